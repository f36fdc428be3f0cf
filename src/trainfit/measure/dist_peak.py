"""The CPU peak of one rank's step when a process group's threads touch tensor memory (issue 7).

trainfit.measure.cpu_peak reads c10's running counter (`total_allocated`). That counter only moves for
allocations and frees made in a thread where the profiler is on, and under gloo some frees happen in
gloo's worker threads after their profiler scope has ended: `c10d::_reduce_scatter_base_` on gloo clones
its input (a whole layer's gradients under FSDP2) in the calling thread, and the clone is released by
the gloo thread when the collective is done. Those frees are never reported, so the counter drifts up by
one layer per reduce-scatter (13.7 MB over 3 steps of a 2-rank FSDP tiny-llama).

Here the live bytes are rebuilt from the allocation events themselves, block by block (pointer and size,
in all threads): a block whose free is not reported is recognised when its address is allocated again,
or when it was born inside a c10d op and is still open at the end; it is then taken to die when the first
backend work record (`gloo:*` / `nccl:*`, in the worker thread) that started after its birth ends -- the
moment gloo drops the work and its tensors -- or at the reuse of its address, whichever is first. Work
records in the worker threads also carry gloo's own temporaries (all_gather allocates a full-size flat
buffer in its thread), which are reported and counted like any allocation.

The profiler runs from before the model is built (see worker.py), so every block live at the step start
was allocated in the session: the baseline is read, not summed.
"""
from __future__ import annotations

import bisect
from typing import Any, Callable

from .cpu_peak import PHASE_PREFIX, START, CpuPeak, _walk, profile_run


def _in_c10d(e) -> bool:
    p = e.parent
    while p is not None:
        if p.name.startswith("c10d::"):
            return True
        p = p.parent
    return False


def analyse_blocks(prof, device_type: str = "cpu") -> CpuPeak:
    allocs, marks, works = [], [], []
    for i, e in enumerate(_walk(prof.profiler.kineto_results.experimental_event_tree())):
        ef = e.extra_fields
        if type(ef).__name__ == "_ExtraFields_Allocation":
            if ef.device.type == device_type:
                allocs.append((e.start_time_ns, i, ef.ptr, ef.alloc_size, e))
        elif e.name.startswith(PHASE_PREFIX):
            marks.append((e.start_time_ns, i, e.name[len(PHASE_PREFIX):]))
        elif e.name.startswith(("gloo:", "nccl:")):
            works.append((e.start_time_ns, e.end_time_ns))
    allocs.sort(key=lambda a: (a[0], a[1]))
    marks.sort()
    works.sort()
    work_starts = [w[0] for w in works]

    # pair births and deaths by address
    open_: dict[int, list] = {}  # ptr -> block [birth_t, order, size, death_t, e]
    blocks, unreported, foreign, foreign_bytes = [], 0, 0, 0

    def unreported_death(b, limit):
        j = bisect.bisect_left(work_starts, b[0])
        t = works[j][1] if j < len(works) else None
        return min(t, limit) if (t is not None and limit is not None) else (t if t is not None else limit)

    for t, i, ptr, size, e in allocs:
        if size > 0:
            old = open_.pop(ptr, None)
            if old is not None:  # address reused without a reported free
                old[3] = unreported_death(old, t)
                unreported += 1
            b = [t, i, size, None, e]
            open_[ptr] = b
            blocks.append(b)
        else:
            b = open_.pop(ptr, None)
            if b is None:
                foreign += 1
                foreign_bytes += -size
            else:
                b[3] = t
    for b in open_.values():
        if _in_c10d(b[4]):  # a collective's own copy cannot outlive the step: its free went unreported
            b[3] = unreported_death(b, None)
            unreported += 1 if b[3] is not None else 0

    # one time-ordered walk: births, deaths, phase marks
    ev = []
    for b in blocks:
        ev.append((b[0], 1, b[1], b[2]))
        if b[3] is not None:
            ev.append((b[3], 2, b[1], -b[2]))
    ev.sort()
    phase, live = START, 0
    phase_peaks = {START: 0}
    mark_vals = []
    peak, peak_phase, mi = 0, START, 0
    for t, _, _, delta in ev:
        while mi < len(marks) and marks[mi][0] <= t:
            phase = marks[mi][2]
            mark_vals.append((phase, live))
            phase_peaks[phase] = max(phase_peaks.get(phase, 0), live)
            mi += 1
        live += delta
        if live > phase_peaks.get(phase, 0):
            phase_peaks[phase] = live
        if live > peak:
            peak, peak_phase = live, phase
    while mi < len(marks):
        phase = marks[mi][2]
        mark_vals.append((phase, live))
        phase_peaks[phase] = max(phase_peaks.get(phase, 0), live)
        mi += 1
    notes = []
    if unreported:
        notes.append(f"{unreported} free(s) made by process-group threads outside the profiler were placed at the "
                     "end of the collective that released them")
    if foreign:
        notes.append(f"{foreign} free(s) ({foreign_bytes} bytes) of memory allocated before the session (ignored)")
    return CpuPeak(baseline=0, peak=peak, peak_phase=peak_phase, phase_peaks=phase_peaks, marks=mark_vals, end=live,
                   events=len(allocs), foreign_frees=foreign, foreign_bytes=foreign_bytes, notes=notes)


def profiled(run: Callable[[Callable[[str], None]], Any], on_phase: Callable[[str], None] | None = None):
    """Run `run(phase)` under the memory profiler (as cpu_peak.cpu_peak) and rebuild its live bytes block by block."""
    prof, result = profile_run(run, on_phase)
    return analyse_blocks(prof), result
