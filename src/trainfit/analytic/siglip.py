"""Gemma 3's image encoder in the analytic engine (spec.vision with projector "pool", models/vlm.py): the SigLIP
tower (transformers models/siglip/modeling_siglip.py SiglipVisionModel: a Conv2d patch embedding plus a learned
position row per patch, `depth` pre-LayerNorm blocks with separate q/k/v/out linears and one SDPA over each image's
patches, a GELU(tanh) MLP, the post_layernorm) and Gemma 3's projector (models/gemma3/modeling_gemma3.py
Gemma3MultiModalProjector, :635-668: the patch grid average-pooled merge x merge, Gemma3RMSNorm, a bias-free matmul
to the language model's width). analytic/vlm.py hands these towers here; the images batch through the tower (one
SDPA call over batch x images), unlike Qwen's packed patch rows."""
from __future__ import annotations

from ..alloc.caching_allocator import K_MIN_BLOCK
from ..setup import Setup
from ..spec import ModelSpec
from . import vlm
from .precision import StateBytes

FP32 = 4


def _rounded(setup: Setup, n: int) -> int:
    return vlm._rounded(setup, n)


def _images(setup: Setup) -> int:
    return setup.batch * (setup.images or 0)


def _sizes(spec: ModelSpec, setup: Setup) -> tuple[int, int, int, int, int]:
    """(patch rows n, hidden h, intermediate i, pixels per patch k, pooled tokens T) of one micro-batch."""
    t = spec.vision
    n = _images(setup) * t.patches(setup.image_size)
    return n, t.hidden, t.intermediate, t.patch_values, _images(setup) * t.tokens(setup.image_size)


def stream_bytes(st: StateBytes) -> int:
    """The tower's hidden stream: the patch conv's output plus the position rows (SiglipVisionEmbeddings.forward,
    modeling_siglip.py:175-185) is fp32 under autocast (a bf16 conv output + the fp32 table promotes), else the
    compute dtype; every residual add keeps it."""
    return FP32 if st.autocast else st.act


def _layernorm_saved(setup: Setup, st: StateBytes, rows: int, width: int) -> int:
    """nn.LayerNorm (in fp32 under autocast: its fp32 input, the stream) saves its input and the per-row mean and
    rstd, fp32 (aten native_layer_norm)."""
    return stream_bytes(st) * rows * width + 2 * _rounded(setup, FP32 * rows)


