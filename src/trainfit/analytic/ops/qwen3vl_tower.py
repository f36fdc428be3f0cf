"""Qwen3-VL's image encoder as op lists (spec.vision family qwen3_vl, ops/vision_tower.py dispatches here): the
kernels transformers' SDPA code launches on CUDA over one micro-batch's n patch rows, forward (backward: ops.backward
of it, plus block_grad_accumulations), and the deepstack features added into the language model's first layers.

Sources, transformers 5.x in the venv, models/qwen3_vl/modeling_qwen3_vl.py:
  Qwen3VLVisionPatchEmbed :91-108 (Conv3d, kernel = stride, with a bias; input `.to(dtype=target_dtype)` :107), the
  position table resampled per image :695-696 (pos_embed(interp_indices) x interp_weights summed over the 4 bilinear
  taps, cast to the stream's dtype, added; the indices and weights are the batch's precomputed `image_interp_*`),
  Qwen3VLVisionRotaryEmbedding.forward :152-168 (the axial angles, cos/sin, recomposed by two cats each),
  Qwen3VLVisionBlock :328-355 (nn.LayerNorm :331-332; Qwen3VLVisionAttention :259-325: fused qkv with bias :268-270
  reshaped, permuted and unbound, apply_rotary_pos_emb_vision :194-205 in fp32 (the code of Qwen2.5-VL's, whose
  ops vision_tower.py lists), SDPA per image over cu_seqlens :302-321 then torch.cat, proj :324; Qwen3VLVisionMLP
  :78-88 linear_fc1, gelu_pytorch_tanh, linear_fc2, biases), Qwen3VLVisionPatchMerger :171-184 (LayerNorm over the
  hidden width, or over hidden x merge^2 with use_postshuffle_norm (the deepstack mergers), linear_fc1, exact GELU,
  linear_fc2), the deepstack mergers after blocks deepstack_visual_indexes :711-715, get_image_features :1033-1043
  (split per image), Qwen3VLModel.forward :1182-1186 (cat, cast, placeholder scatter) and :1218 (each deepstack
  level's cat), Qwen3VLTextModel._deepstack_process :841-850 called after decoder layers 0..k-1 :827-832.
Checked against the trace's kernels by tests/analytic/test_tower_ops_vs_trace.py: a block as a 3-block less a
2-block tower, one deepstack level as a tower with one less a tower without, and the tower's ends."""
from __future__ import annotations

from dataclasses import replace

from ...spec import ModelSpec
from ..activations import FP32, INDEX
from .activation import one_kernel
from .cast import autocast_inputs, weight_casts
from .norm import fused_norm
from .op import BROADCAST, UPCAST, Op, Shape, bwd_kernel, gemm, grad_cast, memory, no_kernel
from .residual import residual

QWEN3 = "modeling_qwen3_vl.py"
TAPS = 4  # bilinear: 4 table rows per patch (vision_utils.py get_vision_interpolation_indices_and_weights)


def layer_norm(spec: ModelSpec, name: str, rows: float, width: float, sh: Shape, src: str) -> list[Op]:
    """nn.LayerNorm (aten native_layer_norm, ops/norm.py fused_norm) over the stream: under autocast (layer_norm is on
    its fp32 list) the 16-bit stream is first cast to fp32 and the norm writes fp32 (its backward casts the gradient
    back); else in the stream's dtype."""
    s = sh.residual
    x = rows * width
    out = FP32 if sh.autocast else s
    ops = [memory(f"{name}.to_fp32", x * s, x * out, f"{src} (torch.autocast fp32 list)", saves=False, **UPCAST)] \
        if out != s else []
    return ops + fused_norm(replace(spec, norm="layernorm"), name, rows, width, sh, "", out, out)


def _linear_in(name: str, rows: float, width: float, sh: Shape) -> list[Op]:
    """The linear's input cast under autocast: the fp32 LayerNorm output to the compute dtype (ops/cast.py)."""
    return autocast_inputs(name, rows, width, 1, sh, "")


