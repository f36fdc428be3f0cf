"""T5's kernels (transformers 5.24 models/t5/modeling_t5.py; mT5 is the same model, modeling_mt5.py), as the op list
times them: the encoder's and the decoder's blocks, the relative position bias each stack's first block computes, the
embeddings, the final norms, the LM head and the loss; a decode step's decoder. The backward is ops.backward of these
lists plus what only a backward runs (encoder_decoder_backward_extra).

A block (T5Block :435-480) is T5LayerSelfAttention [+ T5LayerCrossAttention in the decoder] + T5LayerFF, each
`x + dropout(sublayer(T5LayerNorm(x)))`:
  * T5LayerNorm (:60-73): fp32 variance (pow, mean, + eps, rsqrt), x · rsqrt, a cast to the weight's dtype when that
    is 16-bit, weight · x: HF's RMSNorm kernels (norm.hf_rms_norm), its output in the weight's dtype.
  * T5Attention.forward (:283-372): q, k, v, o linears without bias (inner = heads x d_kv); the cross-attention's k
    and v project the encoder's output (its `key_value_states`) and, with a cache, only at the prefill (is_updated).
    The attention runs through transformers' SDPA interface (T5PreTrainedModel._supports_sdpa; integrations/
    sdpa_attention.py:94-197): the relative bias becomes SDPA's additive float mask (create_position_bias_mask
    :54-91): `position_bias.contiguous()` (a copy of the permuted (1, heads, q, k) bias) in the encoder, `torch.where(
    causal, position_bias, min)` then `.contiguous()` in the decoder's self-attention (no attention mask: the causal
    one is rebuilt per call from two aranges), the cross-attention's zero bias as it is (contiguous). T5's scaling is
    1.0 (:211). A float mask rules out the flash kernel, so CUDA's dispatcher runs the memory-efficient kernel (it
    takes an additive bias, its gradient and dropout; torch sdp_utils.cpp check_for_attn_mask / use_mem_efficient_
    attention): `attention` op with kernel "efficient". Under CUDA autocast SDPA casts its fp32 mask (the bias is an
    fp32 Embedding's lookup) to the compute dtype. Then the output's transpose(1, 2).contiguous() (:195) and o.
    (The trace engine's CUDA semantics run a masked SDPA call through the same kernel, trace/cuda_masked_sdpa.py.)
  * T5LayerFF (:128-142): T5DenseGatedActDense (:98-125: act(wi_0 x) · wi_1 x, dropout, `.to(wo.weight.dtype)`, wo)
    or T5DenseActDense (:76-95: act(wi x), dropout, the same cast, wo); gelu_new's output is fp32 under autocast
    (activation.gelu_new_out), so the product and its dropout are too; wo is kept in fp32 only by
    _keep_in_fp32_modules at load time (not here: the weight dtype is the setup's).
  * relative bias (compute_bias :265-281, _relative_position_bucket :217-262), in each stack's first block only
    (T5Stack.__init__ has_relative_attention_bias=bool(i == 0)); later blocks reuse its output (:741-745).
Around the blocks (T5Stack.forward :665-750, T5ForConditionalGeneration.forward :942-1069): embed_tokens (the shared
table) and dropout per stack; final_layer_norm and dropout per stack; T5 v1.0's d_model**-0.5 rescale of the decoder
output (EncoderDecoderSpec.scale_decoder_outputs, :1047-1048); lm_head (tied to the shared table); CrossEntropyLoss on
the logits as they are (:1054-1057: no upcast but autocast's, whose fp32 list holds the loss); _shift_right's
decoder ids (:622-641).
"""
from __future__ import annotations

from dataclasses import replace

from ..activations import FP32, INDEX
from ..encoder_decoder import inner
from .activation import activation, activation_out_bytes
from .attention import eager_output_copy
from .cast import autocast_inputs, weight_casts
from .embedding import embedding_grad
from .loss import lm_loss, lm_loss_backward_extra, loss_scale
from .norm import norm_ops
from .op import DOWNCAST, REDUCE, UPCAST, Op, Shape, attention_dtype, bwd_kernel, gemm, grad_cast, memory, no_kernel
from .residual import residual

