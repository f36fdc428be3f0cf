"""The CPU peak of a training step, read from PyTorch's own allocation records (DESIGN.md §3).

How it works
------------
The step runs under `torch.profiler.profile(activities=[CPU], profile_memory=True)`. With memory
profiling on, c10's CPU allocator (`ProfiledCPUMemoryReporter` in c10/core/CPUAllocator.cpp) reports
every allocation and every free of tensor memory to the profiler: pointer, signed byte count, and
its own running total of bytes allocated (`total_allocated`, updated under a mutex together with the
event). We read those events from the profiler's event tree
(`prof.profiler.kineto_results.experimental_event_tree()`, events whose `extra_fields` is an
`_ExtraFields_Allocation` with `ptr`, `alloc_size`, `total_allocated`, `device`).

    peak = baseline + max over the step's events of (total_allocated - total_allocated at step start)

- `baseline` = bytes already live when the step starts: the sum over *distinct storages*
  (`untyped_storage().nbytes()`, deduplicated by data pointer) of the model's parameters and buffers,
  the optimizer state (including master weights and Adam's scalar `step` tensors) and the batches.
  Gradients are None at the start of a steady-state step (`zero_grad(set_to_none=True)`).
- The running total is a difference of the allocator's own counter, so it does not depend on the
  order of events with equal timestamps; every change of the counter is reported with its new value,
  so the max over reports is the max of the counter.

Phases: the step's `phase(name)` callback emits an empty `record_function("trainfit::phase::NAME")`
marker; each allocation event belongs to the last marker before it (by the profiler's timestamps).
`phase_peaks[name]` is the highest live total while in that phase (over all micro-batches), including
the live total at the phase's start.

What counts
-----------
- Every tensor storage allocated through c10's CPU allocator: tensors created by ops, outputs,
  intermediates that kernels allocate as tensors (e.g. `at::empty` workspaces inside an ATen kernel,
  the clone in `mm`'s backward), autograd's saved tensors, gradient buffers, optimizer temporaries.
  Sizes are the requested bytes (`numel * itemsize` for a fresh contiguous tensor): the CPU allocator
  does not round (it aligns the address only), so sums match a hand derivation exactly.
- Allocations of size 0 are not reported (and take no memory).

What does not count (caveats)
-----------------------------
- Memory that is not a c10 tensor allocation: malloc inside BLAS/oneDNN/OpenMP (packing buffers,
  scratchpads that oneDNN allocates itself), the Python heap, the profiler's own buffers. These are
  not "live tensor bytes" (DESIGN.md §3) and show up only in RSS, which we report separately.
- Tensors that the process holds but the step does not own (other models, leftovers) are not in the
  baseline: the peak is the step's own, as `max_memory_allocated` would be in a clean process.
- A free of memory allocated *before* profiling started is not reported by c10 (it does not know the
  size), or reported with a stale size if that address was profiled in an earlier session. In the
  standard step nothing allocated before the step is freed during it (parameters and optimizer state
  are updated in place, gradients start as None); `cpu_peak` checks this: `foreign_frees` counts
  frees of addresses not allocated in the session and is expected to be 0 (a note is added if not).
  The garbage collector is disabled during the profiled step so that it cannot free old tensors.
- CUDA differs: its caching allocator rounds every block up to 512 bytes (and reports those sizes
  in `max_memory_allocated`), so CPU bytes are slightly below CUDA bytes for many small tensors.
"""
from __future__ import annotations

import gc
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

PHASE_PREFIX = "trainfit::phase::"
START = "start"  # pseudo-phase before the first marker


def storage_key(t: torch.Tensor):
    s = t.untyped_storage()
    return (t.device.type, t.device.index, s.data_ptr())


