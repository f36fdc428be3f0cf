"""BART and Whisper inference in the analytic engine: the encoder-decoders with learned absolute positions, LayerNorm
blocks and biased linears (encoder_decoder.py dispatches here; T5's relative-bias stacks stay there).

What differs from T5 (transformers 5.24), each a term below or in encdec_frontends.py:
- the front-end of each stack (encdec_frontends.FRONT_ENDS): BART's learned position tables (offset 2,
  modeling_bart.py:75-97) and layernorm_embedding (:521, :647); Whisper's conv1 (k3) + GELU, conv2 (k3, stride 2) +
  GELU over 2 x --seq log-mel frames (modeling_whisper.py:617-618) and the decoder's learned positions (:777-786);
- the blocks: LayerNorm (fp32 output under autocast, like T5LayerNorm's) post-norm in BART (BartEncoderLayer.forward
  :280-308: the normalised sum is both the next residual and fc1's input; families.json post_norm) and pre-norm in
  Whisper (WhisperEncoderLayer.forward :383-417: the sum and its normalised copy both live at the MLP); biased
  q/v/out_proj and k_proj (Whisper's k_proj unbiased, :281), whose biases autocast casts and caches too; fc1 + GELU
  (ACT2FN, one elementwise output) + fc2; SDPA with no mask in the encoders (no relative bias: no bucketing); under
  --attention eager the score-sized tensors (attention_moments) and the probabilities each layer keeps in its `_`
  through the MLP (held_probs);
- the head: lm_head / proj_out over every target position; BART adds final_logits_bias, a (1, vocab) buffer
  (BartForConditionalGeneration.forward :934-935), a second logits tensor in the bias's dtype (fp32 under autocast:
  on a CPU TensorIterator's fp32 copy of the 16-bit logits beside it, trace/cpu_casts.py).
Shared with T5 (encoder_decoder.py): both caches, the step's ids, the activation's live bytes.
"""
from __future__ import annotations

from ..setup import Setup
from ..spec import ModelSpec
from . import encdec_frontends as fe
from .encoder_decoder import FP32, INDEX, activation_live, cross_cache, self_cache
from .families import family_traits
from .onednn import gemm_scratch
from .precision import StateBytes, state_bytes

MODELLED = tuple(fe.FRONT_ENDS)

# the families whose lm_head output gets final_logits_bias added (BartForConditionalGeneration.forward :934-935)
LOGITS_BIAS = ("bart",)


def stack_casts(spec: ModelSpec, decoder: bool) -> int:
    """Elements autocast has cast by a stack's last block's fc2: the audio front-end, every encoder block (decoder
    False) or also every decoder block; lm_head not yet."""
    enc = spec.layers * sum(fe.block_linears(spec, False)) + fe.conv_casts(spec)
    return enc + (spec.encdec.decoder_layers * sum(fe.block_linears(spec, True)) if decoder else 0)


def stream(spec: ModelSpec, st: StateBytes, rows: int) -> int:
    """A block's residual-stream tensors at its MLP over `rows` tokens, in the model's dtype (StateBytes.residual:
    LayerNorm's output is fp32 under autocast, and so is the fp32 + 16-bit sum): the block's input (the layer loop's
    hidden_states), then post-norm (BART) the normalised sum that is both residual and fc1's input, pre-norm
    (Whisper) the sum and its normalised copy."""
    return rows * spec.hidden * st.residual * (2 if family_traits(spec)["post_norm"] else 3)


def mlp_moment(spec: ModelSpec, setup: Setup, st: StateBytes, rows: int, decoder: bool, cast: bool = True) -> int:
    """The MLP's high point over `rows` tokens beside the block's stream, under autocast with every cast before fc2
    counted by the caller: the larger of fc1's (its output, oneDNN's scratch on a CPU's 16-bit path), the
    activation's (fc1's output and the activation's, encoder_decoder.activation_live) and fc2's (the activation's
    output, fc2's output, its scratch and, under autocast, fc2's weight and bias cast: `cast` False once a forward
    before has cached it)."""
    f, h, a = fe.mlp_width(spec, decoder), spec.hidden, st.act
    fc1 = rows * f * a + gemm_scratch(setup, rows, h, f)
    act = activation_live(spec, setup, st) * rows * f
    fc2 = rows * f * a + rows * h * a + gemm_scratch(setup, rows, f, h)
    fc2 += fe.block_linears(spec, decoder)[2] * a if st.autocast and cast else 0
    return max(fc1, act, fc2)


