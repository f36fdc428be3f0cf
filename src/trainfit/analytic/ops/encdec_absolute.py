"""BART's and Whisper's kernels (transformers 5.24 models/bart/modeling_bart.py, models/whisper/modeling_whisper.py),
as the op list times them: each stack's front-end, the encoder's and the decoder's blocks, the head and the loss, and
a decode step's decoder; the encoder-decoders with learned absolute positions and LayerNorm blocks (T5's relative-bias
stacks are ops/encoder_decoder.py's, whose dropout, cast, cache and gradient-sum kernels these lists share).

Front-ends (encdec_frontends.FRONT_ENDS):
  * BART (BartEncoder.forward :517-525, BartDecoder.forward :609-651): the shared table's gather and its embed_scale
    multiply (BartScaledWordEmbedding.forward :109-110: `* embed_scale`, a kernel even at 1.0), the positions
    (BartLearnedPositionalEmbedding.forward :86-97: arange(+ cache_length), `+ offset 2`, their gather), the add,
    layernorm_embedding and the dropout; the decoder also builds its (b, 1, n, n) bool causal mask from the
    torch.ones(b, n) attention_mask it passes to create_causal_mask (masking_utils.py sdpa_mask: the mask's aranges,
    `<=` and `&`s).
  * Whisper (WhisperEncoder.forward :617-624): conv1 (k3) + GELU and conv2 (k3, stride 2) + GELU over the 2 x --seq
    log-mel frames, each convolution one kernel (aten convolution: cuDNN's implicit GEMM on CUDA, listed as the GEMM
    (b x frames_out, hidden, in_channels x 3) with its bias), the position table's rows (arange, gather) added, the
    dropout; the decoder (WhisperDecoder.forward :777-786): the token gather, the position ids (arange + cache_length,
    `.repeat(b, 1)`, :780) and the table's rows indexed (WhisperPositionalEmbedding.forward :210-213), the add, the
    dropout.
Blocks: BartEncoderLayer / BartDecoderLayer (:280-308, :344-390) post-norm, WhisperEncoderLayer / WhisperDecoderLayer
(:383-417, :453-510) pre-norm, each LayerNorm one native_layer_norm (norm.fused_norm; fp32 output under autocast):
  * the attention (BartAttention.forward :185-256, WhisperAttention.forward :287-360): q, k, v and out_proj linears
    with biases (Whisper's k_proj without, :281); BART passes its scaling to SDPA (no kernel), Whisper multiplies q by
    it (:312) and makes q, k and v contiguous in (b, heads, s, d) (:312, :336-337: a copy each over more than one
    token), so the flash kernel's output, in q's layout, is copied by sdpa_attention.py's transpose(1, 2).contiguous()
    (BART's views, and the memory-efficient kernel's output, are (b, s, heads, d): no copy). SDPA (integrations/
    sdpa_attention.py): no mask in the encoders and the cross-attention (the flash kernel; the memory-efficient one in
    fp32, Shape.attention); the decoder's self-attention is BART's materialised bool mask, which
    aten's scaled_dot_product_attention turns into an additive one (attention.cpp convert_boolean_attn_mask: two
    scalar tensors and a where, in q's dtype) for the memory-efficient kernel, Whisper's is_causal (flash, causal;
    no mask: its decoder passes no attention_mask). With a cache (generate()) DynamicLayer.update's torch.cat of the
    k and v (the prefill's too) and the cross-attention's k and v projected at the prefill only (is_updated).
  * the MLP: fc1 (biased), ACT2FN's GELU (one kernel), activation_dropout, fc2 (biased), dropout, the residual add.
Head (BartForConditionalGeneration.forward :926-944, WhisperForConditionalGeneration.forward): lm_head / proj_out
(tied, no bias) over every target position; BART adds final_logits_bias, a (1, vocab) buffer in the model's dtype
(:935); the loss: CrossEntropyLoss on the logits as they are, the decoder ids shift_tokens_right's (:52-65).
The backward is ops.backward of these lists plus the blocks' gradient sums (encoder_decoder.block_grad_sums: BART's
post-norm and Whisper's pre-norm stream are each read as often as T5's) and absolute_backward_extra.
"""
from __future__ import annotations

