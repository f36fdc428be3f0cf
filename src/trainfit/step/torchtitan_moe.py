"""torchtitan's MoE models (its qwen3, deepseek_v3, llama4 and gpt_oss Transformers, [moe_models])
built from a trainfit ModelSpec and parallelized as their parallelize functions do (models/qwen3/infra/
parallelize.py:57-180, deepseek_v3's :49-205, llama4's: llama4's apply_moe_ep_tp, apply_ac, then llama4's apply_fsdp
or llama3's apply_ddp), for the measure engine's real step: one process, or one rank of a torchrun job with data and
expert parallelism (ExpertParallel's all-to-all dispatch and combine over gloo on CPU).

Three of torchtitan 0.2.2's kernels have no CPU implementation; on a CPU the step runs them as follows, the
tensors they make unchanged:
  * torch.histc over the int64 expert ids (models/moe/moe.py:348, :377): torch's CPU histogram kernel takes
    floating-point input only ("histogram_cpu" not implemented for 'Long'); the ids are counted as float and the
    counts returned as int64, the dtype CUDA's kernel returns (NB: one T·top_k float copy more, for the count's
    duration).
  * generate_permute_indices (models/moe/kernels.py:143-215) fills the padded indices with a Triton kernel
    (fill_indices_wrapper); torchtitan's own CPU reference, fill_indices_cpu (:106-140), fills the same int32
    tensor.
  * flex attention (gpt_oss's FlexAttentionWrapper, models/attention.py:106-152): torch runs no flex backward on a
    CPU; cpu_flex_attention (below) runs its math and keeps what the flex HOP keeps.
The experts run torchtitan's grouped-GEMM path (MoEArgs.use_grouped_mm, moe.py:113-130, torch._grouped_mm), which
SM90+ GPUs run; deepseek_v3's and llama4's update_from_config turn it off below SM90 (deepseek_v3 model/args.py:95-99,
llama4 model/args.py:73-77), which this step does not call.
"""
from __future__ import annotations

import contextlib
import functools
from typing import TYPE_CHECKING

import torch
from torch._subclasses.fake_tensor import is_fake
from torch.utils._python_dispatch import TorchDispatchMode

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
    if model == "gpt_oss" and spec.sliding_window and spec.sliding_lead != 1:
        raise EngineUnavailableError(f"--stack torchtitan: torchtitan's gpt_oss slides the window on the even layers "
                                     f"(models/gpt_oss/model/model.py:274); {spec.name}'s layer_types differ")
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
                   gate_bias=m.router_bias,  # gpt_oss's flavors (models/gpt_oss/__init__.py:54)
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
    if model == "gpt_oss":
        from torchtitan.models.gpt_oss import GptOssModel, GptOssModelArgs

        # YaRN as the flavors' defaults (model/args.py:60-65): rope_factor, ntk_alpha (beta_slow), ntk_beta
        # (beta_fast), original_seq_len; the window on the even layers, the causal mask on the others
        return GptOssModel, GptOssModelArgs(
            dim=spec.hidden, n_layers=spec.layers, n_heads=spec.heads, n_kv_heads=spec.kv_heads,
            head_dim=spec.head_dim, vocab_size=spec.vocab, moe_inter_dim=spec.moe.expert_intermediate, norm_eps=eps,
            moe_args=_moe_args(spec, setup), swiglu_limit=spec.moe.swiglu_limit or 7.0, max_seq_len=setup.seq,
            sliding_window_size=spec.sliding_window or setup.seq, attn_mask_type="causal", rope_theta=theta,
            rope_factor=float(rope.get("factor", 1.0)), ntk_alpha=float(rope.get("beta_slow", 1.0)),
            ntk_beta=float(rope.get("beta_fast", 32.0)),
            original_seq_len=int(rope.get("original_max_position_embeddings", 4096)))
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


