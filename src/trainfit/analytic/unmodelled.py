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
:390-615) with attention and MLP blocks: in training the mixer's in_proj split into z, x|B|C and dt, the depthwise
causal conv1d and SiLU, the chunked selective scan (torch_forward: dt softplus and clamp, A * dt cumulative sums,
segment-sum decays of (b, heads, chunks, chunk, chunk), the per-chunk states (b, chunks, heads, head_dim, d_state)),
the D skip, the gated RMSNorm and out_proj; in inference a constant-size state per sequence and Mamba block (the conv
state, conv_dim x (conv_kernel - 1) or conv_kernel, and the fp32 SSM state, heads x head_dim x d_state) beside the
attention blocks' K and V. The engine has none of these terms.
Measured gap at the families matrix's test size (hidden 128; one Mamba-2 block of 8 heads x 64, state 128, 8 groups,
and one attention block; batch 2 x 128), with the refusal lifted: the analytic peak -46.9 % to -62.7 % of the traced
one in training and -64.4 % to -79.6 % in prefill (the peak falls in the Mamba block's scan).

T5 / Flan-T5 (transformers models/t5/modeling_t5.py T5ForConditionalGeneration) is an encoder-decoder: an encoder
stack over --seq tokens (bidirectional self-attention) and a decoder stack over --target-seq tokens (causal
self-attention, then cross-attention whose K and V are projected from the encoder's output), the relative position
bias computed by each stack's first block ((1, heads, q, k), T5Attention.compute_bias) and passed to every later
block as the attention mask's additive term, dropout_rate on the embeddings, attention probabilities and every
branch; in inference the decoder's self-attention cache and the cross-attention cache (K/V over the encoder's tokens
in every decoder block, EncoderDecoderCache). The engine's terms describe one stack of one sequence.
Measured gap at the families matrix's test size (hidden 128, 2 + 2 blocks, batch 2 x 128 + 128 target tokens), with
the refusal lifted: the analytic peak -59.6 % (amp-bf16, CPU) to -66.7 % (bf16, CUDA) of the traced one in training,
-13.6 % in inference (bf16, CUDA).
BART (models/bart/modeling_bart.py BartForConditionalGeneration) has the same two stacks (post-norm, with a learned
position table and layernorm_embedding per stack instead of the relative bias): -54.3 % to -54.5 % in training, -3.0 %
in inference at the same size. Whisper (models/whisper/modeling_whisper.py) reads log-mel frames through two conv1d
before its encoder blocks: -46.5 % to -50.2 % in training, -5.6 % in inference (128 encoder positions).
"""
from __future__ import annotations

from ..errors import SetupError
from ..spec import ModelSpec


def unmodelled_features(spec: ModelSpec) -> list[str]:
    """The features of `spec` the analytic formulas do not cover (empty: fully modelled)."""
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
    if spec.encdec is not None:
        out.append("encoder-decoder stacks (the decoder's cross-attention over the encoder output, two stacks"
                   + (", T5's relative position bias)" if spec.encdec.relative_buckets else ")"))
    if spec.hybrid is not None and spec.hybrid.mamba_layers:
        out.append("Mamba-2 blocks (the chunked selective scan and the per-sequence conv + SSM state)")
    return out


def check_modelled(spec: ModelSpec) -> None:
    """Refuse, in one line, a spec with a feature the analytic engine does not model."""
    missing = unmodelled_features(spec)
    if missing:
        raise SetupError(f"{spec.name}: the analytic engine does not model {', '.join(missing)} "
                         f"({spec.family}); use --engine trace (the real transformers model on fake tensors)")