from dataclasses import replace

from ..activations import FP32, INDEX
from ..encdec_frontends import mlp_width
from ..families import family_traits
from .activation import one_kernel
from .cast import autocast_inputs, weight_casts
from .embedding import embedding_grad
from .encoder_decoder import ABSOLUTE, BOOL, _cast, _drop
from .loss import lm_loss, lm_loss_backward_extra, loss_scale
from .norm import norm_ops
from .op import Op, Shape, attention_dtype, gemm, memory, no_kernel
from .residual import residual

BART, WHISPER = "modeling_bart.py", "modeling_whisper.py"
LISTED = ABSOLUTE
# Whisper's encoder convolutions' kernel width and conv2's stride (WhisperEncoder.__init__ :571-572)
CONV_K, CONV2_STRIDE = 3, 2


def _src(spec) -> str:
    return WHISPER if spec.family == "whisper" else BART


def _whisper(spec) -> bool:
    return spec.encdec.mel_bins > 0


def stack_shape(sh: Shape, seq: int) -> Shape:
    """The setup's Shape over one stack's `seq` tokens per sequence, SDPA's kernels (each attention op names its own:
    flash or, BART's masked self-attention, efficient) and the loss on the logits' own dtype."""
    return replace(sh, seq=seq, hf_eager=False, eager_mask=0, sdpa=True, loss_upcast=False, shifted_labels=False)


def dropouts(spec, training: bool) -> tuple[float, float, float, float]:
    """(embedding, attention probabilities, branch, activation) dropout rates (spec.dropouts and
    EncoderDecoderSpec.activation_dropout: BartEncoderLayer :298, WhisperEncoderLayer :408); 0 in eval."""
    if not training:
        return 0.0, 0.0, 0.0, 0.0
    e, a, r = spec.dropouts
    return e, a, r, spec.encdec.activation_dropout


def _norm(spec, name: str, sh: Shape, group: str) -> list[Op]:
    """nn.LayerNorm: one native_layer_norm (norm.fused_norm), its output in the stream's dtype (fp32 under autocast,
    the weights')."""
    return norm_ops(spec, name, sh.tokens, sh, group)


# --- attention sublayers ------------------------------------------------------------------------------------------
def _head_copies(spec, name: str, rows: float, sh: Shape, n: int, bwd: bool) -> list[Op]:
    """Whisper's `.transpose(1, 2).contiguous()` of `n` projections over `rows` tokens (:312, :336-337) or of SDPA's
    output (sdpa_attention.py transpose(1, 2).contiguous(): the flash kernel's output takes q's layout, flash's
    mha_fwd empty_like(q); the memory-efficient kernel's is (b, s, heads, d) whatever q's, no copy): one copy each,
    none over one token per sequence (the transposed view is contiguous); BART's views none. `bwd`: whether the
    copy's backward copies (the gradient the kernel's backward returns, in the layout of its input under flash, of
    (b, s, heads, d) under the efficient kernel, reshaped for the projection's dgrad); else it passes it on."""
    if not _whisper(spec) or sh.seq == 1:
        return []
    x = rows * spec.hidden * sh.act
    back = () if bwd else (no_kernel(f"{name}.contiguous"),)
    return [memory(f"{name}.contiguous", x, x, f"{WHISPER}:312/:336-337 .contiguous()", saves=False, bwd_ops=back)
            for _ in range(n)]


