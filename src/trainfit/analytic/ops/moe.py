"""The sparse MoE block: router, dispatch, grouped expert GEMMs, combine, and the shared expert."""
from __future__ import annotations

import math
from dataclasses import replace

from ...spec import ModelSpec
from ..activations import FP32, INDEX
from .activation import activation
from .cast import autocast_inputs
from .clamped_swiglu import clamped_swiglu, expert_bias
from .op import Op, Shape, gemm, memory
from .te_casts import te_casts

def expert_dims(spec: ModelSpec, sh: Shape, etp: int | None = None) -> tuple:
    """(hidden, activation bytes, tokens T, experts E, top_k, an expert's width over tp (over `etp` where given),
    local experts E/ep, rows of each local expert's GEMMs on the busiest rank (busiest_per_expert), the rows its
    experts receive in all).
    `etp`: Megatron's expert tensor-parallel degree (ops/megatron_moe.py): under sequence parallelism a rank holds
    T / tp of the TP group's T tokens, sends their copies to the experts, and its expert-TP group gathers what its
    etp ranks received (token_dispatcher.py:691-701 at core_v0.16.1, AG over the expert-TP group), each expert's
    width split etp ways: T·etp / tp tokens' copies at 1/etp of the width (T at 1/tp where etp = tp). The gather
    runs whatever the sequence parallelism (`if self.tp_size > 1`, tp_size the expert-TP group's, :72-76): at tp 1
    the etp ranks hold different sequences, T·etp copies' rows (MoE with tp > 1 is modelled as under SP)."""
    m = spec.moe
    t = etp or sh.tp
    tokens = sh.tokens * t / sh.tp
    local = max(1, m.num_experts // sh.ep)
    per_expert = busiest_per_expert(sh, m.top_k, local, tokens)
    return (spec.hidden, sh.act, sh.tokens, m.num_experts, m.top_k, m.expert_intermediate / t, local, per_expert,
            per_expert * local)


def moe_block(spec: ModelSpec, sh: Shape) -> list[Op]:
    """The sparse MoE block (integrations/moe.py grouped_mm experts; router modeling_mixtral.py:105-107). With
    --ep the rank runs E/ep experts on the routed copies it receives: the busiest rank's, sh.moe_load times the
    balanced T·top_k (analytic/moe_imbalance.py), since every rank waits for it at the combine. The router, the
    dispatch gather and the combine run on the rank's own T·top_k copies (Megatron permutes and unpermutes on the
    source side: token_dispatcher.py MoEAlltoAllTokenDispatcher)."""
    m = spec.moe
    if m.experts_every_token:
        return every_expert_ops(spec, sh)
    h, a, T, e, k, i, local, per_expert, routed = expert_dims(spec, sh)
    src = "transformers integrations/moe.py grouped_mm experts"
    ops = autocast_inputs("router_in", T, h, 1, sh, "attn_out")
    ops.append(gemm("router", T, e, h, sh, "modeling_mixtral.py:105 router linear"))
    ops += [memory("router_softmax", T * e * a, T * e * FP32, "modeling_mixtral.py:106 softmax(fp32)", "router"),
            memory("router_topk", T * e * FP32, T * k * (FP32 + INDEX), "modeling_mixtral.py:107 topk", "router",
                saves=False),
            memory("dispatch", T * k * h * a + T * k * INDEX, T * k * h * a, src + " (hidden[perm // k])", saves=False)]
    gate = 2 if spec.gated_mlp else 1
    # grouped_mm is not autocast-enabled: transformers casts the input to the weights' dtype (moe.py:379), so under
    # autocast the experts run in the fp32 master weights' dtype (NB: TF32 peak where the GPU has it)
    ex = replace(sh, dtype="fp32") if sh.autocast else sh
    ops += _experts_gemm(gemm("experts_in", per_expert, gate * i, h, ex, src + " grouped_mm gate_up", batch=local,
                              fp8=bool(sh.te)), sh)
    if m.expert_bias:  # gpt-oss: per-expert biases gathered and added (clamped_swiglu.py)
        ops += expert_bias("experts_in_bias", routed, gate * i, local, sh)
    if m.swiglu_limit:  # gpt-oss's clamped SwiGLU
        ops += clamped_swiglu("experts_act", routed * i, sh, "experts_act")
    else:
        ops += activation(spec, "experts_act", routed * i, sh, "experts_act")
        if spec.gated_mlp:
            ops.append(memory("experts_mul", 2 * routed * i * a, routed * i * a, src, "experts_act",
                              (0, routed * i * a)))
    ops += _experts_gemm(gemm("experts_out", per_expert, h, i, ex, src + " grouped_mm down", batch=local,
                              fp8=bool(sh.te)), sh)
    if m.expert_bias:
        ops += expert_bias("experts_out_bias", routed, h, local, sh)
    ops += [memory("routing_weight", T * k * h * a + T * k * FP32, T * k * h * a, src + " · routing weight", "combine"),
            memory("combine", T * k * h * a + T * k * INDEX, T * h * a, src + " (out[inv_perm], sum over k)", "combine",
                saves=False)]
    if m.shared_intermediate:  # Qwen-MoE shared expert: a gated MLP scaled by sigmoid(gate(x)) (modeling_qwen2_moe.py)
        ops += shared_expert_ops(spec, sh, "modeling_qwen2_moe.py shared_expert")
        if m.shared_gate:
            ops += [gemm("shared_expert_gate", T, 1, h, sh, "modeling_qwen2_moe.py shared_expert_gate"),
                    memory("shared_scale", 2 * T * h * a, T * h * a, "modeling_qwen2_moe.py sigmoid gate", "combine")]
    return ops


def busiest_per_expert(sh: Shape, top_k: int, local: int, tokens: float | None = None) -> float:
    """Routed copies per local expert on the busiest expert-parallel rank: the balanced T·top_k/local times
    sh.moe_load (analytic/moe_imbalance.py), the extra copies in whole 16-token rows so that the imbalance changes
    the GEMMs' size and not the 16-byte alignment the balanced count has (roofline.gemm_seconds' unaligned
    fallback: a mean count landing on an odd number is not a kernel choice). NB: over-counts by < 16 copies."""
    balanced = (sh.tokens if tokens is None else tokens) * top_k / local
    return balanced + math.ceil((sh.moe_load - 1) * balanced / 16) * 16


def _experts_gemm(g: Op, sh: Shape) -> list[Op]:
    """A grouped expert GEMM, after Transformer Engine's casts where the recipe quantises it (Megatron's
    TEGroupedMLP: TEColumnParallelGroupedLinear / TERowParallelGroupedLinear, ops/te_casts.py)."""
    return (te_casts(g, sh) if sh.te else []) + [g]


def every_expert_ops(spec: ModelSpec, sh: Shape) -> list[Op]:
    """Llama 4's MoE block (modeling_llama4.py:141-166): the router linear, topk, scatter and fp32 sigmoid; the input
    repeated E times and multiplied by the score column; two torch.bmm over every expert on all T tokens
    (Llama4TextExperts.forward :78-81): the GPU computes all E experts' FLOPs (E/top_k the routed ones: model FLOPs
    and MFU stay on the top-k, analytic/flops.py); the sum over the E copies; the shared expert, a gated MLP.
    bmm is on autocast's lower-precision list, so its weights are cast (layer_forward's weight_casts)."""
    m = spec.moe
    h, t, a = spec.hidden, sh.tp, sh.act
    T, e, k = sh.tokens, m.num_experts, m.top_k
    i = m.expert_intermediate / t
    local = max(1, e // sh.ep)
    rows = T * local  # every local expert's copy of every token
    src = "modeling_llama4.py Llama4TextMoe / Llama4TextExperts"
    ops = autocast_inputs("router_in", T, h, 1, sh, "attn_out")
    ops.append(gemm("router", T, e, h, sh, "modeling_llama4.py:142 router linear"))
    ops += [memory("router_topk", T * e * a, T * k * (a + INDEX), "modeling_llama4.py:143 topk", "router",
                   saves=False),
            memory("router_sigmoid", T * e * a, T * e * FP32, "modeling_llama4.py:145 sigmoid(fp32)", "router"),
            memory("routed_repeat", T * h * sh.residual, rows * h * sh.residual, src + " repeat (:161)", "combine",
                   saves=False),
            memory("routed_scale", rows * h * sh.residual + rows * a, rows * h * sh.residual,
                   src + " · scores (:162)", "combine")]
    ops += autocast_inputs("bmm_in", rows, h, 1, sh, "combine")
    gate = 2 if spec.gated_mlp else 1
    ops.append(gemm("all_experts_in", T, gate * i, h, sh, src + " bmm gate_up (:79)", batch=local))
    ops += activation(spec, "all_experts_act", rows * i, sh, "experts_act")
    ops.append(memory("all_experts_mul", 2 * rows * i * a, rows * i * a, src + " up · act(gate) (:81)",
                      "experts_act", (0, rows * i * a)))
    ops.append(gemm("all_experts_out", T, h, i, sh, src + " bmm down (:81)", batch=local))
    ops.append(memory("all_experts_sum", rows * h * a, T * h * a, src + " sum over the copies (:166)", "combine",
                      saves=False))
    return ops + shared_expert_ops(spec, sh, "modeling_llama4.py:97-98 shared_expert")


def shared_expert_ops(spec: ModelSpec, sh: Shape, src: str) -> list[Op]:
    """The shared expert every token runs beside the routed ones: a gated MLP (gate and up, the activation, their
    product, down) of width shared_intermediate, split over TP."""
    h, a, T = spec.hidden, sh.act, sh.tokens
    s = spec.moe.shared_intermediate / sh.tp
    ops = [gemm("shared_gate", T, s, h, sh, src + " gate"), gemm("shared_up", T, s, h, sh, src + " up")]
    ops += activation(spec, "shared_act", T * s, sh, "shared_act")
    ops.append(memory("shared_mul", 2 * T * s * a, T * s * a, src, "shared_act", (0, T * s * a)))
    ops.append(gemm("shared_down", T, h, s, sh, src + " down"))
    return ops
