"""Pipeline stages: layer splits (Megatron's get_num_layers_to_build, Llama 3's published 405B split) and the
in-flight micro-batches of 1F1B and interleaved 1F1B (the papers' memory factors, Megatron's own schedule code)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from trainfit.analytic.engine import estimate
from trainfit.analytic.layout import validate_layout
from trainfit.analytic.parallel.pipeline import in_flight, stages, warmup_chunks
from trainfit.errors import SetupError
from trainfit.models.resolve import load_model
from trainfit.setup import Setup


def _setup(**kw) -> Setup:
    base = dict(stack="megatron", precision="bf16-master", tp=8, pp=16, dp=128, grad_accum=16, seq=8192, batch=1,
                sequence_parallel=True, recompute="full", zero=1)
    return Setup(**{**base, **kw})


def test_405b_pp16_embedding_loss_is_llamas_split():
    # Dubey et al. 2024 (Llama 3) §3.3.2: 126 layers on 16 stages, one layer removed from the first and the last
    spec = load_model("llama-3.1-405b")
    got = stages(spec, _setup(pp_split="embedding-loss"))
    assert [(s.index, s.layers, s.embedding, s.head) for s in got] == [(0, 7, True, False), (1, 8, False, False),
                                                                       (15, 7, False, True)]
    assert 7 + 14 * 8 + 7 == spec.layers
    with pytest.raises(SetupError, match="divide the 126 layers"):
        validate_layout(spec, _setup())  # even: 126 % 16 != 0


def test_first_last_split_matches_megatron_uneven_rule():
    spec = load_model("llama-3.1-405b")
    got = stages(spec, _setup(pp_split="first:6,last:8"))
    # transformer_block.py: (126 - 6 - 8) / 14 = 8 per middle stage
    assert [(s.layers) for s in got] == [6, 8, 8]
    with pytest.raises(SetupError, match="do not split evenly over the 14 other stages"):
        validate_layout(spec, _setup(pp_split="first:5,last:8"))


@pytest.mark.parametrize("p,v,m", [(4, 2, 8), (8, 3, 32), (16, 2, 64), (4, 4, 12)])
def test_interleaved_first_stage_memory_factor(p, v, m):
    # Korthikanti et al. 2022 §4.2.3 / Narayanan et al. 2021 §2.2.2: the first stage of the interleaved schedule
    # stores p · (1 + (p - 1) / (p · v)) micro-batches' activations (enough micro-batches: m >= the warm-up)
    paper = p * (1 + (p - 1) / (p * v))
    assert in_flight(p, 0, v, m) == pytest.approx(paper)


@pytest.mark.parametrize("p,m", [(4, 8), (8, 8), (8, 3)])
def test_1f1b_stage_i_holds_p_minus_i(p, m):
    # Narayanan et al. 2021 §2.2.1: stage i (0-based) runs p - i forwards before its first backward
    for i in range(p):
        assert in_flight(p, i, 1, m) == min(p - i, m)


def test_warmup_is_megatrons_schedule():
    from megatron.core.pipeline_parallel.schedules import get_pp_rank_microbatches  # Megatron's own code, CPU

    for p, v, m in ((4, 2, 8), (8, 3, 16), (4, 1, 8), (16, 2, 16)):
        for r in range(p):
            comm = SimpleNamespace(pp_group=SimpleNamespace(size=lambda p=p: p, rank=lambda r=r: r),
                                   virtual_pipeline_model_parallel_size=v if v > 1 else None)
            _, _, warm, _ = get_pp_rank_microbatches(m, v, p, p2p_communicator=comm)
            assert warmup_chunks(p, r, v, m) == warm


def test_interleaving_checks():
    spec = load_model("llama-3.1-405b")
    with pytest.raises(SetupError, match="multiple of 16"):
        validate_layout(spec, _setup(pp_split="embedding-loss", vpp=2, grad_accum=24))
    with pytest.raises(SetupError, match="equal chunks"):
        validate_layout(spec, _setup(pp_split="embedding-loss", vpp=3, grad_accum=32))
    validate_layout(spec, _setup(pp_split="embedding-loss", vpp=4, grad_accum=32))


def test_interleaving_raises_stage0_memory_and_ep_checks():
    spec = load_model("llama-3.1-405b")
    one = estimate(spec, _setup(pp_split="embedding-loss", grad_accum=64, recompute="selective"))
    two = estimate(spec, _setup(pp_split="embedding-loss", grad_accum=64, vpp=2, recompute="selective"))
    assert two.memory.activations > one.memory.activations
    with pytest.raises(SetupError, match="dense"):
        validate_layout(spec, _setup(ep=2, pp_split="embedding-loss"))
