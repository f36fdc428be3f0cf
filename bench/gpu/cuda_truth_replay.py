"""Today's engines against the committed CUDA truth runs (no GPU needed).

    python -m bench run cuda_truth_replay        # every truth run: analytic and trace; writes the GPU figures
    python -m bench run cuda_truth_replay bench/results/gpu/H200-2026-11-26-unrecorded-2-truth.json   # one, analytic

bench/gpu/cuda_truth.py measured real steps on a GPU and wrote what it measured; this re-estimates every case
with the analytic engine as it is now and prints the errors: the step's own allocated peak (measured above what
the process held before the case: the cuBLAS workspaces and earlier cases' leftovers), the step time, and the
kernels launched per step (the count behind the host-issue bound, analytic/step_time.py). The measured numbers are
ground truth of rule 1 (DEVELOPERS: real steps on a GPU); tests/bench/test_cuda_truth_replay.py checks the
memory column against them. Each case is estimated as it ran (cuda_truth.recorded_settings: the hf steps of runs
that predate max_grad_norm in the settings did not clip their gradients). Without a file, every committed truth
run is replayed, the trace engine's allocated peak and reserved beside the analytic engine's (each distinct step
traced once), and the figures go to bench/results/figures/cuda_truth_replay.json.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ABOUT = {"summary": "today's engines against the committed CUDA truth runs", "minutes": 1.5, "quick": None}

WITHIN = 0.15  # the target for the large ops' kernel time by kind


def replay(path: Path | dict, traces: dict | None = None) -> list[dict]:
    """One row per measured case: measured and analytic peak, reserved, step time and kernels; with `traces` (a
    cache of trace results by step, filled here) the trace engine's peak and reserved too. Reserved is compared as
    bench/gpu/cuda_truth.py does: the step's own, against the engine's less the allocator-held workspaces."""
    from bench.gpu.cuda_truth import analytic_kinds, analytic_passes, measured_kinds, recorded_settings
    from trainfit.analytic.engine import estimate
    from trainfit.hardware import get_gpu
    from trainfit.models.resolve import load_model
    from trainfit.overheads import allocator_held, with_device_total
    from trainfit.setup import Setup
    from trainfit.trace.engine import trace_spec

    run = json.loads(path.read_text()) if isinstance(path, Path) else path
    gpu = get_gpu(run["gpu"])
    rows = []
    for case in run["cases"]:
        m, own = case.get("measured", {}), case.get("measured_own", {})
        if "peak" not in m:
            continue
        spec = load_model(case["model"])
        setup = Setup(**{"device": "cuda", **recorded_settings(case["settings"])})
        held = sum(allocator_held(gpu, setup).values())
        e = estimate(spec, setup, gpu=gpu)
        st = e.detail.step_time.as_dict() if e.detail.step_time else {}
        row = {}
        if traces is not None:
            key = (case["model"], json.dumps(recorded_settings(case["settings"]), sort_keys=True), run["gpu"])
            if key not in traces:
                t = with_device_total(trace_spec(spec, setup, flops=False), gpu).memory
                traces[key] = (t.peak, t.reserved)
            row = {"trace_peak": traces[key][0], "trace_reserved": traces[key][1] - held}
        rows.append({**row, "id": case["id"], "peak": own.get("peak") or m["peak"], "analytic_peak": e.memory.peak,
                     "reserved": own.get("reserved"), "analytic_reserved": e.memory.reserved - held,
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


def worst(rows: list[dict], engine: str, quantity: str) -> float:
    return max((_err(r[f"{engine}_{quantity}"], r[quantity]) for r in rows if r.get(quantity)), key=abs)


def replay_all() -> int:
    """Every committed truth run against both engines; one line per run, then the figures file."""
    from bench.data import gpu_runs, manifest
    from bench.figures import pct, record

    runs, traces, per_run, steps, reserved = gpu_runs("truth"), {}, {}, [], []
    print("| run | steps | allocated: trace / analytic (worst) | reserved: trace / analytic (worst) |\n|---|---:|---|---|")
    for name, run in runs.items():
        rows = replay(run, traces)
        errs = {f"{engine}_{q}": worst(rows, engine, q) for engine in ("trace", "analytic") for q in ("peak", "reserved")}
        per_run[name] = {k: round(v * 100, 3) for k, v in errs.items()}
        steps += [_err(r["analytic_step"], r["step"]) for r in rows if r["kernels"] and r["analytic_step"]]
        reserved += [abs(_err(r["analytic_reserved"], r["reserved"])) for r in rows if r["reserved"]]
        print(f"| {name} | {len(rows)} | {pct(errs['trace_peak'], digits=2)} / {pct(errs['analytic_peak'], digits=2)} | "
              f"{pct(errs['trace_reserved'], digits=2)} / {pct(errs['analytic_reserved'], digits=2)} |", flush=True)
    # kernel time by kind and the kernel count: the newest run whose profile lists every kernel
    newest = next(name for name in reversed(runs) if any((c.get("measured", {}).get("profile") or {}).get("top")
                                                          for c in runs[name]["cases"]))
    kinds, counts = {}, []
    for r in replay(runs[newest]):
        if r["kinds"] and r["analytic_kinds"]:
            for k, v in r["kinds"].items():
                if v:
                    kinds.setdefault(k, []).append(abs(_err(r["analytic_kinds"][k], v)) <= WITHIN)
        if r["kernels"] and r["analytic_kernels"]:
            counts.append(abs(_err(r["analytic_kernels"], r["kernels"])))
    w = {q: max((e[q] for e in per_run.values()), key=abs) for q in next(iter(per_run.values()))}
    med_res = statistics.median(reserved)
    within = {k: [sum(v), len(v)] for k, v in kinds.items()}
    kinds_text = ", ".join(f"{k} {a}/{n}" for k, (a, n) in within.items())
    step_med, step_signed = statistics.median(abs(x) for x in steps), statistics.median(steps)
    gpu = {e["gpu"] for e in manifest() if e["file"].removesuffix(".json") in runs}
    torch = {e["torch"] for e in manifest() if e["file"].removesuffix(".json") in runs}
    n_steps = max(len(r["cases"]) for r in runs.values())

    def size(q: str) -> str:
        return f"≤ {pct(w[q] / 100, False, 2)}"

    def cases(n: int) -> dict:
        return {"cases": n}
    print(f"\nkernel time within {WITHIN:.0%} ({newest}): {kinds_text}; kernel count median {statistics.median(counts):.1%}"
          f"\ntraining step time: median |error| {step_med:.1%} (signed {step_signed:+.1%}) over {len(steps)} steps")
    record("cuda_truth_replay", f"CUDA truth: {n_steps} real steps × {len(runs)} runs on {'/'.join(sorted(gpu))}s, "
           "replayed by today's engines", "allocated: trace 1 %, analytic 3 %; reserved 5 %; large ops' kernel time 15 %",
           f"allocated: trace {size('trace_peak')}, analytic {size('analytic_peak')}; reserved {size('trace_reserved')} "
           f"/ {size('analytic_reserved')}; step time median {step_med * 100:.1f} %",
           {"steps": n_steps, "runs": len(runs), "per_run_worst_pct": per_run,
            **{f"{q}_worst_pct": v for q, v in w.items()},
            "kernel_time_within_15_pct": within, "kernel_time_run": newest,
            "kernel_count_median_pct": round(statistics.median(counts) * 100, 2),
            "step_time_median_pct": round(step_med * 100, 2), "step_time_signed_median_pct": round(step_signed * 100, 2),
            "step_time_steps": len(steps), "analytic_reserved_median_pct": round(med_res * 100, 2)}, "gpu",
           machine=f"{'/'.join(sorted(gpu))}, {len(runs)} runs, torch {', '.join(sorted(torch))}",
           rows=[{"table": "accuracy", "stack": "hf, torchtitan", "engine": "trace", "truth": "H200 allocated / reserved",
                  **cases(n_steps * len(runs)), "median |error|": "—",
                  "worst": f"{size('trace_peak')} / {size('trace_reserved')}"},
                 {"table": "accuracy", "stack": "hf, torchtitan", "engine": "analytic", "truth": "H200 allocated / reserved",
                  **cases(n_steps * len(runs)), "median |error|": f"reserved {pct(med_res, False)}",
                  "worst": f"{size('analytic_peak')} / {size('analytic_reserved')}"},
                 {"table": "accuracy", "stack": "hf, torchtitan", "engine": "analytic step time",
                  "truth": f"H200 steps ({len(runs)} runs)", **cases(len(steps)),
                  "median |error|": pct(step_med, False), "worst": pct(max(steps, key=abs))},
                 {"table": "gpu", "quantity": "allocated peak", **cases(n_steps * len(runs)),
                  "trace": size("trace_peak"), "analytic": size("analytic_peak")},
                 {"table": "gpu", "quantity": "reserved", **cases(n_steps * len(runs)),
                  "trace": size("trace_reserved"), "analytic": size("analytic_reserved")},
                 {"table": "gpu", "quantity": f"kernel time within {WITHIN:.0%} by kind (newest run)",
                  **cases(max(n for _, n in within.values())), "trace": "—", "analytic": kinds_text},
                 {"table": "gpu", "quantity": "kernel count (newest run)", **cases(len(counts)), "trace": "—",
                  "analytic": f"median {statistics.median(counts) * 100:.1f} %"},
                 {"table": "gpu", "quantity": f"step time ({len(steps)} steps over {len(runs)} runs)",
                  **cases(len(steps)), "trace": "—",
                  "analytic": f"median {pct(step_med, False)} (signed {pct(step_signed)})"}])
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path, nargs="?",
                    help="a bench/results/gpu/<gpu>-<date>-<chip>-truth.json from bench/gpu/cuda_truth.py (default: all)")
    args = ap.parse_args(argv)
    if args.results is None:
        return replay_all()
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
