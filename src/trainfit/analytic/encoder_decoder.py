"""An encoder-decoder model in the analytic engine (spec.encdec): T5 / Flan-T5 / mT5 inference memory (BART and
Whisper: encdec_absolute.py, dispatched from here).

transformers models/t5/modeling_t5.py T5ForConditionalGeneration.forward (:942-1069) runs the encoder stack over
--seq tokens, then the decoder stack over --target-seq tokens whose cross-attention reads K and V projected from the
encoder's output, then lm_head over every decoder position. generate()'s prefill is that forward with use_cache
(step/infer.py _seq2seq_step, as generation/utils.py runs it): it fills an EncoderDecoderCache, per decoder block the
self-attention K/V over the target tokens and the cross-attention K/V over the encoder's tokens
(T5Attention.forward :283-372, curr_cache.update); a decode step reads both and appends one token to the first.

Modelled: T5's two stacks (relative position bias; mT5 is the same model, modeling_mt5.py), their training in
encoder_decoder_training.py; BART's and Whisper's in encdec_absolute.py (learned positions, LayerNorm blocks, the
conv front-end), their training in encoder_decoder_training.py with encdec_absolute_training.py's terms.
"""
from __future__ import annotations

from ..errors import NotModelledError
from ..setup import Setup
from ..spec import ModelSpec
from .onednn import gemm_scratch
from .precision import StateBytes, state_bytes

FP32, INDEX = 4, 8

# the families whose two stacks are modelled here (T5Stack: relative position bias, weight-only RMS norm)
MODELLED = ("t5", "mt5")


def modelled(spec: ModelSpec) -> bool:
    """Whether `spec` is an encoder-decoder whose inference the analytic engine models: T5 / mT5 here, BART and
    Whisper in encdec_absolute.py."""
    return spec.encdec is not None and (spec.family in MODELLED or spec.family in _encdec_absolute.MODELLED)


def absolute(spec: ModelSpec):
    """encdec_absolute when `spec` is one of its families (learned absolute positions: BART, Whisper), else None."""
    from . import encdec_absolute  # noqa: PLC0415

    return encdec_absolute if spec.family in encdec_absolute.MODELLED else None


def check_trainable(spec: ModelSpec, setup: Setup) -> None:
    """Refuse, in one line, a training step (analytic/memory.py train_memory) of an encoder-decoder whose saved
    tensors are not modelled: a family other than T5 / mT5, BART and Whisper (encoder_decoder_training.py)."""
    if spec.encdec is not None and not modelled(spec):
        raise NotModelledError(
            f"{spec.name}: training an encoder-decoder model is not modelled by the analytic engine (both stacks' "
            "saved tensors: the encoder's over --seq, the decoder's self- and cross-attention over --target-seq, "
            "the dropout masks; T5's, mT5's, BART's and Whisper's are modelled); use --engine trace")


def inner(spec: ModelSpec) -> int:
    """T5Attention's inner width, num_heads x d_kv (modeling_t5.py:199-205): q, k, v and o's other side."""
    return spec.heads * spec.head_dim


def cast_params(spec: ModelSpec) -> int:
    """The weights autocast casts (and caches for the region) in a full forward: every block's linears (q, k, v, o;
    the decoder's cross-attention q, k, v, o; wi or wi_0/wi_1 and wo, no biases: modeling_t5.py:76-125, :199-205)
    and lm_head (tied to `shared`). The relative bias is an Embedding: not cast."""
    return stack_casts(spec, True) + spec.vocab * spec.hidden


def norm_dtype(st: StateBytes) -> int:
    """Bytes of T5LayerNorm's output (modeling_t5.py:60-73): x * rsqrt(fp32 variance) is fp32, cast to the weight's
    dtype when that is 16-bit, then times the weight: the weight's dtype (fp32 under autocast)."""
    return st.weight


def self_cache(spec: ModelSpec, setup: Setup, st: StateBytes, tokens: int) -> int:
    """The decoder's self-attention cache for `tokens` target tokens per sequence: K and V (batch, heads, tokens,
    d_kv) per decoder block, in the projections' dtype (DynamicLayer keeps k and v as given on its first update)."""
    return 2 * spec.encdec.decoder_layers * setup.batch * tokens * inner(spec) * st.act


def cross_cache(spec: ModelSpec, setup: Setup, st: StateBytes) -> int:
    """The cross-attention cache: K and V projected from the encoder's output (batch, heads, --seq, d_kv) per decoder
    block (T5Attention.forward :318-330 with key_value_states), written once at the prefill and reused."""
    return 2 * spec.encdec.decoder_layers * setup.batch * setup.seq * inner(spec) * st.act


