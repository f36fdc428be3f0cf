"""The measure engine: run the real standard step (trainfit.step) and read its true memory peak.

`measure(spec, setup)` builds the model (random init), runs `warmup` steps so the optimizer state is
resident, then
- CPU: one step under the memory profiler; the peak is reconstructed from c10's allocation records
  (see trainfit.measure.cpu_peak for exactly what counts);
- CUDA: one step with `torch.cuda.reset_peak_memory_stats()` at its start and at every phase
  boundary; the peak is `max_memory_allocated()` (the caching allocator's live bytes, rounded to its
  512-byte blocks), per phase likewise; reserved memory and device-level usage are overheads,
  reported beside the peak, never folded into it;
then `steps` more steps without the profiler, timed (median). RSS (peak resident set of the process
during one unprofiled step) is a secondary figure: it includes the Python heap, libraries and
allocator caches, and is never the peak.
"""
from __future__ import annotations

import math
import os
import resource
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..analytic.layout import validate_layout
from ..errors import EngineUnavailableError, TrainfitError
from ..estimate import Detail, Estimate, Flops, Memory, Timing
from ..setup import Setup
from ..spec import ModelSpec
from ..step import stack_step
from ..step.standard import MasterWeightOptimizer
from .cpu_peak import batch_tensors, cpu_peak, optimizer_tensors, storage_bytes

STEP_PHASES = ("forward", "backward", "optimizer")
# our phase names -> trainfit.estimate.PHASES
ESTIMATE_PHASE = {"forward": "forward_end", "backward": "backward", "optimizer": "optimizer_step", "end": "optimizer_step"}


class StepOutOfMemoryError(TrainfitError):
    """The real step ran out of memory: its peak exceeds what the device has."""


@dataclass
class MeasureResult:
    peak: int  # bytes: largest total of live tensor bytes during the step
    peak_phase: str  # forward / backward / optimizer / end
    phase_peaks: dict[str, int]  # phase -> highest live bytes in it (all micro-batches)
    weights: int  # model parameters + buffers (bf16 for bf16 / bf16-master)
    optimizer_states: int  # optimizer state tensors (exp_avg, exp_avg_sq, momentum, step counters)
    gradients: int  # bytes of all .grad at the end of backward (before optimizer.step)
    activations: int  # live bytes at the end of the last forward minus at its start
    step_seconds: float  # median over the timed (unprofiled) steps
    tokens_per_second: float
    rss_peak: int | None  # bytes, peak RSS of the process during one unprofiled step (secondary)
    device: str
    notes: list[str] = field(default_factory=list)
    master_weights: int = 0  # bf16-master: the fp32 master copy
    inputs: int = 0  # the batches (input_ids, labels)
    baseline: int = 0  # live bytes at step start (weights + states + master + inputs on CPU)
    params: int = 0  # parameter count
    step_times: list[float] = field(default_factory=list)
    reserved_peak: int | None = None  # CUDA: max_memory_reserved (allocator cache included)
    device_used: int | None = None  # CUDA: device memory in use after the step (all processes, context)
    mode: str = "train"  # "infer": prefill + decode (trainfit.measure.infer); phases "prefill" / "decode"
    kv_cache: int = 0  # infer: bytes of the KV cache after prefill (seq tokens)
    kv_cache_decode: int = 0  # infer: bytes of the KV cache after the decode step (seq + 1 tokens)
    decode_seconds: float = 0.0  # infer: median seconds of one decode step (step_seconds is the prefill)


def _device_type(device) -> str:
    return torch.device(device).type


def check_device(device) -> str:
    """'cpu' or 'cuda' for a device the measure engine can run on here, else a one-line EngineUnavailableError."""
    dev = _device_type(device)
    if dev == "cuda" and not torch.cuda.is_available():
        raise EngineUnavailableError("--device cuda: no CUDA device is available to measure on; use --device cpu")
    if dev not in ("cpu", "cuda"):
        raise EngineUnavailableError(f"the measure engine runs on cpu or cuda, not {device!r}")
    return dev


def timed_steps(step: Callable[[], object], n: int, dev: str, after: Callable[[int], None] = lambda i: None) -> list[float]:
    """Wall seconds of `n` calls of `step` (synchronised before and after on CUDA); `after(i)` follows call i."""
    times = []
    for i in range(n):
        if dev == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        if dev == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        after(i)
    return times


def _rss_reset() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM (Linux >= 4.0)
        return True
    except OSError:
        return False


