"""gpt-oss's experts (no torch): the clamped SwiGLU between biased grouped GEMMs, and its top-k-then-softmax router.

transformers 5.24 runs GptOssExperts (modeling_gpt_oss.py:68-114, `@use_experts_implementation(is_concatenated=False,
is_transposed=True, has_bias=True)`) through the grouped_mm experts forward (integrations/moe.py:424-540), as every
MoE family (moe.py), with gpt-oss's own gate (GptOssExperts._apply_gate, modeling_gpt_oss.py:82-88):
  biases    `self.gate_up_proj_bias[expert_ids_g]` and `self.down_proj_bias[expert_ids_g]` (moe.py:480, :508): each
            index keeps the sorted expert ids (int64, one per routed copy) for its backward; the gathered rows are
            added in place to the grouped GEMM's output (`out.add_(bias)`, :419) and freed with the local;
  gate      gate, up = gate_up[..., ::2], gate_up[..., 1::2] (strided views of the (S, 2i) GEMM output);
            gate.clamp(max=limit) and up.clamp(-limit, limit) (each keeps its input, the view: gate_up's storage);
            gate * alpha (a scalar: keeps nothing), sigmoid (keeps its output), gate * sigmoid (keeps both), up + 1
            (keeps nothing), (up + 1) * glu (keeps both): per routed copy gate_up (2i) and five i-wide tensors —
            the clamped gate, the sigmoid, glu, up + 1 and the product (down's input) — where a plain SwiGLU keeps
            gate_up, act(gate) and the product (moe.py: 4i);
  router    GptOssTopKRouter.forward (modeling_gpt_oss.py:126-130): F.linear with a bias, topk over the logits (keeps
            its int64 indices), softmax over the k top values in their own dtype (keeps its output): no softmax over
            every expert.
NB: the gate's backward is not a moment here (the two strided halves' gradients, each a zero-filled (S, 2i), then
summed): an under-count where the peak falls inside it (not in the families matrix, nor at 1 x 2048).
"""
from __future__ import annotations

from ..spec import ModelSpec

INDEX = 8


def saved_intermediates(spec: ModelSpec) -> int:
    """i-wide tensors the gate keeps per routed copy, gate_up's own 2i included (a plain SwiGLU's: 4, moe.py)."""
    return 7 if spec.moe.swiglu_limit else 4


def bias_index_bytes(spec: ModelSpec) -> int:
    """Per routed copy, the sorted expert ids the bias gathers keep (both index the same tensor): 0 without expert
    biases."""
    return INDEX if spec.moe.expert_bias else 0


def topk_softmax_router(spec: ModelSpec, logits: int) -> float:
    """Per token, what GptOssTopKRouter keeps: topk's indices and the softmax over the k top values (in the logits'
    dtype, `logits` bytes)."""
    return (INDEX + logits) * spec.moe.top_k


def prefill_gate_live(spec: ModelSpec) -> int:
    """i-wide tensors live per routed copy as the gate's last product is made in a no-grad forward (read off the
    traced prefill of small-gpt_oss): gate_up (2i) and the gathered gate_up bias (2i, the local `selected_biases`
    until the down projection's gather replaces it), the two clamps, glu, up + 1 and the product (alpha·gate and the
    sigmoid were freed by their one reader): 9 (a plain SwiGLU: gate_up, act(gate), the product: 4)."""
    bias = 2 if spec.moe.expert_bias else 0
    return (7 if spec.moe.swiglu_limit else 4) + bias


def rerun_gate_extra(spec: ModelSpec, ex: int, act: int) -> float:
    """Per token, at the gate's last product in a re-run (full recomputation) forward: beside the layer's saved set
    (all of it counted), the gate's transients — the gathered gate_up bias (2i, the local `selected_biases`) and
    the clamped up (i, a local of _apply_gate: `up + 1` keeps nothing) — and the grouped experts' locals (histc's input, 4 bytes
    per routed copy: float on CPU, int32 on CUDA; the router's logits, bound to `_` by GptOssMLP.forward:143); less
    what the layer saves later: down's output (h) and the inverse permutation (int64) per routed copy (read off the
    trace of small-gpt_oss, bf16 with full recompute on CPU, where this moment sets the peak)."""
    m = spec.moe
    k, h, i = m.top_k, spec.hidden, m.expert_intermediate
    bias = 2 * i if m.expert_bias else 0
    return k * (ex * (bias + i - h) + 4 - INDEX) + act * m.num_experts


def prefill_router(spec: ModelSpec, act: int, weights: int) -> float:
    """Per token, the router's and the dispatch's tensors live through the experts in a no-grad forward (read off
    the traced prefill of small-gpt_oss): the router logits (bound to `_` by GptOssMLP.forward:143, the activations'
    dtype), topk's indices and the top-k softmax; the sort's values and permutation, the gathered routing weights
    (`weights` bytes) and histc's input (4 bytes: float on CPU, int32 on CUDA) per routed copy
    (integrations/moe.py:440-449)."""
    m = spec.moe
    return act * m.num_experts + (INDEX + act) * m.top_k + (2 * INDEX + weights + 4) * m.top_k
