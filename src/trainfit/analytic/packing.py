"""Sequence packing (--doc-len): a training sequence made of several documents, each attending within itself.

transformers' DataCollatorWithFlattening (data/data_collator.py:1261-1299) and TRL's padding-free / packed batches
flatten a micro-batch into one row with no padding and position_ids restarting at every document; with
flash_attention_2, transformers reads the documents' bounds from those position_ids and runs FlashAttention's
varlen kernel over them (modeling_flash_attention_utils.py:564-580 _is_packed_sequence, :855-864
flash_varlen_fn with cu_seqlens from position_ids). What changes: the attention core, timed as a batch of
documents (attention_rows). A document of d tokens costs d·(d+1)/2 causal query-key pairs instead of its share of
the row's s·(s+1)/2; per token over the row, (L+1)/2 keys with L = Σd²/Σd, the token-weighted mean document length
--doc-len takes. What does not: every other op is per token, and the varlen kernel saves what the flash kernel
saves (q, k, v, output, log-sum-exp per token).
NB: the kernel is timed as s/L documents of exactly L tokens: with mixed lengths each document's partial edge
tile differs (either way, under one tile per document), and FlashAttention-2's varlen and fixed-length kernels are
taken to run at the same rate.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # (ops/attention.py imports this module)
    from .ops.op import Shape


def attention_rows(sh: Shape) -> tuple[float, float, float]:
    """(queries, keys, rows) of the attention core's kernel: one row of the rank's s/cp queries over the s keys
    unpacked; under --doc-len the varlen kernel's documents, s/L of them per sequence, each L queries over its own
    L keys (its query tiles walk only their document's key blocks, as a batch of L-token sequences would:
    roofline.py _block_steps). Op.flops's causal (L + 1) / 2 keys per query then counts Σ d(d+1)/2 exactly.
    Rows are per head: under --ulysses (sh.cp is then its degree n) the all-to-alls leave a rank heads / n over
    every query of the sequence (deepspeed 0.19.8 ulysses_sp.py:168-206), so the queries are the whole sequence's
    and the rows 1/n of the heads'."""
    n = sh.ulysses
    if not sh.doc_len:
        return sh.seq / sh.cp * n, sh.seq, 1.0 / n
    length = min(sh.doc_len, sh.seq)
    return length, length, sh.seq / length / n
