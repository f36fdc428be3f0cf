"""Megatron-Core's selective recompute modules (--recompute selective --recompute-modules a,b): which of a layer's
saved tensors each module stops keeping, and which forward ops its backward runs again.

megatron-core 0.16.1 (megatron/core/...):
  transformer/transformer_config.py:411-424  the modules; :1193-1194 default ['core_attn']; :1196-1222 the checks
                  (moe_act needs grouped GEMMs, mla_up_proj needs MLA); they apply only under recompute_granularity
                  'selective' (:1196).
  core_attn       transformer/attention.py:328-331 checkpoint_core_attention: the kernel's q, k, v inputs are the
                  checkpoint's (kept), its own saved set (softmax statistics; eager: the scores) is not.
  layernorm       transformer/transformer_layer.py:383-435: input_layernorm and pre_mlp_layernorm where they are
                  modules of their own (not IdentityOp, which a norm fused into the next linear is): with Transformer
                  Engine the pre-MLP norm of an MoE layer (models/gpt/gpt_layer_specs.py:265, :291) and MLA's input
                  norm (:248); in the local spec both (:371-414). Output-discarding checkpointing (config docstring
                  :422-423): the norm's output (the next linear's saved input) and its statistics are dropped and
                  recomputed, its input is kept.
  mlp             transformer_layer.py:445-447: a dense (not MoE) MLP checkpointed whole: only its input kept. With
                  Transformer Engine the pre-MLP norm is fused into linear_fc1 (IdentityOp), so it is inside.
  moe             transformer/moe/moe_layer.py:153-157: the MoE layer (router, dispatch, experts, combine)
                  checkpointed whole: only its input kept; its all-to-alls run again in the backward.
  moe_act         transformer/moe/experts.py:588-591: the experts' activation (output-discarding): its output,
                  linear_fc2's saved input, is dropped.
  shared_experts  moe_layer.py:158-161 (transformer/moe/shared_experts.py:76): the shared expert checkpointed.
  mla_up_proj     transformer/multi_latent_attention.py:119-122, :344: MLA's up projections and RoPE
                  (output-discarding): q, k, v are dropped, the compressed latents they are made from kept.
"""
from __future__ import annotations

from functools import lru_cache

from ..errors import SetupError
from ..setup import Setup
from ..setup.parsers import parse_recompute_modules as parse
from ..spec import ModelSpec

DEFAULT = ("core_attn",)  # transformer_config.py:1193-1194


def modules(setup: Setup) -> frozenset[str]:
    """The modules recomputed: --recompute-modules under --recompute selective, Megatron's default core_attn
    without it (which is what selective means on every stack: the attention core); none under other policies."""
    if setup.recompute_policy != "selective":
        return frozenset()
    return _named(setup.recompute_modules)


@lru_cache(maxsize=64)
def _named(recompute_modules: str | None) -> frozenset[str]:
    """The set --recompute-modules names (Megatron's default without it), parsed once per value."""
    return frozenset(parse(recompute_modules) if recompute_modules else DEFAULT)


def separate_norms(spec: ModelSpec, setup: Setup, moe: bool) -> tuple[bool, bool]:
    """(input_layernorm, pre_mlp_layernorm) is a module of its own in this layer (gpt_layer_specs.py): the local
    spec (--device cpu) builds both; Transformer Engine's fuses each into the linear after it except MLA's input
    norm (two down projections read it) and an MoE layer's pre-MLP norm (the router and the dispatcher read it)."""
    if setup.device == "cpu":
        return True, True
    return spec.mla is not None, moe


def check_model(spec: ModelSpec, setup: Setup) -> None:
    """Refuse modules the model has nothing for (Megatron raises for moe_act without grouped GEMMs and mla_up_proj
    without MLA, transformer_config.py:1213-1222, and silently skips the rest)."""
    if not setup.recompute_modules or setup.recompute_policy != "selective":
        return
    names = set(parse(setup.recompute_modules))
    why = []
    if spec.moe is None and names & {"moe", "moe_act", "shared_experts"}:
        why.append(f"{', '.join(sorted(names & {'moe', 'moe_act', 'shared_experts'}))}: {spec.name} has no MoE layers")
    elif "shared_experts" in names and not spec.moe.shared_intermediate:
        why.append(f"shared_experts: {spec.name}'s MoE layers have no shared expert")
    if "mla_up_proj" in names and spec.mla is None:
        why.append(f"mla_up_proj: {spec.name} has no multi-latent attention")
    if "mlp" in names and spec.moe is not None and _dense_layers(spec) == 0:
        why.append(f"mlp: every layer of {spec.name} is an MoE layer (use moe)")
    if "layernorm" in names and setup.device != "cpu" and spec.moe is None and spec.mla is None:
        why.append(f"layernorm: Transformer Engine fuses both of {spec.name}'s norms into the next linear "
                   "(gpt_layer_specs.py:291: IdentityOp), nothing to recompute")
    if why:
        raise SetupError(f"--recompute-modules: {'; '.join(why)}; drop it from the list")


def _dense_layers(spec: ModelSpec) -> int:
    from .params import count_params  # (params imports the setup layer only)
    return count_params(spec).dense_layers


