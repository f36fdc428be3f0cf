"""--compile-loss: torchtitan's compile.components = ['loss'] (config/job_config.py:721-727), the loss compiled and
the blocks eager, as pytorch/torchtitan#1789's DeepSeek-V3-16B job config ran it."""
from __future__ import annotations

import pytest

import trainfit
from trainfit.errors import SetupError

# the EP 1 run of pytorch/torchtitan#1789: FSDP 8, local batch 8 x 4096, per-op SAC, on 8 H100 80GB
DSV3_16B = dict(stack="torchtitan", recompute="op", dp=8, zero=3, ep=1, batch=8, seq=4096, gpu="H100-80GB")


def test_the_compiled_loss_drops_the_eager_losss_fp32_buffers():
    """Hand derivation from torch's ops (torchtitan components/loss.py cross_entropy_loss: pred.float(), then
    cross_entropy). Eager, in the loss's backward: log_softmax's saved fp32 output, nll_loss's fp32 input gradient
    and log_softmax_backward's fp32 output: 3 x 4 B per logit (the bf16 logits are not saved: `.float()` keeps no
    input). Compiled (measured on CPU, test_compile_float8.py
    test_compiled_cross_entropy_saves_the_logits_and_two_row_statistics): its bf16 input logits and two fp32 row
    statistics saved, the bf16 gradient made in one kernel: 2 x 2 B per logit + 8 B per row. The step's peak is
    the loss's backward in both: it drops by 8 B per logit less 8 B per row."""
    eager = trainfit.estimate("deepseek-v2-lite", **DSV3_16B)
    loss = trainfit.estimate("deepseek-v2-lite", compile_loss=True, **DSV3_16B)
    rows = 8 * 4096
    logits = rows * 102400  # torchtitan deepseek_v3 16B vocab_size (models/deepseek_v3/__init__.py:79)
    assert eager.memory.peak - loss.memory.peak == pytest.approx(8 * logits - 8 * rows, rel=1e-3)
    # the blocks stay eager: what the 26 MoE and 1 dense layers keep per token is unchanged
    assert loss.detail.records["activation_per_layer"] == eager.detail.records["activation_per_layer"]


@pytest.mark.parametrize("kw, says", [
    (dict(stack="hf"), "no loss-only compile"),
    (dict(stack="torchtitan", compile=True), "compiles the loss too"),
    (dict(stack="torchtitan", stack_release="2025-03"), "runs its loss eager"),
])
def test_compile_loss_is_refused_where_it_does_not_apply(kw, says):
    with pytest.raises(SetupError, match=says) as e:
        trainfit.estimate("llama-3.1-8b", batch=1, seq=2048, compile_loss=True, **kw)
    assert "\n" not in str(e.value)
