"""A vision-language model's image encoder as op lists (spec.vision: Qwen2.5-VL's tower and merger, Gemma 3's SigLIP
tower and pooling projector, Qwen3-VL's tower, merger and deepstack levels: ops/qwen3vl_tower.py): the kernels
transformers' eager/SDPA code launches on CUDA over one micro-batch's patches, forward (backward: ops.backward of
it, plus block_grad_accumulations), and the image tokens scattered into the language model's embeddings. The
language model's own layers are the usual op list over text + image tokens (analytic/vlm.py language_setup).

The tower runs over n = batch x images x (image / patch)^2 patch rows: one Shape with tokens n (tower_shape), unsplit
by tensor, sequence or context parallelism (the tower is not sharded: NB over-counts a rank's tower kernels under
--tp / --cp, which the stacks do not split for a VLM's tower either).

Sources, transformers 5.x in the venv:
  Qwen2.5-VL  models/qwen2_5_vl/modeling_qwen2_5_vl.py: Qwen2_5_VisionPatchEmbed :99-122 (Conv3d, kernel = stride,
      no bias: one GEMM of the patch rows), the window permutation :422-426 and :459, the 2-D rotary tables
      :166-182 (permuted :461-464), Qwen2_5_VLVisionBlock :344-369 (RMSNorm :64-78, fused qkv :273-283 reshaped,
      permuted and unbound, apply_rotary_pos_emb_vision :207-219 in fp32, SDPA per image or window over cu_seqlens
      :316-337 then torch.cat, proj, gated SiLU MLP with biases :85-97), the merger :185-198 (RMSNorm, Linear, GELU,
      Linear) and its argsort :482-484, get_image_features :1075-1080, the placeholder scatter :1219-1222.
  Gemma 3     models/siglip/modeling_siglip.py: SiglipVisionEmbeddings :175-185 (Conv2d with bias, + position
      rows), SiglipEncoderLayer :325-356 (LayerNorm, q/k/v/out with biases :265-306, SDPA over each image,
      fc1 + gelu_pytorch_tanh + fc2 :310-322), post_layernorm :611; models/gemma3/modeling_gemma3.py
      Gemma3MultiModalProjector :651-668 (transpose + contiguous, avg_pool2d, Gemma3RMSNorm, matmul, type_as), the
      placeholder scatter :864.
Checked against the trace's kernels (trace/kernel_shapes.py) by tests/analytic/test_tower_ops_vs_trace.py: one block
as the difference of a 3-block and a 2-block tower, and the tower's ends."""
from __future__ import annotations

from dataclasses import replace

from ...spec import ModelSpec
from ..activations import FP32, INDEX
from .activation import one_kernel
from .attention import core_kernel, eager_kernels, ungrouped_kernel
from .cast import autocast_inputs, weight_casts
from .norm import fused_norm, hf_rms_norm
from .op import (BROADCAST, DOWNCAST, REDUCE, UPCAST, Op, Shape, attention_dtype, bwd_kernel, gemm, grad_cast,
                 memory, no_kernel)
from .residual import residual

QWEN = "modeling_qwen2_5_vl.py"
SIGLIP = "modeling_siglip.py"
# the towers (VisionTowerSpec.family) whose kernels are listed here (Qwen3-VL's in ops/qwen3vl_tower.py, Llama 3.2
# Vision's in ops/mllama_tower.py); analytic/unmodelled.py refuses timing the others
TOWERS = ("qwen2_5_vl", "gemma3", "qwen3_vl", "mllama")
GEMMA3 = "modeling_gemma3.py"


def pooled(spec: ModelSpec) -> bool:
    """Gemma 3's SigLIP tower and pooling projector (VisionTowerSpec.projector "pool"); else Qwen2.5-VL's."""
    return spec.vision.projector == "pool"


def layer_norm_merger(spec: ModelSpec) -> bool:
    """Qwen3-VL's tower (a merger tower with LayerNorms, VisionTowerSpec.norm: ops/qwen3vl_tower.py)."""
    return not pooled(spec) and spec.vision.norm == "layernorm"


