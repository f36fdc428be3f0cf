"""trainfit's benchmarks: the evidence behind docs/design.md's targets, the GPU harness, studies and tools.

Run them with `python -m bench list` and `python -m bench run [--quick] [NAME ...]` (bench/README.md).
"""
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the repository


def child_env(env: dict[str, str]) -> dict[str, str]:
    """`env` with the repository and its src/ first on PYTHONPATH: for a benchmark's worker processes
    (`python -m bench.<kind>.<name> --worker ...`), which import bench and trainfit from this tree."""
    import os

    paths = [str(ROOT / "src"), str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    return {**env, "PYTHONPATH": os.pathsep.join(paths)}
