"""Average board power of training runs against published measurements — validation only, nothing fitted.
    python -m bench run energy_published        # prints the table, writes bench/results/energy.md

The model (analytic/energy.py): P = P_static + (TDP − P_static) × busy share of the step, the busy share from the
step-time model's terms for the layout below; P_static from data/power.toml. Measured = energy / (GPUs × hours).

Sources (measured, GPU energy only):
  * Dodge et al. 2022, "Measuring the Carbon Intensity of AI in Cloud Instances" (FAccT), Table 2, as reproduced in
    the CodeCarbon docs (https://docs.codecarbon.io/latest/introduction/model_examples): BERT pretrain 8 V100 36 h
    37.3 kWh; BERT finetune 4 V100 6 h 3.1 kWh; 6B transformer (6.1B params) 256 A100 192 h 13,812.4 kWh.
    GPU energy measured on Azure (nvidia-smi-style counters). Unknown: batch, seq, precision and layout of each
    run; the V100s are taken as SXM2 32 GB, the A100s as 40 GB (Azure NDv2 / NDasrA100_v4). The layouts below are
    assumptions, stated in each row, not fitted: the busy share (hence the model's power) is printed per layout.
  * Patterson et al. 2021, "Carbon Emissions and Large Neural Network Training", Table 4: GPT-3 on 10,000 V100s,
    330 W average SYSTEM power per processor (host included) at 24.6 TFLOP/s per V100: an upper bound for the
    board power only.
"""
from __future__ import annotations

import argparse
import statistics


from bench.figures import pct, record
from bench.data import results_dir
import trainfit
from trainfit.analytic.energy import busy_share
from trainfit.hardware import get_gpu

ABOUT = {"summary": "average board power vs published measured energy", "minutes": 0.2, "quick": None}

# (label, measured W per GPU, what it is, model, gpu, settings)
CASES = [
    ("Dodge BERT pretrain, 8 V100", 37.3e3 / (8 * 36), "measured GPU", "bert-base", "V100-32GB",
     dict(head="masked-lm", batch=32, seq=512, precision="amp-fp16", dp=8)),
    ("Dodge BERT finetune, 4 V100", 3.1e3 / (4 * 6), "measured GPU", "bert-base", "V100-32GB",
     dict(head="seq-cls", batch=32, seq=128, precision="amp-fp16", dp=4)),
    ("Dodge 6.1B LM, 256 A100 (dp 256, ZeRO-1)", 13812.4e3 / (256 * 192), "measured GPU", "pythia-6.9b", "A100-40GB",
     dict(batch=2, seq=2048, precision="bf16-master", stack="megatron", dp=256, zero=1, recompute="full")),
    ("Dodge 6.1B LM, 256 A100 (tp 8, dp 32)", 13812.4e3 / (256 * 192), "measured GPU", "pythia-6.9b", "A100-40GB",
     dict(batch=4, seq=2048, precision="bf16-master", stack="megatron", dp=32, tp=8, zero=1)),
    ("Patterson GPT-3, 9,984 of 10,000 V100 (tp 8, pp 16, dp 78)", 330.0, "measured system (upper bound)", "gpt-3-175b", "V100-32GB",
     dict(batch=1, seq=2048, precision="fp16-master", stack="megatron", tp=8, pp=16, dp=78, grad_accum=64, recompute="full")),
]


def table_rows(values: dict) -> list[dict]:
    """The page's published-runs line (bench/report.py) from the errors per run."""
    errs = values["error"]
    worst = max(errs, key=lambda k: abs(errs[k]))
    return [{"table": "published", "runs": "board power: Dodge et al. 2022 (6.1B on A100; BERT on V100), Patterson GPT-3",
             "kind": "validation", "n": len(errs), "median |error|": pct(statistics.median(map(abs, errs.values())), False),
             "worst": f"{pct(errs[worst])} ({worst})"}]


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    lines = ["| run | layout (assumed) | busy share | model W | TDP W | measured W | model vs measured | TDP vs measured |",
             "|---|---|---|---|---|---|---|---|"]
    errs = {}
    for label, measured, kind, model, gpu, kw in CASES:
        e = trainfit.estimate(model, gpu=gpu, tokens=1e9, **kw)
        st, tdp = e.detail.step_time.as_dict(), get_gpu(gpu).power_watts
        p = e.time.average_power_watts
        errs[label] = p / measured - 1
        lay = ", ".join(f"{k} {v}" for k, v in kw.items())
        lines.append(f"| {label} ({kind}) | {model} on {gpu}: {lay} | {busy_share(st):.2f} | {p:.0f} | {tdp} | "
                     f"{measured:.0f} | {p / measured - 1:+.0%} | {tdp / measured - 1:+.0%} |")
    text = "\n".join(lines)
    print(text)
    record("energy_published", "average board power vs published measured energy", None,
           f"{len(errs)} runs: model vs measured {min(errs.values()):+.0%} to {max(errs.values()):+.0%}", {"error": errs}, "published",
           rows=table_rows({"error": errs}))
    out = results_dir() / "energy.md"
    out.write_text("# Average board power vs published measurements (validation only)\n\n"
                   "`python -m bench run energy_published` — sources and assumptions in its docstring.\n\n" + text + "\n")


if __name__ == "__main__":
    main()