def patch_rows(spec: ModelSpec, setup) -> int:
    """The tower's patch rows in one micro-batch: batch x images x (image / patch)^2."""
    return setup.batch * (setup.images or 0) * spec.vision.patches(setup.image_size)


def tower_shape(spec: ModelSpec, setup, sh: Shape) -> Shape:
    """The language model's Shape turned to the tower's: tokens = the patch rows (one sequence, unsplit), the tower's
    hidden stream as the residual (stream_bytes), the stack's attention kernel for ungrouped heads (the tower takes
    the model's attention implementation), transformers' eager RMSNorm."""
    return replace(sh, batch=1, seq=patch_rows(spec, setup), cp=1, tp=1, sp=False, residual=stream_bytes(spec, sh),
                   norm="hf-rmsnorm-fp32", rope="cos-sin", eager_mask=0, float8=False, decode=False,
                   attention=ungrouped_kernel(sh))  # (the tower's heads are not grouped)


def stream_bytes(spec: ModelSpec, sh: Shape) -> int:
    """Bytes of an element of the tower's hidden stream: the patch embedding's output dtype, which every residual add
    keeps. Qwen2.5-VL: the Conv3d's (16 bits under autocast: the conv runs in the compute dtype). SigLIP: the conv
    output plus the position rows, analytic/siglip.py stream_bytes (it reads the autocast flag and the activation
    bytes, which a Shape carries as StateBytes does)."""
    from ..siglip import stream_bytes as siglip_stream

    return siglip_stream(sh) if pooled(spec) else sh.act


def _attention(spec: ModelSpec, sh: Shape, chunks: int, name: str) -> list[Op]:
    """One SDPA call per image or window (`chunks` of equal length over the n rows; Qwen2.5-VL splits q, k, v over
    cu_seqlens, SigLIP attends over each image of its (images, patches) batch): bidirectional, the block's heads.
    Qwen2.5-VL's separate calls are listed one op each (their launches); SigLIP's one batched call one op."""
    t = spec.vision
    d = t.hidden // t.heads
    rows = sh.tokens / chunks
    kernel = core_kernel(sh)
    fwd_k, bwd_k = eager_kernels(sh.act, 0) if sh.attention == "eager" else (1, -1)
    calls, batch = (1, chunks * t.heads) if pooled(spec) else (chunks, t.heads)
    # NB: under eager attention the matmuls' operand and output layout copies (ops/attention.py
    # eager_operand_copies, eager_output_copy) are not listed
    op = Op(name, "attention", attention_dtype(sh), rows, rows, d, batch, causal=False, kernel=kernel,
            kernels=fwd_k, bwd_kernels=bwd_k, source="SDPA per image / window (sdpa_attention_forward)")
    return [op] * calls


def _rotate(name: str, x: float, table: float) -> list[Op]:
    """q·cos + rotate_half(q)·sin (:215-216) in fp32 over x elements, cos and sin (`table` elements, broadcast over
    the heads) read by their products; rotate_half = a neg of one half + a cat (:201-204). Backward
    (derivatives.yaml), spelled out: grad·sin, the neg's, each of rotate_half's two slices a slice_backward (zeros +
    the half's copy), their sum, grad·cos, and q's two gradients summed (the add passes its gradient on)."""
    x4, t4 = x * FP32, table * FP32
    src = f"{QWEN}:201-218 apply_rotary_pos_emb_vision"
    return [memory(f"{name}.rope_cos", x4 + t4, x4, src, saves=False, bwd_ops=(
                bwd_kernel(f"{name}.rope_cos.backward", x4 + t4, x4, "strided"),
                bwd_kernel(f"{name}.rope_grad_sum", 2 * x4, x4)), **BROADCAST),
            memory(f"{name}.rope_neg", x4 / 2, x4 / 2, src, saves=False, **BROADCAST),
            memory(f"{name}.rope_cat", x4, x4, src, saves=False, bwd_ops=(
                bwd_kernel(f"{name}.rope_slice_backward", x4, 2 * x4, kernels=2),
                bwd_kernel(f"{name}.rope_slices_sum", 2 * x4, x4))),
            memory(f"{name}.rope_sin", x4 + t4, x4, src, saves=False, bwd_ops=(
                bwd_kernel(f"{name}.rope_sin.backward", x4 + t4, x4, "strided"),), **BROADCAST),
            memory(f"{name}.rope_add", 2 * x4, x4, src, saves=False, bwd_ops=(no_kernel(f"{name}.rope_add"),))]


