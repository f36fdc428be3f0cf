"""torchtitan's MoE models (its qwen3 and deepseek_v3 Transformers, stacks/torchtitan.toml [moe_models]) built from
a trainfit ModelSpec, for the measure engine's real step in one process (no expert parallelism).

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
SM90+ GPUs run; deepseek_v3's update_from_config turns it off below SM90 (model/args.py:95-99), which this step does
not call.
"""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import torch

from ..errors import EngineUnavailableError

if TYPE_CHECKING:  # pragma: no cover
    from ..setup import Setup
    from ..spec import ModelSpec


def torchtitan_model(spec: "ModelSpec", setup: "Setup") -> str:
    """The torchtitan model that builds `spec`'s family (stacks/torchtitan.toml [moe_models] model)."""
    return setup.stack_facts.fact("moe_models", "model")[spec.family]


def check(spec: "ModelSpec", setup: "Setup") -> None:
    """What the one-process MoE step does not run, in one line."""
    if setup.ep > 1 or setup.dp > 1:
        raise EngineUnavailableError(f"--stack torchtitan: the measure engine runs {spec.name}'s MoE model in one "
                                     "process, without data or expert parallelism; use --engine analytic")
    if torchtitan_model(spec, setup) == "qwen3" and (spec.moe.sparse_layers or spec.layers) != spec.layers:
        raise EngineUnavailableError(f"--stack torchtitan: torchtitan's qwen3 makes every layer MoE "
                                     f"(models/qwen3/model/model.py:366-372); {spec.name} has dense layers")


def _moe_args(spec: "ModelSpec"):
    """torchtitan's MoEArgs (models/moe/moe.py:21-41) for `spec`'s router and experts."""
    from torchtitan.models.moe import MoEArgs

    m = spec.moe
    return MoEArgs(num_experts=m.num_experts, num_shared_experts=m.shared_intermediate // m.expert_intermediate,
                   top_k=m.top_k, score_func="sigmoid" if m.router_scoring == "sigmoid" else "softmax",
                   route_norm=m.norm_topk, route_scale=m.routed_scaling, num_expert_groups=m.route_groups or None,
                   num_limited_groups=m.route_group_topk or None, score_before_experts=False, use_grouped_mm=True)


def model_and_args(spec: "ModelSpec", setup: "Setup"):
    """(model class, its args) for `spec` (qwen3: models/qwen3/model/args.py:21-58; deepseek_v3:
    models/deepseek_v3/model/args.py:21-93), attention SDPA with the causal mask (both models' defaults)."""
    check(spec, setup)
    from ..models.hf_config import rope_parameters

    theta, _, rope = rope_parameters(spec.config)
    eps = float(spec.config.get("rms_norm_eps", 1e-6))
    model = torchtitan_model(spec, setup)
    if model == "qwen3":
        from torchtitan.models.qwen3.model.args import Qwen3ModelArgs
        from torchtitan.models.qwen3.model.model import Qwen3Model

        return Qwen3Model, Qwen3ModelArgs(
            dim=spec.hidden, n_layers=spec.layers, n_heads=spec.heads, n_kv_heads=spec.kv_heads,
            vocab_size=spec.vocab, head_dim=spec.head_dim, hidden_dim=spec.intermediate, norm_eps=eps,
            rope_theta=theta, qk_norm=spec.qk_norm, max_seq_len=setup.seq, moe_enabled=True,
            moe_inter_dim=spec.moe.expert_intermediate, moe_args=_moe_args(spec))
    from torchtitan.models.deepseek_v3.model.args import DeepSeekV3ModelArgs
    from torchtitan.models.deepseek_v3.model.model import DeepSeekV3Model

    mla = spec.mla
    args = DeepSeekV3ModelArgs(
        max_seq_len=setup.seq, vocab_size=spec.vocab, dim=spec.hidden, inter_dim=spec.intermediate,
        moe_inter_dim=spec.moe.expert_intermediate, n_layers=spec.layers,
        n_dense_layers=spec.layers - (spec.moe.sparse_layers or spec.layers), n_heads=spec.heads, norm_eps=eps,
        moe_args=_moe_args(spec), q_lora_rank=mla.q_lora_rank, kv_lora_rank=mla.kv_lora_rank,
        qk_nope_head_dim=mla.qk_nope_head_dim, qk_rope_head_dim=mla.qk_rope_head_dim, v_head_dim=mla.v_head_dim,
        rope_theta=theta, rope_factor=float(rope.get("factor", 40)),
        original_seq_len=int(rope.get("original_max_position_embeddings", 4096)))
    args.moe_impl = "standard"  # update_from_config sets it from expert_parallel_comm_backend (model/args.py:116)
    return DeepSeekV3Model, args


def op_sac_save_list(spec: "ModelSpec", setup: "Setup") -> set:
    """The model's own per-op SAC save list (models/qwen3/infra/parallelize.py:39, deepseek_v3's :33)."""
    if torchtitan_model(spec, setup) == "qwen3":
        from torchtitan.models.qwen3.infra.parallelize import _op_sac_save_list
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
