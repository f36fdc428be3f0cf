"""Bytes one Megatron-Core transformer layer saves for backward, per token, on one TP rank (--stack megatron).

Megatron-Core's GPT layer with Transformer Engine (gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec):
TELayerNormColumnParallelLinear (the norm fused into linear_qkv / linear_fc1), TEDotProductAttention (fused/flash
attention; `--attention eager` = Megatron's local DotProductAttention: baddbmm + fused softmax + dropout + bmm),
TERowParallelLinear, bias-dropout-add, bias-GeLU / bias-SwiGLU fusions. The 16-bit model computes in its own dtype
(no autocast; Float16Module), the residual stream is 16-bit (fp32_residual_connection off).

Named terms after Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models") §4.1,
eq. 1: per layer sbh(34 + 5as/h) for GPT in 16-bit with dropout. `replicated` terms are split t ways only by
sequence parallelism (eq. 4), `split` terms by TP alone (eq. 2), `scores` scale with b·s·s (split by heads).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..setup import Setup
from ..spec import ModelSpec
from .batch_free import MICRO_BATCH, cache, memo
from .moe_imbalance import busiest_rank_load, held_load
from .precision import state_bytes
from .megatron_recompute import dropped, modules
from .te_recipes import saved_delta

FP32, MASK, INDEX = 4, 1, 8


@dataclass(frozen=True)
class MegatronLayer:
    replicated: dict  # name -> bytes per token, split t ways only with sequence parallelism
    split: dict  # name -> bytes per token, split t ways by TP
    scores: float  # bytes per token per key (all heads), split t ways by TP (eager attention only)
    mask: float = 0.0  # bytes per (query, key) pair of one sequence, on every rank (the local spec's causal mask)

    def per_rank(self, setup: Setup, tokens: float, keys: float, mask: bool = True) -> float:
        """One layer's saved bytes on one TP rank for `tokens` tokens (this CP rank's) attending to `keys` keys;
        without `mask`, the terms that scale with the tokens alone (the local spec's mask is one sequence's)."""
        t = setup.tp
        rep = sum(self.replicated.values()) / (t if setup.sequence_parallel else 1)
        return (rep + sum(self.split.values()) / t) * tokens + self.scores * tokens * keys / t + \
            (self.mask * keys * keys if mask else 0.0)


def local_spec(setup: Setup) -> bool:
    """--device cpu under megatron: the local layer spec (gpt_layer_specs.py get_gpt_layer_local_spec: no TE, no
    apex), the only one that runs on CPU: torch LayerNorm/RMSNorm (WrappedTorchNorm), ColumnParallelLinear /
    RowParallelLinear, DotProductAttention with torch softmax, unfused bias + activation. bench/targets/megatron_cpu.py
    measures it (GPT-style LayerNorm + GeLU, dropouts 0): within 0.2 % per phase at tp 1 and 2.
    NB: not measured, counted as the LayerNorm/GeLU layer: torch RMSNorm (composite on CPU, saves more than rstd:
    under-counts), SwiGLU, and dropout > 0 (ATen's CPU dropout keeps a mask in the input dtype, not 1 byte:
    under-counts); sequence parallelism does not run (torch_norm.py:32 asserts it off)."""
    return setup.device == "cpu"


def act_bytes(setup: Setup) -> int:
    """Bytes of an activation: the policy's compute dtype (analytic/precision.py state_bytes, every engine's)."""
    return state_bytes(setup).act


def attention_core_recomputed(setup: Setup) -> bool:
    """--recompute selective under megatron with core_attn among its recompute modules (the default:
    megatron_recompute.py, stacks/megatron.toml [recompute])."""
    return "core_attn" in modules(setup)


def layer_terms(spec: ModelSpec, setup: Setup, moe: bool = False, quantised: bool = False,
                held: float = 1.0, load: float | None = None) -> MegatronLayer:
    """`quantised`: a layer inside --low-precision's recipe (te_recipes.saved_delta changes its linears' inputs);
    `held`: the (micro-batch, MoE layer) pairs the rank holds at once, whose routed copies are counted at the load
    of the rank that holds the most of them (moe_imbalance.held_load; 1: one pair, its busiest rank's); `load`: that
    load given instead (megatron_memory.saved_floors' least)."""
    rep, split, scores, mask, stat = per_token_terms(spec, setup, moe, quantised)
    if moe:  # the busiest expert-parallel rank's routed copies, X times the balanced ones (moe_imbalance.py)
        if load is None:
            load = held_load(busiest_rank_load(spec, setup, setup.batch * setup.seq / setup.cp), held)
        split = dict(split)
        for name in ("expert_tokens", "expert_hidden"):
            split[name] *= load
    if modules(setup) - {"core_attn"}:  # --recompute-modules beyond the attention core (megatron_recompute.py)
        rep, split = dropped(spec, setup, moe, act_bytes(setup), stat, rep, split)
    return MegatronLayer(rep, split, scores, mask)


_TERMS = cache()  # per_token_terms' memo
# per_token_terms reads neither the micro-batch nor the ZeRO stage: a layout's ZeRO stages share it
TERMS_FIXED = MICRO_BATCH + (("zero", 0),)


def per_token_terms(spec: ModelSpec, setup: Setup, moe: bool, quantised: bool) -> tuple:
    """(replicated, split, scores, mask, one norm's statistics bytes) of layer_terms before the routed copies' load
    and the recompute modules' drops: bytes per token (per token and key, per key pair), so independent of the
    micro-batch and the accumulation; nor do they read the ZeRO stage (the activation dtype is the precision's:
    precision._state_bytes act; the rest the attention kernel, the device, the recompute modules, the expert layout
    and the recipe). Memoised on the setup without them (batch_free with TERMS_FIXED: every other setting, the stack
    folders) and the layer's kind; shared, never changed (layer_terms copies what it scales)."""
    return memo(_TERMS, spec, setup, (moe, quantised), lambda: _per_token_terms(spec, setup, moe, quantised),
                TERMS_FIXED)


def _per_token_terms(spec: ModelSpec, setup: Setup, moe: bool, quantised: bool) -> tuple:
    """per_token_terms, computed."""
    a = act_bytes(setup)
    h, q, kv, nh = spec.hidden, spec.q_dim, spec.kv_dim, spec.heads
    _, p_attn, p_hidden = spec.dropouts
    eager = setup.attention_kernel == "eager"
    rep: dict = {}
    split: dict = {}
    # Korthikanti eq. 1 "LayerNorm ... stores its input 2sbh" (×2 norms): TE's _LayerNormLinear saves `inputmat`
    rep["norm_inputs"] = 2 * a * h
    # Korthikanti "QKV ... input 2sbh", "MLP ... first linear stores its input 2sbh": TE saves `ln_out` (the local
    # shard under SP, re-gathered in backward)
    rep["linear_inputs"] = 2 * a * h
    # Korthikanti "dropout ... mask sbh" after attention and after the MLP (bias_dropout_add: 1-byte masks)
    if p_hidden > 0:
        rep["dropout_masks"] = 2 * MASK * h
    # not in the paper: TE's norms keep fp32 statistics per token (LayerNorm mu + rsigma, RMSNorm rsigma); the local
    # spec's torch.nn.LayerNorm (torch_norm.py WrappedTorchNorm) saves mean and rstd in the input's dtype on CPU
    # (aten native_layer_norm's CPU kernel; measured: 2 bytes each under bf16)
    stat = a if local_spec(setup) else FP32
    rep["norm_statistics"] = 2 * stat * (2 if spec.norm == "layernorm" else 1)
    # Korthikanti "QK^T ... Q and K 4sbh", "attention over values ... V 2sbh": GQA's k, v are kv_dim wide
    split["qkv"] = a * (q + 2 * kv)
    # Korthikanti "output projection stores its input 2sbh": the attention core's output (TE/flash return it,
    # linear_proj saves it; one tensor)
    split["attention_output"] = a * q
    scores = mask = 0.0
    if eager and not attention_core_recomputed(setup):
        # Korthikanti "softmax output 2as²b", "softmax dropout mask as²b", "dropout output 2as²b" (per head)
        scores = nh * (a + ((MASK + a) if p_attn > 0 else 0))
        if local_spec(setup):
            # masked_softmax_fusion is off by default (transformer_config.py:357) and the fused kernel needs 16-bit
            # CUDA input (fused_softmax.py:253-260): forward_torch_softmax upcasts 16-bit scores (fused_softmax.py:
            # 313-314, attention_softmax_in_fp32 transformer_config.py:343), torch softmax saves its fp32 output,
            # and the 16-bit copy of the probabilities (fused_softmax.py:335-339) is what bmm saves
            # (dot_product_attention.py:229): fp32 + 16-bit per score (fp32 runs: the one fp32 tensor)
            scores += nh * (FP32 if a < FP32 else 0)
            # no mask is passed for causal attention: get_default_causal_mask builds a fresh [sq, sk] bool mask per
            # layer (transformer/utils.py:33-35, fused_softmax.py:323-327), kept by masked_fill_ for backward
            # (transformer/utils.py:49-51)
            mask = MASK
    elif not eager and not attention_core_recomputed(setup):
        # TE FusedAttention/flash saves the softmax statistics (fp32 logsumexp, b·heads·s) beside q, k, v, out
        split["softmax_lse"] = FP32 * nh
    if moe:
        split.update(_moe_terms(spec, setup, a))
        rep.update(_moe_replicated(spec, a))
    else:
        i = spec.intermediate
        # Korthikanti "GeLU ... input 8sbh" (fc1's output, 4h wide; SwiGLU: 2i wide, bias_swiglu_impl saves it)
        split["fc1_output"] = a * i * (2 if spec.gated_mlp else 1)
        # Korthikanti "second linear ... input 8sbh": the activation's output, saved by linear_fc2
        split["activation_output"] = a * i
    if quantised:
        d_rep, d_split = saved_delta(spec, setup, a, moe, attention_core_recomputed(setup))
        rep = {k: rep.get(k, 0.0) + d_rep.get(k, 0.0) for k in rep | d_rep}
        split = {k: split.get(k, 0.0) + d_split.get(k, 0.0) for k in split | d_split}
    return rep, split, scores, mask, stat * (2 if spec.norm == "layernorm" else 1)


def _moe_replicated(spec: ModelSpec, a: int) -> dict:
    """The MoE block's router on every TP rank's tokens (transformer/moe/router.py TopKRouter: logits = input @
    weightᵀ, softmax over experts in fp32 (moe_router_dtype), top-k indices): fp32 probabilities per expert and the
    top-k routing map. NB: the pre-MLP norm is a separate TENorm for MoE (its output is the router's and the
    dispatcher's input): counted as the dense layer's fused norm + ln_out."""
    m = spec.moe
    return {"router": FP32 * m.num_experts + INDEX * m.top_k}


def _moe_terms(spec: ModelSpec, setup: Setup, a: int) -> dict:
    """Per token, the experts' saved tensors under the all-to-all dispatcher with TEGroupedMLP
    (transformer/moe/token_dispatcher.py MoEAlltoAllTokenDispatcher, experts.py TEGroupedMLP), balanced
    routing. A rank holds tokens/t tokens (sequence parallel) and its local experts receive top_k copies of as many;
    the expert-TP group all-gathers its members' copies (etp × as many tokens) and splits the intermediate etp ways.
    Per copy: fc1's input, h wide, ×etp; fc1's output (SwiGLU: 2i) and the activation's output (i, fc2's input),
    whose etp-fold tokens and 1/etp width cancel. fc2's output is not saved: the routing probabilities are applied
    inside the activation (experts.py:680-746 bias_act_func(fc1_output, bias, permuted_probs); the expert bias as
    t + b·p, :609-625) and the combine unpermutes without them (token_dispatcher.py:833-840, no probs; TE v2.10
    permutation.py:375-378 _moe_unpermute_mask_map saves only row_id_map without merging_probs).
    As 'split by TP' terms (÷t: the rank's tokens/t); layer_terms scales them to the busiest EP rank's load.
    gpt-oss's clamps before its fused activation (fusions/fused_bias_geglu.py:424-432) save fc1's output while the
    fused kernel saves their clamped cat: 2i more per copy (clamped).
    NB: without SP (Megatron requires it for MoE with TP > 1) counted as with SP."""
    m = spec.moe
    k, i = m.top_k, m.expert_intermediate
    gate = 2 if spec.gated_mlp else 1
    out = {"expert_tokens": k * a * spec.hidden * setup.expert_tp,
           "expert_hidden": k * a * i * (gate + 1 + clamped(spec))}
    if m.shared_intermediate:
        s = m.shared_intermediate
        out["shared_expert"] = a * s * (gate + 1)  # SharedExpertMLP: an ordinary MLP, column/row-parallel over tp
    return out


def clamped(spec: ModelSpec) -> int:
    """Features per routed copy the clamps' cat adds to the saved tensors (_moe_terms): gate (2i wide) for a clamped
    GLU (gpt-oss's swiglu_limit), else 0."""
    return (2 if spec.gated_mlp else 1) if spec.moe is not None and spec.moe.swiglu_limit else 0


def layer_input(spec: ModelSpec, setup: Setup) -> float:
    """Bytes per token of a layer's input, what a checkpoint keeps (Korthikanti §5: full recompute stores 2sbh,
    /t with sequence parallelism: tensor_parallel/random.py CheckpointFunction saves the hidden states)."""
    return act_bytes(setup) * spec.hidden / (setup.tp if setup.sequence_parallel else 1)
