"""--loss-fusion on --stack megatron: Transformer Engine's fused cross-entropy against a hand count of the tensors its
code allocates and saves, and the kernels' bytes against a hand count of their passes. The native implementation is
measured against Megatron-Core's own step on CPU (tests/stacks/test_megatron_cpu.py, the *-ce-native cases, heavy).
"""
from __future__ import annotations

import trainfit
from trainfit.analytic.ops import Shape
from trainfit.analytic.ops.loss import lm_loss, lm_loss_backward_extra

BASE = dict(stack="megatron", precision="bf16-master", dp=8, tp=2, sequence_parallel=True, zero=1, seq=4096, batch=1)


def test_te_holds_the_logits_not_their_fp32_softmax():
    """Llama-3.1-8B, TP 2, 4096 tokens: x = 4096 × 128256 / 2 logits per rank. Unfused (tensor_parallel/
    cross_entropy.py), the forward's end holds the bf16 logits (2x), their fp32 copy turned softmax (4x, saved) and the
    target mask and masked targets (1 + 8 bytes per token, saved). TE (TransformerEngine v2.9 cross_entropy.py:50-61,
    triton/cross_entropy.py:284-316) holds the bf16 logits, the gradient written into them (2x, saved), and beside
    them loss_1d (4 bytes per token, the returned loss, which the unfused loss returns too), m_d_X_y (3 fp32 per
    token) and its all-gather over the 2 TP ranks (6 fp32 per token). The peak is the forward's end in both."""
    t, x = 4096, 4096 * 128256 // 2
    none = trainfit.estimate("llama-3.1-8b", gpu="H100-80GB", **BASE).memory
    te = trainfit.estimate("llama-3.1-8b", gpu="H100-80GB", **BASE, loss_fusion="te").memory
    unfused = 2 * x + 4 * x + (1 + 8) * t
    fused = 2 * x + 3 * 4 * t + 2 * 3 * 4 * t
    assert none.peak_phase == te.peak_phase == "forward_end"
    assert none.phases["forward_end"] - te.phases["forward_end"] == unfused - fused


def test_native_backward_holds_inductors_fp32_copy():
    """native: the forward's buffers are the unfused ones; its compiled backward (fused_cross_entropy.py:64-84) writes
    the updated softmax into a new fp32 buffer and the bf16 gradient into another (inductor's code), where the
    unfused backward makes only the bf16 cast: 4x more at the backward's start, the same forward."""
    x = 4096 * 128256 // 2
    none = trainfit.estimate("llama-3.1-8b", gpu="H100-80GB", **BASE).memory
    native = trainfit.estimate("llama-3.1-8b", gpu="H100-80GB", **BASE, loss_fusion="native").memory
    assert native.phases["forward_end"] == none.phases["forward_end"]
    assert native.phases["backward"] - none.phases["backward"] == 4 * x


def test_fused_kernels_bytes():
    """The HBM passes over the x logits (rows aside): TE's two forward kernels read the bf16 logits twice and write
    the gradient over them once (triton/cross_entropy.py:297-338), its backward scales it in place (:361-369): 5 × 2x.
    native: the upcast reads 2x and writes 4x, subtract-exp-sum and the div_ each read and write 4x
    (fused_cross_entropy.py:12-61); the compiled backward reads the softmax and writes its fp32 copy, the update back
    and the bf16 gradient (4x read, 4x + 4x + 2x written): 6 + 16 + 14 bytes per logit."""
    rows, v = 2048.0, 64128.0
    x = rows * v
    for impl, per_logit in (("te", 5 * 2), ("native", 6 + 16 + 14)):
        sh = Shape(batch=1, seq=2048, act=2, loss_fusion=impl)
        ops = lm_loss(rows, x, sh) + lm_loss_backward_extra(x, sh)
        moved = sum(o.reads + o.writes for o in ops)
        assert per_logit * x <= moved < per_logit * x + 64 * rows, (impl, moved / x)


def test_te_frees_16_bit_logits_not_an_fp32_copy():
    """The fit rule's pinned block (fit_rule.pinned_block: the largest block freed before the backward's peak) is the
    loss's largest tensor: unfused, the fp32 copy turned softmax (cross_entropy.py:28 `.float()`, 4x); TE makes no
    fp32 copy (triton/cross_entropy.py:284-316 allocates 3 fp32 per row) and frees the bf16 logits that hold their
    gradient (2x) after the output layer's backward. Both larger than the layer's MLP block (4096 × 14336 bytes ×
    2 / 2), and Megatron's flat buffers have no segment slack, so required − peak is that block."""
    x = 4096 * 128256 // 2
    none = trainfit.estimate("llama-3.1-8b", gpu="H100-80GB", **BASE).memory
    te = trainfit.estimate("llama-3.1-8b", gpu="H100-80GB", **BASE, loss_fusion="te").memory
    assert none.required - none.peak == 4 * x
    assert te.required - te.peak == 2 * x