def _rotary(n: float, h: int, heads: int, sh: Shape) -> list[Op]:
    """apply_rotary_pos_emb_vision (:207-219): q and k cast to fp32 (`q.float()`; none in fp32), rotated in fp32
    against the fp32 (n, head_dim) cos/sin tables (_rotate), cast back to q's dtype."""
    a, x = sh.act, n * h
    ops: list[Op] = []
    for name in ("vq", "vk"):
        if a != FP32:
            ops.append(memory(f"{name}.rope_fp32", x * a, x * FP32, f"{QWEN}:213 q.float()", saves=False, **UPCAST))
        ops += _rotate(name, x, x / heads)
    if a != FP32:
        ops += [memory(f"{name}.rope_cast", x * FP32, x * a, f"{QWEN}:217-218 .to(orig dtype)", saves=False,
                       **DOWNCAST) for name in ("vq", "vk")]
    return ops


def _rms_norm(spec: ModelSpec, name: str, rows: float, h: int, sh: Shape) -> list[Op]:
    """Qwen2_5_VLRMSNorm (:64-78): HF's eager RMSNorm kernels (ops/norm.py hf_rms_norm) over the stream; its
    `self.weight * x.to(input_dtype)` promotes a 16-bit x to the fp32 weight's dtype (autocast keeps fp32 weights),
    so its backward casts x's gradient back (grad_cast)."""
    s = sh.residual
    out = max(s, sh.weight)
    ops = hf_rms_norm(spec, name, rows, h, sh, "", out, s, zero_centred=False)
    cast = grad_cast(f"{name}.weight.grad_cast", rows * h, out, s)
    return ops + ([memory(f"{name}.promotion", 0, 0, f"{QWEN}:78", saves=False, kernels=0, bwd_ops=cast)]
                  if cast else [])


def qwen_block(spec: ModelSpec, sh: Shape, chunks: int) -> list[Op]:
    """One Qwen2_5_VLVisionBlock's forward kernels over the n patch rows, attending over `chunks` images or windows."""
    t = spec.vision
    n, h, i, a = sh.tokens, t.hidden, t.intermediate, sh.act
    ops: list[Op] = []
    ops += _rms_norm(spec, "vnorm1", n, h, sh)
    ops += autocast_inputs("vqkv_in", n, h, 1, sh, "")
    ops.append(gemm("vqkv", n, 3 * h, h, sh, f"{QWEN}:283 qkv", bias=True))
    x = n * h * a
    # reshape + permute + unbind are views; unbind's backward stacks the three gradients and the permute's reshape
    # copies them back to the projection's layout (derivatives.yaml unbind: stack; view of a permuted tensor)
    ops.append(memory("vqkv_unbind", 0, 0, f"{QWEN}:283 unbind", saves=False, kernels=0, bwd_ops=(
        bwd_kernel("vqkv_unbind.stack", 3 * x, 3 * x), bwd_kernel("vqkv_unbind.layout", 3 * x, 3 * x, "transpose"))))
    ops += _rotary(n, h, t.heads, sh)
    # torch.split over cu_seqlens (views); its backward concatenates each of q's, k's and v's chunk gradients
    split = [bwd_kernel(f"v{c}_split.backward", x, x) for c in "qkv"] if not pooled(spec) else []
    ops.append(memory("vattn_split", 0, 0, f"{QWEN}:318 torch.split", saves=False, kernels=0, bwd_ops=tuple(split)))
    ops += [memory("vattn_lengths", 0, 0, f"{QWEN}:316 cu_seqlens[1:] - cu_seqlens[:-1]", saves=False, grad=False)]
    ops += _attention(spec, sh, chunks, "vattention")
    # the chunks' outputs concatenated (:335; its backward: split, views)
    ops.append(memory("vattn_cat", x, x, f"{QWEN}:335 torch.cat", saves=False, grad=False))
    ops.append(gemm("vproj", n, h, h, sh, f"{QWEN}:338 proj", bias=True))
    ops += residual("vattn", n * h, 0.0, sh, "", f"{QWEN}:362 residual add")
    ops += _rms_norm(spec, "vnorm2", n, h, sh)
    ops += autocast_inputs("vmlp_in", n, h, 2, sh, "")
    ops.append(gemm("vgate", n, i, h, sh, f"{QWEN}:96 gate_proj", bias=True))
    ops += one_kernel("silu", "vact", n * i, sh, "")
    ops.append(gemm("vup", n, i, h, sh, f"{QWEN}:96 up_proj", bias=True))
    y = n * i * a
    ops.append(memory("vact_mul", 2 * y, y, f"{QWEN}:96 act(gate)·up", bwd_ops=(
        bwd_kernel("vact_mul.backward", 2 * y, y), bwd_kernel("vact_mul.backward_up", 2 * y, y))))
    ops.append(gemm("vdown", n, h, i, sh, f"{QWEN}:96 down_proj", bias=True))
    ops += residual("vmlp", n * h, 0.0, sh, "", f"{QWEN}:368 residual add")
    return weight_casts("vweight_casts", ops, sh) + ops


