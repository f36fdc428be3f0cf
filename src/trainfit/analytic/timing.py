"""The --mfu override (step time from FLOPs at a stated utilisation), and the time, cost and energy of a token budget.
The step-time model itself is analytic/step_time.py; the board power behind the energy is analytic/energy.py.

time = hardware FLOPs / (peak dense FLOP/s of the compute dtype × MFU). `mfu` is the fraction of peak the
model's matmuls reach without recompute (PaLM, Chowdhery et al. 2022, App. B); recompute adds its FLOPs at the
same rate. Pipeline bubble: (p−1)/(v·m) of the ideal time (Narayanan et al. 2021, eq. 1 and §2.2.2; v = --vpp). NB: communication is not
included here (it is overlapped in well-tuned runs; `trainfit plan` models it explicitly).
"""
from __future__ import annotations

from ..hardware import GPU
from ..precision import PRECISIONS
from ..setup import Setup
from .energy import average_power

SECONDS_PER_HOUR = 3600.0


def compute_dtype(setup: Setup) -> str:
    """The dtype the matmuls run in (trainfit.precision's table): fp32 matmuls run as fp32 unless --tf32 (PyTorch's
    default torch.backends.cuda.matmul.allow_tf32 = False since 1.12; measured on an H200, torch 2.11: llama-3.2-1b
    fp32's GEMMs took 318 ms, 0.75 of the fp32 peak, 7.4x the TF32 estimate)."""
    dtype = PRECISIONS[setup.precision].compute  # setup may be the planner's light _Cfg
    return "tf32" if dtype == "fp32" and getattr(setup, "tf32", False) else dtype


def check_gpu(setup: Setup, gpu: GPU | None) -> None:
    """--tf32 needs TF32 tensor cores: a GPU whose catalog entry lists no TF32 peak has none (NVIDIA's come with
    Ampere; V100 and T4 have none, nor MI250X or MI355X): refused, not timed on another path."""
    from ..errors import SetupError

    if gpu is not None and getattr(setup, "tf32", False) and "tf32" not in gpu.peak_flops:
        raise SetupError(f"--tf32 runs fp32 matmuls on TF32 tensor cores, which the {gpu.name} has not: drop --tf32 "
                         "(its fp32 matmuls run at the fp32 rate)")


def step_seconds(hw_flops_per_rank: float, gpu: GPU, setup: Setup, mfu: float) -> float:
    ideal = hw_flops_per_rank / (gpu.flops_for(compute_dtype(setup)) * mfu)
    if setup.pp > 1:
        ideal *= 1 + (setup.pp - 1) / (setup.vpp * setup.grad_accum)
    return ideal


def mfu_step_terms(hw_flops_per_rank: float, gpu: GPU, setup: Setup, mfu: float) -> dict:
    """The --mfu step as terms (compute at the stated utilisation, and the pipeline bubble), for the power model."""
    compute = hw_flops_per_rank / (gpu.flops_for(compute_dtype(setup)) * mfu)
    return {"compute": compute, "bubble": step_seconds(hw_flops_per_rank, gpu, setup, mfu) - compute}


def budget(train_tokens: float, tokens_per_second: float, world: int, gpu: GPU, step: dict | None = None) -> dict:
    """Time, GPU-hours, cost and energy of training on `train_tokens`. `step`: the step's terms (StepTime.as_dict());
    without them the board draws TDP throughout (an upper bound)."""
    seconds = train_tokens / tokens_per_second
    gpu_hours = seconds * world / SECONDS_PER_HOUR
    watts = average_power(gpu, step)
    return {
        "train_tokens": train_tokens,
        "train_seconds": seconds,
        "gpu_hours": gpu_hours,
        "cost_usd": gpu_hours * gpu.price_per_hour,
        # NB: GPU boards only (analytic/energy.py); excludes host, network and cooling (PUE): an under-count of the
        # facility's energy.
        "energy_kwh": gpu_hours * watts / 1000,
        "average_power_watts": watts,
    }
