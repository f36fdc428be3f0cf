"""BENCHMARKS.md, generated from the committed results only.

Inputs: bench/results/figures/*.json (one file per benchmark, written when it runs: name, title, target, figure,
values, command, date, machine, area, optional rows) and bench/results/gpu/manifest.toml (the GPU runs).
Each row of a figures file names the page table it belongs to ("table"); its other keys are that table's columns.
The topic write-ups linked at the end are the pages under docs/benchmarks/, titled by their first heading.

    python -m bench.report            write BENCHMARKS.md
    python -m bench.report --check    exit 1 if BENCHMARKS.md differs from what would be written
"""
from __future__ import annotations

import argparse
import json
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ROOT / "bench" / "results" / "figures"
MANIFEST = ROOT / "bench" / "results" / "gpu" / "manifest.toml"
TOPICS = ROOT / "docs" / "benchmarks"
PAGE = ROOT / "BENCHMARKS.md"

MAX_LINES = 200
MAX_CELL = 120
REQUIRED = ("name", "title", "target", "figure", "values", "command", "date", "machine", "area")

INTRO = """\
# trainfit benchmarks

What is measured: the memory (peak, reserved, what a step needs to fit) and step time trainfit predicts, each against a
truth, with the command that reproduces it, its date and machine. Errors are signed: (prediction − truth) / truth.
Truth is a real step (CPU or GPU) or a published run. Published runs are calibration (in sample: constants may have
been chosen on them) or validation (out of sample): nothing is ever tuned to a validation run.
"""

# Areas of the targets table, in page order: key → what its rows compare with.
AREAS = {
    "cpu-memory": "memory vs real CPU steps",
    "stacks": "training stacks",
    "gpu": "GPU runs",
    "published": "published runs",
    "speed": "speed",
    "anchors": "other tools",
}

# Tables built from the figures files' rows, in page order: key → (heading, one line under it).
TABLES = {
    "accuracy": ("How accurate is it for my stack and GPU?",
                 "Median and worst |error| per stack and engine, against the truth named; details below."),
    "cpu": ("Memory vs real CPU steps, per stack",
            "The real step runs on a CPU; its peak comes from PyTorch's own allocation records."),
    "gpu": ("Memory and time vs GPU runs", "Real steps on GPUs, each beside both engines' predictions."),
    "published": ("Published runs: calibration (in sample) and validation (out of sample)",
                  "Signed error of trainfit's prediction against the published figure; nothing fitted on validation."),
    "speed": ("Speed", "Wall time of trainfit itself."),
    "anchors": ("Other tools on the same cases", "Each tool's estimate against the same real CPU peaks."),
}


def load_figures(folder: Path = FIGURES) -> list[dict]:
    """Every figures file in the folder, checked against the schema, in targets-table order."""
    figures = []
    for path in sorted(folder.glob("*.json")):
        fig = json.loads(path.read_text())
        missing = [key for key in REQUIRED if key not in fig]
        if missing:
            raise ValueError(f"{path.name}: missing {', '.join(missing)}")
        if fig["area"] not in AREAS:
            raise ValueError(f"{path.name}: area {fig['area']!r} is not one of {', '.join(AREAS)}")
        for row in fig.get("rows", []):
            if row.get("table") not in TABLES:
                raise ValueError(f"{path.name}: row table {row.get('table')!r} is not one of {', '.join(TABLES)}")
        figures.append(fig)
    area_order = list(AREAS)
    return sorted(figures, key=lambda f: (area_order.index(f["area"]), f["name"]))


def load_manifest(path: Path = MANIFEST) -> list[dict] | None:
    """The GPU runs' manifest entries (any top-level array of tables, or tables keyed by file, each naming its gpu:
    not the [readers] table, which says which tests read each kind); None if absent."""
    if not path.exists():
        return None
    data = tomllib.loads(path.read_text())
    entries = []
    for key, value in data.items():
        if isinstance(value, list):
            entries += [entry for entry in value if isinstance(entry, dict)]
        elif isinstance(value, dict) and "gpu" in value:
            entries.append({"file": key, **value})
    return entries


def load_topics(folder: Path = TOPICS) -> list[tuple[str, str]]:
    """(path relative to the repository, title) of each topic page, by file name."""
    topics = []
    for path in sorted(folder.glob("*.md")):
        lines = path.read_text().splitlines()
        title = next((line.lstrip("# ").strip() for line in lines if line.startswith("# ")), path.stem)
        topics.append((path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name, title))
    return topics


