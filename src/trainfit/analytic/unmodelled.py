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
    return out


def check_modelled(spec: ModelSpec) -> None:
    """Refuse, in one line, a spec with a feature the analytic engine does not model."""
    missing = unmodelled_features(spec)
    if missing:
        raise SetupError(f"{spec.name}: the analytic engine does not model {', '.join(missing)} "
                         f"({spec.family}); use --engine trace (the real transformers model on fake tensors)")
