"""The CPU flash-attention kernel's buffers (no torch): what SDPA allocates through c10 inside the op on the CPU.

aten/src/ATen/native/cpu/FlashAttentionKernel.cpp (torch 2.13; the file trace/kernel_scratch.py names):
flash_attention_kernel_impl picks the query block by the query length (256 from 768 rows, 64 from 192, else 32) and
512 keys per block; cpu_flash_attention clips both to the sequence (`qSplitSize = q_split_size > qSize ? qSize :
q_split_size`, the same for kv), then allocates with at::empty, per thread (at::get_num_threads):
`buf` in the accumulation dtype (fp32), qSplit·kvSplit (the scores block) + qSplit (row max) + qSplit (row sum) +
qSplit·headSize (the output block), and for a 16-bit input `buf_reduced`, qSplit·kvSplit in the input's dtype.
Checked against the trace's probe of the op (small-gpt_neox amp-bf16 CPU prefill at 8 x 200, 2 threads, without
packing: 171,008 B = 2 · (4·(64·200 + 2·64 + 64·32) + 2·64·200)).

Packing (`packs`): where oneDNN's brgemm ukernel runs the 16-bit type (cpublas::could_pack: bf16 from AMX, fp16
from AMX-FP16), the kernel packs K and V for it when both lengths are at least 64 and each thread's GEMM work is at
least 4x the packed bytes (the pack then overlaps). It then also holds, all through c10 and all live at once with
the buffers above: K re-laid (B·heads·e(headSize)·kvSize), V re-laid (B·heads·kv_padding·headSize, each key block
padded to an even length), a per-thread copy block (threads·kvSplit·headSize) and, for an odd head width, a
per-thread padded query block (threads·qSplit·e(headSize)); `buf_reduced`'s key width is padded to even.
NB: the 2.13 source was not read; the packing rule and sizes are the ones the probe measured on a Sapphire Rapids
(AMX) with 1-64 threads, query/key lengths 16-1000, head widths 31-128, causal and not, named after the blocks of
the kernel's earlier revision (pytorch@008ec6b1 FlashAttentionKernel.cpp: need_pack, key_reorder, value_reorder,
query_padding); the causal work counts min(qSize, kvSize) keys per query row (equal lengths only were measured);
fp16's packing on AMX-FP16 CPUs (Granite Rapids) is taken from could_pack's rule, not measured.
"""
from __future__ import annotations

from .onednn import cpu_threads, effective_isa

FP32 = 4
KV_SPLIT = 512
PACK_MIN = 64  # both lengths at least this to pack (probed: 63 does not, 64 does)
PACK_WORK = 4  # each thread's GEMM work over the packed K/V elements, at least (probed: 3.76 does not, 4.0 does)


def q_split(q_len: int) -> int:
    """flash_attention_kernel_impl's query block for a query length."""
    return 256 if q_len >= 768 else 64 if q_len >= 192 else 32


def could_pack(elem: int, dtype: str = "bf16", isa: str | None = None) -> bool:
    """cpublas::could_pack for the kernel's 16-bit input: oneDNN's brgemm ukernel runs bf16 from avx512_core_amx and
    fp16 from avx512_core_amx_fp16 (probed: fp16 is not packed on an AMX-BF16-only CPU)."""
    isa = effective_isa() if isa is None else isa
    if elem >= FP32 or isa is None:
        return False
    return isa == "avx512_core_amx_fp16" or (dtype == "bf16" and isa == "avx512_core_amx")


def packs(q_len: int, kv_len: int, batch: int, heads: int, elem: int, causal: bool, threads: int,
          dtype: str = "bf16", isa: str | None = None) -> bool:
    """Whether the kernel packs K and V (module docstring): could_pack, both lengths >= PACK_MIN, and the query blocks
    one thread runs, times their GEMM columns, at least PACK_WORK x the keys it packs (per head width, which cancels)."""
    if not could_pack(elem, dtype, isa) or q_len < PACK_MIN or kv_len < PACK_MIN:
        return False
    qs = min(q_split(q_len), q_len)
    blocks = -(-batch * heads * -(-q_len // qs) // threads)  # ceil(B·heads·qSlice / threads)
    keys = min(q_len, kv_len) if causal else kv_len
    return blocks * qs * keys >= PACK_WORK * batch * heads * kv_len


def scratch(q_len: int, kv_len: int, head_dim: int, elem: int, batch: int = 1, heads: int = 1, causal: bool = True,
            dtype: str = "bf16", isa: str | None = None, threads: int | None = None, pack: bool | None = None) -> int:
    """Bytes the op allocates and frees inside it for one call: queries q_len, keys kv_len, head width head_dim,
    input element size elem (2: a 16-bit input, which adds buf_reduced; 4: fp32), `batch` sequences of `heads` query
    heads; with packing (packs, or `pack` where given) its K/V copies and blocks too."""
    n = cpu_threads() if threads is None else threads
    qs = min(q_split(q_len), q_len)
    ks = min(KV_SPLIT, kv_len)
    if not (packs(q_len, kv_len, batch, heads, elem, causal, n, dtype, isa) if pack is None else pack):
        return n * (FP32 * (qs * ks + 2 * qs + qs * head_dim) + (elem * qs * ks if elem < FP32 else 0))
    even = lambda x: x + x % 2  # noqa: E731
    tail = (kv_len - 1) % ks + 1
    kv_padded = (kv_len - 1) // ks * even(ks) + even(tail)
    eh = even(head_dim)
    per_thread = FP32 * (qs * ks + 2 * qs + qs * head_dim) + elem * (qs * even(ks) + ks * head_dim
                                                                    + (qs * eh if head_dim % 2 else 0))
    return n * per_thread + elem * batch * heads * (eh * kv_len + kv_padded * head_dim)