SRC = "modeling_t5.py"
BOOL = 1
# the families whose kernels this module lists (T5Stack's blocks)
LISTED = ("t5", "mt5")
# the absolute-position encoder-decoders, whose kernels ops/encdec_absolute.py lists
ABSOLUTE = ("bart", "whisper")


def listed(spec) -> bool:
    """Whether the op list has `spec`'s kernels (an encoder-decoder of LISTED or ABSOLUTE)."""
    return spec.encdec is not None and spec.family in LISTED + ABSOLUTE


def stack_shape(sh: Shape, seq: int) -> Shape:
    """The setup's Shape over one stack's `seq` tokens per sequence, with T5's attention: SDPA with the bias as its
    float mask (the memory-efficient kernel, the module docstring) and its loss on the logits' own dtype."""
    return replace(sh, seq=seq, attention="efficient", hf_eager=False, eager_mask=0, sdpa=True, loss_upcast=False,
                   shifted_labels=False)


def _drop(name: str, x: float, nbytes: int, p: float, group: str) -> list[Op]:
    """nn.Dropout over x elements of `nbytes` each (CUDA native_dropout: x read, x and a 1-byte mask written); none in
    eval (p = 0)."""
    if p <= 0:
        return []
    return [memory(name, x * nbytes, x * (nbytes + BOOL), "aten native_dropout", group, (0, x), saves=False)]


def _cast(name: str, x: float, src: int, dst: int, group: str = "") -> list[Op]:
    """A dtype cast of x elements (none when the dtypes agree); its backward casts the gradient back."""
    if src == dst:
        return []
    access = DOWNCAST if dst < src else UPCAST
    return [memory(name, x * src, x * dst, "dtype cast", group, saves=False, **access)]


def t5_norm(spec, name: str, tokens: float, sh: Shape, group: str) -> list[Op]:
    """T5LayerNorm (:60-73): HF's RMSNorm kernels (norm.hf_rms_norm), but its fp32 copy feeds the variance only:
    `hidden_states * torch.rsqrt(variance + eps)` multiplies the stream as it is (a 16-bit x by an fp32 factor: an fp32
    product by type promotion), so that product reads x in the stream's dtype, as does its backward's grad · r·x-side
    product (the rsqrt factor's gradient, grad · x), and its backward casts x's gradient back to the stream's dtype
    (engine.cpp validate_outputs; op.grad_cast)."""
    ops = norm_ops(spec, name, tokens, sh, group)
    r = sh.residual
    if r == FP32:
        return ops
    x = tokens * spec.hidden
    out = []
    for o in ops:
        if o.name == f"{name}.mul":
            bwd = tuple(b._replace(reads=b.reads - x * (FP32 - r)) if b.name == f"{name}.mul.backward_r" else b
                        for b in o.bwd_ops)
            o = o._replace(reads=o.reads - x * (FP32 - r),
                           bwd_ops=bwd + grad_cast(f"{name}.mul.grad_cast", x, FP32, r))
        out.append(o)
    return out


# --- the relative position bias (compute_bias :265-281, _relative_position_bucket :217-262) ---------------------
def _bucket_passes(bidirectional: bool) -> list[tuple[str, int, int]]:
    """(op, bytes read, bytes written) per (query, key) pair of _relative_position_bucket's elementwise kernels, in
    order: int64 positions, bool tests, the log bins in fp32."""
    L, F = INDEX, FP32
    if bidirectional:  # :239-242: buckets = (rp > 0).to(long) * n; rp = |rp|
        head = [("sub", 0, L), ("gt", L, BOOL), ("gt.to_long", BOOL, L), ("mul", L, L), ("buckets", L, L),
                ("abs", L, L)]
    else:  # :244: rp = -min(rp, zeros_like(rp))
        head = [("sub", 0, L), ("zeros_like", 0, L), ("minimum", 2 * L, L), ("neg", L, L)]
    # :248-258 is_small, the log bins (float, / max_exact, log, / log(max / exact), * (n - exact), long, + exact),
    # the clamp to n - 1 (full_like, min), the where and the running sum (+=: `0 + x` in the decoder)
    tail = [("lt", L, BOOL), ("to_float", L, F), ("div", F, F), ("log", F, F), ("div2", F, F), ("mul2", F, F),
            ("to_long", F, L), ("add_exact", L, L), ("full_like", 0, L), ("min", 2 * L, L),
            ("where", BOOL + 2 * L, L), ("sum", (2 if bidirectional else 1) * L, L)]
    return head + tail


