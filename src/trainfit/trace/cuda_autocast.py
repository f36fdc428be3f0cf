"""CUDA autocast's fp32 op lists, for a `--device cuda` trace that runs CPU autocast on fake tensors.

CUDA and CPU autocast cast different ops. Both run matmuls, linear and SDPA in the lower precision; CUDA also casts
einsum, mv, addmv, addr, chain_matmul and linalg_multi_dot there (autocast_mode.cpp KERNEL_CUDA(..., lower_precision_fp),
absent from the CPU list), so an einsum's operands are cast before it permutes and copies them into its bmm: its
copies are 16-bit, where CPU autocast copies fp32 operands and casts the copies at the bmm (Nemotron-H's Mamba-2
scan, modeling_nemotron_h.py :325-359). CUDA (and the other devices on the generic lists) also runs a set of ops in fp32 that CPU autocast leaves in bf16/fp16
(aten/src/ATen/autocast_mode.h: AT_FORALL_FP32 — pow, exp, log, rsqrt, layer_norm, the losses...; and
AT_FORALL_FP32_SET_OPT_DTYPE — softmax, log_softmax, sum, cumsum, prod given no dtype run with dtype=float32).
Their outputs, and what their backward saves, are then fp32: e.g. GPT-2's tanh-GELU (`0.5*x*(1+tanh(c*(x+0.044715*
pow(x,3))))`, transformers NewGELUActivation) keeps fp32 copies on CUDA where CPU keeps bf16, and an eager attention
softmax outputs fp32. Measured on an H200 (torch 2.11, 2026-11-26): gpt2 amp-bf16 at batch 2 × 1024 held 458 MiB more
than a CPU-autocast trace; `bench/results/gpu/H200-2026-11-26-unrecorded-2-truth.json`.

The casts are applied at the Python function level (a TorchFunctionMode), above autograd, as autocast itself casts
before the op is recorded: the op then sees — and saves — fp32 tensors. NB: ops reached only from C++ composites
(not through a torch function call) are not re-cast; HF models call these at the Python level. RMSNorm is left to
cuda_kernels._cuda_rms_norm (torch.rms_norm's own CUDA kernel).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

_LOW = (torch.bfloat16, torch.float16)
T = torch.Tensor

# AT_FORALL_FP32, by the Python functions that reach those ops (method, function and operator forms)
FP32 = frozenset({
    torch.pow, T.pow, T.__pow__, T.__rpow__, torch.exp, T.exp, torch.expm1, T.expm1, torch.log, T.log, torch.log2,
    T.log2, torch.log10, T.log10, torch.log1p, T.log1p, torch.reciprocal, T.reciprocal, torch.rsqrt, T.rsqrt,
    torch.acos, T.acos, torch.asin, T.asin, torch.cosh, T.cosh, torch.sinh, T.sinh, torch.tan, T.tan, torch.erfinv,
    T.erfinv, F.softplus, F.layer_norm, torch.layer_norm, F.group_norm, torch.group_norm, torch.logsumexp, T.logsumexp,
    F.cosine_similarity, torch.cosine_similarity, torch.cdist, torch.dist, T.dist, torch.renorm, T.renorm,
    F.nll_loss, F.mse_loss, F.l1_loss, F.smooth_l1_loss, F.huber_loss, F.kl_div, F.binary_cross_entropy_with_logits,
    F.poisson_nll_loss, F.cosine_embedding_loss, F.hinge_embedding_loss, F.margin_ranking_loss,
    F.multilabel_margin_loss, F.soft_margin_loss, F.triplet_margin_loss, F.multi_margin_loss,
})
# AT_FORALL_FP32_SET_OPT_DTYPE: run with dtype=float32 when none is given
FP32_DTYPE = frozenset({
    torch.softmax, T.softmax, F.softmax, torch.log_softmax, T.log_softmax, F.log_softmax, torch.sum, T.sum,
    torch.cumsum, T.cumsum, torch.prod, T.prod, torch.cumprod, T.cumprod,
})


# CUDA's lower-precision list beyond CPU's (autocast_mode.cpp: KERNEL_CUDA(einsum | mv | addmv | addr | chain_matmul |
# linalg_multi_dot, lower_precision_fp); the RNN cells are left out (no model here calls them)
LOWER = frozenset({torch.einsum, torch.mv, T.mv, torch.addmv, T.addmv, torch.addr, T.addr, torch.chain_matmul,
                   torch.linalg.multi_dot})


def _down(x, dtype):
    """lower_precision_fp's cast: a floating-point fp32 tensor to the autocast dtype (autocast_mode.h
    cached_cast: is_eligible — floating point, not float64)."""
    return x.to(dtype) if isinstance(x, torch.Tensor) and x.dtype == torch.float32 else x


def _up(x):
    return x.float() if isinstance(x, torch.Tensor) and x.dtype in _LOW else x


class CudaAutocastLists(TorchFunctionMode):
    """Active for a CUDA-semantics trace; acts only while (CPU) autocast is on, as CUDA autocast would."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if torch.is_autocast_enabled("cpu"):
            if func in LOWER:
                low = torch.get_autocast_dtype("cpu")
                args = tuple([_down(t, low) for t in a] if isinstance(a, (list, tuple)) else _down(a, low)
                             for a in args)
                kwargs = {k: _down(v, low) for k, v in kwargs.items()}
            elif func in FP32:
                args = tuple(_up(a) for a in args)
                kwargs = {k: _up(v) for k, v in kwargs.items()}
            elif func in FP32_DTYPE and kwargs.get("dtype") is None and args \
                    and isinstance(args[0], torch.Tensor) and args[0].dtype in _LOW:
                # softmax(x, dim, _stacklevel, dtype) etc.: a positional dtype is not used by the models here
                kwargs = {**kwargs, "dtype": torch.float32}
        return func(*args, **kwargs)
