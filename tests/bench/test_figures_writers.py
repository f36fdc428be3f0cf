"""The figures writers of the distributed CPU benchmarks (dist_ranks, deepspeed_cpu, megatron_cpu), fed
a run's results by hand: the page's rows keep the shape bench/report.py reads."""
import json

import pytest

from bench import figures, report
from bench.targets import deepspeed_cpu, dist_ranks, megatron_cpu


@pytest.fixture
def written(tmp_path, monkeypatch):
    monkeypatch.setattr(figures, "results_dir", lambda: tmp_path)
    return lambda name: json.loads((tmp_path / "figures" / f"{name}.json").read_text())


def test_dist_ranks(written):
    rows = [(name, n, 1000, 0, 1000, analytic, "backward", 0.1, 0.0, 1.0)
            for n in (2, 4) for name, analytic in (("DDP", 1000), ("ZeRO-1", 1001), ("ZeRO-2", 1010),
                                                   ("FSDP (ZeRO-3)", 1076 if n == 4 else 1008))]
    dist_ranks.record_figures(rows)
    fig = written("dist_ranks")
    assert fig["figure"] == ("trace ≤ 0.000 % on every rank; analytic DDP/ZeRO-1 ≤ 0.10 %, ZeRO-2/FSDP +0.8 % … +7.6 % "
                             "(fp32)")
    assert fig["rows"][1]["worst"] == "+7.6 % (FSDP, 4 ranks)" and fig["rows"][1]["cases"] == 8
    assert {row["table"] for row in fig["rows"]} <= set(report.TABLES)


def test_deepspeed_cpu(written):
    peaks = {(z, p): e for z, e in zip(range(4), (0.001, -0.002, 0.003, -0.018)) for p in ("bf16-master", "fp32")}
    deepspeed_cpu.record_figures(peaks, [0.0075, -0.001])
    fig = written("deepspeed_cpu")
    assert fig["figure"] == ("ZeRO 0–3 × bf16-master/fp32: peaks worst −1.80 % (ZeRO-3), optimizer phases ≤ 0.75 %")
    assert fig["values"]["cases"] == 8 and fig["rows"][0]["worst"] == "−1.80 % (ZeRO-3)"


def test_megatron_cpu_names_the_cases_that_did_not_run(written):
    megatron_cpu.record_figures({"tp1-fp32": [0.0, -0.0012, 0.001, -0.0012]}, 4)
    fig = written("megatron_cpu")
    assert "(1 of 4 cases ran): worst −0.12 %" in fig["figure"] and fig["rows"][0]["cases"] == 1