def relative_bias(spec, sh: Shape, s_q: float, s_kv: float, decoder: bool) -> list[Op]:
    """A stack's first block's compute_bias over s_q x s_kv pairs: the positions (two aranges, `+ past_seen_tokens`),
    the bucketing's elementwise kernels (_bucket_passes, bidirectional in the encoder) and the Embedding(buckets,
    heads) lookup, in the weights' dtype; its backward the table's embedding_dense_backward (encoder_decoder_
    backward_extra). (The permute is a view: its copy is the mask's, _mask_ops.)"""
    n, H, w = s_q * s_kv, spec.heads, sh.weight
    src = f"{SRC}:217-281 compute_bias / _relative_position_bucket"
    passes = _bucket_passes(not decoder)
    ops = [memory("bias.positions", 0, (2 * s_q + s_kv) * INDEX + s_q * INDEX, src, saves=False, kernels=3,
                  grad=False),
           memory("bias.buckets", sum(r for _, r, _ in passes) * n, sum(wr for _, _, wr in passes) * n, src,
                  saves=False, kernels=len(passes), grad=False)]
    table = spec.encdec.relative_buckets * H * w
    ops.append(memory("bias.embedding", n * INDEX + table, n * H * w, f"{SRC}:279 relative_attention_bias lookup",
                      saves=False, grad=False))
    return ops


# --- attention sublayers ------------------------------------------------------------------------------------------
def _mask_ops(spec, sh: Shape, kind: str, s_q: float, s_kv: float) -> list[Op]:
    """SDPA's float mask from the bias (sdpa_attention.py create_position_bias_mask :54-91), per call: the encoder's
    contiguous copy of the permuted bias; the decoder self-attention's causal test (two aranges and >=, :76-78), the
    where of the bias under it and its copy (one where whose output keeps the bias's permuted strides); the
    cross-attention's zero bias is contiguous (no kernel). Under autocast SDPA casts an fp32 mask to the compute
    dtype. Their backwards: the copies' pass the gradient on, the where's zeroes the masked part (one kernel), the
    cast's casts back."""
    P, w, a = spec.heads * s_q * s_kv, sh.weight, sh.act
    src = "sdpa_attention.py:54-91 create_position_bias_mask"
    if kind == "cross":
        return []
    ops = []
    if kind == "self" and s_q > 1:  # (a decode step's single query sees every key: not causal, :148)
        pairs = s_q * s_kv
        ops += [memory("mask.causal", (s_q + s_kv) * INDEX, pairs * BOOL + (s_q + s_kv) * INDEX, src, saves=False,
                       kernels=3, grad=False),
                memory("mask.where", P * w + pairs * BOOL, P * w, src, saves=False, bwd_ops=(
                    bwd_kernel("mask.where.backward", P * w + pairs * BOOL, P * w),))]
    ops.append(memory("mask.contiguous", P * w, P * w, src, saves=False, bwd_ops=(no_kernel("mask.contiguous"),)))
    if sh.autocast and w != a:
        ops += _cast("mask.attn_cast", P, w, a)
    return ops


