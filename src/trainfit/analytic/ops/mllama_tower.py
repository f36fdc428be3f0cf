"""Llama 3.2 Vision's (mllama; spec.vision projector "cross") image encoder and cross-attention layers as op lists:
the kernels transformers' SDPA code launches on CUDA over one micro-batch, forward (backward: ops.backward of it).
ops/vision_tower.py hands the tower here (tower_lists), analytic/tower_time.py times it and the cross-attention
layers (cross_layer_lists) that replace a self-attention layer at their places (text_config cross_attention_layers).

The tower runs every image as max_tiles tiles of (tile / patch)^2 patches and a class token, padded to a multiple of
8 rows (analytic/mllama.py padded_rows): n = images x tiles x padded rows through `depth` local and `global_layers`
tanh-gated encoder layers, each image's tiles attending together under the additive aspect-ratio mask (images, 1,
L, L), L = tiles x padded rows; the intermediate layers' outputs stacked and concatenated to the last one's, the
projector over the m = images x tiles x tile tokens unpadded rows. Unsplit by tensor, sequence or context
parallelism (as vision_tower.py's towers).

A cross-attention layer (MllamaCrossAttentionDecoderLayer) is the self-attention layer's list (ops/layer.py) with its
attention sub-block replaced: q_proj over the text, k/v_proj over the vision tokens (the cross_attention_states),
the q/k RMSNorms, k and v repeated to every head (a mask is given: transformers' SDPA path repeats them), the masked
SDPA (the memory-efficient kernel: a float mask rules out flash), o_proj, and the two tanh gates and the
full-text-row mask on the branches. In a decode step its K and V are the cache's (projected once in the prefill).

Sources, transformers 5.x in the venv, models/mllama/modeling_mllama.py: _prepare_cross_attention_mask :53-78,
_prepare_aspect_ratio_attention_mask :93-119, MllamaPrecomputedAspectRatioEmbedding.forward :131-140,
MllamaPrecomputedPositionEmbedding.forward :162-176, MllamaVisionMLP :186-190, MllamaVisionAttention.forward
:252-287, MllamaVisionEncoderLayer.forward :308-330, MllamaTextRMSNorm.forward :390-395, MllamaTextCrossAttention
.forward :423-470, MllamaCrossAttentionDecoderLayer.forward :690-720, apply_class_embedding :868-872,
MllamaVisionModel.forward :926-1013, MllamaModel.forward :1356-1373 (the projector, the masks).
Checked against the trace's kernels by tests/analytic/test_tower_ops_vs_trace.py: an encoder layer (local, global)
as a tower with one more less the base tower, the tower's ends, a cross-attention layer as a language model with one
more less the base one. NB: the trace counts a tile-embedding lookup as reading its whole table, the op list the
gathered rows (the ends' other bytes +3.4 % to +7.2 % in the trace)."""
from __future__ import annotations

from dataclasses import replace

from ...spec import ModelSpec
from ..activations import FP32, INDEX
from ..mllama import padded_rows, vision_tokens
from .activation import one_kernel
from .attention import eager_kernels
from .cast import autocast_inputs, weight_casts
from .norm import hf_rms_norm
from .op import BROADCAST, DOWNCAST, Op, Shape, attention_dtype, bwd_kernel, gemm, grad_cast, memory
from .residual import residual

MLLAMA = "modeling_mllama.py"


def tiled(spec: ModelSpec) -> bool:
    """Llama 3.2 Vision's tiled tower and cross-attention layers (VisionTowerSpec.projector "cross")."""
    return spec.vision is not None and spec.vision.projector == "cross"


def _sizes(spec: ModelSpec, setup) -> tuple[int, int, int, int]:
    """(images B, padded rows n, unpadded rows m, one image's attention length L) of one micro-batch."""
    t = spec.vision
    images = setup.batch * (setup.images or 0)
    return images, images * t.max_tiles * padded_rows(spec), images * t.max_tiles * t.tile_tokens, \
        t.max_tiles * padded_rows(spec)


