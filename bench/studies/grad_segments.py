"""The analytic engine's reserved with and without the gradients' own segments, against the allocator simulator (no
GPU needed; ~6 minutes on 2 cores).

    python -m bench run grad_segments > bench/results/grad_segments.md

analytic/grad_segments.py: a gradient larger than every activation block, not carved from the loss's freed blocks,
opens a segment of its own in the first step, which sits free at every later step's peak, less the optimizer states
the first optimizer.step() carved from the activations' cache. The reference is the trace engine's allocator replay
(trace/depth_records.py at full depth for deep models; within 1.35 % of the 18 steps measured on an H200,
bench/results/trace_reserved.md). Error = analytic reserved / simulated reserved − 1 (both with --gpu H200's
workspaces).
"""
from __future__ import annotations

import argparse

ABOUT = {"summary": "the gradients' own segments in reserved vs the allocator simulator", "minutes": 6, "quick": None}


SETUPS = [  # (model, settings): the mechanism on (gradients above the largest activation block) and off
    ("llama-3.1-8b", dict(batch=2, seq=1024, precision="bf16")),
    ("llama-3.1-8b", dict(batch=1, seq=2048, precision="bf16")),
    ("llama-3.2-3b", dict(batch=2, seq=1024, precision="amp-bf16")),
    ("llama-3.2-1b", dict(batch=2, seq=1024, precision="amp-bf16")),
    ("llama-3.2-1b", dict(batch=4, seq=512, precision="amp-bf16")),
    ("llama-3.2-1b", dict(batch=8, seq=1024, precision="amp-bf16")),
    ("llama-3.2-1b", dict(batch=2, seq=1024, precision="amp-bf16", recompute="full")),
    ("qwen2.5-1.5b", dict(batch=2, seq=1024, precision="amp-bf16")),
    ("qwen2.5-0.5b", dict(batch=2, seq=512, precision="amp-bf16")),
    ("tinyllama-1.1b", dict(batch=2, seq=1024, precision="amp-bf16", stack="torchtitan")),
    ("tinyllama-1.1b", dict(batch=4, seq=2048, precision="amp-bf16", stack="torchtitan")),
    ("pythia-1b", dict(batch=1, seq=512, precision="amp-bf16")),
    ("llama-3.2-1b", dict(batch=2, seq=1024, precision="bf16")),  # off: 16-bit gradients fit the intermediates
    ("llama-3.2-1b", dict(batch=2, seq=1024, precision="fp32")),  # off: fp32 intermediates
]


def rows():
    from trainfit.analytic.engine import estimate, grad_segments, transient_blocks
    from trainfit.analytic.memory import train_memory
    from trainfit.hardware import get_gpu
    from trainfit.models.resolve import load_model
    from trainfit.overheads import with_device_total
    from trainfit.setup import Setup
    from trainfit.trace.engine import trace_spec

    gpu = get_gpu("H200")
    for model, kw in SETUPS:
        spec, setup = load_model(model), Setup(device="cuda", **kw)
        simulated = with_device_total(trace_spec(spec, setup, flops=False), gpu).memory.reserved
        an = estimate(spec, setup, gpu=gpu).memory.reserved
        mem = train_memory(spec, setup)
        added = grad_segments(spec, setup, mem, transient_blocks(spec, setup, mem))
        yield model, kw, simulated, an, added


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    print("`python -m bench run grad_segments > bench/results/grad_segments.md` (analytic reserved / the allocator "
          "simulator's − 1, both with --gpu H200's workspace)\n")
    print("| setup | simulated reserved GiB | analytic without / with the gradients' segments | added GiB |")
    print("|---|---:|---:|---:|")
    errs = []
    for model, kw, sim, an, added in rows():
        label = f"{model} " + " ".join(f"{k}={v}" for k, v in kw.items())
        errs.append(an / sim - 1)
        print(f"| {label} | {sim / 2**30:.2f} | {(an - added) / sim - 1:+.1%} / {an / sim - 1:+.1%} | "
              f"{added / 2**30:.2f} |", flush=True)
    print(f"\nwith: {min(errs):+.1%} to {max(errs):+.1%}, mean |error| {sum(map(abs, errs)) / len(errs):.1%} "
          f"over {len(errs)} setups")


if __name__ == "__main__":
    main()
