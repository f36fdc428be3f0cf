"""Megatron step time vs Korthikanti et al. 2022 Table 5 (calibration C3, shared/calibration.md): validation of
the step-time model's Megatron axes (interleaving, SP, selective recompute) at the fitted constants — nothing is
fitted here.

    python -m bench run megatron_time

Runs: A100-80GB, seq 2048, vocab 51200, TP 8, no data parallelism, micro-batch 1 (22B: 4 sequences, one step),
interleaved 1F1B with 3 virtual stages per device for 175B and 530B (C3; the paper's §6), bf16 with fp32 master.
Error = predicted / published − 1 (positive: predicted slower).
"""
from __future__ import annotations

import argparse


from bench.figures import record
from bench.targets.time_published import build_setup, build_spec
from bench.targets.time_runs import RUNS  # (the C3 runs' definitions live there, once)

from trainfit.analytic.step_time import layout_step_time
from trainfit.hardware import get_gpu

ABOUT = {"summary": "Megatron step time vs Korthikanti et al. 2022 Table 5", "minutes": 0.2, "quick": None}


def rows():
    for r in RUNS:
        if not r["id"].startswith("c3-"):
            continue
        s = build_setup(r)
        tm = layout_step_time(build_spec(r), s, get_gpu(r["gpu"]))
        yield r["id"].split("-")[1], s.recompute, s.vpp, r["published"], tm


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    print("| model | recompute | v | published s | predicted s | error | bubble s | TP s |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    errs = []
    for name, rec, v, pub, tm in rows():
        e = tm.step_seconds / pub - 1
        errs.append(abs(e))
        print(f"| {name} | {'full' if rec == 'full' else 'SP + selective'} | {v} | {pub:.2f} | {tm.step_seconds:.2f} "
              f"| {e:+.1%} | {tm.bubble:.2f} | {tm.tp_comm:.2f} |")
    errs.sort()
    print(f"\nmedian |error| {errs[len(errs) // 2]:.1%}, worst {errs[-1]:.1%}")
    record("megatron_time", "Megatron step time vs Korthikanti et al. 2022 Table 5 (in sample, C3)", None,
           f"{len(errs)} runs: median |error| {errs[len(errs) // 2]:.1%}, worst {errs[-1]:.1%}",
           {"runs": len(errs), "median_abs": errs[len(errs) // 2], "worst_abs": errs[-1]}, "published")


if __name__ == "__main__":
    main()