def tower_shape(spec: ModelSpec, setup, lm: Shape) -> Shape:
    """The language model's Shape turned to the tower's: tokens = the padded rows (one sequence, unsplit), the
    language model's stream dtype as the tower's (the patch conv's output plus the weights' fp32 tile embeddings
    under autocast: fp32; else the compute dtype), the memory-efficient kernel for its masked SDPA (HF's eager
    attention stays eager)."""
    _, n, _, _ = _sizes(spec, setup)
    kernel = "eager" if lm.attention == "eager" and lm.hf_eager else "efficient"
    return replace(lm, batch=1, seq=n, cp=1, tp=1, sp=False, eager_mask=0, float8=False, decode=False,
                   attention=kernel, masked=False)


def _gate(name: str, x: float, src: str, sh: Shape) -> list[Op]:
    """gate.tanh() (a 1-element fp32 or 16-bit parameter) times the branch: the tanh, then the product, which the
    1-element gate promotes to the weights' dtype (a dimensioned tensor takes part in type promotion: fp32 under
    autocast); backward: grad·tanh for the branch (cast back to the branch's dtype where promoted: grad_cast),
    grad·branch summed for the gate, tanh's."""
    a, out = sh.act, max(sh.act, sh.weight)
    return [memory(f"{name}.tanh", sh.weight, sh.weight, src),
            memory(f"{name}.mul", x * a, x * out, src, bwd_ops=(
                bwd_kernel(f"{name}.mul.backward", x * out, x * out), *grad_cast(f"{name}.grad_cast", x, out, a),
                bwd_kernel(f"{name}.mul.backward_gate", x * (out + a), x * out),
                bwd_kernel(f"{name}.mul.backward_gate_sum", x * out, out, "reduce")), **BROADCAST)]


def _layer_norm(spec: ModelSpec, name: str, rows: float, sh: Shape, src: str) -> list[Op]:
    """nn.LayerNorm over the tower's stream (ops/qwen3vl_tower.py layer_norm: fp32 under autocast)."""
    from .qwen3vl_tower import layer_norm

    return layer_norm(spec, name, rows, spec.vision.hidden, sh, src)


def encoder_layer(spec: ModelSpec, sh: Shape, images: int, gated: bool) -> list[Op]:
    """One MllamaVisionEncoderLayer's forward kernels over the n padded rows (:308-330): LayerNorm, q/k/v without
    bias, SDPA over each image's L rows under the aspect-ratio mask, o_proj, [the attention gate,] the residual add,
    LayerNorm, fc1, GELU, fc2 (biases), [the MLP gate,] the residual add."""
    t = spec.vision
    n, h, i = sh.tokens, t.hidden, t.intermediate
    length = n / images
    ops = _layer_norm(spec, "vnorm1", n, sh, f"{MLLAMA}:320 input_layernorm")
    ops += autocast_inputs("vqkv_in", n, h, 3, sh, "")
    for name in ("vq", "vk", "vv"):
        ops.append(gemm(name, n, h, h, sh, f"{MLLAMA}:258-260 q/k/v_proj"))
    ops += _attention(spec, sh, images, length)
    ops.append(gemm("vo", n, h, h, sh, f"{MLLAMA}:286 o_proj"))
    if gated:
        ops += _gate("vgate_attn", n * h, f"{MLLAMA}:323 gate_attn.tanh() *", sh)
    branch = replace(sh, act=max(sh.act, sh.weight)) if gated else sh
    ops += residual("vattn", n * h, 0.0, branch, "", f"{MLLAMA}:324 residual add")
    ops += _layer_norm(spec, "vnorm2", n, sh, f"{MLLAMA}:328 post_attention_layernorm")
    ops += autocast_inputs("vfc1_in", n, h, 1, sh, "")
    ops.append(gemm("vfc1", n, i, h, sh, f"{MLLAMA}:187 fc1", bias=True))
    ops += one_kernel("gelu", "vact", n * i, sh, "")  # hidden_act "gelu": aten gelu (exact)
    ops.append(gemm("vfc2", n, h, i, sh, f"{MLLAMA}:189 fc2", bias=True))
    if gated:
        ops += _gate("vgate_mlp", n * h, f"{MLLAMA}:330 gate_ffn.tanh() *", sh)
    ops += residual("vmlp", n * h, 0.0, branch, "", f"{MLLAMA}:331 residual add")
    return weight_casts("vweight_casts", ops, sh) + ops


