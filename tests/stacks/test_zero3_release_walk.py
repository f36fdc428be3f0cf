"""ZeRO-3's release (analytic/parallel/zero3_replay.py _Walk): the parameters a released module keeps, found by
bisection over the trace's element prefix sums, are those DeepSpeed's own walk keeps (deepspeed 0.19.8
runtime/zero/partitioned_param_coordinator.py:650-660, written out below as the loop it is, WalkedAhead), so the
replay's peak is the walk's; and a model deep enough for the walk to be quadratic (the reuse distance spans it) is
replayed at once."""
from __future__ import annotations

import dataclasses
import time

import pytest

from trainfit.analytic.params import count_params
from trainfit.analytic.parallel import zero3_replay
from trainfit.models.resolve import load_model


class WalkedAhead:
    """zero3_replay._Walk as DeepSpeed walks it: from the module after the released one, each module's parameters'
    elements added until they reach the reuse distance, every parameter met kept."""

    def __init__(self, order, numel, ahead):
        self.order, self.numel, self.ahead = order, numel, ahead

    def reused(self, p: int, s: int, reuse: int) -> bool:
        walked = 0
        for u in self.order[s + 1:]:
            if walked >= reuse:
                return False
            params = self.ahead(u)
            if p in params:
                return True
            walked += sum(self.numel[q] for q in params)
        return False


def walked_replay(monkeypatch, model, *knobs) -> int:
    """zero3_replay.replay with the release walked (WalkedAhead in place of the bisection)."""
    with monkeypatch.context() as m:
        m.setattr(zero3_replay, "_Walk", WalkedAhead)
        return zero3_replay.replay.__wrapped__(model, *knobs)


@pytest.mark.parametrize("name,layers,leaf", [("tiny-llama", 6, False), ("tiny-mixtral", 4, True),
                                              ("tiny-mixtral", 4, False), ("tiny-deepseek", 5, True),
                                              ("tiny-gpt-oss", 3, True)])
@pytest.mark.parametrize("recompute", [False, True])
@pytest.mark.parametrize("knobs", [(1000, 50_000, 10**9, 10**9), (0, 200_000, 600_000, 300_000),
                                   (5_000, 10**6, 2 * 10**6, 40_000), (0, 0, 10**9, 0)])
def test_bisection_keeps_what_the_walk_keeps(monkeypatch, name, layers, leaf, recompute, knobs):
    spec = dataclasses.replace(load_model(name), layers=layers)
    model = zero3_replay.hf_model(spec, count_params(spec), leaf)
    assert zero3_replay.replay(model, recompute, *knobs) == walked_replay(monkeypatch, model, recompute, *knobs) > 0


def test_a_deep_small_model_replays_in_linear_time():
    """tiny-llama at 2,000 layers: the default reuse distance (10**9 elements) spans the whole model, so the walk
    visited every later module for each release (110 s at 1,000 layers); by bisection a few seconds at most."""
    spec = dataclasses.replace(load_model("tiny-llama"), layers=2000)
    model = zero3_replay.hf_model(spec, count_params(spec), False)
    t0 = time.process_time()
    zero3_replay.replay(model, True, 1000, 50_000_000, 10**9, 10**9)
    assert time.process_time() - t0 < 20  # (the walk: ~440 s; NB a bound on work, not a speed target)


def test_deeper_than_the_replay_takes_is_refused_in_one_line():
    """10**9 layers under ZeRO-3 built one module a layer (a MemoryError traceback after ~38 s): refused at once,
    naming the bound; the deepest catalog models replay as before."""
    from trainfit.analytic.engine import estimate
    from trainfit.errors import SetupError
    from trainfit.setup import Setup

    setup = Setup(device="cuda", stack="deepspeed", zero=3, dp=8, precision="bf16-master")
    deep = dataclasses.replace(load_model("tiny-llama"), layers=10**9)
    t0 = time.process_time()
    with pytest.raises(SetupError, match="up to 10,000 layers"):
        estimate(deep, setup)
    assert time.process_time() - t0 < 5
    assert estimate(load_model("deepseek-v3"), setup.with_(dp=64)).memory.peak > 0