def siglip_block(spec: ModelSpec, sh: Shape, chunks: int) -> list[Op]:
    """One SiglipEncoderLayer's forward kernels over the n patch rows (`chunks`: the images of the batch)."""
    t = spec.vision
    n, h, i, s = sh.tokens, t.hidden, t.intermediate, sh.residual
    ops: list[Op] = []
    # nn.LayerNorm (on autocast's fp32 list: the fp32 stream in, fp32 out; else the compute dtype)
    ops += fused_norm(spec, "vln1", n, h, sh, "", s, s)
    ops += autocast_inputs("vqkv_in", n, h, 3, sh, "")
    for name in ("vq", "vk", "vv"):
        ops.append(gemm(name, n, h, h, sh, f"{SIGLIP}:284-286 q/k/v_proj", bias=True))
    ops += _attention(spec, sh, chunks, "vattention")
    ops.append(gemm("vout", n, h, h, sh, f"{SIGLIP}:304 out_proj", bias=True))
    ops += residual("vattn", n * h, 0.0, sh, "", f"{SIGLIP}:349 residual add")
    ops += fused_norm(spec, "vln2", n, h, sh, "", s, s)
    ops += autocast_inputs("vfc1_in", n, h, 1, sh, "")
    ops.append(gemm("vfc1", n, i, h, sh, f"{SIGLIP}:319 fc1", bias=True))
    ops += one_kernel("gelu_tanh", "vact", n * i, sh, "")  # gelu_pytorch_tanh: aten gelu(approximate="tanh")
    ops.append(gemm("vfc2", n, h, i, sh, f"{SIGLIP}:321 fc2", bias=True))
    ops += residual("vmlp", n * h, 0.0, sh, "", f"{SIGLIP}:354 residual add")
    return weight_casts("vweight_casts", ops, sh) + ops


def block_grad_accumulations(spec: ModelSpec, sh: Shape) -> list[Op]:
    """Backward-only adds of one block (autograd InputBuffer::add, as ops.grad_accumulations): the stream read by each
    norm and its residual add (2, the stream's dtype); the norm output read by several linears, in the norm output's
    dtype: Qwen2.5-VL's gate and up (1), SigLIP's q, k and v (2)."""
    if layer_norm_merger(spec):
        from .qwen3vl_tower import block_grad_accumulations as qwen3vl_accumulations

        return qwen3vl_accumulations(spec, sh)
    t = spec.vision
    s = sh.residual
    x = sh.tokens * t.hidden
    out = s if pooled(spec) else max(s, sh.weight)
    shared = 2 if pooled(spec) else 1
    return [memory("vgrad_accumulate", 2 * x * s * 2, x * s * 2, "autograd InputBuffer::add", saves=False, kernels=2),
            memory("vgrad_accumulate_norm", 2 * x * out * shared, x * out * shared, "autograd InputBuffer::add",
                   saves=False, kernels=shared)]


