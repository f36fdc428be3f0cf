"""The analytic engine against real CPU training steps (truth: trainfit.measure, PyTorch's allocation records).

Issue 2's first accuracy check: within 5% on a handful of families, fp32 and amp-bf16, with and without
recompute. The full matrix is bench/targets/accuracy.py (BENCHMARKS.md).
"""
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from trainfit.analytic.engine import estimate  # noqa: E402
from trainfit.measure import measure  # noqa: E402
from trainfit.models.resolve import load_model  # noqa: E402
from trainfit.setup import Setup  # noqa: E402

CASES = [
    ("tiny-llama", "fp32", "none"),
    ("tiny-llama", "amp-bf16", "full"),
    ("tiny-gpt2", "fp32", "none"),  # dropout everywhere, gelu_new, SDPA math path on CPU
    ("tiny-bert", "fp32", "full"),  # encoder, post-norm, MLM head
    ("tiny-neox", "amp-bf16", "none"),  # parallel residual, fused qkv
    ("tiny-gemma2", "fp32", "none"),  # eager attention with softcapping, 4 norms per layer
]


@pytest.mark.slow
@pytest.mark.parametrize("name,precision,recompute", CASES)
def test_analytic_peak_within_5_percent_of_a_real_cpu_step(name, precision, recompute):
    spec = load_model(name)
    setup = Setup(batch=2, seq=64, precision=precision, recompute=recompute, device="cpu")
    real = measure(spec, setup, steps=0).peak
    predicted = estimate(spec, setup).memory.peak
    assert abs(predicted - real) / real < 0.05, (predicted, real)