def _attention(spec: ModelSpec, sh: Shape, images: int, length: float) -> list[Op]:
    """One SDPA call over the images (batch x heads), every row attending over its image's L rows, the additive
    (images, 1, L, L) mask read per head. NB: under eager attention (eager_attention_forward) the matmuls' operand
    and output copies are not listed, and its score-sized kernels (scaling, mask add, softmax and its casts) are
    timed inside the attention op (roofline.unfused_attention), not compared with the trace's kernels."""
    t = spec.vision
    d = t.hidden // t.heads
    fwd_k, bwd_k = eager_kernels(sh.act, sh.act) if sh.attention == "eager" else (1, -1)  # (the mask: sh.act)
    return [Op("vattention", "attention", attention_dtype(sh), length, length, d, images * t.heads, causal=False,
               kernel=sh.attention, kernels=fwd_k, bwd_kernels=bwd_k, mask=sh.act if sh.attention == "eager" else 0,
               source=f"{MLLAMA}:276 SDPA with the aspect-ratio mask")]


def block_grad_accumulations(spec: ModelSpec, sh: Shape) -> list[Op]:
    """Backward-only adds of one encoder layer (autograd InputBuffer::add): the stream read by each norm and its
    residual add (2, the stream's dtype); the first norm's output read by q, k and v (2, the norm output's dtype:
    fp32 under autocast, where each linear casts it itself, else the stream's)."""
    x, s = sh.tokens * spec.vision.hidden, sh.residual
    return [memory("vgrad_accumulate", 2 * x * s * 2, x * s * 2, "autograd InputBuffer::add", saves=False, kernels=2),
            memory("vgrad_accumulate_norm", 2 * x * s * 2, x * s * 2, "autograd InputBuffer::add", saves=False,
                   kernels=2)]


def _tile_embedding(name: str, images: int, rows: float, table: float, sh: Shape, src: str,
                    in_bytes: int | None = None) -> list[Op]:
    """An nn.Embedding of the aspect-ratio ids (one row of `table` elements per image, the weights' dtype), times a
    tanh gate (1 - tanh for the position table's own part), added to the stream's `rows` x hidden elements
    (broadcast over the rows a table row covers); backward: the add's gradient summed to the table's shape, the
    gate product's, the embedding's dense backward (its zeroing and index_put)."""
    w, s = sh.weight, sh.residual
    r = s if in_bytes is None else in_bytes
    e = images * table
    x = rows
    return [memory(f"{name}.lookup", e * w + images * INDEX, e * w, src, saves=False, bwd_ops=(
                bwd_kernel(f"{name}.lookup.grad_zero", 0, e * w),
                bwd_kernel(f"{name}.lookup.index_put", e * w + images * INDEX, e * w, "strided"))),
            memory(f"{name}.gate_tanh", w, w, src),
            memory(f"{name}.gated", e * w, e * w, src, bwd_ops=(
                bwd_kernel(f"{name}.gated.backward", e * w, e * w),
                bwd_kernel(f"{name}.gated.backward_gate", 2 * e * w, w, "reduce"))),
            memory(f"{name}.add", x * r + e * w, x * s, src, saves=False, bwd_ops=(
                bwd_kernel(f"{name}.add.grad_sum", x * s, e * w, "reduce"),
                *grad_cast(f"{name}.add.grad_cast", x, s, r)), **BROADCAST)]


