"""Inference memory and speed per rank: weights, KV cache, one layer's transient activations.

KV cache = 2 (k and v) · layers · kv_heads · head_dim · batch · tokens · bytes (Pope et al. 2022, "Efficiently
Scaling Transformer Inference", §2.1), GQA/MQA aware through kv_heads. Decode is memory-bound: each step
streams the weights and the KV cache once (roofline, Williams et al. 2009); prefill is compute-bound.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import SetupError
from ..setup import Setup
from ..spec import ModelSpec
from .activations import FP32, family_traits, linear_params_per_layer, resolved_kernel
from .params import ParamCounts, count_params
from .precision import DTYPE_BYTES, state_bytes


@dataclass(frozen=True)
class InferMemory:
    weights: int
    kv_cache: int
    activations: int  # prefill's largest transient (one layer at a time, nothing saved)
    logits: int
    prefill_peak: int
    decode_peak: int


def kv_dtype(spec: ModelSpec, setup: Setup) -> str:
    """The cache's dtype: that of k. Under autocast, rotary models multiply k by fp32 cos/sin, which promotes it
    to fp32, and HF's DynamicLayer allocates v like k (observed in measured amp-bf16 runs)."""
    if setup.kv_dtype:
        return setup.kv_dtype
    if setup.precision == "fp32" or (setup.precision.startswith("amp") and spec.positions == "rotary"):
        return "fp32"
    return "fp16" if setup.precision in ("fp16", "amp-fp16") else "bf16"


def kv_bytes_per_token(spec: ModelSpec, setup: Setup) -> float:
    kv_dtype_ = kv_dtype(spec, setup)
    kv_heads_per_rank = max(spec.kv_heads / setup.tp, 1)  # kv heads are replicated when tp > kv_heads
    layers = spec.layers / setup.pp
    return 2 * layers * kv_heads_per_rank * spec.head_dim * DTYPE_BYTES[kv_dtype_]


def _prefill_transient(spec: ModelSpec, setup: Setup, tokens: int) -> float:
    """Largest set of live tensors inside one layer during a no-grad forward (read off traced prefills): the
    embedding output (HF's forward keeps `inputs_embeds` alive to the end), the layer's input and mid-layer
    residuals and the normalised copy, plus either attention (q, k, v, output; eager adds the s×s scores
    and probabilities) or the MLP (gate, up, product; fc1 and activation; four for HF's composite gelu_new)."""
    st = state_bytes(setup)
    a, r = st.act, st.residual
    t = setup.tp
    base = 4 * r * spec.hidden * tokens
    attn = a * (2 * spec.q_dim + 2 * spec.kv_dim) / t * tokens
    if resolved_kernel(spec, setup) == "eager":
        # HF's eager softmax(dtype=float32) copies the scores to fp32 beside its fp32 output (the scores stay
        # alive as its input), and the model's (b, 1, s, s) causal mask is live throughout; GPT-2's eager
        # softmaxes in the scores' dtype with a boolean mask.
        traits = family_traits(spec)
        if traits["eager_softmax_fp32"]:
            attn += ((2 * FP32 + (a if a != FP32 else 0)) * spec.heads / t + a * traits["causal_masks"]) * tokens * setup.seq
        else:  # GPT-2: scores and probabilities in the scores' dtype; the mask is a view of a buffer
            attn += 2 * a * spec.heads / t * tokens * setup.seq
    width = spec.moe.expert_intermediate * spec.moe.top_k if spec.moe else spec.intermediate
    if spec.gated_mlp:
        # gate and up (one 2×-wide output when fused: Phi-3, the MoE experts), the activation, the product
        live = 4 if (spec.moe or family_traits(spec)["fused_gate_up"]) else 3
    else:
        live = {"gelu_new": 4, "gelu_fast": 4}.get(spec.activation, 2)
    mlp = live * a * width / t * tokens
    if spec.moe:
        mlp += a * spec.hidden * spec.moe.top_k * tokens  # the tokens gathered for their experts
    if resolved_kernel(spec, setup) == "eager" and not family_traits(spec)["eager_softmax_fp32"]:
        mlp += a * spec.heads / t * tokens * setup.seq  # GPT-2's block holds the returned probabilities
    return base + max(attn, mlp)


