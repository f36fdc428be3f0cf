"""The HF stack's step (`--stack hf`) behind the same five functions as trainfit.step.torchtitan, so the trace and
measure engines call whichever `trainfit.step.stack_step(setup)` returns: build, wrap, make_batches, run_step,
prepare. The code itself is build.py (the transformers model), standard.py (the step) and strategy.py (DDP/ZeRO/FSDP2).
"""
from __future__ import annotations

from .build import build_model, make_batches
from .standard import enable_recompute, prepare, run_step
from .strategy import STRATEGIES, check_strategy, wrap

NOTE = ""  # the standard step needs no note
DDP_TAKES_MESH = False  # DDP wraps the model over the default process group (strategy.py)


def build(spec, setup, device="cpu", mesh=None):
    """The transformers model with recompute enabled (data parallelism comes in `wrap`)."""
    model = build_model(spec, setup, device=device)
    enable_recompute(model, setup)
    return model


def check_ranks(spec, setup) -> None:
    """The distributed measure's refusals: the DDP/ZeRO/FSDP2 strategy of --zero (strategy.py)."""
    check_strategy(setup)


__all__ = ["NOTE", "DDP_TAKES_MESH", "STRATEGIES", "build", "check_ranks", "wrap", "make_batches", "run_step",
           "prepare"]
