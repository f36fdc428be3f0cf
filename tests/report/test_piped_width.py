"""A report piped into a file or another program (no terminal, COLUMNS unset) keeps every table cell whole: rich's
default there is 80 columns, at which plan's table cut its numbers to '65,…' (report/console.py)."""
from __future__ import annotations

import os
import subprocess
import sys


def test_piped_plan_table_keeps_its_numbers():
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    out = subprocess.run([sys.executable, "-m", "trainfit.cli", "plan", "llama-3.1-70b", "--gpu", "H100-80GB", "--gpus",
                          "64"], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = [line for line in out.stdout.splitlines() if line.startswith("│")]
    assert rows and not any("…" in line for line in rows), out.stdout
    header = next(line for line in out.stdout.splitlines() if "tokens/s" in line)
    assert "micro×accum" in header and "headroom" in header