def head_moment(spec: ModelSpec, setup: Setup, st: StateBytes, tokens: int) -> int:
    """The forward's end over `tokens` decoder positions, beside the weights, the casts and the caches: the encoder's
    output and the decoder's final output (the model's dtype), then the larger of lm_head's matmul (under autocast its
    16-bit input, the logits (b, tokens, vocab) in the compute dtype, oneDNN's scratch on a CPU's 16-bit path) and,
    for BART, final_logits_bias's add (the logits and their biased copy in the bias's dtype: the model's; on a CPU
    TensorIterator's copy of 16-bit logits to fp32 beside them)."""
    b, h, v, a, w = setup.batch, spec.hidden, spec.vocab, st.act, st.residual
    rows = b * tokens
    held = b * setup.seq * h * w + rows * h * w
    logits = rows * v * a
    matmul = (rows * h * a if st.autocast else 0) + logits + gemm_scratch(setup, rows, h, v)
    if spec.family not in LOGITS_BIAS:
        return held + matmul
    promoted = rows * v * w if setup.device == "cpu" and w != a else 0
    return held + max(matmul, logits + rows * v * w + promoted)


def heads(spec: ModelSpec, decoder: bool) -> int:
    """The stack's attention heads (encoder_attention_heads, decoder_attention_heads)."""
    return spec.encdec.decoder_heads if decoder and spec.encdec.decoder_heads else spec.heads


def probs_bytes(setup: Setup, st: StateBytes) -> int:
    """Bytes per element of eager attention's probabilities: softmax's output, fp32 under CUDA autocast (softmax is
    on its fp32 list; trace/cuda_autocast.py), the compute dtype otherwise (CPU autocast leaves softmax alone)."""
    return FP32 if st.autocast and setup.device == "cuda" else st.act


def pair_live(setup: Setup, st: StateBytes, masked: bool) -> int:
    """Bytes per (head, query, key) live at eager attention's high point (eager_attention_forward, modeling_bart.py
    :114-140, modeling_whisper.py:218-241: matmul(q, k^T) * scaling [+ mask], softmax, matmul with v): without
    autocast two score-sized tensors (the scaled scores and their successor); under CUDA autocast, unmasked, the
    16-bit scores, softmax's fp32 cast of them and its fp32 output, masked, the fp32 sum (16-bit scores + the fp32
    additive mask) and its fp32 softmax; under CPU autocast, masked, the 16-bit scores, TensorIterator's fp32 copy
    of them and the fp32 sum (trace/cpu_casts.py), unmasked two 16-bit ones."""
    a = st.act
    if not st.autocast:
        return 2 * a
    if setup.device == "cuda":
        return 2 * FP32 if masked else a + 2 * FP32
    return a + 2 * FP32 if masked else 2 * a


