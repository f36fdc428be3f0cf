"""The CPU flash-attention kernel's per-thread buffers (no torch): what SDPA allocates inside the op on the CPU.

aten/src/ATen/native/cpu/FlashAttentionKernel.cpp (torch 2.13; the file trace/kernel_scratch.py names):
flash_attention_kernel_impl picks the query block by the query length (256 from 768 rows, 64 from 192, else 32) and
512 keys per block; cpu_flash_attention clips both to the sequence (`qSplitSize = q_split_size > qSize ? qSize :
q_split_size`, the same for kv), then allocates with at::empty, on every ISA, per thread (at::get_num_threads):
`buf` in the accumulation dtype (fp32), qSplit·kvSplit (the scores block) + qSplit (row max) + qSplit (row sum) +
qSplit·headSize (the output block), and for a 16-bit input `buf_reduced`, qSplit·kvSplit in the input's dtype
(:390-433; the packing buffers of :460-465 are fp16-only and not c10's). Both die when the op returns, beside its
output and logsumexp. Checked against the trace's probe of the op (small-gpt_neox amp-bf16 CPU prefill at 8 x 200,
2 threads: 171,008 B = 2 · (4·(64·200 + 2·64 + 64·32) + 2·64·200)).
"""
from __future__ import annotations

from .onednn import cpu_threads

FP32 = 4
KV_SPLIT = 512


def q_split(q_len: int) -> int:
    """flash_attention_kernel_impl's query block for a query length."""
    return 256 if q_len >= 768 else 64 if q_len >= 192 else 32


def scratch(q_len: int, kv_len: int, head_dim: int, elem: int) -> int:
    """Bytes of `buf` and `buf_reduced` for one call: queries q_len, keys kv_len, head width head_dim, input
    element size elem (2: a 16-bit input, which adds buf_reduced; 4: fp32)."""
    qs = min(q_split(q_len), q_len)
    ks = min(KV_SPLIT, kv_len)
    per_thread = FP32 * (qs * ks + 2 * qs + qs * head_dim) + (elem * qs * ks if elem < FP32 else 0)
    return cpu_threads() * per_thread
