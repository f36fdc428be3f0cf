"""A vision-language model's image encoder timed kernel by kernel (analytic/ops/vision_tower.py's lists through
compute_time.time_ops), for the training step's first stage (compute_time.stage_compute) and the prefill
(infer_time.forward_time): its ends once and each kind of block times its count. Nothing without a tower or images
(a text-only step, a decode step: the tower runs in the prefill only). Llama 3.2 Vision's cross-attention layers
(ops/mllama_tower.py cross_layer) are a kind of layer of their own: cross_layer_times, which compute_time and
infer_time weigh against the self-attention layers' lists by their share of the layers."""
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
    SiglipEncoderLayer, modeling_qwen3_vl.py:328 Qwen3VLVisionBlock) that re-runs its forward in its backward; the
    ends are not checkpointed (nor Qwen3-VL's deepstack levels, listed with them: their mergers run between the
    blocks, their adds between the language model's decoder layers). NB: the other
    policies (selective, op, layer:N) are taken to leave the tower's blocks whole (no re-run); under --lora-rank
    the tower is timed as trained (its weight gradients included: over where peft leaves it frozen)."""
    if spec.vision is None or not getattr(setup, "images", 0):
        return ListTime(), ListTime(), ListTime()
    # Llama 3.2 Vision's encoder layers are plain modules (MllamaVisionEncoderLayer, modeling_mllama.py:289): not
    # re-run
    rerun = setup.recompute == "full" and spec.vision.projector != "cross"
    return _times(spec, _Images(setup.batch, setup.images, setup.image_size), gpu, lm, rerun)


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


def cross_share(spec: ModelSpec) -> float:
    """The share of the language model's layers that are cross-attention layers (text_config
    cross_attention_layers); 0 for other models. NB: over a pipeline stage, the model's share (as compute_time's
    layer_kinds)."""
    t = spec.vision
    return len(t.cross_layers) / spec.layers if t is not None and t.cross_layers else 0.0


def cross_layer_forward(spec: ModelSpec, setup: Setup, sh: Shape) -> list:
    """One cross-attention layer's forward kernels (ops/mllama_tower.py cross_layer, from the self-attention
    layer's list, ops/layer.py layer_forward); empty without images (the layers are skipped, MllamaTextModel.forward
    :1136-1139). In a decode step (sh.decode) its K and V are the cache's. NB: under --lora-rank its k/v adapters
    are counted over the text rows (lora_ops.layer_forward)."""
    from . import lora_ops
    from .ops import layer_forward
    from .ops.mllama_tower import cross_layer

    if not setup.images:
        return []
    fwd = cross_layer(spec, sh, layer_forward(spec, sh), setup.images)
    return lora_ops.layer_forward(spec, setup, sh, fwd) if setup.lora_rank else fwd


def cross_layer_times(spec: ModelSpec, setup: Setup, gpu: GPU, sh: Shape,
                      prep=lambda ops: ops) -> tuple[ListTime, ListTime, ListTime]:
    """(forward, backward, recompute) of one cross-attention layer (cross_layer_forward; `prep`: the lists'
    compiled form); nothing without images. Recompute: what the setup's policy re-runs of it (ops.recomputed; under
    --recompute full the layer is a GradientCheckpointingLayer, modeling_mllama.py:672)."""
    from .ops import backward, recomputed
    from .ops.mllama_tower import cross_grad_accumulations

    fwd = cross_layer_forward(spec, setup, sh)
    if not fwd:
        return ListTime(), ListTime(), ListTime()
    bwd = backward(fwd) + cross_grad_accumulations(spec, sh, setup.images)
    rec = recomputed(spec, setup, fwd)
    tf = time_ops(gpu, prep(fwd))
    return tf, time_ops(gpu, prep(bwd)), tf if len(rec) == len(fwd) else time_ops(gpu, prep(rec))
