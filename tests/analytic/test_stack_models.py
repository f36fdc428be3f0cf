"""The analytic engine's stack seam (trainfit/analytic/stacks): every stack with a facts file has an analytic model
found by its name, and a stack that does not override a seam point gets the base behaviour."""
from __future__ import annotations

import sys
from dataclasses import replace
import types
from importlib import resources

import pytest

from trainfit import overheads
from trainfit.analytic import grad_clip, stacks
from trainfit.analytic.precision import state_bytes
from trainfit.analytic.stacks.base import StackModel
from trainfit.setup import Setup

FACT_FILES = sorted(p.name.removesuffix(".toml") for p in resources.files("trainfit.stacks").iterdir()
                    if p.name.endswith(".toml"))


def test_the_stacks_have_facts_files():
    assert {"hf", "torchtitan", "megatron", "deepspeed"} <= set(FACT_FILES)


@pytest.mark.parametrize("name", FACT_FILES)
def test_every_stack_with_a_facts_file_has_an_analytic_model(name):
    assert resources.files("trainfit.analytic.stacks").joinpath(f"{name}.py").is_file()
    assert isinstance(stacks.model_named(name), StackModel)
    assert stacks.model_for(types.SimpleNamespace(stack=name)) is stacks.model_named(name)


def _clip(setup):
    st = state_bytes(setup)
    n = 1e9
    return grad_clip.clipped_params(setup, n), grad_clip.clip_work(setup, st, grad_clip.clipped_params(setup, n), 100,
                                                                    5e7)


def test_a_stack_without_an_override_gets_the_base_clip():
    # torchtitan overrides no clipping: torch's clip_grad_norm_ over FSDP's shards, as the base computes it
    setup = Setup(stack="torchtitan", dp=4, zero=3, batch=1, seq=128)
    base = StackModel()
    n = base.clipped_params(setup, 1e9)
    assert n == 1e9 / 4
    assert _clip(setup) == (n, base.clip_work(setup, state_bytes(setup), n, 100, 5e7, None))
    # megatron's distributed optimizer clips its own shard with its own kernels: not the base's
    meg = Setup(stack="megatron", precision="bf16-master", dp=4, zero=1, batch=1, seq=128)
    assert _clip(meg) != (base.clipped_params(meg, 1e9),
                          base.clip_work(meg, state_bytes(meg), base.clipped_params(meg, 1e9), 100, 5e7, None))


@pytest.fixture
def fifth_stack(monkeypatch):
    """A stack module that overrides one seam point (its process groups), registered under the name 'fifth'."""
    class Fifth(StackModel):
        def communicators(self, setup):
            return {"world": setup.dp * setup.tp * setup.pp}
    module = types.ModuleType(f"{stacks.__name__}.fifth")
    module.MODEL = Fifth()
    monkeypatch.setitem(sys.modules, module.__name__, module)
    stacks.model_named.cache_clear()
    yield stacks.model_named("fifth")
    stacks.model_named.cache_clear()


def test_a_registered_stack_overrides_only_what_it_defines(fifth_stack):
    setup = Setup(dp=4, tp=2, zero=2, batch=1, seq=128)
    base = StackModel()
    assert fifth_stack.communicators(setup) == {"world": 8} != base.communicators(setup)
    assert fifth_stack.clipped_params(setup, 1e9) == base.clipped_params(setup, 1e9)
    ddp = replace(setup, zero=0)
    assert fifth_stack.notes(None, ddp) == base.notes(None, ddp) != []
    assert (fifth_stack.torch_data_parallel, fifth_stack.torch_optimizer, fifth_stack.zero_engine) == (True, True,
                                                                                                         False)


def test_overheads_reads_the_stacks_process_groups():
    torch_groups = overheads.communicators(Setup(dp=4, tp=2, zero=2, batch=1, seq=128))
    assert torch_groups == {"dp": 4, "tp": 2}
    meg = overheads.communicators(Setup(stack="megatron", precision="bf16-master", dp=2, tp=2, pp=2, zero=1, batch=1,
                                      seq=128))
    assert meg == {"tp": 2, "pp": 2, "dp_cp": 2, "model": 4, "embedding": 2}
