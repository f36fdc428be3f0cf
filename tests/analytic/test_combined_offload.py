"""--offload activations together with a state offload (--offload optimizer / params): one value
(activations+params, activations+optimizer) whose two parts each site reads apart (Setup.offload_activations,
Setup.offload_state). By hand: the saved activations the activations part moves add to the states' host bytes, and
come off the device, while the states' terms stay what the state offload alone gives."""
from __future__ import annotations

import pytest

from trainfit import api
from trainfit.errors import SetupError
from trainfit.setup import BY_NAME, Request, Setup, parse_value

GiB = 2**30


@pytest.mark.parametrize("given,value", [
    (["activations", "params"], "activations+params"),
    (["params", "activations"], "activations+params"),
    (["optimizer", "activations"], "activations+optimizer"),
    (["activations", "optimizer", "params"], "activations+params"),  # ZeRO-Infinity's pair, with the activations
    (["optimizer", "params"], "params"),
    ("activations+params", "activations+params"),  # the value itself (the web form's choice)
    (["none"], "none"),
])
def test_the_flag_given_several_times_is_one_value(given, value):
    assert parse_value(BY_NAME["offload"], given) == value


@pytest.mark.parametrize("value,state,acts", [("none", "none", False), ("optimizer", "optimizer", False),
                                              ("params", "params", False), ("activations", "none", True),
                                              ("activations+optimizer", "optimizer", True),
                                              ("activations+params", "params", True)])
def test_each_site_reads_its_part(value, state, acts):
    s = Setup(offload=value, stack="deepspeed", precision="bf16-master", zero=3, dp=2, recompute="full")
    assert (s.offload_state, s.offload_activations) == (state, acts)


# ArcticTraining's long-sequence recipe on one GPU: ZeRO-3 with offload_param + offload_optimizer (C10's setup), and
# its activation_checkpoint_cpu_offload (ALST's run-h200-sp1-llama-8b-liger-offload.yml)
ALST = dict(model="llama-3.1-8b", stack="deepspeed", zero=3, dp=1, recompute="full", seq=65_000, batch=1,
            gpu="H200", attention="flash")


def test_deepspeed_checkpoint_offload_beside_zero_infinity():
    states, both = (api.analytic(Request(**ALST, offload=o)) for o in ("params", "activations+params"))
    spec = api.load_spec("llama-3.1-8b")
    # each checkpointed layer's input (seq × hidden, bf16) goes to the host, all but the one layer being run
    # (monkey_patches.py:85-92): 31 of Llama-3.1-8B's 32 layers
    moved = (spec.layers - 1) * 65_000 * spec.hidden * 2
    assert moved / GiB == pytest.approx(15.37, abs=0.01)
    assert both.detail.host_memory - states.detail.host_memory == moved  # ZeRO-Infinity's host bytes unchanged
    assert states.memory.peak - both.memory.peak == pytest.approx(moved, rel=0.01)
    assert (both.memory.weights, both.memory.optimizer_states) == (states.memory.weights, states.memory.optimizer_states)


def test_fsdp2_cpu_offload_beside_torchtune_activation_offloading():
    run = dict(model="llama-3.2-1b", stack="hf", zero=3, dp=2, recompute="full", seq=4096, batch=2, precision="bf16",
               gpu="RTX-4090")
    states, both = (api.analytic(Request(**run, offload=o)) for o in ("params", "activations+params"))
    spec = api.load_spec("llama-3.2-1b")
    moved = (spec.layers - 2) * 2 * 4096 * spec.hidden * 2  # all but the layer in flight and the one prefetched
    assert both.detail.host_memory - states.detail.host_memory == moved
    assert states.memory.activations - both.memory.activations == moved
    assert both.memory.weights == states.memory.weights == 0  # FSDP2's shards stay on the host


@pytest.mark.parametrize("kw,words", [
    (dict(stack="torchtitan", zero=3, dp=2, offload="activations+params"), "--offload activations"),
    (dict(stack="deepspeed", zero=3, dp=1, offload="activations+params", recompute="none"), "--recompute full"),
    (dict(stack="hf", dp=2, offload="activations+optimizer", recompute="full"), "for one GPU"),
    (dict(stack="hf", zero=2, dp=2, offload="activations+params", recompute="full"), "--zero 3"),
])
def test_a_part_the_stack_does_not_run_is_refused(kw, words):
    with pytest.raises(SetupError, match=words):
        Setup(**kw)
