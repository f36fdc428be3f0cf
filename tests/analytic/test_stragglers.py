"""The job's slowest GPU (analytic/stragglers.py): the order statistic against exact values, the spread against the
H200 runs it was measured on, and the step term against a hand derivation."""
import math
import statistics

import pytest

import trainfit
from trainfit.analytic.roofline import cluster_table
from trainfit.analytic.stragglers import expected_max
from bench import data



@pytest.mark.parametrize("n, exact", [
    (2, 1 / math.sqrt(math.pi)),        # E[max(Z1, Z2)] = 1/sqrt(pi)
    (3, 3 / (2 * math.sqrt(math.pi))),  # E[max of 3] = 3 / (2 sqrt(pi))
    (10, 1.53875),                      # Harter 1961, expected values of normal order statistics, n = 10
    (100, 2.50759),                     # ibid., n = 100
])
def test_expected_max_matches_exact_order_statistics(n, exact):
    assert expected_max(n) == pytest.approx(exact, rel=0.05 if n == 2 else 0.03)
    assert expected_max(1) == 0.0


def test_compute_spread_is_the_h200_runs_coefficient_of_variation():
    """kernels.toml's compute_spread = the sample CV of the llama-3.1-8b bf16 step's GEMM time over the nine H200
    runs committed in bench/results (one chip each)."""
    gemm = []
    # unrecorded-10 ran on unrecorded-9's chip, as far as the runs tell (the same driver, its 8b GEMMs 116.6 ms to
    # 0.1 ms): one chip, counted once
    for stem, run in data.gpu_runs("truth", "H200").items():
        if stem == "H200-2026-11-27-unrecorded-10-truth":
            continue
        for case in run["cases"]:
            if case["id"] == "llama-3.1-8b-bf16":
                gemm.append(case["measured"]["kinds"]["gemm"])
    assert len(gemm) == 9
    assert cluster_table()["compute_spread"] == pytest.approx(statistics.stdev(gemm) / statistics.mean(gemm),
                                                               abs=0.0015)


def test_straggler_term_by_hand():
    """One GPU: no straggler. Eight: the GEMMs and attention take sigma x E[max of 8] longer, E[max of 8] = 1.4236
    (Harter 1961), sigma = 0.034 (+0.7 % for Blom's approximation)."""
    one = trainfit.estimate("llama-3.2-1b", gpu="H100-80GB", batch=2, seq=2048).detail.step_time
    assert one.straggler == 0.0
    st = trainfit.estimate("llama-3.2-1b", gpu="H100-80GB", batch=2, seq=2048, dp=8).detail.step_time.as_dict()
    matmul = st["compute_terms"]["gemm"] + st["compute_terms"]["attention"]
    assert st["straggler"] / matmul == pytest.approx(0.034 * 1.4236, rel=0.01)
    assert st["step_seconds"] == pytest.approx(sum(v for k, v in st.items() if k in (
        "compute", "recompute", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "bubble", "dp_comm", "optimizer",
        "host_copies", "host_issue", "straggler")), rel=1e-9)
