"""The CPU peak of one rank's step when a process group's threads touch tensor memory (issue 7).

trainfit.measure.cpu_peak reads c10's running counter (`total_allocated`). That counter only moves for
allocations and frees made in a thread where the profiler is on, and under gloo some frees happen in
gloo's worker threads after their profiler scope has ended: `c10d::_reduce_scatter_base_` on gloo clones
its input (a whole layer's gradients under FSDP2) in the calling thread, and the clone is released by
the gloo thread when the collective is done. Those frees are never reported, so the counter drifts up by
one layer per reduce-scatter (13.7 MB over 3 steps of a 2-rank FSDP tiny-llama).

Here the live bytes are rebuilt from the allocation events themselves, block by block (pointer and size,
in all threads): a block whose free is not reported is recognised when its address is allocated again,
or when it was born inside a c10d op and is still open at the end; it is then taken to die when its own
collective's backend work record (`gloo:*` / `nccl:*`, in the worker thread) ends -- the moment gloo drops the
work and its tensors -- or at the reuse of its address, whichever is first. A c10d op enqueues exactly one work
and gloo's queue is FIFO, so the k-th c10d op of a kind owns the k-th work record of that kind (WORK_KIND); matching
by time alone ("the first work that started after the birth") is wrong when gloo's two worker threads run a
prefetched all-gather beside the reduce-scatter, which made a loaded 2-core machine's peaks jitter by a layer. Work
records in the worker threads also carry gloo's own temporaries (all_gather allocates a full-size flat
buffer in its thread), which are reported and counted like any allocation.

The profiler runs from before the model is built (see worker.py), so every block live at the step start
was allocated in the session: the baseline is read, not summed.
"""
from __future__ import annotations

import bisect
from itertools import accumulate
from typing import Any, Callable

from .cpu_peak import PHASE_PREFIX, CpuPeak, _walk, profile_run, walk_phases


# The backend work each c10d op enqueues, by name (seen in the profiler: gloo runs _reduce_scatter_base_ as an
# all_reduce of its input's clone, torch/csrc/distributed/c10d/ProcessGroupGloo.cpp _reduce_scatter_base).
WORK_KIND = {"c10d::_reduce_scatter_base_": "all_reduce", "c10d::allreduce_": "all_reduce",
             "c10d::_allgather_base_": "all_gather", "c10d::allgather_": "all_gather",
             "c10d::broadcast_": "broadcast", "c10d::barrier": "barrier",
             # torchtitan's expert-parallel dispatch and combine (functional all_to_all_single)
             "c10d::alltoall_base_": "all_to_all",
             # the coalesced forms Megatron-Core's DDP and distributed optimizer call (param_and_grad_buffer.py
             # reduce_scatter_tensor / all_gather_into_tensor under _coalescing_manager): one work each on gloo
             "c10d::reduce_scatter_tensor_coalesced_": "all_reduce",
             "c10d::allgather_into_tensor_coalesced_": "all_gather"}


def _outer_c10d(e):
    """The outermost c10d op an event happened in (None outside any)."""
    found, p = None, e.parent
    while p is not None:
        if p.name.startswith("c10d::"):
            found = p
        p = p.parent
    return found


def _key(e) -> tuple:
    # the profiler's tree hands out new wrappers for the same event (e.parent), so events are matched by value
    return e.name, e.start_time_ns, e.end_time_ns


def _own_work_ends(ops: list, works: dict) -> dict:
    """{(name, start) of a c10d op event: end of its own work record}: the k-th op of a kind owns the k-th work of that kind (FIFO);
    a kind whose counts differ is left out (its blocks fall back to the first work after their birth)."""
    by_kind: dict[str, list] = {}
    for op in sorted(ops, key=lambda o: o.start_time_ns):
        kind = WORK_KIND.get(op.name)
        if kind is not None:
            by_kind.setdefault(kind, []).append(op)
    out = {}
    for kind, kops in by_kind.items():
        kworks = sorted(works.get(kind, []))
        if len(kworks) == len(kops):
            out.update({_key(op): end for op, (_, end) in zip(kops, kworks)})
    return out


