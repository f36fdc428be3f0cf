"""Cost functions around a projection's GEMM: torchao's float8 casts before it and after its backward."""
from __future__ import annotations

from ..activations import FP32
from .op import Op, Shape, memory

def fp8_casts(linear: Op, sh: Shape) -> list[Op]:
    """torchao Float8Linear (float8/float8_linear.py, tensorwise dynamic scaling): before the fp8 GEMM each operand
    gets an amax reduction and a scaled cast to fp8 (input: T·k, weight: k·n). Compiled, amax and cast stay two
    passes (the amax must finish before the cast), so fused == eager bytes."""
    a, w = sh.act, sh.weight
    x, wt = linear.m * linear.k * linear.batch, linear.k * linear.n * linear.batch
    src = "torchao float8 tensorwise scaling (amax + cast)"
    return [memory(f"{linear.name}.amax_x", x * a, FP32, src, grad=False),
            memory(f"{linear.name}.cast_x", x * a, x, src, grad=False),
            memory(f"{linear.name}.amax_w", wt * w, FP32, src, grad=False),
            memory(f"{linear.name}.cast_w", wt * w, wt, src, grad=False)]

def fp8_backward_extra(ops: list[Op], sh: Shape) -> list[Op]:
    """Float8Linear's backward (float8_linear.py:113-195): dY's amax and fp8 cast, and the transposed fp8 copies the
    two backward GEMMs read (dYᵀ, xᵀ; the weight's cast re-used). Transformer Engine's: te_casts.te_backward_extra."""
    if sh.te:
        from .te_casts import te_backward_extra

        return te_backward_extra(ops, sh)
    out = []
    for op in ops:
        if op.kind == "gemm" and op.dtype == "fp8":
            dy, x = op.m * op.n * op.batch, op.m * op.k * op.batch
            src = "torchao float8_linear.py:113-195 backward casts"
            out += [memory(f"{op.name}.amax_dy", dy * sh.act, FP32, src, saves=False),
                    memory(f"{op.name}.cast_dy", dy * sh.act, 2 * dy, src, saves=False),
                    memory(f"{op.name}.cast_xT", x * sh.act, x, src, saves=False)]
    return out