def causal_mask(spec, sh: Shape, s_kv: float) -> list[Op]:
    """BART's decoder mask, once per forward (BartDecoder.forward :626-640 torch.ones(b, n) attention_mask,
    create_causal_mask -> masking_utils.py sdpa_mask): the ones (fp32) and their bool cast, the aranges of the kv and
    cache positions and their offsets, the padding mask's gather, `<=` and two `&` into the (b, 1, q, kv) bool mask:
    13 kernels. NB: bytes as the output's three passes and the index vectors' six (the trace: within 5 %)."""
    if _whisper(spec):  # no attention_mask: SDPA's is_causal, no mask tensor
        return []
    b, q = sh.batch, sh.seq
    pairs = b * q * s_kv
    reads = pairs * BOOL + 3 * (q + s_kv) * INDEX + b * s_kv * (FP32 + BOOL)
    writes = 2 * pairs * BOOL + 3 * (q + s_kv) * INDEX + b * s_kv * (FP32 + BOOL)
    return [memory("mask.causal", reads, writes, "masking_utils.py sdpa_mask (create_causal_mask)", saves=False,
                   kernels=13, grad=False)]


def _sdpa_mask(spec, sh: Shape, kind: str, s_kv: float) -> list[Op]:
    """aten scaled_dot_product_attention's conversion of BART's bool self-attention mask to an additive one in q's
    dtype (attention.cpp convert_boolean_attn_mask: two scalar_tensor and a where), per call."""
    if kind != "self" or _whisper(spec):
        return []
    pairs = sh.batch * sh.seq * s_kv
    return [memory("self.mask_where", pairs * BOOL + 2 * sh.act, pairs * sh.act + 2 * sh.act,
                   "attention.cpp convert_boolean_attn_mask (torch.where)", saves=False, kernels=3, grad=False)]


def attention_sublayer(spec, sh: Shape, kind: str, s_kv: float, p: tuple, kv_rows: float = 0.0,
                       cache: bool = False, past: float = 0.0) -> list[Op]:
    """One attention sublayer over the Shape's tokens: Whisper's norm before (pre-norm), q (Whisper's scaling and
    copy), k and v (of the block's own tokens, or the encoder's `kv_rows` in the cross-attention; none when the cross
    cache holds them: `past`), the cache's cats (`cache`: generate()), the mask's conversion, SDPA over `s_kv` keys,
    the output's copy, out_proj, the branch's dropout and the residual add, BART's norm after (post-norm). `kind`:
    "encoder", "self" or "cross"; `p`: dropouts()."""
    h, T, src = spec.hidden, sh.tokens, _src(spec)
    post = family_traits(spec)["post_norm"]
    cross = kind == "cross"
    heads = spec.encdec.decoder_heads if kind != "encoder" and spec.encdec.decoder_heads else spec.heads
    d = h // heads
    masked = kind == "self" and not _whisper(spec)
    causal = kind == "self" and _whisper(spec) and sh.seq > 1
    kernel = "efficient" if masked else sh.attention  # (sh.attention: flash, or efficient in fp32)
    flash = kernel == "flash"
    ops = [] if post else _norm(spec, f"{kind}_norm", sh, kind)
    ops += autocast_inputs(f"{kind}_in", T, h, 1 if cross else 3, sh, kind)
    ops.append(gemm(f"{kind}.q", T, h, h, sh, f"{src} q_proj", bias=spec.qkv_bias))
    if _whisper(spec):
        ops.append(memory(f"{kind}.q_scale", T * h * sh.act, T * h * sh.act, f"{WHISPER}:312 q_proj(x) * scaling",
                          kind, saves=False))
    ops += _head_copies(spec, f"{kind}.q", T, sh, 1, flash)
    rows = kv_rows if cross else T
    if not (cross and past):
        if cross:  # the encoder's output, in its final norm's dtype (the stream's)
            ops += _cast(f"{kind}.kv_in.autocast0", rows * h, sh.residual, sh.act) * (2 if sh.autocast else 0)
        k_bias = spec.qkv_bias and spec.encdec.k_bias
        ops.append(gemm(f"{kind}.k", rows, h, h, sh, f"{src} k_proj", bias=k_bias))
        ops += _head_copies(spec, f"{kind}.k", rows, sh, 1, flash)
        ops.append(gemm(f"{kind}.v", rows, h, h, sh, f"{src} v_proj", bias=spec.qkv_bias))
        ops += _head_copies(spec, f"{kind}.v", rows, sh, 1, flash)
        if cache:  # DynamicLayer.update's torch.cat of the cached and the new k and v (the prefill's: of nothing)
            keys = (past + sh.seq) if not cross else s_kv
            kv = sh.batch * h * sh.act * keys
            ops.append(memory(f"{kind}.cache_cat", 2 * kv, 2 * kv, "cache_utils.py DynamicLayer.update (torch.cat)",
                              saves=False, kernels=2, grad=False))
    ops += _sdpa_mask(spec, sh, kind, s_kv)
    ops.append(Op(f"{kind}.attention", "attention", attention_dtype(sh), sh.seq, s_kv, d, sh.batch * heads,
                  causal=causal, kernel=kernel, dropout=p[1] > 0,
                  source="sdpa_attention.py scaled_dot_product_attention"))
    # (its gradient, o's dgrad, is the layout the kernel's backward takes: no kernel)
    ops += _head_copies(spec, f"{kind}.output", T, sh, 1 if flash else 0, False)
    ops.append(gemm(f"{kind}.o", T, h, h, sh, f"{src} out_proj", bias=spec.out_bias))
    ops += residual(kind, T * h, p[2], sh, kind, f"{src} residual + dropout(attention)")
    return ops + (_norm(spec, f"{kind}_norm", sh, kind) if post else [])


