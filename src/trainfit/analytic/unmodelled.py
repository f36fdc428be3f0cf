"""Architecture features the analytic engine has no terms for yet: a spec that has one is refused with one line
(the trace engine builds the real transformers model and covers it). `unmodelled_memory` lists what the memory
formulas lack, `unmodelled_kernels` what only the op list (kernels, step time) lacks: an estimate without a GPU
times nothing and needs the former only.

Qwen3-Next (transformers models/qwen3_next/modeling_qwen3_next.py) is modelled, not refused: its memory and FLOPs
(analytic/gated_deltanet.py: the Gated DeltaNet layers' saved tensors, no-grad high points and per-sequence conv +
recurrent state; activations.py: the gated attention's sigmoid gate; families.json: the zero-centred RMSNorm's fp32
normalised tensor) and its kernels (analytic/ops/gated_deltanet.py: in_proj_qkvz/ba, the depthwise conv, the chunked
rule's batched matmuls and triangular solves, the gated norm; a decode step's recurrent rule; ops/attention.py: the
output gate; ops/norm.py: the zero-centred weight), checked against the trace's kernels per kind of layer
(tests/analytic/test_ops_vs_trace.py).

Llama 4 (llama4_text) is modelled, not refused: its all-experts MoE (analytic/moe_every_expert.py; ops/moe.py
every_expert_ops), its q/k L2 norm (activations.py; ops/norm.py NORMS "l2"), its chunked layers' masked SDPA
(activations.masked_chunk_share; ops/layer.py chunk_mask_ops), its complex fp32 RoPE (ops/layer.py rope_shape,
families.json rotary_complex) and Maverick's interleaved dense/MoE layers (memory.interleaved_moe). NB: the NoPE
layers' temperature scaling of q saves a (1, s, 1, 1) fp32 scale per layer, not counted.
Under autocast with full recomputation its MoE layer's backward high point is the end of the re-run forward
(checkpoint's early stop, the re-run's unsaved locals beside the saved set: moe_every_expert.every_expert_moments):
small-llama4_text amp-bf16 reads -0.31 % (CUDA semantics; -0.29 % CPU, native ISA and AVX2) where pricing only the
experts' product rule read +1.92 % (+1.94 %); Scout with 2 layers at 1 x 4096 on CUDA -0.00 % (+1.58 % before).

Nemotron-H (transformers models/nemotron_h/modeling_nemotron_h.py) interleaves Mamba-2 blocks (NemotronHMamba2Mixer,
:390-613) with attention and MLP blocks. Its inference memory is modelled (hybrid_inference.py, mamba2.py: the
scan's live tensors at the prefill's high point, the conv + SSM state per sequence and Mamba block as cache, K and V
for the attention blocks only; small-nemotron_h within 0.03 % of the trace, under amp-bf16 on a CPU with oneDNN's
bf16 path too (the scan's batched-bmm scratch: mamba2.scan_bmm_scratch), tiny-nemotron-h within 0.5 %), and so is
its training in fp32 and bf16 (hybrid_training.py, mamba2.scan_end_train: what autograd saves of the mixer, the
scan's end in the forward and in a re-run forward, the scan's backward high point; the families matrix's cases
within 0.05 % of the trace), and under autocast (mamba2.scan_autocast_train: the einsums' bmm in bf16, each keeping
16-bit casts of its operands, the high point inside the last bmm or at the scan's end; within 0.35 % of the trace
at one and several chunks, on a CPU with oneDNN's bf16 path with the last bmm's scratch: mamba2.scan_bmm_scratch).
Under CUDA's autocast einsum casts its operands before copying them into its bmm (mamba2.einsum_copy_bytes: 16-bit
copies where CPU autocast copies fp32), and the prefill past one chunk holds the chunk states' copy: small-nemotron_h
amp-bf16 on CUDA semantics from
+1.10 % to -0.06 % (training, 2 x 128; 2 x 256: +1.35 % to -0.04 %), +4.17 % to -0.02 % (prefill, 2 x 128),
+2.34 % to -0.02 % (prefill, 2 x 256; fp32 on CPU -1.83 % to -0.01 %).
Its kernels are modelled too (analytic/ops/mamba2.py, ops/layer.py _hybrid_block: in_proj, the depthwise conv and
SiLU, the SSD chunked scan's segment sums, einsum copies and batched matmuls, the D skip, the gated RMSNorm, out_proj;
a decode step's conv and state update), so --gpu times its step, prefill and decode: against the trace's kernels per
kind of block (tests/analytic/test_ops_vs_trace.py; tiny-nemotron-h at 2 x 128, CUDA semantics) the GEMM shapes and
the casts are exact and the other bytes of a Mamba block within +0.18 % / -0.43 % (amp-bf16, forward / backward),
+0.23 % / -0.45 % (bf16), +0.22 % / -0.91 % (fp32), +0.16 % / +1.06 % at a padded last chunk (2 x 120); attention and
MLP blocks within +0.4 %. NB: that is transformers' reference PyTorch scan; with `mamba_ssm` installed a GPU runs its
fused kernels, which move far fewer bytes (the op list's time is then pessimistic). Serving sizes the engines' own
state allocators (analytic/serving_state.py).

Vision-language models (Qwen2.5-VL, Qwen3-VL, Gemma 3 with images; spec.vision, models/vlm.py) add an image encoder
beside the language model: a patch embedding, attention blocks over each image's patches (Qwen2.5-VL: windowed but
at four blocks), a merger or pooling projector, Qwen3-VL's deepstack mergers, and the image tokens in the language
model's sequence. Qwen2.5-VL's memory and FLOPs are modelled (analytic/vlm.py: the tower's parameters, the language
model over text + image tokens, the tower's saved tensors, prefill high point and FLOPs; tests/analytic/
test_vlm_analytic.py), and so are Gemma 3's (analytic/siglip.py: the SigLIP tower, the pooling projector, the
language model's materialised image-block masks), and so are both towers' kernels (analytic/ops/vision_tower.py:
the patch embedding's GEMM, each block's norms, projections, attention per window or image (Qwen2.5-VL's fp32 2-D
rotary), MLP, the merger or pooling projector and the scatter of the image tokens into the embeddings; timed on the
first stage and in the prefill, analytic/tower_time.py): --gpu times a VLM's training step and prefill. Against the
trace's kernels (tests/analytic/test_tower_ops_vs_trace.py, a block as a 3-block less a 2-block tower, and the
ends; amp-bf16, bf16, fp32 under CUDA semantics) the GEMM and attention shapes and the casts are equal, the other
memory-bound bytes within -2.0 % to +0.2 % forward and -0.9 % to +0.1 % backward for Qwen2.5-VL's blocks, -0.3 % to
+8.8 % for its ends, -0.2 % to +0.3 % forward and -0.2 % to +8.3 % backward for SigLIP's blocks (+13.1 % in fp32:
two gradient copies not listed), -3.3 % to +2.7 % for Gemma 3's ends; Gemma 3's language-model layer with images
(its SDPA masked: k and v repeated, the mask made additive, ops/layer.py masked_sdpa) +0.7 % to +7.0 %. NB: the
masks' construction from token_type_ids (a few small kernels per step) is not listed.
Qwen3-VL's memory and FLOPs are modelled too (analytic/qwen3vl_tower.py: LayerNorm
blocks with a tanh-GELU MLP, in fp32 under CUDA's autocast only; the merger and the deepstack mergers; the position
table resampled to each image, its fp32 rows beside the tower's rotary moment and its interpolation indices and
weights as inputs; the tower's outputs, deepstack features and the clone the deepstack add makes, held by the
language model; the bias casts autocast caches). Its language model runs SDPA with is_causal: no mask is
materialised (qwen3vl_tower.py docstring); a +3.2 % to +10.1 % prefill over-count measured before came from a trace
whose prefill step dropped the images and the cache (step/infer.py: Qwen3-VL's forward takes use_cache through
**kwargs). Now (hidden 128, a 2-block tower of width 64 with a deepstack merger, 1 and 2 images of 128 px, batch 2
x 128 text tokens): training -0.53 % to -0.14 % of the trace in fp32, bf16 and amp-bf16 without recompute, -0.86 %
to -0.13 % with full recompute, prefill -0.83 % to -0.17 %, on CPU and CUDA semantics (ONEDNN_MAX_CPU_ISA=AVX2
alike). NB: oneDNN's Conv3d scratch in the patch embedding is not priced: fp32 on the CPU with full recompute reads
-2.8 % (2 images) to -7.1 % (1 image; its weight-gradient scratch, on both ISAs), and a bf16 CPU prefill of 2
images -2.5 % under AVX2 (its forward scratch, as large as the 16-bit pixel rows). Measured before Qwen2.5-VL's terms (hidden 128, a
2-block tower of width 64, one 112-pixel image per sample, CUDA semantics): analytic -31 % of the traced training
peak, -22 % to -24 % in prefill.
Its tower's kernels are listed (analytic/ops/qwen3vl_tower.py: the biased patch Conv3d's GEMM, the position table
resampled per image (the 4 bilinear taps gathered, weighted, summed, cast, added), the axial rotary tables, each
block's LayerNorms, fused qkv, fp32 2-D rotary, SDPA per image, proj and GELU-tanh MLP, the merger, each deepstack
level's merger and its add into the language model's hidden states after the first decoder layers), checked against
the trace's kernels (tests/analytic/test_tower_ops_vs_trace.py, amp-bf16, bf16, fp32 under CUDA semantics): GEMM and
attention shapes and casts equal, other bytes -0.05 % to +0.10 % forward and -0.05 % to +0.09 % backward for a
block, +0.29 % to +0.34 % forward and -2.9 % to -1.7 % backward for the ends (the patch bias gradient, inside the
trace's convolution_backward), +0.18 % to +0.22 % forward and +1.05 % to +1.21 % backward for a deepstack level;
timed (analytic/tower_time.py) once its memory terms lift this refusal.
Llama 3.2 Vision (mllama; models/mllama.py) is modelled, not refused: its tiled tower (4 tiles an image whatever
its size, local and tanh-gated global LayerNorm/GELU layers under an aspect-ratio mask, the intermediate layers'
outputs concatenated into the projector) and the language model's cross-attention layers (q/k RMSNorms, K/V over
the vision tokens repeated to every head, the masked SDPA, tanh gates; their K/V cache over the vision tokens), with
the tower's backward run last (analytic/mllama.py; tests/analytic/test_mllama_analytic.py). The small model's
training and prefill within 0.82 % of the trace (fp32, bf16, amp-bf16, CPU and CUDA, eager, full recompute, 0 to 2
images; -0.82 % is bf16 full recompute on CUDA, the per-tensor 512-B rounding of its many small parameters; NB fp32
full recompute with 2 images: -1.0 % on CUDA, +0.65 % on the CPU, the cross-attention backward's own temporaries);
llama-3.2-11b-vision at 1 x 512 + 1 image within 0.3 %. Without a tower term (the language model alone, 2 layers):
-15.9 % of the traced training peak (fp32, CPU) and -2.8 % to -5.9 % in prefill; with the cross-attention layers'
extra tensors held to the backward's end and the tower's gradients counted before its backward: the 11B +3.1 %.
Its kernels are listed too (analytic/ops/mllama_tower.py: the tower's ends, local and gated global encoder layers,
the projector, the cross-attention masks; a cross-attention layer as its own kind of layer), so --gpu times it:
against the trace's kernels (tests/analytic/test_tower_ops_vs_trace.py, amp-bf16, bf16, fp32 under CUDA semantics)
GEMM and attention shapes and casts equal, other bytes -0.29 % to +0.19 % for an encoder layer (local or global,
forward and backward), +5.5 % to +7.2 % forward and +3.4 % to +3.7 % backward for the ends (the trace counts each
tile-embedding lookup as reading its whole table, the op list the gathered rows), -1.27 % to +0.36 % forward and
+0.83 % to +2.4 % backward for a cross-attention layer.
Any of these VLMs trained without images (--images 0): the forward skips the tower (and Mllama's cross-attention
layers), so their parameters get no gradient while the optimizer states made by the step before stay
(analytic/vlm.py idle_params). Measured against the trace (bf16, CUDA, 1 x 512): qwen3-vl-2b +4.68 % -> +0.01 %,
qwen2.5-vl-3b +4.47 % -> +0.01 %, gemma-3-4b +2.32 % -> +0.01 %, llama-3.2-11b-vision +6.59 % -> 0.00 % (fp32 and
amp-bf16 alike); the small models' optimizer step, where their gradients all live, +4.7 % to +30 % -> -0.96 % to
-0.04 % (the rest: CUDA's 512-B rounding of each gradient), their peaks (in the backward) unchanged but with 2
micro-batches accumulated (+6.4 % -> -0.41 % Qwen3-VL, +5.9 % -> -0.34 % Mllama; tests/analytic/
test_vlm_without_images.py).

T5 / Flan-T5 / mT5 (transformers models/t5/modeling_t5.py T5ForConditionalGeneration) is an encoder-decoder: an
encoder stack over --seq tokens (bidirectional self-attention) and a decoder stack over --target-seq tokens (causal
self-attention, then cross-attention whose K and V are projected from the encoder's output), the relative position
bias computed by each stack's first block ((1, heads, q, k), T5Attention.compute_bias) and passed to every later
block as the attention mask's additive term, dropout_rate on the embeddings, attention probabilities and every
branch; in inference the decoder's self-attention cache and the cross-attention cache (K/V over the encoder's tokens
in every decoder block, EncoderDecoderCache). Its inference memory and prefill FLOPs are modelled
(analytic/encoder_decoder.py: both stacks' high points, the relative bias's bucketing and additive masks, both
caches, lm_head over every target position; tests/analytic/test_encoder_decoder_analytic.py, within 0.04 % of the
trace), and so are its training memory and FLOPs (analytic/encoder_decoder_training.py: both stacks' saved tensors
block by block — T5LayerNorm's fp32 terms, SDPA with the bias as a float mask (a CPU's math path; under CUDA
semantics the memory-efficient kernel: q, k, v, output, fp32 logsumexp, each self-attention's bias copy), the
gated gelu_new or relu MLP, the dropout noise or masks on the embeddings, probabilities and every branch, autocast's
casts, the bucket indices of each stack's first block — the MLP's two backward moments, full recomputation's held inputs, biases and
re-run blocks; tests/analytic/test_encoder_decoder_training.py). At the families matrix's test size (hidden 128,
2 + 12 blocks, batch 2 x 128 + 128 target tokens) every precision (fp32, amp-bf16, bf16, bf16-master) x recompute
none/full on CPU semantics reads -0.51 % to 0.00 % of the traced peak (T5 v1.0, relu and 6 decoder
blocks: -0.62 % to 0.00 %; ONEDNN_MAX_CPU_ISA=AVX2 -0.25 % to +0.11 %), on CUDA semantics -0.54 % to -0.02 %
(flan-t5-base, 4 x 512 + 128 tokens: -0.003 % amp-bf16, -0.005 % bf16; full recompute +0.23 %, +0.40 %; long
inputs, 1 x 4096 + 64, 2 x 2048 + 64 and 1 x 1500 + 50, where the kernel's (b, heads, q, k) bias gradient, the
stack's accumulated bias gradient under full recomputation or the decoder's embedding backward beside the encoder's
saved tensors is the peak: -0.49 % to +0.18 %, -2.83 % before the last); priced as
the math path on CUDA too, before, it read +1.08 % to +21.22 % (flan-t5-base: +42.4 %, +75.4 %); with the
engine's one-stack terms it read -59.6 % (amp-bf16, CPU) to -66.7 % (bf16, CUDA) (inference: -13.6 %, bf16,
CUDA, before encoder_decoder.py). Its kernels are in the op list (the last paragraph);
--tp/--pp/--cp, data parallelism and ZeRO/FSDP, LoRA, --compile, --offload
and recompute policies other than none and full are refused in one line (encoder_decoder_training.check_trainable).
BART (models/bart/modeling_bart.py BartForConditionalGeneration) has the same two stacks (post-norm, with a learned
position table and layernorm_embedding per stack instead of the relative bias, biased linears, final_logits_bias);
Whisper (models/whisper/modeling_whisper.py) reads log-mel frames (2 x --seq) through conv1 + GELU and conv2
(stride 2) + GELU before its pre-norm encoder blocks. Their inference memory and prefill FLOPs are modelled
(analytic/encdec_absolute.py, the per-stack front-ends in encdec_frontends.py: prefill high point at the last
blocks' MLP or the head, both caches, the decode step; tests/analytic/test_encoder_decoder_analytic.py): at the
families matrix's size (batch 2 x 128 encoder positions + 128 target tokens) the prefill peak equals the trace's on
a CPU (fp32, bf16, amp-bf16; native ISA and ONEDNN_MAX_CPU_ISA=AVX2) and reads -0.03 % (amp-bf16) to -0.17 % (bf16)
under CUDA semantics (the allocator's 512-byte rounding of the biases), the decode step within 0.2 %, the FLOPs
exact; with --attention eager the same (-1.6 % to -4.6 % before the probabilities each layer holds through its
MLP); before, with the one-stack terms, -3.0 % (BART) and -5.6 % (Whisper). Their kernels are in the op list
(below). Their training is modelled (encoder_decoder_training.py's structure with
encdec_absolute_training.py's terms: LayerNorm blocks post- or pre-norm, biased q/k/v/out_proj, SDPA's math path
where attention dropout runs on a CPU or beside BART's materialised causal mask, the fused kernels elsewhere, the
GELU MLP, dropout / attention_dropout / activation_dropout from the config, each stack's front-end, the tied table's
partials at each stack's embedding backward; tests/analytic/test_encoder_decoder_training.py): at the families
matrix's size (2 x 128 + 128) every precision (fp32, amp-bf16, bf16, bf16-master) x recompute none/full on CPU and
CUDA semantics reads -0.18 % to +0.47 % (BART) and -0.39 % to +0.51 % (Whisper) of the traced peak (CPU under
ONEDNN_MAX_CPU_ISA=AVX2: 0.00 % to +0.56 %, +0.12 % to +0.61 %), other shapes and gradient accumulation from
-0.23 % to +0.54 %, bart-base at 1 x 512 + 128 (amp-bf16, CUDA) -0.19 %, whisper-tiny at 1 x 1500 + 128 +0.22 %;
with the one-stack terms -54.3 % to -54.5 % (BART), -46.5 % to -50.2 % (Whisper). Refused in one line as T5's: the
settings check_trainable lists.
T5's kernels (analytic/ops/encoder_decoder.py, timed by encoder_decoder_time.py): both stacks' blocks, the relative
bias, SDPA's float mask and memory-efficient kernel, the cross-attention over the encoder's or the cached k and v, the
head and loss, forward and backward; tests/analytic/test_encdec_ops_vs_trace.py: every GEMM and attention call as
the trace's, a block's memory-bound bytes -0.1 % to +7.2 % of the trace's with CUDA's kernel for a masked SDPA call,
generate()'s prefill and decode -1.4 % and -0.1 %. So --gpu times T5's prefill and decode (and its training step once
its memory is modelled); fp16 and quantised weights are refused for timing (transformers keeps wo in fp32).
BART's and Whisper's kernels (analytic/ops/encdec_absolute.py: each stack's front-end, Whisper's convolutions as
implicit GEMMs, the post- and pre-norm LayerNorm blocks, SDPA's flash kernel or, for BART's bool causal mask, the
memory-efficient one, the caches' cats, final_logits_bias, forward and backward; tests/analytic/
test_encdec_absolute_ops_vs_trace.py, fp32, bf16, amp-bf16): every GEMM and attention call as the trace's, a
block's casts equal and its other memory-bound bytes -0.30 % to +0.23 %, a whole training step's -0.08 % to +3.0 %,
generate()'s prefill -0.06 % to -0.19 % and decode -1.7 % to -3.4 %; --gpu times their prefill and decode (SDPA's
kernels: under --attention eager the timing is refused in one line, encoder_decoder_time.check_timed).
unmodelled_kernels refuses the encoder-decoders whose memory is modelled but whose stacks the op list does not list.
"""
from __future__ import annotations