def parallelize(model: torch.nn.Module, spec: "ModelSpec", setup: "Setup", device_type: str, save_list: set) -> None:
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
    fake = is_fake(next(model.parameters()))
    if dims.ep_enabled:
        from torchtitan.models.llama4.infra.parallelize import apply_moe_ep_tp

        with routed_dispatch(spec, setup) if fake else contextlib.nullcontext():
            apply_moe_ep_tp(model, tp_mesh=None, ep_mesh=dims.get_optional_mesh("ep"), etp_mesh=None,
                            ep_etp_mesh=None, dual_pipe_v=False, use_deepep=False)
    step.apply_recompute(model, setup, save_list)
    if not (dims.fsdp_enabled or dims.ep_enabled):
        step.apply_data_parallel(model, setup, dims.get_mesh("dp_replicate"))  # llama3's apply_ddp
        return
    from torchtitan.config import TORCH_DTYPE_MAP
    from torchtitan.models.llama4.infra.parallelize import apply_fsdp

    with meshes_outside_fake_modes() if fake and dims.ep_enabled else contextlib.nullcontext():
        apply_fsdp(model, dims.get_mesh(["fsdp"]), param_dtype=TORCH_DTYPE_MAP[step.PRECISIONS[setup.precision]],
                   reduce_dtype=torch.float32, pp_enabled=False, cpu_offload=False,
                   reshard_after_forward_policy=step.reshard_policy(setup), ep_degree=dims.ep,
                   edp_mesh=dims.get_optional_mesh(["efsdp"]),
                   gradient_divide_factor=dims.fsdp_gradient_divide_factor)
    step.sum_on_gloo(model, setup)


