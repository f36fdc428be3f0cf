"""The step-time model against every published run of bench/targets/time_runs.py: error per run, then median |error| and
worst, in sample (C1–C3, C5–C8) and out of sample apart, and per GPU generation. Nothing is fitted here.

    python -m bench run time_published        # prints the table, writes bench/results/time_published.md

Only the public path is used (spec + Setup + trainfit.hardware.get_gpu -> layout_step_time(spec, setup, gpu) ->
StepTime.step_seconds), so the table keeps working when step_time.py's internals change.
Error = predicted / published step time − 1 (positive: predicted slower).
Every run here ran, so each is also a fit verdict to get right: the analytic estimate's `time.fits` on the run's GPU
(validation only, never a gate).
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import statistics


from bench.figures import pct, record
from bench.data import results_dir
from bench.targets.time_runs import RUNS, SKIPPED, gpus, published_step

from trainfit.analytic.step_time import layout_step_time
from trainfit.analytic.params import count_params
from trainfit.engines import analytic
from trainfit.api import load_spec
from trainfit.hardware import get_gpu
from trainfit.models.hf_config import for_setup, spec_from_config
from trainfit.setup import Setup

ABOUT = {"summary": "step time vs every published run (in and out of sample)", "minutes": 0.3, "quick": None}

GENERATION = {"V100": "Volta (V100)", "A100": "Ampere (A100)", "H100": "Hopper (H100/H200)",
              "H200": "Hopper (H100/H200)", "B200": "Blackwell (B200/GB200)", "GB200": "Blackwell (B200/GB200)",
              "MI300X": "CDNA 3 (MI300X/MI325X)", "MI325X": "CDNA 3 (MI300X/MI325X)", "MI355X": "CDNA 4 (MI355X)"}
IN_SAMPLE = "in sample (C1–C3, C5–C8)"


def build_spec(run: dict):
    model = run["model"]
    if isinstance(model, str):
        return load_spec(model)
    return spec_from_config(model, run["id"], run["source"])


def build_setup(run: dict) -> Setup:
    return Setup(**run["setup"])


def generation(gpu: str) -> str:
    return GENERATION.get(gpu.split("-")[0], gpu)


def size_band(run: dict) -> str:
    n = count_params(build_spec(run)).total
    bands = ((1e9, "< 1B"), (20e9, "1B–20B"), (200e9, "20B–200B"), (math.inf, "≥ 200B"))
    return next(name for limit, name in bands if n < limit)


def scale(run: dict) -> str | None:
    """"MoE" for a mixture-of-experts model, "dense, multi-node" for a dense one over more GPUs than one node of its
    GPU holds (the catalog's gpus_per_node), else None: the runs of the MoE and multi-node cluster target."""
    if build_spec(run).is_moe:
        return "MoE"
    return "dense, multi-node" if gpus(run) > get_gpu(run["gpu"]).gpus_per_node else None


MOE_AND_MULTI_NODE = "MoE and multi-node dense, out of sample"


def _parts(run: dict):
    """(spec, setup, gpu) of a run as its source states it."""
    if run.get("inexpressible"):  # a layout no Setup has (time_runs' docstring): reported, not approximated
        raise ValueError(f"not expressible: {run['inexpressible']}")
    setup = build_setup(run)
    spec = for_setup(build_spec(run), setup)  # the task head / config the setup asks for, as the CLI does
    gpu = get_gpu(run["gpu"])
    if run.get("power_limit") is not None:  # the board power limit the source states (time_runs' docstring)
        gpu = dataclasses.replace(gpu, power_watts=run["power_limit"])
    return spec, setup, gpu


def predict(run: dict) -> float:
    return layout_step_time(*_parts(run)).step_seconds


def judged_fits(run: dict) -> bool:
    """The analytic estimate's fit verdict on the run's own GPU (the run ran: `True` is right)."""
    return bool(analytic(*_parts(run)).time.fits)


def summary(errs: list[float]) -> str:
    if not errs:
        return "no runs"
    a = [abs(e) for e in errs]
    return f"{len(errs)} runs · median |error| {statistics.median(a):.1%} · worst {max(errs, key=abs):+.1%}"


def render() -> tuple[str, dict[str, list[float]]]:
    """The markdown table, and the signed errors per group (all runs, in/out of sample, generation, size, source)."""
    rows, groups = [], {}
    for r in RUNS:
        pub = published_step(r)
        try:
            pred = predict(r)
        except Exception as err:  # noqa: BLE001 — a setting this checkout refuses is reported, not fatal
            rows.append(f"| {r['id']} | {r['gpu']} | {gpus(r)} | {'in' if r.get('in_sample') else 'out'} | "
                        f"{r['published']:g} {r['unit']} | {pub:.3g} | error: {str(err).splitlines()[0]} | — | — |")
            continue
        e = pred / pub - 1
        fits = judged_fits(r)
        groups.setdefault("judged to fit", []).append(fits)
        if not fits:
            groups.setdefault("judged not to fit", []).append(r["id"])
        groups.setdefault("all runs", []).append(e)
        groups.setdefault(IN_SAMPLE if r.get("in_sample") else "out of sample", []).append(e)
        groups.setdefault("gen: " + generation(r["gpu"]), []).append(e)
        groups.setdefault("size: " + size_band(r), []).append(e)
        groups.setdefault("source: " + r["id"].split("-")[0], []).append(e)
        kind = None if r.get("in_sample") else scale(r)
        if kind:
            groups.setdefault(MOE_AND_MULTI_NODE, []).append(e)
            groups.setdefault(f"scale: {kind}, out of sample", []).append(e)
        rows.append(f"| {r['id']} | {r['gpu']} | {gpus(r)} | {'in' if r.get('in_sample') else 'out'} | "
                    f"{r['published']:g} {r['unit']} | {pub:.3g} | {pred:.3g} | {e:+.1%} | {'yes' if fits else 'no'} |")
    out = ["# Step time vs published runs (`python -m bench run time_published`)", "",
           "Runs and sources: bench/targets/time_runs.py. Error = predicted / published step time − 1 (positive: predicted "
           "slower). Nothing fitted here; in sample = calibration C1–C3, C5–C8 (shared/calibration.md).", "",
           "| group | summary |", "| --- | --- |"]
    verdicts, wrong = groups.pop("judged to fit"), groups.pop("judged not to fit", [])
    for name in sorted(groups, key=lambda g: (g.split(":")[0] in ("gen", "size", "source"), g.split(":")[0], g)):
        out.append(f"| {name} | {summary(groups[name])} |")
    out.append(f"| fit verdict (every run ran) | {sum(verdicts)} of {len(verdicts)} judged to fit"
               + (f"; not: {', '.join(wrong)}" if wrong else "") + " |")
    groups["fit verdicts"] = [float(v) for v in verdicts]
    out += ["", "| run | GPU | GPUs | sample | published | published s/step | predicted s/step | error | judged to fit |",
            "| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | --- |", *rows, "", "Left out:", ""]
    out += [f"- {what}: {why}" for what, why in SKIPPED]
    return "\n".join(out) + "\n", groups


def table_rows(stats: dict[str, dict]) -> list[dict]:
    """The page's lines (bench/report.py): the accuracy table's step-time row, and the published-runs lines in and
    out of sample and by GPU generation."""
    out, inside, every = stats["out of sample"], stats[IN_SAMPLE], stats["all runs"]
    gens = {g.split("(")[1].rstrip(")").replace("/", ", "): v for g, v in stats.items() if g.startswith("gen: ")}
    worst_gen = max(gens, key=lambda g: abs(gens[g]["worst"]))
    line = lambda runs, kind, s: {"table": "published", "runs": runs, "kind": kind, "n": s["runs"],  # noqa: E731
                                  "median |error|": pct(s["median_abs"], False), "worst": pct(s["worst"])}
    return [{"table": "accuracy", "stack": "any", "engine": "analytic step time",
             "truth": f"{every['runs']} published GPU runs (out of sample {out['runs']})", "cases": out["runs"],
             "median |error|": pct(out["median_abs"], False), "worst": pct(out["worst"])},
            line("step time: C1–C3, C5–C8 (Korthikanti, torchtune, torchtitan, torchao, NeMo)",
                 "calibration (in sample)", inside),
            line("step time: Narayanan, Llama 3, torchtitan, llm-foundry, NVIDIA BERT, torchao, NeMo", "validation",
                 out),
            line("step time: MoE runs, and dense runs over more than one node", "validation",
                 stats[MOE_AND_MULTI_NODE]),
            {"table": "published", "runs": f"step time by generation: {' / '.join(gens)}", "kind": "both",
             "n": sum(v["runs"] for v in gens.values()),
             "median |error|": " / ".join(f"{v['median_abs'] * 100:.1f}" for v in gens.values()) + " %",
             "worst": f"{pct(gens[worst_gen]['worst'])} ({worst_gen})"}]


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    text, groups = render()
    print(text)
    verdicts = groups.pop("fit verdicts")
    stats = {g: {"runs": len(e), "median_abs": statistics.median(abs(x) for x in e), "worst": max(e, key=abs)}
             for g, e in groups.items()}
    out = stats["out of sample"]
    record("time_published", "step time vs published runs", "out of sample: median ≤ 10 %, worst ≤ 25 %",
           f"out of sample ({out['runs']} runs): median {out['median_abs']:.1%}, worst {out['worst']:+.1%}; "
           f"{int(sum(verdicts))} of {len(verdicts)} runs judged to fit", stats,
           "published", rows=table_rows(stats))
    path = results_dir() / "time_published.md"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)


if __name__ == "__main__":
    main()