def block_kinds(spec: ModelSpec, setup) -> list[tuple[int, int]]:
    """(blocks, attention chunks) per kind of block: Qwen2.5-VL's windowed blocks (one chunk per window,
    analytic/vlm.py windows) and full-attention ones (fullatt_block_indexes: one per image); SigLIP's blocks attend
    over each image, and so do Qwen3-VL's (window 0: no windowed blocks)."""
    from ..vlm import windows

    t = spec.vision
    images = setup.batch * (setup.images or 0)
    full = t.full_blocks
    if pooled(spec):
        return [(t.depth, images)]
    return [(k, c) for k, c in ((t.depth - full, windows(spec, setup)), (full, images)) if k]


def block_forward(spec: ModelSpec, sh: Shape, chunks: int) -> list[Op]:
    """One tower block's forward kernels (the tower's Shape, tower_shape)."""
    if layer_norm_merger(spec):
        from .qwen3vl_tower import block

        return block(spec, sh, chunks)
    return siglip_block(spec, sh, chunks) if pooled(spec) else qwen_block(spec, sh, chunks)


def _pixel_ops(spec: ModelSpec, sh: Shape, src: str) -> list[Op]:
    """The fp32 pixel rows as the patch embedding reads them: cast to the weight's dtype (`pixel_values.type(...)`,
    `.to(dtype=target_dtype)`) with 16-bit weights, by autocast's conv input cast under autocast; none in fp32. No
    backward (the pixels need no gradient)."""
    t = spec.vision
    x = sh.tokens * t.patch_values
    if sh.act == FP32:
        return []
    return [memory("pixels_cast", x * FP32, x * sh.act, src, saves=False, grad=False, **DOWNCAST)]


def _patch_embed(spec: ModelSpec, sh: Shape, bias: bool, src: str) -> Op:
    """The patch Conv3d / Conv2d, kernel = stride: one GEMM of the patch rows (n, hidden, patch values) (cuDNN's
    implicit GEMM; vision_time.py times a ViT's patch conv the same way). Its backward: the weight's gradient only."""
    return gemm("patch_embed", sh.tokens, spec.vision.hidden, spec.vision.patch_values, sh, src, bias=bias)


def _scatter(spec: ModelSpec, sh: Shape, lm: Shape, image_rows: float, src: str) -> list[Op]:
    """The image features cast to inputs_embeds' dtype (where they differ) and scattered over the placeholder rows
    (inputs_embeds.masked_scatter(mask, features): reads the embeddings, the boolean mask and the features,
    writes the embeddings); backward (derivatives.yaml masked_scatter): grad.masked_fill(mask, 0) for the embeddings
    and masked_select(grad, mask) for the features, then the cast back."""
    out, a, r = spec.vision.out_hidden, sh.act, lm.residual
    e = lm.tokens * out  # the language model's embeddings (its hidden = the projector's output width)
    f = image_rows * out
    ops = [memory("image_features.cast", f * a, f * r, src, saves=False, **(UPCAST if r > a else DOWNCAST))] \
        if a != r else []
    mask = lm.tokens  # the (b, s, 1) boolean mask expanded over the width: a broadcast, read once a token
    ops.append(memory("image_scatter", e * r + mask + f * r, e * r, src, saves=False, bwd_ops=(
        bwd_kernel("image_scatter.masked_fill", e * r + mask, e * r),
        bwd_kernel("image_scatter.masked_select", e * r + mask, f * r))))
    # the placeholder mask (input_ids == image_token_id) and its expansion to the embeddings' width
    ops.append(memory("image_mask", lm.tokens * INDEX, lm.tokens, src, saves=False, grad=False))
    return ops


