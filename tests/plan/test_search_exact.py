"""The search's shortcuts change no answer: the op lists' memo keyed on what the lists read (compute_time:
NOT_IN_OP_LISTS, one layer's lists shared by every recompute policy) and the exact throughput bound (step_time.step_floor,
search._time_best_first) give the same plans, with the same step times, as the straightforward search — every fitting
setup timed, every op list built and timed afresh (compute_time.stage_compute itself, no memo), every group's setup
built from its Request (search.planned_setup, not the search's template: search.group_setup)."""
from __future__ import annotations

import pytest

from trainfit.analytic import compute_time, step_time
from trainfit.analytic.precision import state_bytes
from trainfit.api import load_spec
from trainfit.hardware import get_gpu
from trainfit.plan import floors as floors_mod, search as search_mod
from trainfit.plan.search import PlanQuery, search


def _answer(r) -> list[tuple]:
    return [(c.setup, c.time.step_seconds, c.time.tokens_per_second, c.estimate.memory.peak) for c in r.candidates]


def _straightforward(monkeypatch, spec, gpu, q):
    """Every fitting setup timed (a bound of 0 s: nothing skipped), every stage's lists timed afresh; and for each,
    the bound the search uses (step_time.step_floor) checked against its step: never above it."""
    timed, bounds = [], []

    def checked(spec, setup, gpu, efficiency, pc):
        tm = step_time.layout_step_time(spec, setup, gpu, efficiency, pc)
        floor = step_time.step_floor(spec, setup, gpu, pc, efficiency=efficiency)
        assert floor <= tm.step_seconds * (1 + 1e-12)
        # and the first bound of every split, from the layers alone (Floors.of_layers), below that floor
        layers = step_time.layer_floor(spec, setup, gpu, pc, state_bytes(setup)) if efficiency is None else None
        assert layers is None or layers <= floor * (1 + 1e-12)
        # with its policy's re-run where it re-runs whole layers (a whole-layer group's first bound), still below
        again = step_time.layer_floors(spec, (setup,), gpu, pc, state_bytes(setup), rerun=True)[0] \
            if efficiency is None else None
        assert again is None or layers <= again <= floor * (1 + 1e-12)
        bounds.append(layers)
        timed.append(tm.step_seconds)
        return tm

    with monkeypatch.context() as m:
        m.setattr(step_time, "cached_stage_compute",
                  lambda spec, setup, gpu, st, pc, layers: compute_time.stage_compute(spec, setup, gpu, st, pc, layers))
        m.setattr(floors_mod, "step_floor", lambda *a, **k: 0.0)  # (the search's bounds: plan/floors.py)
        m.setattr(floors_mod, "layer_floors", lambda spec, setups, *a, **k: [0.0] * len(setups))
        # each group's setup built from its Request, as `trainfit estimate` builds it (not from the search's template)
        m.setattr(search_mod, "group_setup", search_mod.planned_setup)
        m.setattr(search_mod, "_layout_base", lambda *a, **k: None)  # (each group from its Request, not its layout's)
        m.setattr(search_mod, "layout_step_time", checked)
        compute_time.clear_memos()
        r = search(spec, gpu, q)
    assert len(timed) == r.stats["timed"] > 0
    assert q.efficiency is not None or any(bounds)  # (the layers' bound was checked)
    return r


# Both ways a search judges its groups' memory (search.Space.judge_first): as each enters (a search too small to share
# over processes, these) and only when the bound reaches it (a large one's: the whole search's, here too)
JUDGING = ("judged first", "judged when taken")


def _check(monkeypatch, model, gpu, q, judging=JUDGING):
    """The search under each way of `judging` against one straightforward search (which judges every group)."""
    spec, g = load_spec(model), get_gpu(gpu)
    plain = _straightforward(monkeypatch, spec, g, q)
    assert plain.stats.get("bounded", 0) == 0
    expand = search_mod._Lazy.entries
    for how in judging:
        taken = []

        def entries(lazy, e, stats):
            """A layout entry's groups (search._layout_entry), none bounded above it: the order stays best first."""
            got = expand(lazy, e, stats)
            assert all(x.neg_bound >= e.neg_bound * (1 + 1e-12) for x in got), how
            taken.append(len(got))
            return got

        with monkeypatch.context() as m:
            if how == "judged when taken":
                m.setattr(search_mod, "MIN_GROUPS", 0)
            m.setattr(search_mod._Lazy, "entries", entries)
            compute_time.clear_memos()
            fast = search(spec, g, q)
        assert _answer(fast) == _answer(plain) and len(fast.candidates) == q.top, how
        # a search that judges its groups when taken enters each layout as one entry (with a global batch), its
        # groups built when taken
        assert bool(taken) or how == "judged first" or q.global_batch_tokens is None, how
        # the same space searched: only the timing is skipped, the groups of the layouts the bound never reaches
        # (their refusals are found when built) and the memory of the splits above a group's known fit that the
        # bound skips (search._Unsettled): those are bounded unsettled, fitting or not
        for k in ("searched", "groups"):
            assert fast.stats.get(k) == plain.stats.get(k), (how, k)
        assert fast.stats.get("stack_refused", 0) <= plain.stats.get("stack_refused", 0), how
        # the straightforward search judges every group's memory (but those of the layouts whose rooms rule out
        # every split, never built where the groups are judged when taken: search._layout_entry); the bounded one
        # those the search takes
        judged = fast.stats["memory_judged"]
        assert 0 < fast.stats["fits"] <= judged <= plain.stats["memory_judged"] <= plain.stats["groups"], how
        assert fast.stats["fits"] <= plain.stats["fits"], how
        assert fast.stats["engine_calls"] <= plain.stats["engine_calls"], how
        bounded, unsettled = fast.stats.get("bounded", 0), fast.stats.get("bounded_unsettled", 0)
        assert fast.stats["timed"] + bounded - unsettled <= plain.stats["timed"] <= fast.stats["timed"] + bounded, how
    return fast


