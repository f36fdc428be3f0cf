"""The planner over a model the analytic engine models in part (Nemotron-H: Mamba-2 blocks trained without --tp/--pp,
ZeRO-3 or other recompute policies; an encoder-decoder on one GPU): it plans the layouts the engine models, leaves out
exactly those `trainfit estimate` refuses, and says so; where none is modelled, the engine's reason in one line. And
plan's default --seq is the estimate's (the model's position table where it is shorter than 2048)."""
from __future__ import annotations

import pytest

from trainfit.api import load_spec
from trainfit.cli import main
from trainfit.engines import analytic
from trainfit.errors import NotModelledError
from trainfit.hardware import get_gpu
from trainfit.plan.search import PlanQuery, planned_setup, search


def test_plans_the_layouts_the_engine_models_and_leaves_out_those_it_refuses():
    spec, gpu = load_spec("nemotron-h-8b"), get_gpu("H100-80GB")
    r = search(spec, gpu, PlanQuery(gpus=8, top=50))
    assert r.candidates, "ZeRO 0-2 over 8 data-parallel ranks with none or full recompute is modelled"
    planned = {(c.setup.tp, c.setup.pp, c.setup.zero, c.setup.recompute) for c in r.candidates}
    # the independent side: the estimate itself at each group's settings (the search's groups are its setups)
    refused, modelled = set(), set()
    for tp, pp in ((1, 1), (2, 1), (4, 1)):  # (the hf stack runs no pipeline split; ZeRO needs dp > 1)
        for zero in (0, 1, 2, 3):
            for rec in ("none", "full"):
                s = planned_setup(spec, batch=1, seq=2048, dp=8 // (tp * pp), tp=tp, pp=pp, zero=zero, recompute=rec,
                                  sequence_parallel=tp > 1, grad_accum=pp)
                try:
                    analytic(spec, s, gpu)
                    modelled.add((tp, pp, zero, rec))
                except NotModelledError:
                    refused.add((tp, pp, zero, rec))
    assert refused and modelled
    assert not planned & refused
    assert planned <= modelled
    assert r.stats["not_modelled"] > 0
    assert any("does not model" in n and "Mamba-2" in n for n in r.notes), r.notes


def test_nothing_fits_diagnosis_takes_the_most_zero_the_engine_models():
    spec = load_spec("nemotron-h-8b")
    r = search(spec, get_gpu("T4"), PlanQuery(gpus=8))
    assert not r.candidates
    lean = r.diagnosis.leanest_setup
    assert (lean.zero, lean.recompute) == (2, "full")  # ZeRO-3 is the stack's most, but not modelled


def test_a_model_with_no_modelled_layout_is_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        main(["plan", "t5-base", "--gpu", "H100-80GB", "--gpus", "8"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("error: plan: the analytic engine models no layout of t5-base on 8 GPUs") and \
        "data parallelism" in err


@pytest.mark.parametrize("model,positions", [("bert-base", 512), ("gpt2", 1024)])
def test_default_seq_is_the_estimates(capsys, model, positions):
    main(["plan", model, "--gpu", "A100-80GB", "--gpus", "2", "--json"])
    import json

    got = json.loads(capsys.readouterr().out)
    assert got["query"]["seq"] == positions
    assert planned_setup(load_spec(model)).seq == positions  # `trainfit estimate`'s default for the same model


def test_a_hybrid_model_on_a_stack_without_mamba_blocks_is_refused_not_estimated_as_attention(capsys):
    """Megatron's memory model (megatron_memory.py) has GPTModel's TransformerLayers only: it had estimated every
    Nemotron-H block as an attention + MLP layer (activation_per_layer equal to a dense Llama layer's), where
    Megatron-LM trains the model as MambaModel (megatron-core ssm/mamba_layer.py). The estimate is refused in one
    line; the planner leaves those groups out and plans the stack that models the blocks."""
    with pytest.raises(SystemExit) as e:
        main(["estimate", "nemotron-h-8b", "--stack", "megatron", "--dp", "8", "--gpu", "H100-80GB"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and "--stack megatron" in err and "Mamba-2" in err
    r = search(load_spec("nemotron-h-8b"), get_gpu("H100-80GB"), PlanQuery(gpus=8, stacks=("hf", "megatron")))
    assert r.candidates and {c.setup.stack for c in r.candidates} == {"hf"}
    assert r.stats["not_modelled"] > 0
