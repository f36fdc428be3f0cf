"""The committed measurements under bench/results/, read one way by tests and scripts. GPU runs live in
bench/results/gpu/ and are listed, with what each holds and what was fitted on it, in its manifest.toml."""
from __future__ import annotations

import json
import tomllib
from functools import cache
from pathlib import Path

GPU_DIR = "gpu"


def results_dir() -> Path:
    return Path(__file__).resolve().parent / "results"


def read_json(relpath: str | Path):
    return json.loads(read_text(relpath))


def read_text(relpath: str | Path) -> str:
    return (results_dir() / relpath).read_text()


@cache
def write_section(name: str, heading: str, text: str, title: str) -> Path:
    """Replace (or append) the `heading` section ("## ...") of results/<name>, a markdown page several benchmarks
    share (plan.md: the search speed and the time model), keeping the others' sections where they are (a page that
    does not change with the order its benchmarks ran in)."""
    path = results_dir() / name
    old = path.read_text() if path.exists() else f"{title}\n\n"
    if heading not in old:
        path.write_text(old.rstrip() + "\n\n" + text)
        return path
    start = old.index(heading)
    nxt = old.find("\n## ", start + 1)
    rest = old[nxt + 1:] if nxt >= 0 else ""
    path.write_text(old[:start] + text.rstrip() + "\n" + ("\n" + rest if rest else ""))
    return path


def manifest() -> list[dict]:
    """The GPU runs' manifest: one dict per committed file (bench/results/gpu/manifest.toml)."""
    return _manifest_file()["run"]


@cache
def _manifest_file() -> dict:
    return tomllib.loads(read_text(f"{GPU_DIR}/manifest.toml"))


def kind_readers() -> dict[str, list[str]]:
    """The tests that read every run of a kind (the manifest's [readers])."""
    return _manifest_file()["readers"]


def gpu_path(stem: str) -> Path:
    """The file of one GPU run, by its name with or without .json."""
    return results_dir() / GPU_DIR / (stem if stem.endswith(".json") else f"{stem}.json")


def gpu_run(stem: str) -> dict:
    return json.loads(gpu_path(stem).read_text())


def gpu_runs(kind: str | None = None, gpu: str | None = None) -> dict[str, dict]:
    """Every committed GPU run of a kind (truth, kernels, context, spread) and GPU, by file stem, in the manifest's
    order; the harness's dry run (chip "none") is not a measurement and is left out."""
    return {e["file"].removesuffix(".json"): gpu_run(e["file"]) for e in manifest()
            if e["chip"] != "none" and kind in (None, e["kind"]) and gpu in (None, e["gpu"])}


def chip_id(uuid: str | None) -> str:
    """A GPU run's chip in its file name: the NVML uuid's first 8 hex digits, "unrecorded" without one."""
    return uuid.removeprefix("GPU-")[:8] if uuid else "unrecorded"


def gpu_file_name(gpu: str, date: str, chip: str, kind: str, what: str = "") -> str:
    """<gpu>-<date>-<chip>-<kind>[-<what>].json, the name of a run in bench/results/gpu/ (manifest.toml)."""
    return f"{gpu}-{date}-{chip}-{kind}{'-' + what if what else ''}.json"
