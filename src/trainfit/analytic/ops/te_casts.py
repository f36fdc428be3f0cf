"""Transformer Engine's quantisation kernels around a TE linear's GEMM under --stack megatron --low-precision
(analytic/te_recipes.py has the recipes' memory; TE v2.9, transformer_engine/pytorch/...).

Forward, per linear: the input quantised once into rowwise data (the fprop GEMM) and columnwise data (saved for
wgrad) by one fused cast-transpose kernel (linear.py:216-228, layernorm_linear.py:186-193 input_quantizer usage
rowwise + columnwise); the weight quantised once per optimizer step, rowwise and columnwise, and reused by the
other micro-batches (module/base.py:1385-1438 get_weight_workspace, megatron extensions/transformer_engine.py:
671-678 is_first_microbatch): its bytes spread over the step's micro-batches (Shape.te_weight_share). Backward: dY
quantised rowwise (dgrad) and columnwise (wgrad) in one kernel (linear.py:567-569). Current scaling (tensorwise)
and NVFP4 (its per-tensor fp32 scale) read each tensor once more for its amax before the cast (TENSOR_AMAX); delayed
scaling casts with the scale from the amax history and records the amax in the same kernel; blockwise and MXFP8
compute each block's scale inside the cast.
NB: the norm-fused quantisation of linear_qkv's / linear_fc1's input (layernorm_linear.py:198-219 with_quantized_norm;
csrc/extensions/normalization.cpp:320-356: delayed scaling's norm writes fp8 directly, current scaling's computes
the amax in the norm kernel, MXFP8 / blockwise / NVFP4 with its Hadamard amax quantise after a bf16 norm) is counted
as a separate cast of the bf16 norm output: over-counts a read of T·h (and, current scaling, its amax pass) per
fused norm under delayed and current scaling. NB: per-tensor fp8
on sm100 writes one copy, not a transpose beside it: over-counts T·k per cast there. NB: delayed scaling's amax
all-reduce at the end of each autocast region (quantization.py:487-510 reduce_and_update_fp8_tensors, two small
all-reduces per micro-batch) is not timed.
"""
from __future__ import annotations

from ...low_precision import RECIPES
from ..activations import FP32
from .op import Op, Shape, memory

SRC = "Transformer Engine quantize (cast + transpose)"
# recipes whose quantizer runs an amax kernel over the whole tensor before the cast: csrc/quantizer.cpp:497-531
# (Float8CurrentScalingQuantizer::quantize_impl: nvte_compute_amax, then the scale, then the cast), :1438-1512
# (NVFP4Quantizer::quantize_impl: nvte_compute_amax / the Hadamard-transform amax for its per-tensor scale)
TENSOR_AMAX = ("tensorwise", "nvfp4")
# current scaling's amax is two launches, a one-thread kernel zeroing the amax for the atomic max and the reduction
# (common/recipe/current_scaling.cu:72-107 launch_amax_kernel), and its scale a third, one thread
# (current_scaling.cu:258 compute_scale_from_amax_kernel): csrc/quantizer.cpp:514-533 quantize_impl runs amax, scale,
# cast. NB: NVFP4 (quantizer.cpp:1507-1508 the same amax call, or the Hadamard-transform amax) stays at one launch
# for its amax, its scale kernels not counted: optimistic by their launches
AMAX_LAUNCHES = {"tensorwise": 2, "nvfp4": 1}
SCALE_LAUNCHES = {"tensorwise": 1}
# recipes whose block scales TE rearranges into cuBLAS's layout before every GEMM, both operands: pytorch/csrc/
# extensions/gemm.cpp:233-240 (general_gemm: swizzle_scaling_factors of A and of B, one kernel each), :484-491
# (te_general_grouped_gemm: multi_tensor_swizzle_scaling_factors of the A list and of the B list); csrc/util.cpp:
# 16-21 (MXFP8 and NVFP4 scales), :103-105 (the grouped form swizzles MXFP8 only); common/swizzle/swizzle.cu:250,
# :615-660 (64 tensors per multi-tensor launch)
SWIZZLED = ("mxfp8", "nvfp4")
SWIZZLED_GROUPED = ("mxfp8",)
# the quantize kernels whose rate is measured apart from the streaming one (kernels.toml access; a GPU without the
# class streams): MXFP8's rowwise + columnwise cast (common/cast/mxfp8/quantize_mxfp8.cuh), kernels.toml TEMXCAST
CAST_ACCESS = {"mxfp8": "te_mx_cast"}