def mlp_sublayer(spec, sh: Shape, p: tuple, decoder: bool) -> list[Op]:
    """fc1, GELU (ACT2FN: one kernel), activation_dropout, fc2, dropout and the residual add, with the norm before
    (Whisper) or after (BART)."""
    h, T, f, src = spec.hidden, sh.tokens, mlp_width(spec, decoder), _src(spec)
    post = family_traits(spec)["post_norm"]
    ops = [] if post else _norm(spec, "mlp_norm", sh, "mlp")
    ops += autocast_inputs("mlp_in", T, h, 1, sh, "mlp")
    ops.append(gemm("mlp.fc1", T, f, h, sh, f"{src} fc1", bias=spec.mlp_bias))
    ops += one_kernel(spec.activation, "mlp.act", T * f, sh, "mlp")
    ops += _drop("mlp.act_dropout", T * f, sh.act, p[3], "mlp")
    ops.append(gemm("mlp.fc2", T, h, f, sh, f"{src} fc2", bias=spec.mlp_bias))
    ops += residual("mlp", T * h, p[2], sh, "mlp", f"{src} residual + dropout(fc2)")
    return ops + (_norm(spec, "mlp_norm", sh, "mlp") if post else [])


def encoder_block(spec, sh: Shape, p: tuple) -> list[Op]:
    """One encoder layer over sh.seq tokens per sequence (its autocast weight casts first)."""
    ops = attention_sublayer(spec, sh, "encoder", sh.seq, p) + mlp_sublayer(spec, sh, p, False)
    return weight_casts("weight_casts", ops, sh) + ops


def decoder_block(spec, sh: Shape, enc_seq: float, p: tuple, cache: bool = False, past: float = 0.0) -> list[Op]:
    """One decoder layer over sh.seq new tokens per sequence with `past` cached ones (a decode step: sh.seq 1): the
    self-attention over past + seq keys, the cross-attention over the encoder's enc_seq tokens (projected at the
    prefill, read from the cache at a decode step), the MLP. `cache`: generate()'s, whose cats the prefill runs too."""
    att = attention_sublayer(spec, sh, "self", past + sh.seq, p, cache=cache, past=past)
    cross = attention_sublayer(spec, sh, "cross", enc_seq, p, kv_rows=sh.batch * enc_seq, cache=cache, past=past)
    ops = att + cross + mlp_sublayer(spec, sh, p, True)
    return weight_casts("weight_casts", ops, sh) + ops


