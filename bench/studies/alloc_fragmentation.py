"""How far the caching allocator's reserved sits above the allocated peak, over traced setups (issue 13).

For each setup: the trace engine's full step (fake tensors, CUDA semantics) replayed through trainfit.alloc
(default settings and expandable_segments:True), next to a mechanism-based estimate the analytic engine could
use without a trace, and the analytic engine's own rule (analytic.engine.step_reserve on its own peak):
    trace column: peak + largest transient storage of the step (cached after it dies, while later, differently
    sized requests open new segments);
    analytic column: peak + one cached block (logits, MLP intermediate or tied-embedding partial gradient) +
    FSDP2's side-stream blocks (overheads.reserved_from_allocated).
Run: python -m bench run alloc_fragmentation [model ...] > bench/results/alloc_fragmentation.md
(dp > 1 rows trace one rank of FSDP2 in a fake process group, trace/distributed.py.)
"""
from __future__ import annotations

import sys
import time

from trainfit.alloc.replay import replay

ABOUT = {"summary": "caching allocator reserved above the allocated peak, over traced setups",
         "minutes": 3, "quick": None}

GiB = 2 ** 30
SETUPS = [  # Request settings; dp > 1: one rank of the sharded step (trace/distributed.py, FSDP2's streams apart)
    dict(model="tiny-llama", batch=4, seq=512, recompute="none"),
    dict(model="tiny-llama", batch=4, seq=512, recompute="full"),
    dict(model="gpt2", batch=1, seq=256, recompute="none"),
    dict(model="gpt2", batch=4, seq=512, recompute="none"),
    dict(model="gpt2", batch=4, seq=512, recompute="full"),
    dict(model="pythia-160m", batch=2, seq=512, recompute="none"),
    dict(model="pythia-160m", batch=2, seq=512, recompute="full"),
    # issue 13 additions: other families, op-level SAC, FSDP2 on two ranks
    dict(model="llama-3.2-1b", batch=1, seq=256, recompute="none"),
    dict(model="llama-3.2-1b", batch=1, seq=256, recompute="full"),
    dict(model="gpt2-medium", batch=2, seq=512, recompute="none"),
    dict(model="gpt2-medium", batch=2, seq=512, recompute="full"),
    dict(model="qwen2.5-0.5b", batch=2, seq=256, recompute="none"),
    dict(model="opt-125m", batch=4, seq=512, recompute="none"),
    dict(model="tiny-llama", batch=4, seq=512, recompute="op", stack="torchtitan"),
    dict(model="tiny-llama", batch=4, seq=512, recompute="none", stack="torchtitan", dp=2, zero=3),
    dict(model="tiny-llama", batch=4, seq=512, recompute="op", stack="torchtitan", dp=2, zero=3),
    dict(model="tinyllama-1.1b", batch=1, seq=512, recompute="op", stack="torchtitan", dp=2, zero=3),
    dict(model="qwen2.5-0.5b", batch=2, seq=256, recompute="none", dp=2, zero=3),
    # the mechanism-based analytic rule's held-out rows (not looked at while deriving it)
    dict(model="llama-3.2-1b", batch=1, seq=256, recompute="none", dp=2, zero=3),
    dict(model="bert-base", batch=8, seq=256, recompute="none"),
    dict(model="pythia-1b", batch=1, seq=512, recompute="none"),
    dict(model="qwen2.5-0.5b", batch=1, seq=512, recompute="full"),
    dict(model="tinyllama-1.1b", batch=1, seq=1024, recompute="op", stack="torchtitan", dp=2, zero=3),
]


def label(kw: dict) -> str:
    extra = "".join(f" {k}={kw[k]}" for k in ("stack", "dp", "zero") if k in kw)
    return f"{kw['model']} b{kw['batch']} s{kw['seq']} rc={kw['recompute']}{extra}"


def study(kw: dict) -> dict:
    from trainfit.analytic.engine import step_reserve
    from trainfit.analytic.memory import train_memory
    from trainfit.api import resolve
    from trainfit.setup import Request
    from trainfit.trace.distributed import trace_rank
    from trainfit.trace.engine import trace_train

    spec, setup = resolve(Request(**kw))
    t0 = time.perf_counter()
    _, rec, an = trace_rank(spec, setup) if setup.dp > 1 else trace_train(spec, setup, flops=False)
    base = replay(rec.records, rec.step_start, end=rec.stop)
    exp = replay(rec.records, rec.step_start, "expandable_segments:True", end=rec.stop)
    largest = max((r.nbytes for r in rec.records if r.birth >= rec.step_start and r.death is not None), default=0)
    formula = an.peak + largest
    analytic = step_reserve(spec, setup, train_memory(spec, setup))
    return {"setup": label(kw), "peak": an.peak, "reserved": base.reserved,
            "expandable": exp.reserved, "formula": formula, "ferr": formula / base.reserved - 1,
            "analytic": analytic, "err": analytic / base.reserved - 1,
            "seconds": time.perf_counter() - t0}


def main(argv: list[str] | None = None) -> None:
    rows = [s for s in SETUPS if not argv or s["model"] in argv]
    print("# bench/studies/alloc_fragmentation.py output (trace engine, CUDA semantics, torch defaults; simulator = "
          "trainfit.alloc, each allocation on its CUDA stream)\n")
    print("| setup | peak GiB | reserved GiB | reserved/peak | expandable GiB | trace peak+largest transient GiB | "
          "error | analytic step_reserve GiB | error |")
    print("|---|---|---|---|---|---|---|---|---|")
    errs, big = [], []
    for s in rows:
        r = study(s)
        errs.append(r["err"])
        print(f"| {r['setup']} | {r['peak'] / GiB:.3f} | {r['reserved'] / GiB:.3f} | {r['reserved'] / r['peak']:.3f} | "
              f"{r['expandable'] / GiB:.3f} | {r['formula'] / GiB:.3f} | {r['ferr']:+.1%} | {r['analytic'] / GiB:.3f} | "
              f"{r['err']:+.1%} |", flush=True)
        big.extend([r["err"]] if r["peak"] >= GiB else [])
    print(f"\nanalytic step_reserve vs the simulator, {len(errs)} setups: error {min(errs):+.1%} to {max(errs):+.1%}, "
          f"mean {sum(errs) / len(errs):+.1%}; {len(big)} real-size setups (peak >= 1 GiB): {min(big):+.1%} to "
          f"{max(big):+.1%}, mean {sum(big) / len(big):+.1%}")


if __name__ == "__main__":
    main(sys.argv[1:])