def dropped(spec: ModelSpec, setup: Setup, moe: bool, act: int, stat: float, rep: dict, split: dict) -> tuple[dict, dict]:
    """The layer's saved terms (megatron_activations.layer_terms: `rep` replicated, `split` by TP, bytes per
    token) less what the recomputed modules do not keep; core_attn is applied by layer_terms itself (the attention
    kernel's terms are never made). `act`: bytes of an activation; `stat`: of one norm's statistics."""
    from .megatron_activations import clamped  # (which imports this module)

    names = modules(setup)
    rep, split = dict(rep), dict(split)
    h = spec.hidden

    def drop(d: dict, key: str, amount: float | None = None) -> None:
        if key in d:
            d[key] = max(0.0, d[key] - (d[key] if amount is None else amount))

    if "layernorm" in names:
        for separate in separate_norms(spec, setup, moe):
            if separate:  # the norm's output (the next linear's input) and its statistics
                drop(rep, "linear_inputs", act * h)
                drop(rep, "norm_statistics", stat)
    if "mlp" in names and not moe:
        for key in ("fc1_output", "activation_output"):
            drop(split, key)
        if not separate_norms(spec, setup, moe)[1]:  # TE: the fused norm's ln_out and statistics are inside
            drop(rep, "linear_inputs", act * h)
            drop(rep, "norm_statistics", stat)
    if moe and "moe" in names:
        for key in ("expert_tokens", "expert_hidden", "shared_expert"):
            drop(split, key)
        drop(rep, "router")
    if moe and "moe_act" in names and "expert_hidden" in split:
        # expert_hidden = top_k × (fc1's output + the activation's output [+ the clamps' cat]): the latter, i wide
        # per copy, and the cat, both inside the checkpointed activation (its input, fc1's output, kept)
        drop(split, "expert_hidden", spec.moe.top_k * act * spec.moe.expert_intermediate * (1 + clamped(spec)))
    if moe and "shared_experts" in names:
        drop(split, "shared_expert")
    if "mla_up_proj" in names and spec.mla is not None:
        m = spec.mla
        drop(split, "qkv")
        # the up projections' inputs, kept: the q and kv latents and k's shared RoPE part (linear_q_down_proj /
        # linear_kv_down_proj are not split by TP: gpt_layer_specs.py:252-254 backend.linear()).
        # NB: under SP they are gathered whole on each rank: counted split t ways with the replicated terms
        rep["mla_latents"] = act * (m.q_lora_rank + m.kv_lora_rank + m.qk_rope_head_dim)
    return {k: v for k, v in rep.items() if v}, {k: v for k, v in split.items() if v}


def rerun_ops(spec: ModelSpec, setup: Setup, forward: list) -> list:
    """The ops of one layer's forward (ops.layer_forward's list) the recomputed modules run again in its backward."""
    names = modules(setup)
    moe = any(o.name == "router" for o in forward)
    keep: list = []
    attn_norm, mlp_norm = separate_norms(spec, setup, moe)
    in_mlp = False
    for o in forward:
        base = o.name.split(".", 1)[0]
        if base == "mlp_residual":
            in_mlp = False
        core = o.kind == "attention" or o.name.startswith(("softcap", "repeat_kv", "attn_probs"))
        take = ("core_attn" in names and core) \
            or ("layernorm" in names and ((base == "attn_norm" and attn_norm) or (base == "mlp_norm" and mlp_norm))) \
            or ("mlp" in names and not moe and (in_mlp or (base == "mlp_norm" and not mlp_norm))) \
            or ("moe" in names and moe and in_mlp) \
            or ("moe_act" in names and base.startswith(("experts_act", "experts_mul"))) \
            or ("shared_experts" in names and base.startswith("shared")) \
            or ("mla_up_proj" in names and base in ("q_b", "kv_b", "q_a_norm", "kv_a_norm", "q", "k", "q_cat",
                                                    "k_build"))
        if take:
            keep.append(o)
        if base == "mlp_norm":
            in_mlp = True
    return keep


def ep_rerun_share(setup: Setup) -> float:
    """The share of a micro-batch's expert all-to-alls (two in the forward, two in the backward) run again: the
    forward's dispatch and combine under the moe module (moe_layer.py:153-157 checkpoints the whole layer)."""
    return 0.5 if "moe" in modules(setup) else 0.0


def rerun_matmul_per_token(spec: ModelSpec, setup: Setup) -> float:
    """Matmul FLOPs per token the average layer's recomputed modules re-run beyond the attention core (2 per weight
    of the GEMMs they re-run, flops.matmul_params_per_token's counting): a dense MLP under mlp; the router, the
    top-k experts and the shared expert under moe; the shared expert under shared_experts.
    NB: mla_up_proj's up projections are not counted (the pointwise modules re-run no matmul)."""
    from .params import count_params

    names = modules(setup)
    if not names & {"mlp", "moe", "shared_experts"}:
        return 0.0
    pc = count_params(spec)
    n = pc.mlp * pc.dense_layers if "mlp" in names else 0.0
    if spec.moe is not None and pc.moe_layers:
        m = spec.moe
        shared = pc.moe_mlp - m.num_experts * pc.expert - m.num_experts * spec.hidden
        if "moe" in names:
            n += pc.moe_layers * (m.top_k * pc.expert + m.num_experts * spec.hidden + shared)
        elif "shared_experts" in names:
            n += pc.moe_layers * shared
    return 2 * n / spec.layers
