"""The Shape of a setup: what the op shapes of one micro-batch on one rank depend on, resolved once from the spec,
the setup's stack facts (stacks/*.toml) and the precision."""
from __future__ import annotations

from dataclasses import fields, replace

from ...setup import Setup
from ...spec import ModelSpec
from ..activations import FP32, norm_kernel, resolved_kernel
from ..families import family_traits
from ..liger import liger_on, swiglu_on
from ..long_context import sp_degree
from .. import torchtitan_moe
from ..moe_imbalance import busiest_rank_load
from ..precision import StateBytes
from ..te_recipes import runs_te
from .op import Shape

def shape_of(spec: ModelSpec, setup: Setup, st: StateBytes, dtype: str) -> Shape:
    """The Shape of `setup` (a Setup or the planner's light _Cfg)."""
    from ..compile_effects import not_modelled
    from ..siglip import image_block_masks
    from ..torchao_recipes import running

    facts = setup.stack_facts.facts
    kernel = resolved_kernel(spec, setup)
    rope = setup.stack_facts.fact("rotary")
    if spec.mla is None and spec.rope_attention_factor != 1.0:  # a fused kernel without a scale: its fallback
        rope = facts.get("rotary", {}).get("scaled", rope)
    hf_eager = kernel == "eager" and rope == "cos-sin"  # (before SDPA's math path is timed as eager below)
    if kernel == "math":
        kernel = "eager"  # SDPA's math path: bmm + softmax, as eager
    elif kernel == "flash" and st.act == FP32:
        kernel = "efficient"  # fp32 runs the memory-efficient kernel (activations._flash_saved)
    elif kernel == "flash" and setup.attention_kernel == "triton":
        kernel = "triton"  # FlashAttention in Triton: flash's saved set, its own speed (kernels.toml [derived])
    compiled = bool(getattr(setup, "compile", False)) and not not_modelled(spec, setup)
    lp = getattr(setup, "low_precision", "none")
    # Transformer Engine runs the recipe (stacks/*.toml [low_precision] library): ops/te_casts.py, not torchao's
    te = lp if runs_te(setup) else ""
    # --cp and --ulysses: the rank holds seq / n of every sequence, attending seq keys (long_context.py)
    return Shape(setup.batch, setup.seq, sp_degree(setup), setup.tp, bool(setup.sequence_parallel), dtype, int(st.act),
                 int(st.residual), int(st.param or st.weight), int(st.grad), bool(st.autocast), kernel,
                 norm_kernel(setup) if spec.norm == "rmsnorm" else "layernorm", rope,
                 bool(family_traits(spec)["loss_upcast"]), setup.ep, compiled, bool(running(setup)),
                 facts.get("fused_elementwise", {}).get("value", False),
                 ("sdpa_backends" in facts.get("attention", {}) or facts.get("attention", {}).get("gpu_preferred", False))
                 and setup.attention_kernel != "flash2",
                 int(st.param or st.weight) if (kernel == "eager" and facts.get("attention", {}).get("eager_mask")
                                                and spec.causal) else 0,
                 hf_eager,
                 facts.get("loss", {}).get("labels") == "shifted-copy",
                 # (HF's eager attention adds its own additive masks: the eager path's ops, not SDPA's)
                 masked=spec.vision is not None and not hf_eager and image_block_masks(spec, setup),
                 te=te,  # (the share only TE's casts read: ops/te_casts.py; 1 without the recipe)
                 te_weight_share=1.0 / max(1, getattr(setup, "grad_accum", 1)) if te else 1.0,
                 lp=running(setup),
                 mx_casts=tuple(facts.get("low_precision", {}).get("mx_cast_kernels", {}).get(
                     getattr(setup, "mx_scale", "floor"), ())) if lp == "mxfp8" and not te else (),
                 moe_block=facts.get("moe", {}).get("block", "transformers"),
                 moe_aux_loss=aux_loss_runs(spec, facts),
                 moe_scored=spec.is_moe and torchtitan_moe.model_fact(spec, setup, "score_before_experts"),
                 moe_load=busiest_rank_load(spec, setup, setup.batch * setup.seq / setup.cp),
                 moe_force_balance=bool(getattr(setup, "moe_force_balance", False)),
                 moe_gemm_streams=int(facts.get("moe", {}).get("gemm_streams", 0)),
                 expert_tp=setup.expert_tp if spec.is_moe and setup.expert_tp != setup.tp else 0,
                 ulysses=int(getattr(setup, "ulysses", 1)),
                 doc_len=getattr(setup, "doc_len", None) or 0,
                 cp_merge=setup.cp > 1 and facts.get("context_parallel", {}).get("merge") == "fp32",
                 liger=liger_on(setup), liger_swiglu=swiglu_on(setup),
                 loss_fusion=loss_kernel(setup))


# The fields only the sparse MoE block reads (ops/layer.py MOE_BLOCKS: ops/moe.py, ops/megatron_moe.py,
# ops/torchtitan_moe.py)
MOE_ONLY = ("ep", "moe_block", "moe_aux_loss", "moe_scored", "moe_load", "moe_force_balance", "moe_gemm_streams",
            "expert_tp")
_MOE_DEFAULTS = {f.name: f.default for f in fields(Shape) if f.name in MOE_ONLY}


def aux_loss_runs(spec: ModelSpec, facts: dict) -> bool:
    """Whether the stack's router runs its load-balancing loss for this model: a positive coefficient (aux_loss_coeff;
    TopKRouter runs none of the loss's kernels at 0). One rule for the timed op list and for the launch config
    written (plan/emit_megatron.py)."""
    return aux_loss_coeff(spec, facts) > 0


def aux_loss_coeff(spec: ModelSpec, facts: dict) -> float:
    """The router's load-balancing loss coefficient: 0 where the stack runs none ([moe] aux_loss off, or the family
    among no_aux_loss_families: Megatron-Bridge's gpt-oss provider), else the model's own where its config gives one
    and the stack takes it ([moe] aux_loss_from_config: MoESpec.aux_loss_coeff), else the stack's default:
    expert_bias_aux_loss_coeff beside a sigmoid router's expert bias (DeepSeek-V3), aux_loss_coeff."""
    moe = facts.get("moe", {})
    if not moe.get("aux_loss", False) or spec.moe is None or spec.family in moe.get("no_aux_loss_families", ()):
        return 0.0
    if moe.get("aux_loss_from_config", False) and spec.moe.aux_loss_coeff is not None:
        return spec.moe.aux_loss_coeff
    return float(moe["expert_bias_aux_loss_coeff"] if spec.moe.router_scoring == "sigmoid" else moe["aux_loss_coeff"])


def without_moe(sh: Shape) -> Shape:
    """`sh` with the MoE block's fields at their defaults: the key of a dense layer's lists, which never read them
    (the layouts of one dense shape that differ in their expert layout share those lists' times)."""
    return sh if all(getattr(sh, k) == v for k, v in _MOE_DEFAULTS.items()) else replace(sh, **_MOE_DEFAULTS)


def loss_kernel(setup: Setup) -> str:
    """Shape.loss_fusion: the fused cross-entropy the step runs, Megatron's --loss-fusion (native, te) or flash-attn's
    --loss xentropy; "" for the loss's own log_softmax + nll_loss."""
    if getattr(setup, "loss", "full") == "xentropy":
        return "xentropy"
    return "" if getattr(setup, "loss_fusion", "none") == "none" else setup.loss_fusion
