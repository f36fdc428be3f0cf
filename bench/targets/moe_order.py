"""Published MoE layouts in their published order: for each set of layouts of one model on one cluster at one global
batch (bench/targets/time_runs.py MOE_LAYOUT_RUNS, `layout_set`), the step time the planner's model predicts for each
(the estimate's and `trainfit plan`'s analytic/step_time.py, as time_published.predict runs it), whether the
estimate says it fits, and the rank order against the published one (Kendall's tau over the expressible rows).

    python -m bench run moe_order        # prints the table, writes bench/results/moe_order.md

Then the published dropless-vs-forced-balance pairs (time_runs.py MOE_ROUTING_PAIRS: one layout run both ways): the
published step-time ratio dropless / forced against the predicted one (--moe-force-balance vs the dropless default,
analytic/moe_imbalance.py), and C8's predicted ratio (published dropless only).

Validation only: C8 (shared/calibration.md) is one row of the Qwen3-235B set (in sample, marked); no other number
here may be fitted on.

    python -m bench run moe_order --fit  # also fits the dropless default (moe_imbalance.DROPLESS) on C8 alone

The fit: C8's predicted step time (time_published.predict, as above) equals its published 24.2 s, bisected over
X in [1, 3] (the step time grows with X); the pairs above then check it.
"""
from __future__ import annotations

import argparse
from itertools import combinations

from bench import data
from bench.figures import record
from bench.targets.time_published import build_setup, build_spec, predict
from bench.targets.time_runs import C8_RUN, MOE_LAYOUT_RUNS, MOE_ROUTING_PAIRS, published_step
from trainfit.engines import analytic
from trainfit.hardware import get_gpu
from trainfit.models.hf_config import for_setup

ABOUT = {"summary": "published MoE layouts of one model and cluster: predicted vs published rank order (Kendall tau)",
         "minutes": 0.5, "quick": None}


def kendall_tau(published: list[float], predicted: list[float]) -> float | None:
    """Kendall's tau-a of two step-time lists (Kendall 1938): (concordant − discordant pairs) / all pairs; a pair tied
    in either list counts as neither. None below two rows."""
    pairs = list(combinations(range(len(published)), 2))
    if not pairs:
        return None
    return sum(_sign(published[i] - published[j]) * _sign(predicted[i] - predicted[j]) for i, j in pairs) / len(pairs)


def _sign(x: float) -> int:
    return (x > 0) - (x < 0)


def layout_text(s) -> str:
    return (f"TP {s.tp}" + (f" CP {s.cp}" if s.cp > 1 else "") + f" EP {s.ep} ETP {s.expert_tp} PP {s.pp}" + (f" VPP {s.vpp}" if s.vpp > 1 else "")
            + f" DP {s.dp}, MBS {s.batch} GA {s.grad_accum}")


def rows_of(runs: list[dict]) -> list[dict]:
    out = []
    for r in runs:
        setup = build_setup(r)
        row = {"id": r["id"], "layout": layout_text(setup), "published_s": published_step(r),
               "in_sample": bool(r.get("in_sample")), "source": r["source"]}
        if r.get("inexpressible"):
            row["inexpressible"] = r["inexpressible"]
        else:
            row["predicted_s"] = predict(r)
            spec = for_setup(build_spec(r), setup)
            row["fits"] = bool(analytic(spec, setup, get_gpu(r["gpu"])).time.fits)
        out.append(row)
    return out


def sets() -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in MOE_LAYOUT_RUNS:
        out.setdefault(r["layout_set"], []).append(r)
    return out


def routing_gaps() -> list[dict]:
    """Per published pair (and C8 with its force-balanced twin predicted only): step time dropless / forced."""
    out = []
    for forced, dropless in zip(MOE_ROUTING_PAIRS[::2], MOE_ROUTING_PAIRS[1::2]):
        out.append({"id": dropless["id"], "layout": layout_text(build_setup(dropless)),
                    "published": published_step(dropless) / published_step(forced),
                    "predicted": predict(dropless) / predict(forced)})
    twin = dict(C8_RUN, setup=dict(C8_RUN["setup"], moe_force_balance=True))
    out.append({"id": C8_RUN["id"], "layout": layout_text(build_setup(C8_RUN)), "published": None,
                "predicted": predict(C8_RUN) / predict(twin)})
    return out