def _rss_peak(reset_ok: bool) -> int | None:
    if reset_ok:
        try:
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
    try:  # lifetime high-water mark (kB on Linux)
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    except Exception:  # pragma: no cover
        return None


def _state_sizes(model, optimizer, batches, dev: str) -> dict[str, int]:
    seen: set = set()
    weights = storage_bytes(list(model.parameters()) + list(model.buffers()), seen, dev)
    master = 0
    if isinstance(optimizer, MasterWeightOptimizer):
        master = storage_bytes(optimizer.master_params, seen, dev)
    states = storage_bytes(optimizer_tensors(optimizer), seen, dev)
    inputs = storage_bytes(batch_tensors(batches), seen, dev)
    grads = storage_bytes([p.grad for p in model.parameters() if p.grad is not None], seen, dev)
    return {"weights": weights, "master": master, "states": states, "inputs": inputs, "grads_at_start": grads}


def _grad_tensors(model, optimizer):
    return [p.grad for p in model.parameters() if p.grad is not None]


def measure(
    spec: ModelSpec,
    setup: Setup,
    steps: int = 3,
    warmup: int = 1,
    device="cpu",
    progress: Callable[[str, int, int], None] | None = None,
) -> MeasureResult:
    """Run the standard step for real and read its peak (module docstring).

    `warmup` >= 1 steps first (the optimizer state must be resident), then one profiled/peak step,
    then `steps` timed steps. `progress(stage, i, n)` is called with stage "build", "warmup",
    "peak", "time". `setup.mode == "infer"`: prefill + one decode step instead
    (trainfit.measure.infer.measure_inference).
    """
    if setup.mode == "infer":
        from .infer import measure_inference

        return measure_inference(spec, setup, device=device, steps=steps, warmup=warmup, progress=progress)
    validate_layout(spec, setup)  # e.g. --seq past a model's learned positions (even with --force)
    dev = check_device(device)
    progress = progress or (lambda stage, i, n: None)
    warmup = max(1, warmup)
    torch.manual_seed(0)
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = bool(setup.tf32)  # --tf32 (PyTorch's default: off); CPU ignores it
    try:
        progress("build", 0, 1)
        model, optimizer, batches = stack_step(setup).prepare(spec, setup, device=device)  # includes 1 warm-up step
        progress("warmup", 1, warmup)
        for i in range(1, warmup):
            stack_step(setup).run_step(model, optimizer, batches, setup)
            progress("warmup", i + 1, warmup)
        progress("peak", 0, 1)
        if dev == "cuda":
            result = _peak_cuda(model, optimizer, batches, setup, device)
        else:
            result = _peak_cpu(model, optimizer, batches, setup)
        progress("peak", 1, 1)
        times = []
        rss_ok = _rss_reset()
        for i in range(steps):
            if dev == "cuda":
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            stack_step(setup).run_step(model, optimizer, batches, setup)
            if dev == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - t0)
            if i == 0:
                result.rss_peak = _rss_peak(rss_ok)
            progress("time", i + 1, steps)
    except torch.OutOfMemoryError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else "out of memory"
        raise StepOutOfMemoryError(
            f"the step ran out of {dev} memory (peak exceeded what is available: {first}); "
            "lower --batch or --seq, use --recompute full, --grad-accum, or a larger device"
        ) from e
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    result.step_times = times
    if stack_step(setup).NOTE:
        result.notes.append(stack_step(setup).NOTE)
    if times:
        result.step_seconds = statistics.median(times)
        tokens = setup.batch * setup.seq * setup.grad_accum
        result.tokens_per_second = tokens / result.step_seconds if result.step_seconds > 0 else math.inf
    result.params = sum(p.numel() for p in model.parameters())
    return result