def attention_sublayer(spec, sh: Shape, kind: str, s_kv: float, p: float, kv_rows: float = 0.0,
                       kv_cached: bool = False) -> list[Op]:
    """One T5LayerSelfAttention / T5LayerCrossAttention (:383-432) over the Shape's tokens: its norm, q (k, v: of the
    block's own tokens, or the encoder's `kv_rows` tokens in the cross-attention, none when `kv_cached`), SDPA's mask,
    the attention over `s_kv` keys, the output copy, o, the residual's dropout and add. `kind`: "encoder", "self"
    (the decoder's causal self-attention) or "cross"; `p`: the dropout rate (0 in eval)."""
    h, T, q, d = spec.hidden, sh.tokens, inner(spec), spec.head_dim
    s_q = sh.seq
    ops = t5_norm(spec, f"{kind}_norm", T, sh, kind)
    cross = kind == "cross"
    ops += autocast_inputs(f"{kind}_in", T, h, 1 if cross else 3, sh, kind)
    src = f"{SRC}:306-330 T5Attention q/k/v"
    ops.append(gemm(f"{kind}.q", T, q, h, sh, src))
    if cross and not kv_cached:  # k and v of the encoder's output (in its final norm's dtype: the weights')
        ops += _cast(f"{kind}.kv_in.autocast0", kv_rows * h, sh.weight, sh.act) * (2 if sh.autocast else 0)
        ops += [gemm(f"{kind}.k", kv_rows, q, h, sh, src), gemm(f"{kind}.v", kv_rows, q, h, sh, src)]
    elif not cross:
        ops += [gemm(f"{kind}.k", T, q, h, sh, src), gemm(f"{kind}.v", T, q, h, sh, src)]
    ops += _mask_ops(spec, sh, kind, s_q, s_kv)
    # NB: timed as the kernel without a bias (roofline.attention_seconds): its reads of the (heads, q, k) bias per
    # batch element and, in backward, its writes of the batch-sized bias gradient are not charged (under)
    ops.append(Op(f"{kind}.attention", "attention", attention_dtype(sh), s_q, s_kv, d, sh.batch * spec.heads,
                  kernel=sh.attention, dropout=p > 0,
                  source="sdpa_attention.py:182 scaled_dot_product_attention (float mask: memory-efficient kernel)"))
    # (the copy's gradient is the transposed view: the efficient kernel's backward takes it as it is, no kernel)
    ops += [o._replace(name=f"{kind}.output_copy", bwd_ops=(no_kernel(f"{kind}.output_copy"),))
            for o in eager_output_copy(T, q, sh)]
    ops.append(gemm(f"{kind}.o", T, h, q, sh, f"{SRC}:370 T5Attention o"))
    ops += residual(kind, T * h, p, sh, kind, f"{SRC}:404/:436 x + dropout(attention)")
    return ops


def ff_sublayer(spec, sh: Shape, p: float) -> list[Op]:
    """T5LayerFF (:128-142): the norm, the MLP (gated: act(wi_0 x) · wi_1 x; else act(wi x)), its dropout, the cast to
    wo's weight dtype and autocast's back, wo, the residual's dropout and add."""
    h, T, f, a, w = spec.hidden, sh.tokens, spec.intermediate, sh.act, sh.weight
    x = T * f
    ops = t5_norm(spec, "ff_norm", T, sh, "ff")
    gated = spec.gated_mlp
    ops += autocast_inputs("ff_in", T, h, 2 if gated else 1, sh, "ff")
    u = activation_out_bytes(spec, sh)  # gelu_new's output: fp32 under autocast
    if gated:
        ops.append(gemm("ff.wi_0", T, f, h, sh, f"{SRC}:107 wi_0"))
        ops += activation(spec, "ff.act", x, sh, "ff")
        ops.append(gemm("ff.wi_1", T, f, h, sh, f"{SRC}:108 wi_1"))
        e = max(u, a)  # the product's dtype (type promotion)
        ops.append(memory("ff.gate_mul", x * (u + a), x * e, f"{SRC}:109 hidden_gelu * hidden_linear", "ff", bwd_ops=(
            bwd_kernel("ff.gate_mul.backward", x * (e + a), x * u), bwd_kernel("ff.gate_mul.backward_b", x * (e + u),
                                                                               x * e),
            *grad_cast("ff.gate_mul.grad_cast", x, e, a))))
    else:
        ops.append(gemm("ff.wi", T, f, h, sh, f"{SRC}:85 wi"))
        ops += activation(spec, "ff.act", x, sh, "ff")
        e = u
    ops += _drop("ff.dropout", x, e, p, "ff")
    ops += _cast("ff.to_wo_dtype", x, e, w, "ff")  # :117-123 `.to(self.wo.weight.dtype)`
    ops += _cast("ff.wo_in.autocast0", x, w, a, "ff") if sh.autocast else []
    ops.append(gemm("ff.wo", T, h, f, sh, f"{SRC}:124 wo"))
    ops += residual("ff", T * h, p, sh, "ff", f"{SRC}:141 x + dropout(ff)")
    return ops


