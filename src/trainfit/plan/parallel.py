"""A large search's layouts shared over worker processes, one share each: a share searches the layouts of the shape
families it claims (Families) exactly as the one-process search does (search.Space), times its own fitting setups
best first and returns the groups it timed; this process merges them. The plans are the same: a group lives in one
share (its key holds its layout), and a share skips a setup only where its bound cannot reach the --top fastest of
the groups all shares have timed so far (Threshold), which the whole search's --top can only raise
(_time_best_first's rule; the plain pass offloads nothing, so no spares are kept for the host-memory verdict); the
ranking reads only the setups (its rank has no search order in it). tests/plan/test_parallel_search.py checks it
against one process.

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


def searched_in_parallel(space, best: dict, workers: int, progress: Callable[[int, int], None] | None = None) -> bool:
    """The plain pass of `space`'s search (every layout, no memory knobs) run over `workers` processes, its timed
    groups merged into `best` and its counts into space.stats; False (nothing done) where one process is asked for
    or the search is too small (MIN_GROUPS), and where this process cannot fork safely (forkable)."""
    if workers <= 1 or not forkable() or space.groups() < MIN_GROUPS:
        return False
    ctx = multiprocessing.get_context("fork")
    space.stats["workers"] = workers
    started = ctx.Value("i", 0)  # layouts the workers have started (the progress bar's count)
    threshold = Threshold(ctx, workers, space.q.top)
    # the shape families, most layouts first (the longest jobs first evens out the workers' ends), claimed one at a
    # time by whichever share is free
    members = space.family_members()
    families = Families(ctx, sorted(range(len(members)), key=lambda f: -len(members[f])))
    with ctx.Pool(workers, initializer=_count_into, initargs=(started, threshold, families)) as pool:
        pending = pool.map_async(_share, [(space.spec, space.gpu, space.q, k) for k in range(workers)])
        while not pending.ready():
            pending.wait(PROGRESS_SECONDS)
            if progress is not None:
                progress(min(started.value, len(space.lays)), len(space.lays))
        for got, stats, calls in pending.get():
            best.update(got)
            _merge(space.stats, stats)
            space.oracle.calls += calls
    return True


class Families:
    """The shape families (search.Space.family_members) in the order they are handed out, each to the first share
    that asks: a share takes the next whenever it has searched its last, so the workers end together whatever each
    family costs (a share's own best-first timing over all its families is the price of one share per worker)."""

    def __init__(self, ctx, order: list[int]):
        self.order, self._next = order, ctx.Value("i", 0)

    def claimed(self):
        """The families this share takes, one at a time until none is left."""
        while True:
            with self._next.get_lock():
                i = self._next.value
                self._next.value = i + 1
            if i >= len(self.order):
                return
            yield self.order[i]


class Threshold:
    """The tokens/s below which no setup can enter the whole search's `size` (--top) fastest groups, as the shares
    find them (search._time_best_first `shared`): the size-th fastest of the groups every share has timed so far,
    each share's `size` fastest kept in its own slots (a group lives in one share: its key holds its layout, so the
    slots never hold one group twice). It only rises: each share's fastest only get faster. Its writes are locked
    (a share rewrites its slots in several steps); its reads are one double, unlocked: a value read before a write is
    a lower one, still a threshold."""

    def __init__(self, ctx, shares: int, size: int):
        self.size, self._slots, self._value = size, ctx.Array("d", shares * size), ctx.RawValue("d", 0.0)
        self.share = 0  # (a worker's share, set by _share before its search)

    @property
    def value(self) -> float:
        return self._value.value

    def publish(self, fastest) -> None:
        """This share's fastest groups' tokens/s so far (at most `size`): the threshold raised where they do."""
        mine = sorted(fastest, reverse=True)[: self.size]
        with self._slots.get_lock():
            at = self.share * self.size
            self._slots[at:at + self.size] = mine + [0.0] * (self.size - len(mine))
            kth = sorted(self._slots[:], reverse=True)[self.size - 1]
            if kth > self._value.value:
                self._value.value = kth


PROGRESS_SECONDS = 0.25  # how often the caller's progress hears the workers' count
_started = None  # in a worker: the shared count of layouts started (_count_into)
_threshold = None  # in a worker: the shares' shared threshold (searched_in_parallel)
_families = None  # in a worker: the shape families the shares claim (Families)


def _count_into(counter, threshold, families) -> None:
    """A worker's initializer: the shared count its layouts add to, the shares' threshold and their families."""
    global _started, _threshold, _families
    _started, _threshold, _families = counter, threshold, families


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
    """The k-th share: the layouts of the families it claims searched and timed best first; (its timed groups, its
    counts, its engine calls)."""
    from .search import Space

    spec, gpu, q, k = args
    _threshold.share = k
    space = Space(spec, gpu, q)
    space.search_layouts(progress=_one_started, families=_families.claimed())
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