# --- the front-ends -----------------------------------------------------------------------------------------------
def _gather(name: str, rows: float, h: int, sh: Shape, src: str) -> Op:
    """An embedding lookup of `rows` rows (an index gather: its ids read, the rows read and written)."""
    return memory(name, rows * h * sh.weight + rows * INDEX, rows * h * sh.weight, src, "embed", saves=False,
                  grad=False)


def audio_front(spec, sh: Shape, p: tuple) -> list[Op]:
    """Whisper's conv1 + GELU and conv2 + GELU over the 2 x n mel frames (:617-618), the position table's rows
    (:621-623: arange over the table, its gather) added, the dropout (:624)."""
    e, h, b, n, a = spec.encdec, spec.hidden, sh.batch, sh.seq, sh.act
    frames = e.mel_frames(n)
    ops = autocast_inputs("conv1_in", b * frames, e.mel_bins, 1, sh, "embed")
    ops.append(gemm("conv1", b * frames, h, e.mel_bins * CONV_K, sh, f"{WHISPER}:617 conv1 (implicit GEMM)",
                    bias=True))
    ops += one_kernel("gelu", "conv1.act", b * frames * h, sh, "embed")
    ops.append(gemm("conv2", b * frames // CONV2_STRIDE, h, h * CONV_K, sh, f"{WHISPER}:618 conv2 (implicit GEMM)",
                    bias=True))
    ops += one_kernel("gelu", "conv2.act", b * n * h, sh, "embed")
    ops = weight_casts("conv.weight_casts", ops, sh) + ops
    ops += [memory("positions.ids", 0, n * INDEX, f"{WHISPER}:621 arange", saves=False, grad=False),
            _gather("embed_positions", n, h, sh, f"{WHISPER}:623 embed_positions")]
    r = sh.residual
    ops.append(memory("embed_add", b * n * h * a + n * h * sh.weight, b * n * h * max(a, sh.weight),
                      f"{WHISPER}:623 inputs_embeds + positions", "embed", saves=False))
    return ops + _drop("embed_dropout", b * n * h, r, p[0], "embed")


def token_front(spec, sh: Shape, p: tuple, decoder: bool, past: float = 0.0) -> list[Op]:
    """A token stack's front-end over sh.seq new tokens per sequence after `past` cached ones: the token gather,
    BART's embed_scale multiply, the position ids and their rows, the add, BART's layernorm_embedding, the dropout;
    BART's decoder's causal mask (causal_mask)."""
    h, n, w, src, T = spec.hidden, sh.seq, sh.weight, _src(spec), sh.tokens
    ops = [_gather("embed", T, h, sh, f"{src} embed_tokens")]
    if _whisper(spec):  # :777-786: arange + cache_length, .repeat(b, 1), weight[position_ids]
        ops.append(memory("positions.ids", 2 * n * INDEX, 2 * n * INDEX + T * INDEX, f"{WHISPER}:777-780 position_ids",
                          saves=False, kernels=3, grad=False))
        ops.append(_gather("embed_positions", T, h, sh, f"{WHISPER}:210-213 "
                           "embed_positions weight[position_ids]"))
        pos = T
    else:  # :86-97: arange (+ cache_length in the decoder), + offset 2 (expanded to (b, n) in the encoder)
        ops.append(memory("embed_scale", T * h * w, T * h * w, f"{BART}:109-110 * embed_scale", "embed", saves=False))
        ids = n if decoder else T
        ops.append(memory("positions.ids", (2 if decoder else 1) * n * INDEX, n * INDEX + ids * INDEX + (n * INDEX if decoder else 0),
                          f"{BART}:86-97 arange + offset", saves=False, kernels=3 if decoder else 2, grad=False))
        if decoder:
            ops += causal_mask(spec, sh, past + n)
        pos = ids
        ops.append(_gather("embed_positions", pos, h, sh, f"{BART}:97 embed_positions"))
    ops.append(memory("embed_add", T * h * w + pos * h * w, T * h * w, f"{src} inputs_embeds + positions", "embed",
                      saves=False))
    if not _whisper(spec):
        ops += _norm(spec, "layernorm_embedding", sh, "embed")
    return ops + _drop("embed_dropout", T * h, sh.residual, p[0], "embed")


