"""DeepSpeed's ZeRO engine on CPU (gloo), per-rank peak of live tensor bytes vs trainfit's analytic estimate.

    PYTHONPATH=src python bench/deepspeed_cpu.py [--model tiny-llama] [--zero 0 1 2 3] [--precision bf16-master fp32]
                                                 [--out bench/results/deepspeed_cpu.md]

Every case runs in ONE `torch.distributed.run --nproc-per-node 2` launch of trainfit's distributed measure
(trainfit.measure.distributed.measure_distributed_many -> trainfit.measure.worker with trainfit.step.deepspeed, the
step `trainfit estimate --stack deepspeed --engine measure` runs): per case, deepspeed.initialize on the HF model
trainfit builds (seed 0) with the config `--emit deepspeed` writes (DeepSpeed's bucket defaults), the client optimizer
torch.optim.AdamW(fused=True) (FusedAdam needs CUDA; torch's fused CPU kernel has FusedAdam's no-temporaries
property), two warm-up steps, then one step whose live bytes are rebuilt from c10's allocation records
(trainfit.measure.dist_peak; the profiler runs from before the model is built). The step peak is the highest live
count after the first phase mark. Prints a markdown table and writes it to --out.
"""
from __future__ import annotations

import argparse
import os
import time

CASE_FIELDS = ("model", "zero", "precision", "batch", "seq")


def case(model: str, zero: int, precision: str, batch: int = 1, seq: int = 64, dp: int = 2):
    from trainfit.models.resolve import load_model
    from trainfit.setup import Setup

    spec = load_model(model)
    setup = Setup(stack="deepspeed", device="cpu", zero=zero, dp=dp, precision=precision, batch=batch, seq=seq,
                  optimizer="adamw")
    return spec, setup


def measure_many(spec, setups, timeout: int | None = None) -> list[list[dict]]:
    """Per setup, per rank {rank, peak, phase_peaks, strategy}: one launch of setups[0].dp CPU ranks."""
    from trainfit.measure.distributed import measure_distributed_many

    runs = measure_distributed_many(spec, setups, setups[0].dp, steps=0, warmup=2, device="cpu", timeout=timeout,
                                    env={"OMP_NUM_THREADS": "1"})
    return [[{"rank": r.rank, "peak": r.peak, "phase_peaks": dict(r.phase_peaks), "strategy": r.strategy}
             for r in ranks] for ranks in runs]


def measure(spec, setup, timeout: int | None = None) -> list[dict]:
    return measure_many(spec, [setup], timeout)[0]


def analytic(spec, setup):
    from trainfit.analytic.memory import train_memory

    return train_memory(spec, setup)


def err(a: float, m: float) -> str:
    return f"{100 * (a - m) / m:+.2f} %"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny-llama")
    ap.add_argument("--zero", type=int, nargs="+", default=[0, 1, 2, 3])
    ap.add_argument("--precision", nargs="+", default=["bf16-master", "fp32"])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                  "deepspeed_cpu.md"))
    a = ap.parse_args()
    import deepspeed

    cases = [case(a.model, z, p, a.batch, a.seq) for p in a.precision for z in a.zero]
    spec = cases[0][0]
    t0 = time.time()
    runs = measure_many(spec, [s for _, s in cases], timeout=600 + 300 * len(cases))
    lines = [f"{a.model}, batch {a.batch}, seq {a.seq}, 2 CPU ranks (gloo), deepspeed {deepspeed.__version__}, the "
             "`--emit deepspeed` config (DeepSpeed's bucket defaults), torch AdamW(fused=True); "
             f"`PYTHONPATH=src python bench/deepspeed_cpu.py` ({time.time() - t0:.0f} s, one launch)", "",
             "Errors are signed, (analytic - measured) / measured; measured = the rank with the highest value.", "",
             "| zero | precision | DeepSpeed optimizer | measured peak (max rank) | analytic | error | "
             "measured backward / optimizer phase | analytic | error |",
             "|---|---|---|---|---|---|---|---|---|"]
    for (_, setup), ranks in zip(cases, runs):
        est = analytic(spec, setup)
        m = max(r["peak"] for r in ranks)
        mb = max(r["phase_peaks"]["backward"] for r in ranks)
        mo = max(r["phase_peaks"]["optimizer"] for r in ranks)
        ab, ao = est.phases["backward"], est.phases["optimizer_step"]
        lines.append(f"| {setup.zero} | {setup.precision} | {ranks[0]['strategy']} | {m:,} | {est.peak:,} | "
                     f"{err(est.peak, m)} | {mb:,} / {mo:,} | {ab:,} / {ao:,} | {err(ab, mb)} / {err(ao, mo)} |")
    text = "\n".join(lines) + "\n"
    print(text)
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        f.write("# DeepSpeed ZeRO on 2 CPU ranks: measured vs analytic\n\n" + text)


if __name__ == "__main__":
    main()
