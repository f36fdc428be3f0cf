"""torchtitan's MoE block as it runs (torchtitan 0.2.2 models/moe/moe.py, utils.py; analytic/torchtitan_moe.py
counts what it saves): the forward kernels of one MoE layer on the busiest expert-parallel rank.

What differs from transformers' block (ops/moe.py), kernel by kernel:
- the router's scores are cast to fp32 and softmaxed or sigmoided there (:328-333); the reorder counts, sorts and
  divides the expert ids (histc twice, argsort, floor_divide: :348, :377-383, :439);
- the experts' input is padded: a copy with a zero row appended (vstack) gathered into T·k + 8 rows per local
  expert (utils.py:41-58 _permute), cast to bf16 twice where it is not bf16 (one cast for w1, one for w3), each
  expert matrix cast to bf16 where it is not (:123-128); w1 and w3 are separate grouped GEMMs, in bf16 whatever the
  step's dtype, on the padded rows; the output is cast back (`.type_as(x)`) and scattered into a fresh tensor
  (utils.py:62-66 _unpermute), then into a zeroed (T·k, h) one (:460-465);
- the combine is a bmm of the top-k scores by an fp32 copy of the outputs (:469-476; autocast casts both to its
  dtype), cast back to x's dtype; llama4's scores multiply the routed input before the experts instead (:441-445)
  and the combine is a sum over the k copies (:480).
Under expert parallelism ExpertParallel's _permute (distributed/expert_parallel.py) pads and gathers in place of
indices_padding_wrapper: the same kernels over the received rows.
NB: bf16 steps without FSDP run autocast, whose bmm casts its fp32 operands (analytic/torchtitan_moe.autocast); the
Shape does not say whether FSDP is on, so the bmm is timed in fp32 unless the step autocasts fp32 weights: over by
its fp32 bytes there.
"""
from __future__ import annotations

from dataclasses import replace

from ...spec import ModelSpec
from ..activations import FP32, INDEX
from ..torchtitan_moe import BF16, INT32, pad_rows
from .activation import activation
from .cast import autocast_inputs
from .clamped_swiglu import clamped_swiglu, expert_bias
from .moe import expert_dims, shared_expert_ops
from .op import Op, Shape, gemm, memory

SRC = "torchtitan 0.2.2 models/moe/"


