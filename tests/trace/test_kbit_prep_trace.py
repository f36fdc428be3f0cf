"""--kbit-prep peft in the trace engine, which runs peft's own prepare_model_for_kbit_training on the quantised
model (trainfit/step/quant.py prepare_kbit): the parameters it upcasts against a hand count from the model's sizes,
and the analytic engine (analytic/kbit_prep.py) against the trace."""
from __future__ import annotations

import warnings

import pytest
from trace_configs import tiny_spec  # tests/trace is on sys.path (rootdir-less import)

from trainfit.analytic.engine import estimate
from trainfit.setup import Setup
from trainfit.trace import trace_spec

pytest.importorskip("peft")
pytest.importorskip("bitsandbytes")
warnings.filterwarnings("ignore", message=".*gradient_checkpointing_enable.*")


def _setup(prep: str) -> Setup:
    return Setup(batch=1, seq=64, precision="bf16", optimizer="adamw", device="cpu", lora_rank=8, quant="nf4",
                 recompute="full", kbit_prep=prep)


@pytest.mark.slow
def test_trace_upcasts_what_peft_does_and_analytic_follows():
    spec = tiny_spec("llama")
    none, peft = trace_spec(spec, _setup("none")), trace_spec(spec, _setup("peft"))
    # peft casts every bf16 parameter bitsandbytes left (embedding, untied head, 2 norms a layer + the final one)
    # to fp32: 2 more bytes each
    unquantised = spec.vocab * spec.hidden * (1 if spec.tied_embeddings else 2) + (2 * spec.layers + 1) * spec.hidden
    assert peft.memory.weights - none.memory.weights == 2 * unquantised
    an = estimate(spec, _setup("peft")).memory.peak
    assert abs(an - peft.memory.peak) <= 0.01 * peft.memory.peak, (an, peft.memory.peak)
    # amp-bf16 (fp32 weights: nothing to upcast; the norms' fp32 outputs make the quantised Linears' fp32 too),
    # which the analytic engine models under full recompute (analytic/quant.py check)
    # (the hf stack's default preparation, peft's: an explicit --kbit-prep is refused where it changes nothing)
    amp = _setup("peft").with_(precision="amp-bf16", kbit_prep=None)
    traced, an = trace_spec(spec, amp).memory.peak, estimate(spec, amp).memory.peak
    assert abs(an - traced) <= 0.01 * traced, (an, traced)
