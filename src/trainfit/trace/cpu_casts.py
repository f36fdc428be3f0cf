"""Scratch copies that CPU TensorIterator kernels allocate for mixed-dtype inputs.

On CPU, an element-wise op whose inputs have different dtypes (bf16 activations + fp32 residual
under autocast, fp32 scores + bf16 mask...) first copies every input whose dtype differs from the
common dtype into a new tensor of that dtype (aten/src/ATen/TensorIterator.cpp, compute_types:
`op.tensor().to(common_dtype_)` when common_device is CPU), and for an in-place op whose output dtype
differs it computes into a temporary output of the common dtype and copies back. Those copies live
only inside the kernel, so the dispatch-level recorder never sees them, but the allocator does (and
a real CPU peak can sit inside such an op: e.g. Gemma-2 amp-bf16 prefill, where it was 5% of the
peak). CUDA's TensorIterator casts on the fly and allocates nothing: only counted for CPU runs.
"""
from __future__ import annotations

import torch

aten = torch.ops.aten

_BINARY = ("add", "sub", "mul", "div", "maximum", "minimum", "pow", "remainder", "fmod", "atan2",
           "eq", "ne", "lt", "le", "gt", "ge", "addcmul", "addcdiv", "lerp", "logical_and", "logical_or")


def _overloads() -> frozenset:
    ops = set()
    for name in _BINARY:
        for n in (name, name + "_"):
            packet = getattr(aten, n, None)
            if packet is None:
                continue
            for o in packet.overloads():
                if o.startswith("Tensor") or o in ("default", "Tensor_Tensor", "Scalar_Tensor"):
                    ops.add(getattr(packet, o))
    ops.add(aten.where.self)
    return frozenset(ops)


PROMOTING = _overloads()


def _category(dtype: torch.dtype) -> int:
    return 3 if dtype.is_complex else 2 if dtype.is_floating_point else 0 if dtype is torch.bool else 1


def common_dtype(ts) -> torch.dtype:
    """torch's type promotion over tensors (no Python scalars): dimensioned tensors decide, unless a
    0-dim tensor is of a higher category (float over int...). Done by hand: building probe tensors
    here would dispatch ops from inside the recorder's hook."""
    dimmed = [t.dtype for t in ts if t.dim() > 0]
    zero = [t.dtype for t in ts if t.dim() == 0]
    r = None
    for d in dimmed:
        r = d if r is None else torch.promote_types(r, d)
    z = None
    for d in zero:
        z = d if z is None else torch.promote_types(z, d)
    if r is None:
        return z
    if z is not None and _category(z) > _category(r):
        return z
    return r


def cast_scratch(func, args, out) -> int:
    """Bytes of the input (and in-place output) copies a CPU kernel makes for `func(*args)`; 0 if none."""
    ts = [a for a in (args[1:] if func is aten.where.self else args) if isinstance(a, torch.Tensor)]
    if len(ts) < 2:
        return 0
    d0 = ts[0].dtype
    if all(t.dtype == d0 for t in ts[1:]):
        return 0
    common = common_dtype(ts)
    size = common.itemsize
    scratch = sum(t.numel() * size for t in ts if t.dtype != common)
    if func._schema.name.endswith("_") and isinstance(out, torch.Tensor) and out.dtype != common:
        scratch += out.numel() * size  # in-place op: computed into a common-dtype temporary, copied back
    return scratch
