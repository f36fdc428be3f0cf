"""A search shared over worker processes (plan/parallel.py) returns the plans one process returns: the same setups
at the same step times, the same space searched (configurations, groups, fits, the values each setting took). The
engine calls differ: a split above its group's known fit is settled only where a share's own search takes it
(search._Unsettled). The size threshold is lowered so that small searches take the parallel path; each test checks it did."""
from __future__ import annotations

import pytest

from trainfit.api import load_spec
from trainfit.hardware import get_gpu
from trainfit.plan import parallel
from trainfit.plan.search import PlanQuery, search

SAME = ("searched", "groups", "batch_unreachable", "layouts", "stacks")


@pytest.mark.parametrize("model, gpu, gpus, seq, tokens, stacks", [
    ("llama-3.1-8b", "A100-40GB", 8, 4096, 1e6, ("hf", "megatron")),  # two stacks, ZeRO stages, pipelines
    ("qwen3-30b-a3b", "H100-80GB", 8, 4096, 2**19, ("megatron",)),  # experts: the dispatchers timed in each group
])
def test_parallel_search_returns_the_same_plans(monkeypatch, model, gpu, gpus, seq, tokens, stacks):
    if not parallel.forkable():
        pytest.skip("this process cannot fork safely (not Linux, or other threads running)")
    monkeypatch.setattr(parallel, "MIN_GROUPS", 0)
    spec, g = load_spec(model), get_gpu(gpu)
    q = PlanQuery(gpus=gpus, seq=seq, global_batch_tokens=tokens, stacks=stacks)
    one, two = search(spec, g, q, workers=1), search(spec, g, q, workers=2)
    assert "workers" not in one.stats and two.stats["workers"] == 2  # (the parallel path ran)
    assert [c.setup for c in two.candidates] == [c.setup for c in one.candidates]
    assert [c.time for c in two.candidates] == [c.time for c in one.candidates]
    assert {k: two.stats[k] for k in SAME} == {k: one.stats[k] for k in SAME}


def test_small_searches_stay_in_this_process():
    spec, g = load_spec("llama-3.1-8b"), get_gpu("A100-40GB")
    r = search(spec, g, PlanQuery(gpus=8, seq=4096, global_batch_tokens=1e6), workers=2)
    assert r.stats["groups"] < parallel.MIN_GROUPS and "workers" not in r.stats


def test_threshold_is_the_sizeth_fastest_of_all_shares_groups():
    import multiprocessing
    ctx = multiprocessing.get_context("fork")
    t = parallel.Threshold(ctx, 2, 3)  # two shares, --top 3
    t.share = 0
    t.publish([10.0, 9.0])
    assert t.value == 0.0  # two groups timed in all: no third yet
    t.share = 1
    t.publish([8.0, 7.0])
    assert t.value == 8.0  # 10, 9, 8 over both shares (each share's own third: none, none)
    t.publish([12.0, 8.0, 7.0])  # share 1's fastest grew: its slots rewritten, not added to (12, 10, 9)
    assert t.value == 9.0
    t.share = 0
    t.publish([11.0, 10.0, 9.0])
    assert t.value == 10.0  # 12, 11, 10
    t.publish([11.0])  # (12, 11, 8: a share's fastest never shrink; read so, the threshold would not fall)
    assert t.value == 10.0


def test_each_family_is_claimed_once():
    import multiprocessing
    fams = parallel.Families(multiprocessing.get_context("fork"), [3, 1, 2, 0])
    a, b = fams.claimed(), fams.claimed()
    got = [next(a), next(b), next(a)] + list(b) + list(a)
    assert got == [3, 1, 2, 0]