from ..errors import SetupError
from ..spec import ModelSpec
from . import encoder_decoder, vlm


def unmodelled_features(spec: ModelSpec) -> list[str]:
    """The features of `spec` the analytic formulas do not cover (empty: fully modelled): those of the memory
    formulas and those of the op list (kernels, step time). Settings a family's terms do not cover yet are refused
    by its own module (e.g. hybrid_training.check_trainable: Nemotron-H under --tp/--pp)."""
    return unmodelled_memory(spec) + unmodelled_kernels(spec)


def unmodelled_kernels(spec: ModelSpec) -> list[str]:
    """Features whose memory is modelled but whose kernels the op list (analytic/ops/) does not list."""
    out = []
    from .ops.encoder_decoder import listed  # noqa: PLC0415 (the ops package imports this module)
    from .ops.vision_tower import TOWERS  # noqa: PLC0415

    if spec.encdec is not None and encoder_decoder.modelled(spec) and not listed(spec):
        out.append("an encoder-decoder's kernels (the op list and step time list T5's, BART's and Whisper's stacks "
                   "only; its memory is modelled: estimate without --gpu)")
    if spec.vision is not None and spec.vision.family not in TOWERS:
        out.append("the vision tower's kernels (the op list and step time list Qwen2.5-VL's, Gemma 3's, Qwen3-VL's "
                   "and Llama 3.2 Vision's; its memory and FLOPs are modelled: estimate without --gpu)")
    return out


