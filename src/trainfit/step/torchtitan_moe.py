"""torchtitan's MoE models (its qwen3, deepseek_v3 and llama4 Transformers, stacks/torchtitan.toml [moe_models])
built from a trainfit ModelSpec and parallelized as their parallelize functions do (models/qwen3/infra/
parallelize.py:57-180, deepseek_v3's :49-205, llama4's: llama4's apply_moe_ep_tp, apply_ac, then llama4's apply_fsdp
or llama3's apply_ddp), for the measure engine's real step: one process, or one rank of a torchrun job with data and
expert parallelism (ExpertParallel's all-to-all dispatch and combine over gloo on CPU).

Two of torchtitan 0.2.2's MoE kernels have no CPU implementation; on a CPU the step runs them as follows, the
tensors they make unchanged:
  * torch.histc over the int64 expert ids (models/moe/moe.py:348, :377): torch's CPU histogram kernel takes
    floating-point input only ("histogram_cpu" not implemented for 'Long'); the ids are counted as float and the
    counts returned as int64, the dtype CUDA's kernel returns (NB: one T·top_k float copy more, for the count's
    duration).
  * generate_permute_indices (models/moe/kernels.py:143-215) fills the padded indices with a Triton kernel
    (fill_indices_wrapper); torchtitan's own CPU reference, fill_indices_cpu (:106-140), fills the same int32
    tensor.
The experts run torchtitan's grouped-GEMM path (MoEArgs.use_grouped_mm, moe.py:113-130, torch._grouped_mm), which
SM90+ GPUs run; deepseek_v3's and llama4's update_from_config turn it off below SM90 (deepseek_v3 model/args.py:95-99,
llama4 model/args.py:73-77), which this step does not call.
"""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import torch

from ..errors import EngineUnavailableError

if TYPE_CHECKING:  # pragma: no cover
    from ..setup import Setup
    from ..spec import ModelSpec


def check(spec: "ModelSpec", setup: "Setup") -> None:
    """What the MoE step does not run, in one line."""
    if setup.ep > 1 and setup.recompute == "op":
        raise EngineUnavailableError(f"--ep {setup.ep} with --recompute op: "
                                     f"{setup.stack_facts.fact('expert_parallel', 'op_sac_fails')}; measure "
                                     "--recompute full or none, or use --engine analytic")
    model, dense = setup.stack_facts.moe_model(spec.family), (spec.moe.sparse_layers or spec.layers) != spec.layers
    if model == "qwen3" and dense:
        raise EngineUnavailableError(f"--stack torchtitan: torchtitan's qwen3 makes every layer MoE "
                                     f"(models/qwen3/model/model.py:366-372); {spec.name} has dense layers")
    if model == "llama4" and dense and not spec.moe.layer_step:
        raise EngineUnavailableError(f"--stack torchtitan: torchtitan's llama4 makes every "
                                     "interleave_moe_layer_step-th layer MoE (models/llama4/model/model.py:387); "
                                     f"{spec.name}'s MoE layers follow another pattern")


def _moe_args(spec: "ModelSpec", setup: "Setup"):
    """torchtitan's MoEArgs (models/moe/moe.py:21-41) for `spec`'s router and experts."""
    from torchtitan.models.moe import MoEArgs

    from ..analytic.torchtitan_moe import model_fact

    m = spec.moe
    return MoEArgs(num_experts=m.num_experts, num_shared_experts=m.shared_intermediate // m.expert_intermediate,
                   top_k=m.top_k, score_func="sigmoid" if m.router_scoring.startswith("sigmoid") else "softmax",
                   route_norm=m.norm_topk, route_scale=m.routed_scaling, num_expert_groups=m.route_groups or None,
                   num_limited_groups=m.route_group_topk or None,
                   score_before_experts=model_fact(spec, setup, "score_before_experts"), use_grouped_mm=True,
                   # --moe-force-balance: the router's round-robin debug routing (moe.py:40-41, :234-249, :335-340)
                   _debug_force_load_balance=setup.moe_force_balance)


