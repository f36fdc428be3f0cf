"""Inference memory and speed per rank: weights, KV cache, one layer's transient activations.

KV cache = 2 (k and v) · layers · kv_heads · head_dim · batch · tokens · bytes (Pope et al. 2022, "Efficiently
Scaling Transformer Inference", §2.1), GQA/MQA aware through kv_heads; MLA (DeepSeek) caches its compressed latent,
(kv_lora_rank + qk_rope_head_dim) · layers · batch · tokens · bytes (kv_values_per_token_layer). Decode is memory-bound: each step
streams the weights and the KV cache once (roofline, Williams et al. 2009); prefill is compute-bound.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ..errors import SetupError
from ..precision import PRECISIONS
from ..setup import Setup
from ..spec import ModelSpec
from .activations import (FP32, INDEX, attention_linear_params, family_traits, linear_params_per_layer,
                          masked_chunk_share, resolved_kernel)
from . import clamped_swiglu as swiglu
from . import cpu_flash
from . import gated_deltanet, mla, siglip, vlm
from . import sink_attention as sinks
from .embedding import rotary_tables
from .hybrid_inference import hybrid_infer_memory
from . import encoder_decoder
from .moe_every_expert import every_expert_prefill
from .onednn import gemm_scratch
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
    to fp32 (observed in measured amp-bf16 runs); v keeps the projection's dtype from transformers 5.24
    (values_keep_their_dtype)."""
    if setup.kv_dtype:
        return setup.kv_dtype
    # Llama 4's complex rotary returns k in its own dtype (modeling_llama4.py:226 `xk_out.type_as(xk)`)
    promoted = spec.positions == "rotary" and not family_traits(spec).get("rotary_complex")
    if setup.precision == "fp32" or (setup.precision.startswith("amp") and promoted):
        return "fp32"
    return "fp16" if setup.precision in ("fp16", "amp-fp16") else "bf16"


def kv_values_per_token_layer(spec: ModelSpec, tp: int = 1) -> float:
    """Cached values per token per layer on one tensor-parallel rank.
    MHA/GQA: k and v of each kv head, 2·kv_heads·head_dim (Pope et al. 2022 §2.1); kv heads are replicated when
    tp > kv_heads. MLA: the compressed latent c^KV and the shared RoPE key k^R, d_c + d_h^R values whatever the head
    count (DeepSeek-V2 paper arXiv:2405.04434 §2.1.3 and Table 1: (d_c + d_h^R)·l elements per token). vLLM caches
    exactly that, one latent per token replicated on every TP rank (vllm/attention/backends/mla/common.py: "a single
    latent vector to represent the per-token entry of the KV cache", kv_c [Skv, Lkv] + k_pe [Skv, R]); transformers
    5.x caches the same pair (modeling_deepseek_v3.py DeepseekV3Attention.forward: `past_key_values.update(kv_nope,
    k_rot)`, both (b, 1, s, ·)) and decompresses per step (see `mla_decompressed`)."""
    if spec.mla is not None:
        return spec.mla.kv_lora_rank + spec.mla.qk_rope_head_dim
    return 2 * kv_width(spec, tp)


def kv_width(spec: ModelSpec, tp: int = 1) -> float:
    """Values per token of k (or of v) on one tensor-parallel rank: kv heads × head_dim, the heads replicated when
    tp > kv_heads."""
    return max(spec.kv_heads / tp, 1) * spec.head_dim


def _layer_cache(spec: ModelSpec, setup: Setup, tokens: int) -> float:
    """One layer's cache of `tokens` tokens on this rank (the stage's cache over its layers)."""
    return kv_bytes_per_token(spec, setup) * tokens / (spec.layers / setup.pp)


def mla_decompressed(spec: ModelSpec, tp: int = 1) -> float:
    """Values per cached token that HF's MLA attention rebuilds for one layer at each decode step
    (modeling_deepseek_v3.py expand_kv): kv_b_proj's output heads·(nope + v) (v is a view of it) and the new
    key_states heads·(nope + rope) (k_rot is expanded as a view, then copied in). 0 for other attention."""
    m = spec.mla
    if m is None:
        return 0.0
    return spec.heads / tp * (m.qk_nope_head_dim + m.v_head_dim + m.qk_head_dim)