def analyse_blocks(prof, device_type: str = "cpu", alive: set | None = None) -> CpuPeak:
    """alive: the data pointers of every storage still held when the run returned (None: not known). A block open at
    the end, born outside any c10d op, whose address no live storage holds was freed unreported too -- a tensor whose
    last reference a process-group worker dropped (Megatron's async all_reduce of a linear layer's input gradient,
    tensor_parallel/layers.py: the gloo work outlives the caller's handle); it is taken to die when the first work
    that started after its birth ends."""
    allocs, marks, works, ops, by_kind = [], [], [], {}, {}
    for i, e in enumerate(_walk(prof.profiler.kineto_results.experimental_event_tree())):
        ef = e.extra_fields
        if type(ef).__name__ == "_ExtraFields_Allocation":
            if ef.device.type == device_type:
                allocs.append((e.start_time_ns, i, ef.ptr, ef.alloc_size, e))
        elif e.name.startswith(PHASE_PREFIX):
            marks.append((e.start_time_ns, i, e.name[len(PHASE_PREFIX):]))
        elif e.name.startswith(("gloo:", "nccl:")):
            works.append((e.start_time_ns, e.end_time_ns))
            by_kind.setdefault(e.name.split(":", 1)[1], []).append((e.start_time_ns, e.end_time_ns))
        elif e.name.startswith("c10d::") and _outer_c10d(e) is None:
            ops[_key(e)] = e
    allocs.sort(key=lambda a: (a[0], a[1]))
    marks.sort()
    works.sort()
    work_starts = [w[0] for w in works]
    own_end = _own_work_ends(list(ops.values()), by_kind)

    # pair births and deaths by address
    open_: dict[int, list] = {}  # ptr -> block [birth_t, order, size, death_t, e]
    blocks, unreported, foreign, foreign_bytes, orphaned = [], 0, 0, 0, 0

    def unreported_death(b, limit):
        op = _outer_c10d(b[4])
        t = own_end.get(_key(op)) if op is not None else None
        if t is None:
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
    for ptr, b in open_.items():
        if _outer_c10d(b[4]) is not None:  # a collective's own copy cannot outlive the step: its free went unreported
            b[3] = unreported_death(b, None)
            unreported += 1 if b[3] is not None else 0
        elif alive is not None and ptr not in alive:
            j = bisect.bisect_left(work_starts, b[0])
            b[3] = works[j][1] if j < len(works) else None
            orphaned += 1 if b[3] is not None else 0

    # one time-ordered walk: births, deaths, phase marks
    ev = []
    for b in blocks:
        ev.append((b[0], 1, b[1], b[2]))
        if b[3] is not None:
            ev.append((b[3], 2, b[1], -b[2]))
    ev.sort()
    peak, peak_phase, phase_peaks, mark_vals, live = walk_phases(
        zip((e[0] for e in ev), accumulate(e[3] for e in ev)), marks, 0)
    notes = []
    if unreported:
        notes.append(f"{unreported} free(s) made by process-group threads outside the profiler were placed at the "
                     "end of the collective that released them")
    if orphaned:
        notes.append(f"{orphaned} block(s) no live tensor holds at the end, freed by process-group threads, were "
                     "placed at the end of the first collective after their birth")
    if foreign:
        notes.append(f"{foreign} free(s) ({foreign_bytes} bytes) of memory allocated before the session (ignored)")
    return CpuPeak(baseline=0, peak=peak, peak_phase=peak_phase, phase_peaks=phase_peaks, marks=mark_vals, end=live,
                   events=len(allocs), foreign_frees=foreign, foreign_bytes=foreign_bytes, notes=notes)


def profiled(run: Callable[[Callable[[str], None]], Any], on_phase: Callable[[str], None] | None = None,
             alive: Callable[[], set] | None = None):
    """Run `run(phase)` under the memory profiler (as cpu_peak.cpu_peak) and rebuild its live bytes block by block.
    alive(): called after the run, the data pointers of the storages still held (see analyse_blocks)."""
    prof, result = profile_run(run, on_phase)
    return analyse_blocks(prof, alive=alive() if alive is not None else None), result


def live_storage_ptrs() -> set:
    """The data pointers of every CPU tensor storage the garbage collector can reach (parameters, buffers, optimizer
    state, caches such as Megatron's GlobalMemoryBuffer)."""
    import gc
    import warnings

    import torch

    out = set()
    with warnings.catch_warnings():  # isinstance on torch.distributed's deprecated reduce_op object warns
        warnings.simplefilter("ignore", FutureWarning)
        for o in gc.get_objects():
            try:
                if isinstance(o, torch.Tensor) and o.device.type == "cpu":
                    out.add(o.untyped_storage().data_ptr())
            except Exception:  # noqa: BLE001 - tensors without storage (meta, sparse, wrappers)
                continue
    return out
