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

from ..analytic.fit_rule import capacity, required
from ..analytic.memory import memory_key, states_floor, train_memory
from ..analytic.params import ParamCounts
from ..setup import Setup
from ..spec import ModelSpec


class PeakOracle:
    """peak(setup with batch b), memoised; counts engine calls."""

    def __init__(self, spec: ModelSpec, pc: ParamCounts):
        self.spec, self.pc = spec, pc
        self.calls = 0
        self._memo: dict[Setup, int] = {}
        self._capacity: dict[tuple, int] = {}

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

    def capacity(self, gpu, setup: Setup, reserve: int) -> int:
        """fit_rule.capacity (the GPU less --reserve and the setup's fixed overheads), memoised on the memory's key:
        the overheads are memory, which the settings memory never reads do not change."""
        key = (gpu, memory_key(setup), reserve)
        got = self._capacity.get(key)
        if got is None:
            got = self._capacity[key] = capacity(gpu, setup, reserve)
        return got

    def largest_batch(self, base: Setup, capacity: int, limit: int) -> int:
        """Largest b in [0, limit] with peak(base with batch=b) <= capacity (0: not even b = 1 fits)."""
        if limit < 1:
            return 0
        one = base.with_micro_batches(1)
        # the states alone outgrow the capacity (memory.states_floor <= peak <= required): no engine call
        if states_floor(self.spec, one, self.pc) > capacity:
            return 0
        p1 = self.peak(one)
        if p1 > capacity:
            return 0
        if limit == 1:
            return 1
        p2 = self.peak(base.with_micro_batches(2))
        if p2 > capacity:
            return 1
        slope = p2 - p1
        hi = limit if slope <= 0 else min(limit, 2 + int((capacity - p2) // slope))
        if hi <= 2:
            return 2
        if self.peak(base.with_micro_batches(hi)) <= capacity:
            return hi
        lo = 2  # fits; hi does not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.peak(base.with_micro_batches(mid)) <= capacity:
                lo = mid
            else:
                hi = mid
        return lo