def block(spec: ModelSpec, sh: Shape, chunks: int) -> list[Op]:
    """One Qwen3VLVisionBlock's forward kernels over the n patch rows, attending over each of `chunks` images."""
    from .vision_tower import _attention, _rotary

    t = spec.vision
    n, h, i, a = sh.tokens, t.hidden, t.intermediate, sh.act
    x = n * h * a
    ops = layer_norm(spec, "vnorm1", n, h, sh, f"{QWEN3}:349 norm1")
    ops += _linear_in("vqkv_in", n, h, sh)
    ops.append(gemm("vqkv", n, 3 * h, h, sh, f"{QWEN3}:269 qkv", bias=True))
    # reshape + permute + unbind are views; unbind's backward stacks the three gradients and the permute's reshape
    # copies them back to the projection's layout (derivatives.yaml unbind: stack; view of a permuted tensor)
    ops.append(memory("vqkv_unbind", 0, 0, f"{QWEN3}:269 unbind", saves=False, kernels=0, bwd_ops=(
        bwd_kernel("vqkv_unbind.stack", 3 * x, 3 * x), bwd_kernel("vqkv_unbind.layout", 3 * x, 3 * x, "transpose"))))
    ops += _rotary(n, h, t.heads, sh)  # :272 apply_rotary_pos_emb_vision (:194-205)
    # torch.split over cu_seqlens (views); its backward concatenates each of q's, k's and v's chunk gradients
    ops.append(memory("vattn_split", 0, 0, f"{QWEN3}:303-305 torch.split", saves=False, kernels=0,
                      bwd_ops=tuple(bwd_kernel(f"v{c}_split.backward", x, x) for c in "qkv")))
    ops.append(memory("vattn_lengths", 0, 0, f"{QWEN3}:302 cu_seqlens[1:] - cu_seqlens[:-1]", saves=False,
                      grad=False))
    ops += _attention(spec, sh, chunks, "vattention")
    ops.append(memory("vattn_cat", x, x, f"{QWEN3}:321 torch.cat", saves=False, grad=False))
    ops.append(gemm("vproj", n, h, h, sh, f"{QWEN3}:324 proj", bias=True))
    ops += residual("vattn", n * h, 0.0, sh, "", f"{QWEN3}:348 residual add")
    ops += layer_norm(spec, "vnorm2", n, h, sh, f"{QWEN3}:354 norm2")
    ops += _linear_in("vfc1_in", n, h, sh)
    ops.append(gemm("vfc1", n, i, h, sh, f"{QWEN3}:83 linear_fc1", bias=True))
    ops += one_kernel("gelu_tanh", "vact", n * i, sh, "")  # gelu_pytorch_tanh: aten gelu(approximate="tanh")
    ops.append(gemm("vfc2", n, h, i, sh, f"{QWEN3}:84 linear_fc2", bias=True))
    ops += residual("vmlp", n * h, 0.0, sh, "", f"{QWEN3}:354 residual add")
    return weight_casts("vweight_casts", ops, sh) + ops


def block_grad_accumulations(spec: ModelSpec, sh: Shape) -> list[Op]:
    """Backward-only adds of one block (autograd InputBuffer::add): the stream read by each norm and its residual add
    (2, the stream's dtype); each norm's output feeds one linear (qkv, linear_fc1): none there."""
    s, x = sh.residual, sh.tokens * spec.vision.hidden
    return [memory("vgrad_accumulate", 2 * x * s * 2, x * s * 2, "autograd InputBuffer::add", saves=False, kernels=2)]


def _merger(spec: ModelSpec, sh: Shape, name: str, postshuffle: bool) -> list[Op]:
    """A Qwen3VLPatchMerger (:181-184) over the n rows: its LayerNorm (over hidden, or over hidden x merge^2 on the
    merged rows with use_postshuffle_norm), the view to merged rows, linear_fc1 (m, m), exact GELU (nn.GELU),
    linear_fc2 to the language model's width."""
    t = spec.vision
    m, merged = t.hidden * t.merge ** 2, sh.tokens / t.merge ** 2
    rows, width = (merged, m) if postshuffle else (sh.tokens, t.hidden)
    ops = layer_norm(spec, f"{name}_norm", rows, width, sh, f"{QWEN3}:182 norm")
    ops += _linear_in(f"{name}_in", merged, m, sh)
    ops.append(gemm(f"{name}_fc1", merged, m, m, sh, f"{QWEN3}:183 linear_fc1", bias=True))
    ops += one_kernel("gelu", f"{name}_act", merged * m, sh, "")
    ops.append(gemm(f"{name}_fc2", merged, t.out_hidden, m, sh, f"{QWEN3}:183 linear_fc2", bias=True))
    return ops


