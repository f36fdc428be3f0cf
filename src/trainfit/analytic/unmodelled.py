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

Llama 4 (transformers models/llama4/modeling_llama4.py) brings four at once:
  * the MoE runs every expert on every token (Llama4TextMoe.forward: `hidden_states.repeat(E, 1)` times the router
    scores, 0 off the top-k, then Llama4TextExperts' two torch.bmm over all E experts): E copies of the MoE
    activations where the engine's MoE terms (analytic/moe.py) count top_k dispatched copies;
  * RoPE in complex fp32 (apply_rotary_emb: `xq.float()` viewed as complex, multiplied, cast back);
  * Llama4TextL2Norm on q and k of the RoPE layers (fp32, no weight);
  * the NoPE layers' attention-temperature scaling of q (an fp32 scale per position, then a product).
Measured gap at the families matrix's test size (tests/analytic/test_vs_trace_families.py, hidden 128, 4 experts
top-2, batch 2 × 128): the analytic peak -7.6 % to -16.1 % of the traced one in training and -25 % in prefill.

gpt-oss (transformers models/gpt_oss/modeling_gpt_oss.py) brings two:
  * attention sinks in eager attention (GptOssPreTrainedModel._supports_sdpa = False; eager_attention_forward: the
    (b, heads, s, s) scores, the sinks expanded to a column and torch.cat'ed to them, the row max subtracted, the
    softmax, the probabilities sliced back): several (b, heads, s, s + 1) tensors where the engine's eager moments
    (activations.py) count the scores and probabilities of a plain softmax;
  * the clamped SwiGLU experts (GptOssExperts._apply_gate: strided gate/up slices, two clamps, sigmoid(alpha * gate),
    gate * sigmoid, up + 1, the product; each expert's biased gate_up and down matmuls and the routing-weight product
    in its own loop step) where analytic/moe.py counts a plain SwiGLU's saved tensors.
Measured gap at the families matrix's test size (hidden 128, 4 experts top-2, batch 2 × 128): the analytic peak
-5.1 % to -15.3 % of the traced one in training (-0.2 % where the optimizer step is the peak), -23.6 % to -30.3 % in
prefill.

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
"""
from __future__ import annotations

from ..errors import SetupError
from ..spec import ModelSpec


def unmodelled_features(spec: ModelSpec, mode: str = "train") -> list[str]:
    """The features of `spec` the analytic formulas do not cover in `mode` (empty: fully modelled): those of the
    memory formulas and those of the op list (kernels, step time)."""
    return unmodelled_memory(spec, mode) + unmodelled_kernels(spec)


def unmodelled_kernels(spec: ModelSpec) -> list[str]:
    """Features whose memory is modelled (in some mode) but whose kernels the op list (analytic/ops/) does not list."""
    out = []
    if spec.hybrid is not None and spec.hybrid.mamba_layers:
        out.append("the Mamba-2 scan's kernels (the op list and step time; inference memory and FLOPs are modelled: "
                   "estimate without --gpu, or with --mfu)")
    return out


def unmodelled_memory(spec: ModelSpec, mode: str = "train") -> list[str]:
    """The features of `spec` the memory formulas do not cover in `mode`."""
    out = []
    if spec.moe is not None and spec.moe.experts_every_token:
        out.append("an MoE whose every expert runs every token (Llama4TextExperts' batched bmm)")
    if spec.qk_l2_norm_layers:
        out.append("L2-normalised q/k")
    if spec.attn_temperature:
        out.append("the NoPE layers' attention-temperature scaling")
    if spec.nope_layers or spec.attention_chunk:
        out.append("interleaved chunked/NoPE attention layers")
    if spec.attn_sinks:
        out.append("attention sinks (a per-head logit column in eager attention)")
    if spec.moe is not None and spec.moe.swiglu_limit:
        out.append("the clamped SwiGLU experts (gpt-oss GptOssExperts)")
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
