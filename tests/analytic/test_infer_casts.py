"""Autocast's casts in an inference step's op lists (analytic/infer_time.py) against the kernels the trace engine
dispatches for one layer (a 3-layer less a 2-layer trace of tiny-llama, amp-bf16, CUDA semantics): the prefill casts
each weight (autocast's cache, ops/cast.weight_casts), the linears' inputs and q and k before the attention; the
decode step, in the same autocast context, finds the weights' casts cached (ops/cast.uncached) and casts every cached
key (the cache keeps k in fp32 under autocast). Before: the decode list timed the weight casts again and cast the new
key only (4172544 bytes of casts per layer listed against 68352 traced)."""
from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

pytest.importorskip("transformers")

from trainfit.analytic.infer_time import _attending  # noqa: E402
from trainfit.analytic.ops import layer_forward, shape_of  # noqa: E402
from trainfit.analytic.ops.cast import uncached  # noqa: E402
from trainfit.analytic.precision import state_bytes  # noqa: E402
from trainfit.analytic.timing import compute_dtype  # noqa: E402
from trainfit.models.resolve import load_model  # noqa: E402
from trainfit.setup import Setup  # noqa: E402
from trainfit.trace.extrapolate import with_layers  # noqa: E402
from trainfit.trace.kernel_shapes import inference_kernels  # noqa: E402


def test_inference_casts_per_layer_match_the_trace():
    spec = load_model("tiny-llama")
    setup = Setup(batch=2, seq=64, precision="amp-bf16", device="cuda", mode="infer")
    one_layer = Counter(inference_kernels(with_layers(spec, 3), setup)) - Counter(
        inference_kernels(with_layers(spec, 2), setup))
    sh = shape_of(spec, setup, state_bytes(setup), compute_dtype(setup))
    listed = {"prefill": layer_forward(spec, sh),
              "decode": _attending(uncached(layer_forward(spec, replace(sh, seq=1, decode=True))), 1, setup.seq + 1)}
    for phase, ops in listed.items():
        traced = [(k.nbytes, c) for k, c in one_layer.items() if k.phase == phase and k.op == "_to_copy"]
        casts = [o for o in ops if o.kind == "memory" and "cast" in o.name]
        assert sum(c for _, c in traced) == sum(o.kernels for o in casts), phase
        assert sum(n * c for n, c in traced) == sum(o.reads + o.writes for o in casts), phase
