"""The trace and measure engines for vision models (VisionSpec): transformers builds the classifier from its
config (ResNetForImageClassification, ConvNextForImageClassification, ViTForImageClassification; models/vision.py
says why not torchvision or timm), and the same paths as any module run it: the trace engine's any-module trace
(user.py) and the measure engine's peak readers (measure/runner.py), as bench/vision.py did for ViT."""
from __future__ import annotations

import contextlib
import dataclasses
import os
import statistics
import time

import torch

from ..estimate import Estimate
from ..setup import Setup
from ..spec import VisionSpec


def build(spec: VisionSpec, setup: Setup, dtype: torch.dtype = torch.float32, device: str = "cpu"):
    """(model, example batch) for `setup`: random weights; images of --image-size (a ViT's config takes the image
    size: its position table has (size / patch)^2 + 1 rows), int64 labels; channels-last when asked."""
    import transformers

    transformers.logging.set_verbosity_error()
    size = setup.image_size or spec.image_size
    kwargs = {k: v for k, v in spec.config.items() if k not in ("model_type", "_trainfit")}
    kwargs["image_size"] = size
    if spec.family == "vit":
        kwargs["attn_implementation"] = "sdpa"
    cfg = transformers.AutoConfig.for_model(spec.family, **kwargs)
    torch.manual_seed(0)
    model = transformers.AutoModelForImageClassification.from_config(cfg).to(device=device, dtype=dtype)
    pixels = torch.randn(setup.batch, spec.channels, size, size, dtype=dtype, device=device)
    if setup.channels_last:
        model = model.to(memory_format=torch.channels_last)
        pixels = pixels.contiguous(memory_format=torch.channels_last)
    labels = torch.randint(0, spec.num_labels, (setup.batch,), device=device)
    return model, {"pixel_values": pixels, "labels": labels}


def trace_vision(spec: VisionSpec, setup: Setup) -> Estimate:
    """The trace engine on the transformers model: a real module (random weights, on the CPU) copied as fake
    tensors (ViT's and ConvNeXt's truncated-normal init does not run on fake tensors), then traced."""
    from ..analytic.vision import check
    from .user import trace

    check(spec, setup)
    model, example = build(spec, setup)
    est = trace(model, example, setup, flops=False)
    return dataclasses.replace(est, model=spec.name,
                               detail={**est.detail, "image_size": setup.image_size or spec.image_size})


def measure_vision(spec: VisionSpec, setup: Setup, steps: int = 3, warmup: int = 1) -> Estimate:
    """Real HF eager steps here: warm-up (optimizer state resident), the peak step read by the measure engine's
    reader (CPU: profiler allocation records; CUDA: torch.cuda.max_memory_allocated), then `steps` timed steps."""
    from ..analytic.vision import check
    from ..measure.runner import _peak_cpu, _peak_cuda, check_device, to_estimate
    from ..step import make_optimizer, run_step
    from ..step.build import param_dtype

    check(spec, setup)
    dev = check_device(setup.device)
    model, example = build(spec, setup, param_dtype(setup), device=setup.device)
    model.train()
    optimizer = make_optimizer(model, setup)
    batches = [example]
    for _ in range(max(1, warmup)):
        run_step(model, optimizer, batches, setup)
    if dev == "cuda":
        result = _peak_cuda(model, optimizer, batches, setup, setup.device)
    else:
        with open(os.devnull, "w") as devnull, contextlib.redirect_stderr(devnull):
            result = _peak_cpu(model, optimizer, batches, setup)
    times = []
    for _ in range(steps):
        if dev == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        run_step(model, optimizer, batches, setup)
        if dev == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    result.step_times = times
    if times:
        result.step_seconds = statistics.median(times)
        result.tokens_per_second = setup.batch / result.step_seconds  # images/s
    result.params = sum(p.numel() for p in model.parameters())
    return to_estimate(result, spec, setup)
