"""Speed of the analytic engine and of the CLI (DESIGN.md §5: ≤ 1 ms per setup; `trainfit estimate` for a 70B
model in under a second of wall time, imports included).

    python -m bench run speed
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from bench.figures import record
from trainfit.analytic.compute_time import clear_memos
from trainfit.analytic.engine import estimate
from trainfit.hardware import get_gpu
from trainfit.models.resolve import load_model
from trainfit.setup import Setup

ABOUT = {"summary": "analytic estimate per setup and `trainfit estimate` wall time", "minutes": 1, "quick": None}


def per_setup_us(name: str, setups: list[Setup], repeat: int = 5) -> float:
    """Best of `repeat` passes over `setups`, each from empty op-list memos (compute_time.clear_memos): what a first
    estimate of each setup costs, whatever ran before in the process (warm memos would time their lookups)."""
    spec = load_model(name)
    gpu = get_gpu("H100-80GB")
    estimate(spec, setups[0], gpu)  # warm the data-file caches
    best = []
    for _ in range(repeat):
        clear_memos()
        t0 = time.perf_counter()
        for s in setups:
            estimate(spec, s, gpu)
        best.append((time.perf_counter() - t0) / len(setups))
    return min(best) * 1e6


def cli_seconds(args: list[str], repeat: int = 5) -> float:
    """Median wall time of `trainfit ARGS` as an installed copy runs it: its modules' bytecode cached (pip compiles
    it at install; an editable install writes it on first import), so one untimed run first, with writing allowed
    where the environment forbids it (PYTHONDONTWRITEBYTECODE)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    cmd = [sys.executable, "-m", "trainfit.cli", *args]
    subprocess.run(cmd, check=True, capture_output=True, env=env)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True, env=env)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def table_rows(values: dict[str, str]) -> list[dict]:
    """The page's speed-table lines (bench/report.py) from the measured values."""
    per_setup = [float(v.split()[0]) for k, v in values.items() if k.startswith("analytic estimate")]
    cli = [v for k, v in values.items() if k.startswith("`trainfit")]
    return [{"table": "speed", "what": "analytic estimate, per setup (8B, 405B, Mixtral; 72 setups each)",
             "measured": f"{min(per_setup):.0f}–{max(per_setup):.0f} µs", "target": "≤ 1 ms"},
            {"table": "speed", "what": "trainfit estimate llama-3.1-70b, wall, imports included", "measured": cli[0],
             "target": "< 1 s"},
            {"table": "speed", "what": "trainfit estimate llama-3.1-405b --json, wall", "measured": cli[1], "target": "—"}]


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    setups = [Setup(batch=b, seq=s, recompute=r, dp=dp, tp=tp, zero=z, attention="eager" if r == "selective" else "auto")
              for b in (1, 2, 4, 8) for s in (2048, 8192) for r in ("none", "selective", "full")
              for dp, tp, z in ((1, 1, 0), (8, 1, 1), (8, 8, 3))]
    rows = [("analytic estimate, llama-3.1-8b (72 setups)", f"{per_setup_us('llama-3.1-8b', setups):.0f} µs per setup"),
            ("analytic estimate, llama-3.1-405b (72 setups)", f"{per_setup_us('llama-3.1-405b', setups):.0f} µs per setup"),
            ("analytic estimate, mixtral-8x7b (72 setups)", f"{per_setup_us('mixtral-8x7b', setups):.0f} µs per setup")]
    for args in (["estimate", "llama-3.1-70b", "--gpu", "H100-80GB"],
                 ["estimate", "llama-3.1-405b", "--dp", "64", "--tp", "8", "--pp", "14", "--grad-accum", "16", "--zero", "1", "--gpu", "H100-80GB", "--json"]):
        rows.append((f"`trainfit {' '.join(args)}` wall time (median of 5, imports included)", f"{cli_seconds(args):.2f} s"))
    record("speed", "analytic estimate per setup; `trainfit estimate` 70B wall time",
           "≤ 1 ms per setup; 70B estimate < 1 s wall", f"{rows[0][1]} (8B) · {rows[1][1]} (405B); 70B CLI {rows[3][1]}",
           dict(rows), "speed", rows=table_rows(dict(rows)))
    print("| what | measured |\n|---|---|")
    for what, value in rows:
        print(f"| {what} | {value} |")


if __name__ == "__main__":
    main()
