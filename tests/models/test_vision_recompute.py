"""--recompute full for vision models: the analytic walk of transformers' non-reentrant checkpointing of every
ViTLayer against the trace engine (the real model with activation_checkpointing_enable, on fake tensors) and a
real CPU step; the recompute FLOPs against a hand count; the refusals of what transformers cannot checkpoint."""
from __future__ import annotations

import pytest

from trainfit.api import Request, run_engines

torch = pytest.importorskip("torch", reason="the checks build the transformers models")
pytest.importorskip("transformers", reason="the checks build the transformers models")


# CUDA semantics (512-byte blocks), as tests/models/test_vision.py; bound: fp32 exact, under autocast one block
@pytest.mark.parametrize("precision,bound", [("fp32", 0), ("amp-bf16", 1024)])
def test_checkpointed_vit_against_the_trace(precision, bound):
    full = Request(model="tiny-vit", batch=4, precision=precision, optimizer="adamw", recompute="full")
    analytic, traced = run_engines(full, "all")
    assert traced.engine == "trace"
    assert abs(analytic.memory.peak - traced.memory.peak) <= bound
    for phase, bytes_ in traced.memory.phases.items():
        assert abs(analytic.memory.phases[phase] - bytes_) <= max(bound, 0.003 * bytes_), phase
    if precision == "fp32":  # the checkpointing is real: the traced step without it holds more at its peak
        eager = run_engines(Request(model="tiny-vit", batch=4, precision=precision, optimizer="adamw"), "trace")[-1]
        assert traced.memory.peak < 0.85 * eager.memory.peak


@pytest.mark.heavy
def test_checkpointed_vit_trace_equals_a_real_cpu_step():
    """A real CPU step (measure) with transformers' checkpointing: the trace within 0.5 %, the analytic walk within
    1 % (oneDNN's per-op scratch is not counted, analytic/vision.py NB)."""
    req = Request(model="tiny-vit", batch=4, precision="fp32", optimizer="momentum", device="cpu", recompute="full")
    analytic = run_engines(req, "analytic")[-1]
    traced = run_engines(req, "trace")[-1]
    measured = run_engines(req, "measure")[-1]
    assert measured.engine == "measure"
    assert abs(traced.memory.peak - measured.memory.peak) <= 0.005 * measured.memory.peak
    assert abs(analytic.memory.peak - measured.memory.peak) <= 0.01 * measured.memory.peak


def test_recompute_flops_and_time_of_vit_b16():
    """Hand count: each ViTLayer's forward is rerun up to fc2 (its inputs packed before its kernel: the early stop),
    so per layer q, k, v, o (4 · 2·N·h²), fc1 (2·N·h·4h) and SDPA (4·N²·h), N = 197 tokens, h = 768, 12 layers."""
    b, n, h, layers = 8, 197, 768, 12
    req = Request(model="vit-b-16", batch=b, precision="amp-bf16", recompute="full", gpu="A100-80GB")
    est = run_engines(req, "analytic")[-1]
    per_layer = 4 * 2 * n * h * h + 2 * n * h * 4 * h + 4 * n * n * h
    assert est.flops.recompute == b * layers * per_layer
    assert est.flops.step == est.flops.forward + est.flops.backward + est.flops.recompute
    plain = run_engines(Request(model="vit-b-16", batch=b, precision="amp-bf16", gpu="A100-80GB"), "analytic")[-1]
    st, st0 = est.detail.step_time, plain.detail.step_time
    assert st.compute == st0.compute  # the step's own kernels, unchanged
    assert st.step_seconds == pytest.approx(st.compute + st.recompute + st.optimizer + st.host_issue + st.straggler)
    # the rerun is most of a forward: at least its matmul FLOPs' share of the step's compute (its LayerNorms, GELUs
    # and casts are memory-bound on top), at most a forward's share (the backward does twice the forward's work)
    share = est.flops.recompute / (est.flops.forward + est.flops.backward)
    assert share < st.recompute / st.compute < 1 / 3
    assert est.memory.peak < plain.memory.peak


@pytest.mark.parametrize("model", ["resnet-50", "convnext-tiny"])
def test_recompute_refused_where_transformers_cannot_checkpoint(cli, model):
    code, _, err = cli("estimate", model, "--recompute", "full")
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    assert f"--recompute full does not apply to {model}" in err and "activation checkpointing" in err


@pytest.mark.parametrize("flags,says", [(["--recompute", "layer:2"], "use --recompute full or none"),
                                        (["--compile"], "--compile does not apply to vit-b-16")])
def test_vit_refuses_what_it_cannot_model(cli, flags, says):
    code, _, err = cli("estimate", "vit-b-16", *flags)
    assert code == 2 and len(err.strip().splitlines()) == 1 and says in err
