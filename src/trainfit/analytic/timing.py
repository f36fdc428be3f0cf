"""The --mfu override (step time from FLOPs at a stated utilisation), and the cost of a token budget. The step-time
model itself is analytic/step_time.py.

time = hardware FLOPs / (peak dense FLOP/s of the compute dtype × MFU). `mfu` is the fraction of peak the
model's matmuls reach without recompute (PaLM, Chowdhery et al. 2022, App. B); recompute adds its FLOPs at the
same rate. Pipeline bubble: (p−1)/(v·m) of the ideal time (Narayanan et al. 2021, eq. 1 and §2.2.2; v = --vpp). NB: communication is not
included here (it is overlapped in well-tuned runs; `trainfit plan` models it explicitly).
"""
from __future__ import annotations

from ..hardware import GPU
from ..precision import PRECISIONS
from ..setup import Setup

SECONDS_PER_HOUR = 3600.0


def compute_dtype(setup: Setup) -> str:
    """The dtype the matmuls run in (trainfit.precision's table)."""
    return PRECISIONS[setup.precision].compute  # setup may be the planner's light _Cfg


def step_seconds(hw_flops_per_rank: float, gpu: GPU, setup: Setup, mfu: float) -> float:
    ideal = hw_flops_per_rank / (gpu.flops_for(compute_dtype(setup)) * mfu)
    if setup.pp > 1:
        ideal *= 1 + (setup.pp - 1) / (setup.vpp * setup.grad_accum)
    return ideal


def budget(train_tokens: float, tokens_per_second: float, world: int, gpu: GPU) -> dict:
    seconds = train_tokens / tokens_per_second
    gpu_hours = seconds * world / SECONDS_PER_HOUR
    return {
        "train_tokens": train_tokens,
        "train_seconds": seconds,
        "gpu_hours": gpu_hours,
        "cost_usd": gpu_hours * gpu.price_per_hour,
        # NB: board power at TDP for the whole run; excludes host, network and cooling (PUE) — an under-count.
        "energy_kwh": gpu_hours * gpu.power_watts / 1000,
    }
