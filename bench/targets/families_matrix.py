"""The families matrix as a figure: every catalog family's shrunk config, analytic peak vs the traced one, in the
cases tests/analytic/test_vs_trace_families.py checks (that test asserts each within 1 %; this records the gaps).

    python -m bench run families_matrix            # every case (default and heavy tier), ~2 min on 2 cores
    python -m bench run --quick families_matrix    # the default tier only
"""
from __future__ import annotations

import argparse

from bench.figures import pct, record
from tests.analytic.test_vs_trace_families import CASES, CONFIGS, KNOWN_GAPS, TOLERANCE, shrink
from tests.analytic.test_vs_trace_families import OWN_FILE
from trainfit.analytic.engine import estimate
from trainfit.models.hf_config import spec_from_config
from trainfit.trace import trace_spec

ABOUT = {"summary": "analytic vs trace peaks, every catalog family at a shrunk size (training and inference)",
         "minutes": 2, "quick": ["--quick"]}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the default tier only (the heavy tier's cases left out)")
    quick = ap.parse_args(argv).quick
    specs, gaps, known = {}, {}, {}
    for case in CASES:
        if quick and any(m.name == "heavy" for m in case.marks):
            continue
        family, setup = case.values
        spec = specs.setdefault(family, spec_from_config(shrink(CONFIGS[family]), f"small-{family}"))
        traced = trace_spec(spec, setup, flops=False).memory.peak
        gap = (estimate(spec, setup).memory.peak - traced) / traced
        (known if case.id in KNOWN_GAPS else gaps)[case.id] = gap
        print(f"{case.id}: {gap:+.2%}", flush=True)
    def worst(mla: bool) -> str:  # the case with the largest |gap| among MLA (or other) families
        return max((k for k in gaps if (specs[k.split("-")[0]].mla is not None) == mla), key=lambda k: abs(gaps[k]))
    other, mla = worst(False), worst(True)
    figure = (f"{len(gaps)} cases, {len(specs)} families: worst {pct(gaps[other], digits=2)} "
              f"(MLA {pct(gaps[mla], digits=2)}); {len(known)} named gaps; {len(OWN_FILE)} checked in their own "
              "test files")
    print(figure)
    record("families_matrix", "analytic vs trace, every catalog family at small sizes (CPU and CUDA semantics)",
           f"within {TOLERANCE * 100:.0f} % per family, MLA's too", figure,
           {"cases": len(gaps), "families": len(specs), "worst_case": other, "worst_pct": round(gaps[other] * 100, 3),
            "worst_mla_case": mla, "worst_mla_pct": round(gaps[mla] * 100, 3),
            "named_gaps_pct": {k: round(v * 100, 2) for k, v in known.items()},
            "own_files": dict(sorted(OWN_FILE.items()))},
           "cpu-memory", quick=quick)


if __name__ == "__main__":
    main()
