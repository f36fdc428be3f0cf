"""CUDA kernel semantics for a trace that runs CPU kernels on fake tensors (`--device cuda`).

Where CUDA and CPU kernels keep different tensors for backward, run the CUDA op itself — its fake-tensor
kernel gives the CUDA output and saved tensors without a GPU:
  * SDPA: on CUDA, HF's sdpa runs the flash kernel for fp16/bf16 (dropout included: it saves the philox RNG
    state, not a mask) and the memory-efficient kernel for fp32; both save the output and an fp32
    logsumexp. On CPU, SDPA with dropout falls back to the math path, which materialises the s×s
    probabilities — a different memory profile. torch/nn/attention sdp dispatch (sdp_utils.cpp).
  * Dropout: CUDA's fused native_dropout keeps a 1-byte mask; the CPU path keeps a noise tensor of the
    input's dtype (aten Dropout.cpp).
An explicit attention mask (padding, T5's relative bias, bidirectional image blocks, chunked or sliding windows past
their window) takes the memory-efficient kernel where CUDA's dispatcher does, else the math path (cuda_masked_sdpa.py):
the flash kernel takes no mask. fp32 with GQA (enable_gqa) takes the math
path: the memory-efficient kernel does not take GQA (sdp_utils.cpp), the flash kernel not fp32.
`--stack torchtitan` allows only the cuDNN, flash and math backends (torchtitan/models/attention.py:173-178, 190:
sdpa_kernel([CUDNN_ATTENTION, FLASH_ATTENTION, MATH], set_priority=True)): bf16 runs the flash kernel here (NB: on
GPUs with cuDNN attention torchtitan gets cuDNN's kernel, which also saves the output and an fp32 logsumexp), and
cuDNN's own where q/k and v differ in width (MLA), which the flash kernel does not take; fp32
the math path (no memory-efficient kernel), whose decomposition materialises the s×s scores as on CUDA.
  * RMSNorm (torch.rms_norm, nn.RMSNorm: torchtitan's norms): on CUDA, with weight and input of one dtype, it runs
    aten._fused_rms_norm, whose autograd keeps the input, the weight and rstd (one fp32 per row;
    tools/autograd/derivatives.yaml `_fused_rms_norm`; aten/src/ATen/native/layer_norm.cpp rms_norm_symint); the
    CPU build has no such kernel and runs the composite (fp32 upcast, pow, mean, rsqrt, mul), which keeps fp32
    copies. HF's LlamaRMSNorm does not call torch.rms_norm and is unaffected.
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from ..setup import Setup
from .cuda_autocast import CudaAutocastLists
from .cuda_masked_sdpa import masked_sdpa
from .lowp_cuda import float8_sees_autocast


def _cuda_sdpa(original, efficient: bool = True, cudnn: bool = False):
    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if torch.is_autocast_enabled("cpu"):  # CUDA autocast lists SDPA as a lower-precision op
            dtype = torch.get_autocast_dtype("cpu")
            query, key, value = query.to(dtype), key.to(dtype), value.to(dtype)
            if attn_mask is not None and attn_mask.is_floating_point():  # cached_cast casts every float argument
                attn_mask = attn_mask.to(dtype)
        with torch.autocast("cpu", enabled=False):
            if attn_mask is not None:
                return masked_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, efficient)
            # the flash kernel needs one head width for q, k and v (sdp_utils.cpp check_head_dim_size_flash);
            # MLA's v is narrower than its q/k, so CUDA's dispatcher takes the memory-efficient kernel
            # (check_head_dim_size_mem_efficient: q and k equal, v its own width)
            low = query.dtype in (torch.float16, torch.bfloat16)
            if low and query.shape[-1] == value.shape[-1]:
                return torch.ops.aten._scaled_dot_product_flash_attention(
                    query, key, value, dropout_p, is_causal, False, scale=scale)[0]
            # a stack that puts cuDNN's kernel first (torchtitan) gets it for q/k and v of different widths too (MLA's
            # 192 and 128): torch's sdp_utils.cpp check_cudnn_tensor_shapes allows head widths up to 256, multiples
            # of 8, on SM 9.0 with cuDNN >= 9.10 (and DeepSeek's 192/128 on SM 10.x from cuDNN 9.11). It saves the
            # output and an fp32 logsumexp, as flex attention does, which torchtitan's DeepSeek flavors run
            # (models/deepseek_v3/__init__.py:78-155 attn_type "flex"). NB: elsewhere (a 128 limit) torch would
            # take SDPA's math path: priced as the fused kernels, right for the flavors' flex attention, low for an
            # attn_type "sdpa" job on such a GPU.
            if cudnn and low and all(w <= 256 and w % 8 == 0 for w in (query.shape[-1], value.shape[-1])):
                return torch.ops.aten._scaled_dot_product_cudnn_attention(
                    query, key, value, None, True, dropout_p, is_causal, False, scale=scale)[0]
            # the memory-efficient kernel has no GQA (sdp_utils.cpp use_mem_efficient_attention:
            # check_batch_size_and_num_heads_dense<false>), so fp32 with enable_gqa takes the math path
            # (seen on an H200, torch 2.11: llama-3.2-1b fp32 kept 4.36 GB more, its s×s probabilities)
            if not efficient or key.shape[1] != query.shape[1]:  # math: a composite op, decomposed as on CUDA
                return torch.ops.aten._scaled_dot_product_attention_math(
                    query, key, value, None, dropout_p, is_causal, None, scale=scale, enable_gqa=enable_gqa)[0]
            return torch.ops.aten._scaled_dot_product_efficient_attention(
                query, key, value, None, True, dropout_p, is_causal, scale=scale)[0]
    return sdpa


def _cuda_dropout(original):
    def dropout(input, p=0.5, training=True, inplace=False):
        if not training or p == 0:
            return input
        if inplace:
            return original(input, p, training, inplace)
        return torch.ops.aten.native_dropout(input, p, True)[0]
    return dropout


class _FusedRMSNorm(torch.autograd.Function):
    """aten._fused_rms_norm as CUDA's autograd runs it (derivatives.yaml): saves input, weight and rstd."""

    @staticmethod
    def forward(ctx, x, normalized_shape, weight, eps):
        out, rstd = torch.ops.aten._fused_rms_norm(x, list(normalized_shape), weight, eps)
        ctx.save_for_backward(x, weight, rstd)
        ctx.shape = list(normalized_shape)
        return out

    @staticmethod
    def backward(ctx, grad):
        x, w, rstd = ctx.saved_tensors
        gx, gw = torch.ops.aten._fused_rms_norm_backward(grad, x, ctx.shape, rstd, w, [True, w is not None])
        return gx, None, gw, None


