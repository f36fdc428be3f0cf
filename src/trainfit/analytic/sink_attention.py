"""Eager attention with attention sinks (gpt-oss; no torch): what it saves for backward and holds in a prefill.

transformers runs gpt-oss's attention eagerly (modeling_gpt_oss.py:380 `_supports_sdpa = False`) through its own
eager_attention_forward (:227-255):
  scores    torch.matmul(q, repeat_kv(k)ᵀ) · scaling + mask (:239-241), (b, heads, s, s);
  sinks     the (heads,) `sinks` logit expanded to a column and torch.cat'ed to the scores (:243-244): the combined
            logits (b, heads, s, s + 1);
  max       `combined - combined.max(dim=-1, keepdim=True).values` (:249): max's backward keeps its int64 indices
            (b, heads, s, 1);
  softmax   F.softmax(combined, dtype=combined.dtype) (:250): in the logits' own dtype — the scores promoted with
            the mask (built in the embeddings' dtype: fp32 under autocast) and the sinks parameter — where the shared
            eager_attention_forward softmaxes in fp32; its output, sink column included, is what its backward keeps;
  slice     probs[..., :-1] (:251), a view, `.to(value_states.dtype)` (:252): a copy where the softmax ran in another
            dtype (autocast: fp32 probabilities, 16-bit v), which probs·v keeps; else probs·v keeps the view, whose
            storage is the softmax output.
q, repeat_kv's k and v and the output's contiguous copy are saved as in the shared eager path (activations.py).
The attention returns its probabilities (:255, `attn_output, attn_weights`), which GptOssDecoderLayer.forward binds to
`_` (:354) until the layer returns: in a no-grad forward they live through the layer's MLP.
"""
from __future__ import annotations

from ..spec import ModelSpec
from .precision import StateBytes

INDEX = 8  # max's int64 indices
FP32 = 4


def softmax_bytes(st: StateBytes) -> int:
    """Bytes per element of the combined logits and their softmax: the scores' dtype (the activations') promoted
    by the mask's (the residual stream's: fp32 under autocast) — the sinks parameter is the weights' dtype, fp32
    under autocast, the activations' otherwise."""
    return max(st.act, st.residual)


def probs_cast_bytes(st: StateBytes) -> int:
    """Bytes per element of `.to(value_states.dtype)`'s copy of the probabilities (0: no copy, the slice is a view
    of the softmax output)."""
    return st.act if softmax_bytes(st) != st.act else 0


def saved_per_key(spec: ModelSpec, st: StateBytes) -> float:
    """Saved bytes per token per key of one layer (one TP rank: divide by tp): the softmax output and the
    probabilities' cast."""
    return spec.heads * (softmax_bytes(st) + probs_cast_bytes(st))


def saved_per_token(spec: ModelSpec, st: StateBytes) -> float:
    """Saved bytes per token beside the per-key ones: the softmax output's sink column and max's indices."""
    return spec.heads * (softmax_bytes(st) + INDEX)


def held_per_key(spec: ModelSpec, st: StateBytes) -> float:
    """Per token per key, what a no-grad forward's layer holds through its MLP: the returned probabilities (the
    cast, or the softmax output whose view they are), bound to `_` by GptOssDecoderLayer.forward (:354)."""
    return spec.heads * (probs_cast_bytes(st) or softmax_bytes(st))


def prefill_scores(spec: ModelSpec, st: StateBytes, tokens: int, keys: int) -> float:
    """The s×s part of the attention's high point in a no-grad forward (one TP rank: divide by tp), as the
    probabilities are cast (or, without a cast, as the max is subtracted: the same set): the masked scores
    (`attn_weights`, :241, a local until :252 reassigns it), the max-subtracted logits (:249) and the softmax
    output (:250), s + 1 columns each but the scores, in the logits' dtype, and the probabilities' cast (read off
    traced prefills of small-gpt_oss at 1 x 1024, bf16 and amp-bf16).
    NB: on a CPU with oneDNN's bf16 matmul path, probs·v's bmm over the strided slice allocates scratch the size of
    the probabilities, a moment not modelled: -1.2 % on small-gpt_oss at 1 x 1024 in bf16 (none on CUDA semantics)."""
    sm = softmax_bytes(st)
    return spec.heads * tokens * (sm * keys + 2 * sm * (keys + 1) + probs_cast_bytes(st) * keys)


def forward_transient(spec: ModelSpec, st: StateBytes, tokens: int, keys: int) -> float:
    """The s×s tensors of the attention's training forward that no backward keeps, at its high point (one TP rank:
    divide by tp): the masked scores (`attn_weights`, a local until :252) and the max-subtracted logits (softmax's
    input), s and s + 1 columns in the logits' dtype, beside the saved softmax output (and its cast) — read off the
    traced training steps of small-gpt_oss at 1 x 2048 (bf16: at the subtraction, the torch.cat output in the
    softmax output's place; amp-bf16: at the probabilities' cast)."""
    sm = softmax_bytes(st)
    return spec.heads * tokens * sm * (2 * keys + 1) + attention_locals(spec, st) * tokens


def attention_locals(spec: ModelSpec, st: StateBytes) -> float:
    """Per token, the attention's locals no backward keeps, live through its softmax: k rotated and v before
    repeat_kv (their repeats are saved); under autocast, rotary's fp32 cos/sin promote q and k (the matmuls save
    their 16-bit casts), so the fp32 rotated q and the fp32 k repeated to every head are locals too (read off the
    traced training step of small-gpt_oss at 1 x 2048, amp-bf16 with full recompute)."""
    if st.autocast and spec.positions == "rotary":
        return FP32 * (2 * spec.q_dim + spec.kv_dim) + st.act * spec.kv_dim
    return 2 * st.act * spec.kv_dim
