"""The measure engine for inference (DESIGN.md §3, "Inference has its own standard steps").

    ids = randint(vocab, (batch, seq))                          # resident, like the weights
    with torch.no_grad() [, autocast for amp-*]:
        phase("prefill"): out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
                          next_ids = out.logits[:, -1:].argmax(-1); del out   # cache kept
        phase("decode"):  out = model(input_ids=next_ids, past_key_values=cache, use_cache=True,
                                      logits_to_keep=1); del out
        phase("end")

- Prefill of a batch of `seq`-token prompts; the HF `DynamicCache` it returns holds `seq` tokens.
  `logits_to_keep=1` is what `generate()` passes: only the last position's logits are computed, so
  the (batch, seq, vocab) logits of a training forward never exist.
- Decode: one step with the cache filled to `seq` tokens; it grows to `seq + 1` (DynamicCache
  appends with `torch.cat`, so each layer briefly holds its old and new K/V: that is counted).
- Encoders (BERT, no cache): one forward over the batch, phase "prefill" only.
- Weights in the setup's dtype: fp32, bf16, fp16 (amp-bf16 / amp-fp16: fp32 weights under autocast).
  int8 / int4 / fp8 need quantised kernels that this engine does not run (EngineUnavailableError).
- The model is in eval mode (dropout off), random weights, no downloads.

The step itself is `trainfit.step.infer.inference_step`, the one the trace engine runs too. Peaks come from the same allocation records as training (trainfit.measure.cpu_peak)
on CPU, and from `max_memory_allocated` reset at every phase boundary on CUDA.

    baseline = weights + buffers + the prompt ids (distinct storages)
    kv_cache = sum of the cache tensors' storages after prefill (= 2·layers·kv_heads·head_dim·batch·seq·bytes)
"""
from __future__ import annotations

import math
import statistics
import time
from typing import Callable

import torch

from ..analytic.layout import validate_layout
from ..errors import EngineUnavailableError, SetupError
from ..setup import Setup
from ..spec import ModelSpec
from ..step.infer import inference_step
from .cpu_peak import cpu_peak, storage_bytes

INFER_PHASES = ("prefill", "decode")
QUANTISED = ("int8", "int4", "fp8")
_KV_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def cache_tensors(cache) -> list[torch.Tensor]:
    """The K/V tensors of an HF cache (transformers >= 4.56 `Cache.layers[i].keys/values`, or the older
    `key_cache` / `value_cache` lists, or the legacy tuple of (k, v) pairs)."""
    if cache is None:
        return []
    out: list[torch.Tensor] = []
    layers = getattr(cache, "layers", None)
    if layers is not None:
        for layer in layers:
            for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
                if isinstance(t, torch.Tensor):
                    out.append(t)
        return out
    for name in ("key_cache", "value_cache"):
        out.extend(t for t in getattr(cache, name, ()) if isinstance(t, torch.Tensor))
    if not out and isinstance(cache, (tuple, list)):
        for kv in cache:
            out.extend(t for t in kv if isinstance(t, torch.Tensor))
    return out


def cache_bytes(cache) -> int:
    return storage_bytes(cache_tensors(cache))


def check_infer_setup(setup: Setup) -> None:
    """Refuse what the real inference step here cannot run (a TrainfitError that says what to do)."""
    if setup.mode != "infer":
        raise SetupError("measure_inference needs --mode infer (training steps: trainfit.measure.measure)")
    if setup.precision in QUANTISED:
        raise EngineUnavailableError(
            f"--precision {setup.precision}: the measure engine does not run quantised kernels "
            "(int8/int4/fp8 weights); measure bf16 or fp16 instead, or use the analytic engine")
    if setup.kv_dtype is not None and setup.kv_dtype not in _KV_DTYPES:
        raise EngineUnavailableError(
            f"--kv-dtype {setup.kv_dtype}: the measure engine runs HF's DynamicCache, which is not quantised; "
            "drop --kv-dtype or use the analytic engine")
    if setup.tp > 1 or setup.pp > 1:
        raise EngineUnavailableError(
            "the measure engine runs one unsharded process: --tp/--pp are not measured; use the analytic engine")


