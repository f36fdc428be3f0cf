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
    # use_cache is a named argument, or reaches the language model through **kwargs (transformers 5.24
    # Qwen3VLForConditionalGeneration.forward, modeling_qwen3_vl.py:1293-1309, hands them on to Qwen3VLTextModel)
    takes_kwargs = any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params.values())
    causal = causal and cache_arg in params and ("use_cache" in params or takes_kwargs)
    device_type = ids.device.type if ids.device.type in ("cpu", "cuda") else "cpu"
    with torch.no_grad(), torch.autocast(device_type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        phase("prefill")
        if not causal:
            model(input_ids=ids)
            phase("end")
            return None
        if getattr(model.config, "is_encoder_decoder", False):
            cache = _seq2seq_step(model, ids, setup, phase, on_cache, cache_arg)
            phase("end")
            return cache
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
    """(input_ids, image inputs) of the prefill: random prompt ids (Whisper: its encoder's log-mel input_features,
    step/build.py encoder_inputs); a vision-language model's with its images (step/build.py vlm_batch; their
    placeholders in the ids)."""
    from .build import encoder_inputs, vlm_batch

    if spec.vision is None or not setup.images:
        return encoder_inputs(spec, setup, device)[1], {}

    images = vlm_batch(spec, setup, device)
    return images.pop("input_ids"), images


def _seq2seq_step(model, ids: torch.Tensor, setup: Setup, phase: Callable[[str], None],
                  on_cache: Callable[[object], None], cache_arg: str):
    """An encoder-decoder model's prefill and decode step, as generate() runs them (transformers generation/utils.py
    _prepare_encoder_decoder_kwargs_for_generation: the encoder once, its output kept for every decoder step):
    prefill = the encoder over `ids` and the decoder over --target-seq tokens (the tokens generated so far; 1 =
    generate()'s first step from decoder_start_token_id), filling the self-attention cache and the cross-attention
    cache (K/V over the encoder's tokens); decode = one decoder token reading both caches.
    NB: the decoder ids are made here (batch x --target-seq int64), inside the step in both engines; every decoder
    position's logits are computed (T5ForConditionalGeneration.forward takes no logits_to_keep)."""
    start = getattr(model.config, "decoder_start_token_id", None) or model.config.pad_token_id or 0  # T5: pad (0)
    decoder_ids = torch.full((ids.shape[0], setup.target_tokens), start, dtype=torch.long, device=ids.device)
    # Whisper's encoder reads log-mel frames (step.build.encoder_inputs), the others token ids
    encoder_in = {"input_features" if ids.is_floating_point() else "input_ids": ids}
    out = model(**encoder_in, decoder_input_ids=decoder_ids, use_cache=True)
    cache = getattr(out, cache_arg)
    on_cache(cache)
    encoder_out = (out.encoder_last_hidden_state,)
    next_ids = out.logits[:, -1:].argmax(-1)
    del out, decoder_ids
    phase("decode")
    out = model(encoder_outputs=encoder_out, decoder_input_ids=next_ids, use_cache=True, **{cache_arg: cache})
    on_cache(getattr(out, cache_arg))
    del out
    return cache
