"""The stacks' facts (trainfit/stacks/*.toml) against the stacks' own code, and the settings that use them.

Independent source: the installed transformers and torchtitan themselves (their config defaults and save lists),
not trainfit's reading of them.
"""
from __future__ import annotations

import dataclasses
import math
import re

import pytest

from trainfit.errors import SetupError
from trainfit.setup import Setup
from trainfit.stacks import get_stack, names


@pytest.mark.parametrize("name", names())
def test_every_fact_names_its_source(name):
    st = get_stack(name)
    assert st.facts, name
    for key, fact in st.facts.items():
        # a file of the stack's code with a line, or a named document
        assert re.search(r"\.(py|toml|md)(:\d+)?", fact["source"]), (name, key, fact["source"])


def test_hf_optimizer_is_the_trainers_default():
    transformers = pytest.importorskip("transformers")
    optim = next(f.default for f in dataclasses.fields(transformers.TrainingArguments) if f.name == "optim")
    assert optim == "adamw_torch_fused"  # torch >= 2.8 (this test pins the fact to the installed versions)
    assert get_stack("hf").fact("optimizer_impl") == "fused"
    assert Setup().optimizer_kernel == "fused"


def test_torchtitan_facts_match_its_code():
    pytest.importorskip("torchtitan")
    import torch
    from torchtitan.config.job_config import ActivationCheckpoint, Optimizer, Training
    from torchtitan.models.llama3.infra import parallelize

    st = get_stack("torchtitan")
    assert Optimizer().implementation == st.fact("optimizer_impl") == "fused"
    assert (Training().mixed_precision_param, Training().mixed_precision_reduce) == ("bfloat16", "float32")
    assert (st.fact("mixed_precision", "param_dtype"), st.fact("mixed_precision", "reduce_dtype")) == ("bf16", "fp32")
    assert ActivationCheckpoint().mode == "selective"
    saved = parallelize._op_sac_save_list
    assert torch.ops.aten.mm.default in saved and torch.ops.aten._scaled_dot_product_flash_attention.default in saved
    assert {"mm", "sdpa"} <= set(st.fact("op_sac", "save"))


def test_selective_means_the_stacks_policy():
    assert Setup(stack="torchtitan", recompute="selective").recompute == "op"
    assert Setup(stack="hf", recompute="selective", attention="eager").recompute == "selective"
    assert Setup(stack="torchtitan", recompute="layer:3").layers_every == 3
    assert Setup(recompute="full").layers_every == 1 and Setup().layers_every == 0


@pytest.mark.parametrize("kw, fragment", [
    (dict(recompute="op"), "not a hf policy"),
    (dict(recompute="layer:2"), "not a hf policy"),
    (dict(stack="torchtitan", recompute="layer:0"), "positive integer"),
    (dict(stack="torchtitan", recompute="layers:2"), "not supported"),
    (dict(stack="torchtitan", dp=2, zero=1), "--zero 1 is not run by --stack torchtitan"),
    (dict(optimizer="adafactor", optimizer_impl="fused"), "no fused adafactor"),
    (dict(stack="torchtitan", head="seq-cls"), "causal language models"),
    (dict(stack="nemo"), "choose one of"),
    # --max-grad-norm: where the stack clips (stacks/*.toml [grad_clip]) and a total norm exists
    (dict(max_grad_norm=-1.0), "--max-grad-norm must be at least 0"),
    (dict(max_grad_norm=math.nan), "--max-grad-norm must be a finite number"),
    (dict(max_grad_norm=1.0, mode="infer"), "--max-grad-norm applies to train/rl only"),
    (dict(max_grad_norm=0.0, stack="torchtitan"), "torchtitan clips"),
    (dict(max_grad_norm=1.0, optimizer_in_backward=True), "--optimizer-in-backward"),
])
def test_bad_stack_settings_are_one_line(kw, fragment):
    with pytest.raises(SetupError, match=re.escape(fragment)) as e:
        Setup(**kw)
    assert "\n" not in str(e.value)


def test_cli_refuses_a_policy_the_stack_lacks(cli):
    code, out, err = cli("estimate", "tiny-llama", "--recompute", "op")
    assert code == 2 and "--stack torchtitan" in err and len(err.strip().splitlines()) == 1


def test_compare_drops_the_training_only_settings():
    """Training vs inference (compare, and the HTML report built on it): a torchtitan step with per-op SAC and
    compile contrasts with inference of the same model, whose request must not carry the training-only flags."""
    import trainfit
    from trainfit.api import compare

    rows = compare(trainfit.Request("llama-3.1-8b", stack="torchtitan", recompute="op", compile=True, dp=8, zero=3,
                                    batch=2, seq=8192))
    train, infer = list(rows.values())[:2]
    assert train.setup.stack == "torchtitan" and infer.setup.mode == "infer" and infer.setup.stack == "hf"
    assert infer.memory.peak < train.memory.peak


@pytest.mark.parametrize("model, words", [("gpt2", "llama-family"), ("llama-3.2-3b", "ties its input and output"),
                                          ("qwen2.5-0.5b", "llama-family")])
def test_every_engine_refuses_a_model_torchtitan_does_not_build(cli, model, words):
    """torchtitan's llama3 Transformer is untied, bias-free and llama-shaped (torchtitan/models/llama3/model/model.py):
    the analytic engine refuses what the trace engine cannot build, instead of estimating a run nobody can make."""
    code, out, err = cli("estimate", model, "--stack", "torchtitan")
    assert code == 2 and words in err and len(err.strip().splitlines()) == 1


def test_a_stack_refusal_names_only_stacks_that_run_the_value():
    """--precision / --zero / --optimizer a stack does not run: the "or --stack ..." of the refusal names each other
    stack whose facts (stacks/*.toml) list the value and no other; it named "--stack hf" whatever the value, under
    --stack hf itself (--precision fp16-master) and for a value hf does not run either."""
    from trainfit.precision import TRAIN_PRECISIONS

    values = [("precision", p, lambda st, v: v in st.precisions) for p in TRAIN_PRECISIONS]
    values += [("zero", z, lambda st, v: v in st.zero_stages) for z in range(4)]
    values += [("optimizer", o, lambda st, v: v in st.optimizers) for o in ("adamw", "lion", "sgd", "adafactor")]
    seen = 0
    for name in names():
        for setting, value, runs in values:
            if runs(get_stack(name), value):
                continue
            with pytest.raises(SetupError) as e:
                Setup(stack=name, dp=2, **{setting: value})
            msg = str(e.value)
            if not msg.startswith(f"--{setting} {value} is not "):
                continue  # refused by an earlier rule (Setup's precision, amp-bf16, on megatron)
            seen += 1
            tail = msg.split("; use one of those")[1]
            named = tail.removeprefix(" or --stack ").split(" or ") if tail else []
            assert sorted(named) == sorted(n for n in names() if n != name and runs(get_stack(n), value)), msg
    assert seen >= 10