def ids_bytes(setup: Setup, decoder_tokens: int) -> int:
    """The prompt's ids (an input) and the decoder's ids (made by the step: step/infer.py _seq2seq_step), int64."""
    return INDEX * setup.batch * (setup.seq + decoder_tokens)


def head_moment(spec: ModelSpec, setup: Setup, st: StateBytes, tokens: int) -> int:
    """What the forward's end holds beside the weights, the casts and the caches, inside lm_head's matmul over
    `tokens` decoder positions per sequence (T5ForConditionalGeneration.forward :1036-1052): the encoder's output
    (encoder_outputs, held through the decoder), the decoder's final-norm output (decoder_outputs[0]), its copy
    scaled by d_model**-0.5 (T5 v1.0 only: EncoderDecoderSpec.scale_decoder_outputs), under autocast its 16-bit cast
    (lm_head's operand), the logits (batch, tokens, vocab) in the compute dtype (no upcast without labels) and, on a
    CPU's 16-bit path, oneDNN's scratch of the head's matmul (onednn.py)."""
    b, h, n = setup.batch, spec.hidden, norm_dtype(st)
    rows = b * tokens
    encoder_out = b * setup.seq * h * n
    decoder_out = rows * h * n * (2 if spec.encdec.scale_decoder_outputs else 1)
    cast = rows * h * st.act if st.autocast else 0
    logits = rows * spec.vocab * st.act
    return encoder_out + decoder_out + cast + logits + gemm_scratch(setup, rows, h, spec.vocab)


def fp32_gelu(spec: ModelSpec, setup: Setup, st: StateBytes) -> bool:
    """Whether gelu_new's output is fp32 in 16-bit compute: CUDA autocast runs pow in fp32 (autocast_mode.h
    AT_FORALL_FP32; trace/cuda_autocast.py), so x + 0.044715 * x^3, its tanh, 1 + tanh and the product with 0.5 * x
    are fp32 (activations.py counts the same in training)."""
    return st.autocast and setup.device == "cuda" and spec.activation == "gelu_new"


def activation_live(spec: ModelSpec, setup: Setup, st: StateBytes) -> int:
    """Bytes per MLP-width element live at the activation's last op: gelu_new (NewGELUActivation, transformers
    activations.py: 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))) holds its input, 1 + tanh(...),
    0.5 * x and the product (1 + tanh and the product fp32 under CUDA autocast: fp32_gelu); an elementwise
    activation (relu) its input and output."""
    a = st.act
    if spec.activation != "gelu_new":
        return 2 * a
    return 2 * a + 2 * (FP32 if fp32_gelu(spec, setup, st) else a)


def mlp_moment(spec: ModelSpec, setup: Setup, st: StateBytes, rows: int) -> int:
    """The MLP's high point over `rows` tokens (T5DenseActDense :84-95, T5DenseGatedActDense :107-125), beside its
    input: the larger of
    - the activation's (activation_live), wi_1 not run yet;
    - wo's: its operands (gated: hidden_gelu, hidden_linear and their product, locals of the forward; not gated: the
      activation's output), under autocast the product cast to wo's fp32 weight dtype (:117-123: `.to(self.wo.weight
      .dtype)`, the 16-bit product freed as it is rebound; an fp32 product, fp32_gelu, is its own cast) and
      autocast's 16-bit cast of that for the matmul, wo's output and, on a CPU's 16-bit path, oneDNN's scratch of
      the matmul."""
    f, a = spec.intermediate, st.act
    act = activation_live(spec, setup, st) * rows * f
    gelu = FP32 if fp32_gelu(spec, setup, st) else a
    if st.autocast:
        operands = (gelu + a if spec.gated_mlp else 0) + st.weight + a
    else:
        operands = 3 * a if spec.gated_mlp else a
    wo = rows * f * operands + rows * spec.hidden * a + gemm_scratch(setup, rows, f, spec.hidden)
    return max(act, wo)


def bucket_live(decoder: bool) -> int:
    """Bytes per (query, key) pair live at T5Attention._relative_position_bucket's high point (modeling_t5.py:217-262,
    called by compute_bias :265-281), at torch.min(relative_position_if_large, torch.full_like(...)): int64 tensors
    of the pairs, compute_bias's relative_position, the running relative_buckets (bidirectional only: the decoder's
    stays the int 0 until the final where), |relative_position|, relative_position_if_large, the full_like and the
    min; and the bool is_small. The encoder's 6 x 8 + 1, the decoder's 5 x 8 + 1."""
    return (5 if decoder else 6) * INDEX + 1


