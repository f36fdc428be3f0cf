"""The real CPU peak of one RL step (step/grpo.py), per phase, from c10's allocation records (cpu_peak.py): the
same step the trace records, after one warm-up step (the optimizer's states resident, gradients None)."""
from __future__ import annotations

import torch

from ..setup import Setup
from ..spec import ModelSpec
from ..step.grpo import RL_PHASES, build, rl_inputs
from .cpu_peak import analyse, optimizer_tensors, profile_run, storage_bytes


def measure_rl(spec: ModelSpec, setup: Setup, seed: int = 0) -> tuple[int, str, dict[str, int]]:
    """(peak, peak phase, {phase: peak bytes}) of one steady-state RL step on this CPU."""
    from ..step.grpo import grpo_step

    torch.manual_seed(seed)
    model, ref, optimizer = build(spec, setup)
    prompts, adv = rl_inputs(spec, setup)
    grpo_step(model, ref, optimizer, prompts, adv, setup)  # warm-up: the optimizer's states exist from here
    seen: set = set()
    baseline = storage_bytes(list(model.parameters()) + list(model.buffers()), seen)
    if ref is not None:
        baseline += storage_bytes(list(ref.parameters()) + list(ref.buffers()), seen)
    baseline += storage_bytes(optimizer_tensors(optimizer) + [prompts, adv], seen)
    prof, _ = profile_run(lambda phase: grpo_step(model, ref, optimizer, prompts, adv, setup, phase=phase))
    cp = analyse(prof, baseline)
    phases: dict[str, int] = {}
    for marker, v in cp.phase_peaks.items():
        name = RL_PHASES.get(marker)
        if name is not None:
            phases[name] = max(phases.get(name, 0), v)
    return cp.peak, RL_PHASES.get(cp.peak_phase, cp.peak_phase), phases


def measure_rl_estimate(spec: ModelSpec, setup: Setup):
    """The measure engine's Estimate of one RL step on this CPU (--engine measure --mode rl)."""
    from ..analytic.params import count_params
    from ..estimate import Estimate, Flops, Memory

    peak, phase, phases = measure_rl(spec, setup)
    n = count_params(spec).total
    memory = Memory(weights=0, gradients=0, optimizer_states=0, master_weights=0, activations=0, temporaries=0,
                    kv_cache=0, peak=peak, peak_phase=phase, phases=phases)
    return Estimate("measure", spec.name, n, n, setup, memory, Flops(0, 0, 0, 0, 0, 0),
                    notes=("RL step (step/grpo.py) on this CPU: c10's allocation records under the profiler "
                           "(measure/cpu_peak.py), after one warm-up step; the peak and each phase's high point",))
