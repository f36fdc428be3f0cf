"""Megatron step time vs Korthikanti et al. 2022 Table 5 (calibration C3, /work/shared/calibration.md): validation of
the step-time model's Megatron axes (interleaving, SP, selective recompute) at the fitted constants — nothing is
fitted here.

    python bench/megatron_time.py

Runs: A100-80GB, seq 2048, vocab 51200, TP 8, no data parallelism, micro-batch 1 (22B: 4 sequences, one step),
interleaved 1F1B with 3 virtual stages per device for 175B and 530B (C3; the paper's §6), bf16 with fp32 master.
Error = predicted / published − 1 (positive: predicted slower).
"""
from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from trainfit.analytic.step_time import layout_step_time  # noqa: E402
from trainfit.api import load_spec  # noqa: E402
from trainfit.hardware import get_gpu  # noqa: E402
from trainfit.setup import Setup  # noqa: E402


def gpt(h, layers, heads):
    base = load_spec("gpt-3-175b")
    return replace(base, name=f"gpt-{h}x{layers}", hidden=h, layers=layers, heads=heads, kv_heads=heads,
                   head_dim=h // heads, intermediate=4 * h, vocab=51200, max_positions=2048)


# (name, spec, pp, gpus, global batch, vpp, published full-recompute s, published SP + selective s) — C3 / Table 5
ROWS = [("22B", gpt(6144, 48, 64), 1, 8, 4, 1, 1.42, 1.10),
        ("175B", gpt(12288, 96, 96), 8, 64, 64, 3, 18.13, 13.75),
        ("530B", gpt(20480, 105, 128), 35, 280, 280, 3, 49.05, 37.83),
        ("1T", gpt(25600, 128, 160), 64, 512, 512, 1, 94.42, 71.49)]


def rows():
    gpu = get_gpu("A100-80GB")
    for name, spec, p, n, B, v, t_full, t_sel in ROWS:
        for rec, sp, pub in (("full", False, t_full), ("selective", True, t_sel)):
            micro, accum = (4, 1) if p == 1 else (1, B)
            s = Setup(stack="megatron", batch=micro, seq=2048, grad_accum=accum, precision="bf16-master",
                      recompute=rec, dp=n // (8 * p), tp=8, pp=p, vpp=v, sequence_parallel=sp, attention="eager")
            tm = layout_step_time(spec, s, gpu)
            yield name, rec, v, pub, tm


def main() -> None:
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


if __name__ == "__main__":
    main()
