"""Vision models in the accuracy matrix: the catalog's tiny ResNet, ConvNeXt and ViT configs (transformers'
*ForImageClassification, random weights), 64x64 images, through trainfit's three engines.

    python -m bench run vision          # ~1 minute on 2 cores; prints a markdown table

Per setup: the analytic engine (analytic/vision.py) against the trace under CUDA semantics (512-byte blocks; no CPU
kernel scratch), and the trace against the real CPU step measured by the measure engine's CPU reader (profiler
allocation records) under CPU semantics (the trace probes oneDNN's scratch on this CPU).
"""
from __future__ import annotations

import argparse

from bench.figures import pct, record
from trainfit.api import Request, run_engines

ABOUT = {"summary": "vision models: analytic vs trace vs real CPU step", "minutes": 1.5, "quick": None}

SETUPS = [(model, precision, batch, "none") for model in ("tiny-resnet", "tiny-resnet-basic", "tiny-convnext", "tiny-vit")
          for precision in ("fp32", "amp-bf16", "bf16") for batch in (4,)]
# ViT with transformers' activation checkpointing (--recompute full; ResNet and ConvNeXt cannot: vision_setup.py)
SETUPS += [("tiny-vit", precision, 4, "full") for precision in ("fp32", "amp-bf16", "bf16")]


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    print("| model | precision | batch | recompute | analytic (cuda) | trace (cuda) | err | trace (cpu) "
          "| measured CPU step | err |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    analytic_gaps: dict[str, list[float]] = {}  # model -> (analytic - trace) / trace, CUDA semantics
    trace_errors = []  # (trace - real) / real, CPU semantics
    for model, precision, batch, recompute in SETUPS:
        kw = dict(model=model, batch=batch, precision=precision, optimizer="momentum", recompute=recompute)
        analytic, traced_cuda = (e.memory.peak for e in run_engines(Request(**kw), "all"))
        cpu = Request(**kw, device="cpu")
        traced = run_engines(cpu, "trace")[-1].memory.peak
        real = run_engines(cpu, "measure")[-1].memory.peak
        print(f"| {model} | {precision} | {batch} | {recompute} | {analytic:,} | {traced_cuda:,} | "
              f"{(analytic - traced_cuda) / traced_cuda:+.2%} | {traced:,} | {real:,} "
              f"| {(traced - real) / real:+.3%} |", flush=True)
        analytic_gaps.setdefault(model, []).append((analytic - traced_cuda) / traced_cuda)
        trace_errors.append((traced - real) / real)
    record_figures(analytic_gaps, trace_errors)


def record_figures(analytic_gaps: dict[str, list[float]], trace_errors: list[float]) -> None:
    trace_worst = max(trace_errors, key=abs)
    gaps = [g for model_gaps in analytic_gaps.values() for g in model_gaps]
    exact = [model.removeprefix("tiny-") for model, model_gaps in analytic_gaps.items() if not any(model_gaps)]
    worst = {model.removeprefix("tiny-"): max(g, key=abs) for model, g in analytic_gaps.items() if any(g)}
    analytic_text = ", ".join(([f"{'/'.join(exact)} exact"] if exact else [])
                              + [f"{m} {pct(w, digits=2)}" for m, w in worst.items()])
    record("vision", "vision models: analytic vs trace, trace vs a real CPU step", "analytic 3 %, trace 0.5 %",
           f"trace vs CPU step ≤ {pct(trace_worst, False, 3)} ({len(trace_errors)} cases); analytic vs trace: {analytic_text}",
           {"trace_cases": len(trace_errors), "trace_worst_pct": round(trace_worst * 100, 3),
            "analytic_worst_pct": round(max(gaps, key=abs) * 100, 2),
            "analytic_worst_per_model_pct": {m: round(w * 100, 3) for m, w in worst.items()}},
           "cpu-memory",
           rows=[{"table": "cpu", "stack": "hf (vision)", "case": "ResNet, ConvNeXt, ViT (and ViT checkpointed)", "cases": len(trace_errors),
                  "trace vs real": pct(trace_worst, digits=3), "analytic vs real": f"vs trace ≤ {pct(max(gaps, key=abs), False, 2)}"}])


if __name__ == "__main__":
    main()
