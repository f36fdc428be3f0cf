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

Nemotron-H (transformers models/nemotron_h/modeling_nemotron_h.py) interleaves Mamba-2 blocks (NemotronHMamba2Mixer,
:390-613) with attention and MLP blocks. Its inference memory is modelled (hybrid_inference.py, mamba2.py: the
scan's live tensors at the prefill's high point, the conv + SSM state per sequence and Mamba block as cache, K and V
for the attention blocks only; small-nemotron_h within 0.03 % of the trace (-2.5 % under amp-bf16 on a CPU with
oneDNN's bf16 path: the scan's batched-bmm scratch), tiny-nemotron-h within 0.5 %), and so is its training in fp32
and bf16 (hybrid_training.py, mamba2.scan_end_train: what autograd saves of the mixer, the scan's end in the forward
and in a re-run forward, the scan's backward high point; the families matrix's cases within 0.05 % of the trace),
and under autocast (mamba2.scan_autocast_train: the einsums' bmm in bf16, each keeping 16-bit casts of its
operands, the high point inside the last bmm or at the scan's end; within 0.35 % of the trace at one and several
chunks, -1.55 % on a CPU with oneDNN's bf16 path: the batched-bmm scratch).
Not modelled: the scan's kernels in the op list (unmodelled_kernels) that times a pass or a
step with --gpu (refused unless --mfu). Serving sizes the engines' own state allocators (analytic/serving_state.py).

Vision-language models (Qwen2.5-VL, Qwen3-VL, Gemma 3 with images; spec.vision, models/vlm.py) add an image encoder
beside the language model: a patch embedding, attention blocks over each image's patches (Qwen2.5-VL: windowed but
at four blocks), a merger or pooling projector, Qwen3-VL's deepstack mergers, and the image tokens in the language
model's sequence. Qwen2.5-VL's memory and FLOPs are modelled (analytic/vlm.py: the tower's parameters, the language
model over text + image tokens, the tower's saved tensors, prefill high point and FLOPs; tests/analytic/
test_vlm_analytic.py), and so are Gemma 3's (analytic/siglip.py: the SigLIP tower, the pooling projector, the
language model's materialised image-block masks), and so are Qwen3-VL's (analytic/qwen3vl_tower.py: LayerNorm
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
images -2.5 % under AVX2 (its forward scratch, as large as the 16-bit pixel rows). The op list has no tower kernels, so timing
a VLM is refused. Measured before Qwen2.5-VL's terms (hidden 128, a 2-block tower of width 64, one
112-pixel image per sample, CUDA semantics): analytic -31 % of the traced training peak, -22 % to -24 % in prefill.

T5 / Flan-T5 / mT5 (transformers models/t5/modeling_t5.py T5ForConditionalGeneration) is an encoder-decoder: an
encoder stack over --seq tokens (bidirectional self-attention) and a decoder stack over --target-seq tokens (causal
self-attention, then cross-attention whose K and V are projected from the encoder's output), the relative position
bias computed by each stack's first block ((1, heads, q, k), T5Attention.compute_bias) and passed to every later
block as the attention mask's additive term, dropout_rate on the embeddings, attention probabilities and every
branch; in inference the decoder's self-attention cache and the cross-attention cache (K/V over the encoder's tokens
in every decoder block, EncoderDecoderCache). Its inference memory and prefill FLOPs are modelled
(analytic/encoder_decoder.py: both stacks' high points, the relative bias's bucketing and additive masks, both
caches, lm_head over every target position; tests/analytic/test_encoder_decoder_analytic.py, within 0.04 % of the
trace), its kernels are not (unmodelled_kernels: timing refused), and its training is refused in one line
(encoder_decoder.check_trainable: both stacks' saved tensors, the shared bias's gradient, the dropout masks). The
training gap measured at the families matrix's test size (hidden 128, 2 + 12 blocks, batch 2 x 128 + 128 target
tokens) with the engine's one-stack terms: the analytic peak -59.6 % (amp-bf16, CPU) to -66.7 % (bf16, CUDA) of the
traced one (inference: -13.6 %, bf16, CUDA, before encoder_decoder.py).
BART (models/bart/modeling_bart.py BartForConditionalGeneration) has the same two stacks (post-norm, with a learned
position table and layernorm_embedding per stack instead of the relative bias): -54.3 % to -54.5 % in training, -3.0 %
in inference at the same size. Whisper (models/whisper/modeling_whisper.py) reads log-mel frames through two conv1d
before its encoder blocks: -46.5 % to -50.2 % in training, -5.6 % in inference (128 encoder positions).
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
    if spec.vision is not None:
        out.append("the vision tower's kernels (the op list and step time; Qwen2.5-VL's, Qwen3-VL's and Gemma 3's "
                   "memory and FLOPs are modelled: estimate without --gpu)")
    if spec.encdec is not None and encoder_decoder.modelled(spec):
        out.append("an encoder-decoder's kernels (the op list and step time: the cross-attention, the relative "
                   "position bias; T5's inference memory is modelled: estimate without --gpu)")
    if spec.hybrid is not None and spec.hybrid.mamba_layers:
        out.append("the Mamba-2 scan's kernels (the op list and step time; its memory and FLOPs are modelled: "
                   "estimate without --gpu, or with --mfu)")
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