def _lse(spec: ModelSpec, setup: Setup) -> int:
    """SDPA's logsumexp of one block: one call over (batch x images, heads, patches) (SiglipAttention.forward,
    modeling_siglip.py:273-306, no mask); on CUDA padded to 32 rows by the efficient kernel plus the RNG seed and
    offset (512-B blocks), on the CPU the flash kernel's logsumexp alone (as analytic/vlm.py _sdpa_chunk)."""
    t = spec.vision
    rows = t.patches(setup.image_size)
    if setup.device == "cuda":
        return _rounded(setup, FP32 * _images(setup) * t.heads * -(-rows // 32) * 32) + 2 * K_MIN_BLOCK
    return FP32 * _images(setup) * t.heads * rows


def _weight_casts(spec: ModelSpec, st: StateBytes) -> int:
    """Under autocast each block linear's weight cast to 16 bits (q, k, v, out: h x h; fc1, fc2: h x i), saved by
    its matmul and cached by autocast."""
    if not st.autocast:
        return 0
    h, i = spec.vision.hidden, spec.vision.intermediate
    return st.act * (4 * h * h + 2 * h * i)


def block_saved(spec: ModelSpec, setup: Setup, st: StateBytes) -> int:
    """One SiglipEncoderLayer (modeling_siglip.py:325-356): two LayerNorms; the linears' inputs (the norm's output
    shared by q, k, v and fc1's, or under autocast each linear's own 16-bit cast of the fp32 norm output: q, k, v,
    fc1); q, k, v and SDPA's output (the out projection's input: the output is laid out (b, patches, heads, d), so
    reshape + contiguous copy nothing) and the logsumexp; fc1's output (GELU's input) and GELU's output (fc2's
    input, SiglipMLP :310-322, gelu_pytorch_tanh one op); the weight casts; the residual adds save nothing."""
    n, h, i, _, _ = _sizes(spec, setup)
    a = st.act
    return (2 * _layernorm_saved(setup, st, n, h) + (4 if st.autocast else 2) * a * n * h + 4 * a * n * h
            + _attention_extra(spec, setup, st) + 2 * a * n * i + _weight_casts(spec, st))


def _attention_extra(spec: ModelSpec, setup: Setup, st: StateBytes) -> int:
    """Beside q, k, v and the output: SDPA's logsumexp, or under eager attention (the tower takes the model's
    implementation; eager_attention_forward, modeling_siglip.py:227-247) each image's fp32 probabilities and their
    16-bit cast (analytic/vlm.py _eager_chunk); the output's transposed copy is the out projection's input."""
    if setup.attention_kernel == "eager":
        t = spec.vision
        return _images(setup) * vlm._eager_chunk(st, t.heads, t.patches(setup.image_size))
    return _lse(spec, setup)


def _rmsnorm_saved(setup: Setup, st: StateBytes, rows: int, width: int) -> int:
    """Gemma3RMSNorm (modeling_gemma3.py:119-133) over the pooled rows: x.float() (the fp32 pooled rows, or their
    copy) saved by pow and the rsqrt multiply, the rsqrt (rows,) fp32, the normalised fp32 tensor (the weight
    multiply's operand); the projection's input is its 16-bit copy (type_as, or autocast's cast) or in fp32 the
    product itself."""
    return 2 * FP32 * rows * width + _rounded(setup, FP32 * rows) + st.act * rows * width


def tower_saved(spec: ModelSpec, setup: Setup, st: StateBytes) -> int:
    """Bytes the tower and projector save for the backward in one micro-batch:
    - the patch Conv2d (SiglipVisionEmbeddings.forward, :175-185): the pixels cast to the weight's dtype (a 16-bit
      copy with 16-bit weights; fp32: the input itself, tower_inputs), under autocast its 16-bit casts of the pixels
      and of the weight; the position rows' add saves nothing;
    - each block (block_saved), or with full recompute each block's input (GradientCheckpointingLayer);
    - the post_layernorm (SiglipVisionModel.forward :575-619);
    - the projector (Gemma3MultiModalProjector.forward, :651-668): the contiguous (b, hidden, side, side) copy that
      avg_pool2d keeps, the RMSNorm over the pooled rows, under autocast the projection weight's cast."""
    if spec.vision is None or not setup.images:
        return 0
    t = spec.vision
    n, h, _, k, pooled = _sizes(spec, setup)
    a, s = st.act, stream_bytes(st)
    embed = a * (n * k + h * k) if st.autocast else (a * n * k if a < FP32 else 0)
    if setup.recompute == "full":
        # NB: the re-run block's saved set during the tower's backward is not a moment (as analytic/vlm.py)
        blocks = t.depth * s * n * h
    else:
        blocks = t.depth * block_saved(spec, setup, st)
    projector = s * n * h + _rmsnorm_saved(setup, st, pooled, h) + (a * h * t.out_hidden if st.autocast else 0)
    return embed + blocks + _layernorm_saved(setup, st, n, h) + projector


def tower_casts(spec: ModelSpec, setup: Setup, st: StateBytes) -> int:
    """Under autocast the weight casts autocast's cache keeps through a no-grad generate: the patch conv's, each
    block's linears' and the projection's; 0 otherwise."""
    if spec.vision is None or not setup.images or not st.autocast:
        return 0
    t = spec.vision
    return st.act * (t.hidden * t.patch_values + t.hidden * t.out_hidden) + t.depth * _weight_casts(
        spec, st)


def checkpointed_casts(spec: ModelSpec, setup: Setup, st: StateBytes) -> int:
    """Under autocast with full recompute, the checkpointed blocks' weight casts, cached to the end of the forward's
    autocast region (as analytic/vlm.py checkpointed_casts)."""
    if spec.vision is None or not setup.images or not st.autocast or setup.recompute != "full":
        return 0
    return spec.vision.depth * _weight_casts(spec, st)


def encoder_outputs_held(spec: ModelSpec, setup: Setup, st: StateBytes) -> int:
    """What the language model's prefill holds beside its layers (Gemma3Model.forward, modeling_gemma3.py:860-895,
    locals through the layers): the tower's output (mm_encoder_outputs["image"]: its last_hidden_state, patches x
    hidden in the stream's dtype, and pooler_output, the projection's output cast back to it, type_as, :668), the
    image features' copy in inputs_embeds' dtype where that differs, and the image-block masks (block_masks)."""
    if spec.vision is None or not setup.images:
        return 0
    n, h, _, _, pooled = _sizes(spec, setup)
    s, r = stream_bytes(st), st.residual
    out = spec.vision.out_hidden
    return s * n * h + s * pooled * out + (r * pooled * out if r != s else 0) + block_masks(spec, setup)


def block_masks(spec: ModelSpec, setup: Setup) -> int:
    """The language model's boolean masks made from token_type_ids (create_masks_for_vision_model,
    modeling_gemma3.py:682-740), (batch, 1, tokens, tokens) each: one for the full-attention layers and one for the
    sliding ones, alive through the layers (causal_mask_mapping). Under eager attention the masks are additive ones
    in the embeddings' dtype, which analytic/inference.py's eager moment counts (family trait causal_masks)."""
    if setup.attention_kernel == "eager" or not image_block_masks(spec, setup):
        return 0
    return 2 * setup.batch * setup.seq ** 2


def tower_prefill_peak(spec: ModelSpec, setup: Setup, st: StateBytes) -> int:
    """The tower's no-grad high point (beside the weights, the cached casts and the pixels), the larger of two
    moments, each beside the language model's text embeddings (made before the tower: Gemma3Model.forward
    :852, the tower at :857):
    - the patch Conv2d (SiglipVisionEmbeddings.forward, modeling_siglip.py:175-185): the pixels' 16-bit copy (pixel_values.to(the
      weight's dtype), or autocast's cast) and the conv's output. NB: oneDNN's convolution scratch on the CPU is not
      priced (an under-count: 100,352 B at 8 images of 112 px in bf16, probed by the trace);
    - inside a block's MLP: the stream (the block's input and the residual add's output), the norm's output (fp32
      under autocast) and its 16-bit cast, fc1's output and GELU's output."""
    if spec.vision is None or not setup.images:
        return 0
    n, h, i, k, _ = _sizes(spec, setup)
    a, s = st.act, stream_bytes(st)
    conv = (a * n * k if a < FP32 else 0) + a * n * h
    block = s * n * h + n * h * (s + (a if st.autocast else 0)) + 2 * a * n * i
    return max(conv, block) + setup.batch * setup.seq * spec.hidden * st.residual


def tower_forward_flops(spec: ModelSpec, setup: Setup) -> float:
    """The forward FLOPs (2 per multiply-add): the patch conv (each patch times the (hidden, channels x patch^2)
    weight), each block's q, k, v, out, fc1, fc2 matmuls and its attention (q.k^T and probs.v over the image's
    patches: 4 x hidden per key), the projection of the pooled rows. NB: norms, pooling, GELU are elementwise and
    left out, as in flops.py."""
    if spec.vision is None or not setup.images:
        return 0.0
    t = spec.vision
    n, h, i, k, pooled = _sizes(spec, setup)
    per_block = 2 * n * (4 * h * h + 2 * h * i) + 4 * h * n * t.patches(setup.image_size)
    return 2 * n * k * h + t.depth * per_block + 2 * pooled * h * t.out_hidden


def image_block_masks(spec: ModelSpec, setup: Setup) -> bool:
    """Whether the language model runs every layer's SDPA with a materialised mask: Gemma 3 with images reads
    token_type_ids (the processor's, step/build.py _pooled_batch), whose image blocks attend both ways
    (Gemma3Model.forward :876-883 create_masks_for_vision_model: OR(causal, blockwise), and AND(sliding window, ...)
    for the sliding layers), a mask no SDPA is_causal can express."""
    return (spec.vision is not None and spec.vision.projector == "pool" and bool(setup.images)
            and setup.mode in ("train", "infer"))


def checkpoint_held_masks(spec: ModelSpec, setup: Setup, layers: int) -> tuple[int, int] | None:
    """With full recompute, the image-block masks the checkpointed layers' closures keep alive (as
    recompute.checkpoint_held_masks: each layer closes over its own kind's mask, Gemma3TextModel.forward :539 passing
    causal_mask_mapping[layer type]): (from the forward through the last layer's backward: one per kind of layer
    among `layers`, at the first layer's backward: one); None where the masks are not Gemma 3's boolean SDPA ones
    (eager attention's additive masks are recompute.py's)."""
    if (setup.recompute != "full" or setup.compile or setup.attention_kernel == "eager"
            or not image_block_masks(spec, setup)):
        return None
    one = setup.batch * setup.seq ** 2
    sliding = spec.sliding_layers
    kinds = (sliding > 0) + (sliding < spec.layers)
    return min(kinds, layers) * one, one
