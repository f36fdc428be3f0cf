"""The analytic engine against the trace engine at real model scale (where no CPU can run the step).

    python -m bench run analytic_vs_trace      # ~3 minutes on 2 cores; prints a markdown table

Each case is traced on fake tensors (exact at the tensor level; the trace matches real CPU steps to 0.5%,
see bench/targets/accuracy.py), with `--device cuda` semantics unless stated: flash SDPA, fused dropout, foreach
optimizers, 512-byte allocator rounding.
"""
from __future__ import annotations

import argparse
import time

from bench.figures import pct, record
from trainfit.analytic.engine import estimate
from trainfit.models.resolve import load_model
from trainfit.setup import Setup
from trainfit.trace.engine import trace_spec

ABOUT = {"summary": "analytic vs trace peaks at real scale (7B-47B, CUDA semantics)", "minutes": 1, "quick": None}

GiB = 2**30
CASES = [
    ("llama-3.1-8b", Setup(batch=2, seq=4096, precision="amp-bf16")),
    ("llama-3.1-8b", Setup(batch=2, seq=4096, precision="amp-bf16", recompute="full")),
    ("llama-3.1-8b", Setup(batch=1, seq=2048, precision="bf16", attention="eager")),
    ("llama-3.1-8b", Setup(batch=8, seq=4096, precision="bf16", mode="infer")),
    ("gpt2-xl", Setup(batch=8, seq=1024, precision="amp-bf16")),
    ("bert-large", Setup(batch=32, seq=512, precision="amp-fp16")),
    ("mistral-7b", Setup(batch=4, seq=4096, precision="bf16-master", recompute="full")),
    ("mistral-7b", Setup(batch=4, seq=8192, precision="bf16", mode="infer")),
    ("qwen2.5-7b", Setup(batch=2, seq=4096, precision="amp-bf16", device="cpu")),
    ("gemma-2-9b", Setup(batch=1, seq=4096, precision="amp-bf16")),
    ("mixtral-8x7b", Setup(batch=1, seq=2048, precision="bf16", recompute="full")),
]


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    print("| model | mode | precision | recompute | attention | device | batch | seq | trace peak | phase | analytic peak | phase | gap | trace s |")
    print("|" + "---|" * 14)
    gaps = []
    for name, st in CASES:
        spec = load_model(name)
        a = estimate(spec, st)
        t0 = time.perf_counter()
        t = trace_spec(spec, st)
        secs = time.perf_counter() - t0
        gap = (a.memory.peak - t.memory.peak) / t.memory.peak
        gaps.append(abs(gap))
        print(f"| {name} | {st.mode} | {st.precision} | {st.recompute} | {st.attention_kernel} | {st.device} | {st.batch} | {st.seq} "
              f"| {t.memory.peak / GiB:.2f} GiB | {t.memory.peak_phase} | {a.memory.peak / GiB:.2f} GiB | {a.memory.peak_phase} "
              f"| {gap:+.2%} | {secs:.1f} |", flush=True)
    gaps.sort()
    median, worst = gaps[len(gaps) // 2], gaps[-1]
    print(f"\n{len(gaps)} cases · median |gap| {median:.2%} · worst {worst:.2%}")
    record("analytic_vs_trace", "analytic vs trace at real scale (7B–47B, CUDA semantics)", None,
           f"{len(gaps)} cases: median {pct(median, False, 2)}, worst {pct(worst, False, 2)}",
           {"cases": len(gaps), "median_pct": round(median * 100, 3), "worst_pct": round(worst * 100, 3)}, "cpu-memory")


if __name__ == "__main__":
    main()