def ends_forward(spec: ModelSpec, sh: Shape, lm: Shape, images: int) -> list[Op]:
    """The tower's kernels outside its encoder layers, the projector and the language model's cross-attention masks
    (made once a step)."""
    t = spec.vision
    h, a, s, w = t.hidden, sh.act, sh.residual, sh.weight
    tiles, rows0 = images * t.max_tiles, t.tile_tokens
    patches = tiles * (rows0 - 1)
    n, m, length = sh.tokens, tiles * rows0, t.max_tiles * padded_rows(spec)
    ops: list[Op] = []
    if a != FP32:  # pixel_values.to(target_dtype), or autocast's conv input cast
        x = patches * t.patch_values
        ops.append(memory("pixels_cast", x * FP32, x * a, f"{MLLAMA}:930 pixel_values.to / autocast", saves=False,
                          grad=False, **DOWNCAST))
    # the patch Conv2d (kernel = stride, no bias): one GEMM of the patch rows (cuDNN's implicit GEMM)
    ops.append(gemm("patch_embed", patches, h, t.patch_values, sh, f"{MLLAMA}:930 patch_embedding"))
    ops += _tile_embedding("vpre_tile", images, patches * h, t.max_tiles * h, sh,
                           f"{MLLAMA}:131-140 pre_tile_positional_embedding", a)
    # class token: the (1, 1, h) parameter expanded over the tiles and concatenated before the patches; backward:
    # the cat's slices are views, the expand's gradient a sum over the tiles
    ops.append(memory("vclass_cat", patches * h * s + tiles * h * w, m * h * s, f"{MLLAMA}:870-871 torch.cat",
                      saves=False, bwd_ops=(bwd_kernel("vclass_cat.expand_backward", tiles * h * s, h * w,
                                                       "reduce"),)))
    # gated_positional_embedding: (1 - tanh(gate)) x the (rows0, h) table added over every tile, then the tile table
    # (images, tiles x rows0 x h) gated by tanh(gate) and added
    tab = rows0 * h
    ops += [memory("vposition.one_minus_tanh", 2 * w, 2 * w, f"{MLLAMA}:164 1 - gate.tanh()", kernels=2),
            memory("vposition.gated", tab * w, tab * w, f"{MLLAMA}:164 (1 - tanh) * embedding", bwd_ops=(
                bwd_kernel("vposition.gated.backward", tab * w, tab * w),
                bwd_kernel("vposition.gated.backward_gate", 2 * tab * w, w, "reduce"))),
            memory("vposition.add", m * h * s + tab * w, m * h * s, f"{MLLAMA}:165 + positions", saves=False,
                   bwd_ops=(bwd_kernel("vposition.add.grad_sum", m * h * s, tab * w, "reduce"),), **BROADCAST)]
    ops += _tile_embedding("vtile_position", images, m * h, t.max_tiles * tab, sh,
                           f"{MLLAMA}:168-174 tile_embedding")
    ops += _layer_norm(spec, "vln_pre", m, sh, f"{MLLAMA}:946 layernorm_pre")
    # F.pad to a multiple of 8 rows (constant_pad_nd: a fill and the copy); its backward a narrowing copy
    ops.append(memory("vpad", m * h * s, n * h * s, f"{MLLAMA}:950-952 F.pad", saves=False, kernels=2, bwd_ops=(
        bwd_kernel("vpad.backward", n * h * s, m * h * s),)))
    # the aspect-ratio mask (no gradient), in the weights' dtype (`dtype=self.dtype`): the (images, tiles) mask cast,
    # repeated over the rows, its padded rows zeroed, inverted (1 - mask); an outer product (a k = 1 matmul: under
    # autocast its operands cast to the compute dtype, which it writes) and the scaling by finfo.min
    r, sq = images * length, images * length ** 2
    src = f"{MLLAMA}:100-117 _prepare_aspect_ratio_attention_mask"
    ops += [memory("vmask.to_dtype", tiles * INDEX, tiles * w, src, saves=False, grad=False),
            memory("vmask_prepare", r * w + tiles * w, 2 * r * w + images * (length - t.max_tiles * rows0) * w,
                   src, saves=False, grad=False, kernels=3)]
    if sh.autocast and a != w:
        ops.append(memory("vmask_outer.autocast", 2 * r * w, 2 * r * a, src, saves=False, grad=False, kernels=2,
                          **DOWNCAST))
    ops += [gemm("vmask_outer", length, length, 1, sh, f"{MLLAMA}:116 mask @ mask.T", batch=images,
                 wgrad=False)._replace(grad=False),
            memory("vmask_scale", sq * a, sq * a, f"{MLLAMA}:116 * finfo.min", saves=False, grad=False)]
    return weight_casts("vweight_casts_ends", [o for o in ops if o.wgrad], sh) + ops


