"""The memory engine's memos change no number: state_bytes' answer by setup identity and Megatron's core-attention-only
setup (megatron_memory._core_only, memoised on the setup without its micro-batch and accumulation) against their own straightforward
derivations, built afresh for each setup (Setup.with_ with every rule checked, precision._state_bytes). Fast (no
torch)."""
from __future__ import annotations

import copy

from trainfit.analytic import megatron_memory, memo as memos, precision
from trainfit.analytic.memory import train_memory
from trainfit.analytic.params import count_params
from trainfit.api import load_spec
from trainfit.plan.search import planned_setup


def test_core_only_setup_is_the_validated_one_at_every_micro_batch():
    spec = load_spec("qwen3-30b-a3b")
    for mods, core in (("moe_act", dict(recompute="none", recompute_modules=None)),
                       ("core_attn,moe_act", dict(recompute_modules="core_attn"))):
        base = planned_setup(spec, seq=2048, batch=1, grad_accum=4, dp=4, ep=4, pp=2, vpp=2, stack="megatron",
                             recompute="selective", recompute_modules=mods)
        for b, accum in ((1, 4), (3, 4), (2, 8), (3, 4)):  # (3, 4) twice: the second is read back
            s = base.with_micro_batches(b, accum)
            got = megatron_memory._core_only(s)
            assert got == s.with_(**core) and (got.batch, got.grad_accum) == (b, accum)


def test_memory_is_the_same_with_the_memos_emptied_and_without_the_identity_memo(monkeypatch):
    spec = load_spec("qwen3-30b-a3b")
    pc = count_params(spec)
    s = planned_setup(spec, seq=2048, batch=2, grad_accum=4, dp=4, ep=4, pp=2, vpp=2, stack="megatron",
                      recompute="selective", recompute_modules="moe_act")
    memo = train_memory(spec, s, pc)
    memos.clear()
    monkeypatch.setattr(megatron_memory, "_LAST_CORE", (None, None))
    # every state_bytes call computes afresh on a copy (a new identity, the same fields)
    monkeypatch.setattr(precision, "_RECENT_SIZE", 0)
    fresh = train_memory(spec, copy.copy(s), pc)
    assert fresh == memo and precision.state_bytes(s) == precision._state_bytes(copy.copy(s))


def test_memory_is_the_same_with_the_batch_free_memos_warm_or_emptied():
    """megatron_memory.rank_states (keyed without the micro-batch, the accumulation and the recompute policy) and
    megatron_activations.per_token_terms (without the micro-batch, the accumulation and the ZeRO stage) are memoised
    on batch_free.BatchFree keys: the peak of each micro-batch read with the memos warm from the other micro-batches,
    another recompute policy and another ZeRO stage equals the one computed with every memo emptied first — over the
    recompute modules, full recompute, a pipeline and the expert layout."""
    from trainfit.analytic import compute_time

    spec = load_spec("qwen3-30b-a3b")
    pc = count_params(spec)
    bases = [planned_setup(spec, seq=2048, batch=1, grad_accum=4, dp=4, ep=4, pp=2, stack="megatron",
                           recompute="selective", recompute_modules="layernorm,moe_act", zero=1),
             planned_setup(spec, seq=2048, batch=1, grad_accum=1, dp=8, ep=2, tp=2, sequence_parallel=True,
                           stack="megatron", recompute="full", zero=3)]
    for base in bases:
        warm = []
        compute_time.clear_memos()
        for other in (base.with_(recompute="none", recompute_modules=None), base.with_(zero=2)):
            train_memory(spec, other, pc)  # the states' entry (same ZeRO), the layers' terms (same recompute)
        for b, accum in ((1, base.grad_accum), (3, base.grad_accum), (2, 2 * base.grad_accum)):
            warm.append(train_memory(spec, base.with_micro_batches(b, accum), pc))
        for (b, accum), got in zip(((1, base.grad_accum), (3, base.grad_accum), (2, 2 * base.grad_accum)), warm):
            compute_time.clear_memos()
            assert got == train_memory(spec, base.with_micro_batches(b, accum), pc)


def test_the_batch_free_key_leaves_out_only_the_micro_batch_and_the_accumulation():
    from trainfit.analytic.batch_free import BatchFree

    spec = load_spec("qwen3-30b-a3b")
    s = planned_setup(spec, seq=2048, batch=2, grad_accum=4, dp=4, ep=4, stack="megatron", zero=1)
    assert BatchFree(s) == BatchFree(s.with_micro_batches(5, 8)) and hash(BatchFree(s)) == hash(BatchFree(
        s.with_micro_batches(5, 8)))
    assert BatchFree(s) != BatchFree(s.with_(zero=2)) and BatchFree(s) != BatchFree(s.with_(seq=4096))
