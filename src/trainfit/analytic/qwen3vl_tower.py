"""Qwen3-VL's image encoder in the analytic engine (spec.vision of family qwen3_vl, models/vlm.py): transformers
models/qwen3_vl/modeling_qwen3_vl.py Qwen3VLVisionModel (:621-725): the biased Conv3d patch embedding (as Qwen2.5-VL's,
:91-108), the learned position table resampled to each image's grid (:683-696: each patch's 4 neighbouring rows
times their bilinear weights, summed, added to the patch rows), `depth` pre-LayerNorm blocks over each image's
patches (Qwen3VLVisionBlock :328-356: a fused qkv, the 2-D rotary, one SDPA per image, a plain linear_fc1 ->
gelu_pytorch_tanh -> linear_fc2 MLP, :78-88), the merger and a deepstack merger after each of `deepstack_blocks`
(Qwen3VLVisionPatchMerger :171-184: LayerNorm, Linear, nn.GELU, Linear; the deepstack ones normalise after the
2 x 2 shuffle), whose outputs the language model adds to the image tokens' hidden states after its first layers
(Qwen3VLTextModel :815-850). analytic/vlm.py hands this tower here and keeps the terms it shares with Qwen2.5-VL's
(the attention, the weight casts, the rotary moment, the FLOPs).

The language model runs SDPA with is_causal, no materialised mask: in the step's prefill and training alike the
positions come as (3, batch, tokens) M-RoPE rows, so Qwen3VLTextModel.forward passes create_causal_mask no text
positions (:795-807) and no packed-sequence check runs (masking_utils.py:866-871, only with positions and neither
a 2-D mask nor a cache), and without padding _ignore_causal_mask_sdpa skips the mask (masking_utils.py:292-293). In
generate() the positions carry a text row (:1384-1423), but with a cache, so the check is skipped all the same."""
from __future__ import annotations

from ..setup import Setup
from ..spec import ModelSpec
from . import vlm
from .precision import StateBytes

FP32 = 4


def norm_in_fp32(setup: Setup, st: StateBytes) -> bool:
    """Whether the tower's LayerNorms run in fp32 on its 16-bit stream: under CUDA's autocast (layer_norm is on its
    fp32 list: aten/src/ATen/autocast_mode.h AT_FORALL_FP32; trace/cuda_autocast.py), which saves an fp32 copy of
    the input and returns fp32 rows that each Linear casts back; CPU's autocast keeps layer_norm in the input's
    dtype (16-bit rows in, 16-bit rows out; analytic/loss.py reads the same)."""
    return st.autocast and setup.device == "cuda"


def _layernorm_saved(setup: Setup, st: StateBytes, rows: int, width: int, input_saved: bool = True) -> int:
    """nn.LayerNorm (aten native_layer_norm) saves its input (its fp32 copy where norm_in_fp32) and the per-row
    mean and rstd: fp32, but in the input's dtype on the CPU when input and weight agree (16-bit weights without
    autocast: aten/src/ATen/native/layer_norm.cpp param_scalar_type; analytic/activations.py _norm_saved).
    `input_saved` False: the input is counted elsewhere (the 16-bit stream the next block's norm keeps)."""
    x = FP32 * rows * width if norm_in_fp32(setup, st) else (st.act * rows * width if input_saved else 0)
    stats = st.act if setup.device == "cpu" and not st.autocast else FP32
    return x + 2 * vlm._rounded(setup, stats * rows)


def block_saved(spec: ModelSpec, setup: Setup, st: StateBytes) -> int:
    """One Qwen3VLVisionBlock (:328-356): two LayerNorms (the block's input and the mid residual, or their fp32
    copies: norm_in_fp32), the qkv and linear_fc1 inputs (the norm's output, or autocast's 16-bit cast of its fp32
    output), the attention as Qwen2.5-VL's over one chunk per image (vlm._attention_saved: Qwen3VLVisionAttention
    :259-325 splits over cu_seqlens the same way), linear_fc1's output (the tanh GELU's input) and the GELU's output
    (linear_fc2's input), the weight casts; the residual adds save nothing."""
    n, h, i = vlm.patches(spec, setup), spec.vision.hidden, spec.vision.intermediate
    a = st.act
    images = setup.batch * setup.images
    return (2 * _layernorm_saved(setup, st, n, h) + 2 * a * n * h + vlm._attention_saved(spec, setup, st, images)
            + 2 * a * n * i + vlm._weight_casts(spec, st))