@lru_cache(maxsize=1)
def values_keep_their_dtype() -> bool:
    """HF's DynamicLayer allocates v in v's own dtype from transformers 5.24 (cache_utils.py lazy_initialization:
    `dtype=value_states.dtype`); up to 5.23 in k's (`dtype=self.dtype`, set from key_states). The installed
    version decides (read from its metadata, transformers is not imported); without it, the current behaviour."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        major, minor = (int(x) for x in version("transformers").split(".")[:2])
    except (PackageNotFoundError, ValueError):
        return True
    return (major, minor) >= (5, 24)


def kv_bytes_per_token(spec: ModelSpec, setup: Setup) -> float:
    """The HF generate cache's bytes per token, every layer, as the prefill leaves it. Sliding-window layers are not
    capped at the window here: transformers' DynamicSlidingWindowLayer keeps a slice (a view) of the prefill's whole
    k and v (cache_utils.py:242-247), so after the prefill each of them holds every prompt token (read off traces of
    tiny-gemma3 with a 64-token window at 2 x 200: within 0.6 %). Its decode update frees that storage for
    min(seq, window - 1) + 1 tokens (`sliding_decode_tokens`), which the decode peak counts for the layers updated
    before it (`_decode_cache_moment`). Serving engines cap them (serving.layer_kinds)."""
    k, v = kv_layer_bytes(spec, setup)
    if spec.mla is not None:
        return spec.layers / setup.pp * (k + v)
    # Qwen3-Next's Gated DeltaNet layers cache no k and v (their per-sequence state: linear_state_bytes); a hybrid
    # stack caches K and V in its attention blocks only (its Mamba blocks' states do not grow with the tokens:
    # hybrid_inference.block_cache_bytes)
    attention = spec.hybrid.attention_layers if spec.hybrid is not None else gated_deltanet.attention_layers(spec)
    return attention / setup.pp * (k + v)


def kv_layer_bytes(spec: ModelSpec, setup: Setup) -> tuple[float, float]:
    """(keys, values): the bytes one token adds to one attention layer's cache on one rank, each of the two tensors
    the HF cache layer keeps (DynamicLayer.keys and .values, cache_utils.py:134-137). MLA's latent is its `keys`
    and the shared RoPE key k^R its `values` (modeling_deepseek_v3.py: `cache.update(kv_nope, k_rot)`)."""
    k_bytes = v_bytes = DTYPE_BYTES[kv_dtype(spec, setup)]
    # under autocast the cache's "values" keep the 16-bit dtype they are made in (values_keep_their_dtype):
    # v, the projection's output; MLA's RoPE key k^R where DeepSeek-V2's complex rotary returns its input's dtype
    # (modeling_deepseek_v2.py apply_rotary_emb: `.type_as(xk)`; its latent is fp32, its norm's weight; V3 rotates
    # with fp32 cos/sin: both fp32)
    if not setup.kv_dtype and setup.precision.startswith("amp") and values_keep_their_dtype() and (
            spec.family == "deepseek_v2" if spec.mla is not None else spec.positions == "rotary"):
        v_bytes = DTYPE_BYTES[PRECISIONS[setup.precision].compute]
    if spec.mla is not None:
        return spec.mla.kv_lora_rank * k_bytes, spec.mla.qk_rope_head_dim * v_bytes
    per_head = kv_width(spec, setup.tp)
    return per_head * k_bytes, per_head * v_bytes


def linear_state_bytes(spec: ModelSpec, setup: Setup) -> float:
    """The Gated DeltaNet layers' cache (gated_deltanet.state_per_sequence) for the batch, constant in the sequence
    length; 0 without such layers."""
    if not gated_deltanet.linear_layers(spec):
        return 0.0
    act = state_bytes(setup).act
    return gated_deltanet.linear_layers(spec) / setup.pp * gated_deltanet.state_per_sequence(spec, act) * setup.batch


def _linear_moment(spec: ModelSpec, setup: Setup, tokens: int) -> float:
    """A Gated DeltaNet layer's high point (gated_deltanet.prefill_live; a one-token step's, decode_live) beside what
    the attention's moment holds (`_held`); 0 without such layers. The layer's input is the embedding output itself
    where the last linear layer is the first layer (Qwen3NextModel.forward: `hidden_states = inputs_embeds`)."""
    if not gated_deltanet.linear_layers(spec):
        return 0.0
    live = (gated_deltanet.prefill_live(spec, setup, tokens) if setup.seq > 1
            else gated_deltanet.decode_live(spec, setup, tokens))
    first = spec.linear_attn.last == 0
    return _held(spec, setup, tokens) - (state_bytes(setup).residual * spec.hidden * tokens if first else 0) \
        + live / setup.tp


def _linear_context(spec: ModelSpec, setup: Setup, per_layer_casts: float) -> float:
    """Beside the last linear layer's high point: the cache of the layers before it (k and v of its attention
    layers, the states of its linear layers; layers past it have cached nothing yet) and its own conv state (the
    recurrent state is written after the rule, :763); under autocast the weight casts of the layers before it
    (`per_layer_casts` each: NB the average layer's) and its own in_proj casts. The logits do not exist yet."""
    g = spec.linear_attn
    last = spec.layers - 1 if g.last < 0 else g.last
    st = state_bytes(setup)
    linear_before = g.layers - 1
    attention_before = last - linear_before
    per_attention_layer = kv_bytes_per_token(spec, setup) / max(gated_deltanet.attention_layers(spec), 1)
    cache = attention_before * per_attention_layer * setup.batch * setup.seq + \
        linear_state_bytes(spec, setup) * linear_before / g.layers + \
        st.act * g.conv_dim * g.conv_kernel * setup.batch / setup.tp
    casts = 0.0
    if st.autocast:
        in_proj = spec.hidden * (2 * g.key_dim + 2 * g.value_dim + 2 * g.value_heads)
        casts = last * per_layer_casts + st.act * in_proj / setup.tp
    return cache + casts


def _held(spec: ModelSpec, setup: Setup, tokens: int) -> float:
    """What a layer's high points hold beside its own tensors (`_prefill_moments`): the embedding output, the layer's
    input and its normalised copy, the rotary tables and positions, learned positions where the model keeps them."""
    st = state_bytes(setup)
    r, h = st.residual, spec.hidden
    traits = family_traits(spec)
    base = _stream(spec, r * h * tokens)
    if spec.positions == "rotary":
        base += rotary_tables(spec, setup.seq, r, setup.batch) + INDEX * setup.seq
    if traits["position_embeds_kept"]:
        base += r * (tokens if traits["positions_per_sequence"] else setup.seq) * h
    return base


def _stream(spec: ModelSpec, hidden_bytes: float) -> float:
    """A layer's residual-stream tensors at its high points, each `hidden_bytes`: the embedding output (kept by the
    model's forward), the layer's input and, pre-norm, its normalised copy. A post-norm layer (BERT, RoBERTa: family
    fact post_norm) reads its input as it is, the previous LayerNorm's output (modeling_bert.py BertLayer: no norm
    before the attention): no copy (traced tiny-bert prefill at 4 x 256: two such tensors beside the MLP's)."""
    return (2 if family_traits(spec)["post_norm"] else 3) * hidden_bytes


def _prefill_moments(spec: ModelSpec, setup: Setup, tokens: int, keys: int | None = None) -> tuple[float, float, float]:
    """(attention, MLP, residual add): the largest sets of live tensors inside one layer during a no-grad forward (read off traced prefills): the
    embedding output (HF's forward keeps `inputs_embeds` alive to the end), the rotary tables, the layer's input
    and mid-layer residuals and the normalised copy, plus either attention (q, k, v, output; eager adds the s×s
    scores and probabilities) or the MLP (gate, up, product; fc1 and activation; four for HF's composite
    gelu_new; the MoE block's routed copies). At the attention's high point the mid-layer residual does not exist
    yet; at the MLP's it does (GPT-NeoX's parallel residual holds the attention output instead). Eager attention's
    causal masks span `keys` keys (setup.seq; a decode step's: the cache, `_decode_moment`)."""
    st = state_bytes(setup)
    a, r = st.act, st.residual
    t = setup.tp
    h = spec.hidden
    traits = family_traits(spec)
    base = _stream(spec, r * h * tokens)  # the embedding output, the layer's input, the normalised copy
    if spec.positions == "rotary":
        # cos and sin (1, s, rotary_dim) in the hidden states' dtype, and the positions they came from, live
        # through all the layers (modeling_llama.py LlamaModel.forward: `position_embeddings`)
        base += rotary_tables(spec, setup.seq, r, setup.batch) + INDEX * setup.seq
    # Llama 4's chunked layers past the chunk: create_chunked_causal_mask's boolean (b, 1, s, s), held in the
    # model's causal_mask_mapping through every layer (modeling_llama4.py:552-562)
    base += setup.batch * setup.seq * setup.seq if masked_chunk_share(spec, setup) else 0
    if traits["position_embeds_kept"]:
        # GPT-2's forward keeps `position_embeds` (1, s, h) beside `inputs_embeds`; OPT's `pos_embeds` are (b, s, h)
        base += r * (tokens if traits["positions_per_sequence"] else setup.seq) * h
    if spec.mla is None and resolved_kernel(spec, setup) == "eager":
        # the model's causal masks over `keys` (setup.seq; a decode step's: the cache) live through every layer
        base += _eager_mask(spec, setup, tokens, setup.seq if keys is None else keys)
    attn = a * (2 * spec.q_dim + 2 * spec.kv_dim) / t * tokens
    if spec.mla is not None:
        autocast = setup.precision.startswith("amp")
        attn = mla.prefill_attention(spec, a=a, r=r, kernel=resolved_kernel(spec, setup), seq=setup.seq,
                                     tokens=tokens, tp=t, autocast=autocast,
                                     o_cast=a * o_proj_params(spec) / t if autocast else 0)
    elif resolved_kernel(spec, setup) == "eager":
        # the s x s scores (_eager_scores) beside q, k and v
        if traits["eager_softmax_fp32"]:
            # beside the scores: the rotated q, and k and v repeated to every head when kv_heads < heads (repeat_kv;
            # otherwise they are the cache's own tensors: k and v's projections went into DynamicCache's torch.cat);
            # the output does not exist yet. Under autocast, rotary's fp32 cos/sin promote q and k to fp32 (kv_dtype)
            promoted = setup.precision.startswith("amp") and spec.positions == "rotary"
            q_b = FP32 if promoted else a
            v_b = a if (promoted and values_keep_their_dtype()) else q_b
            attn = q_b * spec.q_dim / t * tokens
            if spec.kv_heads < spec.heads:
                attn += (q_b + v_b) * spec.q_dim / t * tokens
        attn += _eager_scores(spec, setup, tokens, setup.seq)
    elif resolved_kernel(spec, setup) == "math" and setup.device == "cuda" and siglip.image_block_masks(spec, setup):
        # Gemma 3's image-block masks (analytic/siglip.py): with a mask transformers repeats k and v to every head
        # and passes no enable_gqa (activations.masked_efficient_share), which the memory-efficient kernel takes
        attn += a * 2 * spec.q_dim / t * tokens
    elif resolved_kernel(spec, setup) == "math" and setup.device == "cuda":
        attn = _math_sdpa_prefill(spec, setup, tokens, a)
    elif traits["fused_qkv"] and spec.positions == "rotary":
        attn = _fused_rotary_attention(spec, setup, tokens, setup.seq if keys is None else keys)
    if spec.moe:
        mlp = _moe_prefill(spec, setup, st) / t * tokens
    else:
        if spec.gated_mlp:
            # gate and up (one 2×-wide output when fused: Phi-3), the activation, the product
            live = 4 if traits["fused_gate_up"] else 3
        else:
            live = _mlp_live(spec)
        mlp = live * a * spec.intermediate / t * tokens
    kept = 0
    if traits["block_keeps_attn_output"]:
        # GPT-2's block holds its attention's outputs (`attn_outputs`, modeling_gpt2.py GPT2Block.forward) through
        # the MLP: the output, and under eager attention the returned probabilities
        kept = a * h * tokens
        if resolved_kernel(spec, setup) == "eager":
            kept += a * spec.heads / t * tokens * setup.seq
    if spec.attn_sinks and resolved_kernel(spec, setup) == "eager":
        # gpt-oss's layer holds its attention's probabilities through the MLP (sink_attention.held_per_key)
        kept += sinks.held_per_key(spec, st) / t * tokens * setup.seq
    # the MLP's closing residual add (`hidden_states = residual + hidden_states`, modeling_llama.py
    # LlamaDecoderLayer.forward; OPT's modeling_opt.py OPTDecoderLayer.forward): the normalised copy is freed, the
    # MLP's output (a) and the mid residual make the new residual (r); on CPU, adding a 16-bit output to an fp32
    # residual first copies it to fp32 (TensorIterator compute_types; trace/cpu_casts.py). NB: a MoE block's output
    # is priced in the activation dtype.
    scratch = FP32 * h * tokens if (setup.device == "cpu" and a != r) else 0
    add = base - r * h * tokens + r * h * tokens + a * h * tokens + r * h * tokens + scratch + kept
    if traits["post_norm"] and not spec.gated_mlp:
        add = _post_norm_add(spec, setup, tokens, base, scratch)
    # an inline MLP (OPT) frees the normalised copy at fc1: the mid residual takes its place
    mid = 0 if traits["mlp_inline"] else r * h * tokens
    return base + attn, base + mid + mlp + kept, add


def _fused_rotary_attention(spec: ModelSpec, setup: Setup, tokens: int, keys: int) -> float:
    """Phi-3/GPT-NeoX's attention high point beside the stream: the fused projection's output stays whole beside
    rotary's new q (k goes to the cache), and the flash kernels' (b, h, s, d) output is copied for the output
    projection (activations._flash_saved); or, where more, the moment inside SDPA (_fused_rotary_sdpa)."""
    a, t = state_bytes(setup).act, setup.tp
    efficient = setup.device == "cuda" and a == FP32
    plain = a * (2 * spec.q_dim + 2 * spec.kv_dim) / t * tokens + a * spec.q_dim / t * tokens * (1 if efficient else 2)
    return max(plain, _fused_rotary_sdpa(spec, setup, tokens, keys))


def _fused_rotary_o_proj(spec: ModelSpec, setup: Setup, tokens: int) -> float:
    """Beside the stream inside a fused-qkv rotary layer's output projection (oneDNN's scratch is the caller's): SDPA's
    autocast casts, logsumexp and buffers died as it returned (a packed CPU kernel's K/V copies too: cpu_flash.py),
    and its output with the transpose's contiguous copy the projection reads; the fused projection's output and
    rotary's q stay, and the projection's output is made (the traced small-gpt_neox amp-bf16 CPU prefill at 8 x 200:
    10,290,528 B live after layer 1's dense addmm, its weight's cast among them)."""
    st = state_bytes(setup)
    a, t = st.act, setup.tp
    q, kv = spec.q_dim / t, kv_width(spec, t)
    rot_q = FP32 if st.autocast and spec.positions == "rotary" else a
    return (a * (q + 2 * kv) + rot_q * q + a * q + a * spec.hidden) * tokens


def _fused_rotary_sdpa(spec: ModelSpec, setup: Setup, tokens: int, keys: int) -> float:
    """Inside SDPA's flash kernel (CPU flash; CUDA flash / memory-efficient) in a fused-qkv rotary layer (GPT-NeoX,
    Phi-3), beside the stream and the caches: the fused projection's whole output a·(q + 2kv) (q, k, v are views of
    it), rotary's new q (promoted to fp32 by the fp32 cos/sin under autocast: kv_dtype), and under autocast SDPA's
    casts of that q and of the cache's fp32 k back to the 16-bit dtype (v keeps its own dtype from transformers
    5.24: values_keep_their_dtype; before, an fp32 v copied too); then the kernel's output (a·q), its fp32 logsumexp
    and, on the CPU, its buffers (_sdpa_returning; `keys`: the keys each query sees, a decode step's the cache). Read off the traced
    small-gpt_neox amp-bf16 CPU prefill at 8 x 200 (the peak inside layer 1's
    _scaled_dot_product_flash_attention_for_cpu). NB: the CUDA memory-efficient kernel pads the logsumexp to 32 rows
    (under by at most 31 per head and sequence)."""
    st = state_bytes(setup)
    a, t = st.act, setup.tp
    q, kv = spec.q_dim / t, kv_width(spec, t)
    promoted = st.autocast and spec.positions == "rotary"
    rot_q = FP32 if promoted else a
    casts = a * q + a * kv + (0 if values_keep_their_dtype() else a * kv) if promoted else 0
    return (a * (q + 2 * kv) + rot_q * q + casts + a * q) * tokens + _sdpa_returning(spec, setup, tokens, keys)


def _sdpa_returning(spec: ModelSpec, setup: Setup, tokens: int, keys: int) -> float:
    """What dies as the SDPA kernel returns, beside its output: its fp32 logsumexp (one per head and token) and, on
    the CPU, its own buffers (cpu_flash.scratch, over the rank's query heads, packed where the kernel packs; a
    decoder's prefill is causal)."""
    t = setup.tp
    scratch = cpu_flash.scratch(setup.seq, keys, spec.head_dim, state_bytes(setup).act, batch=setup.batch,
                                heads=spec.heads // t, causal=spec.causal,
                                dtype=PRECISIONS[setup.precision].compute) if setup.device == "cpu" else 0
    return FP32 * spec.heads / t * tokens + scratch


def _post_norm_add(spec: ModelSpec, setup: Setup, tokens: int, base: float, scratch: float) -> float:
    """A post-norm layer's (BERT, RoBERTa) closing add and LayerNorm: BertLayer.feed_forward_chunk holds
    `intermediate_output` (the activation's output, a·i) while BertOutput.forward runs `self.LayerNorm(hidden_states
    + input_tensor)` on the down projection's output (a·h) and the mid residual (r·h, the attention's LayerNorm
    output) (modeling_bert.py BertOutput/BertLayer, transformers 5.24): the sum (r·h) and, beside it, either the CPU
    add's fp32 copy of the 16-bit output (`scratch`) or the LayerNorm's output (r·h: layer_norm runs in fp32 under
    autocast, on both autocast fp32 lists: torch/amp autocast_mode, aten/src/ATen/autocast_mode.cpp) with its mean
    and rstd (native_layer_norm's two (b, s, 1) outputs, NB: counted in r bytes; on a pure bf16 CPU run their dtype
    may differ, a few bytes per token). Read off the traced small-bert amp-bf16 CPU prefill at 8 x 200: the peak
    inside the last layer's output LayerNorm."""
    a, r = state_bytes(setup).act, state_bytes(setup).residual
    h = spec.hidden
    mid = r * h * tokens
    act_out = a * spec.intermediate / setup.tp * tokens
    return base + mid + act_out + a * h * tokens + r * h * tokens + max(scratch, r * h * tokens + 2 * r * tokens)


def _mlp_live(spec: ModelSpec) -> int:
    """A plain (ungated) MLP's intermediate-wide tensors at its activation's high point, fc1's output among them:
    fc1's output and the activation's (2); four for HF's composite gelu_new/gelu_fast (the input, its pow, and the
    tanh chain's temporaries: activations.py NewGELUActivation.forward); three for relu² (Nemotron), whose
    ReLUSquaredActivation.forward (transformers activations.py:211-214) holds `relu_applied` while torch.square
    makes its output (traced small-nemotron bf16 prefill at 8 x 200: up_proj's, relu's and pow's outputs, the peak)."""
    return {"gelu_new": 4, "gelu_fast": 4, "relu2": 3}.get(spec.activation, 2)


def _eager_scores(spec: ModelSpec, setup: Setup, rows: int, keys: int) -> float:
    """HF eager attention's score-sized tensors at its high point, `rows` queries (every sequence's) by `keys` keys,
    one TP rank: a prefill's s x s per sequence, a decode step's one row over the cache (eager_attention_forward,
    modeling_llama.py: `attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling`, the mask added,
    `softmax(attn_weights, dim=-1, dtype=torch.float32)`). HF's eager softmax(dtype=float32) copies the scores to
    fp32 beside its fp32 output (the scores stay alive as its input), and the model's (b, 1, q, k) causal mask is
    live throughout (`_eager_mask`, counted with the layer's stream); adding the fp32 mask (autocast) to 16-bit
    scores makes fp32 scores, which softmax(dtype=float32) does not copy: on CUDA 2 fp32 per score, on CPU the add's
    fp32 scratch copy of the 16-bit scores beside them (TensorIterator; trace/cpu_casts.py) as before the softmax's
    copy. GPT-2's eager softmaxes in the scores' dtype: scores and probabilities; gpt-oss's own eager attention:
    sink_attention.py."""
    st = state_bytes(setup)
    a, r, t = st.act, st.residual, setup.tp
    traits = family_traits(spec)
    if not traits["eager_softmax_fp32"]:
        return 2 * a * spec.heads / t * rows * keys
    if spec.attn_sinks:
        return sinks.prefill_scores(spec, st, rows, keys) / t
    low = a if a != FP32 and (a == r or setup.device == "cpu") else 0
    return (2 * FP32 + low) * spec.heads / t * rows * keys


def _eager_mask(spec: ModelSpec, setup: Setup, rows: int, keys: int) -> float:
    """Eager attention's causal masks, `rows` queries by `keys` keys: the model builds each kind's (b, 1, q, k) mask
    once, in the embeddings' dtype (r: fp32 under autocast), and holds it through the layers (masking_utils.py
    create_causal_mask, called from the model's forward: LlamaModel, GPT2Model in transformers 5.24; traced tiny-gpt2
    eager prefill at 4 x 256: its (4, 1, 256, 256) bf16 mask beside layer 3's MLP; family fact causal_masks)."""
    return state_bytes(setup).residual * family_traits(spec)["causal_masks"] * rows * keys


def _math_sdpa_prefill(spec: ModelSpec, setup: Setup, tokens: int, a: int) -> float:
    """The attention's high point on SDPA's math path (fp32 with GQA on CUDA: activations.resolved_kernel), read off
    traced prefills (qwen3, gemma3_text at 2 x 128): the rotated q and its scaled copy, k and v repeated to every
    query head (enable_gqa), the s×s scores and their softmax per head, and the causal mask as one additive (s, s)
    tensor of the query's dtype (torch aten/src/ATen/native/transformers/attention.cpp
    _scaled_dot_product_attention_math); k and v themselves are the cache's tensors. The output does not exist yet.
    The decode step's math path over the cache: `_running_layer`."""
    t = setup.tp
    return (a * 4 * spec.q_dim / t * tokens + 2 * a * spec.heads / t * tokens * setup.seq
            + a * setup.seq * setup.seq)


def _prefill_gemms(spec: ModelSpec, setup: Setup, tokens: int, attn: float, mlp: float) -> tuple[float, float, float]:
    """(output projection, MLP's first matmul, MLP's last matmul): what is live inside each of the layer's largest
    matmuls, oneDNN's scratch included (onednn.py: a transient inside the op, beside its output; 0 off its path).
    Each is a moment of `_prefill_moments` less what is born after that matmul, plus its output and scratch; under
    autocast plus the 16-bit copy of an fp32 input, which autocast makes per call (its weight casts are the caller's:
    casts_attn + the output projection's, casts_mlp, and all of them at the last matmul). Without scratch they top
    their moment only where such a copy outweighs what is born later: OPT under autocast, whose fc1 holds the fp32
    normalised copy and its 16-bit cast (small-opt amp-bf16 prefill on CUDA semantics: -2.1 % -> -0.1 % against the
    trace).
      output projection (SDPA kernels): q's rotated copy and the kernel's output beside the projection's output, the
        moment's k and v gone (read off traced prefills of small-llama, -qwen2, -opt); a fused q/k/v projection
        keeps its whole output (its k and v are views): with rotary, that output, rotary's q, SDPA's output copied
        contiguous and the projection's output, SDPA's casts and buffers gone (_fused_rotary_o_proj; small-gpt_neox),
        without (GPT-2's c_attn), the moment and the projection's output;
      MLP, gated: the up projection, the activated gate beside it (the product not made yet); a fused gate_up, its own
        output alone; the down projection, the product beside its output (gate and up freed; a fused gate_up's
        storage still held by the gate's view: modeling_phi3.py Phi3MLP.forward);
      MLP, one activation: fc1's output alone, and OPT's inline MLP (mlp_inline) still holds the normalised copy it
        frees at fc1; fc2 with the activation's output beside its own.
    NB: not modelled (an under-count where the peak falls inside one, on a CPU that takes oneDNN's path): eager and
    MLA attention's projections and eager's bmm, the MoE experts' matmuls, q/k/v's projections (below the
    attention moment in the traced prefills), and the LM head, which runs on the last position only (generate's
    logits_to_keep=1: batch rows)."""
    st = state_bytes(setup)
    a, r, t, h = st.act, st.residual, setup.tp, spec.hidden
    traits = family_traits(spec)
    cast_in = a * h * tokens if st.autocast and r != a else 0  # autocast's copy of an fp32 input
    o_gemm = first = last = 0.0
    tb = not traits["conv1d_weights"]  # x·Wᵀ (nn.Linear) or x·W (Conv1D): B's layout (onednn.py, AMX)

    def gemm(m: float, k: float, n: float) -> int:
        return gemm_scratch(setup, m, k, n, transposed_b=tb)

    kernel = resolved_kernel(spec, setup)
    if spec.mla is None and kernel != "eager":
        if not traits["fused_qkv"]:
            live = attn - 2 * a * spec.kv_dim / t * tokens + a * h * tokens
        elif spec.positions == "rotary":
            live = attn - _fused_rotary_attention(spec, setup, tokens, setup.seq) + \
                _fused_rotary_o_proj(spec, setup, tokens)
        else:
            live = attn + a * h * tokens
        o_gemm = live + gemm(tokens, spec.q_dim / t, h)
    if spec.moe is None:
        i = spec.intermediate / t
        if spec.gated_mlp:
            live = 4 if traits["fused_gate_up"] else 3  # as _prefill_moments counts them at the product
            width = 2 * i if traits["fused_gate_up"] else i
            first = mlp - (live - 2) * a * i * tokens + cast_in + gemm(tokens, h, width)
            held = (live - 3) * a * i * tokens  # the fused gate_up's storage, minus the freed activation
            last = mlp - 2 * a * i * tokens + held + a * h * tokens + gemm(tokens, i, h)
        else:
            live = _mlp_live(spec)
            inline = r * h * tokens if traits["mlp_inline"] else 0
            first = mlp - (live - 1) * a * i * tokens + cast_in + inline + gemm(tokens, h, i)
            last = mlp - (live - 1) * a * i * tokens + a * h * tokens + gemm(tokens, i, h)
    return o_gemm, first, last


def o_proj_params(spec: ModelSpec) -> int:
    """The attention output projection's weights: h·q_dim, MLA's heads·v_head_dim·h (mla.linear_params)."""
    if spec.mla is not None:
        return spec.heads * spec.mla.v_head_dim * spec.hidden
    return spec.hidden * spec.q_dim


def cast_params(spec: ModelSpec) -> float:
    """Per layer (averaged over dense and MoE layers), the weights autocast casts: the matmuls' — the MoE experts
    run grouped_mm outside autocast (moe.py), so a MoE layer casts its attention, router and shared expert."""
    # Qwen3-Next: the Gated DeltaNet layers' projections in place of attention's (gated_deltanet.linear_params)
    mixer = attention_linear_params(spec)
    if gated_deltanet.linear_layers(spec):
        n_lin = gated_deltanet.linear_layers(spec)
        mixer = ((spec.layers - n_lin) * mixer + n_lin * gated_deltanet.linear_params(spec)) / spec.layers
    dense = linear_params_per_layer(spec) - attention_linear_params(spec) + mixer
    if spec.moe is None:
        return dense
    m = spec.moe
    h = spec.hidden
    moe_layer = mixer + m.num_experts * h + \
        (3 * h * m.shared_intermediate + h if m.shared_intermediate else 0)
    if m.experts_every_token:
        # Llama 4's experts are torch.bmm, on autocast's lower-precision list: their gate_up and down weights are
        # cast too (modeling_llama4.py:78-81); its shared expert has no gate
        moe_layer = attention_linear_params(spec) + m.num_experts * h * (1 + 3 * m.expert_intermediate) + \
            3 * h * m.shared_intermediate
    n_moe = spec.moe_layers
    return (n_moe * moe_layer + (spec.layers - n_moe) * dense) / spec.layers


def _moe_prefill(spec: ModelSpec, setup: Setup, st) -> float:
    """Per token, the MoE block's high point in a no-grad forward (moe.py for the kernels): either the experts'
    activation (the routed copies of the input, gate_up's output, act(gate), the product) or the routing multiply
    (the input copies, down's output, the weighted output and its reordered copy), all in the experts' weight
    dtype (grouped_mm runs outside autocast) except the weighted ones (promoted to the routing weights' dtype)."""
    m = spec.moe
    if m.experts_every_token:  # Llama 4: every expert on every token (moe_every_expert.py)
        return every_expert_prefill(spec, setup)
    h, k, i = spec.hidden, m.top_k, m.expert_intermediate
    ex = int(st.weight)
    wb = FP32 if not family_traits(spec)["moe_weights_logits_dtype"] else max(ex, st.act)
    # (gpt-oss's clamped SwiGLU holds more i-wide tensors at its last product: clamped_swiglu.py)
    gate_live = swiglu.prefill_gate_live(spec)
    routed = max(ex * k * (h + gate_live * i), k * h * (2 * ex + 2 * wb))
    # the router's fp32 softmax and top-k, the sort's indices and the routing weights
    router = FP32 * m.num_experts + (INDEX + FP32) * k + (2 * INDEX + 2 * wb) * k
    if m.router_scoring == "topk_softmax":
        router = swiglu.prefill_router(spec, st.act, wb)
    shared = 0
    if m.shared_intermediate:
        shared = st.act * h  # Qwen2-MoE computes its shared expert first and holds the output
    return routed + router + shared


def infer_memory(spec: ModelSpec, setup: Setup, pc: ParamCounts | None = None) -> InferMemory:
    pc = pc or count_params(spec)
    st = state_bytes(setup)
    n = pc.total / (setup.tp * setup.pp)
    weights = n * st.weight
    if spec.hybrid is not None:  # Mamba-2 / attention / MLP blocks (hybrid_inference.py)
        return hybrid_infer_memory(spec, setup, weights)
    if spec.encdec is not None:  # an encoder-decoder's two stacks and two caches (encoder_decoder.py)
        return encoder_decoder.infer_memory(spec, setup, weights)
    tokens = setup.batch * setup.seq
    # the prompt's token ids (b, seq) int64: an input, held by the caller through the prefill and the decode step
    # (generate() keeps input_ids; step/infer.py inference_step), and at decode the new token's (b, 1) beside them
    ids = INDEX * tokens
    kv = kv_bytes_per_token(spec, setup) * tokens + linear_state_bytes(spec, setup)
    attn_moment, mlp_moment, add_moment = _prefill_moments(spec, setup, tokens)
    linear_moment = _linear_moment(spec, setup, tokens)
    act = max(attn_moment, mlp_moment, add_moment, linear_moment)
    o_gemm, mlp_first, mlp_last = _prefill_gemms(spec, setup, tokens, attn_moment, mlp_moment)
    # generate() computes the prefill logits of the last position only (logits_to_keep=1), in fp32
    logits = FP32 * spec.vocab / setup.tp * setup.batch
    # autocast caches each weight's low-precision cast for the whole autocast region (the layers' by the last one)
    casts = casts_attn = casts_mlp = casts_o = 0
    if setup.precision.startswith("amp"):
        casts = st.act * cast_params(spec) * spec.layers / (setup.tp * setup.pp)
        # at the last layer's high points its later matmuls have not been cast yet: the output projection and the
        # MLP at its attention, a dense MLP's down projection at its activation
        h = spec.hidden
        later_mlp = 0 if spec.moe else h * spec.intermediate
        if spec.moe and spec.moe.experts_every_token:
            # Llama 4's MoE high point is at the experts' product (every_expert_prefill): the down bmm and the
            # shared expert (which runs after the experts) have not cast their weights yet
            later_mlp = spec.moe.num_experts * spec.moe.expert_intermediate * h + 3 * h * spec.moe.shared_intermediate
        mlp_casts = (cast_params(spec) - attention_linear_params(spec)) if spec.moe else \
            (3 if spec.gated_mlp else 2) * h * spec.intermediate
        casts_attn = casts - st.act * (o_proj_params(spec) + mlp_casts) / setup.tp
        casts_mlp = casts - st.act * later_mlp / setup.tp
        # inside the output projection its own weight (and bias) is cast too
        casts_o = casts_attn + st.act * (o_proj_params(spec) + (h if spec.out_bias else 0)) / setup.tp
    if not spec.causal:  # encoders: one forward over the whole sequence, no KV cache, no decode
        # an MLM head scores every position (no loss: no upcast), after the layers' high point: the encoder's output
        # and the transform's normalised output beside the logits; under autocast with every matmul's cast
        # (biases included) cached, the transform's and the decoder's among them
        full_logits = st.act * spec.vocab / setup.tp * tokens
        # (its high point is inside the decoder's matmul, tokens x hidden x vocab: oneDNN's scratch, onednn.py)
        # the transform's LayerNorm (its input the 16-bit GELU output) runs in fp32 under CUDA autocast (layer_norm
        # is on CUDA's fp32 list, torch/testing/_internal/autocast_test_lists.py:148; not on the CPU lists,
        # AutocastCPUTestLists :242-, where it returns its input's dtype) and its output is cast for the decoder's
        # matmul, a copy that lives through it (traced small-bert amp-bf16 CUDA prefill at 8 x 200: the encoder
        # output, the fp32 LayerNorm output and its bf16 copy beside the logits; on the CPU a bf16 output, no copy)
        norm = st.residual if (st.autocast and setup.device == "cuda") else st.act
        copy = st.act if norm != st.act else 0
        head = full_logits + (st.residual + norm + copy) * spec.hidden * tokens + \
            gemm_scratch(setup, tokens, spec.hidden, spec.vocab / setup.tp)
        if casts:
            h = spec.hidden
            head += casts + st.act * (h * h + h + (spec.vocab * h + spec.vocab) / setup.tp)
        peak = weights + ids + max(attn_moment + casts_attn, mlp_moment + casts_mlp, add_moment + casts, head,
                             o_gemm + casts_o, mlp_first + casts_mlp, mlp_last + casts)
        return InferMemory(int(weights), 0, int(act), int(full_logits), int(peak), 0)
    # at the residual add every matmul of the layer has cast its weight
    linear_prefill = linear_moment + _linear_context(spec, setup, casts / spec.layers) if linear_moment else 0
    # a VLM (analytic/vlm.py): the pixel rows (an input held through generate) and, under autocast, the tower's
    # cached weight casts; the tower's outputs held through the layers; the tower's own high point (its first
    # block's rotary) before them
    pixels = vlm.tower_inputs(spec, setup) + vlm.tower_casts(spec, setup, st)
    head_cast = st.act * spec.vocab * spec.hidden / setup.tp if casts else 0  # the LM head's, cast after the layers
    # the logits exist only at the forward's end, after the layers (the LM head is its last op): beside the whole
    # cache, the embedding output, the last hidden state and its normalised copy (`_held`), every cast
    head = _held(spec, setup, tokens) + logits + casts + head_cast
    held = kv + vlm.encoder_outputs_held(spec, setup, st)
    prefill = weights + pixels + ids + max(linear_prefill, vlm.tower_prefill_peak(spec, setup, st), held + max(
        attn_moment + casts_attn, mlp_moment + casts_mlp, add_moment + casts, o_gemm + casts_o,
        mlp_first + casts_mlp, mlp_last + casts, head, _q_norm_moment(spec, setup, tokens, casts_attn),
        _rotary_moment(spec, setup, tokens, casts_attn)))
    # NB: an eager attention bmm's oneDNN scratch (a CPU step in 16 bits: onednn.py) is not counted at decode, an
    # under-count where the decode peak falls inside one (tiny-gpt-oss 2 x 128 bf16 CPU: -4.3 %)
    decode = (weights + pixels + ids + INDEX * setup.batch + linear_state_bytes(spec, setup) + casts + head_cast
              + _decode_moment(spec, setup, logits))
    return InferMemory(int(weights), int(kv), int(act), int(logits), int(prefill), int(decode))


def _q_norm_moment(spec: ModelSpec, setup: Setup, tokens: int, casts_attn: float) -> float:
    """MLA's q_a_layernorm high point in the last layer (mla.q_norm_prefill) beside the whole cache less this
    layer's own (not written yet) and the layer's stream (`_held`); under autocast with the casts of the layers
    before and of this layer's q_a_proj only (`casts_attn` less its later attention matmuls: q_b, kv_a, kv_b;
    NB: q_a_proj's bias, if any, is not counted). 0 without MLA or a q LoRA."""
    if spec.mla is None or not spec.mla.q_lora_rank:
        return 0.0
    st = state_bytes(setup)
    own = _layer_cache(spec, setup, tokens)
    later = mla.projection_params(spec) - spec.hidden * spec.mla.q_lora_rank
    casts = casts_attn - st.act * later / setup.tp if casts_attn else 0
    return _held(spec, setup, tokens) + mla.q_norm_prefill(spec, a=st.act, tokens=tokens) + casts - own


def _rotary_moment(spec: ModelSpec, setup: Setup, tokens: int, casts_attn: float) -> float:
    """Inside the last layer's apply_rotary_pos_emb (modeling_llama.py: `k_embed = (k * cos) + (rotate_half(k) *
    sin)`, after q's) with separate q, k, v projections: their outputs a·(q + 2kv) (held by the attention's locals),
    q_embed, k·cos and the product with sin (in cos's dtype: fp32 under autocast, kv_dtype), rotate_half(k) (a, a
    torch.cat), and on the CPU under autocast the mixed-dtype mul's fp32 copy of that 16-bit operand
    (TensorIterator; trace/cpu_casts.py); beside the stream (`_held`), the casts of the layers before and this
    layer's q, k, v (`casts_attn`) and the caches of the layers before (this one's is written after). Read off the
    traced small-llama amp-bf16 CPU prefill at 8 x 200 (the peak at layer 1's `rotate_half(k) * sin`). 0 where the
    projections are fused, for MLA and for complex rotary (their own paths)."""
    traits = family_traits(spec)
    if (spec.positions != "rotary" or spec.mla is not None or traits["fused_qkv"] or traits.get("rotary_complex")
            or spec.rotary_fraction != 1.0 or spec.hybrid is not None or gated_deltanet.linear_layers(spec)):
        return 0.0
    st = state_bytes(setup)
    a, t = st.act, setup.tp
    q, kv = spec.q_dim / t, kv_width(spec, t)
    rq = FP32 if st.autocast else a
    scratch = FP32 * kv if (setup.device == "cpu" and rq != a) else 0
    own = _layer_cache(spec, setup, tokens)
    live = (a * (q + 2 * kv) + rq * q + 2 * rq * kv + a * kv + scratch) * tokens
    return _held(spec, setup, tokens) + live + casts_attn - own


def cache_window(spec: ModelSpec) -> int | None:
    """The tokens a windowed layer's HF cache keeps (None: no such layers): the sliding window, or Llama 4's attention
    chunk: transformers caches a chunked layer in a DynamicSlidingWindowLayer whose window is the chunk
    (cache_utils.py get_layer_types_and_kwargs: `chunked_attention` -> sliding_window=attention_chunk_size; the
    LAYER_CLASS_MAP comment "sliding and chunked are the same [...] only the mask differs")."""
    return spec.sliding_window or spec.attention_chunk


def sliding_decode_tokens(spec: ModelSpec, seq: int) -> int:
    """Tokens a windowed layer's cache storage holds once the decode step has updated it: transformers'
    DynamicSlidingWindowLayer.update (cache_utils.py:242-250) concatenates the tokens it kept (a view of the last
    window - 1 of the previous storage) with the new one, keeps a view of the last window - 1 of the result and
    returns the result whole: min(seq, window - 1) + 1 tokens, the prompt's storage freed with the old view."""
    return min(seq, cache_window(spec) - 1) + 1


def _sliding_layers_per_stage(spec: ModelSpec, setup: Setup) -> float:
    """The attention layers on one pipeline stage whose cache is a DynamicSlidingWindowLayer (every layer the config
    gives a window: cache_utils.py get_layer_types_and_kwargs; sliding_window_layers None: all of them; Llama 4's
    chunked layers)."""
    if spec.sliding_window:
        attention = gated_deltanet.attention_layers(spec)
        return (attention if spec.sliding_window_layers is None else spec.sliding_window_layers) / setup.pp
    return spec.chunked_layers / setup.pp if spec.attention_chunk else 0.0


def _decode_moment(spec: ModelSpec, setup: Setup, logits: float) -> float:
    """The decode step's high point beside the weights, the casts and the linear layers' states: the larger of
      inside the running layer's attention: the cache as its update leaves it (`_decode_cache_moment`) beside the
        layer's one-token attention tensors (q, k, v, output: NB over by those not born yet at the update);
      inside a layer's MLP or residual add (or a Gated DeltaNet layer's step): the updated cache
        (`_decode_cache_between`) beside that one-token moment;
      at the LM head: the updated cache, the embedding output, the last hidden state and its normalised copy, and
        the last position's logits, which exist only after the layers (the forward's last op).
    The cache-sized tensors dominate the first wherever the cache outweighs a layer's one-token activations."""
    one = setup.with_(seq=1)
    b = setup.batch
    attn, mlp, add = _prefill_moments(spec, one, b, keys=setup.seq + 1)
    between = _decode_cache_between(spec, setup)
    # inside the layer's largest one-token matmuls, their oneDNN scratch (a 16-bit CPU step: onednn.py) beside their
    # output, the running layer's cache already updated (traced decode of tiny-llama bf16 at 4 x 64: the down
    # projection's 134,784 B of scratch at the step's high point)
    gemms = _prefill_gemms(spec, one, b, attn, mlp)
    return max(_decode_cache_moment(spec, setup) + attn,
               between + max(mlp, add, _linear_moment(spec, one, b), *gemms),
               between + _held(spec, one, b) + logits)


def _decode_cache_between(spec: ModelSpec, setup: Setup) -> float:
    """The cache between two layers' decode updates, at its largest: every full-attention layer at seq + 1 tokens.
    NB: over by the windowed layers' cut (counted at the prompt's seq tokens, as before their update) where one has
    run: a layer's MLP moment rarely tops the update moments, whose cache-sized tensors are larger."""
    attention = max(gated_deltanet.attention_layers(spec), 1) / setup.pp
    per_layer = kv_bytes_per_token(spec, setup) / attention
    sliding = _sliding_layers_per_stage(spec, setup)
    s = setup.seq
    return per_layer * setup.batch * ((attention - sliding) * (s + 1) + sliding * s)


def _decode_cache_moment(spec: ModelSpec, setup: Setup) -> float:
    """The cache at the decode step's high point, with the running layer's cache-sized tensors. Layers update their
    caches in order, so inside a layer those before it hold their updated caches and those after it the prefill's:
    a sliding-window (or chunked) layer shrinks from the prompt's seq tokens to `sliding_decode_tokens` as it runs
    (read off traces of small-gpt_oss, small-gemma2, small-gemma3_text and small-llama4_text past their windows), a
    full layer grows by one token. The high point is inside the larger of
      a full-attention layer's: the last one (the cache only grows through them), after `spec.sliding_lead` sliding
        layers (updated), the rest still at the prompt;
      the first sliding layer's: every other layer at the prompt beside its own (`_running_layer`).
    NB: the full layers after the running one, where sliding layers follow it, count seq + 1 tokens (one over)."""
    b, s = setup.batch, setup.seq
    attention = max(gated_deltanet.attention_layers(spec), 1) / setup.pp
    per_layer = kv_bytes_per_token(spec, setup) / attention  # one attention layer's cache per token
    sliding = _sliding_layers_per_stage(spec, setup)
    full = attention - sliding
    moments = []
    if full > 0:
        lead = min(spec.sliding_lead, sliding)
        others = (full - 1) * (s + 1) + (sliding - lead) * s + (lead * sliding_decode_tokens(spec, s) if lead else 0)
        moments.append(per_layer * b * others + _running_layer(spec, setup, s, s + 1, sliding=False))
    if sliding > 0:
        others = full * (s + 1) + (sliding - 1) * s
        moments.append(per_layer * b * others +
                       _running_layer(spec, setup, s, sliding_decode_tokens(spec, s), sliding=True))
    return max(moments)


def _running_layer(spec: ModelSpec, setup: Setup, old: int, new: int, sliding: bool) -> float:
    """The running layer's cache-sized tensors at its high point, its cache going from `old` to `new` tokens per
    sequence; the larger of
      its update: a full layer's DynamicLayer.update (cache_utils.py:136-137, transformers 5.24) concatenates the keys,
        then the values, and rebinding `self.keys` frees the old keys before the values' cat: old and new keys beside
        the old values, then the new keys beside old and new values (traced decodes of tiny-qwen2 at 16 x 480 and
        tiny-gpt2 at 4 x 256: one old tensor live at the peak, not two). A windowed layer's
        DynamicSlidingWindowLayer.update (:242-246) makes the full keys and values before either kept view replaces
        the old storage: old and new, both;
      its attention, the old storage gone: the new cache, eager attention's k and v repeated to every head when
        kv_heads < heads (repeat_kv: copies of the cache's tensors, in their dtypes) and its one-row scores over the
        cache (`_eager_scores`: traced decodes of tiny-llama eager at 4 x 384, small-gemma2, small-gpt_oss); MLA
        under HF rebuilds the layer's k and v from the latent for every cached token after the update
        (modeling_deepseek_v3.py DeepseekV3Attention.forward: cache.update, then expand_kv; NB: vLLM/SGLang absorb
        kv_b_proj into q and o at decode and rebuild nothing, so this over-estimates a serving engine's decode).
    SDPA's math path (CUDA fp32 with GQA) repeats k and v over the cache too, and copies the repeated k's transpose.
    """
    st = state_bytes(setup)
    k, v = kv_layer_bytes(spec, setup)
    if sliding:
        update = (k + v) * (old + new)
    else:
        update = max(k * (old + new) + v * old, k * new + v * (old + new))
    after = (k + v) * new + st.act * mla_decompressed(spec, setup.tp) * new
    kernel = resolved_kernel(spec, setup)
    repeats = (spec.heads / setup.tp) / max(spec.kv_heads / setup.tp, 1)  # query heads per cached kv head
    if kernel == "eager":
        if spec.kv_heads < spec.heads:
            after += (k + v) * repeats * new
        # the scores' matmul under autocast casts a k that rotary promoted to fp32 (kv_dtype) to the 16-bit dtype, a
        # copy over every query head freed when the matmul returns (read off the traced amp-bf16 decode of
        # small-gemma2 at 8 x 200: that copy and the 16-bit scores at the bmm, before the softmax's fp32 tensors)
        cast = st.act * spec.q_dim / setup.tp if st.autocast and DTYPE_BYTES[kv_dtype(spec, setup)] != st.act else 0
        after += max((cast + st.act * spec.heads / setup.tp) * new, _eager_scores(spec, setup, 1, new))
    elif kernel == "math" and spec.mla is not None:
        after += mla.decode_math_per_key(spec, a=st.act, tp=setup.tp) * new
    elif kernel == "math" and setup.device == "cuda":
        # SDPA's math path (fp32 with GQA on CUDA: activations.resolved_kernel; torch aten/src/ATen/native/
        # transformers/attention.cpp _scaled_dot_product_attention_math, enable_gqa): k and v repeated to every query
        # head over the cache, the repeated k's transpose copied for the bmm, beside the one-row scores (read off the
        # traced decode of small-qwen2 in fp32 on CUDA semantics at 8 x 200: at the scores' bmm)
        after += (2 * k + v) * repeats * new + st.act * spec.heads / setup.tp * new
    return setup.batch * max(update, after)


def largest_batch(spec: ModelSpec, setup: Setup, capacity: int) -> int:
    """Largest batch at this context whose prefill and decode fit `capacity` bytes (0 if none): the fit rule's
    required (required_at) within fit_rule.capacity."""
    if required_at(spec, setup.with_(batch=1)) > capacity:
        return 0
    lo, hi = 1, 2
    while required_at(spec, setup.with_(batch=hi)) <= capacity and hi < 1 << 24:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if required_at(spec, setup.with_(batch=mid)) <= capacity else (lo, mid)
    return lo


def largest_context(spec: ModelSpec, setup: Setup, capacity: int) -> int:
    """Largest context (tokens) at this batch whose required (required_at) fits `capacity`, up to the model's
    max_position_embeddings (spec.position_limit: a learned table has no more rows; a rotary model was trained to
    it, and vLLM's default max_model_len is it: vllm config.py _get_and_verify_max_len, max_model_len None ->
    the derived max_position_embeddings)."""
    if required_at(spec, setup.with_(seq=1)) > capacity:
        return 0
    limit = spec.position_limit(setup.mode) or 1 << 24  # none given: memory alone bounds it
    lo, hi = 1, min(2, limit + 1)  # invariant: lo fits, hi does not or exceeds the limit
    while hi <= limit and required_at(spec, setup.with_(seq=hi)) <= capacity:
        lo, hi = hi, min(hi * 2, limit + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if required_at(spec, setup.with_(seq=mid)) <= capacity else (lo, mid)
    return lo


def required_at(spec: ModelSpec, setup: Setup) -> int:
    """What the run's tensors need from the caching allocator at this setup (analytic/fit_rule.py infer_required)."""
    from .fit_rule import infer_required

    return infer_required(spec, setup, infer_memory(spec, setup))


def check_layout(spec: ModelSpec, setup: Setup) -> None:
    if setup.dp > 1 and setup.mode == "infer" and setup.zero:
        raise SetupError("--zero applies to training; inference replicas do not shard optimizer state")