def _features_cat(name: str, f: float, src: str) -> Op:
    """torch.cat of the per-image split of the features (:1039, :1040-1042 split, views; concatenated again): one
    copy; its backward the split's: the gradients concatenated (one copy)."""
    return memory(f"{name}.cat", f, f, src, saves=False, bwd_ops=(bwd_kernel(f"{name}.split_backward", f, f),))


def deepstack_level(spec: ModelSpec, sh: Shape, lm: Shape) -> list[Op]:
    """One deepstack level: the merger with postshuffle norm on the stream after its block (:711-715), the stream's
    gradient summed with the next reader's (one add), the level's features concatenated (:1218), and in the language
    model after its decoder layer (:827-832, _deepstack_process :841-850): the features cast to the hidden states'
    dtype, hidden_states.clone(), hidden_states[mask, :] (index) + features, written back (index_put_). Backward
    (derivatives.yaml): index_put_'s — the values' gradient grad[mask] (index) and the stream's grad with the masked
    rows zeroed (zeros, index_put) —, the index's (new_zeros, index_put with accumulate), the two stream gradients
    summed, the cast back."""
    t = spec.vision
    s, a, r = sh.residual, sh.act, lm.residual
    x = sh.tokens * t.hidden * s
    merged = sh.tokens / t.merge ** 2
    f, e, mask = merged * t.out_hidden, lm.tokens * t.out_hidden, lm.tokens  # (the mask: bool, a byte a token)
    ops = _merger(spec, sh, "vdeepstack", True)
    ops.append(memory("vdeepstack.stream_grad", 0, 0, "autograd InputBuffer::add", saves=False, kernels=0,
                      bwd_ops=(bwd_kernel("vdeepstack.grad_accumulate", 2 * x, x),)))
    ops.append(_features_cat("vdeepstack_features", f * a, f"{QWEN3}:1218 torch.cat"))
    if a != r:
        ops.append(memory("vdeepstack_features.cast", f * a, f * r, f"{QWEN3}:845 visual_embeds.to", saves=False,
                          **(UPCAST if r > a else {})))
    ops.append(memory("vdeepstack.clone", e * r, e * r, f"{QWEN3}:846 clone", saves=False,
                      bwd_ops=(no_kernel("vdeepstack.clone"),)))
    ops.append(memory("vdeepstack.index", e * r + mask, f * r, f"{QWEN3}:847 hidden_states[mask, :]", saves=False,
                      bwd_ops=(bwd_kernel("vdeepstack.index.new_zeros", 0, e * r),
                               bwd_kernel("vdeepstack.index.index_put", e * r + mask + f * r, e * r, "strided"))))
    ops.append(memory("vdeepstack.add", 2 * f * r, f * r, f"{QWEN3}:847 + visual_embeds", saves=False,
                      bwd_ops=(no_kernel("vdeepstack.add"),)))
    ops.append(memory("vdeepstack.index_put", e * r + mask + f * r, e * r, f"{QWEN3}:848 hidden_states[mask, :] =",
                      saves=False, access="strided", bwd_ops=(
                          bwd_kernel("vdeepstack.index_put.values", e * r + mask, f * r, "strided"),
                          bwd_kernel("vdeepstack.index_put.zeros", 0, f * r),
                          bwd_kernel("vdeepstack.index_put.masked", e * r + mask + f * r, e * r, "strided"),
                          bwd_kernel("vdeepstack.grad_sum", 2 * e * r, e * r))))
    return weight_casts("vweight_casts_deepstack", ops, sh) + ops


