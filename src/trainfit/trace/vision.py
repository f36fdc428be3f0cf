"""The trace engine for vision models (VisionSpec): the transformers classifier (step/vision.py) through the
any-module trace (user.py), as bench/targets/vision.py first did for ViT."""
from __future__ import annotations

import dataclasses

from ..estimate import Estimate
from ..setup import Setup
from ..spec import VisionSpec
from ..step.vision import build


def trace_vision(spec: VisionSpec, setup: Setup) -> Estimate:
    """The trace engine on the transformers model: a real module (random weights, on the CPU) copied as fake
    tensors (ViT's and ConvNeXt's truncated-normal init does not run on fake tensors), then traced."""
    from ..analytic.vision import check
    from .user import trace

    check(spec, setup)
    model, example = build(spec, setup)
    est = trace(model, example, setup, flops=True)
    return dataclasses.replace(est, model=spec.name, detail=dataclasses.replace(
        est.detail, image_size=setup.image_size or spec.image_size, num_labels=spec.num_labels))
