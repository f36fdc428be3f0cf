"""A vision-language model in the analytic engine (spec.vision: Qwen2.5-VL's tower, models/vlm.py; Gemma 3's SigLIP
tower and pooling projector are analytic/siglip.py's, Qwen3-VL's tower's own terms analytic/qwen3vl_tower.py's, each
function here hands them over): the language model's sequence and the image encoder's own terms.

The language model runs over the text tokens and each image's merged tokens, which replace as many placeholder ids
in input_ids (Qwen2_5_VLModel.forward, transformers models/qwen2_5_vl/modeling_qwen2_5_vl.py: get_placeholder_mask
and masked_scatter of the image embeddings into inputs_embeds): every language-model term (activations, the KV
cache, the logits, FLOPs) reads that sequence (vlm_setup.lm_seq), as the trace's step builds it (step/build.py
vlm_batch)."""
from __future__ import annotations

from dataclasses import replace

from ..alloc.caching_allocator import K_MIN_BLOCK
from ..errors import SetupError
from ..setup import Setup
from ..spec import ModelSpec
from ..vlm_setup import IMAGE_MODES, lm_seq
from . import mllama, qwen3vl_tower, siglip
from .precision import StateBytes

# the towers whose terms are here, in analytic/siglip.py (Gemma 3's: projector "pool"), analytic/qwen3vl_tower.py
# (Qwen3-VL's) or analytic/mllama.py (Llama 3.2 Vision's); analytic/unmodelled.py refuses the others
MODELLED_TOWERS = ("qwen2_5_vl", "gemma3", "qwen3_vl", "mllama")


def _qwen3(spec: ModelSpec) -> bool:
    """Qwen3-VL's tower (LayerNorm blocks, deepstack mergers), whose saved tensors are analytic/qwen3vl_tower.py's."""
    return spec.vision is not None and spec.vision.family == "qwen3_vl"


def _pooled(spec: ModelSpec) -> bool:
    """Gemma 3's SigLIP tower and pooling projector, whose terms are analytic/siglip.py's."""
    return spec.vision is not None and spec.vision.projector == "pool"


def _crossed(spec: ModelSpec) -> bool:
    """Mllama's tiled tower read through cross-attention, whose terms are analytic/mllama.py's."""
    return spec.vision is not None and spec.vision.projector == "cross"


def _own_terms(spec: ModelSpec):
    """The module with the tower's own tower_saved, encoder_outputs_held and tower_prefill_peak (siglip, qwen3vl_tower,
    mllama), or None for Qwen2.5-VL's, which are here."""
    return siglip if _pooled(spec) else qwen3vl_tower if _qwen3(spec) else mllama if _crossed(spec) else None


def language_setup(spec: ModelSpec, setup: Setup) -> Setup:
    """`setup` with --seq the language model's tokens per sample (text + image tokens) where the step runs the
    tower; `setup` itself otherwise (a text model, serving, RL)."""
    if spec.vision is None or setup.mode not in IMAGE_MODES or not setup.images:
        return setup
    tokens = lm_seq(spec, setup)
    chunks = 2 * setup.cp
    if setup.cp > 1 and tokens % chunks:
        # megatron-core 0.16.1 utils.py:2025-2029 get_batch_on_this_cp_rank views the language model's input (the
        # tokens with their image placeholders) as 2·cp chunks; the Setup's rule (setup/rules.py) reads --seq, the text
        images = tokens - setup.seq
        fit = setup.seq + (-tokens) % chunks
        raise SetupError(f"--cp {setup.cp} splits each sequence into 2 × cp = {chunks} load-balanced chunks: "
                         f"{spec.name}'s language model reads --seq {setup.seq} + {images} image "
                         f"token{'s' if images != 1 else ''} = {tokens}, "
                         f"not divisible by {chunks}; use --seq {fit}")
    return replace(setup, seq=tokens)


FP32, INDEX = 4, 8


