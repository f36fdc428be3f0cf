"""The quantise kernels of torchao's recipes around a converted projection's GEMMs, and the GEMMs' dtypes
(analytic/torchao_recipes.py has the recipes' sources; tensorwise's casts stay gemm.py's).

Bytes per cast: a float8 recipe's amax reduction reads the bf16 operand and writes its scales, then the scaled cast
reads it again and writes 1 byte per element and the scales (two passes, eager and compiled: the amax must finish
before the cast); eager, the dgrad weight and both wgrad operands are then copied to the layout _scaled_mm reads. An
MX cast is one pass (the 32-element block's amax and the cast in one kernel), at its kernel's measured rate: dim0
to_mx compiled, dim1 torchao's CUDA kernel, --mx-scale rceil's dim0 clamping in inductor at 0.57 of floor's
(stacks/torchtitan.toml [low_precision] mx_cast_kernels; kernels.toml access). NB: eager mxfp8_cublas casts along
dim0 with torch ops (to_mx: abs, amax, divide, clamp, cast: several passes): under-counted as one (compiled, as
torchtitan runs it, inductor fuses them). NB: the scales' tiny reductions and the swizzle of MX scales for cuBLAS
are left out (a few launches per linear).
"""
from __future__ import annotations

from typing import NamedTuple

from ...low_precision import RECIPES, Recipe
from ..activations import FP32
from .gemm import fp8_backward_extra, fp8_casts
from .nvfp4_casts import backward_casts as nvfp4_backward, forward_casts as nvfp4_forward
from .op import Op, Shape, memory


class Cast(NamedTuple):
    """One quantisation of a GEMM operand. operand: "x" (T·k input), "w" (k·n weight), "dy" (T·n gradient); rows: the
    operand dim along which one scale each ("T", "k", "n"; "" = one per tensor); passes: 2 = an amax reduction then
    the scaled cast, 1 = one kernel doing both (MX's 32-element blocks); copy: in eager a transposed copy of the
    fp8 result follows (preprocess_addmm)."""

    name: str
    operand: str
    rows: str
    passes: int
    copy: bool = False
    tensorwise: bool = False
    dim1: bool = False  # MX: the transposing cast (its own kernel: Shape.mx_casts[1]), else along dim0


# forward and backward casts per recipe (sources: analytic/torchao_recipes.py docstring)
_FWD = {
    "rowwise": (Cast("x", "x", "T", 2), Cast("w", "w", "n", 2)),
    "rowwise_with_gw_hp": (Cast("x", "x", "T", 2), Cast("w", "w", "n", 2)),
    "mxfp8": (Cast("x", "x", "T", 1), Cast("w", "w", "n", 1)),
}
_BWD = {
    # dgrad: dy along dim -1, w along dim -1 (copied); wgrad: dy and x along dim 0 (both copied)
    "rowwise": (Cast("dy", "dy", "T", 2), Cast("wT", "w", "k", 2, copy=True),
                Cast("dyT", "dy", "n", 2, copy=True), Cast("xT", "x", "k", 2, copy=True)),
    # dgrad only: the weight tensorwise; wgrad in bf16 (no casts)
    "rowwise_with_gw_hp": (Cast("dy", "dy", "T", 2), Cast("wT", "w", "", 2, copy=True, tensorwise=True)),
    # dim0 of dy; dim1 (transposing, one kernel each) of w, dy and x
    "mxfp8": (Cast("dy", "dy", "T", 1), Cast("wT", "w", "k", 1, dim1=True), Cast("dyT", "dy", "n", 1, dim1=True),
              Cast("xT", "x", "k", 1, dim1=True)),
}
# the backward GEMMs whose output torchao rescales itself: rowwise's dgrad and wgrad run without fast accumulation
# (float8/config.py:215-217 at torchao v0.18.0: only gemm_config_output sets use_fast_accum), and there
# addmm_float8_unwrapped calls cuBLAS's tensorwise _scaled_mm with unit scales and multiplies the output by the
# outer product of the two row scales afterwards (float8_ops.py:53-57, :84-85: "the rowwise CUTLASS-based kernel is
# so slow without fast-accum"); rowwise_with_gw_hp's dgrad has a tensorwise weight (no axiswise pair: no rescale).
# NB (predicted faster): the backward GEMMs without fast accumulation are timed at the fp8 fraction measured with it,
# and rowwise's forward GEMM (torch's CUTLASS rowwise kernel) at tensorwise cuBLAS's, which pytorch/pytorch#147971
# finds within 90-100 % for most shapes with a tail down to 50 %
_RESCALED = {"rowwise": ("dgrad", "wgrad")}
# the GEMMs that run in the recipe's format: (forward, dgrad, wgrad)
LOW_GEMMS = {"tensorwise": (True, True, True), "rowwise": (True, True, True),
              "rowwise_with_gw_hp": (True, True, False), "mxfp8": (True, True, True), "nvfp4": (True, True, True)}


def recipe_of(sh: Shape) -> Recipe | None:
    return RECIPES.get(sh.lp) if sh.float8 else None


def _dims(g: Op) -> dict[str, float]:
    return {"T": g.m * g.batch, "k": g.k, "n": g.n}


