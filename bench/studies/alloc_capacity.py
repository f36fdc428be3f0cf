"""What a training step needs on a device that has no more than it: the allocator simulator's least capacity
against the analytic fit rule's required (analytic/fit_rule.py), over traced setups.

Reserved is what an unconstrained run caches. When a cudaMalloc fails, c10's malloc frees every free, non-split
cached segment and retries (CUDACachingAllocator.cpp malloc: release_cached_blocks), so a step near its GPU's
capacity gives its cache back. For each setup: the trace engine's step replayed through trainfit.alloc (torch
defaults), bisected over the capacity (alloc/replay.py least_capacity, 2 MiB steps, exact) to the least one at
which every request is served; beside it the allocated peak, the unconstrained reserved, the analytic engine's
required (the fit rule) and its old basis, the analytic reserved (step_reserve; inference: infer_reserve), the
unconstrained reserved the fit was judged on.
Checks on the simulator's side: the replay at the least capacity retries at least once where it is below reserved
(num_alloc_retries: the released cache is the mechanism) and fails 2 MiB below it; "served" is monotone in the
capacity on a grid of 8 capacities between it and reserved (the bisection's premise).

Run: python -m bench run alloc_capacity [model ...] > bench/results/alloc_capacity.md
Rows: bench/studies/alloc_fragmentation.py's 23 setups (records traced here, all checks), then real-size steps measured on
an H200 (bench/results/gpu/H200-*-truth.json; the trace engine's full-depth replay, least capacity only), then inference
(prefill + decode) steps.
"""
from __future__ import annotations

import sys
import time

from bench.figures import record
from bench.studies.alloc_fragmentation import SETUPS, label

ABOUT = {"summary": "the simulator's least capacity vs the analytic fit rule's required", "minutes": 2, "quick": None}

GiB = 2 ** 30
MiB = 2 ** 20
# the CUDA truth runs' training steps (bench/gpu/cuda_truth.py CASES: batch 2 x 1024 tokens on an H200)
REAL = [dict(model=m, batch=2, seq=1024, **kw) for m, kw in (
    ("gpt2", dict(precision="amp-bf16")),
    ("llama-3.2-1b", dict(precision="amp-bf16")),
    ("llama-3.2-1b", dict(precision="fp32")),
    ("llama-3.2-1b", dict(precision="bf16")),
    ("llama-3.2-1b", dict(precision="amp-bf16", recompute="full")),
    ("llama-3.2-1b", dict(precision="amp-bf16", optimizer_impl="foreach")),
    ("qwen2.5-1.5b", dict(precision="amp-bf16")),
    ("tinyllama-1.1b", dict(precision="amp-bf16", stack="torchtitan")),
    ("llama-3.2-3b", dict(precision="amp-bf16")),
    ("llama-3.1-8b", dict(precision="bf16")),
)]
# inference (prefill + decode): the fit rule's infer_required (the MLP block, pinned, + the weights' slack)
INFER = [dict(model=m, mode="infer", batch=b, seq=s, precision="bf16") for m, b, s in (
    ("llama-3.2-1b", 4, 2048), ("qwen2.5-0.5b", 8, 2048), ("gpt2", 8, 1000), ("llama-3.2-3b", 2, 4096))]


def _label(kw: dict) -> str:
    extra = "".join(f" {k}={kw[k]}" for k in ("mode", "precision", "optimizer_impl") if k in kw)
    return label({"recompute": "none", **kw}) + extra