def _peak_cpu(model, optimizer, batches, setup) -> MeasureResult:
    sizes = _state_sizes(model, optimizer, batches, "cpu")
    baseline = sizes["weights"] + sizes["master"] + sizes["states"] + sizes["inputs"] + sizes["grads_at_start"]
    grad_info: dict = {}

    def on_phase(name: str) -> None:
        if name == "optimizer":  # end of the last backward: gradients complete
            grad_info["bytes"] = storage_bytes(_grad_tensors(model, optimizer), device="cpu")

    peak, _ = cpu_peak(lambda phase: stack_step(setup).run_step(model, optimizer, batches, setup, phase), baseline, on_phase)
    notes = list(peak.notes)
    notes.append(
        "CPU peak: live tensor bytes from c10's allocation records (torch.profiler profile_memory), "
        "baseline = distinct storages of weights, buffers, optimizer state and batches"
    )
    # activations: live at end of last forward minus at its start
    fw_start = peak.live_at("forward")
    fw_end = peak.live_at("backward")
    phases = {k: v for k, v in peak.phase_peaks.items() if k in STEP_PHASES or k == "end"}
    after = _state_sizes(model, optimizer, batches, "cpu")
    if abs(peak.end - baseline) > 0:
        notes.append(f"live bytes after the step differ from its start by {peak.end - baseline} bytes")
    if after["states"] != sizes["states"]:
        notes.append("optimizer state size changed during the measured step: not in steady state")
    return MeasureResult(
        peak=peak.peak,
        peak_phase=peak.peak_phase,
        phase_peaks=phases,
        weights=sizes["weights"],
        optimizer_states=sizes["states"],
        gradients=grad_info.get("bytes", 0),
        activations=fw_end - fw_start,
        step_seconds=0.0,
        tokens_per_second=0.0,
        rss_peak=None,
        device="cpu",
        notes=notes,
        master_weights=sizes["master"],
        inputs=sizes["inputs"],
        baseline=baseline,
    )


def _peak_cuda(model, optimizer, batches, setup, device) -> MeasureResult:
    """CUDA: allocator statistics. Per-phase peaks: max_memory_allocated read and reset at each boundary."""
    dev = torch.device(device)
    if dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    sizes = _state_sizes(model, optimizer, batches, "cuda")
    torch.cuda.synchronize(dev)
    marks: list[tuple[str, int]] = []
    phase_peaks: dict[str, int] = {}
    current = {"name": "start"}
    grad_info: dict = {}

    def phase(name: str) -> None:
        # close the previous phase window, open the next one
        prev = current["name"]
        phase_peaks[prev] = max(phase_peaks.get(prev, 0), torch.cuda.max_memory_allocated(dev))
        if name == "optimizer":
            grad_info["bytes"] = storage_bytes(_grad_tensors(model, optimizer), device="cuda")
        marks.append((name, torch.cuda.memory_allocated(dev)))
        torch.cuda.reset_peak_memory_stats(dev)
        current["name"] = name

    torch.cuda.reset_peak_memory_stats(dev)
    start = torch.cuda.memory_allocated(dev)
    stack_step(setup).run_step(model, optimizer, batches, setup, phase)
    torch.cuda.synchronize(dev)
    last = current["name"]
    phase_peaks[last] = max(phase_peaks.get(last, 0), torch.cuda.max_memory_allocated(dev))
    reserved = torch.cuda.max_memory_reserved(dev)
    notes = [
        "CUDA peak: torch.cuda.max_memory_allocated (caching-allocator blocks, 512-byte rounded), "
        "reset at the step start; reserved memory and device usage are reported separately"
    ]
    device_used = None
    try:
        free, total = torch.cuda.mem_get_info(dev)
        device_used = total - free
    except Exception:  # pragma: no cover
        pass
    try:  # per-process usage from NVML when available (includes the CUDA context)
        import pynvml  # type: ignore

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(dev.index or 0)
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
            if p.pid == os.getpid() and p.usedGpuMemory:
                notes.append(f"NVML: this process uses {p.usedGpuMemory} bytes on the device (context included)")
    except Exception:
        pass
    peak = max(phase_peaks.values())
    peak_phase = next(k for k in ("forward", "backward", "optimizer", "end", "start") if phase_peaks.get(k) == peak)
    fw = [v for n, v in marks if n == "forward"]
    bw = [v for n, v in marks if n == "backward"]
    activations = (bw[-1] - fw[-1]) if fw and bw else 0
    if start != sizes["weights"] + sizes["master"] + sizes["states"] + sizes["inputs"] + sizes["grads_at_start"]:
        notes.append(
            f"memory_allocated at the step start ({start}) is not the sum of weights, states and inputs "
            "(allocator rounding, or other tensors held by the process)"
        )
    return MeasureResult(
        peak=peak,
        peak_phase=peak_phase,
        phase_peaks={k: v for k, v in phase_peaks.items() if k != "start"},
        weights=sizes["weights"],
        optimizer_states=sizes["states"],
        gradients=grad_info.get("bytes", 0),
        activations=activations,
        step_seconds=0.0,
        tokens_per_second=0.0,
        rss_peak=None,
        device=torch.cuda.get_device_name(dev),
        notes=notes,
        master_weights=sizes["master"],
        inputs=sizes["inputs"],
        baseline=start,
        reserved_peak=reserved,
        device_used=device_used,
    )


