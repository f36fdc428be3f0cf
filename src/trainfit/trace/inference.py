"""Inference standard steps (DESIGN.md §3): prefill of a batch of prompts, then one decode step on the
full KV cache, traced like the training step.

    phase("prefill"): out = model(ids, use_cache=True, logits_to_keep=1)   # HF DynamicCache filled
    phase("decode"):  model(next_ids, past_key_values=cache, use_cache=True, logits_to_keep=1)

`logits_to_keep=1` is what `generate()` passes (only the last position's logits are needed), so the
(batch, seq, vocab) logits of a training forward are not materialised. Encoders (BERT) have no
cache: one forward over the batch ("prefill"). The cache's tensors are labelled kv_cache; DynamicCache
grows by `torch.cat`, so each layer briefly holds old and new cache during decode (counted).
The step is `trainfit.step.infer.inference_step`, the one the measure engine runs on real tensors.
"""
from __future__ import annotations

import time
from dataclasses import replace

import torch

from ..errors import EngineUnavailableError
from ..setup import Setup
from ..spec import ModelSpec
from ..step.infer import inference_step, prompt
from .analysis import INFER_PHASES, analyse
from .cuda_kernels import cuda_kernels
from .fake import fake_mode, translated_errors, vision_constants
from .modules import ModuleStack
from .recorder import BUFFER, INPUT, KV_CACHE, PARAMETER, AllocationRecorder
from ..vlm_setup import lm_seq


def cache_tensors(cache) -> list[torch.Tensor]:
    # an encoder-decoder model's cache (transformers cache_utils.py EncoderDecoderCache): the decoder's self-attention
    # DynamicCache, growing with the generated tokens, and the cross-attention one, K/V over the encoder's tokens
    # written once at the first decoder step (modeling_t5.py T5Attention.forward :310-345)
    parts = [getattr(cache, "self_attention_cache", None), getattr(cache, "cross_attention_cache", None)]
    if any(p is not None for p in parts):
        return [t for p in parts if p is not None for t in cache_tensors(p)]
    out = []
    for layer in getattr(cache, "layers", ()):
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if isinstance(t, torch.Tensor):
                out.append(t)
        # linear-attention layers (transformers cache_utils.py LinearAttentionCacheLayerMixin: Qwen3-Next's Gated
        # DeltaNet): the per-sequence conv and recurrent states, held by state index
        for states in (getattr(layer, "conv_states", None), getattr(layer, "recurrent_states", None)):
            if isinstance(states, dict):
                out.extend(t for t in states.values() if isinstance(t, torch.Tensor))
    return out


def trace_inference(spec: ModelSpec, setup: Setup, *, flops: bool = True, alloc_conf: str | None = None):
    from .engine import NOTES, build_hf, device_notes, estimate_from

    if setup.precision in ("int8", "int4", "fp8"):
        raise EngineUnavailableError(
            f"--precision {setup.precision}: quantized inference kernels are not traced; use the analytic engine")
    t0 = time.perf_counter()
    with translated_errors(spec.name), fake_mode(), cuda_kernels(setup), vision_constants(spec):
        model = build_hf(spec, setup).eval()
        ids, images = prompt(spec, setup)  # input_ids (Whisper: input_features)
        modules = ModuleStack(model)
        rec = AllocationRecorder(modules, count_flops=flops, round_cuda=setup.device == "cuda")

        def on_cache(cache):
            for t in cache_tensors(cache):
                rec.adopt(t, KV_CACHE)

        with modules, rec:
            for name, p in model.named_parameters():
                rec.adopt(p, PARAMETER, name)
            for name, b in model.named_buffers():
                rec.adopt(b, BUFFER, name)
            rec.adopt(ids, INPUT, "input_features" if ids.is_floating_point() else "input_ids")
            for name, t in images.items():
                rec.adopt(t, INPUT, name)
            start = rec.event
            rec.reset_peak()
            inference_step(model, ids, setup, spec.causal, phase=rec.set_phase, on_cache=on_cache, images=images)
        an = analyse(rec, start, INFER_PHASES)
    if rec.flops is not None:  # Flops.forward is the prefill; the decode step's FLOPs go in detail
        by_phase = rec.flops.by_phase
        rec.flops.by_kind["forward"] = by_phase.get("prefill", 0)
    est = estimate_from(spec.name, model, setup, rec, an, setup.batch * lm_seq(spec, setup), time.perf_counter() - t0,
                    NOTES + tuple(device_notes(setup)) +
                    ("inference: activations are reported as temporaries (nothing is saved for backward)",),
                    alloc_conf=alloc_conf)
    if rec.flops is not None:
        est = replace(est, detail=est.detail.with_records(decode_flops=rec.flops.by_phase.get("decode", 0)))
    return est
