"""Architecture features the analytic engine has no terms for yet: a spec that has one is refused with one line
(the trace engine builds the real transformers model and covers it). `unmodelled_memory` lists what the memory
formulas lack, `unmodelled_kernels` what only the op list (kernels, step time) lacks: an estimate without a GPU
times nothing and needs the former only.

Qwen3-Next (transformers models/qwen3_next/modeling_qwen3_next.py): its memory and FLOPs are modelled
(analytic/gated_deltanet.py: the Gated DeltaNet layers' saved tensors, no-grad high points and per-sequence conv +
recurrent state; activations.py: the gated attention's sigmoid gate; families.json: the zero-centred RMSNorm's fp32
normalised tensor); the op list has no Gated DeltaNet kernels (in_proj_qkvz/ba, the depthwise conv, the chunked
rule's batched matmuls and triangular solves, the gated norm), so timing it is refused.

Llama 4 (llama4_text) is modelled, not refused: its all-experts MoE (analytic/moe_every_expert.py; ops/moe.py
every_expert_ops), its q/k L2 norm (activations.py; ops/norm.py NORMS "l2"), its chunked layers' masked SDPA
(activations.masked_chunk_share; ops/layer.py chunk_mask_ops), its complex fp32 RoPE (ops/layer.py rope_shape,
families.json rotary_complex) and Maverick's interleaved dense/MoE layers (memory.interleaved_moe). NB: the NoPE
layers' temperature scaling of q saves a (1, s, 1, 1) fp32 scale per layer, not counted.

Nemotron-H (transformers models/nemotron_h/modeling_nemotron_h.py) interleaves Mamba-2 blocks (NemotronHMamba2Mixer,
:390-613) with attention and MLP blocks. Its inference memory is modelled (hybrid_inference.py, mamba2.py: the
scan's live tensors at the prefill's high point, the conv + SSM state per sequence and Mamba block as cache, K and V
for the attention blocks only; small-nemotron_h within 0.03 % of the trace (-2.5 % under amp-bf16 on a CPU with
oneDNN's bf16 path: the scan's batched-bmm scratch), tiny-nemotron-h within 0.5 %). Training
is not: the mixer's in_proj split into z, x|B|C and dt, the depthwise causal conv1d and SiLU, the chunked selective
scan (mamba2_chunk_scan, :273-378: dt softplus and clamp, A * dt cumulative sums, segment-sum decays of
(b, heads, chunks, chunk, chunk), the per-chunk states (b, chunks, heads, head_dim, d_state)), the D skip, the gated
RMSNorm and out_proj, all saved for backward, have no terms; nor have the scan's kernels in the op list
(analytic/ops) that times a pass (so inference with --gpu is refused too, unless --mfu). Serving sizes the engines'
own state allocators (analytic/serving_state.py).
Measured gap at the families matrix's test size (Nemotron-H 47B's flags at hidden 128: one Mamba-2 block of 8 heads
x 64, state 256, 8 groups, and one attention block; batch 2 x 128), with the refusal lifted: the analytic training
peak -58.3 % to -85.4 % of the traced one (every precision and recompute policy, CPU and CUDA semantics).

Vision-language models (Qwen2.5-VL, Qwen3-VL, Gemma 3 with images; spec.vision, models/vlm.py) add an image encoder
beside the language model: a patch embedding, attention blocks over each image's patches (Qwen2.5-VL: windowed but
at four blocks), a merger or pooling projector, Qwen3-VL's deepstack mergers, and the image tokens in the language
model's sequence. Qwen2.5-VL's memory and FLOPs are modelled (analytic/vlm.py: the tower's parameters, the language
model over text + image tokens, the tower's saved tensors, prefill high point and FLOPs; tests/analytic/
test_vlm_analytic.py); the op list has no tower kernels, so timing a VLM is refused. Qwen3-VL's tower (a learned
position table resampled per image, LayerNorm/GELU blocks, deepstack mergers) and Gemma 3's SigLIP tower and pooling
projector have no terms: refused. Measured before Qwen2.5-VL's terms (hidden 128, a 2-block tower of width 64, one
112-pixel image per sample, CUDA semantics): analytic -31 % of the traced training peak, -22 % to -24 % in prefill.
"""
from __future__ import annotations

from ..errors import SetupError
from ..spec import ModelSpec
from . import vlm


def unmodelled_features(spec: ModelSpec, mode: str = "train") -> list[str]:
    """The features of `spec` the analytic formulas do not cover in `mode` (empty: fully modelled): those of the
    memory formulas and those of the op list (kernels, step time)."""
    return unmodelled_memory(spec, mode) + unmodelled_kernels(spec)


def unmodelled_kernels(spec: ModelSpec) -> list[str]:
    """Features whose memory is modelled (in some mode) but whose kernels the op list (analytic/ops/) does not list."""
    out = []
    if spec.linear_attn is not None:
        out.append("the Gated DeltaNet layers' kernels (the op list and step time; their memory and FLOPs are "
                   "modelled: estimate without --gpu)")
    if spec.vision is not None:
        out.append("the vision tower's kernels (the op list and step time; Qwen2.5-VL's memory and FLOPs are "
                   "modelled: estimate without --gpu)")
    if spec.hybrid is not None and spec.hybrid.mamba_layers:
        out.append("the Mamba-2 scan's kernels (the op list and step time; inference memory and FLOPs are modelled: "
                   "estimate without --gpu, or with --mfu)")
    return out


def unmodelled_memory(spec: ModelSpec, mode: str = "train") -> list[str]:
    """The features of `spec` the memory formulas do not cover in `mode`."""
    out = []
    if spec.vision is not None and spec.vision.family not in vlm.MODELLED_TOWERS:
        out.append("a vision tower (the image encoder's patch embedding, attention blocks and merger or projector, "
                   "and its image tokens in the language model's sequence)")
    if spec.hybrid is not None and spec.hybrid.mamba_layers and mode != "infer":
        # inference memory is modelled (hybrid_inference.py, mamba2.py); training's saved tensors are not
        out.append("Mamba-2 blocks in training (the chunked scan's saved tensors)")
    return out


def check_modelled(spec: ModelSpec, mode: str = "train", kernels: bool = True) -> None:
    """Refuse, in one line, a spec with a feature the analytic engine does not model in `mode`; `kernels` False:
    what the memory estimate needs only (no op list, no step time)."""
    missing = unmodelled_features(spec, mode) if kernels else unmodelled_memory(spec, mode)
    if missing:
        raise SetupError(f"{spec.name}: the analytic engine does not model {', '.join(missing)} "
                         f"({spec.family}); use --engine trace (the real transformers model on fake tensors)")
