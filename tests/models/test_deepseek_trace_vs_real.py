"""The trace engine against a real CPU training step (trainfit.measure) on the DeepSeek test configs: MLA attention
(q/kv down- and up-projections, decoupled RoPE, SDPA math path with v narrower than q/k) and the shared-expert MoE
with its first dense layer. Peaks within 0.5%, as tests/trace/test_trace_vs_real.py for the other families
(~7 s a case: heavy)."""
from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from trainfit.measure import measure  # noqa: E402
from trainfit.models.resolve import load_model  # noqa: E402
from trainfit.setup import Setup  # noqa: E402
from trainfit.trace import trace_spec  # noqa: E402

CASES = [("tiny-deepseek", "amp-bf16", "none"), ("tiny-deepseek", "fp32", "full"),
         ("tiny-deepseek-v2", "fp32", "none"), ("tiny-deepseek-v2", "amp-bf16", "full")]


@pytest.mark.heavy
@pytest.mark.parametrize("name,precision,recompute", CASES, ids=["-".join(c) for c in CASES])
def test_trace_peak_equals_real_cpu_step(name, precision, recompute):
    spec = load_model(name)
    setup = Setup(batch=2, seq=32, precision=precision, recompute=recompute, optimizer="adamw", device="cpu")
    traced = trace_spec(spec, setup).memory.peak
    real = measure(spec, setup, steps=0).peak
    assert abs(traced - real) <= 0.005 * real, (traced, real)