def stack_input(spec, sh: Shape, p: tuple, decoder: bool, past: float = 0.0) -> list[Op]:
    """A stack's front-end (the module docstring)."""
    if not decoder and _whisper(spec):
        return audio_front(spec, sh, p)
    return token_front(spec, sh, p, decoder, past)


def stack_output(spec, sh: Shape) -> list[Op]:
    """Whisper's final layer_norm per stack (WhisperEncoder.forward :641, WhisperDecoder); BART's blocks end normed."""
    return [] if family_traits(spec)["post_norm"] else _norm(spec, "final_norm", sh, "final")


def head_forward(spec, sh: Shape, loss: bool) -> list[Op]:
    """lm_head / proj_out over every decoder position (its autocast casts: one weight, tied), BART's final_logits_bias
    add (:935: the (1, vocab) buffer in the model's dtype, fp32 under autocast, promoting the logits) and, `loss`,
    shift_tokens_right's decoder ids (:52-65: new_zeros, the shifted copy, the start token, the -100 masked_fill) and
    CrossEntropyLoss (loss.lm_loss)."""
    T, h, V, a = sh.tokens, spec.hidden, spec.vocab, sh.act
    src = _src(spec)
    ops = autocast_inputs("lm_head_in", T, h, 1, sh, "final")
    g = gemm("lm_head", T, V, h, sh, f"{src} lm_head / proj_out")
    ops += weight_casts("head.weight_casts", [g], sh) + [g]
    if spec.family == "bart":
        out = max(a, sh.residual)
        ops.append(memory("final_logits_bias", T * V * a + V * sh.residual, T * V * out,
                          f"{BART}:935 lm_logits + final_logits_bias", "final", saves=False))
    if not loss:
        return ops
    logits = max(a, sh.residual) if spec.family == "bart" else a
    ids = T * INDEX
    shift = memory("shift_right", 3 * ids, 4 * ids, f"{src} shift_tokens_right", saves=False, kernels=4, grad=False)
    return [shift] + ops + lm_loss(T, T * V, replace(sh, act=logits)) + [loss_scale()]


def absolute_backward_extra(spec, enc: Shape, dec: Shape) -> list[Op]:
    """What only the backward runs, once per step: loss.backward()'s seed and nll_loss's zeroed gradient; the token
    tables' embedding_dense_backward (BART's shared table: both stacks' gathers, and the tied lm_head's gradient
    added, autograd InputBuffer::add; Whisper's decoder table and proj_out), the learned position tables' (BART's
    two; Whisper's decoder's; its encoder's table is frozen, :575)."""
    h, V = spec.hidden, spec.vocab
    ops = [memory("loss.seed", 0, FP32, "autograd _make_grads ones_like", saves=False),
           *lm_loss_backward_extra(dec.tokens * V, dec)]
    ops += embedding_grad("embed.decoder", V, dec.tokens, h, dec)
    x = V * h * dec.grad
    if _whisper(spec):
        ops.append(memory("embed.tied_grad_sum", 2 * x, x, "autograd InputBuffer::add (tied proj_out)",
                          saves=False))
        ops += embedding_grad("positions.decoder", spec.encdec.decoder_positions, dec.tokens, h, dec)
        return ops
    ops += embedding_grad("embed.encoder", V, enc.tokens, h, enc)
    ops.append(memory("embed.tied_grad_sum", 2 * 2 * x, 2 * x, "autograd InputBuffer::add (shared table)",
                      saves=False, kernels=2))
    for name, sh in (("positions.encoder", enc), ("positions.decoder", dec)):
        ops += embedding_grad(name, sh.seq + 2, sh.tokens, h, sh)
    return ops
