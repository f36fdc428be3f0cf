"""The power-capped clock law (analytic/roofline.py power_clock) against published power-cap measurements, and the
fit of the voltage-floor clock on the calibration runs that ran capped (C2, C5: H100-96GB at 500 W).

    python -m bench run power_clock_published          # the validation table, writes bench/results/power_clock.md
    python -m bench run power_clock_published --fit    # also re-fits kernels.toml [voltage_floor] clock

Validation only (calibration.md: no constant is fitted on these): each point is a board at a cap P against the same
board at a reference power P_ref, with the static power the law takes for it (data/power.toml, or the catalog GPU of
its die where the board is not in the catalog: stated per row). P_ref is the power the uncapped clock held at: the
board's limit for the GEMM (GB300), the uncapped run's measured average draw for the Zeus steps (227 of 250 W, 273
of 300 W; NB the average includes the step's idle gaps, so its GEMMs drew between that and the limit). `measured`
is a throughput ratio; where it is a whole training step (Zeus) it bounds the clock ratio from above, as the step's
memory-bound and host time do not slow with the SM clock. Sources: kernels.toml [sources] GB300PL, ZEUSPL.

The fit: the five C2/C5 rows of bench/targets/time_runs.py through time_published's public path, the knee scanned
on a grid of 0.001 for the least sum of squared log errors (the floor's clock); and the unstated power limit of C6's
"power limited" B200 job, bisected on its bf16 row (time_runs' _AO_POWER_LIMIT keeps it).
"""
from __future__ import annotations

import argparse
import math
import sys

from bench.data import results_dir
from bench.figures import record
from trainfit.analytic.roofline import power_clock

ABOUT = {"summary": "power-capped clock law vs published power-cap points; fits the voltage floor on C2/C5",
         "minutes": 0.2, "quick": None}

# (id, source key, board, P (W), P_ref (W), P_static (W) and whose, generation of the knee, measured ratio(s), kind)
POINTS = [
    ("gb300-gemm-500w", "GB300PL", "GB300", 500, 1400, 137, "B200's (data/power.toml)", "blackwell",
     (617 / 2174, 617 / 1600), "cuBLAS GEMM"),
    ("v100-bert-100w", "ZEUSPL", "V100 (250 W board; uncapped draw)", 100, 226.75, 42, "V100-16GB's", "volta",
     (1766.005 / 3769.47,), "training step"),
    ("v100-bert-150w", "ZEUSPL", "V100 (250 W board; uncapped draw)", 150, 226.75, 42, "V100-16GB's", "volta",
     (1766.005 / 2325.37,), "training step"),
    ("v100-bert-200w", "ZEUSPL", "V100 (250 W board; uncapped draw)", 200, 226.75, 42, "V100-16GB's", "volta",
     (1766.005 / 1884.195,), "training step"),
    ("a40-bert-150w", "ZEUSPL", "A40 (300 W board; uncapped draw)", 150, 273.09, 110, "A40 with a process at P0 (power.toml NB)", "ampere_ga102",
     (1961.784 / 3566.016,), "training step"),
    ("a40-bert-200w", "ZEUSPL", "A40 (300 W board; uncapped draw)", 200, 273.09, 110, "A40 with a process at P0 (power.toml NB)", "ampere_ga102",
     (1961.784 / 2253.946,), "training step"),
    ("a40-bert-250w", "ZEUSPL", "A40 (300 W board; uncapped draw)", 250, 273.09, 110, "A40 with a process at P0 (power.toml NB)", "ampere_ga102",
     (1961.784 / 2011.939,), "training step"),
]

CALIBRATION = ("c2-tt-8b-fsdp8", "c2-tt-8b-fsdp8-compile", "c2-tt-8b-fsdp8-compile-fp8", "c5-torchao-h100-8b-bf16",
               "c5-torchao-h100-8b-tensorwise")


def knee_of(generation: str) -> float:
    from trainfit.analytic.roofline import voltage_floor
    return voltage_floor(generation)


def checks() -> dict[str, dict[str, bool]]:
    """Per point, whether each law agrees with the measurement: inside the measured range (a GEMM's rate), or at or
    under the measured bound (a whole step's, an upper bound of the clock)."""
    out = {}
    for pid, _, _, p, ref, static, _, gen, meas, kind in POINTS:
        lo, hi = (min(meas), max(meas)) if kind == "cuBLAS GEMM" else (0.0, max(meas))
        laws = {"cube": power_clock(p, ref, static), "floor": power_clock(p, ref, static, knee_of(gen))}
        out[pid] = {k: lo <= v <= hi for k, v in laws.items()}
    return out