# --- blocks -------------------------------------------------------------------------------------------------------
def encoder_block(spec, sh: Shape, p: float, first: bool = False) -> list[Op]:
    """One encoder T5Block over sh.seq tokens per sequence (`first`: with the relative bias's computation)."""
    s = sh.seq
    att = attention_sublayer(spec, sh, "encoder", s, p)
    if first:
        at = next(i for i, o in enumerate(att) if o.name.startswith("mask."))
        att = att[:at] + relative_bias(spec, sh, s, s, False) + att[at:]
    ops = att + ff_sublayer(spec, sh, p)
    return weight_casts("weight_casts", ops, sh) + ops


def decoder_block(spec, sh: Shape, enc_seq: float, p: float, first: bool = False, past: float = 0.0) -> list[Op]:
    """One decoder T5Block over sh.seq new tokens per sequence with `past` cached ones (a decode step: sh.seq 1): the
    causal self-attention over past + seq keys, the cross-attention over the encoder's enc_seq tokens (their k and v
    projected at the prefill, read from the cache at a decode step), the FF. `first`: with the relative bias and the
    cross-attention's zero bias (:335-342, in the query's dtype; later blocks reuse it)."""
    keys = past + sh.seq
    att = attention_sublayer(spec, sh, "self", keys, p)
    if past:  # the self-attention cache's growth: DynamicLayer.update's torch.cat of the old and new k and v
        kv = sh.batch * inner(spec) * sh.act
        at = next(i for i, o in enumerate(att) if o.name.startswith("mask."))
        att.insert(at, memory("self.cache_cat", 2 * kv * keys, 2 * kv * keys, "cache_utils.py DynamicLayer.update "
                              "(torch.cat)", saves=False, kernels=2, grad=False))
    if first:
        at = next(i for i, o in enumerate(att) if o.name.startswith("mask."))
        att = att[:at] + relative_bias(spec, sh, sh.seq, keys, True) + att[at:]
    cross = attention_sublayer(spec, sh, "cross", enc_seq, p, kv_rows=sh.batch * enc_seq, kv_cached=bool(past))
    if first:
        at = next(i for i, o in enumerate(cross) if o.kind == "attention")
        cross.insert(at, memory("cross.zero_bias", 0, spec.heads * sh.seq * enc_seq * sh.act,
                                f"{SRC}:335-342 torch.zeros position_bias", saves=False, grad=False))
    ops = att + cross + ff_sublayer(spec, sh, p)
    return weight_casts("weight_casts", ops, sh) + ops


# --- around the blocks --------------------------------------------------------------------------------------------
def stack_input(spec, sh: Shape, p: float) -> list[Op]:
    """A stack's embed_tokens gather (the shared table, its dtype the weights') and dropout (T5Stack.forward :683,
    :727).
    The gather's backward is the table's embedding_dense_backward (encoder_decoder_backward_extra)."""
    T, h, w = sh.tokens, spec.hidden, sh.weight
    ops = [memory("embed", T * h * w + T * INDEX, T * h * w, f"{SRC}:683 embed_tokens (gather)", "embed",
                  saves=False, grad=False)]
    return ops + _drop("embed_dropout", T * h, w, p, "embed")


def stack_output(spec, sh: Shape, p: float) -> list[Op]:
    """A stack's final_layer_norm and dropout (T5Stack.forward :746-747), in the norm's output dtype (the weights')."""
    T = sh.tokens
    return t5_norm(spec, "final_norm", T, sh, "final") + _drop("final_dropout", T * spec.hidden, sh.weight, p, "final")


