"""How far the caching allocator's reserved sits above the allocated peak, over traced setups (issue 13).

For each setup: the trace engine's full step (fake tensors, CUDA semantics) replayed through trainfit.alloc
(default settings and expandable_segments:True), next to a mechanism-based estimate the analytic engine could
use without a trace:
    reserved ~ peak + largest transient storage of the step (cached after it dies, while later, differently
    sized requests open new segments) + 2 MiB rounding of the live large tensors (not modelled separately).
Run: PYTHONPATH=src python bench/alloc_fragmentation.py [model ...] > bench/results/alloc_fragmentation.md
"""
from __future__ import annotations

import sys
import time

from trainfit.alloc.replay import replay

GiB = 2 ** 30
SETUPS = [  # (model, batch, seq, recompute)
    ("tiny-llama", 4, 512, "none"), ("tiny-llama", 4, 512, "full"),
    ("gpt2", 1, 256, "none"), ("gpt2", 4, 512, "none"), ("gpt2", 4, 512, "full"),
    ("pythia-160m", 2, 512, "none"), ("pythia-160m", 2, 512, "full"),
]


def study(model: str, batch: int, seq: int, recompute: str) -> dict:
    from trainfit.api import resolve
    from trainfit.setup import Request
    from trainfit.trace.engine import trace_train

    spec, setup = resolve(Request(model=model, batch=batch, seq=seq, recompute=recompute))
    t0 = time.perf_counter()
    _, rec, an = trace_train(spec, setup, flops=False)
    base = replay(rec.records, rec.step_start)
    exp = replay(rec.records, rec.step_start, "expandable_segments:True")
    largest = max((r.nbytes for r in rec.records if r.birth >= rec.step_start and r.death is not None), default=0)
    formula = an.peak + largest
    return {"setup": f"{model} b{batch} s{seq} rc={recompute}", "peak": an.peak, "reserved": base.reserved,
            "expandable": exp.reserved, "formula": formula, "err": formula / base.reserved - 1,
            "seconds": time.perf_counter() - t0}


def main(argv: list[str]) -> None:
    rows = [s for s in SETUPS if not argv or s[0] in argv]
    print("| setup | peak GiB | reserved GiB | reserved/peak | expandable GiB | peak+largest transient GiB | error |")
    print("|---|---|---|---|---|---|---|")
    for s in rows:
        r = study(*s)
        print(f"| {r['setup']} | {r['peak'] / GiB:.3f} | {r['reserved'] / GiB:.3f} | {r['reserved'] / r['peak']:.3f} | "
              f"{r['expandable'] / GiB:.3f} | {r['formula'] / GiB:.3f} | {r['err']:+.1%} |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