def bias_moment(spec: ModelSpec, setup: Setup, st: StateBytes, decoder: bool) -> int:
    """A stack's first block at its relative bias's bucketing (bucket_live over its (q, k) pairs), after q, k and v
    (T5Attention.forward :301-330: compute_bias runs once they are projected): the stack's input embeddings (the
    block's input), its norm's output, q, k and v over the stack's tokens, under autocast the weight casts made so
    far (the encoder's blocks before the decoder's first block, and each first block's q, k, v); in the decoder
    also the encoder's output (k and v are its first block's self-attention cache: counted with the caches)."""
    b, h, q = setup.batch, spec.hidden, inner(spec)
    q_len = setup.target_tokens if decoder else setup.seq
    rows = b * q_len
    qkv = (1 if decoder else 3) * rows * q * st.act
    stream = rows * h * (st.weight + norm_dtype(st))
    cast = (stack_casts(spec, False) if decoder else 0) + 3 * h * q
    encoder_out = b * setup.seq * h * norm_dtype(st) if decoder else 0
    return q_len * q_len * bucket_live(decoder) + qkv + stream + encoder_out + (st.act * cast if st.autocast else 0)


def mask_moment(spec: ModelSpec, setup: Setup, st: StateBytes, decoder: bool) -> int:
    """A stack's last block at its self-attention's additive mask (sdpa_attention.py create_position_bias_mask
    :54-91), q, k and v projected: beside the relative bias (block_context) its contiguous copy, SDPA's mask; in the
    decoder (causal) first the torch.where of the causal mask and the bias, laid out as the permuted bias, then
    copied by .contiguous(): two more (q, k, heads) tensors in the weights' dtype at the copy, beside the causal
    mask (q, k) bool. Under autocast (the
    encoder) SDPA's 16-bit cast of the mask beside them. Beside: q (the decoder's k and v are its cache; the
    encoder's k and v), the block's context but the stream after the attention (block_context) and the weight casts
    made so far. NB: the SDPA kernel's own output and workspace after the copy are not priced."""
    b, h, q, a = setup.batch, spec.hidden, inner(spec), st.act
    q_len = setup.target_tokens if decoder else setup.seq
    pairs = spec.heads * q_len * q_len
    masks = (2 if decoder else 1) * pairs * st.weight + (pairs * a if st.autocast and not decoder else 0)
    causal = q_len * q_len if decoder else 0  # the causal mask, (q, k) bool, the where's condition
    rows = b * q_len
    qkv = (1 if decoder else 3) * rows * q * a
    later = (4 * h * q if decoder else 0) + h * q + (3 if spec.gated_mlp else 2) * h * spec.intermediate
    cast = a * (stack_casts(spec, decoder) - later) if st.autocast else 0
    return masks + causal + qkv + block_context(spec, setup, st, decoder) - rows * h * st.residual + cast


def block_context(spec: ModelSpec, setup: Setup, st: StateBytes, decoder: bool) -> int:
    """What the last block of a stack holds beside its MLP: the stack's relative bias (its first block's
    compute_bias :265-281, an Embedding lookup (q, k, heads) in the weights' dtype, kept as `position_bias` through
    the stack's loop, T5Stack.forward :735-745), the stack's input embeddings (inputs_embeds, a local of the
    forward), the block's input (the loop's hidden_states) when it is not the first, the stream after its attention
    sublayers and the MLP's normalised input (T5LayerFF :138-142); in the decoder also the encoder's output (its
    cross-attention's key_value_states) and the cross-attention's zero bias (1, heads, q, k) in the query's dtype
    (T5Attention.forward :335-342: the cross-attention has no relative bias), kept as encoder_decoder_position_bias."""
    b, h, heads = setup.batch, spec.hidden, spec.heads
    q_len = setup.target_tokens if decoder else setup.seq
    blocks = spec.encdec.decoder_layers if decoder else spec.layers
    rows = b * q_len
    bias = q_len * q_len * heads * st.weight
    stream = rows * h * (st.weight + (2 if blocks > 1 else 1) * st.residual) + rows * h * norm_dtype(st)
    cross = b * setup.seq * h * norm_dtype(st) + heads * q_len * setup.seq * st.act if decoder else 0
    return bias + stream + cross


def stack_casts(spec: ModelSpec, decoder: bool) -> int:
    """The weights autocast has cast by the last block's wo in a stack: the encoder's blocks (decoder False), or
    every block of both stacks (lm_head not yet)."""
    h, q, f = spec.hidden, inner(spec), spec.intermediate
    mlp = (3 if spec.gated_mlp else 2) * h * f
    encoder = spec.layers * (4 * h * q + mlp)
    return encoder + (spec.encdec.decoder_layers * (8 * h * q + mlp) if decoder else 0)


