"""A large search's layouts shared over worker processes: each searches every n-th layout (its share) exactly as the
one-process search does (search.Space), times its own fitting setups best first and returns the groups it timed;
this process merges them. The plans are the same: a group lives in one share (its key holds its layout), and a share
skips a setup only where its bound cannot reach the --top fastest groups of that share or of any share done so far
(a threshold the workers share), which the whole search's --top can only raise (_time_best_first's rule; the plain
pass offloads nothing, so no spares are kept for the host-memory verdict); the ranking reads only the setups (its
rank has no search order in it). tests/plan/test_parallel_search.py checks it against one process.

Python's threads share one interpreter lock, so the work runs in processes, forked: a forkserver or spawned worker
imports the caller's main module again, which a script without a `__main__` guard would run again. A fork copies
only the calling thread, so it is used where this process runs no other thread (the CLI, a script), on Linux (macOS
defaults to spawn: its system libraries are not fork-safe); elsewhere, and for a search too small to repay the
workers' start (~0.1 s here), the search runs in this process. Each worker builds its own memos."""
from __future__ import annotations

import multiprocessing
import sys
import threading
from collections.abc import Callable

from .gc_paused import gc_paused

# The fewest groups (search.Space.groups) a parallel search is started for: each costs ~1-3 ms (its memory judged,
# its splits bounded), so below this the whole search takes under about a second
MIN_GROUPS = 1000
# Shares per worker: more, smaller shares even out the layouts' unequal costs (a share's own best-first timing is
# the price of each: tens of setups)
SHARES_PER_WORKER = 2


def searched_in_parallel(space, best: dict, workers: int, progress: Callable[[int, int], None] | None = None) -> bool:
    """The plain pass of `space`'s search (every layout, no memory knobs) run over `workers` processes, its timed
    groups merged into `best` and its counts into space.stats; False (nothing done) where one process is asked for
    or the search is too small (MIN_GROUPS), and where this process cannot fork safely (forkable)."""
    if workers <= 1 or not forkable() or space.groups() < MIN_GROUPS:
        return False
    n = workers * SHARES_PER_WORKER
    ctx = multiprocessing.get_context("fork")
    space.stats["workers"] = workers
    started = ctx.Value("i", 0)  # layouts the workers have started (the progress bar's count)
    # the highest tokens/s some share's POOL x --top fastest groups all reach: every share skips what is below it
    # (search._time_best_first `shared`). Unlocked: a write lost to a race leaves a lower value, which is still one
    threshold = ctx.RawValue("d", 0.0)
    with ctx.Pool(workers, initializer=_count_into, initargs=(started, threshold)) as pool:
        pending = pool.map_async(_share, [(space.spec, space.gpu, space.q, k, n) for k in range(n)])
        while not pending.ready():
            pending.wait(PROGRESS_SECONDS)
            if progress is not None:
                progress(min(started.value, len(space.lays)), len(space.lays))
        for got, stats, calls in pending.get():
            best.update(got)
            _merge(space.stats, stats)
            space.oracle.calls += calls
    return True


PROGRESS_SECONDS = 0.25  # how often the caller's progress hears the workers' count
_started = None  # in a worker: the shared count of layouts started (_count_into)
_threshold = None  # in a worker: the shares' shared threshold (searched_in_parallel)


def _count_into(counter, threshold) -> None:
    """A worker's initializer: the shared count its layouts add to, and the shares' threshold."""
    global _started, _threshold
    _started, _threshold = counter, threshold


def _one_started(i: int, n: int) -> None:
    """search_layouts' progress in a worker: one more layout started."""
    if _started is not None:
        with _started.get_lock():
            _started.value += 1


def forkable() -> bool:
    """Linux, with no thread but this one running (a fork copies the calling thread only: a lock another thread
    held would stay held in the child)."""
    return sys.platform == "linux" and threading.active_count() == 1


@gc_paused
def _share(args: tuple) -> tuple[dict, dict, int]:
    """One worker's share (k of n): its layouts searched and timed best first; (its timed groups, its counts, its
    engine calls)."""
    from .search import Space

    spec, gpu, q, k, n = args
    space = Space(spec, gpu, q)
    space.search_layouts(progress=_one_started, share=(k, n))
    best: dict = {}
    # (no spares: the plain pass a share searches offloads nothing, the memory knobs' levels coming after it, so no
    # share holds a plan the host-memory verdict could reject)
    space.time_best_first(best, spares=False, shared=_threshold)
    return best, space.stats, space.oracle.calls


def _merge(into: dict, stats: dict) -> None:
    """A share's counts added to the search's: the numbers summed (the layouts are the whole search's in each),
    each stack's groups summed and the values its searched settings took joined."""
    for key, v in stats.items():
        if key == "stacks":
            for stack, d in v.items():
                mine = into["stacks"][stack]
                mine["groups"] += d["groups"]
                for axis, values in d["axes"].items():
                    mine["axes"].setdefault(axis, set()).update(values)
        elif key == "not_modelled_why":  # (the first reason a share found: search._not_modelled)
            into.setdefault(key, v)
        elif key != "layouts" and isinstance(v, (int, float)):
            into[key] = into.get(key, 0) + v
