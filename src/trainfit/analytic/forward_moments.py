"""The forward's high point inside the last layer, where it tops the forward's end: with a classifier head there are
no logits at the end, so the last layer's own live tensors can set the forward's high point.

Post-norm encoders (BERT, RoBERTa: family fact `post_norm`) end each layer with `LayerNorm(dropout(dense(x)) +
input_tensor)` (transformers/models/bert/modeling_bert.py:349-352 BertOutput.forward). As the last layer's norm
allocates its output, every layer's saved tensors exist (its own norm's input too), and beside them:
  * the norm's output (the residual stream's dtype: autocast runs layer_norm in fp32);
  * the dropout's output, still BertOutput.forward's local `hidden_states` until the norm returns (compute dtype);
  * under autocast three residual-stream tensors no backward saves (the linears save their low-precision casts):
    the layer's input (BertLayer.forward's argument, modeling_bert.py:377-414), its attention output
    (feed_forward_chunk's argument, :416-419) and the embeddings' output (BertModel.forward's local
    `embedding_output`, :657-674, referenced until the model returns; the layer's input itself in a 1-layer model).
    Without autocast the linears save these very tensors: they are in the saved set already.
Read off the trace of small-bert with a sequence-classification head (amp-bf16 on CUDA: these five tensors are the
temporaries at the peak, beside exactly the saved set).

On CPU with dropout on the probabilities SDPA takes the math path (activations.resolved_kernel), which in a 16-bit
model without autocast can top that: at its probs·v matmul (aten.bmm) the layer has saved its input, the fp32 q, k, v
copies the matmuls keep (aten.clone) and the probabilities (softmax, noise, dropped), and beside them live
  * the q, k, v projections' outputs, held by the attention module's locals until the kernel returns;
  * the kernel's fp32 upcasts of q, k and v (aten._to_copy), q scaled (aten.mul) and the bmm's fp32 output;
  * the probabilities copied to the inputs' dtype (aten._to_copy: the kernel's second output).
Read off the trace of small-bert, bf16 on CPU (each tensor by the aten op that made it).
NB: one more 16-bit (b, heads, s, d) aten._to_copy output is live there in the trace, its reader not identified:
an under-count of a·q bytes per token (-0.75 % on small-bert).
NB: only without recomputation (a checkpointed layer saves nothing in its forward: not modelled) and for post-norm
families; the pre-norm decoders' in-layer tensors are not modelled (their LM head's logits top them); the math
path's moment only without autocast (with it the layer's end is higher on small-bert).
"""
from __future__ import annotations

from ..setup import Setup
from ..spec import ModelSpec
from .activations import FP32, keys_per_token, layer_activations, resolved_kernel
from .families import family_traits
from . import sink_attention as sinks
from .precision import StateBytes


def last_layer_forward(spec: ModelSpec, setup: Setup, st: StateBytes, tokens: int, layer_saved: float) -> float:
    """Bytes beside all layers' saved tensors at the last layer's forward high point (one micro-batch, one TP
    rank; layer_saved: one layer's saved bytes); 0 where the moment is not modelled."""
    if spec.attn_sinks and resolved_kernel(spec, setup) == "eager" and setup.recompute == "none":
        return _sink_attention_forward(spec, setup, st, tokens)
    if not family_traits(spec)["post_norm"] or setup.recompute != "none":
        return 0.0
    t = setup.tp
    sp = t if setup.sequence_parallel else 1
    h, a, r = spec.hidden, st.act, st.residual
    held = (3 if spec.layers > 1 else 2) * r if st.autocast else 0
    layer_end = (r + a + held) * h * tokens / sp
    if resolved_kernel(spec, setup) != "math" or st.autocast or a == FP32:
        return layer_end
    qkv = spec.q_dim + 2 * spec.kv_dim
    keys = keys_per_token(spec, setup.seq)
    la = layer_activations(spec, setup)
    # of the layer's saved set, what exists at the probs·v matmul: its input, the fp32 q, k, v, the probabilities
    made = a * h * tokens / sp + (3 * FP32 * spec.q_dim * tokens + la.per_token_key * tokens * keys) / t
    live = ((a + FP32) * qkv + 2 * FP32 * spec.q_dim + a * spec.heads * keys) * tokens / t
    return max(layer_end, live - (layer_saved - made))


def _sink_attention_forward(spec: ModelSpec, setup: Setup, st: StateBytes, tokens: int) -> float:
    """gpt-oss (sink_attention.py): inside the last layer's eager attention, as its softmax runs, the scores and the
    max-subtracted logits (sink_attention.forward_transient) and the model's causal masks (one per kind of layer, the
    embeddings' dtype, held by the model's forward) beside every layer's saved tensors — of the last layer's, those
    made after the probabilities not yet: the output's contiguous copy and the MLP sub-block's (its norm, inputs and
    the MoE block's). Where the sequence is long this tops the LM head's logits (small-gpt_oss at 1 x 2048: -9 % in
    bf16, -24 % in amp-bf16 without it)."""
    t = setup.tp
    keys = keys_per_token(spec, setup.seq)
    masks = st.residual * family_traits(spec)["causal_masks"] * setup.batch * setup.seq * setup.seq
    la = layer_activations(spec, setup, moe=spec.moe is not None)
    later = (st.act * spec.q_dim / t + sum(la.mlp_share.values())) * tokens
    return sinks.forward_transient(spec, st, tokens, keys) / t + masks - later
