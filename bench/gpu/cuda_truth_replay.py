"""Today's analytic engine against a committed CUDA truth run (no GPU needed).

    python -m bench run cuda_truth_replay bench/results/gpu/H200-2026-11-26-unrecorded-2-truth.json

bench/gpu/cuda_truth.py measured real steps on a GPU and wrote what it measured; this re-estimates every case
with the analytic engine as it is now and prints the errors: the step's own allocated peak (measured above what
the process held before the case: the cuBLAS workspaces and earlier cases' leftovers), the step time, and the
kernels launched per step (the count behind the host-issue bound, analytic/step_time.py). The measured numbers are
ground truth of rule 1 (DEVELOPERS: real steps on a GPU); tests/bench/test_cuda_truth_replay.py checks the
memory column against them. Each case is estimated as it ran (cuda_truth.recorded_settings: the hf steps of runs
that predate max_grad_norm in the settings did not clip their gradients).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ABOUT = {"summary": "today's analytic engine against a committed CUDA truth run", "minutes": 0.5, "quick": None}


def replay(path: Path) -> list[dict]:
    """One row per measured case: measured and analytic peak, step time and kernels."""
    # this folder's harness (bench/ scripts import each other by name)
    from bench.gpu.cuda_truth import analytic_kinds, analytic_passes, measured_kinds, recorded_settings
    from trainfit.analytic.engine import estimate
    from trainfit.hardware import get_gpu
    from trainfit.models.resolve import load_model
    from trainfit.setup import Setup

    run = json.loads(path.read_text())
    gpu = get_gpu(run["gpu"])
    rows = []
    for case in run["cases"]:
        m, own = case.get("measured", {}), case.get("measured_own", {})
        if "peak" not in m:
            continue
        spec = load_model(case["model"])
        e = estimate(spec, Setup(**{"device": "cuda", **recorded_settings(case["settings"])}), gpu=gpu)
        st = e.detail.step_time.as_dict() if e.detail.step_time else {}
        rows.append({"id": case["id"], "peak": own.get("peak") or m["peak"], "analytic_peak": e.memory.peak,
                     "step": m["step_seconds"], "analytic_step": e.time.step_seconds if e.time else None,
                     "host_issue": st.get("host_issue"),
                     "kernels": (m.get("profile") or {}).get("kernels"),
                     "analytic_kernels": round(st["kernels"]) if st.get("kernels") else None,
                     "kinds": measured_kinds(m), "analytic_kinds": analytic_kinds(st, gpu),
                     "decode": m.get("decode_seconds"), "passes": m.get("passes"),
                     "analytic_decode": (e.setup.batch / e.time.decode_tokens_per_second
                                         if e.time and e.time.decode_tokens_per_second else None),
                     "analytic_passes": analytic_passes(e)})
    return rows


def _kinds(pred: dict | None, meas: dict | None) -> str:
    if not pred or not meas:
        return "—"
    return " / ".join(f"{_err(pred[k], meas[k]):+.0%}" if meas.get(k) else "—"
                      for k in ("gemm", "attention", "other", "optimizer"))


def _err(a, b):
    return None if a is None or not b else (a - b) / b


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path, help="a bench/results/gpu/<gpu>-<date>-<chip>-truth.json from bench/gpu/cuda_truth.py")
    args = ap.parse_args(argv)
    rows = replay(args.results)
    print("| case | peak (measured) | analytic | step ms (measured) | analytic | host-bound part | kernels measured "
          "/ analytic | kinds: gemm / attention / other / optimizer |\n|---|---:|---:|---:|---:|---:|---:|---|")
    steps = []
    for r in rows:
        pe, se = _err(r["analytic_peak"], r["peak"]), _err(r["analytic_step"], r["step"])
        if se is not None and r["kernels"]:
            steps.append(abs(se))
        kern = f"{r['kernels']} / {r['analytic_kernels']}" if r["kernels"] else "—"
        print(f"| {r['id']} | {r['peak']:,} | {pe:+.2%} | {r['step'] * 1e3:.1f} | "
              f"{r['analytic_step'] * 1e3:.1f} ({se:+.1%}) | {(r['host_issue'] or 0) * 1e3:.1f} ms | {kern} | "
              f"{_kinds(r['analytic_kinds'], r['kinds'])} |")
    if steps:
        print(f"\ntraining step time: median |error| {statistics.median(steps):.1%}, worst {max(steps):.1%} "
              f"over {len(steps)} steps")
    gen = [r for r in rows if r["decode"] and r["analytic_decode"]]
    if gen:
        print("\n| inference | prefill ms (measured) | analytic | decode ms (measured) | analytic | kernels prefill / "
              "decode: measured, analytic |\n|---|---:|---:|---:|---:|---|")
    for r in gen:
        mp, ap = r["passes"] or {}, r["analytic_passes"] or {}
        kern = " / ".join(f"{(mp.get(k) or {}).get('kernels', '—')}, {round((ap.get(k) or {}).get('kernels', 0))}"
                          for k in ("prefill", "decode"))
        print(f"| {r['id']} | {r['step'] * 1e3:.1f} | {r['analytic_step'] * 1e3:.1f} "
              f"({_err(r['analytic_step'], r['step']):+.1%}) | {r['decode'] * 1e3:.2f} | "
              f"{r['analytic_decode'] * 1e3:.2f} ({_err(r['analytic_decode'], r['decode']):+.1%}) | {kern} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
