"""SDPA FLOPs with grouped-query attention (trace/flops.py): k/v broadcast to the query's heads.

Hand count: q·kᵀ and p·v are each 2·b·h_q·s_q·s_k·d multiply-adds counted as 2 FLOPs each (FlopCounterMode's
convention); backward 2.5x the forward (dq, dk, dv, dp and the recomputed scores: flop_counter.py
sdpa_backward_flop_count). Torch before 2.13 asserted equal heads here (seen on torch 2.11: every GQA CUDA trace
failed).
"""
import torch

from trainfit.trace.flops import _sdpa_bwd, _sdpa_fwd


def test_gqa_forward_and_backward_counts():
    b, hq, hkv, s, d = 2, 32, 8, 128, 64
    q, kv = torch.empty(b, hq, s, d, device="meta"), torch.empty(b, hkv, s, d, device="meta")
    fwd = 2 * (2 * b * hq * s * s * d)
    assert _sdpa_fwd(q, kv, kv) == fwd
    assert _sdpa_bwd(q, q, kv, kv) == 5 * fwd // 2
