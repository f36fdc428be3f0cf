"""Committed measurements under bench/results, read by name (the benchmarks write there; tests read through here)."""
from __future__ import annotations

import json
from pathlib import Path

from bench import ROOT


def results_dir() -> Path:
    """bench/results: every committed measurement and table."""
    return ROOT / "bench" / "results"


def read_json(relpath: str) -> dict:
    """The JSON file at `relpath` under bench/results."""
    return json.loads(read_text(relpath))


def read_text(relpath: str) -> str:
    """The text of the file at `relpath` under bench/results."""
    return (results_dir() / relpath).read_text()
