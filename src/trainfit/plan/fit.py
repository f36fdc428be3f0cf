"""The largest micro-batch that fits, with as few calls to the analytic engine as possible.

For a fixed layout, ZeRO stage, recompute policy and precision, every term of the engine's per-phase memory is
affine in the micro-batch b (activations, logits and backward temporaries scale with b·s tokens; states do not),
and the peak is the maximum of those phases and of the pipeline stages — so peak(b) is convex, piecewise affine
and non-decreasing (tests/plan/test_fit.py checks this against the engine). Hence the secant through b = 1, 2
under-estimates peak(b) for b ≥ 2, its crossing with the capacity bounds the answer from above, and one more
call usually confirms it; a binary search covers the rest. Every number is the engine's own
(`analytic.memory.train_memory`), so `trainfit estimate` with the chosen setup gives the same peak.
"""
from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

from ..analytic.fit_rule import capacity, required
from ..analytic.memory import memory_key, stage_memories, stage_saved_floors, stage_states_floors, train_memory
from ..analytic.parallel.pipeline import in_flight
from ..analytic.params import ParamCounts
from ..setup import Setup
from ..spec import ModelSpec


class PeakOracle:
    """peak(setup with batch b), memoised; counts engine calls."""

    def __init__(self, spec: ModelSpec, pc: ParamCounts):
        self.spec, self.pc = spec, pc
        self.calls = 0
        self._memo: dict[Setup, int] = {}
        self._above: dict[Setup, int] = {}  # a stage's peak above the capacity asked: a lower bound of required
        self._capacity: dict[tuple, int] = {}
        # micro_batch_room's stage states, of the groups that differ only in their recompute (rank_states' STATES_FIXED)
        self._stage_states: dict[tuple, tuple] = {}
        self._saved: dict[tuple, tuple] = {}  # micro_batch_room's, of the groups that differ only in their ZeRO stage

    def peak(self, setup: Setup) -> int:
        """What the step's tensors need from the caching allocator: the fit rule's bytes (analytic/fit_rule.py
        required; convex in b like the peak: the pinned block is the largest of blocks that scale with b·s tokens
        or not at all, the segment slack does not depend on b)."""
        key = memory_key(setup)  # (the settings memory never reads: the setups that differ only in them share it)
        got = self._memo.get(key)
        if got is None:
            self.calls += 1
            got = self._memo[key] = required(self.spec, setup, train_memory(self.spec, setup, self.pc), self.pc)
        return got

    def fits(self, setup: Setup, capacity: int) -> bool:
        """peak(setup) <= capacity, its stages computed first to last until one's peak is above the capacity
        (required >= the peak of the step's every stage: fit_rule.required adds bytes >= 0 to the largest), so a
        setup that does not fit usually costs one stage, not all; the answer is peak's."""
        key = memory_key(setup)
        got = self._memo.get(key)
        if got is not None:
            return got <= capacity
        if self._above.get(key, capacity) > capacity:
            return False
        self.calls += 1
        stages = []
        for m in stage_memories(self.spec, setup, self.pc):
            if m.peak > capacity:
                self._above[key] = m.peak
                return False
            stages.append(m)
        got = self._memo[key] = required(self.spec, setup, max(stages, key=lambda m: m.peak), self.pc)
        return got <= capacity

    def capacity(self, gpu, setup: Setup, reserve: int, key: tuple) -> int:
        """fit_rule.capacity (the GPU less --reserve and the setup's fixed overheads), memoised on the caller's `key`
        for the setups that differ only in their recompute policy and modules, which no overhead reads (the
        context, the cuBLAS workspace, the communicators: overheads.fixed_bytes). Not on memory_key: a dispatcher's
        own buffers (overheads.OWN_BUFFERS) are overheads the memory never reads; the search judges those setups
        again at their own capacity before it times them (plan/search.py _time_best_first)."""
        key = (gpu, key, reserve)
        got = self._capacity.get(key)
        if got is None:
            got = self._capacity[key] = capacity(gpu, setup, reserve, self.spec)
        return got

    def micro_batch_room(self, setup: Setup, capacity: int, states_key: tuple, saved_key: tuple) -> "Room":
        """The room each pipeline stage's states leave under the capacity for its saved bytes (memory.
        stage_states_floors, stage_saved_floors, memoised on the caller's names for the setups that share them: the
        states read no recompute policy, the saved bytes no ZeRO stage). No engine call."""
        states = self._stage_states.get(states_key)
        if states is None:
            states = self._stage_states[states_key] = stage_states_floors(self.spec, setup, self.pc)
        saved = self._saved.get(saved_key)
        if saved is None:
            saved = self._saved[saved_key] = stage_saved_floors(self.spec, setup, self.pc)
        return Room(tuple((capacity - st, *sv) for st, sv in zip(states, saved)))

    def batch_bounds(self, base: Setup, capacity: int, limit: int) -> tuple[int, int]:
        """(lo, hi): the largest b in [0, limit] with peak(base with batch=b) <= capacity lies in [lo, hi], b = lo
        known to fit (0: not even b = 1 fits, and hi = 0) — from at most two engine calls: b = 1, b = 2 and the secant
        through them, which under-estimates the convex peak beyond (module docstring). The search's `limit` is its
        room's (micro_batch_room: none where the states alone outgrow the capacity, without an engine call)."""
        if limit < 1:
            return 0, 0
        one = base.with_micro_batches(1)
        if not self.fits(one, capacity):
            return 0, 0
        if limit == 1:
            return 1, 1
        two = base.with_micro_batches(2)
        if not self.fits(two, capacity):
            return 1, 1
        slope = self.peak(two) - self.peak(one)
        hi = limit if slope <= 0 else min(limit, 2 + int((capacity - self.peak(two)) // slope))
        return (2, 2) if hi <= 2 else (2, hi)

    def largest_batch(self, base: Setup, capacity: int, limit: int) -> int:
        """Largest b in [0, limit] with peak(base with batch=b) <= capacity (0: not even b = 1 fits)."""
        lo, hi = self.batch_bounds(base, capacity, limit)
        if lo == hi or self.fits(base.with_micro_batches(hi), capacity):
            return hi
        while hi - lo > 1:  # lo fits, hi does not
            mid = (lo + hi) // 2
            if self.fits(base.with_micro_batches(mid), capacity):
                lo = mid
            else:
                hi = mid
        return lo


class Room(NamedTuple):
    """A split (b, m) needs at least b × (in_flight × saved + working) bytes beside each pipeline stage's states
    (memory.stage_saved_floors), in_flight the stage's micro-batches in flight at accumulation m (pipeline.in_flight:
    non-decreasing in m): above the capacity less those states (`free`) on any stage, it cannot fit. `stages`:
    (free, rank, saved, working) of each."""
    stages: tuple

    def largest(self, pp: int, vpp: int, accum: int, limit: int) -> int:
        """The largest micro-batch up to `limit` that may fit at accumulation `accum`, or at any accumulation
        above it (0: none)."""
        for free, rank, saved, working in self.stages:
            if free < 0:
                return 0
            per = stage_in_flight(pp, rank, vpp, accum) * saved + working
            if per > 0:
                limit = min(limit, int(free / per))
        return limit


@lru_cache(maxsize=65536)
def stage_in_flight(pp: int, rank: int, vpp: int, accum: int) -> float:
    """Stage `rank`'s micro-batches in flight at accumulation `accum` (pipeline.in_flight, as stages() counts them;
    one without a pipeline: no warm-up)."""
    return in_flight(pp, rank, vpp, accum)