def storage_bytes(tensors: Iterable[torch.Tensor], seen: set | None = None, device: str | None = None) -> int:
    """Bytes of the distinct storages behind `tensors` (skipping those already in `seen`, which is updated)."""
    seen = set() if seen is None else seen
    total = 0
    for t in tensors:
        if t is None or not isinstance(t, torch.Tensor):
            continue
        if device is not None and t.device.type != device:
            continue
        if is_traceable_wrapper_subclass(t):  # a storage-less wrapper (torchao's quantised optimizer states):
            names, _ = t.__tensor_flatten__()  # the tensors it holds
            total += storage_bytes([getattr(t, n) for n in names], seen, device)
            continue
        s = t.untyped_storage()
        if s.nbytes() == 0:
            continue
        k = storage_key(t)
        if k in seen:
            continue
        seen.add(k)
        total += s.nbytes()
    return total


def optimizer_tensors(optimizer) -> list[torch.Tensor]:
    """Every tensor in the optimizer's state (exp_avg, exp_avg_sq, momentum buffers, step counters...)."""
    out = []
    for st in optimizer.state.values():
        for v in st.values():
            if isinstance(v, torch.Tensor):
                out.append(v)
    return out


def batch_tensors(batches) -> list[torch.Tensor]:
    return [v for b in batches for v in b.values() if isinstance(v, torch.Tensor)]


@dataclass
class CpuPeak:
    baseline: int  # live bytes at step start
    peak: int  # baseline + max delta
    peak_phase: str
    phase_peaks: dict[str, int]  # phase -> highest live bytes in it
    marks: list[tuple[str, int]]  # (phase, live bytes when it started), in order
    end: int  # live bytes after the step
    events: int  # allocation/free events seen
    foreign_frees: int = 0  # frees of memory allocated before the session (expected 0)
    foreign_bytes: int = 0
    notes: list[str] = field(default_factory=list)

    def live_at(self, phase: str, occurrence: int = -1) -> int:
        """Live bytes when the `occurrence`-th marker of `phase` fired (default: the last one)."""
        vals = [v for n, v in self.marks if n == phase]
        return vals[occurrence]


def _walk(roots):
    stack = list(reversed(roots))
    while stack:
        e = stack.pop()
        yield e
        stack.extend(reversed(e.children))


def analyse(prof, baseline: int, device_type: str = "cpu") -> CpuPeak:
    """Reconstruct the live-bytes curve from a finished profiler session (see module docstring)."""
    allocs = []  # (t_ns, order, ptr, size, total)
    marks = []  # (t_ns, order, name)
    for i, e in enumerate(_walk(prof.profiler.kineto_results.experimental_event_tree())):
        ef = e.extra_fields
        if type(ef).__name__ == "_ExtraFields_Allocation":
            if ef.device.type != device_type:
                continue
            allocs.append((e.start_time_ns, i, ef.ptr, ef.alloc_size, ef.total_allocated))
        elif e.name.startswith(PHASE_PREFIX):
            marks.append((e.start_time_ns, i, e.name[len(PHASE_PREFIX):]))
    allocs.sort(key=lambda a: (a[0], a[1]))
    marks.sort(key=lambda m: (m[0], m[1]))

    notes = []
    if allocs:
        base_counter = allocs[0][4] - allocs[0][3]
    else:
        base_counter = 0
    # foreign frees: a free of an address not allocated in the profiler session
    live_ptrs: dict[int, int] = {}
    foreign, foreign_bytes = 0, 0
    for _, _, ptr, size, _ in allocs:
        if size > 0:
            live_ptrs[ptr] = size
        elif ptr in live_ptrs:
            del live_ptrs[ptr]
        else:
            foreign += 1
            foreign_bytes += -size
    if foreign:
        notes.append(
            f"{foreign} free(s) ({foreign_bytes} bytes) of memory allocated before the profiled step: "
            "the reconstruction counts them with the size c10 reported"
        )

    # walk events and markers in time order
    peak, peak_phase, phase_peaks, mark_vals, live = walk_phases(
        ((t, baseline + total - base_counter) for t, _, _, _, total in allocs), marks, baseline)
    return CpuPeak(
        baseline=baseline,
        peak=peak,
        peak_phase=peak_phase,
        phase_peaks=phase_peaks,
        marks=mark_vals,
        end=live,
        events=len(allocs),
        foreign_frees=foreign,
        foreign_bytes=foreign_bytes,
        notes=notes,
    )


