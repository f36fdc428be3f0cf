"""Compute overlapping an NCCL collective runs on the SMs NCCL leaves free (analytic/overlap.py)."""
import pytest

from trainfit.analytic.overlap import exposed, overlapped_seconds
from trainfit.hardware import get_gpu

# 132 SMs (WP-H Table 3); 24 NCCL channels on an NVSwitch H100 node (NCCL's search, tests/test_overheads.py; AWS p5
# NCCL_DEBUG logs print "24 coll channels")
H100 = get_gpu("H100-80GB")


def test_short_collective_stretches_compute_by_its_stolen_sms():
    # simulate it step by step: 0.5 s with 108 of 132 SMs, then the rest of 1.0 s of work on all 132
    done = 0.5 * 108 / 132
    assert overlapped_seconds(H100, 0.5, 1.0) == pytest.approx(0.5 + (1.0 - done), rel=1e-9)
    assert exposed(H100, 0.5, 1.0) == pytest.approx(0.5 * 24 / 132, rel=1e-9)  # 90.9 ms


def test_long_collective_is_the_wall_time():
    # the compute alone would end at 1.0 * 132/108 = 1.222 s < 2.0 s: the collective sets the time
    assert overlapped_seconds(H100, 2.0, 1.0) == pytest.approx(2.0)
    # just past the crossover the slowed compute (1.222 s) ends before the collective
    assert overlapped_seconds(H100, 1.23, 1.0) == pytest.approx(1.23)


def test_no_collective_or_no_channel_data_costs_nothing():
    assert overlapped_seconds(H100, 0.0, 1.0) == 1.0
    assert overlapped_seconds(get_gpu("MI300X"), 0.5, 1.0) == 1.0  # RCCL's search is not modelled


def test_memory_bound_kernels_share_hbm_with_the_collective():
    a100 = get_gpu("A100-80GB")
    # A100: 2039 GB/s x 0.863 (STREAM triad) = 1760 GB/s achieved; an NVLink collective at 207 GB/s stores and
    # re-reads every byte (nccl#1428): 414 GB/s of it gone -> memory-bound kernels at 1346/1760 = 0.765 speed;
    # GEMMs on 84 of 108 SMs (24 NCCL channels) = 0.778. Half the work of each kind: 1 s of work takes
    # 0.5/0.778 + 0.5/0.765 = 1.296 s overlapped, i.e. progress rate 0.7716
    r = 1 / (0.5 / (84 / 108) + 0.5 / ((1760 - 414) / 1760))
    assert overlapped_seconds(a100, 0.5, 1.0, mem_share=0.5, link_bw=207e9) == pytest.approx(1 + 0.5 * (1 - r), rel=2e-3)
    # a slow inter-node link barely touches HBM: the slowdown is then mostly the SMs'
    assert exposed(a100, 0.5, 1.0, mem_share=0.5, link_bw=25e9) < exposed(a100, 0.5, 1.0, mem_share=0.5, link_bw=207e9)
