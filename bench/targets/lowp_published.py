"""Low-precision (FP8/MX/NVFP4) and Blackwell/MI300X training runs against their published throughput and reserved
memory: calibration (C5–C7 of shared/calibration.md) and validation apart, with medians. Nothing is fitted here;
validation is never a gate.

    python -m bench run lowp_published        # prints the table, writes bench/results/lowp_published.md

The runs are those of bench/targets/time_runs.py (throughput) and bench/targets/stacks_published.py (reserved memory)
collected for it (time_runs.LOWP_CALIBRATION, LOWP_VALIDATION: their bf16 baselines too) and any other that uses a
low-precision recipe or runs on a Blackwell or AMD Instinct GPU (`in_scope`); each is predicted by its own
target's public path (time_published.predict, stacks_published.predict), so one job has one definition. A run this
checkout cannot express (a setting, recipe, stack feature or GPU it lacks, or a layout no Setup has) is listed as
"not expressible: <reason>" and left out of the medians.

Errors: throughput = predicted tokens/s / published − 1 (= published step time / predicted − 1; positive: predicted
faster); reserved = predicted reserved (the analytic engine's memory.reserved) / published max_reserved − 1.
Targets (issue 39): on runs not fitted on, throughput median |error| ≤ 10 %, reserved median |error| ≤ 5 %.
"""
from __future__ import annotations

import argparse
import statistics

from bench.data import results_dir
from bench.figures import pct, record
from bench.targets import stacks_published, time_published
from bench.targets.time_runs import LOWP_CALIBRATION, LOWP_VALIDATION, RUNS, gpus, published_step

ABOUT = {"summary": "FP8/MX/NVFP4 and Blackwell/MI300X runs: throughput and reserved vs published",
         "minutes": 0.2, "quick": None}

KINDS = ("calibration", "validation")
# the GPU generations (time_published.GENERATION) whose every run belongs here, low precision or not
GENERATIONS = ("Blackwell", "CDNA")
# the runs collected for this table (their bf16 baselines on Hopper included)
OWN = {r["id"] for r in LOWP_CALIBRATION + LOWP_VALIDATION}


def recipe_of(setup: dict) -> str:
    """The row's recipe as the table names it: --low-precision (bf16 without), with a non-default --mx-scale."""
    lp = setup.get("low_precision", "bf16")
    return lp + (f" ({setup['mx_scale']})" if setup.get("mx_scale", "floor") != "floor" else "")


def in_scope(run_id: str, setup: dict, gpu: str) -> bool:
    """One of this table's own runs, a low-precision recipe, or a Blackwell / AMD Instinct GPU."""
    return (run_id in OWN or setup.get("low_precision", "none") != "none"
            or time_published.generation(gpu).startswith(GENERATIONS))


def throughput_rows() -> list[dict]:
    out = []
    for r in RUNS:
        if not in_scope(r["id"], r["setup"], r["gpu"]):
            continue
        dense = time_published.build_spec(r).moe is None
        row = {"id": r["id"], "kind": KINDS[0] if r.get("in_sample") else KINDS[1], "gpu": r["gpu"],
               "group": f"{r['setup']['stack']} · {time_published.generation(r['gpu'])} · {'dense' if dense else 'MoE'}",
               "gpus": gpus(r), "recipe": recipe_of(r["setup"]), "stack": r["setup"]["stack"],
               "published": f"{r['published']:g} {r['unit']}"}
        try:
            row["error"] = published_step(r) / time_published.predict(r) - 1
        except Exception as err:  # noqa: BLE001 — what this checkout cannot express is reported, not fatal
            row["not_expressible"] = str(err).splitlines()[0].removeprefix("not expressible: ")
        out.append(row)
    return out


def memory_rows() -> list[dict]:
    out = []
    for run in stacks_published.RUNS:
        s = dict(run.settings)
        if run.metric != "reserved" or not in_scope(run.name, s, s.get("gpu", "")):
            continue
        p = stacks_published.predict(run)
        row = {"id": run.name, "kind": run.kind, "gpu": s.get("gpu"), "recipe": recipe_of(s),
               "published": f"{run.published_gib:g} GiB max_reserved"}
        if "error" in p:
            row["not_expressible"] = p["error"]
        elif p.get("reserved") is None:
            row["not_expressible"] = "no reserved estimate for this setup"
        else:
            row["predicted"] = f"{p['reserved']:.2f} GiB"
            row["error"] = p["reserved"] / run.published_gib - 1
        out.append(row)
    return out


def stats(rows: list[dict]) -> dict:
    """Per kind: runs, expressible ones, median |error| and worst (signed) over the expressible."""
    out = {}
    for kind in KINDS:
        mine = [r for r in rows if r["kind"] == kind]
        errs = [r["error"] for r in mine if "error" in r]
        out[kind] = {"runs": len(mine), "expressible": len(errs),
                     "median_abs": statistics.median(abs(e) for e in errs) if errs else None,
                     "worst": max(errs, key=abs) if errs else None}
    return out


