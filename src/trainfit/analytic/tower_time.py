"""A vision-language model's image encoder timed kernel by kernel (analytic/ops/vision_tower.py's lists through
compute_time.time_ops), for the training step's first stage (compute_time.stage_compute) and the prefill
(infer_time.forward_time): its ends once and each kind of block times its count. Nothing without a tower or images
(a text-only step, a decode step: the tower runs in the prefill only)."""
from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

from ..hardware import GPU
from ..setup import Setup
from ..spec import ModelSpec
from .compute_time import ListTime, time_ops
from .ops import Shape, compiled
from .ops.vision_tower import tower_lists


class _Images(NamedTuple):
    """What of a Setup the tower's lists read (ops/vision_tower.py: the patch rows, the windows): the planner's
    layouts that differ elsewhere (data parallelism, ZeRO, pipeline) share one tower time."""

    batch: int
    images: int
    image_size: int


def tower_times(spec: ModelSpec, setup: Setup, gpu: GPU, lm: Shape) -> tuple[ListTime, ListTime, ListTime]:
    """(forward, backward, recompute) of the tower in one micro-batch, `lm` the language model's Shape (its lists
    compiled under torch.compile, as the layers'). Recompute: with --recompute full every block is a
    GradientCheckpointingLayer (modeling_qwen2_5_vl.py:344 Qwen2_5_VLVisionBlock, modeling_siglip.py:325
    SiglipEncoderLayer) that re-runs its forward in its backward; the ends are not checkpointed. NB: the other
    policies (selective, op, layer:N) are taken to leave the tower's blocks whole (no re-run); under --lora-rank
    the tower is timed as trained (its weight gradients included: over where peft leaves it frozen)."""
    if spec.vision is None or not getattr(setup, "images", 0):
        return ListTime(), ListTime(), ListTime()
    return _times(spec, _Images(setup.batch, setup.images, setup.image_size), gpu, lm, setup.recompute == "full")


@lru_cache(maxsize=1024)
def _times(spec: ModelSpec, images: _Images, gpu: GPU, lm: Shape, rerun: bool) -> tuple[ListTime, ListTime, ListTime]:
    prep = compiled if lm.compile else (lambda ops: ops)
    fwd = bwd = rec = ListTime()
    for j, (count, f, b) in enumerate(tower_lists(spec, images, lm)):
        tf = time_ops(gpu, prep(f))
        fwd, bwd = fwd + count * tf, bwd + count * time_ops(gpu, prep(b))
        if j and rerun:  # (j = 0: the ends)
            rec = rec + count * tf
    return fwd, bwd, rec
