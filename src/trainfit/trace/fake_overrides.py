"""Fake kernels for ops whose meta implementation refuses inputs the real CPU kernel accepts, or makes other
tensors than it does.

`aten._grouped_mm` (transformers' MoE experts, "grouped_mm" implementation): its meta kernel checks
CUDA's constraint "inputs must be bf16", so an fp32 MoE step fails under FakeTensorMode although the
CPU kernel runs it. The output shape depends only on the operand shapes (the group offsets are
values), so we produce it here, with the kernel's own row padding to 16 bytes
(aten/src/ATen/native/GroupedMMUtils.h, create_grouped_gemm_output_tensor).
"""
from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensor

aten = torch.ops.aten


def _grouped_mm(func, args, kwargs):
    a, b = args[0], args[1]
    if not isinstance(a, FakeTensor):
        return func(*args, **kwargs)
    out_dtype = kwargs.get("out_dtype") or (args[4] if len(args) > 4 and args[4] is not None else a.dtype)
    if a.dim() == 2 and b.dim() == 3:  # ragged A: (M, K) x (G, K, N) -> (M, N)
        size = [a.shape[0], b.shape[-1]]
    elif a.dim() == 3 and b.dim() == 2:  # ragged B: (G, M, K) x (K, N) -> (M, N)
        size = [a.shape[1], b.shape[-1]]
    elif a.dim() == 2 and b.dim() == 2:  # ragged K: (M, K) x (K, N) -> (G, M, N), G = len(offs)
        offs = args[2] if len(args) > 2 else kwargs.get("offs")
        size = [offs.shape[0], a.shape[0], b.shape[-1]]
    else:  # batched: (G, M, K) x (G, K, N)
        size = [a.shape[0], a.shape[1], b.shape[-1]]
    align = max(1, 16 // out_dtype.itemsize)
    padded = (size[-1] + align - 1) // align * align
    stride = [padded, 1] if len(size) == 2 else [size[1] * padded, padded, 1]
    return torch.empty_strided(size, stride, dtype=out_dtype, device=a.device)


_HALF = (torch.bfloat16, torch.float16)


def _layer_norm(func, args, kwargs):
    """`aten.native_layer_norm` with a 16-bit input and fp32 weight or bias (a "mixed type" LayerNorm: ConvNeXt's
    norms after a 16-bit conv under CPU autocast): the CPU kernel keeps mean and rstd in fp32
    (aten/src/ATen/native/layer_norm.cpp layer_norm_cpu: `dtype = param_scalar_type(input, mixed_type)`), and so
    does CUDA's, in the accumulate type; the fake kernel (torch/_refs native_layer_norm) casts them to the input's
    dtype on every CPU input, 2 bytes short per row each. NB: a LayerNorm all in 16 bits keeps them 16-bit on CPU
    and fp32 on CUDA; left as the fake kernel makes them (CPU's)."""
    out, mean, rstd = func(*args, **kwargs)
    x = args[0]
    params = [p for p in (args[2:4] if len(args) > 2 else ()) if isinstance(p, torch.Tensor)]
    if isinstance(x, FakeTensor) and x.dtype in _HALF and any(p.dtype == torch.float32 for p in params):
        return out, mean.to(torch.float32), rstd.to(torch.float32)
    return out, mean, rstd


OVERRIDES = {aten._grouped_mm.default: _grouped_mm, aten.native_layer_norm.default: _layer_norm}