def ends_after(spec: ModelSpec, sh: Shape, lm: Shape, images: int) -> list[Op]:
    """Between the local and global encoders and after them: layernorm_post, the post-tile embedding, the
    intermediate layers' outputs stacked and concatenated to the last one's (unpadded), the projector; then the
    language model's cross-attention masks."""
    t = spec.vision
    h, s = t.hidden, sh.residual
    tiles, rows0 = images * t.max_tiles, t.tile_tokens
    n, m = sh.tokens, tiles * rows0
    k = len(t.intermediate_layers)
    wide = h * (1 + k)
    ops = _layer_norm(spec, "vln_post", n, sh, f"{MLLAMA}:974 layernorm_post")
    ops += _tile_embedding("vpost_tile", images, n * h, t.max_tiles * h, sh,
                           f"{MLLAMA}:980 post_tile_positional_embedding")
    # torch.stack of the intermediate outputs (n, h, k); its backward (unbind: views) adds into each layer's stream
    # gradient (the add runs in the local layers' backward, autograd's InputBuffer)
    ops.append(memory("vintermediate_stack", k * n * h * s, k * n * h * s, f"{MLLAMA}:996 torch.stack", saves=False,
                      bwd_ops=(bwd_kernel("vintermediate_stack.accumulate", 2 * k * n * h * s, k * n * h * s,
                                          "strided", kernels=k),)))
    # the padded rows sliced off (views) and the last and intermediate states concatenated; backward: each slice's
    # slice_backward (zeros, then the copy), the cat's slices are views
    ops.append(memory("vfeatures_cat", m * wide * s, m * wide * s, f"{MLLAMA}:1010 torch.cat", saves=False,
                      bwd_ops=(bwd_kernel("vfeatures_cat.slice_backward_zero", 0, n * wide * s, kernels=2),
                               bwd_kernel("vfeatures_cat.slice_backward", m * wide * s, m * wide * s, "strided",
                                          kernels=2))))
    ops += autocast_inputs("vprojector_in", m, wide, 1, sh, "")
    ops.append(gemm("vprojector", m, t.out_hidden, wide, sh, f"{MLLAMA}:1356 multi_modal_projector", bias=True))
    return weight_casts("vweight_casts_projector", ops, sh) + ops + _text_masks(spec, lm, images)