def unmodelled_memory(spec: ModelSpec) -> list[str]:
    """The features of `spec` the memory formulas do not cover."""
    out = []
    if spec.vision is not None and spec.vision.family not in vlm.MODELLED_TOWERS:
        out.append("a vision tower (the image encoder's patch embedding, attention blocks and merger or projector, "
                   "and its image tokens in the language model's sequence)")
    if spec.encdec is not None and not encoder_decoder.modelled(spec):
        out.append("encoder-decoder stacks (the decoder's cross-attention over the encoder output, two stacks"
                   + (", T5's relative position bias)" if spec.encdec.relative_buckets else ")"))
    return out


def check_modelled(spec: ModelSpec, kernels: bool = True) -> None:
    """Refuse, in one line, a spec with a feature the analytic engine does not model; `kernels` False: what the
    memory estimate needs only (no op list, no step time)."""
    missing = unmodelled_features(spec) if kernels else unmodelled_memory(spec)
    if missing:
        raise SetupError(f"{spec.name}: the analytic engine does not model {', '.join(missing)} "
                         f"({spec.family}); use --engine trace (the real transformers model on fake tensors)")


def check_training_setup(spec: ModelSpec, setup) -> None:
    """Refuse, in one line (NotModelledError), a training setup whose terms its family's own module has not derived:
    Nemotron-H's under --tp/--pp, ZeRO-3 or other recompute policies (hybrid_training.check_trainable), an
    encoder-decoder's beyond one GPU (encoder_decoder.check_trainable, encoder_decoder_training.check_trainable, its
    step time: encoder_decoder_time.check_timed). The engine raises each where it computes those terms; the planner
    asks here first, so that it leaves such groups out instead of failing the search (plan/search.py _group_base)."""
    if spec.hybrid is not None:
        from . import hybrid_training  # noqa: PLC0415 (it imports this module)
        from .precision import state_bytes  # noqa: PLC0415

        hybrid_training.check_trainable(spec, setup, state_bytes(setup))
    if spec.encdec is not None:
        from . import encoder_decoder_time, encoder_decoder_training  # noqa: PLC0415 (they import this module)

        encoder_decoder.check_trainable(spec, setup)
        encoder_decoder_training.check_trainable(spec, setup)
        encoder_decoder_time.check_timed(spec, setup)
