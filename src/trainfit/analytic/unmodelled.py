"""Architecture features the analytic engine has no terms for yet: a spec that has one is refused with one line
(the trace engine builds the real transformers model and covers it).

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
oneDNN's bf16 path: the scan's batched-bmm scratch), tiny-nemotron-h within 0.5 %), and so is its training in fp32
and bf16 (hybrid_training.py, mamba2.scan_end_train: what autograd saves of the mixer, the scan's end in the forward
and in a re-run forward, the scan's backward high point; the families matrix's cases within 0.05 % of the trace).
Not modelled: training under autocast (refused in one line by hybrid_training.check_trainable: the scan's einsums
then run their bmm in bf16 and save 16-bit casts of their operands; the analytic peak read -59 % (CUDA) and -64 %
(CPU) before the Mamba-2 terms), the serving engines' state allocators, and the scan's kernels in the op list
(analytic/ops, mode "ops") that times a pass or a step with --gpu (refused unless --mfu).
"""
from __future__ import annotations

from ..errors import SetupError
from ..spec import ModelSpec


def unmodelled_features(spec: ModelSpec, mode: str = "train") -> list[str]:
    """The features of `spec` the analytic formulas do not cover in `mode` (empty: fully modelled). The op list
    (analytic/ops) asks with mode "ops": it times training steps and inference passes alike."""
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
    if spec.linear_attn is not None:
        out.append("Gated DeltaNet linear-attention layers (their conv and recurrent state)")
    if spec.attn_output_gate:
        out.append("the sigmoid output gate of gated attention")
    if spec.moe is not None and spec.moe.swiglu_limit:
        out.append("the clamped SwiGLU experts (gpt-oss GptOssExperts)")
    if spec.hybrid is not None and spec.hybrid.mamba_layers and mode not in ("infer", "train"):
        # inference and training memory are modelled (hybrid_inference.py, hybrid_training.py, mamba2.py); the
        # serving engines' state allocators and the scan's kernels in the op list (mode "ops") are not
        out.append("Mamba-2 blocks in serving and in the op list that times a pass or step with --gpu (the scan's "
                   "kernels; --mfu times it from FLOPs)")
    return out


def check_modelled(spec: ModelSpec, mode: str = "train") -> None:
    """Refuse, in one line, a spec with a feature the analytic engine does not model in `mode`."""
    missing = unmodelled_features(spec, mode)
    if missing:
        raise SetupError(f"{spec.name}: the analytic engine does not model {', '.join(missing)} "
                         f"({spec.family}); use --engine trace (the real transformers model on fake tensors)")