def infer_memory(spec: ModelSpec, setup: Setup, pc: ParamCounts | None = None) -> InferMemory:
    pc = pc or count_params(spec)
    st = state_bytes(setup)
    n = pc.total / (setup.tp * setup.pp)
    weights = n * st.weight
    tokens = setup.batch * setup.seq
    kv = kv_bytes_per_token(spec, setup) * tokens
    act = _prefill_transient(spec, setup, tokens)
    # generate() computes the prefill logits of the last position only (logits_to_keep=1), in fp32
    logits = FP32 * spec.vocab / setup.tp * setup.batch
    # autocast caches each weight's low-precision cast for the whole autocast region (the layers' by the last one)
    casts = 0
    if setup.precision.startswith("amp"):
        casts = st.act * linear_params_per_layer(spec) * spec.layers / (setup.tp * setup.pp)
    if not spec.causal:  # encoders: one forward over the whole sequence, no KV cache, no decode
        # an MLM head scores every position (no loss: no upcast), after the layers' high point
        full_logits = st.act * spec.vocab / setup.tp * tokens
        peak = weights + casts + max(act, full_logits + 2 * st.residual * spec.hidden * tokens)
        return InferMemory(int(weights), 0, int(act), int(full_logits), int(peak), 0)
    prefill = weights + kv + act + logits + casts
    head_cast = st.act * spec.vocab * spec.hidden / setup.tp if casts else 0  # the LM head's, cast after the layers
    cached = setup.batch * (setup.seq + 1)
    # DynamicCache grows each layer's k and v with torch.cat: old and new live together for a moment; eager
    # attention with fewer kv heads than heads repeats k and v to every head (repeat_kv)
    layer_kv = kv_bytes_per_token(spec, setup) / (spec.layers / setup.pp) * cached
    repeated = 2 * st.act * spec.q_dim / setup.tp * cached if (resolved_kernel(spec, setup) == "eager"
                                                                 and spec.kv_heads < spec.heads) else 0
    decode = (weights + kv_bytes_per_token(spec, setup) * cached + layer_kv + repeated + casts + head_cast
              + _prefill_transient(spec, setup.with_(seq=1), setup.batch) + logits)
    return InferMemory(int(weights), int(kv), int(act), int(logits), int(prefill), int(decode))


def largest_batch(spec: ModelSpec, setup: Setup, capacity: int) -> int:
    """Largest batch at this context whose prefill and decode fit `capacity` bytes (0 if none)."""
    if infer_peak(spec, setup.with_(batch=1)) > capacity:
        return 0
    lo, hi = 1, 2
    while infer_peak(spec, setup.with_(batch=hi)) <= capacity and hi < 1 << 24:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if infer_peak(spec, setup.with_(batch=mid)) <= capacity else (lo, mid)
    return lo


def largest_context(spec: ModelSpec, setup: Setup, capacity: int) -> int:
    """Largest context (tokens) at this batch that fits `capacity`, up to the model's max positions × 64."""
    if infer_peak(spec, setup.with_(seq=1)) > capacity:
        return 0
    lo, hi = 1, 2
    limit = max(spec.max_positions, 1) * 64
    while infer_peak(spec, setup.with_(seq=hi)) <= capacity and hi < limit:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if infer_peak(spec, setup.with_(seq=mid)) <= capacity else (lo, mid)
    return lo


def infer_peak(spec: ModelSpec, setup: Setup) -> int:
    m = infer_memory(spec, setup)
    return max(m.prefill_peak, m.decode_peak)


def check_layout(spec: ModelSpec, setup: Setup) -> None:
    if setup.dp > 1 and setup.mode == "infer" and setup.zero:
        raise SetupError("--zero applies to training; inference replicas do not shard optimizer state")
