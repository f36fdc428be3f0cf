"""Nemotron-H inference in the analytic engine (analytic/hybrid_inference.py, mamba2.py): the cache by hand, and
the prefill peak against the trace where the small matrix config does not reach (several scan chunks with padding,
MLP blocks, three Mamba blocks)."""
from __future__ import annotations

import pytest

from trainfit.analytic.engine import estimate
from trainfit.errors import SetupError
from trainfit.models.resolve import load_model
from trainfit.setup import Setup


def test_cache_is_states_per_mamba_block_and_kv_per_attention_block():
    """tiny-nemotron-h (M-M*M-: 3 Mamba-2, 1 attention, 2 MLP blocks), bf16, 2 x 128, by hand: a Mamba block keeps
    per sequence its conv state, conv_dim x kernel = (8*16 + 2*2*16) x 4 bf16 = 1,536 B, and its SSM state,
    heads x head_dim x state = 8 x 16 x 16 fp32 = 8,192 B (cache_utils.py:1226-1238); the attention block k and v,
    2 x 2 kv heads x 16 x 2 B = 128 B per token; MLP blocks nothing."""
    spec = load_model("tiny-nemotron-h")
    est = estimate(spec, Setup(batch=2, seq=128, precision="bf16", mode="infer"))
    mamba = 3 * 2 * (192 * 4 * 2 + 8 * 16 * 16 * 4)
    attention = 128 * 2 * 128
    assert est.memory.kv_cache == mamba + attention
    assert est.detail.kv_bytes_per_token == 128


@pytest.mark.parametrize("setup", [Setup(batch=2, seq=128, precision="amp-bf16", tp=2),
                                   Setup(batch=2, seq=128, precision="bf16", mode="infer", tp=2)],
                         ids=["train-tp2", "infer-tp2"])
def test_what_is_not_modelled_is_refused_in_one_line(setup):
    with pytest.raises(SetupError, match="Mamba-2") as e:
        estimate(load_model("tiny-nemotron-h"), setup)
    assert "\n" not in str(e.value)


@pytest.mark.slow
@pytest.mark.parametrize("precision,device", [("bf16", "cpu"), ("amp-bf16", "cuda"), ("fp32", "cuda")])
def test_prefill_peak_within_1_percent_of_the_trace(precision, device):
    """2 x 100 tokens in 16-token chunks: 7 chunks, the last padded; before the terms the analytic engine refused
    the family."""
    from trainfit.trace import trace_spec

    spec = load_model("tiny-nemotron-h")
    setup = Setup(batch=2, seq=100, precision=precision, device=device, mode="infer")
    traced = trace_spec(spec, setup, flops=False).memory.peak
    predicted = estimate(spec, setup).memory.peak
    assert abs(predicted - traced) / traced <= 0.01, (predicted, traced)


@pytest.mark.slow
def test_scan_flops_against_the_trace():
    """The Mamba-2 mixers' FLOPs beyond their projections (mamba2.scan_flops_per_token: the scan's einsums over the
    positions padded to whole chunks, and the conv) against the trace's count per module: tiny-nemotron-h at 2 x 100
    (7 chunks of 16, the last padded), its 3 Mamba blocks."""
    from trainfit.analytic.mamba2 import scan_flops_per_token
    from trainfit.trace import trace_spec

    spec = load_model("tiny-nemotron-h")
    setup = Setup(batch=2, seq=100, precision="bf16", device="cuda", mode="infer")
    by_module = trace_spec(spec, setup, flops=True).detail.records["flops_by_module"]
    traced = sum(by_module[f"model.layers.{i}.mixer"] for i, k in enumerate(spec.hybrid.pattern) if k == "mamba")
    predicted = 3 * scan_flops_per_token(spec, 100) * 2 * 100
    assert abs(predicted - traced) / traced <= 0.01, (predicted, traced)


