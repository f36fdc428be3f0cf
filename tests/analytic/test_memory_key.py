"""The planner judges a group's memory once for all its TIMED settings (plan/space.py: the MoE dispatcher,
--overlap-moe-comm), keyed by analytic.memory.memory_key: train_memory and the fit rule's required bytes run afresh
under each value of NOT_IN_MEMORY give the same bytes, and the capacity differs by the dispatcher's own buffers alone
(overheads.OWN_BUFFERS: the planner judges those setups again before it times them). Fast (no torch)."""
from __future__ import annotations

from trainfit.analytic.fit_rule import capacity, required
from trainfit.analytic.memory import NOT_IN_MEMORY, memory_key, train_memory
from trainfit.analytic.params import count_params
from trainfit.api import load_spec
from trainfit.hardware import get_gpu
from trainfit.overheads import OWN_BUFFERS, overheads
from trainfit.plan.search import planned_setup
from trainfit.plan.space import TIMED


def test_the_timed_settings_are_those_memory_never_reads():
    assert {a.name for a in TIMED} <= {k for k, _ in NOT_IN_MEMORY}
    assert all(dict(NOT_IN_MEMORY)[a.name] == a.default for a in TIMED)


def test_memory_is_the_same_under_every_dispatcher_and_schedule():
    gpu = get_gpu("H100-80GB")
    spec = load_spec("qwen3-30b-a3b")
    pc = count_params(spec)
    layouts = [dict(dp=8, ep=8, recompute="selective", recompute_modules="moe_act"),
               dict(dp=4, tp=2, ep=4, sequence_parallel=True, recompute="none"),
               dict(dp=4, pp=2, vpp=2, ep=4, recompute="none", grad_accum=8)]
    for lay in layouts:
        lay = {"grad_accum": 4, **lay}
        seen, caps = set(), set()
        for how, sms, overlap in ((None, None, False), ("allgather", None, False), ("deepep", 24, False),
                                  ("hybridep", None, False), (None, None, True), ("deepep", None, True)):
            s = planned_setup(spec, seq=4096, batch=2, stack="megatron", precision="bf16-master", zero=1,
                              moe_dispatcher=how, moe_dispatcher_sms=sms, overlap_moe_comm=overlap, **lay)
            key = memory_key(s)
            assert all(getattr(key, k) == v for k, v in NOT_IN_MEMORY) and key != s or (how, overlap) == (None, False)
            m = train_memory(spec, s, pc)
            seen.add((m.peak, m.phases["backward"], required(spec, s, m, pc)))
            # the capacity: the dispatcher's buffers beside the allocator are the only difference
            # (tests/test_dispatcher_buffers.py)
            own = overheads(gpu, s, spec)
            caps.add(capacity(gpu, s, 0, spec) + own.get("deepep_buffers", 0) + own.get("hybridep_buffers", 0))
            assert {k for k in own if k.endswith("ep_buffers")} == ({f"{how}_buffers"} if how in OWN_BUFFERS else set())
        assert len(seen) == 1 and len(caps) == 1, (lay, seen, caps)
    # torchtitan's DeepEP backend: its memory counted as its all-to-all's (parallel/expert_memory.py NB)
    spec = load_spec("deepseek-v2-lite")
    pc = count_params(spec)
    for rec in ("none", "op"):
        seen = set()
        for how in (None, "deepep"):
            s = planned_setup(spec, seq=4096, batch=2, stack="torchtitan", precision="amp-bf16", zero=3, dp=8, ep=8,
                              recompute=rec, moe_dispatcher=how)
            m = train_memory(spec, s, pc)
            seen.add((m.peak, m.phases["backward"], required(spec, s, m, pc)))
        assert len(seen) == 1, (rec, seen)