def attention_moments(spec: ModelSpec, setup: Setup, st: StateBytes, kv_self: int, cross: int) -> int:
    """Eager attention's high points in each stack's last block, beside the weights, the inputs and the ids: the
    encoder's self-attention (q, k, v over --seq), the decoder's self-attention (q; its K/V and every earlier block's
    are the self cache, the earlier blocks' cross caches) and cross-attention (q; the self-attention's
    probabilities, held by the layer's `_`, BartDecoderLayer.forward :357-362); each beside the stack's front-end,
    the block's stream so far (its input; pre-norm also the normalised copy, and before the cross-attention the
    self-attention's sum) and the casts made so far. 0 under SDPA (no score-sized tensor)."""
    if not fe.eager(spec, setup):
        return 0
    b, s, t, h, a, r = setup.batch, setup.seq, setup.target_tokens, spec.hidden, st.act, st.residual
    cast = a if st.autocast else 0
    pre = 0 if family_traits(spec)["post_norm"] else 1
    enc_block, dec_block = sum(fe.block_linears(spec, False)), sum(fe.block_linears(spec, True))
    qkv = fe.block_linears(spec, False)[0] - h * h - (h if spec.out_bias else 0)  # q, k, v of one attention
    encoder_casts = stack_casts(spec, False)
    enc = (cast * (encoder_casts - enc_block + qkv) + fe.held(spec, setup, st, False, s) + b * s * h * (r * (1 + pre)
           + 3 * a) + heads(spec, False) * b * s * s * pair_live(setup, st, False))
    dec_before = cast * (encoder_casts + (spec.encdec.decoder_layers - 1) * dec_block)
    dec_front = fe.held(spec, setup, st, True, t) + b * s * h * r  # and the encoder's output
    hd = heads(spec, True)
    dec_self = (dec_before + cast * qkv + kv_self + cross * (1 - 1 / spec.encdec.decoder_layers) + dec_front
                + b * t * h * (r * (1 + pre) + a) + hd * b * t * t * pair_live(setup, st, True))
    dec_cross = (dec_before + cast * (qkv + fe.block_linears(spec, False)[0]) + kv_self + cross + dec_front
                 + b * t * h * (r * (2 + pre) + a) + hd * b * t * t * probs_bytes(setup, st)
                 + hd * b * t * s * pair_live(setup, st, False))
    return max(enc, dec_self, dec_cross)


def held_probs(spec: ModelSpec, setup: Setup, st: StateBytes, decoder: bool) -> int:
    """Under eager attention, the last attention's probabilities a block holds through its MLP (the layer's `_` of
    `hidden_states, _ = self.self_attn(...)` / `self.encoder_attn(...)`, BartEncoderLayer.forward :286,
    BartDecoderLayer.forward :373, WhisperEncoderLayer / WhisperDecoderLayer the same): (b, heads, q, k) with k the
    encoder's positions (the decoder's cross-attention); 0 under SDPA (it returns no weights)."""
    if not fe.eager(spec, setup):
        return 0
    q_len = setup.target_tokens if decoder else setup.seq
    return heads(spec, decoder) * setup.batch * q_len * setup.seq * probs_bytes(setup, st)


def logits_bias(spec: ModelSpec, st: StateBytes) -> int:
    """BART's final_logits_bias buffer (1, vocab) in the model's dtype (not a parameter: params.py leaves it out)."""
    return spec.vocab * st.residual if spec.family in LOGITS_BIAS else 0