def llama4_ffn_sizing(dim: int, dense: int, expert: int, per_token: int) -> tuple[int, float]:
    """(multiple_of, ffn_dim_multiplier) for which torchtitan's llama4 sizing gives the dense layers' FFN width
    `dense` and the experts' `expert`: hidden = int(multiplier · int(2·4·dim/3)), the experts' int(hidden /
    (top_k + shared experts)), each rounded up to multiple_of (models/llama4/model/model.py:388-402, FeedForward
    :326-330). Searches the powers of two its flavours use (2048: Scout's and Maverick's), largest first."""
    base = int(2 * (4 * dim) / 3)
    for mult_of in (2048, 1024, 512, 256, 128, 64, 32, 16, 8, 4, 2, 1):
        for hidden in range(dense, max(0, dense - mult_of), -1):  # int(m · base) rounds up to `dense`
            moe = int(hidden / per_token)
            if -(-moe // mult_of) * mult_of == expert:
                return mult_of, (hidden + 0.5) / base
    raise EngineUnavailableError(f"--stack torchtitan: no multiple_of/ffn_dim_multiplier gives torchtitan's llama4 "
                                 f"FFN widths {dense} (dense) and {expert} (experts) for dim {dim}")


def model_and_args(spec: "ModelSpec", setup: "Setup"):
    """(model class, its args) for `spec` (qwen3: models/qwen3/model/args.py:21-58; deepseek_v3:
    models/deepseek_v3/model/args.py:21-93), attention SDPA with the causal mask (both models' defaults)."""
    check(spec, setup)
    from ..models.hf_config import rope_parameters

    theta, _, rope = rope_parameters(spec.config)
    eps = float(spec.config.get("rms_norm_eps", 1e-6))
    model = setup.stack_facts.moe_model(spec.family)
    if model == "qwen3":
        from torchtitan.models.qwen3.model.args import Qwen3ModelArgs
        from torchtitan.models.qwen3.model.model import Qwen3Model

        return Qwen3Model, Qwen3ModelArgs(
            dim=spec.hidden, n_layers=spec.layers, n_heads=spec.heads, n_kv_heads=spec.kv_heads,
            vocab_size=spec.vocab, head_dim=spec.head_dim, hidden_dim=spec.intermediate, norm_eps=eps,
            rope_theta=theta, qk_norm=spec.qk_norm, max_seq_len=setup.seq, moe_enabled=True,
            moe_inter_dim=spec.moe.expert_intermediate, moe_args=_moe_args(spec, setup))
    if model == "llama4":
        from torchtitan.models.llama4 import Transformer, TransformerModelArgs
        from torchtitan.models.llama4.model.args import RoPEScalingArgs

        per_token = spec.moe.top_k + spec.moe.shared_intermediate // spec.moe.expert_intermediate
        mult_of, mult = llama4_ffn_sizing(spec.hidden, spec.intermediate, spec.moe.expert_intermediate, per_token)
        scaling = (RoPEScalingArgs(scaling_factor=float(rope["factor"]), low_freq_factor=float(rope["low_freq_factor"]),
                                   high_freq_factor=float(rope["high_freq_factor"]),
                                   original_max_position_embeddings=int(rope["original_max_position_embeddings"]))
                   if rope.get("low_freq_factor") is not None else None)
        # the non-iRoPE flavors' attention (sdpa, causal: stacks/torchtitan.toml [spec_as_built.llama4])
        return Transformer, TransformerModelArgs(
            dim=spec.hidden, n_layers=spec.layers, n_heads=spec.heads, n_kv_heads=spec.kv_heads,
            vocab_size=spec.vocab, multiple_of=mult_of, ffn_dim_multiplier=mult, norm_eps=eps, rope_theta=theta,
            rope_scaling_args=scaling, max_seq_len=setup.seq, moe_args=_moe_args(spec, setup),
            interleave_moe_layer_step=spec.moe.layer_step or 1)
    from torchtitan.models.deepseek_v3.model.args import DeepSeekV3ModelArgs
    from torchtitan.models.deepseek_v3.model.model import DeepSeekV3Model

    mla = spec.mla
    args = DeepSeekV3ModelArgs(
        max_seq_len=setup.seq, vocab_size=spec.vocab, dim=spec.hidden, inter_dim=spec.intermediate,
        moe_inter_dim=spec.moe.expert_intermediate, n_layers=spec.layers,
        n_dense_layers=spec.layers - (spec.moe.sparse_layers or spec.layers), n_heads=spec.heads, norm_eps=eps,
        moe_args=_moe_args(spec, setup), q_lora_rank=mla.q_lora_rank, kv_lora_rank=mla.kv_lora_rank,
        qk_nope_head_dim=mla.qk_nope_head_dim, qk_rope_head_dim=mla.qk_rope_head_dim, v_head_dim=mla.v_head_dim,
        rope_theta=theta, rope_factor=float(rope.get("factor", 40)),
        original_seq_len=int(rope.get("original_max_position_embeddings", 4096)))
    args.moe_impl = "standard"  # update_from_config sets it from expert_parallel_comm_backend (model/args.py:116)
    return DeepSeekV3Model, args


def parallelize(model: torch.nn.Module, setup: "Setup", device_type: str, save_list: set) -> None:
    """The model's parallelize function for data and expert parallelism (qwen3/infra/parallelize.py:111-180; the
    same order in deepseek_v3's and llama4's): apply_moe_ep_tp with ExpertParallel on the ep mesh (ep > 1), then
    apply_ac with the model's `save_list`, then llama4's apply_fsdp over the fsdp mesh, the routed experts over the efsdp mesh
    (zero 2/3, or any ep > 1), or llama3's apply_ddp over the dp_replicate mesh (zero 0)."""
    from . import torchtitan as step

    if setup.dp == 1:
        step.apply_recompute(model, setup, save_list)
        return
    dims = step.parallel_dims(setup)
    _build_meshes(dims, device_type)
    if dims.ep_enabled:
        from torchtitan.models.llama4.infra.parallelize import apply_moe_ep_tp

        apply_moe_ep_tp(model, tp_mesh=None, ep_mesh=dims.get_optional_mesh("ep"), etp_mesh=None, ep_etp_mesh=None,
                        dual_pipe_v=False, use_deepep=False)
    step.apply_recompute(model, setup, save_list)
    if not (dims.fsdp_enabled or dims.ep_enabled):
        step.apply_data_parallel(model, setup, dims.get_mesh("dp_replicate"))  # llama3's apply_ddp
        return
    from torchtitan.config import TORCH_DTYPE_MAP
    from torchtitan.models.llama4.infra.parallelize import apply_fsdp

    apply_fsdp(model, dims.get_mesh(["fsdp"]), param_dtype=TORCH_DTYPE_MAP[step.PRECISIONS[setup.precision]],
               reduce_dtype=torch.float32, pp_enabled=False, cpu_offload=False,
               reshard_after_forward_policy=step.reshard_policy(setup), ep_degree=dims.ep,
               edp_mesh=dims.get_optional_mesh(["efsdp"]), gradient_divide_factor=dims.fsdp_gradient_divide_factor)
    step.sum_on_gloo(model, setup)


def _build_meshes(dims, device_type: str) -> None:
    """ParallelDims.build_mesh (distributed/parallel_dims.py:68-188) on the step's device type: it reads the module
    global device_type (:12, :140), which torchtitan sets to the accelerator, or "cuda" where there is none
    (tools/utils.py:36-42), so a CPU step builds its gloo meshes with it set to "cpu" for the call."""
    from torchtitan.distributed import parallel_dims

    accelerator = parallel_dims.device_type
    parallel_dims.device_type = device_type
    try:
        dims.build_mesh()
    finally:
        parallel_dims.device_type = accelerator


def op_sac_save_list(spec: "ModelSpec", setup: "Setup") -> set:
    """The model's own per-op SAC save list (models/qwen3/infra/parallelize.py:39, deepseek_v3's :33, llama4's
    :51)."""
    model = setup.stack_facts.moe_model(spec.family)
    if model == "qwen3":
        from torchtitan.models.qwen3.infra.parallelize import _op_sac_save_list
    elif model == "llama4":
        from torchtitan.models.llama4.infra.parallelize import _op_sac_save_list
    else:
        from torchtitan.models.deepseek_v3.infra.parallelize import _op_sac_save_list
    return _op_sac_save_list


@contextlib.contextmanager
def cpu_kernels(model: torch.nn.Module):
    """On a CPU MoE model, torchtitan's MoE kernels as the module docstring runs them; elsewhere nothing."""
    blocks = getattr(model, "layers", {})
    moe = any(getattr(b, "moe_enabled", False) for b in (blocks.values() if hasattr(blocks, "values") else blocks))
    if not moe or next(model.parameters()).device.type != "cpu":
        yield
        return
    from torchtitan.models.moe import kernels

    triton_fill = kernels.fill_indices_wrapper

    def fill_cpu(tokens, starts, offsets, experts_per_rank, ranks, max_len, **_):
        return kernels.fill_indices_cpu(tokens, starts, offsets, experts_per_rank, ranks, max_len)

    histc = torch.histc

    def integer_histc(x, *args, **kwargs):
        # (torchtitan resolves torch.histc at each call, moe.py:348, :377; a TorchFunctionMode would be off inside
        # the backward's recomputed forwards, which its handler for Tensor.backward runs)
        if x.device.type == "cpu" and not x.is_floating_point():
            return histc(x.float(), *args, **kwargs).to(x.dtype)
        return histc(x, *args, **kwargs)

    kernels.fill_indices_wrapper, torch.histc = fill_cpu, integer_histc
    try:
        yield
    finally:
        kernels.fill_indices_wrapper, torch.histc = triton_fill, histc
