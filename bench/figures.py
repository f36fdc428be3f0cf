"""A target benchmark's headline figures, written to bench/results/figures/<name>.json (what `python -m bench report`
builds BENCHMARKS.md from). Fields: name, title, target, figure, values, command, date, machine, area, rows."""
from __future__ import annotations

import datetime
import json
import os
from pathlib import Path

from bench.data import results_dir

AREAS = ("cpu-memory", "gpu", "published", "speed", "anchors", "stacks")


def cpu_machine() -> str:
    """This CPU in one line: model name, the bf16 ISA oneDNN sees (avx512_bf16 or AVX2) and the cores this process may use."""
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "CPU")
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    isa = "avx512_bf16" if "avx512_bf16" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    return f"{model}, {isa}, {len(os.sched_getaffinity(0))} cores"


def pct(x: float, signed: bool = True) -> str:
    """An error as the page writes it: -0.235 -> "−23.5 %" (signed) or "23.5 %" (its size)."""
    return f"{x * 100:+.1f} %".replace("-", "−") if signed else f"{abs(x) * 100:.1f} %"


def record(name: str, title: str, target: str | None, figure: str, values: dict, area: str,
           rows: list[dict] | None = None, quick: bool = False, machine: str | None = None) -> Path:
    """Write `name`'s figures file; `quick` when the run was `--quick` (the command then says so); `machine` for a
    GPU run (the GPU's name), else this CPU."""
    if area not in AREAS:
        raise ValueError(f"area {area!r} is not one of {', '.join(AREAS)}")
    if len(figure) > 120:
        raise ValueError(f"figure is {len(figure)} characters (at most 120): {figure}")
    out = {"name": name, "title": title, "target": target, "figure": figure, "values": values,
           "command": f"python -m bench run {'--quick ' if quick else ''}{name}",
           "date": datetime.date.today().isoformat(), "machine": machine or cpu_machine(), "area": area}
    if rows is not None:
        out["rows"] = rows
    path = results_dir() / "figures" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    return path