def fit_dropless() -> tuple[float, float, float]:
    """(X, the X moe_imbalance keeps, C8's error there): X the dropless training default at which C8 is predicted at
    its published step time."""
    from trainfit.analytic import compute_time, moe_imbalance

    kept = moe_imbalance.DROPLESS

    def err(x: float) -> float:
        moe_imbalance.DROPLESS = x
        compute_time.clear_memos()
        return predict(C8_RUN) / published_step(C8_RUN) - 1
    try:
        lo, hi = 1.0, 3.0
        for _ in range(30):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if err(mid) < 0 else (lo, mid)
        return (lo + hi) / 2, kept, err(kept)
    finally:
        moe_imbalance.DROPLESS = kept
        compute_time.clear_memos()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fit", action="store_true", help="fit the dropless default (moe_imbalance.DROPLESS) on C8")
    args = ap.parse_args(argv)
    lines = ["# Published MoE layouts in their published order (bench/targets/moe_order.py)", "",
             "Each set: layouts of one model on one cluster at one global batch, published step times (faster "
             "first), the planner's predicted step time and the estimate's fit verdict. Kendall's tau over the "
             "expressible rows: +1 the published order, −1 reversed. Validation only (C8 is marked in sample).", ""]
    values = {}
    for name, runs in sets().items():
        rows = sorted(rows_of(runs), key=lambda x: x["published_s"])
        ok = [x for x in rows if "predicted_s" in x]
        tau = kendall_tau([x["published_s"] for x in ok], [x["predicted_s"] for x in ok])
        values[name] = {"kendall_tau": tau, "rows": rows}
        lines += [f"## {name}", "", "| layout | published s/step | predicted s/step | error | fits | run |",
                  "| --- | ---: | ---: | ---: | --- | --- |"]
        for x in rows:
            if "predicted_s" in x:
                err = x["predicted_s"] / x["published_s"] - 1
                pred, e, fits = f"{x['predicted_s']:.2f}", f"{err:+.0%}", "yes" if x["fits"] else "no"
            else:
                pred, e, fits = "not expressible", "", x["inexpressible"]
            lines.append(f"| {x['layout']} | {x['published_s']:.2f} | {pred} | {e} | {fits} | {x['id']}"
                         f"{' (C8, in sample)' if x['in_sample'] else ''} |")
        lines += ["", f"Kendall tau over {len(ok)} expressible layouts: "
                      + ("n/a" if tau is None else f"{tau:+.2f}"), ""]
    gaps = routing_gaps()
    values["dropless_vs_forced"] = gaps
    lines += ["## Dropless vs forced balance: step time dropless / forced", "",
              "| layout | seq | published | predicted | run |", "| --- | ---: | ---: | ---: | --- |"]
    for g in gaps:
        seq = next(r for r in MOE_ROUTING_PAIRS + [C8_RUN] if r["id"] == g["id"])["setup"]["seq"]
        pub = "—" if g["published"] is None else f"{g['published']:.3f}"
        lines.append(f"| {g['layout']} | {seq} | {pub} | {g['predicted']:.3f} | {g['id']} |")
    lines.append("")
    if args.fit:
        x, kept, kept_err = fit_dropless()
        lines += [f"Fit on C8 (dropless, alltoall, EP 8): moe_imbalance.DROPLESS = {x:.3f} (kept: {kept:g}, at "
                  f"which C8 is {kept_err:+.1%})", ""]
    out = "\n".join(lines) + "\n"
    print(out)
    taus = [v["kendall_tau"] for k, v in values.items() if k in sets() and v["kendall_tau"] is not None]
    record("moe_order", "published MoE layouts: predicted rank order", "Kendall tau +1 (the published order)",
           "Kendall tau " + ", ".join(f"{t:+.2f}" for t in taus) + f" over {len(taus)} published layout sets",
           values, "published")
    (data.results_dir() / "moe_order.md").write_text(out)


if __name__ == "__main__":
    main()
