"""The low-precision and Blackwell/MI300X runs of bench/targets/time_runs.py (C5–C7 and their validation set) are well
formed: each names a GPU of the catalog (or one being added to it), settings that exist with allowed values, a known
unit, a pinned source, and parallel degrees whose product is the GPU count the source states (read from the source's
own words, transcribed in the run). Not a gate on the errors: lowp_published only has to report every run."""
from __future__ import annotations

import re

import pytest

from bench.targets import lowp_published
from bench.targets.stacks_published import RUNS as MEMORY_RUNS
from bench.targets.time_runs import LOWP_CALIBRATION, LOWP_VALIDATION, gpus, published_step

from trainfit.hardware import get_gpu
from trainfit.setup.settings import BY_NAME, SETUP_NAMES, check_value

LOWP = LOWP_CALIBRATION + LOWP_VALIDATION


def stated_gpus(run: dict) -> int:
    """The GPU count as the source words it: "<n> GPUs" (NeMo's #-GPUs column, torchao's "one node of 8 GPUs") or
    torchtitan's table titles "on <n> H100s"."""
    found = re.findall(r"\b(\d[\d,]*) GPUs\b", run["notes"]) or re.findall(r"on (\d+) H100s", run["source"])
    assert found, f"{run['id']}: no GPU count in its source or notes"
    return int(found[0].replace(",", ""))


def test_ids_unique_and_count():
    ids = [r["id"] for r in LOWP]
    assert len(ids) == len(set(ids))
    assert len(LOWP_VALIDATION) >= 20


@pytest.mark.parametrize("run", LOWP, ids=lambda r: r["id"])
def test_run_is_well_formed(run):
    for key in ("id", "source", "gpu", "model", "setup", "unit", "notes", "published"):
        assert run[key], f"{run['id']}: empty {key}"
    assert re.search(r"github\.com/.+/(blob|tree)/[0-9a-f]{40}/", run["source"]), "source not pinned to a commit"
    get_gpu(run["gpu"])  # a catalog GPU (raises otherwise)
    for name, value in run["setup"].items():
        assert name in SETUP_NAMES, f"{run['id']}: unknown setting {name}"
        check_value(BY_NAME[name], value)  # its type, choices and bounds
    assert published_step(run) > 0  # a unit published_step knows
    s = run["setup"]
    assert gpus(run) == stated_gpus(run)
    assert s.get("ep", 1) <= s.get("dp", 1) * s.get("cp", 1) * s.get("tp", 1)
    if "GBS" in run["notes"]:  # NeMo's tables: GBS = MBS x gradient accumulation x DP
        gbs = int(re.search(r"GBS (\d+)", run["notes"]).group(1))
        assert s["batch"] * s["grad_accum"] * s["dp"] == gbs
    assert bool(run.get("in_sample")) == run["id"].startswith(("c5-", "c6-", "c7-"))
    if run.get("in_sample"):
        assert re.search(r"C[567] of calibration\.md", run["source"])


def test_calibration_is_c5_to_c7_as_written():
    # shared/calibration.md: C5 two H100 rows, C6 two B200 rows, C7 two NeMo rows (H100 Llama-3-8B, B200 Qwen3-30B)
    by = {r["id"][:2]: [] for r in LOWP_CALIBRATION}
    for r in LOWP_CALIBRATION:
        by[r["id"][:2]].append((r["gpu"], r["published"], r.get("published_reserved_gib")))
    assert by == {"c5": [("H100-96GB", 6150, 47.65), ("H100-96GB", 7689.5, 47.77)],
                  "c6": [("B200", 8307.5, 33.71), ("B200", 9969.0, 33.88)],
                  "c7": [("H100-80GB", 14451, None), ("B200", 9299, None)]}


def test_reserved_rows_are_the_runs_own():
    names = {r.name: r for r in MEMORY_RUNS}
    for run in LOWP:
        if "published_reserved_gib" in run:
            assert names[run["id"]].published_gib == run["published_reserved_gib"]
            assert names[run["id"]].kind == ("calibration" if run.get("in_sample") else "validation")


def test_target_reports_every_run(monkeypatch):
    rows = lowp_published.throughput_rows()
    ids = [r["id"] for r in rows]
    assert {r["id"] for r in LOWP} <= set(ids) and len(ids) == len(set(ids))
    assert all(("error" in r) != ("not_expressible" in r) for r in rows)
    offload = "mbridge-25.11-gb200-llama-3.1-70b-fp8cs"  # its activation CPU offload is --offload-layers 40
    assert "error" in next(r for r in rows if r["id"] == offload)
    # a run no Setup expresses is reported, not fatal: the same run marked inexpressible
    marked = [dict(r, inexpressible="a layout no Setup has") if r["id"] == offload else r for r in lowp_published.RUNS]
    monkeypatch.setattr(lowp_published, "RUNS", marked)
    rows = lowp_published.throughput_rows()
    assert next(r for r in rows if r["id"] == offload)["not_expressible"] == "a layout no Setup has"
    text = lowp_published.render(rows, [])
    assert text.count("not expressible:") == sum("not_expressible" in r for r in rows) == 1
