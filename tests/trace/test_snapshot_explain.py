"""`trainfit explain` on a synthetic snapshot of a real model's step: the trace engine records tiny-llama's training
step (--device cuda semantics), the allocator simulator replays it and exports torch's snapshot format with the
frames torch would record (trace/snapshot.py), and the reader (memory_snapshot.py), which sees only the frames and
sizes, must recover the categories the trace assigned — including what no frame names: which backward blocks are
gradients and which are the backward's temporaries — to the byte."""
from __future__ import annotations

from collections import Counter

import pytest

from trainfit.api import resolve
from trainfit.memory_snapshot import explain
from trainfit.setup import Request
from trainfit.trace.engine import trace_train
from trainfit.trace.recorder import CATEGORIES
from trainfit.trace.snapshot import requested, trace_snapshot

# the trace's categories in the reader's: parameters and buffers are both allocated moving the model
AS_READ = {"parameter": "weights", "buffer": "weights", "gradient": "gradients", "optimizer_state": "optimizer_states",
           "activation": "activations", "temporary": "temporaries", "input": "inputs_and_other"}


@pytest.fixture(scope="module")
def traced():
    spec, setup = resolve(Request(model="tiny-llama", batch=2, seq=64, precision="amp-bf16", device="cuda"))
    _, rec, _ = trace_train(spec, setup, flops=False)
    return rec, setup


def _truth(live) -> Counter:
    out = Counter()
    for r in live:
        out[AS_READ[CATEGORIES[r.cat]]] += requested(r)
    return out


@pytest.mark.heavy  # the trace: ~3 s on 2 cores
@pytest.mark.parametrize("moment", ["peak", "backward end"])
def test_explain_recovers_the_trace_s_categories(traced, moment):
    rec, setup = traced
    at = None if moment == "peak" else \
        next(e for e, n in rec.phase_marks if n == "optimizer" and e >= rec.step_start) - 1
    snap, live = trace_snapshot(rec, setup, at=at)
    ex = explain(snap)
    truth = _truth(live)
    assert {k: v for k, v in ex.bytes.items() if k in AS_READ.values() and v} == dict(truth)
    if moment == "backward end":  # every trainable parameter's gradient is live, and read as one
        assert truth["gradients"] > 0 and ex.bytes["gradients"] == truth["gradients"]
    else:  # the step's allocated peak holds the forward's saved tensors
        assert truth["activations"] > 0
    # the allocator's part: block sizes above the requests, and free blocks; the whole reserved is accounted for
    assert ex.bytes["rounding"] == sum(b["size"] for s in snap["segments"] for b in s["blocks"]
                                       if b["state"] == "active_allocated") - sum(truth.values())
    assert sum(ex.bytes.values()) == ex.reserved == sum(s["total_size"] for s in snap["segments"])


@pytest.mark.heavy  # the trace of the fixture
def test_explain_sets_the_analytic_prediction_beside_the_trace_s_snapshot(traced, cli, tmp_path):
    # two independent accounts of one step: the analytic engine's formulas at its peak, and the traced step's
    # allocations at theirs, read back from the snapshot: the resident state to 4 bytes a tensor (Adam's on-device
    # `step` scalars, torch/optim/adam.py _init_group, which the analytic count of states leaves out; the rotary
    # table), the activations within 1 %
    import json
    import pickle

    rec, setup = traced
    snap, _ = trace_snapshot(rec, setup)
    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps(snap))
    code, out, _ = cli("explain", str(path), "--model", "tiny-llama", "--batch", "2", "--seq", "64", "--precision",
                       "amp-bf16", "--device", "cuda", "--json")
    d = json.loads(out)
    got, want = d["bytes"], d["predicted"]["bytes"]
    tensors = sum(1 for r in rec.records if CATEGORIES[r.cat] in ("parameter", "buffer"))
    assert code == 0 and 0 <= got["optimizer_states"] - want["optimizer_states"] <= 4 * tensors
    assert abs(got["weights"] - want["weights"]) <= 4 * tensors
    assert abs(got["activations"] / want["activations"] - 1) < 0.01