def check_kv_dtype(setup: Setup, cache) -> None:
    """--kv-dtype must be the dtype HF's cache actually has (we do not convert it). NB: that dtype is the K
    projection's output after the rotary embedding: under amp-* autocast llama-style models return cos/sin in
    the fp32 hidden dtype, so K becomes fp32 (V too up to transformers 5.23, whose DynamicLayer allocated V in K's
    dtype; from 5.24 V keeps its own)."""
    tensors = cache_tensors(cache)
    if setup.kv_dtype is None or not tensors:
        return
    have = tensors[0].dtype
    if have != _KV_DTYPES[setup.kv_dtype]:
        raise EngineUnavailableError(
            f"--kv-dtype {setup.kv_dtype}: HF's DynamicCache holds K/V in {str(have).removeprefix('torch.')} for "
            f"this model at --precision {setup.precision}; the measure engine does not convert the cache: "
            "drop --kv-dtype or use the analytic engine")


def prepare_inference(spec: ModelSpec, setup: Setup, device="cpu"):
    """(model in eval mode, prompt ids, image inputs) — built from the config with random weights; the image inputs
    are a vision-language model's (step/infer.py prompt), else empty; Whisper's ids are its input_features."""
    from ..step.build import build_model

    try:
        model = build_model(spec, setup, device=device)
    except (ValueError, ImportError, KeyError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise EngineUnavailableError(f"transformers cannot build {spec.name}: {first}") from e
    model.eval()
    from ..step.infer import prompt

    ids, images = prompt(spec, setup, device)
    return model, ids, images


def measure_inference(spec: ModelSpec, setup: Setup, device="cpu", steps: int = 3, warmup: int = 1,
                      progress: Callable[[str, int, int], None] | None = None):
    """Run prefill + one decode step for real and read the peaks (module docstring) -> MeasureResult.

    `warmup` unprofiled runs first (lazy initialisations), then one peak run (profiler on CPU,
    allocator statistics on CUDA), then `steps` timed runs (median prefill and decode seconds).
    """
    from .runner import (
        StepOutOfMemoryError,
        _rss_peak,
        _rss_reset,
        check_device,
    )

    check_infer_setup(setup)
    validate_layout(spec, setup)  # e.g. the decode token past a model's learned positions
    dev = check_device(device)
    progress = progress or (lambda stage, i, n: None)
    torch.manual_seed(0)
    try:
        progress("build", 0, 1)
        model, ids, images = prepare_inference(spec, setup, device)
        for i in range(max(1, warmup)):
            cache = inference_step(model, ids, setup, spec.causal, images=images)
            if i == 0:
                check_kv_dtype(setup, cache)
            del cache
            progress("warmup", i + 1, max(1, warmup))
        progress("peak", 0, 1)
        if dev == "cuda":
            result = _infer_peak_cuda(model, ids, spec, setup, device, images)
        else:
            result = _infer_peak_cpu(model, ids, spec, setup, images)
        progress("peak", 1, 1)
        prefill_t, decode_t = [], []
        rss_ok = _rss_reset()
        for i in range(steps):
            stamps: dict[str, float] = {}

            def stamp(name: str) -> None:
                if dev == "cuda":
                    torch.cuda.synchronize(device)
                stamps[name] = time.perf_counter()

            inference_step(model, ids, setup, spec.causal, phase=stamp, images=images)
            if "decode" in stamps:
                prefill_t.append(stamps["decode"] - stamps["prefill"])
                decode_t.append(stamps["end"] - stamps["decode"])
            else:
                prefill_t.append(stamps["end"] - stamps["prefill"])
            if i == 0:
                result.rss_peak = _rss_peak(rss_ok)
            progress("time", i + 1, steps)
    except torch.OutOfMemoryError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else "out of memory"
        raise StepOutOfMemoryError(
            f"inference ran out of {dev} memory ({first}); lower --batch or --seq, or use a larger device") from e
    if prefill_t:
        result.step_times = prefill_t
        result.step_seconds = statistics.median(prefill_t)
        result.tokens_per_second = setup.batch * setup.seq / result.step_seconds if result.step_seconds > 0 else math.inf
    if decode_t:
        result.decode_seconds = statistics.median(decode_t)
    result.params = sum(p.numel() for p in model.parameters())
    return result


def _sizes(model, ids, images: dict) -> tuple[int, int]:
    seen: set = set()
    weights = storage_bytes(list(model.parameters()) + list(model.buffers()), seen)
    inputs = storage_bytes([ids, *images.values()], seen)
    return weights, inputs


def _infer_peak_cpu(model, ids, spec, setup, images: dict):
    from .runner import MeasureResult

    weights, inputs = _sizes(model, ids, images)
    baseline = weights + inputs
    kv: list[int] = []

    def on_cache(cache) -> None:
        kv.append(cache_bytes(cache))  # reads storages only: allocates nothing

    peak, _ = cpu_peak(lambda phase: inference_step(model, ids, setup, spec.causal, phase, on_cache, images), baseline)
    notes = list(peak.notes)
    notes.append("CPU peak: live tensor bytes from c10's allocation records (torch.profiler profile_memory); "
                 "baseline = weights, buffers and the prompt ids")
    phases = {k: v for k, v in peak.phase_peaks.items() if k in INFER_PHASES}
    return _result(MeasureResult, peak.peak, _peak_phase(phases, peak.peak), phases, weights, inputs, baseline, kv,
                   "cpu", notes)


def _peak_phase(phases: dict[str, int], peak: int) -> str:
    for name in INFER_PHASES:  # "end" cannot exceed decode: everything there was live in decode
        if phases.get(name) == peak:
            return name
    return max(phases, key=phases.get) if phases else "prefill"


def _result(cls, peak, peak_phase, phases, weights, inputs, baseline, kv, device, notes):
    kv_prefill = kv[0] if kv else 0
    kv_decode = kv[-1] if len(kv) > 1 else kv_prefill
    return cls(
        peak=peak, peak_phase=peak_phase, phase_peaks=phases, weights=weights, optimizer_states=0, gradients=0,
        # NB: the prefill's transient above weights, prompt and the full cache: at the prefill peak only the
        # layers up to the current one have cached K/V, so this can under-read the transient by < kv_cache.
        activations=max(0, phases.get("prefill", peak) - baseline - kv_prefill),
        step_seconds=0.0, tokens_per_second=0.0, rss_peak=None, device=device, notes=notes, inputs=inputs,
        baseline=baseline, mode="infer", kv_cache=kv_prefill, kv_cache_decode=kv_decode,
    )


def _infer_peak_cuda(model, ids, spec, setup, device, images: dict):
    from .runner import MeasureResult

    dev = torch.device(device)
    if dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    weights, inputs = _sizes(model, ids, images)
    kv: list[int] = []
    phase_peaks: dict[str, int] = {}
    current = {"name": "start"}

    def phase(name: str) -> None:
        prev = current["name"]
        phase_peaks[prev] = max(phase_peaks.get(prev, 0), torch.cuda.max_memory_allocated(dev))
        torch.cuda.reset_peak_memory_stats(dev)
        current["name"] = name

    torch.cuda.synchronize(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    start = torch.cuda.memory_allocated(dev)
    inference_step(model, ids, setup, spec.causal, phase, lambda c: kv.append(cache_bytes(c)), images)
    torch.cuda.synchronize(dev)
    phase_peaks[current["name"]] = max(phase_peaks.get(current["name"], 0), torch.cuda.max_memory_allocated(dev))
    reserved = torch.cuda.max_memory_reserved(dev)
    phases = {k: v for k, v in phase_peaks.items() if k in INFER_PHASES}
    if "end" in phase_peaks:  # the tail of decode (after its last boundary) belongs to decode
        key = "decode" if "decode" in phases else "prefill"
        phases[key] = max(phases.get(key, 0), phase_peaks["end"])
    peak = max(phases.values())
    notes = ["CUDA peak: torch.cuda.max_memory_allocated (caching-allocator blocks, 512-byte rounded), reset at "
             "every phase boundary; reserved memory and device usage are reported separately"]
    r = _result(MeasureResult, peak, _peak_phase(phases, peak), phases, weights, inputs, start, kv,
                torch.cuda.get_device_name(dev), notes)
    r.reserved_peak = reserved
    try:
        free, total = torch.cuda.mem_get_info(dev)
        r.device_used = total - free
    except Exception:  # pragma: no cover
        pass
    return r