def cell(value, where: str) -> str:
    text = "—" if value is None else str(value)
    if len(text) > MAX_CELL:
        raise ValueError(f"{where}: cell longer than {MAX_CELL} characters: {text[:60]}…")
    return text.replace("|", "\\|").replace("\n", " ")


def table(header: list[str], rows: list[list], where: str) -> list[str]:
    lines = ["| " + " | ".join(cell(name, where) for name in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(value, f"{where}, row {row[0]!r}") for value in row) + " |" for row in rows]
    return lines


def targets_section(figures: list[dict]) -> list[str]:
    rows = [[f["title"], f["target"], f["figure"], f"`{f['command']}`", f["date"], f["machine"]] for f in figures]
    return ["## Every benchmark against its target", "",
            *table(["what", "target", "current figure", "command", "date", "machine"], rows, "targets"), ""]


def rows_section(key: str, figures: list[dict]) -> list[str]:
    rows = [row for fig in figures for row in fig.get("rows", []) if row["table"] == key]
    if not rows:
        return []
    columns = [column for column in dict.fromkeys(c for row in rows for c in row) if column != "table"]
    heading, note = TABLES[key]
    level = "##" if key == "accuracy" else "###"
    return [f"{level} {heading}", "", note, "",
            *table(columns, [[row.get(column, "") for column in columns] for row in rows], key), ""]


def manifest_section(entries: list[dict] | None) -> list[str]:
    """The GPU runs summarised per GPU and kind (each run, its cases, software and readers: the manifest itself)."""
    lines = ["### GPU runs", ""]
    if entries is None:
        return lines + ["No GPU run manifest (bench/results/gpu/manifest.toml) is committed yet.", ""]
    groups: dict[tuple[str, str], list[dict]] = {}
    for entry in entries:
        groups.setdefault((entry.get("gpu", ""), entry.get("kind", "")), []).append(entry)
    rows = []
    for (gpu, kind), runs in groups.items():
        dates = sorted({str(run.get("date", "")) for run in runs})
        chips = sorted({run.get("chip", "") for run in runs})
        known = [chip for chip in chips if chip not in ("none", "") and not chip.startswith("unrecorded")]
        fitted = sum(len(run.get("fitted", [])) for run in runs)
        rows.append([gpu, kind, len(runs), " … ".join(dict.fromkeys([dates[0], dates[-1]])),
                     ", ".join(known) or "—", len(chips) - len(known), fitted])
    return lines + ["From bench/results/gpu/manifest.toml (each run's cases, software, fitted constants and readers are "
                    "there).", "", *table(["gpu", "kind", "runs", "dates", "chips (uuid prefix)", "chips unrecorded",
                                           "constants fitted"], rows, "manifest"), ""]


def topics_section(topics: list[tuple[str, str]]) -> list[str]:
    return ["## Topic write-ups", "", *(f"- [{title}]({path})" for path, title in topics), ""]


def render(figures: list[dict], manifest: list[dict] | None, topics: list[tuple[str, str]]) -> str:
    lines = [INTRO.rstrip("\n"), "", *rows_section("accuracy", figures), *targets_section(figures),
             "## By area", ""]
    for key in TABLES:
        if key == "accuracy":
            continue
        lines += rows_section(key, figures)
        if key == "gpu":
            lines += manifest_section(manifest)
    lines += topics_section(topics)
    text = "\n".join(lines).rstrip("\n") + "\n"
    count = text.count("\n")
    if count > MAX_LINES:
        raise ValueError(f"the page would have {count} lines, more than {MAX_LINES}")
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench report", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the page differs from what would be written")
    parser.add_argument("--figures", type=Path, default=FIGURES, help="folder of figures files")
    parser.add_argument("--manifest", type=Path, default=MANIFEST, help="the GPU runs' manifest")
    parser.add_argument("--topics", type=Path, default=TOPICS, help="folder of topic pages")
    parser.add_argument("--out", type=Path, default=PAGE, help="the page to write or check")
    args = parser.parse_args(argv)
    text = render(load_figures(args.figures), load_manifest(args.manifest), load_topics(args.topics))
    if args.check:
        current = args.out.read_text() if args.out.exists() else ""
        if current != text:
            print(f"{args.out.name} is not what the results give: run `python -m bench report`", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(text)
    print(f"wrote {args.out.name}: {text.count(chr(10))} lines from {len(list(args.figures.glob('*.json')))} "
          "figures files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