def torchtitan_moe_block(spec: ModelSpec, sh: Shape) -> list[Op]:
    """The forward kernels of torchtitan's MoE block (module docstring); sh.moe_scored: the model's MoEArgs set
    score_before_experts (llama4)."""
    m, scored = spec.moe, sh.moe_scored
    h, a, T, e, k, i, local, per_expert, rows = expert_dims(spec, sh)
    r = sh.residual
    padded = pad_rows(rows, local)  # the padded rows the grouped GEMMs run on
    ops = autocast_inputs("router_in", T, h, 1, sh, "attn_out")
    ops.append(gemm("router", T, e, h, sh, SRC + "moe.py:325 gate"))
    ops += [memory("router_scores", T * e * a, T * e * FP32, SRC + "moe.py:328-333 scores.to(fp32), softmax/sigmoid",
                   "router", kernels=1 + (a != FP32)),
            memory("router_topk", T * e * FP32, T * k * (FP32 + INDEX), SRC + "moe.py:336-346 topk, gather",
                   "router", saves=False),
            memory("reorder", 3 * T * k * INDEX, 2 * T * k * INDEX + 2 * e * INDEX,
                   SRC + "moe.py:348, :377-383, :439 histc (twice), argsort, floor_divide", "router", saves=False,
                   kernels=4, grad=False),
            memory("dispatch", T * k * (h * r + INDEX), T * k * h * r, SRC + "moe.py:439 x[indices // top_k]",
                   saves=False)]
    if scored:
        ops.append(memory("score_in", T * k * (h * r + FP32), T * k * h * (FP32 + r),
                          SRC + "moe.py:441-445 routed_input.to(fp32) * scores, .to(x.dtype)", "combine",
                          kernels=1 + 2 * (r != FP32)))
    ops += [memory("pad", rows * h * r, (rows + 1) * h * r, SRC + "utils.py:54 vstack((x, zeros))", saves=False),
            memory("permute", padded * (h * r + INT32), padded * h * r, SRC + "utils.py:56 x[permuted_indices]",
                   saves=False)]
    gptoss = bool(m.swiglu_limit or m.expert_bias)  # gpt_oss's GptOssGroupedExperts (gptoss_experts)
    if r != BF16:
        n = 1 if gptoss else 2
        ops.append(memory("experts_in_bf16", n * padded * h * r, n * padded * h * BF16,
                          SRC + "moe.py:123, :126 x.bfloat16() (twice; gpt_oss's once)", kernels=n, saves=False))
    if sh.weight != BF16:
        x = 3 * local * h * i / sh.tp
        ops.append(memory("experts_w_bf16", x * sh.weight, x * BF16, SRC + "moe.py:123-128 w.bfloat16()", kernels=3,
                          saves=False))
    ex = replace(sh, dtype="bf16", act=BF16)  # the grouped GEMMs and their activation in bf16 (moe.py:123-128)
    g = padded / local
    if gptoss:
        ops += gptoss_experts(ex, g, padded, h, i, local)
    else:
        ops.append(gemm("experts_w1", g, i, h, ex, SRC + "moe.py:123 grouped_mm w1", batch=local))
        ops += activation(spec, "experts_act", padded * i, ex, "experts_act")
        ops.append(gemm("experts_w3", g, i, h, ex, SRC + "moe.py:125 grouped_mm w3", batch=local))
        ops.append(memory("experts_mul", 2 * padded * i * BF16, padded * i * BF16,
                          SRC + "moe.py:125 silu(w1 x) * w3 x", "experts_act"))
        ops.append(gemm("experts_w2", g, h, i, ex, SRC + "moe.py:128 grouped_mm w2", batch=local))
    if r != BF16:
        ops.append(memory("experts_out_cast", padded * h * BF16, padded * h * r, SRC + "moe.py:128 .type_as(x)",
                          saves=False))
    ops += [memory("unpermute", padded * (h * r + INT32), (rows + 1) * h * r,
                   SRC + "utils.py:62-66 new_empty, index_put", saves=False),
            memory("unsort", T * k * (h * r + INDEX), 2 * T * k * h * r, SRC + "moe.py:460-465 zeros, index_put",
                   saves=False, kernels=2)]
    if scored:
        ops.append(memory("combine_sum", T * k * h * r, T * h * r, SRC + "moe.py:480 sum over the k copies",
                          "combine", saves=False))
    else:
        w = a if sh.autocast else FP32
        casts = (r != FP32) + (w != FP32) * 2  # .float() of the outputs; autocast's casts of both operands
        ops.append(memory("combine_bmm", T * k * (h * r + FP32) + (w != FP32) * T * k * (h + 1) * FP32,
                          T * h * w + (r != FP32) * T * k * h * FP32 + (w != FP32) * T * k * (h + 1) * w,
                          SRC + "moe.py:469-476 bmm(top_scores, routed_output.float())", "combine",
                          kernels=1 + casts))
        if w != r:
            ops.append(memory("combine_cast", T * h * w, T * h * r, SRC + "moe.py:474 .to(x.dtype)", "combine",
                              saves=False))
    if m.shared_intermediate:
        ops += shared_expert_ops(spec, sh, SRC + "moe.py:45-68 FeedForward (shared_experts)")
        ops.append(memory("shared_add", T * h * (a + r), T * h * r, SRC + "moe.py:482 out + out_experts", "combine",
                          saves=False))
    return ops


def gptoss_experts(ex: Shape, g: float, padded: float, h: int, i: int, local: int) -> list[Op]:
    """torchtitan's gpt_oss experts (models/gpt_oss/model/moe.py:142-176), in bf16 on the padded rows: mlp1's one
    grouped GEMM 2·I wide, its per-expert bias, the clamped interleaved SwiGLU, mlp2 and its bias. NB: the biases
    and the SwiGLU are timed as transformers' gpt-oss kernels (ops/clamped_swiglu.py: a gather and an add per
    bias); torchtitan's repeat_interleave, cat of the tail rows and out-of-place add pass over the rows once more:
    predicted faster by that memory traffic."""
    src = "torchtitan 0.2.2 models/gpt_oss/model/moe.py"
    return [gemm("experts_mlp1", g, 2 * i, h, ex, src + ":155-157 grouped_mm mlp1", batch=local),
            *expert_bias("experts_mlp1_bias", padded, 2 * i, local, ex),
            *clamped_swiglu("experts_act", padded * i, ex, "experts_act"),
            gemm("experts_mlp2", g, h, i, ex, src + ":166 grouped_mm mlp2", batch=local),
            *expert_bias("experts_mlp2_bias", padded, h, local, ex)]
