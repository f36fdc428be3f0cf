"""--stack deepspeed --ep N (AutoEP) on CPU ranks (gloo): per-rank model states and live bytes vs the analytic engine.

    python -m bench run deepspeed_autoep_cpu [--out bench/results/deepspeed_autoep_cpu.md]

One `torch.distributed.run` launch per model and --dp (2 ranks: ep 2, expert-data-parallel 1; 4 ranks: ep 2,
expert-data-parallel 2) of trainfit's distributed measure with trainfit.step.deepspeed: deepspeed.initialize with
the `--emit deepspeed` config and its expert_parallel block (AutoEP replaces each HF MoE block with an
AutoEPMoELayer of E/ep experts, deepspeed 0.19.8 runtime/engine.py:816-913; tiny-deepseek: DeepSeek-V3's MLA, a
dense first layer, shared experts beside the routed ones), the client optimizer torch AdamW(fused=True) over
DeepSpeed's dense and 'moe' parameter groups, two warm-up steps, then one step whose live bytes are rebuilt from
c10's allocation records (trainfit.measure.dist_peak). Per rank the measure reports the 16-bit weights the engine
holds (its flat groups or ZeRO-3 partitions and the persistent whole parameters) and the optimizer states (the fp32
partitions and AdamW's moments): the states the analytic engine counts as weights and master + optimizer.
"""
from __future__ import annotations

import argparse
import os
import time

from bench.data import results_dir
from bench.targets import deepspeed_cpu as ds

ABOUT = {"summary": "--stack deepspeed --ep (AutoEP) vs DeepSpeed's engine on 2 and 4 CPU ranks: states and peaks",
         "minutes": 2, "quick": None}

# (model, dp, zero, precision): ep 2 throughout
CASES = (("tiny-mixtral", 2, 0, "bf16-master"), ("tiny-mixtral", 2, 1, "bf16-master"),
         ("tiny-mixtral", 2, 2, "bf16-master"), ("tiny-mixtral", 2, 2, "fp32"), ("tiny-mixtral", 2, 3, "bf16-master"),
         ("tiny-mixtral", 4, 2, "bf16-master"), ("tiny-mixtral", 4, 3, "bf16-master"),
         ("tiny-deepseek", 2, 2, "bf16-master"), ("tiny-deepseek", 2, 3, "bf16-master"),
         ("tiny-deepseek", 4, 2, "bf16-master"), ("tiny-deepseek", 4, 3, "bf16-master"))


def case(model: str, dp: int, zero: int, precision: str, ep: int = 2):
    """(spec, setup) of one case: deepspeed_cpu.case's CPU setup (batch 1, seq 64, AdamW) under AutoEP's --ep."""
    return ds.case(model, zero, precision, dp=dp, ep=ep)


# (one launch of the setups' dp CPU ranks: weights and optimizer states per rank beside the peaks)
measure_many = ds.measure_many


def states(est) -> tuple[int, int]:
    """(weights, master + optimizer states) of an analytic estimate: what the measure reports as weights and
    optimizer_states (trainfit.step.deepspeed resident_tensors)."""
    return est.weights, est.master + est.optimizer


def err(a: float, m: float) -> str:
    return f"{100 * (a - m) / m:+.3f} %"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(results_dir() / "deepspeed_autoep_cpu.md"))
    a = ap.parse_args(argv)
    import deepspeed

    from trainfit.analytic.memory import train_memory

    t0 = time.time()
    lines = [f"--ep 2, batch 1, seq 64, CPU ranks (gloo), deepspeed {deepspeed.__version__} AutoEP, the "
             "`--emit deepspeed` config, torch AdamW(fused=True); `python -m bench run deepspeed_autoep_cpu`", "",
             "Errors are signed, (analytic - measured) / measured; measured = the rank with the highest value "
             "(weights and optimizer states are equal on every rank).", "",
             "| model | dp | zero | precision | weights measured / analytic | error | fp32 master + optimizer "
             "measured / analytic | error | peak measured / analytic | error | forward / backward / optimizer "
             "phase error |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for model, dp in dict.fromkeys((c[0], c[1]) for c in CASES):
        cases = [case(model, d, z, p) for m, d, z, p in CASES if (m, d) == (model, dp)]
        spec = cases[0][0]
        runs = measure_many(spec, [s for _, s in cases], timeout=600 + 300 * len(cases))
        for (_, setup), ranks in zip(cases, runs):
            est = train_memory(spec, setup)
            w, o = states(est)
            mw, mo = max(r["weights"] for r in ranks), max(r["optimizer_states"] for r in ranks)
            mp = max(r["peak"] for r in ranks)
            ph = [err(est.phases[k], max(r["phase_peaks"][m] for r in ranks))
                  for k, m in (("forward_end", "forward"), ("backward", "backward"), ("optimizer_step", "optimizer"))]
            lines.append(f"| {model} | {dp} | {setup.zero} | {setup.precision} | {mw:,} / {w:,} | {err(w, mw)} | "
                         f"{mo:,} / {o:,} | {err(o, mo)} | {mp:,} / {est.peak:,} | {err(est.peak, mp)} | "
                         f"{' / '.join(ph)} |")
    lines[0] += f" ({time.time() - t0:.0f} s)"
    text = "\n".join(lines) + "\n"
    print(text)
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        f.write("# DeepSpeed AutoEP (--ep 2) on CPU ranks: measured vs analytic\n\n" + text)


if __name__ == "__main__":
    main()