def _merger_saved(spec: ModelSpec, setup: Setup, st: StateBytes, postshuffle: bool) -> int:
    """One Qwen3VLVisionPatchMerger (:171-184): its LayerNorm (over hidden, or over hidden x merge^2 after the
    shuffle: a deepstack merger, whose input is the stream the next block's norm keeps), linear_fc1's input,
    linear_fc1's output (nn.GELU's input) and the GELU's output over the merged rows, the weight casts of both
    Linears."""
    t = spec.vision
    n, a = vlm.patches(spec, setup), st.act
    m = t.hidden * t.merge ** 2
    merged = n // t.merge ** 2
    norm = (_layernorm_saved(setup, st, merged, m, input_saved=False) if postshuffle
            else _layernorm_saved(setup, st, n, t.hidden))
    return norm + 3 * merged * m * a + (a * (m * m + m * t.out_hidden) if st.autocast else 0)


def tower_saved(spec: ModelSpec, setup: Setup, st: StateBytes) -> int:
    """Bytes the tower saves for its backward in one micro-batch (Qwen3VLVisionModel.forward, :670-725): the patch
    embedding's casts (as Qwen2.5-VL's, vlm.tower_saved; the pixel rows' 16-bit copy get_image_features :1033), the
    rotary's cos and sin ((patches, head_dim) fp32 each, :697), each block (or with full recompute its input: a
    GradientCheckpointingLayer), the merger and each deepstack merger. The position rows' lookup times the
    interpolation weights (:695) saves the indices and the weights, both inputs (interpolation_bytes)."""
    if spec.vision is None or not setup.images:
        return 0
    t = spec.vision
    n, h, a = vlm.patches(spec, setup), t.hidden, st.act
    k = t.patch_values
    embed = a * (n * k + h * k) if st.autocast else (a * n * k if a < FP32 else 0)
    rotary = 2 * n * (h // t.heads) * FP32
    # NB: as Qwen2.5-VL's, the re-run block's saved set during the tower's backward is not a moment
    blocks = t.depth * (a * n * h if setup.recompute == "full" else block_saved(spec, setup, st))
    mergers = _merger_saved(spec, setup, st, False) + len(t.deepstack_blocks) * _merger_saved(spec, setup, st, True)
    return embed + rotary + blocks + mergers


def encoder_outputs_held(spec: ModelSpec, setup: Setup, st: StateBytes) -> int:
    """What the language model's prefill holds of the tower and its deepstack (Qwen3VLModel.forward,
    modeling_qwen3_vl.py:1170-1244, locals through the layers), `setup.seq` the language model's tokens:
    - the tower's output object (mm_encoder_outputs["image"], :1170): its last_hidden_state (patches x hidden, the
      stream's dtype), the merger's and each deepstack merger's output (merged rows x out_hidden, split per image:
      get_image_features :1027-1043), the merged rows' torch.cat cast to inputs_embeds' dtype (:1182) and each
      deepstack feature's torch.cat (deepstack_visual_embeds, :1218), a new tensor even for one image;
    - the placeholder masks (get_placeholder_mask: input_ids == the image id and == the video id, batch x tokens
      bool, the second kept as `_`, :1183);
    - the layer after a deepstack add holds the previous layer's output beside its input: Qwen3VLTextModel.forward
      (:815-833) keeps `layer_outputs` while `_deepstack_process` (:841-850) adds the features to a clone of it."""
    if spec.vision is None or not setup.images:
        return 0
    t = spec.vision
    n = vlm.patches(spec, setup)
    merged = n // t.merge ** 2
    deepstack = len(t.deepstack_blocks)
    outputs = n * t.hidden * st.act + merged * t.out_hidden * (st.act + st.residual + 2 * deepstack * st.act)
    masks = 2 * vlm._rounded(setup, setup.batch * setup.seq)
    clone = st.residual * setup.batch * setup.seq * spec.hidden if 0 < deepstack < spec.layers else 0
    return outputs + masks + clone


def interpolation_bytes(spec: ModelSpec, setup: Setup) -> int:
    """The position table's resampling to each image's grid (get_vision_interpolation_indices_and_weights, bilinear
    with aligned corners, modeling_qwen3_vl.py:683-690): the 4 neighbouring table rows of each patch, int64, and
    their 4 weights, fp32; inputs of the step (step/build.py vlm_batch passes them as the model would make them)."""
    return vlm.patches(spec, setup) * 4 * (vlm.INDEX + FP32)


def _bias_sizes(spec: ModelSpec) -> list[tuple[int, int]]:
    """The tower's Linear and Conv3d bias lengths, each with how many biases have it (not one entry per block: a
    depth of 10**9): the patch conv's (hidden), per block qkv's (3 x hidden), proj's (hidden), linear_fc1's
    (intermediate) and linear_fc2's (hidden), per merger (the merger and each deepstack merger) linear_fc1's
    (hidden x merge^2) and linear_fc2's (out_hidden)."""
    t = spec.vision
    mergers = 1 + len(t.deepstack_blocks)
    return [(t.hidden, 1), (3 * t.hidden, t.depth), (t.hidden, t.depth), (t.intermediate, t.depth), (t.hidden, t.depth),
            (t.hidden * t.merge ** 2, mergers), (t.out_hidden, mergers)]


def bias_casts(spec: ModelSpec, st: StateBytes) -> int:
    """Under autocast, the 16-bit casts of the tower's biases (_bias_sizes), which autocast's cache keeps as it
    keeps the weights' (a leaf that requires grad: aten/src/ATen/autocast_mode.cpp cached_cast)."""
    return st.act * sum(b * n for b, n in _bias_sizes(spec)) if st.autocast else 0


def tower_prefill_peak(spec: ModelSpec, setup: Setup, st: StateBytes) -> int:
    """The tower's no-grad high point: Qwen2.5-VL's moment at the last block's rotary (vlm.rotary_moment: the qkv
    output, q and k in fp32 and their rotations, the rotary's cos and sin, the block's input and its norm's output,
    the pixel rows' 16-bit copy, the text embeddings; the norm's output fp32 only where norm_in_fp32), and beside it
    the resampled position rows (`pos_embeds`, :695: the table's rows times the fp32 interpolation weights, summed:
    (patches, hidden) fp32, a local of the tower's forward) and the deepstack mergers' outputs of the blocks before
    the last (deepstack_feature_lists, :702-715: merged rows x out_hidden each)."""
    if spec.vision is None or not setup.images:
        return 0
    t = spec.vision
    n = vlm.patches(spec, setup)
    before_last = sum(1 for j in t.deepstack_blocks if j < t.depth - 1)
    norm_out = FP32 if norm_in_fp32(setup, st) else st.act
    return (vlm.rotary_moment(spec, setup, st, norm_out) + FP32 * n * t.hidden
            + before_last * (n // t.merge ** 2) * t.out_hidden * st.act)


def forward_end_held(spec: ModelSpec, setup: Setup, st: StateBytes) -> int:
    """What a training forward's end holds of the tower beside its saved set, in the model's output object until
    the step takes the loss from it (Qwen3VLForConditionalGeneration.forward returns image_outputs, :1374-1382): the
    tower's last_hidden_state (patches x hidden) and the merger's and each deepstack merger's outputs (merged rows x
    out_hidden), the stream's dtype; and under autocast the tower's bias casts, cached to the end of the forward's
    autocast region (bias_casts; on CUDA each a 512-B block)."""
    if spec.vision is None or not setup.images:
        return 0
    t = spec.vision
    n = vlm.patches(spec, setup)
    mergers = 1 + len(t.deepstack_blocks)
    outputs = n * t.hidden * st.act + mergers * (n // t.merge ** 2) * t.out_hidden * st.act
    if not st.autocast:
        return outputs
    return outputs + sum(n * vlm._rounded(setup, st.act * b) for b, n in _bias_sizes(spec))
