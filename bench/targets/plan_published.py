"""The planner's time model against published runs with public configurations, term by term.

    python -m bench run plan_published            # prints the table, writes its section of bench/results/plan.md

Runs (definitions, sources and unit conversions: bench/targets/time_runs.py, the one list): Korthikanti et al. 2022 Table 5
(calibration C3, shared/calibration.md), and, out of sample,
Narayanan et al. 2021 Table 2 (GPT-3 174.6B on 384 / 768 / 1536 A100s) and Llama 3 Table 4 (405B on 8192 / 16384
H100s; its interleaved schedule's virtual-stage count is not published, so it is shown at v = 1 and v = 3).
The "GPT-3 on 1024 A100s, 34 days" figure of Narayanan et al. §5.1 is an estimate from their eq. 4, not a measured
run: left out. The full validation set (all GPUs and stacks) is bench/targets/time_published.py.

Nothing is fitted: the compute is the roofline-timed op list (analytic/compute_time.py).
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, replace


from bench.figures import record
from bench import data
from bench.targets.time_published import build_setup, build_spec
from bench.targets.time_runs import RUNS, published_step as run_published_step

from trainfit.analytic.step_time import layout_step_time
from trainfit.hardware import get_gpu
from trainfit.setup import Setup

ABOUT = {"summary": "the planner's time model vs published runs, term by term", "minutes": 0.5, "quick": None}

SOURCES = {"narayanan-": "Narayanan 2021 Table 2", "c3-": "Korthikanti 2022 Table 5 (C3)",
           "llama3-": "Llama 3 Table 4"}


@dataclass(frozen=True)
class Run:
    name: str
    source: str
    spec: object
    gpu: str
    setup: Setup
    published_step: float  # seconds
    published: str  # the metric as published
    fit: bool


def runs() -> list[Run]:
    out = []
    for r in RUNS:
        label = next((v for k, v in SOURCES.items() if r["id"].startswith(k)), None)
        if label is None:
            continue
        spec, setup = build_spec(r), build_setup(r)
        pub = f"{r['published']:g} {r['unit']}"
        vpps = (1, 3) if r["id"].startswith("llama3-") else (setup.vpp,)
        for v in vpps:
            name = r["id"] + (f" (v={v})" if len(vpps) > 1 else "")
            out.append(Run(name, label, spec, r["gpu"],
                           replace(setup, vpp=v), run_published_step(r), pub, bool(r.get("in_sample"))))
    return out


def predict(r: Run):
    """The shipped model: the roofline-timed op list (analytic/compute_time.py) + communication, nothing fitted."""
    return layout_step_time(r.spec, r.setup, get_gpu(r.gpu))


def table(rs: list[Run]) -> str:
    lines = ["| run | source | layout (dp×tp×pp, micro×accum) | published step | predicted step | error | "
             "published | predicted MFU / HFU | compute | recompute | TP | PP | bubble | DP exposed | slowest GPU |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rs:
        tm = predict(r)
        pub = r.published_step
        s = r.setup
        util = r.published
        lines.append(
            f"| {r.name}{'' if r.fit else ' *'} | {r.source} | {s.dp}×{s.tp}×{s.pp}, {s.batch}×{s.grad_accum} | "
            f"{pub:.2f} s | {tm.step_seconds:.2f} s | {tm.step_seconds / pub - 1:+.1%} | {util} | "
            f"{tm.mfu:.1%} / {tm.hfu:.1%} | {tm.compute:.2f} | {tm.recompute:.2f} | {tm.tp_comm:.2f} | "
            f"{tm.pp_comm:.2f} | {tm.bubble:.2f} | {tm.dp_comm:.2f} | {tm.straggler:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    rs = runs()
    errs = sorted((predict(r).step_seconds / r.published_step - 1 for r in rs if r.fit), key=abs)
    outs = sorted((predict(r).step_seconds / r.published_step - 1 for r in rs if not r.fit), key=abs)
    text = [
        "## Time model vs published runs (bench/targets/plan_published.py)",
        "",
        f"The shipped model (each kernel of the step timed by the roofline, analytic/compute_time.py; nothing fitted). "
        f"Calibration C3 ({len(errs)} runs): median |error| {abs(errs[len(errs) // 2]):.1%}, worst {errs[-1]:+.1%}; "
        f"out of sample ({len(outs)} rows): median |error| {abs(outs[len(outs) // 2]):.1%}, worst {outs[-1]:+.1%}. "
        "All 49 published runs: bench/targets/time_published.py.",
        "",
        "Error = predicted / published step time − 1 (positive: we predict slower). Time columns are seconds per "
        "step. `*` = out of sample. Published step times converted as "
        "bench/targets/time_runs.py says: Narayanan from TFLOP/s via their eq. 3; Korthikanti as printed (Table 5); Llama 3 "
        "from TFLOP/s/GPU with 6N + 12·l·h·s FLOPs per token.",
        "",
        table(rs),
        "",
    ]
    out = "\n".join(text)
    print(out)
    record("plan_published", "the planner's time model vs published runs", None,
           f"C3 ({len(errs)}): median {abs(errs[len(errs) // 2]):.1%}; out of sample ({len(outs)}): median "
           f"{abs(outs[len(outs) // 2]):.1%}, worst {outs[-1]:+.1%}",
           {"in_sample": {"runs": len(errs), "median_abs": abs(errs[len(errs) // 2]), "worst": errs[-1]},
            "out_of_sample": {"runs": len(outs), "median_abs": abs(outs[len(outs) // 2]), "worst": outs[-1]}},
           "published")
    data.write_section("plan.md", "## Time model vs published runs", out, "# Planner benchmarks")


if __name__ == "__main__":
    main()
