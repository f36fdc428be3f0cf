"""--loss xentropy (flash-attn's fused softmax cross-entropy, what llm-foundry's MPT trains with) and the loop of
Composer 0.17.2 (stacks/hf.toml [releases."2024-01-llm-foundry"]), by hand from the code they ran:
flash_attn/losses/cross_entropy.py at v1.0.9 saves the 16-bit logits and an fp32 log-sum-exp per token
(ctx.save_for_backward(logits, lse, labels)) and makes no fp32 copy; its backward writes the gradient into a new
tensor of the logits' dtype (csrc/xentropy/xentropy_kernel.cu:697, inplace_backward False). Composer keeps the logits
(state.outputs) through the backward and recomputes the loss on them twice for its train metrics."""
from __future__ import annotations

import pytest

from trainfit import api
from trainfit.analytic.engine import transient_blocks
from trainfit.analytic.loss import head_and_loss
from trainfit.analytic.memory import train_memory
from trainfit.analytic.precision import state_bytes
from trainfit.engines import analytic
from trainfit.hardware import get_gpu
from trainfit.setup import Setup

V, T = 128256, 4096  # llama-3.2-1b's vocabulary; batch 1 x 4096


def _setup(**kw):
    return Setup(**{"stack": "hf", "precision": "bf16", "batch": 1, "seq": T, **kw})


def _head(**kw):
    setup = _setup(**kw)
    return head_and_loss(api.load_spec("llama-3.2-1b"), setup, state_bytes(setup), T)


def test_xentropy_saves_the_bf16_logits_instead_of_an_fp32_log_softmax():
    full, fused = _head(), _head(loss="xentropy")
    # saved: the bf16 logits (2 B a logit) and one fp32 log-sum-exp a token, where the upcast loss saves the fp32
    # log-softmax output (4 B a logit)
    assert fused.saved - full.saved == pytest.approx((2 - 4) * V * T + 4 * T)
    # its backward: one new bf16 gradient of the logits and the fp32 grad_loss per token, where the upcast loss makes
    # the log-softmax output's and the logits' fp32 gradients (4 + 4 B a logit)
    assert fused.backward_transient == pytest.approx(2 * V * T + 4 * T)
    assert full.backward_transient == pytest.approx(8 * V * T)


def test_xentropy_pins_the_16_bit_gradient_not_the_fp32_logits():
    spec = api.load_spec("llama-3.2-1b")
    for loss, per_logit in (("full", 4), ("xentropy", 2)):
        setup = _setup(loss=loss)
        assert max(transient_blocks(spec, setup, train_memory(spec, setup))) == V * T * per_logit


def test_composer_loop_holds_the_logits_and_drops_the_hidden_states():
    fused = _head(loss="xentropy")
    composer = _head(loss="xentropy", stack_release="2024-01-llm-foundry")
    # the same bf16 logits, saved once, live to the step's end (HeadBytes.labels: what the loop holds)
    assert composer.saved == fused.saved
    assert composer.labels - fused.labels == pytest.approx(2 * V * T)
    # the loss runs after the model's forward has returned: under autocast its final hidden states are gone
    amp = dict(precision="amp-bf16")
    held = _head(loss="xentropy", **amp).forward_transient
    gone = _head(loss="xentropy", stack_release="2024-01-llm-foundry", **amp).forward_transient
    assert held - gone == pytest.approx(4 * 2048 * T)  # the fp32 residual stream's last hidden states


def test_composer_train_metrics_add_two_cross_entropy_passes_to_the_forward():
    spec, gpu = api.load_spec("llama-3.2-1b"), get_gpu("H100-80GB")
    plain = analytic(spec, _setup(loss="xentropy"), gpu).time
    composer = analytic(spec, _setup(loss="xentropy", stack_release="2024-01-llm-foundry"), gpu).time
    # each pass reads the bf16 logits, writes their fp32 copy, reads it twice and writes the log-softmax (2 + 4 +
    # 8 + 4 = 18 B a logit): two passes move 36 B a logit, at best at the GPU's memory bandwidth
    floor = 2 * 18 * V * T / gpu.memory_bandwidth
    assert floor <= composer.step_seconds - plain.step_seconds < 3 * floor