def qwen_ends(spec: ModelSpec, sh: Shape, lm: Shape) -> list[Op]:
    """Qwen2.5-VL's tower outside its blocks: the pixels' cast, the patch Conv3d, the window permutation, the 2-D
    rotary tables, the merger and the merged rows put back in image order, and the scatter into the embeddings."""
    t = spec.vision
    n, h, a, s = sh.tokens, t.hidden, sh.act, sh.residual
    m, merged = h * t.merge ** 2, sh.tokens / t.merge ** 2
    ops = _pixel_ops(spec, sh, f"{QWEN}:1075 pixel_values.type / autocast")
    ops.append(_patch_embed(spec, sh, False, f"{QWEN}:121 patch_embed Conv3d"))
    # hidden_states[window_index] (:424): a gather of the rows; its backward zeros and index_put_s (2 kernels)
    x = n * h * s
    ops.append(memory("window_permute", x + merged * INDEX, x, f"{QWEN}:424 window permutation", saves=False,
                      bwd_ops=(bwd_kernel("window_permute.grad_zero", 0, x),
                               bwd_kernel("window_permute.index_put", x + merged * INDEX, x, "strided"))))
    # the rotary tables (:166-182, :461-464), fp32, no gradient: the (2, n) positions cast to fp32; e = n x head_dim
    # / 2 angles: the freqs product (writes 4e), cos, its scaling, sin, its scaling (2 x 4e bytes each), the h/w cats
    # (2 x 8e), the full-width cats and the window gathers (2 x 16e each)
    e = n * (h // t.heads) / 2
    ops.append(memory("vrotary_tables.to_fp32", 2 * n * INDEX, 2 * n * FP32, f"{QWEN}:168 position_ids.float()",
                      saves=False, grad=False, **UPCAST))
    ops.append(memory("vrotary_tables", 2 * n * FP32 + 52 * e, 60 * e, f"{QWEN}:166-182 rotary tables",
                      saves=False, grad=False, kernels=11))
    ops += _rms_norm(spec, "vmerger_norm", n, h, sh)
    ops += autocast_inputs("vmerger_in", merged, m, 1, sh, "")
    ops.append(gemm("vmerger_fc1", merged, m, m, sh, f"{QWEN}:191 merger mlp[0]", bias=True))
    ops += one_kernel("gelu", "vmerger_act", merged * m, sh, "")
    ops.append(gemm("vmerger_fc2", merged, t.out_hidden, m, sh, f"{QWEN}:193 merger mlp[2]", bias=True))
    f = merged * t.out_hidden * a
    ops.append(memory("vmerger_unpermute", f + merged * INDEX, f, f"{QWEN}:484 [reverse_indices]", saves=False,
                      bwd_ops=(bwd_kernel("vmerger_unpermute.grad_zero", 0, f),
                               bwd_kernel("vmerger_unpermute.index_put", f + merged * INDEX, f, "strided"))))
    # the per-image split (views) concatenated again (:1216 torch.cat; its backward: views)
    ops.append(memory("image_features.cat", f, f, f"{QWEN}:1216 torch.cat", saves=False, grad=False))
    ops += _scatter(spec, sh, lm, merged, f"{QWEN}:1219-1222 masked_scatter")
    return weight_casts("vweight_casts_ends", ops, sh) + ops


def gemma3_ends(spec: ModelSpec, sh: Shape, lm: Shape) -> list[Op]:
    """Gemma 3's tower outside its blocks: the pixels' cast, the patch Conv2d and the position rows, the
    post_layernorm, the pooling projector, and the scatter into the embeddings."""
    t = spec.vision
    n, h, a, s, w = sh.tokens, t.hidden, sh.act, sh.residual, sh.weight
    ops = _pixel_ops(spec, sh, f"{SIGLIP}:178 pixel_values.to / autocast")
    ops.append(_patch_embed(spec, sh, True, f"{SIGLIP}:178 patch_embedding Conv2d"))
    # + position_embedding(position_ids) (:184): the table's rows gathered (one image's patches), added to every image
    # (a broadcast); the add's backward sums the images' gradients for the table (then its embedding backward)
    rows = t.patches(t.image_size)  # (a fixed image size: VisionTowerSpec.fixed_size)
    ops.append(memory("vpositions", rows * h * w + rows * INDEX, rows * h * w, f"{SIGLIP}:184 position_embedding",
                      saves=False, grad=False))
    ops.append(memory("vpositions_add", n * h * a + rows * h * w, n * h * s, f"{SIGLIP}:184 + positions",
                      saves=False, bwd_ops=(bwd_kernel("vpositions_add.grad_sum", n * h * s, rows * h * w, "reduce"),
                                            *grad_cast("vpositions_add.grad_cast", n * h, s, a)), **BROADCAST))
    ops += fused_norm(spec, "vpost_ln", n, h, sh, "", s, s)
    # Gemma3MultiModalProjector (:656-668): the (b, hidden, side, side) contiguous copy, avg_pool2d, Gemma3RMSNorm
    # (the language model's norm kernels: ops/norm.py, fp32, zero-centred weight), the projection, type_as
    x, pooled_rows = n * h * s, sh.tokens / t.merge ** 2
    p = pooled_rows * h * s
    ops.append(memory("vpool_layout", x, x, f"{GEMMA3}:659 transpose + contiguous", saves=False, access="transpose"))
    ops.append(memory("vavg_pool", x, p, f"{GEMMA3}:661 avg_pool2d", saves=False, **REDUCE))
    ops += hf_rms_norm(spec, "vsoft_emb_norm", pooled_rows, h, sh, "", FP32, s)
    ops += autocast_inputs("vprojection_in", pooled_rows, h, 1, sh, "")
    ops.append(gemm("vprojection", pooled_rows, t.out_hidden, h, sh, f"{GEMMA3}:667 mm_input_projection", bias=False))
    f = pooled_rows * t.out_hidden
    if a != s:  # .type_as(vision_outputs): the 16-bit product back to the stream's fp32
        ops.append(memory("vprojection.type_as", f * a, f * s, f"{GEMMA3}:668 type_as", saves=False, **UPCAST))
    ops += _scatter(spec, replace(sh, act=s), lm, pooled_rows, f"{GEMMA3}:864 masked_scatter")
    return weight_casts("vweight_casts_ends", ops, sh) + ops


def ends_forward(spec: ModelSpec, sh: Shape, lm: Shape) -> list[Op]:
    """The tower's kernels outside its blocks (the tower's Shape `sh`, the language model's `lm`); Qwen3-VL's with its
    deepstack levels (their language-model adds too)."""
    if layer_norm_merger(spec):
        from .qwen3vl_tower import ends_with_deepstack

        return ends_with_deepstack(spec, sh, lm)
    return gemma3_ends(spec, sh, lm) if pooled(spec) else qwen_ends(spec, sh, lm)


def ends_backward(ops: list[Op]) -> list[Op]:
    """The backward of ends_forward's list: ops.backward without the patch embedding's input gradient (the pixels
    need none: convolution_backward's output_mask)."""
    from .derived import backward

    return [o for o in backward(ops) if o.name != "patch_embed.dgrad"]


def tower_lists(spec: ModelSpec, setup, lm: Shape) -> list[tuple[int, list[Op], list[Op]]]:
    """(count, forward, backward) of each part of the tower in one micro-batch: its ends once, then each kind of
    block (block_kinds) with its count; empty without a tower or images. `setup`: a Setup, or what of it the tower
    reads (batch, images, image_size)."""
    from .derived import backward

    if spec.vision is None or not getattr(setup, "images", 0):
        return []
    if spec.vision.projector == "cross":  # Llama 3.2 Vision's tiled tower (ops/mllama_tower.py)
        from .mllama_tower import tower_lists as tiled_lists

        return tiled_lists(spec, setup, lm)
    sh = tower_shape(spec, setup, lm)
    ends = ends_forward(spec, sh, lm)
    out = [(1, ends, ends_backward(ends))]
    for blocks, chunks in block_kinds(spec, setup):
        fwd = block_forward(spec, sh, chunks)
        out.append((blocks, fwd, backward(fwd) + block_grad_accumulations(spec, sh)))
    return out