def ends(spec: ModelSpec, sh: Shape, lm: Shape) -> list[Op]:
    """Qwen3-VL's tower outside its blocks, deepstack levels apart (ends_with_deepstack): the pixels' cast, the
    patch Conv3d, the resampled position rows, the 2-D rotary tables, the merger, the features' cat and the scatter
    into the embeddings."""
    from .vision_tower import _patch_embed, _pixel_ops, _scatter

    t = spec.vision
    n, h, a, s, w = sh.tokens, t.hidden, sh.act, sh.residual, sh.weight
    ops = _pixel_ops(spec, sh, f"{QWEN3}:1033 pixel_values.type / :107 .to(dtype)")
    ops.append(_patch_embed(spec, sh, True, f"{QWEN3}:100, :107 patch_embed Conv3d"))
    # pos_embed(interp_indices) (:695): TAPS table rows a patch gathered (the table's dtype w); times the fp32
    # weights (type promotion: fp32), summed over the taps, cast to the stream's dtype, added (:696). Backward: the
    # add passes the gradient on, the cast back, the sum's an expand, the product's grad x weights (then cast to the
    # table's dtype where 16-bit), the embedding's backward into the table. NB: that backward is one kernel here;
    # CUDA's embedding_dense_backward sorts the indices first (a few launches more: optimistic)
    g, rows, table = n * TAPS * h, t.position_embeddings * h * w, n * TAPS * INDEX
    ops.append(memory("vpos_gather", table + rows, g * w, f"{QWEN3}:695 pos_embed(interp_indices)", saves=False,
                      bwd_ops=(bwd_kernel("vpos_gather.backward", g * w + table, rows, "strided"),)))
    ops.append(memory("vpos_weights", g * w + n * TAPS * FP32, g * FP32, f"{QWEN3}:695 x interp_weights",
                      saves=False, bwd_ops=(
                          bwd_kernel("vpos_weights.backward", n * h * FP32 + n * TAPS * FP32, g * FP32, "strided"),
                          *grad_cast("vpos_weights.grad_cast", g, FP32, w)), **BROADCAST))
    ops.append(memory("vpos_sum", g * FP32, n * h * FP32, f"{QWEN3}:695 .sum(1)", saves=False, access="reduce",
                      bwd_ops=(no_kernel("vpos_sum"),)))
    if s != FP32:
        ops.append(memory("vpos_embeds.to_dtype", n * h * FP32, n * h * s, f"{QWEN3}:696 .to(hidden_states.dtype)",
                          saves=False, bwd_access="upcast"))
    ops.append(memory("vpos_add", n * h * (a + s), n * h * s, f"{QWEN3}:696 + pos_embeds", saves=False,
                      bwd_ops=(no_kernel("vpos_add"),)))
    # the rotary tables (:152-168), fp32, no gradient: the (n, 2) positions cast to fp32, e = n x head_dim / 2
    # angles: the freqs product with the head_dim / 4 inverse frequencies (writes 4e), cos, its scaling, sin, its
    # scaling (reads 4e, writes 4e each), each table's h/w cat (reads 4e, writes 4e) and full-width cat of the h/w
    # half twice (reads 8e, writes 8e)
    d = h // t.heads
    e = n * d / 2
    ops.append(memory("vrotary_tables.to_fp32", 2 * n * INDEX, 2 * n * FP32, f"{QWEN3}:154 position_ids.float()",
                      saves=False, grad=False, **UPCAST))
    ops.append(memory("vrotary_tables", 2 * n * FP32 + d / 4 * FP32 + 40 * e, 44 * e,
                      f"{QWEN3}:152-168 rotary tables", saves=False, grad=False, kernels=9))
    ops += _merger(spec, sh, "vmerger", False)
    f = n / t.merge ** 2 * t.out_hidden
    ops.append(_features_cat("image_features", f * a, f"{QWEN3}:1182 torch.cat"))
    # NB: the split sizes (:1038 grid prod // merge^2) and get_placeholder_mask's video mask and count checks
    # (:1045-1084: a few kernels over the token ids) are left out, the image mask listed once (_scatter): a few
    # small launches optimistic
    ops += _scatter(spec, sh, lm, n / t.merge ** 2, f"{QWEN3}:1182-1186 masked_scatter")
    return weight_casts("vweight_casts_ends", ops, sh) + ops


def ends_with_deepstack(spec: ModelSpec, sh: Shape, lm: Shape) -> list[Op]:
    """The ends and each deepstack level (deepstack_visual_indexes): once a micro-batch, none of them inside a
    checkpointed block (the language model's adds run between its decoder layers)."""
    return ends(spec, sh, lm) + len(spec.vision.deepstack_blocks) * deepstack_level(spec, sh, lm)
