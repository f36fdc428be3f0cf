"""Accuracy of the analytic (and trace) engines against real CPU training steps.

    python bench/accuracy.py            # the full matrix, writes bench/results/accuracy.md and .json
    python bench/accuracy.py --quick    # a representative subset (about a minute)

Truth: `trainfit.measure` — the real standard step on this CPU, peak from PyTorch's profiler allocation
records. Models: the tiny-* catalog configs (random weights). Predictions use --device cpu semantics.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

from trainfit.analytic.engine import estimate
from trainfit.errors import TrainfitError
from trainfit.models.resolve import load_model
from trainfit.setup import Setup

FAMILIES = ["tiny-llama", "tiny-qwen2", "tiny-gpt2", "tiny-neox", "tiny-phi3", "tiny-gemma2", "tiny-bert", "tiny-opt"]


def cases(quick: bool) -> list[tuple[str, Setup]]:
    out = []
    base = dict(batch=2, seq=128, device="cpu", optimizer="adamw")
    fams = FAMILIES[:4] + ["tiny-bert"] if quick else FAMILIES
    for fam in fams:
        for prec in ("fp32", "amp-bf16") if quick else ("fp32", "amp-bf16", "bf16"):
            for rec in ("none", "full"):
                out.append((fam, Setup(**{**base, "precision": prec, "recompute": rec})))
    if quick:
        return out
    for opt in ("sgd", "momentum", "adam", "adafactor"):  # optimizers
        out.append(("tiny-llama", Setup(**{**base, "optimizer": opt, "precision": "fp32"})))
    for acc in (2, 4):  # gradient accumulation
        out.append(("tiny-llama", Setup(**{**base, "grad_accum": acc})))
        out.append(("tiny-gpt2", Setup(**{**base, "grad_accum": acc, "precision": "fp32"})))
    out.append(("tiny-llama", Setup(**{**base, "precision": "bf16-master"})))
    for b in (1, 4, 8):  # batch sweep (linear)
        out.append(("tiny-llama", Setup(**{**base, "batch": b, "precision": "fp32"})))
    for s in (64, 256, 512):  # sequence sweep, eager attention (quadratic) and sdpa (linear)
        out.append(("tiny-llama", Setup(**{**base, "seq": s, "attention": "eager", "precision": "fp32"})))
        out.append(("tiny-llama", Setup(**{**base, "seq": s, "precision": "fp32"})))
    out.append(("tiny-mixtral", Setup(**{**base, "precision": "fp32"})))
    return out


def run(quick: bool, with_trace: bool) -> list[dict]:
    from trainfit.measure import measure

    trace = None
    if with_trace:
        with contextlib.suppress(ImportError):
            from trainfit.trace.engine import trace_spec as trace
    rows = []
    todo = cases(quick)
    for n, (name, setup) in enumerate(todo, 1):
        spec = load_model(name)
        row = {"model": name, "precision": setup.precision, "optimizer": setup.optimizer, "recompute": setup.recompute,
               "attention": setup.attention_kernel, "batch": setup.batch, "seq": setup.seq, "grad_accum": setup.grad_accum}
        try:
            with open(os.devnull, "w") as devnull, contextlib.redirect_stderr(devnull):
                m = measure(spec, setup, steps=0)
        except TrainfitError as e:
            row["error"] = str(e)
            rows.append(row)
            print(f"[{n}/{len(todo)}] {name} {setup.precision}: {e}", file=sys.stderr)
            continue
        t0 = time.perf_counter()
        a = estimate(spec, setup)
        row["analytic_ms"] = (time.perf_counter() - t0) * 1e3
        row.update(measured=m.peak, measured_phase=m.peak_phase, analytic=a.memory.peak, analytic_phase=a.memory.peak_phase)
        row["analytic_err"] = (a.memory.peak - m.peak) / m.peak
        if trace is not None:
            try:
                t = trace(spec, setup)
                row.update(trace=t.memory.peak, trace_err=(t.memory.peak - m.peak) / m.peak)
            except TrainfitError as e:
                row["trace_error"] = str(e)
        rows.append(row)
        extra = f" trace {row['trace_err']:+.2%}" if "trace_err" in row else ""
        print(f"[{n}/{len(todo)}] {name:13s} {setup.precision:11s} {setup.optimizer:9s} rec={setup.recompute:5s} "
              f"b={setup.batch} s={setup.seq} acc={setup.grad_accum} {setup.attention_kernel:5s} "
              f"measured {m.peak / 2**20:8.2f} MiB analytic {row['analytic_err']:+.2%}{extra}", file=sys.stderr)
    return rows


def summary(rows: list[dict], key: str) -> str:
    errs = [abs(r[key]) for r in rows if key in r]
    if not errs:
        return "n/a"
    worst = max((r for r in rows if key in r), key=lambda r: abs(r[key]))
    return (f"{len(errs)} cases · median |error| {statistics.median(errs):.2%} · worst {abs(worst[key]):.2%} "
            f"({worst['model']} {worst['precision']} recompute {worst['recompute']})")


def markdown(rows: list[dict]) -> str:
    has_trace = any("trace_err" in r for r in rows)
    lines = [f"- analytic vs measured: {summary(rows, 'analytic_err')}"]
    if has_trace:
        lines.append(f"- trace vs measured: {summary(rows, 'trace_err')}")
    lines.append("")
    head = "| model | precision | optimizer | recompute | attention | batch | seq | accum | measured peak (B) | phase | analytic | err |"
    sep = "|" + "---|" * 12
    if has_trace:
        head += " trace | err |"
        sep += "---|---|"
    lines += [head, sep]
    for r in rows:
        if "measured" not in r:
            lines.append(f"| {r['model']} | {r['precision']} | {r['optimizer']} | {r['recompute']} | | | | | error: {r['error']} |")
            continue
        line = (f"| {r['model']} | {r['precision']} | {r['optimizer']} | {r['recompute']} | {r['attention']} | {r['batch']} | "
                f"{r['seq']} | {r['grad_accum']} | {r['measured']:,} | {r['measured_phase']} | {r['analytic']:,} | "
                f"{r['analytic_err']:+.2%} |")
        if has_trace:
            line += f" {r['trace']:,} | {r['trace_err']:+.2%} |" if "trace_err" in r else " — | — |"
        lines.append(line)
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a representative subset")
    ap.add_argument("--no-trace", action="store_true", help="skip the trace engine")
    ap.add_argument("--out", default="bench/results", help="folder for accuracy.md / accuracy.json")
    args = ap.parse_args()
    rows = run(args.quick, not args.no_trace)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "accuracy.json").write_text(json.dumps(rows, indent=1))
    md = markdown(rows)
    (out / "accuracy.md").write_text(md + "\n")
    print(md)


if __name__ == "__main__":
    main()
