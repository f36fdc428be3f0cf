"""Cost functions of the LM loss: the logits' upcast, log_softmax + nll_loss, the labels' shift, the loss scaling."""
from __future__ import annotations

from ..activations import FP32, INDEX
from .op import REDUCE, UPCAST, Op, Shape, memory


def loss_bytes(sh: Shape) -> int:
    """The loss's logits dtype: fp32 where the stack's loss upcasts them, under autocast and in fp32."""
    return FP32 if (sh.loss_upcast or sh.autocast or sh.act == FP32) else sh.act


def lm_loss(rows: float, x: float, sh: Shape) -> list[Op]:
    """Cross-entropy over `rows` tokens' `x` logits. HF's ForCausalLMLoss and torchtitan's cross_entropy_loss upcast
    the T × V/t logits to fp32 (loss_utils.py:61, loss.py:23) and run log_softmax (two reading passes: max/sum,
    then write) + nll_loss; compiled, one kernel reads the logits."""
    a, lb = sh.act, loss_bytes(sh)
    src = "loss_utils.py:61 logits.float() + cross_entropy"
    ops = [memory("logits_fp32", x * a, x * lb, src, "loss", (0, 0), saves=False, **UPCAST)] if lb != a else []
    # fused, the loss kernel reads the logits and keeps two fp32 numbers per row (max, log-sum-exp); its backward
    # reads the logits again and writes their gradient (compile_effects.compiled_head)
    return ops + [memory("log_softmax", 2 * x * lb, x * lb, src, "loss", (x * a, 2 * FP32 * rows), kernels=1, **REDUCE),
                  memory("nll_loss", rows * (lb + INDEX), FP32, src, "loss", (0, 0), saves=False)]


def lm_loss_backward_extra(x: float, sh: Shape) -> list[Op]:
    """nll_loss's backward writes a zeroed gradient of the `x` logits before scattering -1 (aten nll_loss_backward)."""
    return [memory("nll_loss.grad", 0, x * loss_bytes(sh), "aten nll_loss_backward (zeros + scatter)", "loss", (0, 0),
                   saves=False)]


def shifted_labels(sh: Shape) -> list[Op]:
    """ForCausalLMLoss pads the labels by one and copies the shifted view (loss_utils.py:65-66
    `nn.functional.pad(labels, (0, 1), value=ignore_index)`, `labels[..., 1:].contiguous()`): constant_pad_nd fills
    the padded tensor and copies the labels in (aten PadNd.cpp constant_pad_nd: `output.fill_(value)`,
    `c_output.copy_(self)`), then the contiguous copy: 3 small kernels, no backward."""
    if not sh.shifted_labels or sh.compile:  # (compiled, inside the model's graph)
        return []
    n = sh.tokens * INDEX
    return [memory("labels_shift", 2 * n, 3 * n, "loss_utils.py:65-66 pad + shift", saves=False, kernels=3, grad=False)]


def loss_scale() -> Op:
    """The step scales the loss by a divisor (trainfit's hf step `model(**b).loss / n`, step/standard.py:181, as the
    HF Trainer divides by the accumulation steps; torchtitan train.py:530-542 `/ global_valid_tokens`): one div of a
    scalar, and its backward one (grad / n)."""
    return memory("loss_scale", FP32, FP32, "step loss / n", saves=False)