def walk_phases(samples: Iterable[tuple[float, int]], marks: list, start: int):
    """One time-ordered walk of the live bytes `samples` ((time, live bytes after that event)) against the phase
    `marks` ((time, _, phase name), sorted), from `start` live bytes: (peak, its phase, each phase's peak, the live
    bytes at each mark as (phase, bytes), the live bytes at the end). A mark at an event's time opens its phase
    before that event; marks after the last event open theirs at the end."""
    phase, live = START, start
    phase_peaks: dict[str, int] = {START: start}
    mark_vals: list[tuple[str, int]] = []
    peak, peak_phase, mi = start, START, 0
    for t, after in (*samples, (float("inf"), None)):
        while mi < len(marks) and marks[mi][0] <= t:
            phase = marks[mi][2]
            mark_vals.append((phase, live))
            phase_peaks[phase] = max(phase_peaks.get(phase, 0), live)
            mi += 1
        if after is None:
            break
        live = after
        if live > phase_peaks.get(phase, 0):
            phase_peaks[phase] = live
        if live > peak:
            peak, peak_phase = live, phase
    return peak, peak_phase, phase_peaks, mark_vals, live


def cpu_peak(
    run: Callable[[Callable[[str], None]], Any],
    baseline: int,
    on_phase: Callable[[str], None] | None = None,
) -> tuple[CpuPeak, Any]:
    """Run `run(phase)` under the memory profiler and reconstruct its peak.

    `run` receives a `phase(name)` callback to call at phase boundaries (the standard step's
    `phase` argument); `on_phase(name)` is called from it too (e.g. to read gradient bytes).
    `baseline`: live bytes at the start (see module docstring). Returns (CpuPeak, run's result).
    """
    prof, result = profile_run(run, on_phase)
    return analyse(prof, baseline), result


def profile_run(run, on_phase=None):
    """Run `run(phase)` under the memory profiler, with an empty record_function marker at each phase boundary
    and the garbage collector off (a collection mid-step would free at an arbitrary moment). Returns (prof, result)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    def phase(name: str) -> None:
        with record_function(PHASE_PREFIX + name):
            pass
        if on_phase is not None:
            on_phase(name)

    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            result = run(phase)
    finally:
        if was_enabled:
            gc.enable()
    return prof, result


class PeakSession:
    """The CPU peak of steps a trainer runs itself (trainfit.callbacks): `start(tensors)` with the tensors live at
    that moment (the baseline: distinct storages of the parameters, gradients, optimizer state and the batch),
    `stop()` -> CpuPeak over everything the steps allocated in between (the same records as `cpu_peak`; the garbage
    collector off in between, as in `profile_run`)."""

    def __init__(self):
        self._prof = None
        self._baseline = 0
        self._gc = True

    def start(self, tensors: Iterable[torch.Tensor]) -> None:
        from torch.profiler import ProfilerActivity, profile

        self._baseline = storage_bytes(tensors, device="cpu")
        gc.collect()
        self._gc = gc.isenabled()
        gc.disable()
        self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self._prof.start()

    def stop(self) -> CpuPeak:
        try:
            self._prof.stop()
            alive = None
            if torch.distributed.is_available() and torch.distributed.is_initialized():
                from .dist_peak import live_storage_ptrs
                alive = live_storage_ptrs()
        finally:
            if self._gc:
                gc.enable()
        if alive is None:
            return analyse(self._prof, self._baseline)
        # a process group's threads free tensors outside the profiler (gloo's reduce-scatter clone,
        # measure/dist_peak.py): the live bytes rebuilt block by block, on top of the baseline (blocks born before
        # the session are not in them)
        from dataclasses import replace

        from .dist_peak import analyse_blocks

        p = analyse_blocks(self._prof, alive=alive)
        return replace(p, baseline=self._baseline, peak=self._baseline + p.peak, end=self._baseline + p.end,
                       phase_peaks={k: self._baseline + v for k, v in p.phase_peaks.items()},
                       marks=[(k, self._baseline + v) for k, v in p.marks])
