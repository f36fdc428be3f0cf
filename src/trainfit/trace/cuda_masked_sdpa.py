"""Where CUDA's SDPA dispatcher sends a call with an explicit attention mask, and that kernel run on fake tensors.

The flash kernel takes no mask (sdp_utils.cpp can_use_flash_attention: check_for_attn_mask), so a masked call goes to
the memory-efficient kernel when its constraints hold (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp
can_use_mem_efficient_attention, read at torch main 001f694, the newest version at hand; the CUDA sources are not in
the CPU wheel of torch 2.13):
  * dtype fp16, bf16 or fp32 (sm80 and newer: greater_than_or_equal_sm80_mem_efficient_dtypes);
  * check_head_dim_size_mem_efficient: q's and k's head widths equal, q's and v's multiples of the GEMM alignment
    (minimum_gemm_alignment: 8 elements for 16-bit with tensor cores, 4 for fp32 on sm80+), both non-zero;
  * check_data_ptr_alignment_mem_efficient: q's, k's and v's storage offsets multiples of that alignment;
  * check_last_dim_stride_equals_1_dense, check_nonzero_sequence_lengths_dense;
  * check_batch_size_and_num_heads_dense: one head count for q, k and v, as at torch 2.11 (the H200 runs: fp32 GQA
    took the math path, cuda_kernels.py); at 001f694 the CUDA build passes supports_gqa=true. HF repeats k/v itself
    or packs the query groups (decode) when it passes a mask (transformers integrations/sdpa_attention.py:42-51,
    119-127), so a masked HF call never has GQA;
and otherwise to the math path, whose decomposition materialises the (b, h, q, k) scores and probabilities in fp32.
The mask becomes an additive bias before the kernel (attention.cpp scaled_dot_product_attention):
convert_boolean_attn_mask turns a boolean mask into where(mask, 0, -inf) of the query's dtype (same shape as the
mask), and for the memory-efficient kernel preprocess_mask pads a mask whose leading strides are not multiples of 8
(or whose last stride is not 1) to a last dim + (8 - last % 8) copy sliced back (pad_bias), then expands it to
(b, h, q, k) without a copy. The kernel saves q, k, v, the output, the bias and an fp32 logsumexp (b, h, ceil(q/32)*32)
(_meta_registrations.py meta__scaled_dot_product_efficient_attention); when the bias requires grad (T5's relative
position bias) its backward allocates a (b, h, q, k rounded up to 16) gradient of the bias's dtype, which autograd
sums back to the bias's own shape (meta__scaled_dot_product_efficient_backward).
NB: on H100/H200 with cuDNN 9.15 and newer, torch puts cuDNN first (sdp_utils.cpp check_prefer_cudnn_attention; the
H200 runs' default bf16 kernel was cuDNN's), and cuDNN takes a mask that needs no gradient (check_attn_mask_shape):
it saves the same output, fp32 logsumexp (b, h, q, 1) and bias, without the efficient kernel's padding — the
efficient kernel's logsumexp overstates cuDNN's by at most 31 rows per head. cuDNN's op does not differentiate the
bias (its autograd raises "not differentiable with respect to argument 'attn_bias'" at torch 2.13), so a bias that
needs a gradient (T5's) cannot run there; which check keeps such a call off cuDNN was not found in sdp_utils.cpp.
"""
from __future__ import annotations

import torch

_EFFICIENT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_PAD_ALIGNMENT = 8  # attention.cpp preprocess_mask: mem_eff_alignment


def gemm_alignment(dtype: torch.dtype) -> int:
    """sdp_utils.cpp minimum_gemm_alignment on sm80 and newer: max(4, 128 bits / the element's bits) with tensor
    cores (8 elements for fp16/bf16, 4 for fp32)."""
    return max(4, 128 // (torch.finfo(dtype).bits))


def efficient_takes_mask(query, key, value) -> bool:
    """Whether CUDA's memory-efficient kernel takes this masked call (sdp_utils.cpp can_use_mem_efficient_attention
    on sm80+); if not, the dispatcher falls back to the math path."""
    if query.dtype not in _EFFICIENT_DTYPES or not (query.dtype == key.dtype == value.dtype):
        return False
    a = gemm_alignment(query.dtype)
    dq, dk, dv = query.shape[-1], key.shape[-1], value.shape[-1]
    if dq != dk or dq % a or dv % a or dq == 0 or dv == 0:  # check_head_dim_size_mem_efficient
        return False
    if any(t.storage_offset() % a for t in (query, key, value)):  # check_data_ptr_alignment_mem_efficient
        return False
    if any(t.stride(-1) != 1 for t in (query, key, value)):  # check_last_dim_stride_equals_1_dense<false>
        return False
    if query.shape[-2] == 0 or key.shape[-2] == 0:  # check_nonzero_sequence_lengths_dense
        return False
    return query.shape[1] == key.shape[1] == value.shape[1]  # check_batch_size_and_num_heads_dense (no GQA)


def additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """attention.cpp convert_boolean_attn_mask: a boolean mask as where(mask, 0, -inf) of the query's dtype; a float
    mask is already additive."""
    if mask.dtype != torch.bool:
        return mask
    return torch.where(mask, 0.0, torch.scalar_tensor(float("-inf"), dtype=dtype, device=mask.device))


def _aligned(mask: torch.Tensor) -> bool:
    """attention.cpp aligned_tensor<8>: every stride but the last a multiple of 8, the last 1."""
    return all(s % _PAD_ALIGNMENT == 0 for s in mask.stride()[:-1]) and mask.stride(-1) == 1


def preprocess_mask(mask: torch.Tensor, query, key) -> torch.Tensor:
    """attention.cpp preprocess_mask: pad an unaligned bias (pad_bias: pads by 8 - last % 8, 8 when already a
    multiple, and slices back), then expand it to (b, h, q, k)."""
    if not _aligned(mask):
        last = mask.shape[-1]
        mask = torch.nn.functional.pad(mask, (0, _PAD_ALIGNMENT - last % _PAD_ALIGNMENT))[..., :last]
    return mask.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])


def masked_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, efficient: bool):
    """A masked SDPA call as CUDA runs it: the memory-efficient kernel when it takes the call (and the stack allows
    it), else the math path (attention.cpp scaled_dot_product_attention)."""
    mask = additive_mask(attn_mask, query.dtype)
    if efficient and efficient_takes_mask(query, key, value):
        lse = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))  # should_compute_logsumexp
        return torch.ops.aten._scaled_dot_product_efficient_attention(
            query, key, value, preprocess_mask(mask, query, key), lse, dropout_p, is_causal, scale=scale)[0]
    return torch.ops.aten._scaled_dot_product_attention_math(
        query, key, value, mask, dropout_p, is_causal, None, scale=scale, enable_gqa=enable_gqa)[0]
