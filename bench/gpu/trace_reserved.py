"""The trace engine's reserved against a committed CUDA truth run, at full depth and extrapolated (no GPU needed;
~6 minutes on 2 cores for the 18 H200 steps).

    python -m bench run trace_reserved bench/results/gpu/H200-2026-11-27-unrecorded-9-truth.json [--only CASE ...]

The trace replays the step's allocations through the caching allocator's rules (alloc/replay.py). A model of 16
layer periods or more is traced at 3, 4 and 5 periods and extrapolated (trace/extrapolate.py); its reserved comes
from the full depth's records written down from the 5-period trace (trace/depth_records.py), or, where they cannot
be written, from a line through the traced depths. This prints both paths beside the full-depth trace.
Error = trace reserved less the allocator-held workspaces / the step's own measured reserved − 1 (rule 1: real
steps on a GPU).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

ABOUT = {"summary": "the trace engine's reserved against a committed CUDA truth run", "minutes": 6, "quick": None}



def rows(path: Path, only: list[str] | None = None, depths: tuple[str, ...] = ("full", "extrapolated")):
    """One dict per measured case: the error of the trace's reserved at each depth, and how the extrapolated
    one was made."""
    from trainfit.hardware import get_gpu
    from trainfit.models.resolve import load_model
    from trainfit.overheads import allocator_held, with_device_total
    from trainfit.setup import Setup
    from trainfit.trace.engine import trace_spec

    from bench.gpu.cuda_truth import recorded_settings  # this folder's harness: each case as its step ran (clipping)

    run = json.loads(path.read_text())
    gpu = get_gpu(run["gpu"])
    for case in run["cases"]:
        own = (case.get("measured_own") or {}).get("reserved")
        if not own or (only and case["id"] not in only):
            continue
        spec = load_model(case["model"])
        setup = Setup(**{"device": "cuda", **recorded_settings(case["settings"])})
        held = sum(allocator_held(gpu, setup).values())
        out = {"id": case["id"]}
        for depth in depths:
            # with the workspaces, as bench/gpu/cuda_truth.py compares it (trace_spec's own reserved leaves them out)
            e = with_device_total(trace_spec(spec, setup, flops=False, extrapolate=depth == "extrapolated"), gpu)
            out[depth] = (e.memory.reserved - held) / own - 1
            if "extrapolated_from_layers" in e.detail.records:
                out["from"] = e.detail.records.get("reserved_from")
        yield out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--only", nargs="*", default=None)
    a = ap.parse_args(argv)
    print("| case | full depth | default (extrapolated from 16 periods) | extrapolated reserved from |")
    print("|---|---:|---:|---|")
    for r in rows(a.run, a.only):
        print(f"| {r['id']} | {r['full']:+.2%} | {r['extrapolated']:+.2%} | {r.get('from') or 'not extrapolated'} |",
              flush=True)


if __name__ == "__main__":
    main()