def split_kernels(linear: Op, sh: Shape) -> int:
    """Quantise kernels of a grouped linear's `linear.kernels` splits (one per local expert: TEGroupedMLP):
    tex.split_quantize runs one fused multi-tensor cast-transpose for delayed scaling and one quantize per split
    for every other recipe (TE v2.9 pytorch/csrc/extensions/cast.cpp:117-147 multi_tensor_quantize_impl)."""
    return 1 if sh.te == "delayed" else int(linear.kernels)


def _quantise(name: str, elements: float, in_bytes: float, sh: Shape, kernels: int = 1) -> list[Op]:
    """One tensor (or `kernels` splits of it) quantised into rowwise and columnwise data: its amax pass (current
    scaling only) and the cast."""
    r = RECIPES[sh.te]
    out = [memory(f"{name}.amax", elements * in_bytes, FP32, SRC + ": per-tensor amax", grad=False, saves=False,
                  kernels=kernels * AMAX_LAUNCHES[r.name])] if r.name in TENSOR_AMAX else []
    if r.name in SCALE_LAUNCHES:
        out.append(memory(f"{name}.scale", FP32, FP32, SRC + ": scale from amax", grad=False, saves=False,
                          kernels=kernels * SCALE_LAUNCHES[r.name]))
    return out + [memory(f"{name}.cast", elements * in_bytes, 2 * elements * r.per_element, SRC, grad=False,
                         saves=False, kernels=kernels, access=CAST_ACCESS.get(r.name, "vector"))]


def swizzles(name: str, gemm: Op, a: float, b: float, sh: Shape) -> list[Op]:
    """The scale swizzles before one TE GEMM call of `gemm` (its `kernels` per-expert GEMMs: a grouped call) whose
    operands hold `a` and `b` elements: a kernel per operand (per 64 tensors of a grouped call) moving their block
    scales (SWIZZLED). A fused linear_qkv / linear_fc1 is one GEMM listed as its projections' (layer.py): the
    projections after the first (`shared_input` in te_casts, the same rows and input as the GEMM before in
    te_backward_extra) add none, though their own GEMMs stay listed."""
    r = RECIPES[sh.te]
    grouped = gemm.kernels > 1
    if r.name not in (SWIZZLED_GROUPED if grouped else SWIZZLED):
        return []
    scales = (a + b) / r.block * r.scale_bytes
    return [memory(f"{name}.swizzle", scales, scales, "Transformer Engine swizzle_scaling_factors (gemm.cpp:233-240, "
                   ":484-491)", grad=False, saves=False, kernels=2 * (-(-int(gemm.kernels) // 64) if grouped else 1))]


def te_casts(linear: Op, sh: Shape, shared_input: bool = False) -> list[Op]:
    """Before the GEMM: the input's quantisation (every micro-batch) and the weight's (once per optimizer step).
    `shared_input`: the projection reads the input the one before it read (q, k, v; gate, up), which Megatron's
    fused linear_qkv / linear_fc1 (one TE linear each, gpt_layer_specs.py) quantise once: no input cast of its own."""
    x, w = linear.m * linear.k * linear.batch, linear.k * linear.n * linear.batch
    # the weight's kernels run in the step's first micro-batch only: their bytes and launches spread over the others
    weight = [memory(o.name, o.reads * sh.te_weight_share, o.writes * sh.te_weight_share, o.source, grad=False,
                     saves=False, kernels=o.kernels * sh.te_weight_share, access=o.access)
              for o in _quantise(f"{linear.name}.w", w, sh.weight, sh, split_kernels(linear, sh))]
    if shared_input:
        return weight
    return _quantise(f"{linear.name}.x", x, sh.act, sh, split_kernels(linear, sh)) + weight + swizzles(
        linear.name, linear, x, w, sh)


def te_backward_extra(ops: list[Op], sh: Shape) -> list[Op]:
    """After each quantised GEMM's output gradient arrives: dY quantised rowwise and columnwise; the scale swizzles
    of its dgrad (dY and the weight) and wgrad (dY and the input) GEMMs."""
    out, prev = [], None
    for op in ops:
        if op.kind == "gemm" and op.dtype == RECIPES[sh.te].peak:
            dy, x, w = op.m * op.n * op.batch, op.m * op.k * op.batch, op.k * op.n * op.batch
            out += _quantise(f"{op.name}.dy", dy, sh.act, sh, split_kernels(op, sh))
            fused = prev is not None and op.kernels == 1 and (prev.m, prev.k, prev.batch) == (op.m, op.k, op.batch)
            if not fused:  # (a projection of the fused linear before it: its GEMMs are that linear's: swizzles)
                out += swizzles(f"{op.name}.dgrad", op, dy, w, sh) + swizzles(f"{op.name}.wgrad", op, dy, x, sh)
        if op.kind == "gemm":
            prev = op
    return out