def infer_memory(spec: ModelSpec, setup: Setup, weights: float):
    """The prefill's and a decode step's high points (InferMemory) of generate() on BART or Whisper:
    prefill: the encoder over --seq positions, the decoder over --target-seq tokens filling both caches and the head
      over every target position; its high point the largest of: Whisper's conv front-end (fe.conv_moment), each
      stack's last block at its MLP (fe.held + stream + mlp_moment; the decoder's beside the encoder's output and
      both caches), under eager attention each stack's last attentions (attention_moments) and the head
      (head_moment). Beside them always the weights, BART's logits bias, the encoder's
      input and the decoder's ids. NB: SDPA's own tensors (its output, BART's decoder mask's copies inside the
      kernel) are not priced: below the MLP's at every size tested; nor, in fp16, BART's per-block
      isfinite check (BartEncoderLayer.forward :304: a (b, n, h) bool, freed; the trace cannot run its
      data-dependent branch);
    decode: one target token reading the caches, the self-attention cache grown by one token, the encoder's output
      held (step/infer.py _seq2seq_step; the prefill's decoder ids freed there), at the larger of the head, the last
      block's MLP over one position and a block's cache update (DynamicLayer.update's torch.cat: its old K, then
      its old V, beside the grown one). NB: each moment's few one-token tensors are left out (under)."""
    from .inference import InferMemory  # noqa: PLC0415 (inference dispatches to encoder_decoder, then here)

    st = state_bytes(setup)
    b, s, t, a = setup.batch, setup.seq, setup.target_tokens, st.act
    cast = a if st.autocast else 0
    dec = spec.encdec.decoder_layers
    cross = cross_cache(spec, setup, st)
    kv = self_cache(spec, setup, st, t) + cross
    fixed = weights + logits_bias(spec, st) + fe.encoder_input(spec, setup, st) + INDEX * b * t
    last_fc2 = fe.block_linears(spec, False)[2]
    front = fe.conv_moment(spec, setup, st) + cast * fe.conv_casts(spec)
    encoder = (cast * (stack_casts(spec, False) - last_fc2) + fe.held(spec, setup, st, False, s)
               + stream(spec, st, b * s) + held_probs(spec, setup, st, False)
               + mlp_moment(spec, setup, st, b * s, False))
    encoder_out = b * s * spec.hidden * st.residual
    decoder = (cast * (stack_casts(spec, True) - fe.block_linears(spec, True)[2]) + kv + encoder_out
               + fe.held(spec, setup, st, True, t) + stream(spec, st, b * t) + held_probs(spec, setup, st, True)
               + mlp_moment(spec, setup, st, b * t, True))
    lm_head = spec.vocab * spec.hidden
    head = cast * (stack_casts(spec, True) + lm_head) + kv + head_moment(spec, setup, st, t)
    attention = attention_moments(spec, setup, st, self_cache(spec, setup, st, t), cross)
    prefill = fixed + max(front, encoder, decoder, head, attention)
    per_block = self_cache(spec, setup, st, 1) / dec
    # the decode's high point: the head, the last block's MLP over one token (on a CPU's 16-bit path fc2's oneDNN
    # scratch, sized by the weight's side more than the rows) or a block's cache update (DynamicLayer.update's
    # torch.cat of keys, then of values: one old tensor beside its grown copy)
    step = max(head_moment(spec, setup, st, 1),
               encoder_out + stream(spec, st, b) + mlp_moment(spec, setup, st, b, True, cast=False),
               encoder_out + per_block * t / 2)
    decode = (fixed - INDEX * b * t + cast * (stack_casts(spec, True) + lm_head) + cross
              + self_cache(spec, setup, st, t + 1) + step)
    logits = b * t * spec.vocab * a
    return InferMemory(int(weights), int(kv), int(max(0, prefill - fixed - kv)), int(logits), int(prefill),
                       int(decode))


def prefill_flops(spec: ModelSpec, setup: Setup) -> float:
    """The prefill's FLOPs, 2 per multiply-add (analytic/flops.py's convention), over the batch:
    - Whisper's conv front-end (fe.conv_flops);
    - the encoder, --seq positions through each block's q, k, v, out_proj and fc1/fc2 and its bidirectional SDPA,
      q.k^T and probs.v over --seq keys (2 x 2 x d_model per key);
    - the decoder, --target-seq tokens through each block's self-attention linears, the cross-attention's q and
      out_proj and fc1/fc2, its self-attention over the keys its kernel visits: the causal (t + 1) / 2 on average
      where SDPA runs is_causal (Whisper: no mask tensor, encdec_frontends.FRONT_ENDS; the fused kernels skip the
      masked blocks, trace/flops.py), every key where a mask tensor is passed (BART) or under eager attention,
      whose matmuls are whole; and its cross-attention over --seq keys, whose k and v project the encoder's --seq
      positions;
    - lm_head / proj_out over every target position.
    NB: biases, norms, positions, softmax and activations are elementwise and left out, as in flops.py."""
    b, s, t, h = setup.batch, setup.seq, setup.target_tokens, spec.hidden
    mlp_e = 2 * h * fe.mlp_width(spec, False)
    mlp_d = 2 * h * fe.mlp_width(spec, True)
    encoder = spec.layers * b * s * (2 * (4 * h * h + mlp_e) + 4 * h * s)
    self_keys = t if fe.eager(spec, setup) or fe.front_end(spec, True).causal_mask else (t + 1) / 2
    decoder = spec.encdec.decoder_layers * b * (t * (2 * (6 * h * h + mlp_d) + 4 * h * self_keys + 4 * h * s)
                                                + s * 2 * 2 * h * h)
    return fe.conv_flops(spec, setup) + encoder + decoder + 2 * b * t * spec.vocab * h