def _text_masks(spec: ModelSpec, lm: Shape, images: int) -> list[Op]:
    """_prepare_cross_attention_mask (:53-78) over the (batch, L, images, tiles) int64 mask (no gradient): its
    repeat_interleave to every vision token (v elements), 1.0 - mask (fp32, the default dtype) cast to the weights'
    dtype, its bool cast, the masked_fill to finfo.min, the full-text-row test (!=, any over the vision tokens,
    type_as: a cast) and the mask's product with it (in place)."""
    rows = lm.batch * lm.seq
    v = rows * vision_tokens(spec, _Images(lm.batch, images // max(lm.batch, 1)))
    w = lm.weight
    src = f"{MLLAMA}:53-78 _prepare_cross_attention_mask"
    ops = [memory("cross_mask_repeat", rows * images // max(lm.batch, 1) * spec.vision.max_tiles * INDEX, v * INDEX,
                  src, saves=False, grad=False),
           memory("cross_mask_invert", v * INDEX, v * FP32, src, saves=False, grad=False)]
    if w != FP32:
        ops.append(memory("cross_mask.to_dtype", v * FP32, v * w, src, saves=False, grad=False, **DOWNCAST))
    return ops + [
        memory("cross_mask_bool.to_dtype", v * w, v, src, saves=False, grad=False),
        memory("cross_mask_fill", v * (w + 1), v * w, src, saves=False, grad=False),
        memory("cross_mask_rows", v * w + v, v + rows, src, saves=False, grad=False, kernels=2),
        memory("cross_row_mask.to_dtype", rows, rows * w, src, saves=False, grad=False),
        memory("cross_mask_row_mul", v * w + rows * w, v * w, src, saves=False, grad=False, **BROADCAST)]


class _Images:
    """What vision_tokens reads of a setup (its images per sample)."""

    def __init__(self, batch: int, images: int):
        self.batch, self.images = batch, images


def tower_lists(spec: ModelSpec, setup, lm: Shape) -> list[tuple[int, list[Op], list[Op]]]:
    """(count, forward, backward) of each part of the tower in one micro-batch (ops/vision_tower.py tower_lists):
    the ends once, the local layers, the global (gated) layers; the ends' backward without the pixels' gradient."""
    from .derived import backward
    from .vision_tower import ends_backward

    t = spec.vision
    images = setup.batch * (setup.images or 0)
    sh = tower_shape(spec, setup, lm)
    ends = ends_forward(spec, sh, lm, images) + ends_after(spec, sh, lm, images)
    out = [(1, ends, ends_backward(ends))]
    for count, gated in ((t.depth, False), (t.global_layers, True)):
        if count:
            fwd = encoder_layer(spec, sh, images, gated)
            out.append((count, fwd, backward(fwd) + block_grad_accumulations(spec, sh)))
    return out


def cross_layer(spec: ModelSpec, sh: Shape, self_layer: list[Op], images: int) -> list[Op]:
    """One MllamaCrossAttentionDecoderLayer's forward kernels over the text rows (:690-720), from the self-attention
    layer's list `self_layer` (ops/layer.py layer_forward: its norms, MLP and residual adds): its attention
    sub-block (from the autocast input casts to o_proj) replaced by cross_attention, the tanh gates before the
    residual adds, the full-text-row mask on the MLP's output. `images` per sample; in a decode step (sh.decode) K
    and V are the cache's."""
    start = next(j for j, o in enumerate(self_layer) if o.name.startswith("attn_in") or o.name == "q")
    end = next(j for j, o in enumerate(self_layer) if o.name == "o") + 1
    T, h = sh.tokens, spec.hidden
    src_gate = f"{MLLAMA}:708 cross_attn_attn_gate.tanh() *"
    ops = self_layer[:start] + cross_attention(spec, sh, images) + _gate("cross_gate_attn", T * h, src_gate, sh)
    rest = self_layer[end:]
    down = next(j for j, o in enumerate(rest) if o.name == "down") + 1
    gated = replace(sh, act=max(sh.act, sh.weight))
    res_attn = next(j for j, o in enumerate(rest) if o.name.startswith("attn_residual"))
    ops += [o for o in rest[:res_attn] if not o.name.startswith("attn_")] + residual(
        "attn", T * h, 0.0, gated, "attn_out", f"{MLLAMA}:708 residual add")
    ops += rest[res_attn + 1:down]
    b = max(sh.act, sh.weight)
    rows = sh.batch * sh.seq  # the (batch, 1, L, 1) mask in the weights' dtype, broadcast over the width
    ops.append(memory("cross_row_mask", T * h * sh.act + rows * sh.weight, T * h * b,
                      f"{MLLAMA}:716 full_text_row_masked_out_mask *", saves=False, bwd_ops=(
                          bwd_kernel("cross_row_mask.backward", T * h * b + rows * sh.weight, T * h * b),
                          *grad_cast("cross_row_mask.grad_cast", T * h, b, sh.act)),
                      **BROADCAST))
    ops += _gate("cross_gate_mlp", T * h, f"{MLLAMA}:717 cross_attn_mlp_gate.tanh() *", replace(sh, act=b))
    res_mlp = next(j for j, o in enumerate(rest) if o.name.startswith("mlp_residual"))
    ops += residual("mlp", T * h, 0.0, gated, "mlp_out", f"{MLLAMA}:718 residual add") + rest[res_mlp + 1:]
    return ops


def _rms_norm(spec: ModelSpec, name: str, rows: float, d: int, sh: Shape, out: int) -> list[Op]:
    """MllamaTextRMSNorm over head_dim (:390-395): HF's eager RMSNorm kernels (ops/norm.py hf_rms_norm) over the
    projection's output; `self.weight * x.to(input_dtype)` promotes a 16-bit x to fp32 weights' dtype (`out`), so
    its backward casts x's gradient back (grad_cast)."""
    ops = hf_rms_norm(spec, name, rows, d, sh, "qk_norm", out, sh.act, zero_centred=False)
    cast = grad_cast(f"{name}.weight.grad_cast", rows * d, out, sh.act)
    return ops + ([memory(f"{name}.promotion", 0, 0, f"{MLLAMA}:395", saves=False, kernels=0, bwd_ops=cast)]
                  if cast else [])


def cross_attention(spec: ModelSpec, sh: Shape, images: int) -> list[Op]:
    """MllamaTextCrossAttention.forward (:423-470): q_proj over the T text rows (under autocast its input cast),
    q_norm; k/v_proj over the V vision rows (the 16-bit cross_attention_states: no input cast), k_norm (none in a
    decode step: the cache's K and V); k and v repeated to every head (integrations/sdpa_attention.py repeat_kv: a
    mask is given); under autocast SDPA's casts of q and k (the norms' fp32 outputs) and of the mask (the weights'
    dtype); the masked SDPA (memory-efficient kernel; eager: HF's eager attention); o_proj."""
    T, h, a, w = sh.tokens, spec.hidden, sh.act, sh.weight
    q, kv, d = spec.q_dim, spec.kv_dim, spec.head_dim
    vt = vision_tokens(spec, _Images(sh.batch, images))
    V = sh.batch * vt
    o = max(a, w)  # the norms' output: weight * x.to(input_dtype) promotes to the weights' dtype
    ops = autocast_inputs("attn_in", T, h, 1, sh, "attn_in")
    ops.append(gemm("q", T, q, h, sh, f"{MLLAMA}:430 q_proj"))
    ops += _rms_norm(spec, "q_norm", T * q / d, d, sh, o)
    if not sh.decode:
        ops += [gemm("k", V, kv, h, sh, f"{MLLAMA}:435 k_proj"), gemm("v", V, kv, h, sh, f"{MLLAMA}:436 v_proj")]
        ops += _rms_norm(spec, "k_norm", V * kv / d, d, sh, o)
    src = "integrations/sdpa_attention.py repeat_kv (a mask is given)"
    for name, b in (("k", o), ("v", a)):
        if kv < q:
            ops.append(memory(f"{name}_repeat", V * kv * b, V * q * b, src, "attention", saves=False, bwd_ops=(
                bwd_kernel(f"{name}_repeat.backward", V * q * b, V * kv * b, "reduce"),)))
    eager = sh.attention == "eager" and sh.hf_eager
    if o != a and sh.autocast:  # autocast's casts (SDPA's, or the eager matmuls') of q and the repeated k; SDPA
        # also casts the mask (the eager path adds it to the scores)
        mask = sh.batch * sh.seq * vt
        ops += [memory("q.attn_cast", T * q * o, T * q * a, "torch.autocast (SDPA inputs)", "attention", saves=False,
                       **DOWNCAST),
                memory("k.attn_cast", V * q * o, V * q * a, "torch.autocast (SDPA inputs)", "attention", saves=False,
                       **DOWNCAST)]
        ops += [] if eager else [memory("cross_mask.attn_cast", mask * w, mask * a, "torch.autocast (SDPA inputs)",
                                        "attention", saves=False, grad=False, **DOWNCAST)]
    ops.append(Op("attention", "attention", attention_dtype(sh), sh.seq, vt, d, sh.batch * spec.heads,
                  causal=False, kernel="eager" if eager else "efficient",
                  kernels=eager_kernels(a, w)[0] if eager else 1, bwd_kernels=eager_kernels(a, w)[1] if eager else -1,
                  mask=w if eager else 0, source=f"{MLLAMA}:457 masked SDPA over the vision tokens"))
    ops.append(gemm("o", T, h, q, sh, f"{MLLAMA}:469 o_proj"))
    return ops


def cross_grad_accumulations(spec: ModelSpec, sh: Shape, images: int) -> list[Op]:
    """Backward-only adds of one cross-attention layer (autograd InputBuffer::add): the stream read by each norm and
    its residual add (2) and the MLP input read by gate and up (1), over the text rows (ops.grad_accumulations'
    without q, k and v sharing an input); the cross_attention_states read by k_proj and v_proj (1, the activation
    dtype, over the vision rows). NB: the states' gradient summed over the cross-attention layers (one add a layer
    but the first) is not listed."""
    x = sh.tokens * spec.hidden * sh.residual
    v = sh.batch * vision_tokens(spec, _Images(sh.batch, images)) * spec.hidden * sh.act
    return [memory("grad_accumulate", 2 * x * 3, x * 3, "autograd InputBuffer::add", saves=False, kernels=3),
            memory("cross_states_grad_accumulate", 2 * v, v, "autograd InputBuffer::add", saves=False)]