@contextlib.contextmanager
def routed_dispatch(spec: "ModelSpec", setup: "Setup"):
    """While apply_moe_ep_tp wraps the experts (distribute_module binds ExpertParallel._token_dispatch then), the
    dispatch as the trace runs it on fake tensors. torchtitan's _token_dispatch (distributed/expert_parallel.py:99-165)
    all-to-alls the per-expert counts, reads the splits to the host (`.tolist()`, :128-129: values fake tensors lack),
    all-to-alls the routed rows and pads them per local expert (_permute, whose sizes follow the rows received,
    models/moe/utils.py:43-58). This one makes the same tensors and collectives, its splits the routing's
    (received_splits)."""
    from torch.distributed._functional_collectives import all_to_all_single, all_to_all_single_autograd
    from torchtitan.distributed.expert_parallel import ExpertParallel
    from torchtitan.models.moe.utils import _permute

    from ..analytic.moe_imbalance import round_robin_counts

    def dispatch(self, mod, inputs, device_mesh):
        routed_input, num_tokens_per_expert = inputs
        ep = device_mesh.shape[0]
        experts = num_tokens_per_expert.shape[0]
        with torch.no_grad():
            per_group = all_to_all_single(num_tokens_per_expert, None, None, group=device_mesh.get_group())
            per_group = torch.ops._c10d_functional.wait_tensor(per_group)
            num_tokens_per_expert.view(ep, -1).sum(dim=1).to(torch.device("cpu"))  # (the splits' host copies)
            per_group.view(ep, -1).sum(dim=1).to(torch.device("cpu"))
            sent = routed_input.shape[0]
            self.input_splits = round_robin_counts(sent, experts, ep)
            self.output_splits = received_splits(spec, setup, sent, ep, device_mesh.get_local_rank())
        routed_input = all_to_all_single_autograd(routed_input, self.output_splits, self.input_splits,
                                                  device_mesh.get_group())
        self.input_shape, routed_input, self.permuted_indices, per_group = _permute(
            routed_input, per_group, ep, experts // ep)
        return routed_input, per_group

    real = ExpertParallel._token_dispatch
    ExpertParallel._token_dispatch = dispatch
    try:
        yield
    finally:
        ExpertParallel._token_dispatch = real


def received_splits(spec: "ModelSpec", setup: "Setup", sent: int, ep: int, rank: int) -> list[int]:
    """The routed copies the traced EP `rank` receives from each of the `ep` source ranks, each of which sends `sent`
    (its tokens × top_k), as the routing setting gives them (analytic/moe_imbalance.py, the analytic engine's source):
      * torchtitan's forced balance (--moe-force-balance): its round-robin routing, exact (round_robin_counts:
        every source rank routes alike, so the rank receives its own count from each);
      * learned routing: the traced rank is the busiest: it receives busiest_rank_load (--moe-imbalance, default
        the dropless DROPLESS) times the balanced `sent`, in equal parts from each source rank (NB: equal parts: the
        all-to-all's buffers are sized by the sum, which is the setting's). What a rank sends sizes nothing new (its
        routed rows exist before the dispatch): round-robin counts, balanced."""
    from ..analytic.moe_imbalance import busiest_rank_load, forced_by, near_equal_parts, round_robin_counts
    from ..models.hf_config import as_built

    spec = as_built(spec, setup)  # (torchtitan's llama4 routes its tokens: [spec_as_built.llama4])
    if setup.moe_force_balance and forced_by(setup) == "round-robin":
        return [round_robin_counts(sent, spec.moe.num_experts, ep)[rank]] * ep
    return near_equal_parts(round(sent * busiest_rank_load(spec, setup, sent / spec.moe.top_k)), ep)


def local_expert_rows(spec: "ModelSpec", setup: "Setup", sent: int, ep: int, rank: int) -> list[int]:
    """The routed copies each of EP `rank`'s local experts receives, as the routing setting gives them
    (received_splits, per expert): under torchtitan's forced balance its round-robin routing, exact
    (round_robin_expert_counts from each of the ep sources); under learned routing the rank's received copies in
    near-equal parts over its experts (NB: the setting gives the rank's load, not its experts'; an even split pads
    the least, by under 8 rows an expert, models/moe/kernels.py:183-189)."""
    from ..analytic.moe_imbalance import forced_by, near_equal_parts, round_robin_expert_counts
    from ..models.hf_config import as_built

    experts = as_built(spec, setup).moe.num_experts
    local = experts // ep
    if setup.moe_force_balance and forced_by(setup) == "round-robin":
        return [ep * n for n in round_robin_expert_counts(sent, experts)[rank * local:(rank + 1) * local]]
    return near_equal_parts(sum(received_splits(spec, setup, sent, ep, rank)), local)


class _KnownRows(TorchDispatchMode):
    """Inside gpt_oss's experts on fake tensors (known_expert_rows), the two values they read from the router's
    aligned counts, given: their sum (`int(offsets[-1])`, the tail's size: aten._local_scalar_dense) and the biases'
    repeat by them (aten.repeat_interleave.Tensor, whose output the sum sizes: passed as its output_size)."""

    def __init__(self, rows: int):
        super().__init__()
        self.rows = rows

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._local_scalar_dense.default:
            return self.rows
        if func is torch.ops.aten.repeat_interleave.Tensor:
            kwargs = {**kwargs, "output_size": self.rows}
        return func(*args, **kwargs)


def known_expert_rows(model: torch.nn.Module, spec: "ModelSpec", setup: "Setup") -> None:
    """On fake tensors (the trace engine), each gpt_oss experts module runs its forward under _KnownRows with the
    aligned rows the routing setting gives the traced rank, rank 0 (local_expert_rows, each expert's count aligned as
    generate_permute_indices aligns it: round_up(max(n, 8), 8), models/moe/kernels.py:183-189): gpt_oss repeats its
    expert biases by those counts and sizes the tail rows by their sum (models/gpt_oss/model/moe.py:142-176), values
    fake tensors do not hold. Every other torchtitan MoE model reads no count inside its experts."""
    from torchtitan.models.gpt_oss.model.moe import GptOssGroupedExperts
    from torchtitan.models.moe import utils

    from ..models.hf_config import as_built

    experts = [m for m in model.modules() if isinstance(m, GptOssGroupedExperts)]
    if not experts:
        return
    align = utils.TOKEN_GROUP_ALIGN_SIZE_M
    sent = setup.batch * setup.seq * as_built(spec, setup).moe.top_k
    rows = sum(-(-max(n, align) // align) * align for n in local_expert_rows(spec, setup, sent, setup.ep, 0))
    for module in experts:
        module.forward = functools.partial(_forward_with_rows, module, rows)


def _forward_with_rows(module: torch.nn.Module, rows: int, *args, **kwargs):
    with _KnownRows(rows):
        return type(module).forward(module, *args, **kwargs)


def trace_notes(spec: "ModelSpec", setup: "Setup") -> list[str]:
    """The distributed trace's line on the routing it assumes (received_splits), under expert parallelism."""
    from ..analytic.moe_imbalance import busiest_rank_load
    from ..models.hf_config import as_built

    if setup.ep <= 1 or not spec.is_moe:
        return []
    load = busiest_rank_load(as_built(spec, setup), setup, setup.batch * setup.seq / setup.cp)
    return [f"expert parallelism: the traced rank receives {load:.2f}x the balanced routed tokens (the all-to-all's "
            "splits, values fake tensors do not hold, are the routing setting's: --moe-imbalance, "
            "--moe-force-balance; analytic/moe_imbalance.py)"]


@contextlib.contextmanager
def meshes_outside_fake_modes():
    """DeviceMesh construction outside the trace's fake-tensor and dispatch modes: fully_shard on the experts' EP
    DTensors concatenates the ep and efsdp meshes (torch/distributed/fsdp/_fully_shard/_fsdp_param.py
    _init_sharding_spec_tp -> device_mesh.py _concatenate), whose DeviceMesh reads its rank tensor's values
    (_compute_coordinates_from_mesh: nonzero), which a fake tensor cannot give. The mesh tensors are real ranks."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.utils._python_dispatch import _disable_current_modes

    init = DeviceMesh.__init__

    def init_real(self, *args, **kwargs):
        with _disable_current_modes():
            init(self, *args, **kwargs)

    DeviceMesh.__init__ = init_real
    try:
        yield
    finally:
        DeviceMesh.__init__ = init


def _build_meshes(dims, device_type: str) -> None:
    """ParallelDims.build_mesh (distributed/parallel_dims.py:68-188) on the step's device type: it reads the module
    global device_type (:12, :140), which torchtitan sets to the accelerator, or "cuda" where there is none
    (tools/utils.py:36-42), so a CPU step builds its gloo meshes with it set to "cpu" for the call. They are built
    outside the trace's fake-tensor and dispatch modes: init_device_mesh reads the real rank tensors it makes."""
    from torch.utils._python_dispatch import _disable_current_modes
    from torchtitan.distributed import parallel_dims

    accelerator = parallel_dims.device_type
    parallel_dims.device_type = device_type
    try:
        with _disable_current_modes():
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
    elif model == "gpt_oss":
        from torchtitan.models.gpt_oss.infra.parallelize import _op_sac_save_list

        # (the CPU substitute for flex attention stands for its compiled region, which the list saves)
        return _op_sac_save_list | {cpu_flex_op()}
    else:
        from torchtitan.models.deepseek_v3.infra.parallelize import _op_sac_save_list
    return _op_sac_save_list


@contextlib.contextmanager
def kernels(model: torch.nn.Module, setup: "Setup"):
    """torchtitan's MoE kernels where they cannot run as written: on a CPU as the module docstring runs them, and on
    fake tensors (the trace engine) as below; on a GPU nothing changes.

    On fake tensors, which hold no values:
      * the indices' fill allocates what it allocates, int32 of `max_len`, and writes nothing (the Triton wrapper's
        one allocation, kernels.py:79-81; fill_indices_cpu's, :114-118). NB: the CPU reference's per-expert arange
        temporaries (:132-137, at most one expert's tokens in int32, in the forward's no_grad) are not made: a CPU
        trace may read low by that much if its peak fell there (not seen: tests/stacks/test_torchtitan_moe.py).
      * under CUDA semantics (setup.device "cuda") torch.histc counts the int64 ids as they are (CUDA's histc takes
        integer input, its output (bins,) of the input's dtype: aten/src/ATen/native/cuda/SummaryOps.cu _histc_cuda),
        without the CPU's float copy; its values are not computed (the trace reads none).
    (gpt_oss's experts read the counts' values: known_expert_rows.)"""
    blocks = getattr(model, "layers", {})
    moe = any(getattr(b, "moe_enabled", False) for b in (blocks.values() if hasattr(blocks, "values") else blocks))
    param = next(model.parameters())
    fake = is_fake(param)
    if not moe or (param.device.type != "cpu" and not fake):
        yield
        return
    from torchtitan.models.attention import FlexAttentionWrapper
    from torchtitan.models.moe import kernels as moe_kernels

    fill, histc = moe_kernels.fill_indices_wrapper, torch.histc
    flex = FlexAttentionWrapper.__dict__["_compiled_flex_attn"]

    def fill_cpu(tokens, starts, offsets, experts_per_rank, ranks, max_len, **_):
        return moe_kernels.fill_indices_cpu(tokens, starts, offsets, experts_per_rank, ranks, max_len)

    def fill_fake(tokens, starts, offsets, experts_per_rank, ranks, max_len, **_):
        return torch.full((max_len,), -1, dtype=torch.int32, device=tokens.device)

    def integer_histc(x, bins=100, min=0, max=0, **kwargs):
        # (torchtitan resolves torch.histc at each call, moe.py:348, :377; a TorchFunctionMode would be off inside
        # the backward's recomputed forwards, which its handler for Tensor.backward runs)
        if x.is_floating_point():
            return histc(x, bins=bins, min=min, max=max, **kwargs)
        if fake and setup.device == "cuda":
            return x.new_zeros(bins)
        return histc(x.float(), bins=bins, min=min, max=max, **kwargs).to(x.dtype)

    moe_kernels.fill_indices_wrapper, torch.histc = (fill_fake if fake else fill_cpu), integer_histc
    FlexAttentionWrapper._compiled_flex_attn = staticmethod(cpu_flex_attention)
    try:
        yield
    finally:
        moe_kernels.fill_indices_wrapper, torch.histc = fill, histc
        FlexAttentionWrapper._compiled_flex_attn = flex
        _MASKS.clear()  # (the step's masks, held for the stand-in's backward: released with the step)


def forward_kwargs(model: torch.nn.Module, tokens: torch.Tensor) -> dict:
    """The model's forward keywords beside the tokens: for a flex-attention model (gpt_oss) its attention masks, as
    torchtitan's post_dataloading_process builds them before the forward (train.py:457-466: get_attention_masks;
    the causal mask needs no tokenizer, models/gpt_oss/model/model.py:398-401)."""
    if getattr(getattr(model, "model_args", None), "attn_type", "sdpa") != "flex":
        return {}
    if not is_fake(tokens):
        return {"attention_masks": model.get_attention_masks(input_batch=tokens, tokenizer=None)}
    # on fake tensors (the trace engine) the masks are built real, outside the trace's modes, from tokens of the same
    # shape: torchtitan builds them with a torch.compile'd create_block_mask (models/attention.py:300-305), whose
    # compiled kernel reads its inputs' memory; gpt_oss's causal and window masks read no token value
    # (model.py:398-414), and the CPU stand-in reads only their mask_mod (cpu_flex_attention). NB: the BlockMask's
    # block-count tensors (int32, (batch, 1, seq / 128 [, seq / 128])) are not recorded: low by at most that
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        real = torch.zeros(tokens.shape, dtype=tokens.dtype)
        return {"attention_masks": model.get_attention_masks(input_batch=real, tokenizer=None)}


# -- flex attention on CPU ---------------------------------------------------------------------------------------
# torch 2.13 runs no flex-attention backward on a CPU ("FlexAttention does not support backward on CPU",
# torch/nn/attention/flex_attention.py:2082 _validate_device). The CPU step runs flex attention's math as one opaque
# op instead (a custom op, so that per-op SAC sees one op as it sees the compiled region: gpt_oss's save list keeps
# torch._higher_order_ops.inductor_compiled_code), which allocates and saves what the flex HOP does: its output in
# q's dtype, the fp32 logsumexp in log2 units (both saved beside q, k and v: _higher_order_ops/flex_attention.py:
# 796-812, max_scores not kept), and returns the natural-log logsumexp (the public API's `lse * ln 2`).
# NB: its working scores are fp32 over 32-query chunks (a transient the GPU kernel holds in
# registers: the CPU peak reads high by at most one chunk's scores, 32 x seq x 4 bytes); its backward returns dq,
# dk, dv in the inputs' dtype (accumulated in fp32 per kv head, one head at a time).
_MASKS: dict[int, object] = {}
_CHUNK = 32
_OP = []


def cpu_flex_op():
    """The custom op (defined on first use: torch.library registration is process-global)."""
    if _OP:
        return _OP[0]
    import math

    @torch.library.custom_op("trainfit::cpu_flex_attention", mutates_args=())
    def op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: int, scale: float
           ) -> tuple[torch.Tensor, torch.Tensor]:
        b, h, s, d = q.shape
        rep = h // k.shape[1]
        out = torch.empty_like(q)
        lse2 = torch.empty((b, h, s), dtype=torch.float32)
        with torch.no_grad():
            for i in range(b):
                for j in range(h):
                    kk, vv = k[i, j // rep].float(), v[i, j // rep].float()
                    for c in range(0, s, _CHUNK):
                        sc = (q[i, j, c:c + _CHUNK].float() @ kk.T) * scale
                        sc.masked_fill_(~_dense_mask(mask, i, c, min(s, c + _CHUNK), s), float("-inf"))
                        lse = torch.logsumexp(sc, dim=-1)
                        out[i, j, c:c + _CHUNK] = (torch.exp(sc - lse[:, None]) @ vv).to(q.dtype)
                        lse2[i, j, c:c + _CHUNK] = lse / math.log(2)
        return out, lse2.mul_(math.log(2))

    @op.register_fake
    def _(q, k, v, mask, scale):
        # on fake tensors (the trace engine) what flex attention's fused kernel returns, the output and its fp32
        # logsumexp (NB: the CPU loop's own chunk temporaries, at most _CHUNK rows of fp32 scores, are not made)
        return torch.empty_like(q), q.new_empty(q.shape[:3], dtype=torch.float32)

    def setup_context(ctx, inputs, output):
        # (the region's outputs are the output and the natural-log lse: what per-op SAC stores; the log2 lse the
        # HOP keeps is made here, where autograd saves it)
        q, k, v, mask, scale = inputs
        out, lse = output
        ctx.save_for_backward(q, k, v, out, lse / math.log(2))
        ctx.mask, ctx.scale = mask, scale

    def backward(ctx, dout, dlse):
        q, k, v, out, lse2 = ctx.saved_tensors
        b, h, s, d = q.shape
        rep = h // k.shape[1]
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        if is_fake(q):  # the fused backward's gradients (NB: its fp32 (b, h, s) row sums not made)
            return dq, dk, dv, None, None
        for i in range(b):
            for g in range(k.shape[1]):
                kk, vv = k[i, g].float(), v[i, g].float()
                dkk, dvv = torch.zeros_like(kk), torch.zeros_like(vv)
                for j in range(g * rep, (g + 1) * rep):
                    for c in range(0, s, _CHUNK):
                        e = min(s, c + _CHUNK)
                        qq, do = q[i, j, c:e].float(), dout[i, j, c:e].float()
                        sc = (qq @ kk.T) * ctx.scale
                        sc.masked_fill_(~_dense_mask(ctx.mask, i, c, e, s), float("-inf"))
                        p = torch.exp(sc - lse2[i, j, c:e, None] * math.log(2))
                        dvv += p.T @ do
                        dp = do @ vv.T
                        delta = (do * out[i, j, c:e].float()).sum(-1, keepdim=True)
                        ds = p * (dp - delta + (dlse[i, j, c:e, None] if dlse is not None else 0))
                        dq[i, j, c:e] = (ds @ kk * ctx.scale).to(q.dtype)
                        dkk += ds.T @ qq * ctx.scale
                dk[i, g], dv[i, g] = dkk.to(k.dtype), dvv.to(v.dtype)
        return dq, dk, dv, None, None

    op.register_autograd(backward, setup_context=setup_context)
    _OP.append(torch.ops.trainfit.cpu_flex_attention.default)
    return _OP[0]


def _dense_mask(key: int, batch: int, start: int, end: int, s: int) -> torch.Tensor:
    """Rows start:end of the block mask's mask_mod over s keys for sequence `batch` of the batch (torchtitan's mask
    mods are tensor expressions: models/attention.py:208-296; its document mask reads the sequence's own document
    ids, :234-237, where the causal and window masks ignore b)."""
    zero = torch.zeros((), dtype=torch.long)
    b = torch.tensor(batch, dtype=torch.long)
    return _MASKS[key](b, zero, torch.arange(start, end)[:, None], torch.arange(s)[None, :])


def cpu_flex_attention(q, k, v, *, block_mask=None, scale=None, enable_gqa=False, return_lse=False, **_):
    """FlexAttentionWrapper's compiled flex_attention on a CPU (the comment above)."""
    _MASKS[id(block_mask.mask_mod)] = block_mask.mask_mod
    out, lse = cpu_flex_op()(q, k, v, id(block_mask.mask_mod), scale if scale is not None else q.shape[-1] ** -0.5)
    return (out, lse) if return_lse else out
