"""--offload activations (torchtune's activation offloading) in the analytic engine, by hand: with full recompute a
layer saves only its input (the checkpoint's), and all but the layer in flight and the one prefetched live in
pinned host memory."""
from __future__ import annotations

import pytest

from trainfit import api
from trainfit.errors import SetupError
from trainfit.setup import Request, Setup

BASE = dict(model="llama-3.2-3b", batch=2, seq=4096, precision="bf16", recompute="full")


def test_checkpointed_inputs_go_to_the_host():
    kept, off = (api.analytic(Request(**BASE, **kw)) for kw in ({}, dict(offload="activations")))
    spec = api.load_spec("llama-3.2-3b")
    per_layer = 2 * 2 * 4096 * spec.hidden  # one bf16 checkpoint input: batch × seq × hidden
    host = (spec.layers - 2) * per_layer  # 28 layers, 2 on the device
    assert off.detail["host_memory"] == host
    assert kept.memory.activations - off.memory.activations == host
    # calibration C1 publishes 23.1 -> 21.8 GiB for this step (1.3 GiB); the hand count is 1.22 GiB
    assert host / 2**30 == pytest.approx(1.3, rel=0.07)


@pytest.mark.parametrize("kw,words", [(dict(offload="activations", stack="torchtitan"), "--stack hf")])
def test_refusals(kw, words):
    with pytest.raises(SetupError, match=words):
        Setup(**kw)


def test_trace_and_measure_refuse_in_one_line():
    from trainfit.engines import measure, trace

    spec = api.load_spec("tiny-llama")
    for engine in (trace, measure):
        with pytest.raises(SetupError, match="--engine analytic"):
            engine(spec, Setup(offload="activations", device="cpu", batch=1, seq=8))