def table() -> str:
    out = ["| point | board | cap / ref W | static W | measured | cube law | law with the floor (knee) | kind |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for pid, src, board, p, ref, static, whose, gen, meas, kind in POINTS:
        k = knee_of(gen)
        m = f"{min(meas):.3f}" if len(meas) == 1 else f"{min(meas):.3f}–{max(meas):.3f}"
        floor = f"{power_clock(p, ref, static, k):.3f} ({k:g}, {gen})" if k else f"— (no floor for {gen})"
        out.append(f"| {pid} ({src}) | {board} | {p} / {ref} | {static} ({whose}) | {m} | "
                   f"{power_clock(p, ref, static):.3f} | {floor} | {kind} |")
    return "\n".join(out)


def _clear():
    """Every memo of the analytic engine, so a changed knee reaches the step times."""
    from trainfit.analytic import compute_time
    compute_time.clear_memos()
    for m in list(sys.modules.values()):
        if getattr(m, "__name__", "").startswith("trainfit"):
            for v in list(vars(m).values()):
                if hasattr(v, "cache_clear") and getattr(v, "__name__", "") not in ("_table", "load_toml"):
                    v.cache_clear()


def calibration_errors(knee: float) -> dict[str, float]:
    """predicted / published step time - 1 of the C2/C5 rows with Hopper's floor at `knee`."""
    from bench.targets.time_published import predict
    from bench.targets.time_runs import RUNS, published_step
    from trainfit.analytic.roofline import _table
    _table()["voltage_floor"]["clock"] = knee
    _clear()
    return {r["id"]: predict(r) / published_step(r) - 1 for r in RUNS if r["id"] in CALIBRATION}


def fit() -> tuple[float, dict[str, float]]:
    """The knee in [0.80, 1.00] with the least sum of squared log errors over the C2/C5 rows."""
    def loss(k):
        return sum(math.log1p(e) ** 2 for e in calibration_errors(k).values())
    best = min((round(0.80 + i * 0.001, 3) for i in range(201)), key=loss)
    return best, calibration_errors(best)


def fit_c6_limit() -> tuple[float, float]:
    """The board limit (W) at which C6's bf16 row (calibration.md C6: "8x power limited B200", limit not stated) is
    predicted at its published throughput — bisection over [300, 1000] W, the step time falling as the limit rises —
    and the row's error at the limit time_runs keeps (_AO_POWER_LIMIT)."""
    from bench.targets.time_published import predict
    from bench.targets.time_runs import RUNS, published_step
    row = next(r for r in RUNS if r["id"] == "c6-torchao-b200-8b-bf16")

    def err(watts):
        return predict({**row, "power_limit": watts}) / published_step(row) - 1
    lo, hi = 300.0, 1000.0
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if err(mid) > 0 else (lo, mid)
    return (lo + hi) / 2, err(row["power_limit"])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fit", action="store_true", help="re-fit [voltage_floor] clock on C2/C5 and C6's power limit")
    args = ap.parse_args(argv)
    text = ["# Power-capped clock vs published power-cap points (validation only)", "",
            "Law: analytic/roofline.py power_clock; ratios are f(cap) / f(ref) (measured: throughput ratios).", "",
            table(), ""]
    if args.fit:
        kept = knee_of("hopper")
        k, errs = fit()
        text += [f"Fit on C2/C5 (H100-96GB at 500 W): [voltage_floor] clock = {k:.3f} (kernels.toml has {kept:g})", ""]
        text += [f"- {rid}: {e:+.1%}" for rid, e in errs.items()]
        watts, kept_err = fit_c6_limit()
        text += ["", f"Fit on C6 (B200, \"power limited\", limit not stated): {watts:.0f} W (time_runs "
                 f"_AO_POWER_LIMIT keeps a limit at which C6 bf16 is {kept_err:+.1%})"]
        text.append("")
    out = "\n".join(text)
    print(out)
    (results_dir() / "power_clock.md").write_text(out)
    ok = checks()
    floor, cube = sum(v["floor"] for v in ok.values()), sum(v["cube"] for v in ok.values())
    record("power_clock_published", "power-capped clock law vs published power-cap points", None,
           f"{len(ok)} points: {floor} agree with the floor law, {cube} with the cube law", {"agree": ok}, "published",
           rows=[{"table": "published", "runs": "power-capped clock: GB300 GEMM at 500 W (GB300PL), Zeus V100/A40 "
                  "BERT steps under caps (ZEUSPL, bounds)", "kind": "validation", "n": len(ok),
                  "median |error|": "—", "worst": f"{len(ok) - floor} of {len(ok)} outside (cube law: {len(ok) - cube})"}])


if __name__ == "__main__":
    main()
