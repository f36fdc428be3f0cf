"""The search's bound memo (plan/floors.py) shares one step_floor among a layout's ZeRO stages of the same state bytes:
step_floor run on the setup at each ZeRO stage gives one bound per state bytes (its compute, TP/PP/CP/EP exchanges,
bubble and stragglers read no ZeRO setting; FSDP2's mixed precision, on at hf's ZeRO 2/3 under amp-bf16, changes the
state bytes, which the key holds), and the memo hands back step_floor's own value. Fast (no torch)."""
from __future__ import annotations

from trainfit.analytic import compute_time
from trainfit.analytic.params import count_params
from trainfit.analytic.precision import state_bytes
from trainfit.analytic.step_time import step_floor
from trainfit.api import load_spec
from trainfit.errors import SetupError
from trainfit.hardware import get_gpu
from trainfit.plan.floors import Floors
from trainfit.plan.search import planned_setup


def test_the_bound_is_the_same_at_every_zero_stage():
    gpu = get_gpu("H100-80GB")
    cases = [("qwen3-30b-a3b", "megatron", "bf16-master", dict(tp=2, ep=4, sequence_parallel=True,
                                                                tp_comm_overlap=True, pp=2, grad_accum=4)),
             ("llama-3.2-1b", "hf", "amp-bf16", {}), ("llama-3.2-1b", "torchtitan", "amp-bf16", {"tp": 2}),
             ("llama-3.2-1b", "deepspeed", "bf16-master", {})]
    for name, stack, prec, kw in cases:
        spec = load_spec(name)
        pc = count_params(spec)
        floors = Floors(spec, gpu, pc)
        bounds: dict = {}
        runs = 0
        for zero in (0, 1, 2, 3):
            try:
                s = planned_setup(spec, seq=2048, batch=2, dp=4, zero=zero, stack=stack, precision=prec,
                                  **{"grad_accum": 2, **kw})
            except SetupError:
                continue  # a stage the stack does not run
            runs += 1
            compute_time.clear_memos()
            fresh = step_floor(spec, s, gpu, pc, state_bytes(s))
            assert floors(s, state_bytes(s)) == fresh
            bounds.setdefault(state_bytes(s), set()).add(fresh)
        assert sum(map(len, bounds.values())) == len(bounds), (name, stack, bounds)
        if stack == "megatron":  # its four stages keep the same state bytes: one bound for all of them
            assert runs == 4 and len(bounds) == 1