def infer_memory(spec: ModelSpec, setup: Setup, weights: float):
    """The prefill's and a decode step's high points (InferMemory) of generate() on T5:
    prefill: the encoder over --seq tokens and the decoder over --target-seq tokens filling both caches, its high
      point the largest of: the last block's MLP in each stack (block_context + mlp_moment; the decoder's with both
      caches written), each stack's first block at its relative bias's bucketing (bias_moment: a long input or
      target), each stack's last block at its additive mask (mask_moment) and lm_head over every target position
      (head_moment). Against the trace (tests/analytic/test_encoder_decoder_analytic.py): within 0.04 % at the
      families matrix's size and at 2048-token inputs or targets; +0.5 % with 32 heads of 8 under autocast on a
      CPU (NB: the encoder's mask moment counts SDPA's 16-bit cast of the mask, over there);
    decode: one target token reading the caches, its self-attention cache grown by one token (DynamicLayer.update's
      torch.cat: the running block holds its old and new K/V; NB: both counted, over by one block's old K), the
      encoder's output held (step/infer.py _seq2seq_step's encoder_out), the head over one position (within 0.4 %
      of the traced decode at the matrix's size, over)."""
    from .inference import InferMemory  # noqa: PLC0415 (inference dispatches here)

    if absolute(spec) is not None:
        return absolute(spec).infer_memory(spec, setup, weights)
    st = state_bytes(setup)
    b, t = setup.batch, setup.target_tokens
    cast = st.act if st.autocast else 0
    cross = cross_cache(spec, setup, st)
    kv = self_cache(spec, setup, st, t) + cross
    ids = ids_bytes(setup, t)
    encoder = (cast * stack_casts(spec, False) + block_context(spec, setup, st, False)
               + mlp_moment(spec, setup, st, b * setup.seq))
    decoder = (cast * stack_casts(spec, True) + kv + block_context(spec, setup, st, True)
               + mlp_moment(spec, setup, st, b * t))
    head = cast * cast_params(spec) + kv + head_moment(spec, setup, st, t)
    first_self = self_cache(spec, setup, st, t) / spec.encdec.decoder_layers  # the decoder's first block's K/V
    buckets = max(bias_moment(spec, setup, st, False), first_self + bias_moment(spec, setup, st, True))
    # the decoder's last block: every self-attention cache and the cross-attention caches of the blocks before it
    masks = max(mask_moment(spec, setup, st, False),
                self_cache(spec, setup, st, t) + cross * (1 - 1 / spec.encdec.decoder_layers)
                + mask_moment(spec, setup, st, True))
    prefill = weights + ids + max(encoder, decoder, head, buckets, masks)
    per_block = self_cache(spec, setup, st, 1) / spec.encdec.decoder_layers
    grown = self_cache(spec, setup, st, t + 1) + per_block * t
    decode = weights + cast * cast_params(spec) + cross + grown + ids + head_moment(spec, setup, st, 1)
    logits = b * t * spec.vocab * st.act
    # activations: what the prefill's high point holds beside the weights, the ids and the whole caches
    return InferMemory(int(weights), int(kv), int(max(0, prefill - weights - ids - kv)), int(logits), int(prefill),
                       int(decode))


def prefill_flops(spec: ModelSpec, setup: Setup) -> float:
    """The prefill's FLOPs, 2 per multiply-add (analytic/flops.py's convention), over the batch:
    - the encoder, --seq tokens per sequence through each block's q, k, v, o and MLP (wi or wi_0/wi_1, wo) and its
      bidirectional attention, q.k^T and probs.v over --seq keys (2 x 2 x inner per key);
    - the decoder, --target-seq tokens through each block's self-attention linears, the cross-attention's q and o
      and the MLP, its self-attention over --target-seq keys (NB: every key, not the causal half: T5 passes its
      bias as an explicit additive mask, sdpa_attention.py create_position_bias_mask, so no kernel skips the masked
      half) and its cross-attention over --seq keys, whose k and v project the encoder's --seq tokens;
    - lm_head over every target position (T5ForConditionalGeneration.forward takes no logits_to_keep).
    NB: norms, the relative bias, softmax and activations are elementwise and left out, as in flops.py."""
    if absolute(spec) is not None:
        return absolute(spec).prefill_flops(spec, setup)
    b, s, t = setup.batch, setup.seq, setup.target_tokens
    h, q = spec.hidden, inner(spec)
    mlp = (3 if spec.gated_mlp else 2) * h * spec.intermediate
    encoder = spec.layers * b * s * (2 * (4 * h * q + mlp) + 4 * q * s)
    decoder = spec.encdec.decoder_layers * b * (t * (2 * (6 * h * q + mlp) + 4 * q * t + 4 * q * s)
                                                + s * 2 * 2 * h * q)
    return encoder + decoder + 2 * b * t * spec.vocab * h


# (imported last, as the module, not its names: encdec_absolute reads this module's caches and activation terms; a function-level import costs its
# resolution on every call, and this one sits on the engine's hot path)
from . import encdec_absolute as _encdec_absolute  # noqa: E402
