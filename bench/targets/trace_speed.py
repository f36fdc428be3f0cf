"""Speed of the trace engine (issue 3: a 7B step ≤ 3 s, 70B ≤ 10 s on two cores), with and without layer
extrapolation, against PyTorch's MemTracker on the same fake step. All times from one process, warm (after one
untimed trace, so transformers' imports and torch's one-time setup are excluded — reported separately).

    python -m bench run trace_speed [--skip-405b-full] [--skip-memtracker]
"""
from __future__ import annotations

import argparse
import time

from trainfit.models.resolve import load_model
from trainfit.setup import Setup
from trainfit.trace.engine import trace_spec

ABOUT = {"summary": "trace engine speed for 7B/70B/405B steps, with and without extrapolation",
         "minutes": 5, "quick": ["--skip-405b-full", "--skip-memtracker"]}

SETUP = Setup(batch=1, seq=4096, precision="amp-bf16", optimizer="adamw", device="cuda")


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def memtracker_seconds(name: str) -> tuple[float, int]:
    """The same standard step under torch.distributed._tools.mem_tracker.MemTracker (fake tensors)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    from trainfit.step import make_batches, make_optimizer, run_step
    from trainfit.trace.engine import build_hf
    from trainfit.trace.fake import fake_mode
    from trainfit.trace.train import warm_up_optimizer

    spec = load_model(name)
    t0 = time.perf_counter()
    with fake_mode():
        model = build_hf(spec, SETUP)
        opt = make_optimizer(model, SETUP)
        batches = make_batches(spec, SETUP)
        warm_up_optimizer(model, opt)
        mt = MemTracker()
        mt.track_external(model, opt)
        with mt:
            run_step(model, opt, batches, SETUP)
        peak = sum(mt.get_tracker_snapshot("peak")[next(iter(mt.get_tracker_snapshot("peak")))].values())
    return time.perf_counter() - t0, peak


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--skip-405b-full", action="store_true")
    ap.add_argument("--skip-memtracker", action="store_true")
    args = ap.parse_args(argv)
    cold, _ = timed(lambda: trace_spec(load_model("tiny-llama"), SETUP))
    rows = [("first trace in a fresh process (imports, one-time setup; tiny model)", f"{cold:.1f} s", "")]
    for name in ("llama-2-7b", "llama-2-70b", "llama-3.1-405b"):
        spec = load_model(name)
        t_ex, e_ex = timed(lambda: trace_spec(spec, SETUP, extrapolate=True))
        rows.append((f"{name} training step, layer extrapolation", f"{t_ex:.1f} s", f"peak {e_ex.memory.peak:,} B"))
        if name == "llama-3.1-405b" and args.skip_405b_full:
            continue
        t_full, e_full = timed(lambda: trace_spec(spec, SETUP, extrapolate=False))
        same = "identical peak" if e_full.memory.peak == e_ex.memory.peak else f"peak differs: {e_full.memory.peak:,}"
        rows.append((f"{name} training step, full trace", f"{t_full:.1f} s", same))
    if not args.skip_memtracker:
        t_mt, peak = memtracker_seconds("llama-2-7b")
        rows.append(("llama-2-7b, same step under PyTorch's MemTracker", f"{t_mt:.1f} s", f"peak {peak:,} B"))
    print(f"setup: batch {SETUP.batch}, seq {SETUP.seq}, {SETUP.precision}, {SETUP.optimizer}, --device cuda semantics\n")
    print("| what | seconds | note |\n|---|---|---|")
    for r in rows:
        print(f"| {' | '.join(r)} |")


if __name__ == "__main__":
    main()