def simulator_checks(rec, setup, least: int, reserved: int) -> tuple[int, bool, bool]:
    """(retries at the least capacity, fails 2 MiB below it, served at every capacity of the grid above it)."""
    from trainfit.alloc import OutOfMemory
    from trainfit.alloc.replay import replay
    from trainfit.trace.engine import replay_args

    step = replay_args(rec, setup)

    def served(capacity: int):
        try:
            return replay(capacity=capacity, **step)
        except OutOfMemory:
            return None

    at = served(least)
    grid = sorted({least + (reserved - least) * k // 8 // (2 * MiB) * 2 * MiB for k in range(1, 9)})
    return at.retries, served(least - 2 * MiB) is None, all(served(c) is not None for c in grid)


def study(kw: dict, traced: bool) -> dict:
    from trainfit import engines
    from trainfit.api import resolve
    from trainfit.setup import Request

    spec, setup = resolve(Request(**kw))
    t0 = time.perf_counter()
    checks = None
    if traced:  # the records, for the simulator's own checks (as bench/studies/alloc_fragmentation.py traces them)
        from trainfit.trace.distributed import trace_rank
        from trainfit.trace.engine import replay_of, trace_train

        _, rec, an = trace_rank(spec, setup) if setup.dp > 1 else trace_train(spec, setup, flops=False)
        r = replay_of(rec, setup, None)
        peak, least, reserved = an.peak, r.required, r.reserved
        checks = simulator_checks(rec, setup, least, reserved)
    else:
        m = engines.trace(spec, setup, flops=False).memory
        peak, least, reserved = m.peak, m.required, m.reserved
    a = engines.analytic(spec, setup).memory
    old = a.reserved  # without a GPU: the step's own (step_reserve; inference: infer_reserve)
    return {"setup": _label(kw), "peak": peak, "least": least, "reserved": reserved, "required": a.required,
            "err": a.required / least - 1, "old": old, "old_err": old / least - 1, "checks": checks,
            "seconds": time.perf_counter() - t0}


def _summary(name: str, errs: list[float]) -> str:
    if not errs:
        return f"{name}: none"
    return (f"{name}, {len(errs)} setups: {min(errs):+.1%} to {max(errs):+.1%}, mean {sum(errs) / len(errs):+.1%}, "
            f"mean |error| {sum(abs(e) for e in errs) / len(errs):.1%}")


def main(argv: list[str] | None = None) -> None:
    rows = [(s, True) for s in SETUPS] + [(s, False) for s in REAL + INFER]
    rows = [(s, t) for s, t in rows if not argv or s["model"] in argv]
    print("# bench/studies/alloc_capacity.py output (trace engine, CUDA semantics, torch defaults; simulator = trainfit.alloc)\n")
    print("least capacity: the simulator's least capacity at which the step's every request is served (its OOM path "
          "releasing the free cached segments and retrying); required: the analytic fit rule; old: the analytic "
          "reserved (step_reserve; inference: infer_reserve), the unconstrained reserved the fit was judged on "
          "before. retries: num_alloc_retries of the replay at the least capacity; −2 MiB: that replay fails 2 MiB below it; monotone: served at 8 capacities between it and "
          "reserved.\n")
    print("| setup | peak GiB | least capacity GiB | least/peak | reserved GiB | analytic required GiB | error | "
          "old (analytic reserved) GiB | error | retries | −2 MiB OOM | monotone |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    small, big, real, infer, old_all, checks_ok = [], [], [], [], [], True
    for s, traced in rows:
        r = study(s, traced)
        c = r["checks"]
        if c is not None:
            checks_ok &= c[1] and c[2] and (c[0] >= 1 or r["least"] == r["reserved"])
        cells = (f"{c[0]} | {'yes' if c[1] else 'NO'} | {'yes' if c[2] else 'NO'}" if c else "— | — | —")
        print(f"| {r['setup']} | {r['peak'] / GiB:.3f} | {r['least'] / GiB:.3f} | {r['least'] / r['peak']:.3f} | "
              f"{r['reserved'] / GiB:.3f} | {r['required'] / GiB:.3f} | {r['err']:+.1%} | {r['old'] / GiB:.3f} | "
              f"{r['old_err']:+.1%} | {cells} |", flush=True)
        (infer if s.get("mode") == "infer" else real if not traced else big if r["peak"] >= GiB else small).append(
            r["err"])
        old_all.append(r["old_err"])
    print()
    print("analytic required vs the simulator's least capacity: " + "; ".join(
        (_summary("alloc_fragmentation.py's setups with a peak >= 1 GiB", big),
         _summary("their sub-GiB ones", small), _summary("the H200 truth runs' training steps", real),
         _summary("training, all", big + small + real), _summary("inference", infer),
         _summary("old basis (the unconstrained reserved), all", old_all))))
    print(f"simulator checks (retries where least < reserved, OOM 2 MiB below, monotone on the grid): "
          f"{'all hold' if checks_ok else 'SOME FAIL'}")
    if not argv:  # the figures are the whole study's
        record_figures(big + small + real, real, infer)


def record_figures(training: list[float], real: list[float], infer: list[float]) -> None:
    def span(errs: list[float]) -> str:
        return f"{min(errs) * 100:+.1f} … {max(errs) * 100:+.1f} %".replace("-", "−")

    def mean(errs: list[float]) -> float:
        return sum(errs) / len(errs)

    def rounded(errs: list[float]) -> list[float]:
        return [round(min(errs) * 100, 2), round(max(errs) * 100, 2)]

    record("alloc_capacity", "the fit rule: analytic required vs the allocator simulator's least capacity", None,
           f"{len(training)} training setups {span(training)} (mean {mean(training) * 100:+.1f} %); "
           f"{len(real)} H200 truth steps {span(real)} (mean {mean(real) * 100:+.1f} %)".replace("-", "−"),
           {"training_setups": len(training), "training_range_pct": rounded(training),
            "training_mean_pct": round(mean(training) * 100, 2), "h200_steps": len(real),
            "h200_range_pct": rounded(real), "h200_mean_pct": round(mean(real) * 100, 2),
            "inference_range_pct": rounded(infer)}, "gpu",
           rows=[{"table": "gpu", "quantity": "required (fit rule) vs the simulator's least capacity", "cases": len(real),
                  "trace": "= truth (simulator)", "analytic": f"{span(real)}, mean {mean(real) * 100:+.1f} %".replace("-", "−")}])


if __name__ == "__main__":
    main(sys.argv[1:])