def head_forward(spec, sh: Shape, loss: bool) -> list[Op]:
    """The decoder output's d_model**-0.5 rescale (T5 v1.0: :1047-1048), lm_head over every decoder position
    (:1050, no logits_to_keep) with its autocast casts (the head is the shared table: one weight cast) and, `loss`,
    _shift_right's decoder ids from the labels (:622-641: new_zeros, the shifted copy, the start token, the -100
    test and masked_fill_) and CrossEntropyLoss (:1054-1057; under autocast its fp32 upcast, loss.lm_loss)."""
    T, h, V, w = sh.tokens, spec.hidden, spec.vocab, sh.weight
    ops = []
    if spec.encdec.scale_decoder_outputs:
        ops.append(memory("decoder_out_scale", T * h * w, T * h * w, f"{SRC}:1048 * model_dim**-0.5", "final",
                          saves=False))
    ops += autocast_inputs("lm_head_in", T, h, 1, sh, "final")
    g = gemm("lm_head", T, V, h, sh, f"{SRC}:1050 lm_head")
    ops += weight_casts("head.weight_casts", [g], sh) + [g]
    if not loss:
        return ops
    ids = T * INDEX
    shift = memory("shift_right", 4 * ids, 5 * ids, f"{SRC}:622-641 _shift_right", saves=False, kernels=6, grad=False)
    return [shift] + ops + lm_loss(T, T * V, sh) + [loss_scale()]


def encoder_decoder_backward_extra(spec, enc: Shape, dec: Shape) -> list[Op]:
    """What only the backward runs, once per step: loss.backward()'s seed and nll_loss's zeroed gradient
    (loss.lm_loss_backward_extra); the shared table's three gradients (both stacks' gathers and the tied lm_head: two
    embedding_dense_backward and their two adds into the table's gradient, autograd InputBuffer::add); each stack's
    relative bias table's embedding_dense_backward over its (q, k) pairs; and the bias's gradients summed across the
    stack's blocks (the bias is one tensor every block's mask reads: blocks - 1 adds of (1, heads, q, k) per stack).
    The efficient kernel's bias gradient is batch-sized, summed over the broadcast batch (per block, here too)."""
    h, V, H = spec.hidden, spec.vocab, spec.heads
    seed = memory("loss.seed", 0, FP32, "autograd _make_grads ones_like", saves=False)
    ops = [seed, *lm_loss_backward_extra(dec.tokens * V, dec)]
    ops += embedding_grad("embed.decoder", V, dec.tokens, h, dec) + embedding_grad("embed.encoder", V, enc.tokens, h,
                                                                                   enc)
    x = V * h * enc.grad
    ops.append(memory("embed.tied_grad_sum", 2 * 2 * x, 2 * x, "autograd InputBuffer::add (shared table)",
                      saves=False, kernels=2))
    for sh, blocks, decoder in ((enc, spec.layers, False), (dec, spec.encdec.decoder_layers, True)):
        P = H * sh.seq * sh.seq
        ops += embedding_grad("bias.decoder" if decoder else "bias.encoder", spec.encdec.relative_buckets,
                              sh.seq * sh.seq, H, sh)
        ops.append(memory("bias.grad_sum", 2 * P * sh.weight * (blocks - 1), P * sh.weight * (blocks - 1),
                          "autograd InputBuffer::add (the shared bias)", saves=False, kernels=blocks - 1))
        ops.append(memory("bias.grad_batch_sum", sh.batch * P * sh.act * blocks, P * sh.act * blocks,
                          "efficient attention's grad_bias summed over the broadcast batch", saves=False,
                          kernels=blocks, **REDUCE))
    return ops


def block_grad_sums(spec, sh: Shape, decoder: bool, enc_rows: float = 0.0) -> list[Op]:
    """Backward-only kernels of one block: autograd sums the gradients of a tensor read k times with k - 1 adds
    (torch/csrc/autograd/input_buffer.cpp InputBuffer::add): the residual stream read by each sublayer's norm and its
    residual add (1 per sublayer), the normalised input read by q, k and v (2; the cross-attention's by q alone),
    the FF's read by wi_0 and wi_1 (1, gated); in the decoder the encoder's output read by the block's cross k and v
    (2 adds over the encoder's rows)."""
    x = sh.tokens * spec.hidden
    n = (3 if decoder else 2) + 2 + (1 if spec.gated_mlp else 0)
    r = sh.residual
    ops = [memory("grad_accumulate", 2 * x * r * n, x * r * n, "autograd InputBuffer::add", saves=False, kernels=n)]
    if decoder:
        e = enc_rows * spec.hidden * sh.weight
        ops.append(memory("grad_accumulate.encoder_out", 2 * 2 * e, 2 * e, "autograd InputBuffer::add (encoder "
                          "output)", saves=False, kernels=2))
    return ops