def _summary(s: dict) -> str:
    if not s["expressible"]:
        return f"{s['runs']} runs, none expressible yet"
    return (f"{s['expressible']} of {s['runs']} runs expressible · median |error| {s['median_abs']:.1%} · worst "
            f"{s['worst']:+.1%}")


def render(tput: list[dict], mem: list[dict]) -> str:
    ts, ms = stats(tput), stats(mem)
    out = ["# Low-precision and Blackwell/MI300X runs vs published (`python -m bench run lowp_published`)", "",
           "Runs and sources: bench/targets/time_runs.py (LOWP_CALIBRATION, LOWP_VALIDATION and the earlier Float8 "
           "rows) and bench/targets/stacks_published.py. Throughput error = predicted tokens/s ÷ published − 1 "
           "(positive: predicted faster); reserved error = predicted ÷ published max_reserved − 1. Calibration = "
           "C5–C7 (shared/calibration.md); nothing is fitted on validation, and validation is no gate. Targets on "
           "validation: throughput median ≤ 10 %, reserved median ≤ 5 %.", "",
           "| metric | kind | summary |", "| --- | --- | --- |"]
    for name, st in (("throughput", ts), ("reserved memory", ms)):
        out += [f"| {name} | {kind} | {_summary(st[kind])} |" for kind in KINDS]
    groups = sorted({r["group"] for r in tput if r["kind"] == KINDS[1] and "error" in r})
    out += ["", "Validation throughput by stack, GPU generation and model kind (where the misses are):", "",
            "| group | summary |", "| --- | --- |"]
    for g in groups:
        mine = [dict(r, kind=KINDS[1]) for r in tput if r.get("group") == g and r["kind"] == KINDS[1]]
        out.append(f"| {g} | {_summary(stats(mine)[KINDS[1]])} |")
    for title, rows, cols in (
            ("Throughput", tput, ("run", "kind", "GPU", "GPUs", "recipe", "stack", "published", "error")),
            ("Reserved memory", mem, ("run", "kind", "GPU", "recipe", "published", "predicted", "error"))):
        out += ["", f"## {title}", "", "| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
        for kind in KINDS:
            for r in (r for r in rows if r["kind"] == kind):
                cells = {"run": r["id"], "kind": kind, "GPU": r["gpu"], "GPUs": r.get("gpus", ""),
                         "recipe": r["recipe"], "stack": r.get("stack", ""), "published": r["published"],
                         "predicted": r.get("predicted", "—"),
                         "error": f"{r['error']:+.1%}" if "error" in r else f"not expressible: {r['not_expressible']}"}
                out.append("| " + " | ".join(str(cells[c]) for c in cols) + " |")
    out += ["", "Candidates left out (no stated layout, GPU or precision; not collected): bench/targets/time_runs.py "
            "SKIPPED, listed in bench/results/time_published.md."]
    return "\n".join(out) + "\n"


def table_rows(values: dict) -> list[dict]:
    """The page's published-runs lines (bench/report.py): throughput and reserved memory, calibration and validation."""
    out = []
    for metric, label in (("throughput", "throughput"), ("reserved", "reserved memory")):
        for kind in KINDS:
            s = values[metric][kind]
            out.append({"table": "published", "runs": f"FP8/MX/NVFP4, Blackwell, MI300X: {label} "
                        f"({s['expressible']} of {s['runs']} expressible)", "kind": kind, "n": s["expressible"],
                        "median |error|": "—" if s["median_abs"] is None else pct(s["median_abs"], False),
                        "worst": "—" if s["worst"] is None else pct(s["worst"])})
    return out


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    tput, mem = throughput_rows(), memory_rows()
    text = render(tput, mem)
    print(text)
    values = {"throughput": stats(tput), "reserved": stats(mem),
              "not_expressible": sorted({r["id"] for r in tput + mem if "not_expressible" in r})}
    v = values["throughput"]["validation"], values["reserved"]["validation"]
    figure = ("validation: throughput " + ("—" if v[0]["median_abs"] is None else f"{v[0]['median_abs']:.1%}")
              + f" median ({v[0]['expressible']}/{v[0]['runs']} runs), reserved "
              + ("—" if v[1]["median_abs"] is None else f"{v[1]['median_abs']:.1%}")
              + f" ({v[1]['expressible']}/{v[1]['runs']})")
    record("lowp_published", "FP8/MX/NVFP4 and Blackwell/MI300X runs vs published",
           "validation: throughput median ≤ 10 %, reserved median ≤ 5 %", figure, values, "published",
           rows=table_rows(values), machine="published GPU runs; predictions by the analytic engine")
    path = results_dir() / "lowp_published.md"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)


if __name__ == "__main__":
    main()
