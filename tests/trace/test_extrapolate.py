"""Layer extrapolation (trace/extrapolate.py) must equal the full trace, field by field."""
from __future__ import annotations

import warnings

import pytest
from trace_configs import tiny_spec  # tests/trace is on sys.path (rootdir-less import)

from trainfit.setup import Setup
from trainfit.trace.engine import trace_spec
from trainfit.trace.extrapolate import trace_extrapolated

warnings.filterwarnings("ignore", message=".*gradient_checkpointing_enable.*")

CASES = [
    ("llama", "amp-bf16", "none", "adamw", 1),
    ("llama", "bf16-master", "full", "momentum", 2),
    ("gpt2", "fp32", "full", "sgd", 1),
    pytest.param("gemma2", "amp-bf16", "none", "adamw", 2, marks=pytest.mark.heavy),  # period 2: sliding / global
    # layers (~14 s: its 6-layer trace; tests/stacks' layer:2 case keeps a period-2 extrapolation in the default run)
    ("qwen2", "bf16", "full", "adamw", 1),
    ("bert", "amp-bf16", "none", "momentum", 1),
    ("mixtral", "fp32", "none", "adamw", 1),
]


def _same(extra, full):
    assert extra is not None, "extrapolation refused (a linearity check failed)"
    assert extra.memory == full.memory
    assert extra.flops == full.flops
    assert extra.params == full.params


@pytest.mark.parametrize("family,precision,recompute,optimizer,grad_accum", CASES,
                         ids=["-".join(map(str, c)) for c in CASES])
def test_extrapolation_equals_full_trace(family, precision, recompute, optimizer, grad_accum):
    layers = 12
    spec = tiny_spec(family, layers=layers)
    setup = Setup(batch=2, seq=32, precision=precision, optimizer=optimizer, recompute=recompute,
                  grad_accum=grad_accum, device="cpu")
    full = trace_spec(spec, setup, extrapolate=False)
    extra = trace_extrapolated(spec, setup, min_periods=1)
    _same(extra, full)
    assert extra.detail["extrapolated_from_layers"][0] == (6 if family == "gemma2" else 3)


@pytest.mark.slow
def test_extrapolation_equals_full_trace_llama2_7b():
    from trainfit.models.hf_config import spec_from_config

    cfg = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
           "num_key_value_heads": 32, "intermediate_size": 11008, "vocab_size": 32000,
           "max_position_embeddings": 4096}
    spec = spec_from_config(cfg, name="llama-2-7b")
    setup = Setup(batch=1, seq=4096, precision="amp-bf16", optimizer="adamw", device="cpu")
    full = trace_spec(spec, setup, extrapolate=False)
    extra = trace_spec(spec, setup)
    assert "extrapolated_from_layers" in extra.detail
    _same(extra, full)
