"""The measure engine for vision models (VisionSpec): real HF eager steps of the transformers classifier
(step/vision.py), the peak read by the measure engine's readers (runner.py)."""
from __future__ import annotations

import contextlib
import dataclasses
import os
import statistics

from ..estimate import Estimate
from ..setup import Setup
from ..spec import VisionSpec
from ..step.vision import build


def measure_vision(spec: VisionSpec, setup: Setup, steps: int = 3, warmup: int = 1) -> Estimate:
    """Real HF eager steps here: warm-up (optimizer state resident), the peak step read by the measure engine's
    reader (CPU: profiler allocation records; CUDA: torch.cuda.max_memory_allocated), then `steps` timed steps."""
    from ..analytic.vision import check
    from .runner import _peak_cpu, _peak_cuda, check_device, timed_steps, to_estimate
    from ..step import make_optimizer, run_step
    from ..step.build import param_dtype
    from ..step.standard import enable_recompute

    check(spec, setup)
    dev = check_device(setup.device)
    model, example = build(spec, setup, param_dtype(setup), device=setup.device)
    model.train()
    enable_recompute(model, setup)  # --recompute full: transformers' activation_checkpointing_enable (as the trace)
    optimizer = make_optimizer(model, setup)
    batches = [example]
    for _ in range(max(1, warmup)):
        run_step(model, optimizer, batches, setup)
    if dev == "cuda":
        result = _peak_cuda(model, optimizer, batches, setup, setup.device)
    else:
        with open(os.devnull, "w") as devnull, contextlib.redirect_stderr(devnull):
            result = _peak_cpu(model, optimizer, batches, setup)
    times = timed_steps(lambda: run_step(model, optimizer, batches, setup), steps, dev)
    result.step_times = times
    if times:
        result.step_seconds = statistics.median(times)
        result.tokens_per_second = setup.batch / result.step_seconds  # images/s
    result.params = sum(p.numel() for p in model.parameters())
    est = to_estimate(result, spec, setup)
    return dataclasses.replace(est, detail=dataclasses.replace(
        est.detail, image_size=setup.image_size or spec.image_size, num_labels=spec.num_labels))
