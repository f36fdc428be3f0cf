"""Cost functions around a projection's GEMM: torchao's float8 casts before it and after its backward."""
from __future__ import annotations

from ..activations import FP32
from .op import Op, Shape, memory

def fp8_casts(linear: Op, sh: Shape, shared_input: bool = False) -> list[Op]:
    """torchao Float8Linear (float8/float8_linear.py, tensorwise dynamic scaling): before the fp8 GEMM each operand
    gets an amax reduction and a scaled cast to fp8 (input: T·k, weight: k·n). Compiled, amax and cast stay two
    passes (the amax must finish before the cast), so fused == eager bytes. Under torchtitan's Float8 TP
    (float8_tp) a column-parallel linear's input is its block's, cast once on the rank's sequence shard before the
    all-gather and read already cast by each linear of the block (`shared_input`: not again)."""
    a, w = sh.act, sh.weight
    x, wt = linear.m * linear.k * linear.batch, linear.k * linear.n * linear.batch
    src = "torchao float8 tensorwise scaling (amax + cast)"
    out = []
    if float8_tp(sh) and linear.tp_split == "col":
        x /= sh.tp  # PrepareFloat8ModuleInput's cast of the Shard(1) block input
        src = "torchao float8_tensor_parallel.py:170-230 PrepareFloat8ModuleInput (torchtitan parallelize.py:224-239)"
        if shared_input:
            x = 0.0
    if x:
        out += [memory(f"{linear.name}.amax_x", x * a, FP32, src, grad=False),
                memory(f"{linear.name}.cast_x", x * a, x, src, grad=False)]
    return out + [memory(f"{linear.name}.amax_w", wt * w, FP32, src, grad=False),
                  memory(f"{linear.name}.cast_w", wt * w, wt, src, grad=False)]


def float8_tp(sh: Shape) -> bool:
    """torchtitan's tensorwise Float8 TP (models/llama3/infra/parallelize.py:190-205: Float8ColwiseParallel,
    Float8RowwiseParallel, PrepareFloat8ModuleInput with a tensorwise recipe under TP): sequence-parallel, cast before
    the gathers both ways (parallel/tensor.py)."""
    return sh.float8 and sh.lp in ("", "tensorwise") and sh.tp > 1 and sh.sp and not sh.te


def fp8_backward_extra(ops: list[Op], sh: Shape) -> list[Op]:
    """Float8Linear's backward (float8_linear.py:113-195): dY's amax and fp8 cast, and the transposed fp8 copies the
    two backward GEMMs read (dYᵀ, xᵀ; the weight's cast re-used). Transformer Engine's: te_casts.te_backward_extra."""
    if sh.te:
        from .te_casts import te_backward_extra

        return te_backward_extra(ops, sh)
    out = []
    tp = float8_tp(sh)
    for op in ops:
        if op.kind == "gemm" and op.dtype == "fp8":
            dy, x = op.m * op.n * op.batch, op.m * op.k * op.batch
            src = "torchao float8_linear.py:113-195 backward casts"
            if tp and op.tp_split == "row":
                # Float8RowwiseParallel casts the output gradient on its sequence shard before the backward's
                # all-gather (float8_tensor_parallel.py:138-152 NoopFwToFloat8BwDynamic); the linear reads it cast
                # (float8_linear.py:107, :158) and transposes the gathered fp8 for its wgrad
                out += [memory(f"{op.name}.amax_dy", dy / sh.tp * sh.act, FP32, src, saves=False),
                        memory(f"{op.name}.cast_dy", dy / sh.tp * sh.act, dy / sh.tp, src, saves=False),
                        memory(f"{op.name}.dyT", dy, dy, src, saves=False, access="transpose")]
            else:
                out += [memory(f"{op.name}.amax_dy", dy * sh.act, FP32, src, saves=False),
                        memory(f"{op.name}.cast_dy", dy * sh.act, 2 * dy, src, saves=False)]
            # the input's transposed fp8 for the wgrad: from the gathered fp8 input under Float8 TP's
            # column-parallel linears (float8_linear.py:179), else cast from the high-precision input
            out.append(memory(f"{op.name}.cast_xT", x * (1 if tp and op.tp_split == "col" else sh.act), x, src,
                              saves=False))
    return out