def _total_memory(result: MeasureResult) -> int | None:
    if result.device == "cpu":
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):  # pragma: no cover
            return None
    try:
        return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    except Exception:  # pragma: no cover
        return None


def to_estimate(result: MeasureResult, spec: ModelSpec, setup: Setup) -> Estimate:
    """The measured result as an `Estimate` (engine="measure"). FLOPs are left 0 (filled analytically
    by the caller); categories are what was resident (weights, states, master) or measured
    (gradients at the end of backward, activations saved by the last forward)."""
    if result.mode == "infer":
        return _infer_estimate(result, spec, setup)
    phases: dict[str, int] = {}
    for name, v in result.phase_peaks.items():
        key = ESTIMATE_PHASE.get(name)
        if key is not None:
            phases[key] = max(phases.get(key, 0), v)
    known = result.weights + result.master_weights + result.optimizer_states + result.inputs
    at_peak = {
        "weights": result.weights,
        "master_weights": result.master_weights,
        "optimizer_states": result.optimizer_states,
        "inputs": result.inputs,
        "other": max(0, result.peak - known),  # gradients + activations + temporaries, not separated
    }
    memory = Memory(
        weights=result.weights,
        gradients=result.gradients,
        optimizer_states=result.optimizer_states,
        master_weights=result.master_weights,
        activations=result.activations,
        temporaries=0,  # NB: not separable from allocation records alone; see at_peak["other"]
        kv_cache=0,
        peak=result.peak,
        peak_phase=ESTIMATE_PHASE.get(result.peak_phase, result.peak_phase),
        phases=phases,
        at_peak=at_peak,
    )
    total = _total_memory(result)
    timing = Timing(
        gpu=result.device,
        mfu=0.0,
        step_seconds=result.step_seconds,
        tokens_per_second=result.tokens_per_second,
        fits=True,  # it ran
        headroom=(total - result.peak) if total is not None else 0,
    )
    records = {
        "phase_peaks": dict(result.phase_peaks),
        "inputs": result.inputs,
        "baseline": result.baseline,
        "rss_peak": result.rss_peak,
        "reserved_peak": result.reserved_peak,
        "device_used": result.device_used,
        "step_times": list(result.step_times),
    }
    return Estimate(
        engine="measure",
        model=spec.name,
        params=result.params,
        params_per_rank=result.params,
        setup=setup,
        memory=memory,
        flops=Flops(forward=0, backward=0, recompute=0, step=0, model_step=0, per_token=0),
        time=timing,
        notes=tuple(result.notes),
        detail=Detail(records=records),
    )


def _infer_estimate(result: MeasureResult, spec: ModelSpec, setup: Setup) -> Estimate:
    """Inference: phases "prefill" / "decode" (as the analytic engine's), kv_cache after prefill."""
    at_peak = {
        "weights": result.weights,
        "inputs": result.inputs,
        "kv_cache": result.kv_cache_decode if result.peak_phase == "decode" else result.kv_cache,
    }
    at_peak["other"] = max(0, result.peak - sum(at_peak.values()))  # activations, logits, cache growth
    memory = Memory(
        weights=result.weights, gradients=0, optimizer_states=0, master_weights=0,
        activations=result.activations, temporaries=0, kv_cache=result.kv_cache, peak=result.peak,
        peak_phase=result.peak_phase, phases=dict(result.phase_peaks), at_peak=at_peak,
    )
    total = _total_memory(result)
    timing = Timing(
        gpu=result.device, mfu=0.0, step_seconds=result.step_seconds, tokens_per_second=result.tokens_per_second,
        fits=True, headroom=(total - result.peak) if total is not None else 0,
        prefill_seconds=result.step_seconds or None,
        decode_tokens_per_second=(setup.batch / result.decode_seconds) if result.decode_seconds > 0 else None,
    )
    records = {
        "phase_peaks": dict(result.phase_peaks),
        "inputs": result.inputs,
        "baseline": result.baseline,
        "kv_cache_decode": result.kv_cache_decode,
        "rss_peak": result.rss_peak,
        "reserved_peak": result.reserved_peak,
        "device_used": result.device_used,
        "prefill_times": list(result.step_times),
        "decode_seconds": result.decode_seconds,
    }
    return Estimate(
        engine="measure", model=spec.name, params=result.params, params_per_rank=result.params, setup=setup,
        memory=memory, flops=Flops(forward=0, backward=0, recompute=0, step=0, model_step=0, per_token=0),
        time=timing, notes=tuple(result.notes), detail=Detail(records=records),
    )
