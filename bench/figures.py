"""A target benchmark's headline figures, written to bench/results/figures/<name>.json (what `python -m bench report`
builds BENCHMARKS.md from). Fields: name, title, target, figure, values, command, date, machine, area, rows."""
from __future__ import annotations

import datetime
import json
import os
import re
from pathlib import Path

from bench.data import results_dir

AREAS = ("cpu-memory", "gpu", "published", "speed", "anchors", "stacks")


def cpu_model(name: str) -> str:
    """/proc/cpuinfo's model name without trademarks, core count, clock or "Processor": "AMD EPYC 9654 96-Core
    Processor" -> "AMD EPYC 9654", "Intel(R) Xeon(R) Platinum 8480+ CPU @ 2.00GHz" -> "Intel Xeon Platinum 8480+"."""
    name = re.sub(r"\((R|TM|tm)\)", "", name)
    name = re.sub(r"\s+(\d+-Core\s+)?(CPU\s+)?(Processor\b|@.*)", "", name)
    return " ".join(name.replace(" CPU", "").split()) or "CPU"


def cpu_machine() -> str:
    """This CPU in one line: its model, the ISA oneDNN takes for its 16-bit kernels (AMX, AVX512-BF16, AVX-512,
    AVX2-VNNI-2, else AVX2: its effective ISA, ONEDNN_MAX_CPU_ISA's cap applied, analytic/onednn.py) and the cores this
    process may use: "AMD EPYC, AVX512-BF16, 2 cores"."""
    from trainfit.analytic.onednn import effective_isa

    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "")
    isa = effective_isa() or ""
    label = ("AMX" if isa.startswith("avx512_core_amx") else "AVX512-BF16" if isa in ("avx512_core_bf16",
             "avx512_core_fp16") else "AVX-512" if isa.startswith("avx512") else "AVX2-VNNI-2" if isa == "avx2_vnni_2"
             else "AVX2" if isa else "no AVX2")
    return f"{cpu_model(model)}, {label}, {len(os.sched_getaffinity(0))} cores"


def pct(x: float, signed: bool = True, digits: int = 1) -> str:
    """An error as the page writes it: -0.235 -> "−23.5 %" (signed) or "23.5 %" (its size), `digits` decimals; one
    that rounds to zero has no sign."""
    size = f"{abs(x) * 100:.{digits}f} %"
    if not signed or float(size[:-2]) == 0:
        return size
    return ("−" if x < 0 else "+") + size


def record(name: str, title: str, target: str | None, figure: str, values: dict, area: str,
           rows: list[dict] | None = None, quick: bool = False, machine: str | None = None) -> Path:
    """Write `name`'s figures file; `quick` when the run was `--quick` (the command then says so); `machine` where
    the figures are not this CPU's (a GPU run's, published runs')."""
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
