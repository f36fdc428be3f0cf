"""The LM loss of transformers 4.40 under Answer.AI's fsdp_qlora loop (stacks/hf.toml [releases."2024-03-fsdp-qlora"]),
by hand from the code it ran: modeling_llama.py:1228 rebinds `logits = logits.float()` (the bf16 logits dropped),
:1233 takes the loss on `logits[..., :-1, :].contiguous()` (a second fp32 copy, freed once log_softmax has run), and
:1247-1249 returns the fp32 logits, which train.py:872-894 keeps (`output`) through loss.backward()."""
from __future__ import annotations

import pytest

from trainfit import api
from trainfit.analytic.loss import head_and_loss
from trainfit.analytic.precision import state_bytes
from trainfit.setup import Setup

V, T = 128256, 4096  # llama-3.2-1b's vocabulary; batch 1 x 4096


def _head(**kw):
    setup = Setup(stack="hf", precision="bf16", batch=1, seq=T, **kw)
    return head_and_loss(api.load_spec("llama-3.2-1b"), setup, state_bytes(setup), T)


def test_fsdp_qlora_release_holds_the_fp32_logits_and_copies_them_shifted():
    now, then = _head(), _head(stack_release="2024-03-fsdp-qlora")
    # the fp32 logits (4 B a logit) live from the forward to the end of the step: saved, and among the step's inputs
    assert then.saved - now.saved == pytest.approx(4 * V * T)
    assert then.labels - now.labels == pytest.approx(4 * V * T)
    # the forward's high point beside them: the shifted fp32 copy (4 B) instead of transformers 5's bf16 logits and
    # their fp32 copy (2 + 4 B); the log-softmax output (4 B, saved) in both
    assert then.forward_transient - now.forward_transient == pytest.approx((4 - 6) * V * T)
    # the loss's backward is the same code (log_softmax's and the slice's fp32 gradients)
    assert then.backward_transient == now.backward_transient