def _cast_ops(prefix: str, c: Cast, elements: float, rows: float, src_bytes: int, r: Recipe, sh: Shape,
              src: str, backward: bool) -> list[Op]:
    """One operand's quantisation: [amax pass (reads the operand, writes the scales)], the cast (reads the operand
    and its scales, writes the quantised elements and scales: Recipe.quantised_bytes), [eager: the transposed copy
    of the quantised tensor]."""
    rec = RECIPES["tensorwise"] if c.tensorwise else r
    q = rec.quantised_bytes(elements, int(rows) if rec.scale == "row" else 1)
    scales = q - elements * rec.element_bytes
    kw = {"saves": False} if backward else {"grad": False}
    out = []
    if c.passes == 2:
        out.append(memory(f"{prefix}.amax_{c.name}", elements * src_bytes, max(scales, FP32), src, **kw))
    # MX: the stack's dim0 / dim1 cast kernel, at its measured rate (Shape.mx_casts; kernels.toml access)
    access = sh.mx_casts[c.dim1] if sh.mx_casts else "vector"
    out.append(memory(f"{prefix}.cast_{c.name}", elements * src_bytes + (scales if c.passes == 2 else 0), q, src,
                      access=access, **kw))
    if c.copy and not sh.compile:
        out.append(memory(f"{prefix}.copy_{c.name}", q, q, "torchao float8/float8_ops.py:342-345 preprocess_addmm",
                          **kw))
    return out


def _operand_bytes(sh: Shape) -> dict[str, int]:
    return {"x": sh.act, "w": sh.weight, "dy": sh.act}


def quantise(g: Op, sh: Shape, shared_input: bool = False) -> tuple[list[Op], Op]:
    """A converted projection's forward: the casts before its GEMM and the GEMM at the recipe's dtype. tensorwise:
    ops/gemm.py's casts, the GEMM in fp8 (unchanged); `shared_input`: the GEMM before it read the same input."""
    r = recipe_of(sh)
    if r is not None and r.name == "nvfp4":  # NVFP4Linear's own kernels (ops/nvfp4_casts.py)
        g = g._replace(dtype=r.peak)
        return nvfp4_forward(g, sh), g
    if r is None or r.name == "tensorwise" or r.name not in _FWD:
        return fp8_casts(g, sh, shared_input), g
    g = g._replace(dtype=r.peak)
    d, b = _dims(g), _operand_bytes(sh)
    elements = {"x": d["T"] * g.k, "w": g.k * g.n * g.batch}
    src = f"torchao {r.name} forward casts (module docstring)"
    ops = [o for c in _FWD[r.name] for o in _cast_ops(g.name, c, elements[c.operand], d[c.rows] if c.rows else 1,
                                                        b[c.operand], r, sh, src, False)]
    return ops, g


def backward_extra(fwd: list[Op], sh: Shape) -> list[Op]:
    """The backward's quantise kernels of every converted projection of `fwd` (tensorwise: ops/gemm.py's)."""
    r = recipe_of(sh)
    if r is not None and r.name == "nvfp4":
        return [o for g in fwd if g.kind == "gemm" and g.dtype == r.peak for o in nvfp4_backward(g, sh)]
    if r is None or r.name == "tensorwise" or r.name not in _BWD:
        return fp8_backward_extra(fwd, sh)
    dtype, b = r.peak, _operand_bytes(sh)
    src = f"torchao {r.name} backward casts (module docstring)"
    out: list[Op] = []
    for g in fwd:
        if g.kind == "gemm" and g.dtype == dtype:
            d = _dims(g)
            elements = {"x": d["T"] * g.k, "w": g.k * g.n * g.batch, "dy": d["T"] * g.n}
            out += [o for c in _BWD[r.name] for o in _cast_ops(g.name, c, elements[c.operand],
                                                               d[c.rows] if c.rows else 1, b[c.operand], r, sh, src,
                                                               True)]
            out += _rescales(g, r, sh)
    return out


def _rescales(g: Op, r: Recipe, sh: Shape) -> list[Op]:
    """The rescale of each backward GEMM output torchao scales after the GEMM (_RESCALED): the dgrad's T·k input
    gradient (activation dtype) and the wgrad's k·n weight gradient (the weight's dtype). Compiled, inductor fuses
    the scales' outer product into the multiply: one kernel reading and writing the output ("at least one extra
    triton kernel per GEMM ... just for the rescaling": pytorch/ao#2184). Eager, the outer product is an fp32 tensor
    of the output's shape, then the in-place multiply reads both. NB: where inductor fuses the multiply into a
    pointwise consumer of the output it costs less (errs slow by up to that consumer's read)."""
    src = "torchao float8/float8_ops.py:53-57, :84-85 (addmm_float8_unwrapped: output *= post_inverse_scale)"
    d = _dims(g)
    sizes = {"dgrad": (d["T"] * g.k, sh.act), "wgrad": (g.k * g.n * g.batch, sh.weight)}
    out = []
    for which in _RESCALED.get(r.name, ()):
        n, nbytes = sizes[which]
        if sh.compile:
            out.append(memory(f"{g.name}.rescale_{which}", n * nbytes, n * nbytes, src, saves=False))
        else:
            out += [memory(f"{g.name}.rescale_scales_{which}", 0.0, n * FP32, src, saves=False),
                    memory(f"{g.name}.rescale_{which}", n * (nbytes + FP32), n * nbytes, src, saves=False)]
    return out


def backward_gemms(bwd: list[Op], sh: Shape) -> list[Op]:
    """ops.backward's GEMMs with the recipe's high-precision ones back in the compute dtype: rowwise_with_gw_hp's
    weight-gradient GEMM (torchao float8/config.py:364-368: both operands' scaling DISABLED)."""
    r = recipe_of(sh)
    if r is None or LOW_GEMMS.get(r.name, (True,) * 3)[2]:
        return bwd
    low = r.peak
    return [o._replace(dtype=sh.dtype) if o.kind == "gemm" and o.dtype == low and o.name.endswith(".wgrad") else o
            for o in bwd]
