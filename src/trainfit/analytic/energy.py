"""Average board power of a training step, from what the GPU does in each term of the step (no torch).

P = P_static + (P_tdp − P_static) · a, with a = the busy share of the step: the seconds of the terms in which the
GPU runs its own kernels (matmuls, recompute, optimizer) over the whole step; waiting terms (pipeline bubble,
exposed communication: analytic/terms.py) draw the static power. This is the linear utilisation-power model of
Fan, Weber & Barroso 2007 ("Power provisioning for a warehouse-sized computer", ISCA: their server model P(u) = P_idle +
(P_busy − P_idle)·u) applied to the GPU board, with u the busy share of the step. P_busy = TDP: dense tensor-core
kernels run at the board's power cap (the power limit is what throttles their clocks); P_static is the P0 reading at
0 % utilisation (data/power.toml, sourced per GPU). Llama 3 (Dubey et al. 2024, §3.3.4) reports the same two-level
behaviour at scale: whole-cluster power swings by tens of MW as 16K GPUs go from computing to waiting together.

NB: busy at TDP over-counts kernels that do not reach the power cap (small models, memory-bound steps: measured GPU
energy over GPU-hours is 43-92 % of TDP in Dodge et al. 2022's table, docs.codecarbon.io model_examples: BERT on
V100 129 W, ViT-Huge on V100 275 W, a 6.1B LM on A100 281 W); waiting at the static floor under-counts NCCL's
kernels and a resident process's P0 draw. Board power only: host, network and cooling (PUE) are not included.
"""
from __future__ import annotations

import statistics
from functools import lru_cache

from ..data import load_toml
from ..hardware import GPU
from .terms import is_waiting, time_terms


@lru_cache(maxsize=1)
def _static() -> dict[str, dict]:
    return load_toml("power.toml")["static"]


@lru_cache(maxsize=1)
def _static_ratio() -> float:
    """Median static/TDP over the measured GPUs, for a GPU without a reading (catalog GPUs in gpus.json)."""
    from ..hardware import get_gpu

    return statistics.median(v["watts"] / get_gpu(name).power_watts for name, v in _static().items())


def static_watts(gpu: GPU) -> float:
    """Board power at P0 and 0 % utilisation. NB: a GPU without a reading (data/power.toml) gets the median
    static/TDP ratio of the measured ones — error of unknown sign. A power cap (--power-limit) leaves it as the
    board's: the ratio is of its TDP (GPU.tdp_watts)."""
    entry = _static().get(gpu.name)
    return entry["watts"] if entry else _static_ratio() * gpu.tdp_watts


def check_power_limit(gpu: GPU, watts: float) -> None:
    """A --power-limit the board cannot take, refused in one line with the range it can, whether the step is timed
    or not (--mfu): above its TDP (a board cannot be run above it), or at or below its static power
    (check_above_static)."""
    if watts > gpu.tdp_watts:
        from ..errors import SetupError

        raise SetupError(f"--power-limit {watts:g} W: the {gpu.name} board draws at most {gpu.tdp_watts:g} W (its "
                         f"TDP); give a cap above {static_watts(gpu):.0f} W and at most {gpu.tdp_watts:g} W")
    check_above_static(gpu, watts)


def check_above_static(gpu: GPU, watts: float) -> None:
    """A cap at or below the board's static power leaves nothing to clock its SMs (roofline.power_clock: r = 0, a
    zero compute rate; the energy would be of a board drawing less than its idle): refused in one line."""
    floor = static_watts(gpu)
    if watts <= floor:
        from ..errors import SetupError

        raise SetupError(f"--power-limit {watts:g} W: the {gpu.name} board draws {floor:.0f} W idle (at P0), so a cap "
                         f"at or below it leaves its SMs no clock; give a cap above {floor:.0f} W")


def busy_share(step: dict) -> float:
    """Seconds of the step's non-waiting terms over the seconds of all its terms."""
    terms = time_terms(step)
    total = sum(terms.values())
    if total <= 0:
        return 1.0
    return sum(v for k, v in terms.items() if not is_waiting(k)) / total


def average_power(gpu: GPU, step: dict | None) -> float:
    """Average board watts over a step whose terms are `step` (StepTime.as_dict(), or any name -> seconds with
    the same names). Without terms: TDP, an upper bound."""
    if not step:
        return float(gpu.power_watts)
    idle = min(static_watts(gpu), gpu.power_watts)
    return idle + (gpu.power_watts - idle) * busy_share(step)
