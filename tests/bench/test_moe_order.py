"""bench/targets/moe_order.py: Kendall's tau against hand-counted pairs, and the C8 row of its Qwen3-235B set against
shared/calibration.md's own words."""
from __future__ import annotations

from pathlib import Path

import pytest

from bench.targets.moe_order import kendall_tau, sets
from bench.targets.time_runs import published_step


def test_kendall_tau_hand_counts():
    assert kendall_tau([1, 2, 3], [10, 20, 30]) == 1
    assert kendall_tau([1, 2, 3], [30, 20, 10]) == -1
    # one of three pairs swapped (2 and 3): (2 concordant − 1 discordant) / 3
    assert kendall_tau([1, 2, 3], [10, 30, 20]) == pytest.approx(1 / 3)
    assert kendall_tau([1, 1, 2], [5, 6, 7]) == pytest.approx(2 / 3)  # the published tie counts as neither
    assert kendall_tau([4], [1]) is None


def test_sets_compare_layouts_of_one_model_cluster_and_batch():
    for name, runs in sets().items():
        expressible = [r for r in runs if not r.get("inexpressible")]
        assert len(expressible) >= 2, name
        keys = {(r["model"], r["gpu"], r["setup"]["seq"], r["setup"]["batch"] * r["setup"]["grad_accum"]
                 * r["setup"]["dp"]) for r in runs}
        assert len(keys) == 1, name
        layouts = {(r["setup"].get("tp", 1), r["setup"].get("pp", 1), r["setup"].get("ep", 1), r["setup"]["batch"],
                    r["setup"].get("moe_dispatcher"), r["setup"].get("overlap_moe_comm", False))
                   for r in expressible}
        assert len(layouts) == len(expressible), name


def test_c8_row_is_calibration_md():
    # shared/calibration.md C8: TP 2, EP 8, PP 32, VPP 3, DP 4, gradient accumulation 512, MBS 1, step 24.2 s
    text = (Path(__file__).resolve().parents[3] / "shared" / "calibration.md")
    c8 = [r for runs in sets().values() for r in runs if r.get("in_sample")]
    assert len(c8) == 1 and c8[0]["id"].startswith("c8-")
    s = c8[0]["setup"]
    assert (s["tp"], s["ep"], s["pp"], s["vpp"], s["dp"], s["grad_accum"], s["batch"]) == (2, 8, 32, 3, 4, 512, 1)
    assert published_step(c8[0]) == 24.2
    if text.exists():
        assert "TP 2, EP 8, PP 32, VPP 3, DP 4, gradient accumulation 512" in text.read_text()
        assert "Step time **24.2 s**" in text.read_text()
