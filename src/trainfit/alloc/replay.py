"""Replay a traced step's allocation stream (trace/recorder.py Records: nbytes, birth, death event indices)
through the caching-allocator simulation: the step's `max_memory_reserved`.

Order: every record's birth and death by event index (each index is one or the other). The resident state
(weights, optimizer state, batches: born before `start`) is allocated first, in adoption order (a distributed
trace's setup as it ran, from the wrapped model on: trace/engine.py replay_args), then the step runs twice, the
way a measured run reaches steady state: before the second pass the storages the first one left alive are freed
(the next step makes its own), and the peaks are reset at its start (torch.cuda.reset_peak_memory_stats); reserved
never shrinks without an OOM, so the second pass' maximum is the steady state's. Events from `end` on (the
recorder had stopped: the model and optimizer going away after the trace) are not replayed: the resident state
stays allocated through the second pass.
Streams: each record is allocated on its `stream` (trace/streams.py: FSDP2's all-gather copy-in and
reduce-scatter streams are 1..; records without one are on 0), so a block freed on a side stream serves only that
stream's later requests, as in the caching allocator (caching_allocator.py, get_free_block).
NB (each reads reserved low where it applies): a free returns its block at once -- right for FSDP2, which holds
references until its events instead of calling record_stream (trace/streams.py), but blocks a collective
backend record_stream's (ProcessGroupNCCL's own stream) would stay busy until the GPU catches up, which a
trace without timing cannot know; resident tensors are allocated in adoption order, not in the order model
construction made them (the optimizer's states, where the caller names them `lazy`, in the first step's optimizer
phase, as torch.optim makes them); allocations inside one kernel (cuBLAS workspaces) are not in the trace.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import cancel
from .caching_allocator import Allocator
from .config import AllocConf, parse_alloc_conf


@dataclass(frozen=True)
class Replay:
    reserved: int  # max reserved over the (second) step, including the resident state
    allocated: int  # max allocated over it: the trace's peak rounded like the allocator
    segments: int  # segments (or mapped ranges) held at the end
    segment_sizes: tuple[int, ...] = ()  # their sizes (bytes), by address
    retries: int = 0  # malloc's OOM retries (num_alloc_retries): release_cached_blocks, then cudaMalloc again
    # the least capacity at which every request of the step is served (least_capacity); None: not searched
    required: int | None = None


def segment_histogram(sizes) -> list[list[int]]:
    """[[segment bytes, how many], ...], largest first: the simulator's segments (Replay.segment_sizes) and a real
    process's (torch.cuda.memory_snapshot()'s total_size per segment) in one form, so bench/gpu/cuda_truth.py can set
    them side by side where reserved differs."""
    counts: dict[int, int] = {}
    for n in sizes:
        counts[int(n)] = counts.get(int(n), 0) + 1
    return [[n, c] for n, c in sorted(counts.items(), reverse=True)]


def _events(records, lo: int, hi: int | None = None):
    ev = []
    for r in records:
        if not r.nbytes:  # no block: CUDACachingAllocator.cpp NativeCachingAllocator::allocate mallocs if size != 0
            continue
        if r.birth >= lo and (hi is None or r.birth < hi):
            ev.append((r.birth, 1, r))
        if r.death is not None and r.death >= lo and (hi is None or r.death < hi):
            ev.append((r.death, 0, r))
    ev.sort(key=lambda e: e[0])
    return ev


def replay(records, start: int, conf: AllocConf | str | None = None, capacity: int | None = None,
           end: int | None = None, lazy=None, lazy_at: int | None = None) -> Replay:
    """Max reserved over a steady-state step. records: objects with nbytes, birth, death (None: alive at the end)
    and optionally stream (default 0); start: the event index at which the step starts; end: the first event
    after it (None: the last record's). lazy, lazy_at: resident records (`lazy(r)` true) that the first step makes
    at its event `lazy_at` rather than before it — torch.optim's states, created in the first optimizer.step()
    after the backward has freed its activations into the cache (torch/optim/adam.py _init_group: zeros_like)."""
    a, _, _ = steady_state(records, start, conf, capacity, end, lazy, lazy_at)
    sizes = a.segments
    return Replay(reserved=a.max_reserved, allocated=a.max_allocated, segments=len(sizes), segment_sizes=tuple(sizes),
                  retries=a.num_alloc_retries)


def steady_state(records, start: int, conf: AllocConf | str | None = None, capacity: int | None = None,
                 end: int | None = None, lazy=None, lazy_at: int | None = None, until: int | None = None):
    """`replay`'s allocator run: (Allocator, {id(record): its block's address} of the records allocated at the
    end, the event of the second pass at which allocated first reached its maximum). until: stop the second pass
    after its event `until` (the state a snapshot taken there would show)."""
    a = Allocator(conf if isinstance(conf, AllocConf) else parse_alloc_conf(conf), capacity=capacity)
    handles: dict[int, int] = {}
    deferred = [r for r in records if r.nbytes and r.birth < start and lazy_at is not None and lazy(r)]
    skip = {id(r) for r in deferred}
    for at, born, r in _events(records, 0, end):  # setup, then step 1
        cancel.check()
        if deferred and at >= lazy_at:
            for d in deferred:
                handles[id(d)] = a.malloc(d.nbytes, getattr(d, "stream", 0))
            deferred = []
        if id(r) in skip and r.birth == at and born:
            continue  # made at lazy_at
        if born:
            handles[id(r)] = a.malloc(r.nbytes, getattr(r, "stream", 0))
        elif id(r) in handles:
            a.free(handles.pop(id(r)))
    for d in deferred:  # a step without an optimizer phase (lazy_at past its events)
        handles[id(d)] = a.malloc(d.nbytes, getattr(d, "stream", 0))
    for r in records:  # what step 1 left alive is replaced by step 2's own
        if r.birth >= start and id(r) in handles:
            a.free(handles.pop(id(r)))
    a.reset_peak()
    peak_at, best = start, a.allocated
    for at, born, r in _events(records, start, end):
        cancel.check()
        if until is not None and at > until:
            break
        if born:
            handles[id(r)] = a.malloc(r.nbytes, getattr(r, "stream", 0))
            if a.allocated > best:
                peak_at, best = at, a.allocated
        elif r.birth >= start and id(r) in handles:  # a resident storage dies once, in step 1
            a.free(handles.pop(id(r)))
    return a, handles, peak_at


def least_capacity(records, start: int, conf: AllocConf | str | None = None, end: int | None = None, lazy=None,
                   lazy_at: int | None = None, unconstrained: Replay | None = None) -> int:
    """The least capacity (bytes the allocator may reserve: cudaMalloc fails beyond it) at which `replay` serves
    every request of the warm-up and the steady-state step: the step's memory requirement on a device, which
    reserved (what an unconstrained run caches) is not. When a cudaMalloc fails, malloc releases every free
    non-split cached segment (release_cached_blocks) and retries (CUDACachingAllocator.cpp malloc; the simulator's
    OOM path), so the cached blocks of freed tensors are given back; what it cannot give back is the slack inside
    segments that still hold a live block.

    Bisection over capacities between the allocated peak (reserved >= allocated: below it nothing is served) and
    the unconstrained run's reserved (served without a retry), in steps of 2 MiB, which is exact: every segment
    and expandable page is a multiple of 2 MiB (get_allocation_size: kSmallBuffer, kLargeBuffer, kRoundLarge), so
    a capacity acts as its 2 MiB floor. unconstrained: the replay without a capacity, when the caller has it.
    NB: takes "served" as monotone in the capacity (a larger one releases later, so the step's blocks land
    elsewhere); bench/studies/alloc_capacity.py checks it on a grid above the answer for every setup it runs."""
    from .caching_allocator import K_ROUND_LARGE, OutOfMemory

    if unconstrained is None:
        unconstrained = replay(records, start, conf, end=end, lazy=lazy, lazy_at=lazy_at)
    unit = K_ROUND_LARGE
    lo = (unconstrained.allocated - 1) // unit  # in units: a capacity below the allocated peak fails
    hi = unconstrained.reserved // unit  # served: the unconstrained run never reserves more
    while hi - lo > 1:
        cancel.check()
        mid = (lo + hi) // 2
        try:
            replay(records, start, conf, capacity=mid * unit, end=end, lazy=lazy, lazy_at=lazy_at)
            hi = mid
        except OutOfMemory:
            lo = mid
    return hi * unit