def _cuda_rms_norm(original):
    def rms_norm(input, normalized_shape, weight=None, eps=None):
        if weight is not None and weight.dtype != input.dtype:  # CUDA takes the composite path too
            return original(input, normalized_shape, weight, eps)
        return _FusedRMSNorm.apply(input, tuple(normalized_shape), weight, eps)
    return rms_norm


@contextlib.contextmanager
def cuda_kernels(setup: Setup):
    """Patch torch.nn.functional's SDPA, dropout and RMSNorm for the duration of a `--device cuda` trace, and apply
    CUDA autocast's fp32 op lists (cuda_autocast.py)."""
    if setup.device != "cuda":
        yield
        return
    saved = F.scaled_dot_product_attention, F.dropout, F.rms_norm
    backends = setup.stack_facts.facts.get("attention", {}).get("sdpa_backends", ("efficient",))
    F.scaled_dot_product_attention = _cuda_sdpa(saved[0], efficient="efficient" in backends,
                                                cudnn=backends[0] == "cudnn")
    F.dropout = _cuda_dropout(saved[1])
    F.rms_norm = _cuda_rms_norm(saved[2])
    try:
        with CudaAutocastLists() if setup.policy.autocast else contextlib.nullcontext(), float8_sees_autocast(setup):
            yield
    finally:
        F.scaled_dot_product_attention, F.dropout, F.rms_norm = saved