def test_dense_model_over_the_four_stacks(monkeypatch):
    r = _check(monkeypatch, "llama-3.1-8b", "A100-40GB",
               PlanQuery(gpus=8, seq=4096, global_batch_tokens=1e6, stacks=("hf", "torchtitan", "megatron",
                                                                             "deepspeed")))
    assert r.stats.get("bounded", 0) > r.stats["timed"]  # the bound does skip most of them here


def test_moe_model_with_expert_layouts(monkeypatch):
    # tiny-mixtral on megatron: ep and etp searched, recompute none / selective / full share their layers' lists
    _check(monkeypatch, "tiny-mixtral", "H100-80GB",
           PlanQuery(gpus=4, seq=2048, global_batch_tokens=2**16, stacks=("megatron",)))


def test_flat_efficiency_override(monkeypatch):
    # --efficiency: the bound is the flat override's own (step_floor's efficiency), the dispatchers searched alike
    _check(monkeypatch, "tiny-mixtral", "H100-80GB",
           PlanQuery(gpus=4, seq=2048, global_batch_tokens=2**16, stacks=("megatron",), efficiency=0.4),
           judging=JUDGING[:1])


def test_no_global_batch(monkeypatch):
    _check(monkeypatch, "llama-3.1-70b", "H100-80GB", PlanQuery(gpus=64, seq=8192, top=3))


def _judged_when_taken(monkeypatch, model, gpu, q):
    """No global batch, Megatron's rooms capping the micro-batch (search.LAZY_LIMIT): a large search bounds each group
    over every micro-batch its room allows and judges its memory only when taken; the plans are those of the
    straightforward search, with fewer groups judged than where every group is judged first (LAZY_LIMIT 0)."""
    fast = _check(monkeypatch, model, gpu, q, judging=JUDGING[1:])
    with monkeypatch.context() as m:
        m.setattr(search_mod, "MIN_GROUPS", 0)
        m.setattr(search_mod, "LAZY_LIMIT", 0)
        eager = search(load_spec(model), get_gpu(gpu), q)
    assert _answer(eager) == _answer(fast)
    assert fast.stats["memory_judged"] < eager.stats["memory_judged"]


def test_no_global_batch_groups_judged_when_taken(monkeypatch):
    _judged_when_taken(monkeypatch, "llama-3.1-8b", "A100-40GB", PlanQuery(gpus=8, seq=8192, top=3,
                                                                          stacks=("megatron",)))


@pytest.mark.heavy
def test_no_global_batch_moe_groups_judged_when_taken(monkeypatch):  # (~50 s)
    _judged_when_taken(monkeypatch, "mixtral-8x7b", "H100-80GB", PlanQuery(gpus=16, seq=4096, top=3,
                                                                          stacks=("megatron",)))


@pytest.mark.heavy
def test_qwen3_moe_on_16_h100(monkeypatch):
    _check(monkeypatch, "qwen3-30b-a3b", "H100-80GB",
           PlanQuery(gpus=16, seq=4096, global_batch_tokens=2**20, stacks=("megatron",)))


def test_a_layouts_groups_derived_from_its_default_setup_are_their_requests_setups():
    """search._derived (the layout's default setup with the group's recompute, ZeRO stage, modules and switches set)
    gives the Setup that planned_setup builds from the group's Request, field for field, for every group of an expert
    layout and of a dense one (the search derives every group so: search._group_base)."""
    spec, gpu = load_spec("qwen3-30b-a3b"), get_gpu("H100-80GB")
    q = PlanQuery(gpus=16, seq=4096, global_batch_tokens=2**20, stacks=("megatron",))
    space = search_mod.Space(spec, gpu, q)
    checked = 0
    for lay in [x for x in space.lays if x.ep > 1][:3] + [x for x in space.lays if x.ep == 1][:2]:
        args = search_mod._LayoutArgs(spec, gpu, q, lay, space.oracle, space.floors, None, 1, ((1, 1),), {},
                                      "megatron", {}, None, [{}], False, {})
        for group in [("bf16-master", z, r, mods) for z in (0, 1) for r, mods in
                      (("none", None), ("full", None), ("selective", "moe_act"), ("selective", None))]:
            try:
                base, switches = search_mod._group_base(args, group)
            except Exception as e:  # a group the rules refuse is refused by its Request too
                with pytest.raises(type(e)):
                    search_mod.planned_setup(spec, **_request_settings(lay, q, group, {}))
                continue
            assert base == search_mod.planned_setup(spec, **_request_settings(lay, q, group, switches))
            assert base.__dict__ == search_mod.planned_setup(spec, **_request_settings(lay, q, group, switches)).__dict__
            checked += 1
    assert checked >= 20


def _request_settings(lay, q, group, switches) -> dict:
    prec, zero, rec, modules = group
    return dict(batch=1, seq=q.seq, grad_accum=search_mod._probe_accum(lay), precision=prec, optimizer=q.optimizer,
                recompute=rec, zero=zero, sequence_parallel=lay.tp > 1, stack="megatron",
                **({"recompute_modules": modules} if modules else {}), **lay.settings(None), **switches)