def _rounded(setup: Setup, n: int) -> int:
    """A small tensor's bytes as the allocator holds them: CUDA rounds each block up to 512 B (CUDACachingAllocator.cpp
    kMinBlockSize; alloc/caching_allocator.py K_MIN_BLOCK); the CPU allocator holds the bytes."""
    return -(-n // K_MIN_BLOCK) * K_MIN_BLOCK if setup.device == "cuda" and n else n


def patches(spec: ModelSpec, setup: Setup) -> int:
    """The tower's patch rows in one micro-batch: batch x images x (image / patch)^2."""
    return setup.batch * (setup.images or 0) * spec.vision.patches(setup.image_size)


def windows(spec: ModelSpec, setup: Setup) -> int:
    """The attention chunks of a windowed block in one micro-batch: each image's (image / window)^2 windows
    (vision_utils get_vision_window_index: window / (patch x merge) merged tokens a side; an image not a multiple of
    the window keeps its partial windows, rounded up)."""
    t = spec.vision
    if not t.window:
        return setup.batch * (setup.images or 0)
    side = setup.image_size // (t.patch * t.merge)
    per = t.window // (t.patch * t.merge)
    return setup.batch * (setup.images or 0) * (-(-side // per)) ** 2


def pixel_bytes(spec: ModelSpec, setup: Setup) -> int:
    """pixel_values: one fp32 row of in_channels x temporal_patch x patch^2 values per patch (the processor's
    flattened patches, Qwen2VLImageProcessor; step/build.py vlm_batch), an input live through the step."""
    t = spec.vision
    return patches(spec, setup) * t.patch_values * FP32


def _norm_saved(setup: Setup, st: StateBytes, rows: int, width: int, consumers: int) -> int:
    """Qwen2_5_VLRMSNorm (modeling_qwen2_5_vl.py:64-78) saves its fp32 input (the stream itself in fp32, else the
    .to(float32) copy), the rsqrt (rows,) fp32, the normalised tensor cast back to the stream's dtype (the weight
    multiply's operand) and its output as the next linear's input: under autocast the linear's own 16-bit cast of the
    fp32 product, one per consuming linear (an activation's cast is not cached: qkv; gate_proj and up_proj)."""
    out = st.act * rows * width * (consumers if st.autocast else 1)
    return FP32 * rows * width + _rounded(setup, FP32 * rows) + st.act * rows * width + out


def _weight_casts(spec: ModelSpec, st: StateBytes) -> int:
    """Under autocast each linear's weight cast to 16 bits, saved by its matmul (the bias's cast is not saved):
    per block qkv (3h x h), proj (h x h), gate/up (i x h each), down (h x i)."""
    if not st.autocast:
        return 0
    t = spec.vision
    h, i = t.hidden, t.intermediate
    return st.act * (3 * h * h + h * h + (3 if t.gated_mlp else 2) * h * i)


def _sdpa_chunk(setup: Setup, st: StateBytes, heads: int, length: int) -> int:
    """What SDPA saves per chunk beside q, k, v and its output: the logsumexp (1, heads, length) fp32 and, on CUDA,
    the RNG seed and offset of the efficient/flash kernels (aten _scaled_dot_product_efficient_attention /
    _flash_attention outputs), each a 512-B block; on the CPU the flash kernel's logsumexp alone
    (_scaled_dot_product_flash_attention_for_cpu). NB: the CUDA efficient kernel pads the logsumexp to 32 rows."""
    if setup.device == "cuda":
        return _rounded(setup, FP32 * heads * -(-length // 32) * 32) + 2 * K_MIN_BLOCK
    return FP32 * heads * length


def _attention_saved(spec: ModelSpec, setup: Setup, st: StateBytes, chunks: int) -> int:
    """One block's attention (Qwen2_5_VLVisionAttention.forward, :273-341): the fused qkv output (v, a view of it,
    is SDPA's operand; without autocast q and k too), the rotated q and k cast back to the compute dtype
    (apply_rotary_pos_emb_vision :210-222 computes in fp32 and saves nothing beyond the shared cos/sin), SDPA's
    output per chunk (torch.split over cu_seqlens, one SDPA call per image or window, :318-337) and their torch.cat
    (proj's input), and each chunk's logsumexp."""
    n, h, a = patches(spec, setup), spec.vision.hidden, st.act
    if setup.attention_kernel == "eager":  # the tower takes the model's attention implementation
        return 3 * n * h * a + 2 * n * h * a + n * h * a + chunks * _eager_chunk(st, spec.vision.heads, n // chunks)
    return 3 * n * h * a + 2 * n * h * a + 2 * n * h * a + chunks * _sdpa_chunk(
        setup, st, spec.vision.heads, n // chunks)


def _eager_chunk(st: StateBytes, heads: int, length: int) -> int:
    """eager_attention_forward (:241-262) per chunk: softmax's fp32 probabilities (its backward's operand) and their
    cast to the compute dtype (the probs.v matmul's operand; the same tensor in fp32); its output's transposed copy is
    not saved (the chunks' torch.cat is, counted once beside)."""
    scores = heads * length * length
    return FP32 * scores + (st.act * scores if st.act < FP32 else 0)


def _mlp_saved(spec: ModelSpec, st: StateBytes, rows: int) -> int:
    """The gated MLP (Qwen2_5_VLMLP, :85-97): gate_proj's output (SiLU's input), SiLU's output and up_proj's
    output (the product's operands) and their product (down_proj's input)."""
    return 4 * rows * spec.vision.intermediate * st.act


def block_saved(spec: ModelSpec, setup: Setup, st: StateBytes, chunks: int) -> int:
    """One tower block (Qwen2_5_VLVisionBlock, :344-375): two RMSNorms, the attention over `chunks` images or
    windows, the gated MLP; the residual adds save nothing."""
    n, h = patches(spec, setup), spec.vision.hidden
    return (_norm_saved(setup, st, n, h, 1) + _norm_saved(setup, st, n, h, 2 if spec.vision.gated_mlp else 1)
            + _attention_saved(spec, setup, st, chunks) + _mlp_saved(spec, st, n) + _weight_casts(spec, st))


def tower_saved(spec: ModelSpec, setup: Setup, st: StateBytes) -> int:
    """Bytes the tower's forward saves for its backward in one micro-batch (Qwen2_5_VisionTransformerPretrainedModel.
    forward, :430-489), live until the tower's backward, after the language model's and before the text
    embedding's (the tower runs after the embedding lookup, Qwen2_5_VLModel.forward :1202-1206, modeling_qwen3_vl.py
    :1163-1170, and autograd runs the later nodes first: memory.py passes them as phases.py embedding_freed):
    - the patch embedding (Qwen2_5_VisionPatchEmbed, :99-122, a Conv3d whose kernel equals its stride: a matmul of
      the pixel rows): under autocast its 16-bit casts of the pixel rows and of the weight; with 16-bit weights the
      pixel rows' copy in the tower's dtype (Qwen2_5_VLModel.get_image_features, :1075 pixel_values.type); in fp32
      the pixel rows themselves (an input: tower_inputs);
    - the 2-D rotary's cos and sin (Qwen2_5_VLVisionRotaryEmbedding, :128-186): (patches, head_dim) fp32 each,
      permuted into window order, shared by every block;
    - each block, windowed (one SDPA per window) or full (one per image: fullatt_block_indexes);
    - the merger (Qwen2_5_VLPatchMerger, :188-200): its RMSNorm over the patches, the first Linear's output (GELU's
      input) and GELU's output over the merged rows (patches / merge^2 of width hidden x merge^2), the autocast
      weight casts of both Linears, and the argsort of the window order (merged rows, int64) its rows are put back
      with."""
    if (own := _own_terms(spec)) is not None:
        return own.tower_saved(spec, setup, st)
    if spec.vision is None or not setup.images:
        return 0
    t = spec.vision
    n, h, a = patches(spec, setup), t.hidden, st.act
    k = t.patch_values
    m = t.hidden * t.merge ** 2
    merged = n // t.merge ** 2
    embed = a * (n * k + h * k) if st.autocast else (a * n * k if a < FP32 else 0)
    rotary = 2 * n * (h // t.heads) * FP32
    full = t.full_blocks
    images = setup.batch * setup.images
    if setup.recompute == "full":
        # each block is a GradientCheckpointingLayer (Qwen2_5_VLVisionBlock, :344): it keeps its input only and
        # re-runs in its backward. NB: the re-run block's saved set during the tower's backward is not a moment
        # here (the tower's backward comes after the language model's, whose moments hold more at these sizes)
        blocks = t.depth * n * h * a
    else:
        blocks = (full * block_saved(spec, setup, st, images)
                  + (t.depth - full) * block_saved(spec, setup, st, windows(spec, setup)))
    merger = (_norm_saved(setup, st, n, h, 1) + 2 * merged * m * a + _rounded(setup, INDEX * merged)
              + (a * (m * m + m * t.out_hidden) if st.autocast else 0))
    return embed + rotary + blocks + merger


def cross_layers_saved(spec: ModelSpec, setup: Setup, st: StateBytes) -> int:
    """What a VLM's language-model layers save beyond memory.py's layer price: Mllama's cross-attention layers'
    (analytic/mllama.py); 0 for the towers whose tokens join the sequence."""
    return mllama.cross_layers_saved(spec, setup, st) if _crossed(spec) else 0


def cross_kinds(spec: ModelSpec, setup: Setup, st: StateBytes, layers: int, self_kind):
    """(kinds, pattern) of a language model whose layers differ by kind (Mllama's cross-attention layers:
    analytic/mllama.py layer_kinds); None where every layer is memory.py's."""
    return mllama.layer_kinds(spec, setup, st, layers, self_kind) if _crossed(spec) else None


def late_gradients(spec: ModelSpec, setup: Setup, pc) -> int:
    """Parameters whose gradients are made after the embedding's backward: Mllama's tower and projector (the tower
    runs before the language model's embedding, so autograd runs its backward last: MllamaModel.forward
    :1345-1377, the text embedded in MllamaTextModel.forward :1109). Qwen2.5-VL and Gemma 3 embed the text first and
    run the tower after it: their towers' backward comes before the embedding's (0)."""
    return pc.vision if _crossed(spec) and setup.images else 0


def idle_params(spec: ModelSpec, setup: Setup, pc, layers: int, embedding: bool) -> float:
    """Parameters of one rank (a stage of `layers` language-model layers, with the embedding or not) that get no
    gradient in a step without images: the forward runs the tower only for pixel_values (Qwen2_5_VLModel.forward
    :1205, modeling_qwen3_vl.py :1169, Gemma3Model.forward :856, MllamaModel.forward :1346: `if pixel_values is not
    None`), so autograd never reaches the tower's or the projector's parameters, nor Mllama's skipped
    cross-attention layers' (mllama.skipped_params), and their .grad stays None. The optimizer states stay: the step
    before made them for every parameter (torch/optim/adam.py _init_group :139-151 makes a parameter's state on the
    first step it has a gradient; trace/train.py warm_up_optimizer steps all parameters once), and the step then
    skips a parameter without a .grad (adam.py:151, sgd.py:88 `if p.grad is not None`), so its foreach temporaries
    cover the others only. NB: DDP's gradient buckets (zero.py model_states' comm) are still sized to every
    parameter. 0 with images or for a text model."""
    if spec.vision is None or setup.images:
        return 0
    tower = pc.vision if embedding else 0  # the first stage's (parallel/tensor.py rank_params)
    return tower + (mllama.skipped_params(spec, setup, pc, layers, embedding) if _crossed(spec) else 0)


def tower_inputs(spec: ModelSpec, setup: Setup) -> int:
    """The tower's inputs in one micro-batch, live through the step: the pixel rows (0 without images), and
    Qwen3-VL's position-table resampling (qwen3vl_tower.interpolation_bytes). NB: the index tensors (the grid,
    cu_seqlens, the window order, the patches' 2-D positions) are not counted: under (patches x 2 int64 + a few
    512-B blocks)."""
    if _qwen3(spec):
        return pixel_bytes(spec, setup) + qwen3vl_tower.interpolation_bytes(spec, setup) if setup.images else 0
    if _crossed(spec):
        return mllama.tower_inputs(spec, setup)
    return pixel_bytes(spec, setup) if setup.images and spec.vision is not None else 0


def tower_casts(spec: ModelSpec, setup: Setup, st: StateBytes) -> int:
    """Under autocast, the tower's weight casts, which autocast's cache keeps for the whole region (a no-grad
    generate: the prefill and the decode): the patch embedding's, each block's linears' (_weight_casts) and the
    merger's two Linears' (biases cast per call, not counted); 0 without autocast or images."""
    if _pooled(spec):
        return siglip.tower_casts(spec, setup, st)
    if _crossed(spec):
        return mllama.tower_casts(spec, setup, st)
    if spec.vision is None or not setup.images or not st.autocast:
        return 0
    t = spec.vision
    m = t.hidden * t.merge ** 2
    k = t.patch_values
    mergers = 1 + len(t.deepstack_blocks)  # Qwen3-VL's deepstack mergers are the merger's shape
    return (st.act * (t.hidden * k + mergers * (m * m + m * t.out_hidden)) + t.depth * _weight_casts(spec, st)
            + (qwen3vl_tower.bias_casts(spec, st) if _qwen3(spec) else 0))


def encoder_outputs_held(spec: ModelSpec, setup: Setup, st: StateBytes) -> int:
    """What the language model's prefill holds of the tower (Qwen2_5_VLModel.forward, :1205-1222): the tower's
    output object (its last_hidden_state, patches x hidden in the stream's dtype, and the merged rows put back in
    image order, split per image, get_image_features :1075-1080) and their torch.cat cast to inputs_embeds' dtype
    (image_embeds), locals of the forward through the layers."""
    if (own := _own_terms(spec)) is not None:
        return own.encoder_outputs_held(spec, setup, st)
    if spec.vision is None or not setup.images:
        return 0
    t = spec.vision
    n = patches(spec, setup)
    merged = n // t.merge ** 2
    return n * t.hidden * st.act + merged * t.out_hidden * (st.act + st.residual)


def tower_prefill_peak(spec: ModelSpec, setup: Setup, st: StateBytes) -> int:
    """The tower's no-grad high point (beside the weights, its casts and the pixel rows): the first block's 2-D
    rotary (apply_rotary_pos_emb_vision, :210-222) at k's rotation, read off a traced bf16 prefill (2 images of 64
    patches per sample): q and k upcast to fp32 (views of the qkv output when it is fp32 already), the rotated
    q_embed, k * cos, rotate_half(k) * sin and their sum k_embed, each (patches, hidden) fp32, beside the qkv
    output, the rotary's cos and sin, the block's input and its norm's output (fp32 under autocast: the weight's
    fp32 multiply), the pixel rows' copy in a 16-bit tower's dtype (get_image_features :1075, alive through the
    tower's call) and the language model's text embeddings (made before the tower: Qwen2_5_VLModel.forward).
    NB: under autocast the tower's later weight casts (tower_casts, counted whole) are not made yet: over."""
    if (own := _own_terms(spec)) is not None:
        return own.tower_prefill_peak(spec, setup, st)
    return rotary_moment(spec, setup, st)


def rotary_moment(spec: ModelSpec, setup: Setup, st: StateBytes, norm_out: int | None = None) -> int:
    """tower_prefill_peak's moment of a Qwen tower (the rotary at k's rotation, the tower's input rows and the
    language model's text embeddings beside it); analytic/qwen3vl_tower.py adds what Qwen3-VL's holds beside.
    `norm_out`: bytes per value of the block norm's output (default: the RMSNorm's, fp32 under autocast)."""
    if spec.vision is None or not setup.images:
        return 0
    t = spec.vision
    n, h, a = patches(spec, setup), t.hidden, st.act
    k = t.patch_values
    copy = a * n * k if (a < FP32 and not st.autocast) else 0
    rotary = (6 if a < FP32 else 4) * FP32 * n * h + 2 * FP32 * n * (h // t.heads)
    block = 3 * n * h * a + n * h * a + n * h * (norm_out or (FP32 if st.autocast else a))
    text = setup.batch * setup.seq * spec.hidden * st.residual
    return copy + rotary + block + text


def forward_end_held(spec: ModelSpec, setup: Setup, st: StateBytes) -> int:
    """What a training forward's end holds of the tower beside its saved set and inputs: Qwen3-VL's
    (qwen3vl_tower.forward_end_held: the output object's image_outputs, the cached bias casts); 0 for the others.
    NB: Qwen2.5-VL's and Gemma 3's output objects are not read here."""
    return qwen3vl_tower.forward_end_held(spec, setup, st) if _qwen3(spec) else 0


def checkpointed_casts(spec: ModelSpec, setup: Setup, st: StateBytes) -> int:
    """Under autocast with full recompute, the checkpointed tower blocks' weight casts, which autocast's cache keeps
    to the end of the forward's autocast region (aten/src/ATen/autocast_mode.cpp cached_cast: a leaf fp32 weight
    that requires grad is cached whatever the grad mode, so also in the checkpoint's no-grad forward)."""
    if _pooled(spec):
        return siglip.checkpointed_casts(spec, setup, st)
    if _crossed(spec):  # Mllama: the projector's fp32 input, held to the forward's end
        return mllama.checkpointed_casts(spec, setup, st)
    if spec.vision is None or not setup.images or not st.autocast or setup.recompute != "full":
        return 0
    return spec.vision.depth * _weight_casts(spec, st)


def tower_forward_flops(spec: ModelSpec, setup: Setup) -> float:
    """The tower's forward FLOPs in one micro-batch, 2 per multiply-add (analytic/flops.py's convention): the patch
    embedding's Conv3d (kernel = stride: each patch row times the (hidden, in_channels x temporal_patch x patch^2)
    weight), each block's qkv, proj and MLP matmuls and its attention (q.k^T and probs.v, 2 x 2 x hidden per key;
    every patch sees its window's or image's patches, bidirectional), and the merger's two Linears over the merged
    rows (and Qwen3-VL's deepstack mergers, the merger's shape, modeling_qwen3_vl.py:654-662). NB: norms, rotary,
    activations and Qwen3-VL's position-table resampling are elementwise and left out, as in flops.py."""
    if _pooled(spec):
        return siglip.tower_forward_flops(spec, setup)
    if _crossed(spec):
        return mllama.tower_forward_flops(spec, setup)
    if spec.vision is None or not setup.images:
        return 0.0
    t = spec.vision
    n, h, i = patches(spec, setup), t.hidden, t.intermediate
    m = t.hidden * t.merge ** 2
    per_block = 2 * n * (4 * h * h + (3 if t.gated_mlp else 2) * h * i)
    images = setup.batch * setup.images
    full = t.full_blocks
    attention = 4 * h * n * (full * n / images + (t.depth - full) * n / windows(spec, setup))
    mergers = 1 + len(t.deepstack_blocks)
    return patch_embed_flops(spec, setup) + t.depth * per_block + attention + mergers * 2 * (n // t.merge ** 2) * (
        m * m + m * t.out_hidden)


def patch_embed_flops(spec: ModelSpec, setup: Setup) -> float:
    """The patch embedding's forward FLOPs: each patch row times the (hidden, in_channels x temporal_patch x patch^2)
    weight."""
    if _crossed(spec):
        return mllama.patch_embed_flops(spec, setup)
    if spec.vision is None or not setup.images:
        return 0.0
    t = spec.vision
    return 2 * patches(spec, setup) * t.patch_values * t.hidden