@pytest.mark.slow
@pytest.mark.parametrize("model,precision,recompute,device", [
    ("small", "fp32", "none", "cuda"), ("small", "bf16", "full", "cpu"), ("tiny-nemotron-h", "fp32", "none", "cpu"),
    ("tiny-nemotron-h", "amp-bf16", "none", "cuda"),
    # CUDA's autocast casts the einsums' operands before their copies (mamba2.einsum_copy_bytes): +1.35 % without
    pytest.param("small", "amp-bf16", "none", "cuda", marks=pytest.mark.heavy)])
def test_training_past_one_chunk_within_1_percent_of_the_trace(model, precision, recompute, device):
    """Training with the sequence over several chunks (mamba2.scan_end_train, einsum_copies: x·dt's and the chunk
    states' operand copies, which one chunk does not make; under autocast, mamba2.scan_autocast_train: the chunk
    states' 16-bit copy; the families matrix's 2 x 128 is one chunk): its
    Nemotron-H at 2 x 256 (two chunks of 128), and tiny-nemotron-h at 2 x 128 (8 chunks of 16; 2 groups for 8 heads;
    MLP and attention blocks between 3 Mamba blocks, each kind with its own norm's saved tensors)."""
    from tests.analytic.test_vs_trace_families import CONFIGS, assert_analytic_near_trace, shrink
    from trainfit.models.hf_config import spec_from_config

    if model == "small":
        spec, seq = spec_from_config(shrink(CONFIGS["nemotron_h"]), "small-nemotron_h"), 256
    else:
        spec, seq = load_model(model), 128
    setup = Setup(batch=2, seq=seq, precision=precision, recompute=recompute, device=device, optimizer="adamw")
    assert_analytic_near_trace(spec, setup, "nemotron_h", 0.01)


@pytest.mark.slow
@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_amp_training_at_the_scan_end_within_1_percent_of_the_trace(device):
    """amp-bf16 training with Nemotron-H 8B's flags (state 128: the scan's end, with Y_off, the sum and its copy, tops
    the moment inside the last bmm, with C's fp32 copy: mamba2.scan_autocast_train; the matrix's 47B flags, state
    256, peak inside it on CPU, at the scan's end under CUDA's autocast, whose einsum copies C in 16 bits:
    mamba2.einsum_copy_bytes), shrunk as the families matrix does, 2 x 128 (one chunk). CPU under full recomputation
    (the re-run forward in the backward)."""
    import json
    from importlib import resources

    from tests.analytic.test_vs_trace_families import assert_analytic_near_trace, shrink
    from trainfit.models.hf_config import spec_from_config

    cfg = json.loads(resources.files("trainfit.models.catalog").joinpath("nemotron-h-8b.json").read_text())
    spec = spec_from_config(shrink(cfg), "small-nemotron-h-8b")
    setup = Setup(batch=2, seq=128, precision="amp-bf16", recompute="full" if device == "cpu" else "none",
                  device=device, optimizer="adamw")
    assert_analytic_near_trace(spec, setup, "nemotron_h", 0.01)


@pytest.mark.slow
@pytest.mark.parametrize("precision,device", [("amp-bf16", "cuda"), ("fp32", "cpu")])
def test_prefill_past_one_chunk_within_1_percent_of_the_trace(precision, device):
    """The prefill with the sequence over several chunks: Nemotron-H (47B's flags, state 256) shrunk as the families
    matrix does, at 2 x 256 (two chunks of 128), the high point inside the scan's last bmm, which multiplies a
    contiguous copy of the chunk states (mamba2.mixer_prefill; one chunk makes none). Without that copy the analytic
    peak read +2.34 % (amp-bf16, CUDA semantics, with C's fp32 copy) and -1.83 % (fp32, CPU)."""
    from tests.analytic.test_vs_trace_families import CONFIGS, assert_analytic_near_trace, shrink
    from trainfit.models.hf_config import spec_from_config

    spec = spec_from_config(shrink(CONFIGS["nemotron_h"]), "small-nemotron_h")
    setup = Setup(batch=2, seq=256, precision=precision, device=device, mode="infer")
    assert_analytic_near_trace(spec, setup, "nemotron_h", 0.01)
