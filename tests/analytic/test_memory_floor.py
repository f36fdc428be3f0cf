"""The planner caps a group's micro-batch without an engine call (plan/fit.py PeakOracle.micro_batch_room): each
pipeline stage's states (memory.stage_states_floors) plus b × (in_flight × saved + working) bytes
(memory.stage_saved_floors) must stay at or below that stage's own peak from the engine (memory.stage_memories), at
every micro-batch and accumulation, or the planner would reject a setup that fits. Checked against the engine over
Megatron-Core layouts of dense, MoE (with and without dense first layers and MTP), attention-sink and low-precision
models; and the floor must bite: near the engine's activations where nothing is recomputed. Fast (no torch)."""
from __future__ import annotations

import itertools

import pytest

from trainfit.analytic.memory import stage_memories, stage_saved_floors, stage_states_floors
from trainfit.analytic.params import count_params
from trainfit.api import load_spec
from trainfit.errors import SetupError
from trainfit.models.hf_config import for_setup
from trainfit.plan.fit import stage_in_flight
from trainfit.plan.search import planned_setup

SEQ = 4096
LAYOUTS = [dict(), dict(tp=2, sequence_parallel=True), dict(pp=2, pp_split="embedding-loss"),
           dict(pp=4, vpp=2, pp_split="embedding-loss"), dict(cp=2), dict(tp=4, sequence_parallel=True, pp=2,
                                                                         pp_split="embedding-loss")]
POLICIES = [dict(recompute="none"), dict(recompute="selective"), dict(recompute="full"), dict(recompute="uniform:2"),
            dict(recompute="selective", recompute_modules="moe_act"),
            dict(recompute="selective", recompute_modules="layernorm,mlp")]
SPLITS = [(1, 1), (2, 1), (1, 3), (3, 8), (2, 9)]


def _model(name: str):
    spec = load_spec(name)
    spec = for_setup(spec, planned_setup(spec, seq=SEQ))
    return spec, count_params(spec)


def _floors_and_peaks(name: str, extra: dict):
    spec, pc = _model(name)
    for lay, policy, zero in itertools.product(LAYOUTS, POLICIES, (1, 3)):
        try:
            setup = planned_setup(spec, seq=SEQ, stack="megatron", dp=8, zero=zero, **lay, **policy, **extra)
        except SetupError:  # (a module set the model has nothing for, a layout the model cannot take)
            continue
        for b, accum in SPLITS:
            x = setup.with_micro_batches(b, accum)
            try:
                peaks = [m.peak for m in stage_memories(spec, x, pc)]
            except SetupError:  # (a pipeline split the model's layers cannot take)
                break
            for states, (rank, saved, working), peak in zip(stage_states_floors(spec, x, pc),
                                                            stage_saved_floors(spec, x, pc), peaks):
                floor = states + b * (stage_in_flight(x.pp, rank, x.vpp, accum) * saved + working)
                yield x, rank, floor, states, peak


@pytest.mark.parametrize("name, extra", [
    ("llama-3.1-8b", {}),
    ("llama-3.1-8b", {"low_precision": "delayed"}),
    ("qwen3-30b-a3b", {"ep": 8}),
    ("qwen3-30b-a3b", {"ep": 4, "moe_force_balance": True}),
    ("deepseek-v3", {"ep": 8}),  # MLA, three dense first layers, an MTP layer on the last stage
    ("gpt-oss-120b", {"ep": 8}),  # attention sinks, sliding windows
])
def test_the_floor_stays_below_each_stages_peak(name, extra):
    n = 0
    for x, rank, floor, _, peak in _floors_and_peaks(name, extra):
        n += 1
        assert floor <= peak, (name, x.tp, x.pp, x.vpp, x.cp, x.recompute, x.recompute_modules, x.batch,
                               x.grad_accum, rank, floor, peak)
    assert n >= 100  # (the layouts and policies the model takes)


def test_the_floor_bites_where_nothing_is_recomputed():
    """Without recomputation the stored layers are most of a stage's activations: the floor reaches at least half of
    the engine's bytes above the states on every stage (so the cap rejects what cannot fit, not only the absurd)."""
    shares = [(floor - states) / (peak - states)
              for x, _, floor, states, peak in _floors_and_peaks("qwen3-30b-a3b", {"ep": 8})
              if x.recompute == "none"]
    assert len(shares) >= 20 and min(shares) > 0.5, min(shares)


def test_the_saved_bytes_read_no_zero_stage():
    """The planner shares a layout's saved bytes over its ZeRO stages (plan/search.py micro_batch_room's key)."""
    spec, pc = _model("deepseek-v3")
    for policy in POLICIES[:3]:
        seen = {stage_saved_floors(spec, planned_setup(spec, seq=SEQ, stack="megatron", dp=8, ep=8, zero=z,
                                                       **policy).with_micro_batches(2, 4), pc) for z in (0, 1, 2, 3)}
        assert len(seen) == 1, (policy, seen)
