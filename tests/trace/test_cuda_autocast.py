"""CUDA autocast's fp32 lists, and its lower-precision list beyond CPU's (einsum), in a CUDA-semantics trace
(trace/cuda_autocast.py).

Truth: aten/src/ATen/autocast_mode.h (AT_FORALL_FP32: pow, layer_norm, ...; AT_FORALL_FP32_SET_OPT_DTYPE: softmax,
sum, ...; AT_FORALL_LOWER_PRECISION_FP: mm, linear, ...), which CUDA autocast applies and CPU autocast does not, and
an H200 measurement (bench/results/gpu/H200-2026-11-26-unrecorded-2-truth.json: gpt2 amp-bf16 at 2 x 1024 held 458 MiB more than a
CPU-autocast trace predicted; the trace with these lists is within 0.75 %).
"""
import contextlib
import math

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from trainfit.trace.cuda_autocast import CudaAutocastLists


def _dtypes():
    x = torch.randn(4, 8, dtype=torch.bfloat16)
    w = torch.randn(8, 8, dtype=torch.float32)
    return {"pow": torch.pow(x, 3.0).dtype, "pow_method": x.pow(2).dtype, "layer_norm": F.layer_norm(x, (8,)).dtype,
            "softmax": F.softmax(x, dim=-1).dtype, "sum": x.sum().dtype, "tanh": torch.tanh(x).dtype,
            "linear": F.linear(x.float(), w).dtype}


def test_cpu_autocast_alone_keeps_bf16():
    with torch.autocast("cpu", dtype=torch.bfloat16):
        d = _dtypes()
    assert d["pow"] == d["layer_norm"] == d["softmax"] == d["sum"] == torch.bfloat16


def test_cuda_lists_run_the_fp32_ops_in_fp32():
    with CudaAutocastLists(), torch.autocast("cpu", dtype=torch.bfloat16):
        d = _dtypes()
    fp32 = {k for k, v in d.items() if v == torch.float32}
    # AT_FORALL_FP32 (pow, layer_norm) and AT_FORALL_FP32_SET_OPT_DTYPE (softmax, sum) in fp32; tanh is on no list
    # (stays bf16); linear is on the lower-precision list (bf16 from an fp32 input)
    assert fp32 == {"pow", "pow_method", "layer_norm", "softmax", "sum"}
    assert d["tanh"] == d["linear"] == torch.bfloat16


def test_cuda_lists_do_nothing_without_autocast():
    with CudaAutocastLists():
        d = _dtypes()
    assert d["pow"] == d["softmax"] == d["sum"] == torch.bfloat16 and d["linear"] == torch.float32


def test_an_explicit_dtype_is_kept():
    x = torch.randn(4, 8, dtype=torch.bfloat16)
    with CudaAutocastLists(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert F.softmax(x, dim=-1, dtype=torch.float64).dtype == torch.float64


class _NewStorages(TorchDispatchMode):
    """(op, dtype, shape) of every tensor an op returns in a storage none of its inputs has: the copies."""

    def __init__(self):
        super().__init__()
        self.made = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        out = func(*args, **(kwargs or {}))
        self.made += [(func, t.dtype, tuple(t.shape)) for t in tree_leaves(out)
                      if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs]
        return out


def _einsum_copies(cuda_lists: bool):
    """The Mamba-2 scan's last einsum (transformers modeling_nemotron_h.py:359, C_times_states) on fp32 operands under
    CPU autocast, with or without CUDA's lists: its output dtype and the copies it makes of C, whose permuted layout
    (b, c, h, l, n) bmm needs is not viewable."""
    c, states = torch.randn(2, 2, 16, 4, 8), torch.randn(2, 2, 4, 6, 8)
    made = _NewStorages()
    with contextlib.ExitStack() as stack:
        if cuda_lists:
            stack.enter_context(CudaAutocastLists())
        stack.enter_context(torch.autocast("cpu", dtype=torch.bfloat16))
        with made:
            out = torch.einsum("bclhn,bchpn->bclhp", c, states)
    return out.dtype, [(func, dtype) for func, dtype, shape in made.made if math.prod(shape) == c.numel()]


def test_einsum_is_cast_before_its_operands_are_copied():
    """CUDA autocast lists einsum (autocast_mode.cpp KERNEL_CUDA(einsum, lower_precision_fp)): C is cast to bf16
    before einsum permutes it, so the permuted copy bmm multiplies is 16-bit. CPU autocast lists bmm only
    (KERNEL_CPU(bmm, lower_precision_fp)): einsum copies the fp32 C, and bmm casts the copy."""
    aten = torch.ops.aten
    dtype, copies = _einsum_copies(cuda_lists=True)
    assert dtype == torch.bfloat16
    assert copies == [(aten._to_copy.default, torch.bfloat16), (aten.clone.default, torch.bfloat16)]
    dtype, copies = _einsum_copies(cuda_lists=False)
    assert dtype == torch.bfloat16
    assert copies == [(aten.clone.default, torch.float32), (aten._to_copy.default, torch.bfloat16)]
