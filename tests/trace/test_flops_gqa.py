"""SDPA FLOPs (trace/flops.py): k/v broadcast to the query's heads (GQA), and a causal call counting the pairs its
mask keeps.

Hand count: q·kᵀ and p·v are each 2·b·h_q·s_q·s_k·d multiply-adds counted as 2 FLOPs each (FlopCounterMode's
convention); backward twice the forward (dq, dk, dv, dp; the fused kernel's recomputed scores are its own, not the
model's). Torch before 2.13 asserted equal heads here (seen on torch 2.11: every GQA CUDA trace failed). A causal
s x s call keeps s(s+1)/2 of the s² pairs.
"""
import pytest
import torch

from trainfit.trace.flops import _SDPA, _is_causal, _sdpa_bwd, _sdpa_fwd

aten = torch.ops.aten


def test_gqa_forward_and_backward_counts():
    b, hq, hkv, s, d = 2, 32, 8, 128, 64
    q, kv = torch.empty(b, hq, s, d, device="meta"), torch.empty(b, hkv, s, d, device="meta")
    fwd = 2 * (2 * b * hq * s * s * d)
    assert _sdpa_fwd(False, q, kv, kv) == fwd
    assert _sdpa_bwd(False, q, q, kv, kv) == 2 * fwd


def test_causal_counts_the_kept_pairs():
    b, h, s, d = 1, 4, 100, 16
    q = torch.empty(b, h, s, d, device="meta")
    kept = s * (s + 1) // 2  # rows 0..s-1 see 1..s keys
    assert _sdpa_fwd(True, q, q, q) == 2 * (2 * b * h * kept * d)
    assert _sdpa_bwd(True, q, q, q, q) == 4 * (2 * b * h * kept * d)


@pytest.mark.parametrize("name", [n + suffix for n in _SDPA for suffix in ("", "_backward") if hasattr(aten, n)])
def test_is_causal_is_read_where_each_kernel_takes_it(name):
    """Each SDPA kernel's is_causal, positional or keyword, as its schema places it (flash 4th, efficient 6th, ...)."""
    op = getattr(aten, name).default
    names = [a.name for a in op._schema.arguments]
    at = names.index("is_causal")
    assert _is_causal(op, (None,) * at + (True,), {}) is True
    assert _is_causal(op, (None,) * at + (False,), {}) is False
    assert _is_causal(op, (None,) * at, {"is_causal": True}) is True
