"""bench/targets/posttrain_published.py: its published runs are well formed, the calibration runs (C9, C10) are not
among the validation ones, every run is reported (compared or not expressible, never both), and the summary counts
verdicts as defined. Not a gate on the errors: validation is never a gate."""
import re

import pytest

from bench.targets import posttrain_published as pp

METRICS = ("allocated", "reserved", "device_total", "ran", "oom")


def test_runs_are_well_formed():
    ids = [r.id for r in pp.RUNS]
    assert len(ids) == len(set(ids))
    for r in pp.RUNS:
        assert r.metric in METRICS and r.family in pp.FAMILIES, r.id
        # a memory figure exactly where the metric is one, in GiB a GPU can hold
        assert (r.value is None) == (r.metric in ("ran", "oom")), r.id
        assert r.value is None or 0 < r.value < 200, r.id
        # a pinned commit and a line (or the page's numbered table)
        assert re.search(r"/blob/[0-9a-f]{40}/.+#(L\d+|table-\d+)", r.source), r.id
        assert "gpu" in r.flags and r.flags.get("batch", 1) >= 1, r.id


def test_calibration_runs_are_not_validation_rows():
    # C9: benchmarks_03_2024.md lines 34 and 44 (QLoRA and LoRA, batch 1, context 512, peak reserved 4.98 / 10.24)
    aai = [r for r in pp.RUNS if r.source.startswith(pp.AAI)]
    assert not [r for r in aai if r.source.endswith(("#L34", "#L44"))]
    assert not [r for r in aai if r.metric == "reserved" and r.value in (4.98, 10.24)]
    # C10: the H200 baseline recipe (65,000 tokens, 137.36 GB)
    assert not [r for r in pp.RUNS if "run-h200-sp1-llama-8b-baseline" in r.source or r.value == 137.36]


def test_every_run_is_reported_once():
    rows = [pp.evaluate(r) for r in pp.RUNS]
    assert [r["id"] for r in rows] == [r.id for r in pp.RUNS]
    for row, run in zip(rows, pp.RUNS):
        assert ("not_expressible" in row) != ("fits" in row), row
        # every run reaches the engine: what is not expressible carries the engine's own refusal
        assert not row.get("not_expressible", "").startswith("needs "), row
        # a compared memory figure is predicted / published - 1
        if "error" in row:
            assert row["error"] == pytest.approx(row["predicted"] / run.value - 1)
    s = pp.summarise(rows, {"c9": None, "c10": None, "longest": None, "rl": None})
    text = pp.render(rows, s)
    assert text.count("not expressible:") == sum("not_expressible" in r for r in rows)
    assert s["not_yet_available"] == ["c10", "c9", "longest", "rl"]
    assert "not yet available (bench/targets/longest_context_published.py)" in text


def test_verdicts_count_ran_and_oom():
    # hand-counted: two runs that ran (one judged to fit), one OOM judged not to fit, one not expressible
    rows = [{"id": "a", "fits": True, "expected": "ran"}, {"id": "b", "fits": False, "expected": "ran"},
            {"id": "c", "fits": False, "expected": "oom"}, {"id": "d", "not_expressible": "needs x"}]
    assert pp.verdicts(rows) == {"ran": 2, "ran_fits": 1, "oom": 1, "oom_not_fits": 1, "disagree": ["b"]}
    m = pp.memory_stats([{"id": "a", "error": -0.2}, {"id": "b", "error": 0.1}, {"id": "c", "error": 0.05},
                         {"id": "d", "not_expressible": "x"}])
    assert m["median_abs"] == pytest.approx(0.1) and m["worst"] == -0.2 and m["with_memory"] == 3
    assert m["expressible"] == 3 and m["runs"] == 4


def test_a_missing_module_is_not_yet_available():
    assert pp.optional_rows("no_such_module_here", "rows") is None


def test_time_errors_are_summarised_apart_from_memory():
    # C9's rows: one memory and one time comparison (fsdp_qlora_c9.c9_rows marks the time row in its metric)
    c9 = [{"id": "C9-lora", "metric": "peak reserved GiB", "error": 0.05, "kind": "calibration"},
          {"id": "C9-lora", "metric": "time s / 1,024 samples", "error": -0.84, "kind": "calibration"}]
    c10 = [{"id": "C10", "error": -0.1, "kind": "calibration"}]
    s = pp.summarise([], {"c9": c9, "c10": c10, "longest": None, "rl": None})
    assert s["calibration"]["memory"]["with_memory"] == 2 and s["calibration"]["memory"]["worst"] == -0.1
    assert s["calibration"]["time"]["with_memory"] == 1 and s["calibration"]["time"]["worst"] == -0.84
    text = pp.render([], s)
    assert "| time | calibration | 1 of 1 runs compared" in text and "-84.0%" not in text.split("| time |")[0]
