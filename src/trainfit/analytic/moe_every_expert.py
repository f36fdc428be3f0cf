"""What Llama 4's MoE block saves for backward: every expert runs every token (no torch).

transformers models/llama4/modeling_llama4.py (5.24):
  router   Llama4Router.forward (:147-152): a Linear to E logits, topk (its int64 indices), a -inf tensor with the
           top values scattered in (scatter_ saves the indices: the same tensor), sigmoid of its fp32 copy (the fp32
           output saved), cast back to the logits' dtype;
  routed   Llama4TextMoe.forward (:166-174): `hidden_states.repeat(E, 1)` (E copies of the block input, saved by the
           multiply), times the router scores as an (E·T, 1) column (`transpose(0, 1).reshape(-1, 1)`: a contiguous
           copy in the logits' dtype, saved too): the product is the experts' input;
  experts  Llama4TextExperts.forward (:66-84): torch.bmm over all E experts on E·T rows, saving its input (under
           autocast bmm's own 16-bit cast; autocast also caches the gate_up_proj and down_proj casts: bmm is on its
           lower-precision list), gate_up (E·T, 2I) (act(gate) and up are views of it, each saving it), act(gate) and
           the product (the second bmm's input); the output's sum over the E copies saves nothing;
  shared   Llama4TextMLP (:88-103): gate_proj, up_proj, act, product, down_proj as a dense gated MLP.
Read off traces of the families matrix's shrunk Llama 4 (hidden 128, 4 experts, top-2, I 256, 2 × 128 tokens:
bf16, amp-bf16 and fp32 per module, exact). The E copies are what every token costs whatever top_k: the routed
experts' zero-scored copies are computed and saved like the others.
NB: with tensor parallelism the block's terms are split as moe.py's are (parallel/tensor.py term_divisors), and expert
parallelism is not modelled here (every rank is taken to hold every expert): transformers' Llama 4 TP plan is not
checked against these terms.
"""
from __future__ import annotations

from ..setup import Setup
from ..spec import ModelSpec
from .precision import state_bytes

FP32 = 4
INDEX = 8


def every_expert_block(spec: ModelSpec, setup: Setup) -> tuple[dict, float]:
    """({"linear_inputs": bytes per token, "mlp": bytes per token}, fixed bytes) saved by one Llama 4 MoE block, as
    analytic/moe.py moe_block returns them. "linear_inputs": the block input as the linears save it (once without
    autocast: router, gate_proj and up_proj share it; under autocast each linear its own 16-bit cast)."""
    m = spec.moe
    st = state_bytes(setup)
    a, r, amp = st.act, st.residual, st.autocast
    h, e, k, i, s = spec.hidden, m.num_experts, m.top_k, m.expert_intermediate, m.shared_intermediate
    inputs = (3 if amp else 1) * a * h
    router = FP32 * e + INDEX * k  # sigmoid's fp32 output, topk's indices (:149-151)
    # the repeated input (in the block input's dtype: the norm's output, fp32 under autocast), the score column
    # (the logits' dtype: a), then bmm's input (the product itself, or autocast's 16-bit cast of the fp32 product)
    routed = e * (r * h + a + a * h)
    experts = e * a * (2 * i + i + i)  # gate_up, act(gate), the product
    shared = 4 * a * s  # Llama4TextMLP: gate out, act(gate), up out, product
    fixed = a * (e * h + 3 * e * h * i + 3 * h * s) if amp else 0  # autocast's weight casts: router, experts, shared
    return {"linear_inputs": inputs, "mlp": router + routed + experts + shared}, fixed


