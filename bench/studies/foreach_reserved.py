"""foreach AdamW's temporaries in reserved: the analytic engine against the allocator simulator (issue 18).

    python -m bench run foreach_reserved            (~1 minute on 2 cores, no GPU)

For each setup, with torch.optim's foreach and fused AdamW: the trace engine's step replayed through trainfit.alloc
(trace/engine.py replay_of: the states made in the first optimizer step, as torch.optim makes them; the simulator is
within 1.9 % of every measured H200 step, docs/benchmarks/gpu-truth.md) beside the analytic engine's step_reserve, and the
analytic rule without foreach's segments (analytic/foreach_segments.py) — what it read before 2026-11-27.
"""
from __future__ import annotations

import argparse

ABOUT = {"summary": "foreach AdamW's temporaries in reserved: analytic vs the allocator simulator",
         "minutes": 1, "quick": None}


MiB = 2**20
SETUPS = [  # (model, batch, seq, precision)
    ("llama-3.2-1b", 2, 1024, "amp-bf16"), ("llama-3.2-1b", 1, 256, "amp-bf16"), ("llama-3.2-1b", 4, 1024, "amp-bf16"),
    ("llama-3.2-1b", 1, 2048, "amp-bf16"), ("llama-3.2-1b", 2, 1024, "bf16"), ("qwen2.5-0.5b", 2, 512, "amp-bf16"),
    ("gpt2", 4, 512, "amp-bf16"), ("gpt2", 8, 1024, "fp32"), ("pythia-160m", 2, 512, "amp-bf16"),
]


def row(model: str, batch: int, seq: int, precision: str, impl: str) -> dict:
    from trainfit import overheads
    from trainfit.analytic.engine import fsdp2_side_streams, largest_transient, step_reserve
    from trainfit.analytic.memory import train_memory
    from trainfit.api import resolve
    from trainfit.setup import Request
    from trainfit.trace.engine import replay_of, trace_train

    spec, setup = resolve(Request(model=model, batch=batch, seq=seq, precision=precision, device="cuda",
                                  optimizer_impl=impl))
    _, rec, _ = trace_train(spec, setup, flops=False)
    mem = train_memory(spec, setup)
    without = overheads.reserved_from_allocated(mem.peak, largest_transient(spec, setup, mem),
                                                fsdp2_side_streams(spec, setup, mem))
    return {"simulated": replay_of(rec, setup, None).reserved, "analytic": step_reserve(spec, setup, mem),
            "without": without}


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    print("| setup | optimizer | simulated reserved (MiB) | analytic | error | without foreach's segments | error |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for model, batch, seq, precision in SETUPS:
        for impl in ("fused", "foreach"):
            r = row(model, batch, seq, precision, impl)
            sim = r["simulated"]
            print(f"| {model} b{batch} s{seq} {precision} | {impl} | {sim / MiB:,.0f} | {r['analytic'] / MiB:,.0f} | "
                  f"{r['analytic'] / sim - 1:+.1%} | {r['without'] / MiB:,.0f} | {r['without'] / sim - 1:+.1%} |",
                  flush=True)


if __name__ == "__main__":
    main()
