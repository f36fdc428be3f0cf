"""The search's throughput bounds (analytic/step_time.py step_floor), memoised for one search.

step_floor times one micro-batch of a setup: its compute (the op lists, compute_time.cached_stage_compute, keyed with
--zero fixed: compute_time.NOT_IN_OP_LISTS), its critical-path communication (step_time.micro_batch_comm: the TP, PP,
CP and EP exchanges, which read the layout, the micro-batch and the stack's switches, never the ZeRO stage: the
ZeRO stage's collectives are the DP exchange's, parallel/zero.py dp_comm, which the bound leaves out), the pipeline
bubble and the stragglers' wait. Where a ZeRO stage changes what the compute reads, it does so through the state
bytes (FSDP2's mixed precision: precision.fsdp2_mixed_precision), which the key holds; the DP exchange alone reads
--overlap-param-gather, which the planner turns on with ZeRO (search.plan_switches). So the groups of one layout
that differ only in --zero share their bounds: Megatron's four ZeRO stages cost one bound per (micro-batch,
accumulation) instead of four (tests/plan/test_floors.py).
"""
from __future__ import annotations

from ..analytic.ops import WHOLE_LAYER
from ..analytic.params import ParamCounts
from ..analytic.precision import StateBytes
from ..analytic.step_time import layer_floors, step_floor
from ..hardware import GPU
from ..setup import Setup
from ..spec import ModelSpec


# The settings only the DP exchange reads (parallel/zero.py dp_comm), which the bound leaves out, at fixed values
DP_ONLY = (("zero", 0), ("overlap_param_gather", False))
# The recompute policy at its cheapest: nothing re-run. step_floor's lists are the same under every policy (compute_time
# keys them without it), and a policy only adds to its terms: the re-run forward (its recompute list), the TP and CP
# collectives that re-run with it (forward_rerun_share), the stragglers' share of both and the bubble that grows with
# them (tests/plan/test_floors.py)
NO_RECOMPUTE = (("recompute", "none"), ("recompute_modules", None))


class Floors:
    """step_floor(spec, setup, gpu, pc, st) of one search (its model, GPU and parameter counts fixed), memoised on
    the setup with DP_ONLY's settings fixed and the state bytes `st`: every other setting is in the key (the setup's
    own equality: all its fields), so the ones left out are those no term of the bound reads (module docstring)."""

    def __init__(self, spec: ModelSpec, gpu: GPU, pc: ParamCounts, efficiency: float | None = None):
        self.spec, self.gpu, self.pc, self.efficiency = spec, gpu, pc, efficiency  # (--efficiency: the flat override)
        self._memo: dict[tuple[Setup, StateBytes, bool], float] = {}
        self._layers: dict[tuple[Setup, StateBytes], float | None] = {}
        self._splits: dict[tuple, dict] = {}

    def __call__(self, setup: Setup, st: StateBytes, exchanges: bool = True, fixed: tuple = DP_ONLY) -> float:
        key = (setup.keyed(fixed), st, exchanges)
        got = self._memo.get(key)
        if got is None:  # (under NO_RECOMPUTE: the floor of `setup` with nothing re-run)
            run = setup.keyed(NO_RECOMPUTE) if fixed is not DP_ONLY else setup
            got = self._memo[key] = step_floor(self.spec, run, self.gpu, self.pc, st, exchanges, self.efficiency)
        return got

    def without_exchanges(self, setup: Setup, st: StateBytes) -> float:
        """step_floor without the expert exchanges (its `exchanges`): a floor of every setup that differs from
        `setup` only in the TIMED settings (plan/space.py: the dispatcher, --overlap-moe-comm), which only those
        exchanges read (the search passes a group's default assignment); memoised as __call__ is."""
        return self(setup, st, exchanges=False)

    def below_every_policy(self, setup: Setup, st: StateBytes) -> float:
        """step_floor without the expert exchanges and without recomputation (NO_RECOMPUTE): a floor of every setup
        that differs from `setup` only in its recompute policy and modules, the TIMED settings or the ZeRO stage:
        one bound per micro-batch for a layout's selective groups (each module set's), which the search refines only
        for the entries it takes (plan/search.py _time_best_first); memoised as __call__ is."""
        return self(setup, st, exchanges=False, fixed=DP_ONLY + NO_RECOMPUTE)

    def of_layers(self, setup: Setup, st: StateBytes) -> float | None:
        """step_time.layer_floor: below every floor above of the setups that differ from `setup` only in their
        recompute policy and modules, the TIMED settings or the ZeRO stage, from one layer's and the ends' op lists
        and one layer's TP collectives, whatever the pipeline (the stage's own lists are not built), memoised as
        __call__ is; None under --efficiency (the flat override) or where layer_floor has none. The search's first
        bound of every split (plan/search.py _time_best_first refines it to below_every_policy's and on)."""
        if self.efficiency is not None:
            return None
        key = (setup.keyed(DP_ONLY + NO_RECOMPUTE), st)
        got = self._layers.get(key, False)
        if got is False:
            got = self._layers[key] = layer_floors(self.spec, (setup,), self.gpu, self.pc, st)[0]
        return got

    def of_splits(self, setup: Setup, st: StateBytes, splits,
                  rerun: bool = False) -> list[tuple[float, int, int, bool]]:
        """(negated tokens_bound, micro-batch, accumulation, whether of_layers gave it) of each (micro-batch,
        accumulation) split of `setup` (a group's, at any micro-batch): of_layers' floor, or below_every_policy's
        where it has none — a bound of every group of the layout (its recompute policies and modules, ZeRO stages,
        TIMED assignments), memoised for all of them. With `rerun` and a policy that re-runs whole layers
        (ops.WHOLE_LAYER), the floors add its re-run (step_time.layer_floors): a bound of the groups of that policy
        alone, memoised for them."""
        whole = rerun and setup.recompute_policy in WHOLE_LAYER
        fixed = DP_ONLY + (() if whole else NO_RECOMPUTE) + (("batch", 1), ("grad_accum", 1))
        key = (setup.keyed(fixed), st)
        known = self._splits.get(key)
        if known is None:
            known = self._splits[key] = {}  # (b, accum) -> its entry, as the layout's groups ask for them
        missing = [setup.with_micro_batches(b, accum) for b, accum in dict.fromkeys(splits) if (b, accum) not in known]
        if missing:
            # (step_time.layer_floors: the splits' floors from one layer's lists, what no split changes worked out once)
            floors = layer_floors(self.spec, missing, self.gpu, self.pc, st, whole) if self.efficiency is None \
                else [None] * len(missing)
            for x, floor in zip(missing, floors):
                if floor is None:
                    known[(x.batch, x.grad_accum)] = (-tokens_bound(x, self.below_every_policy(x, st)), x.batch,
                                                      x.grad_accum, False)
                else:
                    known[(x.batch, x.grad_accum)] = (-tokens_bound(x, floor), x.batch, x.grad_accum, True)
        return [known[split] for split in splits]


def tokens_bound(setup: Setup, floor: float) -> float:
    """The most tokens/s `setup` could reach with a step of at least `floor` seconds (inf for a floor of 0). NB: a
    relative margin of 1e-9 above it covers its rounding (summed apart from step_time's terms); under --ulysses the
    tokens are dp / ulysses sequences: it over-counts (still a bound)."""
    tokens = setup.batch * setup.seq * setup.grad_accum * setup.dp
    return tokens / floor * (1 + 1e-9) if floor > 0 else float("inf")