def every_expert_moments(spec: ModelSpec, setup: Setup, tokens: int, pending: float, recomputed: float) -> list:
    """The MoE block's backward high points (backward.Moment).

    (a) At the experts' product rule (Llama4TextExperts.forward `up * act_fn(gate)`, :82): the shared expert ran its
    backward first (it was recorded last, Llama4TextMoe.forward :172-173), its gradients made and its saved tensors
    freed; the second bmm's backward made its input gradient (E·T × I) and the down_proj gradient (all experts),
    freeing the product; the product rule adds the two operands' gradients (E·T × I each). Beside them the shared
    expert's gradient of the block input (T × h, the input's dtype) waits in autograd's input buffer for the experts'
    and the router's. Read off the trace of the shrunk Llama 4 (fp32, full recompute, CPU semantics: the live tensors
    at its peak, one by one). Under autocast the weight casts those backwards read went with them (the shared
    expert's three and its two input casts, the experts' down_proj cast: autocast_mode.cpp cached_cast keeps them
    only through the saved tensors once the region has exited; read off the amp-bf16 trace, all freed by then).
    (b) With full recomputation, the end of the layer's re-run forward: torch.utils.checkpoint's non-reentrant
    recompute stops once the last saved tensor is made again (torch/utils/checkpoint.py:1128-1131, early_stop on by
    default: :362), here the shared expert's down_proj input and weight (its output never made). Beside the whole
    saved set: the gradients made before the re-run starts (their ops save nothing) — the layer output's, its cast
    to the MoE branch's dtype where the residual stream's differs (the residual add's backward,
    Llama4TextDecoderLayer.forward :441; torch/csrc/autograd/engine.cpp validate_outputs casts a gradient to its
    input's dtype), and the routed output's, expanded over the E copies and made contiguous (the `.sum(dim=0)` of
    :173 and the reshape/view before it) — and the re-run frames' locals no op saved: the attention output (:425,
    the residual add saves nothing), the router's logits and scores (:148-152), the experts' output (`routed_out`,
    :171), and under autocast the MoE input (the norm's output: the linears save their casts) and the scored copies
    (`routed_in`, :170: the promoted dtype, fp32; bmm saves its own 16-bit cast). Read off the trace of the shrunk
    Llama 4 amp-bf16 (full recompute, CUDA and CPU semantics: the peak, at the shared down_proj's weight cast).
    `pending`: the layer output's gradient, waiting for the attention branch."""
    from .backward import Moment  # noqa: PLC0415 (backward imports moe's peers)

    m, st, t = spec.moe, state_bytes(setup), setup.tp
    a, r, h, e = st.act, st.residual, spec.hidden, m.num_experts
    sp = t if setup.sequence_parallel else 1
    rows = e * tokens  # every expert's copy of every token
    shared_saved = 4 * a * m.shared_intermediate * tokens / t
    if st.autocast:  # the weight casts and the shared expert's input casts, freed with their backwards
        shared_saved += a * (3 * h * m.shared_intermediate + e * m.expert_intermediate * h) / t
        shared_saved += 2 * a * h * tokens / sp
    grads = 2 * a * rows * m.expert_intermediate / t  # three gradients made, the product freed
    done = (e * h * m.expert_intermediate + 3 * h * m.shared_intermediate) / t
    shared_grad = r * h * tokens / sp
    moments = [Moment(recomputed + pending + shared_grad + grads, done, shared_saved)]
    if setup.recompute == "full":
        made = (a * h * tokens / sp if r != a else 0) + a * rows * h / t  # the output's cast, the expanded gradient
        held = a * h * tokens / sp + 2 * a * e * tokens / t + a * rows * h / t  # attention out, router, routed_out
        if st.autocast:
            held += r * h * tokens / sp + max(r, a) * rows * h / t  # the MoE input, the scored copies
        moments.append(Moment(recomputed + pending + made + held, 0.0))
    return moments


def every_expert_prefill(spec: ModelSpec, setup: Setup) -> float:
    """Per token, the MoE block's high point in a no-grad forward: at the experts' product (Llama4TextExperts.forward
    :82, `up * self.act_fn(gate)`), the E copies of the input times the scores (the repeat freed, rebound by
    Llama4TextMoe.forward :169-170; in the block input's dtype, fp32 under autocast, whose 16-bit bmm cast went
    with the first bmm), gate_up (E × 2I), act(gate) and the product (E × I each); the router's logits (returned),
    fp32 sigmoid and scores (E each), its top-k values and indices. The shared expert runs after (:172), on T rows."""
    m, st = spec.moe, state_bytes(setup)
    a, r = st.act, st.residual
    e, i = m.num_experts, m.expert_intermediate
    routed = e * (r * spec.hidden + 4 * a * i)
    router = (2 * a + FP32) * e + (a + INDEX) * m.top_k
    return routed + router
