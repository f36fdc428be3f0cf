"""The planner's states floor (analytic/memory.py states_floor) never exceeds the fit rule's required bytes, which
the memory oracle would read at micro-batch 1: a group it rejects could not have fit (plan/fit.py largest_batch).
Megatron's layouts of a dense and a MoE model, every ZeRO stage and recompute policy; the stacks without a floor
read 0."""
from __future__ import annotations

import itertools

import pytest

from trainfit.analytic.fit_rule import required
from trainfit.analytic.memory import states_floor, train_memory
from trainfit.analytic.params import count_params
from trainfit.api import load_spec
from trainfit.errors import SetupError
from trainfit.setup import Setup


@pytest.mark.parametrize("model", ["llama-3.1-8b", "qwen3-30b-a3b"])
def test_megatron_states_floor_is_below_the_required_bytes(model):
    spec = load_spec(model)
    pc = count_params(spec)
    checked = 0
    for tp, pp, ep, zero, rec, accum in itertools.product((1, 2), (1, 2, 4), (1, 4), (0, 1, 3), ("none", "full"),
                                                          (1, 8)):
        if ep > 1 and spec.moe is None:
            continue
        dp = 32 // (tp * pp)
        try:
            s = Setup(stack="megatron", precision="bf16-master", seq=2048, batch=1, grad_accum=max(accum, pp), tp=tp,
                      pp=pp, dp=dp, ep=ep, zero=zero, recompute=rec, sequence_parallel=tp > 1)
        except SetupError:
            continue  # a combination Megatron's rules refuse
        floor = states_floor(spec, s, pc)
        need = required(spec, s, train_memory(spec, s, pc), pc)
        assert 0 < floor <= need, (s.tp, s.pp, s.ep, s.zero, s.recompute, s.grad_accum)
        checked += 1
    assert checked >= 30


def test_stacks_without_a_floor_read_zero():
    spec = load_spec("llama-3.1-8b")
    assert states_floor(spec, Setup(stack="hf", seq=2048, dp=8, zero=3)) == 0


@pytest.mark.parametrize("stack, model", [("megatron", "qwen3-30b-a3b"), ("megatron", "llama-3.1-8b"),
                                          ("torchtitan", "llama-3.1-8b"), ("hf", "llama-3.1-8b"),
                                          ("deepspeed", "llama-3.1-8b")])
def test_states_and_overheads_do_not_read_the_recompute_policy(stack, model):
    # the memory oracle memoises the stages' states and the fit rule's capacity once for a group's every recompute
    # policy and module set (plan/fit.py PeakOracle.micro_batch_room and capacity, keyed by plan/search.py's `family`)
    from trainfit.analytic.fit_rule import capacity
    from trainfit.hardware import get_gpu
    from trainfit.plan.space import recompute_module_sets
    from trainfit.stacks import get_stack

    spec, gpu = load_spec(model), get_gpu("H100-80GB")
    pc = count_params(spec)
    sets = [("selective", m) for m in recompute_module_sets(spec, stack)] + \
        [(r, None) for r in get_stack(stack).plan_recomputes if r != "selective"]
    compared = 0
    for tp, pp, ep, zero in itertools.product((1, 2), (1, 2), (1, 4), get_stack(stack).zero_stages):
        seen, built = set(), 0
        for rec, mods in sets:
            try:
                s = Setup(stack=stack, precision=get_stack(stack).plan_precisions[0], seq=2048, batch=1, grad_accum=2,
                          tp=tp, pp=pp,
                          dp=16 // (tp * pp), ep=ep, zero=zero, recompute=rec, sequence_parallel=tp > 1,
                          **({"recompute_modules": mods} if mods else {}))
            except SetupError:
                continue
            seen.add((states_floor(spec, s, pc), capacity(gpu, s)))
            built += 1
        assert len(seen) <= 1, (tp, pp, ep, zero, seen)
        compared += built > 1
    assert compared >= 4  # (groups of several policies the stack's rules take)
