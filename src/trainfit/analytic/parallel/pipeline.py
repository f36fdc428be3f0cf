"""Pipeline parallelism: what one stage holds and how many micro-batches' activations it stores at once.

1F1B schedule (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM", §2.2.1): stage i runs pp - i warm-up forwards before its first backward, so the first stage keeps
min(pp, micro-batches) micro-batches' activations in flight and the last stage one.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...setup import Setup
from ...spec import ModelSpec


@dataclass(frozen=True)
class Stage:
    """What one pipeline stage holds."""

    index: int
    layers: int
    embedding: bool
    head: bool
    in_flight: int  # micro-batches whose activations are stored at once


def stages(spec: ModelSpec, setup: Setup) -> list[Stage]:
    """First and last pipeline stages (the others are like the first minus the embedding).
    NB: layers split evenly (validate_layout requires pp | layers); the middle stages are never the worst."""
    per = spec.layers // setup.pp
    if setup.pp == 1:
        return [Stage(0, spec.layers, True, True, 1)]
    in_flight = min(setup.pp, setup.grad_accum)  # 1F1B warm-up depth on stage 0 (Narayanan 2021 §2.2.1)
    return [Stage(0, per, True, False, in_flight), Stage(setup.pp - 1, per, False, True, 1)]
