"""The inference standard step (DESIGN.md §3), shared by the measure and trace engines.

    phase("prefill"): out = model(ids, use_cache=True, logits_to_keep=1)   # HF DynamicCache filled
    phase("decode"):  model(next_ids, past_key_values=cache, use_cache=True, logits_to_keep=1)

`logits_to_keep=1` is what `generate()` passes (only the last position's logits are needed). Encoders (BERT)
have no cache: one forward over the batch ("prefill"). Under amp-* the step runs under torch.autocast.
"""
from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Callable

import torch

from ..setup import Setup
from .build import autocast_dtype

if TYPE_CHECKING:  # pragma: no cover
    from ..spec import ModelSpec


def inference_step(model, ids: torch.Tensor, setup: Setup, causal: bool = True,
                   phase: Callable[[str], None] = lambda name: None,
                   on_cache: Callable[[object], None] = lambda cache: None, images: dict | None = None):
    """Prefill + one decode step; returns the final cache (None for encoders). `on_cache` sees the cache after
    each forward (the engines label or weigh it). `images`: a vision-language model's image inputs for the prefill
    (step/build.py vlm_batch less its input_ids: pixel_values, image_grid_thw, the tower's index tensors); `ids`
    then holds the image placeholders."""
    images = images or {}
    dtype = autocast_dtype(setup)
    params = inspect.signature(model.forward).parameters
    kw = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
    # transformers 5.24 renamed past_key_values to cache (the argument and the output field)
    cache_arg = "cache" if "cache" in params else "past_key_values"
    causal = causal and cache_arg in params and "use_cache" in params
    device_type = ids.device.type if ids.device.type in ("cpu", "cuda") else "cpu"
    with torch.no_grad(), torch.autocast(device_type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        phase("prefill")
        if not causal:
            model(input_ids=ids)
            phase("end")
            return None
        out = model(input_ids=ids, use_cache=True, **images, **kw)
        cache = getattr(out, cache_arg)
        on_cache(cache)
        next_ids = out.logits[:, -1:].argmax(-1)  # greedy; its value does not matter for memory
        del out
        phase("decode")
        out = model(input_ids=next_ids, use_cache=True, **{cache_arg: cache}, **kw)
        on_cache(getattr(out, cache_arg))
        del out
        phase("end")
    return cache


def prompt(spec: "ModelSpec", setup: Setup, device="cpu") -> tuple[torch.Tensor, dict]:
    """(input_ids, image inputs) of the prefill: random prompt ids; a vision-language model's with its images
    (step/build.py vlm_batch; their placeholders in the ids)."""
    if spec.vision is None or not setup.images:
        return torch.randint(0, spec.vocab, (setup.batch, setup.seq), device=device), {}
    from .build import vlm_batch

    images = vlm_batch(spec, setup, device)
    return images.pop("input_ids"), images
