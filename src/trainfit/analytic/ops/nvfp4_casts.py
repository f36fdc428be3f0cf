"""The quantise kernels of torchao's NVFP4Linear around one converted projection (--low-precision nvfp4 on
--stack torchtitan --stack-release 2026-08; analytic/nvfp4.py has the recipe's sources), as memory-bound ops with
the bytes torchao's kernels move (torchao 0.18 prototype/moe_training/nvfp4_training/, paths below relative to it).

One NVFP4 operand of E elements is E/2 bytes of e2m1 codes and E/16 bytes of e4m3 block scales (the swizzled scale
tensors are (rows/128, cols/64, 32, 16) bytes: hadamard_quantize_row_col_triton.py:379-388,
quantize_2d_triton.py:252-260): low_precision.RECIPES["nvfp4"].quantised_bytes.

Forward (nvfp4_linear.py:99-136), x: T×k bf16 input, w: n×k bf16 weight:
  * amax_x      triton_rht_amax (hadamard_amax_triton.py:161-236): one pass over x, the Hadamard-transformed and
                the plain absolute maxima, two fp32 scalars out;
  * cast_x      triton_rht_quantize_row_col (hadamard_quantize_row_col_triton.py:229-414): one pass over x writing
                its rowwise codes (the forward GEMM's) and its RHT'd columnwise codes (saved for wgrad);
  * amax_w      w.float().abs().max() (nvfp4_linear.py:45), one reduction of w when compiled (NB: eager runs three
                kernels, an fp32 copy, abs and max: under-counted as one pass, as ops/torchao_casts.py's mxfp8 dim0);
  * cast_w      triton_weight_quantize_2d (quantize_2d_triton.py:210-281): one pass over w writing the rowwise
                (forward) and the transposed (dgrad, saved) codes, 16×16 block scales stored per 1×16.
Backward (nvfp4_linear.py:166-229): dy: T×n bf16 gradient:
  * amax_dy, cast_dy  the same two kernels over dy, with stochastic rounding: the rowwise codes for dgrad, the RHT'd
                columnwise codes for wgrad. dgrad and wgrad read the saved codes: no other cast.
NB: the 16-point Hadamard transform (32 FLOPs per element, fused in the kernels) is taken as free beside the bytes
(16 FLOPs per byte read, far below any GPU's ridge point); the per-tensor scale's few scalar ops are left out.
"""
from __future__ import annotations

from ...low_precision import RECIPES
from ..activations import FP32
from .op import Op, Shape, memory

NVFP4 = RECIPES["nvfp4"]
_SRC = "torchao 0.18 nvfp4_training (analytic/ops/nvfp4_casts.py)"


def _pair(prefix: str, name: str, elements: float, src_bytes: int, backward: bool, amaxes: int = 2) -> list[Op]:
    """One operand's amax pass (reads it, `amaxes` fp32 scalars out: triton_rht_amax's two, the weight's max one)
    and its row + column quantise pass (reads it, writes two NVFP4 copies)."""
    kw = {"saves": False} if backward else {"grad": False}
    return [memory(f"{prefix}.amax_{name}", elements * src_bytes, amaxes * FP32, _SRC, **kw),
            memory(f"{prefix}.cast_{name}", elements * src_bytes, 2 * NVFP4.quantised_bytes(elements), _SRC, **kw)]


def forward_casts(g: Op, sh: Shape) -> list[Op]:
    """The forward's quantise kernels before one converted GEMM `g` (T = g.m·g.batch rows, k inputs, n outputs)."""
    tokens = g.m * g.batch
    return _pair(g.name, "x", tokens * g.k, sh.act, False) + _pair(g.name, "w", g.k * g.n * g.batch, sh.weight,
                                                                     False, amaxes=1)


def backward_casts(g: Op, sh: Shape) -> list[Op]:
    """The backward's quantise kernels of one converted GEMM: its gradient's amax and row + column quantise pass."""
    return _pair(g.name, "dy", g.m * g.batch * g.n, sh.act, True)
