"""DeepSpeed's ZeRO engine on CPU (gloo), per-rank peak of live tensor bytes vs trainfit's analytic estimate.

    PYTHONPATH=src python bench/deepspeed_cpu.py [--model tiny-llama] [--zero 0 1 2 3] [--precision bf16-master fp32]

Each case is one `torch.distributed.run --nproc-per-node 2` of this file in worker mode: deepspeed.initialize
on the HF model trainfit builds (trainfit.step.build, seed 0), the client optimizer torch.optim.AdamW(fused=True)
(FusedAdam needs CUDA; torch's fused CPU kernel has FusedAdam's no-temporaries property), DeepSpeed's own
defaults for everything else (no bucket size set), two warm-up steps, then one step whose live bytes are rebuilt
from c10's allocation records (trainfit.measure.dist_peak, the profiler running from before the model is built).
The step peak is the highest live count after the first phase mark. Prints a markdown table.
"""
from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import tempfile

CASE_FIELDS = ("model", "zero", "precision", "batch", "seq")


def ds_config(setup) -> dict:
    cfg = {"train_micro_batch_size_per_gpu": setup.batch, "gradient_accumulation_steps": 1,
           "zero_optimization": {"stage": setup.zero}, "zero_allow_untested_optimizer": True}
    if setup.precision == "bf16-master":
        cfg["bf16"] = {"enabled": True}
    elif setup.precision == "fp16-master":
        cfg["fp16"] = {"enabled": True}
    return cfg


def worker(job_path: str) -> None:
    import deepspeed
    import torch

    from trainfit.measure.cpu_peak import START
    from trainfit.measure.dist_peak import profiled
    from trainfit.step.build import build_model, make_batches

    with open(job_path, "rb") as f:
        job = pickle.load(f)
    spec, setup = job["spec"], job["setup"]
    deepspeed.init_distributed(dist_backend="gloo")
    rank = torch.distributed.get_rank()
    state = {}

    def step(phase=None):
        eng, batch = state["eng"], state["batch"]
        mark = phase or (lambda name: None)
        mark("forward")
        loss = eng(**batch).loss
        mark("backward")
        eng.backward(loss)
        mark("optimizer")
        eng.step()
        mark("end")

    def run(phase):
        torch.manual_seed(0)
        model = build_model(spec, setup)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        state["eng"], *_ = deepspeed.initialize(model=model, optimizer=opt, config=ds_config(setup))
        torch.manual_seed(1000 + rank)
        state["batch"] = make_batches(spec, setup)[0]
        for _ in range(2):
            step()
        step(phase)

    pk, _ = profiled(run)
    out = {"rank": rank, "peak": max(v for k, v in pk.phase_peaks.items() if k != START),
           "phase_peaks": {k: v for k, v in pk.phase_peaks.items() if k != START},
           "optimizer": type(state["eng"].optimizer).__name__}
    with open(os.path.join(job["dir"], f"rank{rank}.json"), "w") as f:
        json.dump(out, f)


def measure(spec, setup, timeout: int = 600) -> list[dict]:
    """Per-rank {peak, phase_peaks, optimizer} of one DeepSpeed step on `setup.dp` CPU ranks."""
    with tempfile.TemporaryDirectory(prefix="trainfit-ds-") as d:
        job = os.path.join(d, "job.pkl")
        with open(job, "wb") as f:
            pickle.dump({"spec": spec, "setup": setup, "dir": d}, f)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_CPP_LOG_LEVEL": "ERROR"}
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(setup.dp), "--standalone",
               os.path.abspath(__file__), "--worker", job]
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        files = sorted(x for x in os.listdir(d) if x.startswith("rank") and x.endswith(".json"))
        if p.returncode != 0 or len(files) != setup.dp:
            lines = [ln for ln in (p.stdout + p.stderr).splitlines() if "Error" in ln or "error" in ln]
            raise RuntimeError(f"deepspeed run failed (rc {p.returncode}): {(lines or ['no output'])[-1]}")
        return [json.load(open(os.path.join(d, x))) for x in files]


def analytic(spec, setup):
    from trainfit.analytic.memory import train_memory

    return train_memory(spec, setup)


def case(model: str, zero: int, precision: str, batch: int = 1, seq: int = 64, dp: int = 2):
    from trainfit.models.resolve import load_model
    from trainfit.setup import Setup

    spec = load_model(model)
    setup = Setup(stack="deepspeed", device="cpu", zero=zero, dp=dp, precision=precision, batch=batch, seq=seq,
                  optimizer="adamw")
    return spec, setup


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker")
    ap.add_argument("--model", default="tiny-llama")
    ap.add_argument("--zero", type=int, nargs="+", default=[0, 1, 2, 3])
    ap.add_argument("--precision", nargs="+", default=["bf16-master", "fp32"])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=64)
    a = ap.parse_args()
    if a.worker:
        return worker(a.worker)
    print(f"{a.model}, batch {a.batch}, seq {a.seq}, 2 CPU ranks (gloo), deepspeed defaults, torch AdamW(fused=True)\n")
    print("| zero | precision | DeepSpeed optimizer | measured peak (max rank) | analytic | error | "
          "measured backward / optimizer phase | analytic | error |")
    print("|---|---|---|---|---|---|---|---|---|")
    for p in a.precision:
        for z in a.zero:
            spec, setup = case(a.model, z, p, a.batch, a.seq)
            est = analytic(spec, setup)
            try:
                ranks = measure(spec, setup)
            except Exception as e:  # noqa: BLE001 - the table records why a case did not run
                print(f"| {z} | {p} | - | failed: {e} | {est.peak:,} | | | | |")
                continue
            m = max(r["peak"] for r in ranks)
            mb = max(r["phase_peaks"]["backward"] for r in ranks)
            mo = max(r["phase_peaks"]["optimizer"] for r in ranks)
            ab, ao = est.phases["backward"], est.phases["optimizer_step"]
            print(f"| {z} | {p} | {ranks[0]['optimizer']} | {m:,} | {est.peak:,} | {err(est.peak, m)} | "
                  f"{mb:,} / {mo:,} | {ab:,} / {ao:,} | {err(ab, mb)} / {err(ao, mo)} |", flush=True)


def err(a: float, m: float) -> str:
    return f"{100 * (a - m) / m:+.2f} %"


if __name__ == "__main__":
    main()
