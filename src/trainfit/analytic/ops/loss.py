"""Cost functions of the LM loss: the logits' upcast, log_softmax + nll_loss, the labels' shift, the loss scaling."""
from __future__ import annotations

from dataclasses import replace

from ..activations import FP32, INDEX
from .op import REDUCE, UPCAST, Op, Shape, memory


def loss_bytes(sh: Shape) -> int:
    """The loss's logits dtype: fp32 where the stack's loss upcasts them, under autocast and in fp32."""
    return FP32 if (sh.loss_upcast or sh.autocast or sh.act == FP32) else sh.act


def lm_loss(rows: float, x: float, sh: Shape) -> list[Op]:
    """Cross-entropy over `rows` tokens' `x` logits. HF's ForCausalLMLoss and torchtitan's cross_entropy_loss upcast
    the T × V/t logits to fp32 (loss_utils.py:61, loss.py:23) and run log_softmax (two reading passes: max/sum,
    then write) + nll_loss; compiled, one kernel reads the logits."""
    if sh.loss_fusion == "xentropy":
        return xentropy_ce(rows, x, sh)
    if sh.loss_fusion:
        return megatron_fused_ce(rows, x, sh)
    a, lb = sh.act, loss_bytes(sh)
    src = "loss_utils.py:61 logits.float() + cross_entropy"
    ops = [memory("logits_fp32", x * a, x * lb, src, "loss", (0, 0), saves=False, **UPCAST)] if lb != a else []
    # fused, the loss kernel reads the logits and keeps two fp32 numbers per row (max, log-sum-exp); its backward
    # reads the logits again and writes their gradient (compile_effects.compiled_head)
    return ops + [memory("log_softmax", 2 * x * lb, x * lb, src, "loss", (x * a, 2 * FP32 * rows), kernels=1, **REDUCE),
                  memory("nll_loss", rows * (lb + INDEX), FP32, src, "loss", (0, 0), saves=False)]


def lm_loss_backward_extra(x: float, sh: Shape) -> list[Op]:
    """nll_loss's backward writes a zeroed gradient of the `x` logits before scattering -1 (aten nll_loss_backward);
    Megatron's fused cross-entropy has its own backward (megatron_fused_ce_backward)."""
    if sh.loss_fusion == "xentropy":
        return xentropy_ce_backward(x, sh)
    if sh.loss_fusion:
        return megatron_fused_ce_backward(x, sh)
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


def megatron_fused_ce(rows: float, x: float, sh: Shape) -> list[Op]:
    """Megatron's fused vocab-parallel cross-entropy forward over `rows` tokens' `x` logits (--loss-fusion; what each
    saves: analytic/megatron_loss.py). Their backward is megatron_fused_ce_backward, so none has a generic one.
    native (megatron-core 0.16.1 fusions/fused_cross_entropy.py, each function one torch.compile graph; kernels read
    off inductor's code for it): calculate_logits_max, the fp32 copy and its row max in one reduction (reads the
    16-bit logits, writes the fp32 copy); calculate_predicted_logits, subtract-max, exp in place and the row sum in
    one reduction that writes back (the target gather and masks on rows beside it); calculate_cross_entropy_loss, the
    div_ by the sum in place (and log-sum minus target). NB: on CUDA inductor may split the second graph's row work
    (masks, gather) into a kernel of its own: one launch more, bytes of rows only.
    te (TransformerEngine v2.9 triton/cross_entropy.py:266-342): loss_1d and m_d_X_y zeroed (two fills of rows),
    online_softmax_kernel (reads the logits in their dtype, writes 3 fp32 per row), the m/d/X_y all-gather over TP
    (NB: its few bytes per row not timed as a collective), cross_entropy_kernel (reads the logits again, writes the
    gradient over them in their dtype)."""
    a = sh.act
    if sh.loss_fusion == "te":
        src = "TransformerEngine v2.9 triton/cross_entropy.py:266-342 cross_entropy_forward"
        return [memory("te_ce.zeros", 0, 4 * FP32 * rows, src, "loss", (0, 0), saves=False, grad=False, kernels=2),
                memory("te_ce.online_softmax", x * a, 3 * FP32 * rows, src, "loss", (x * a, 3 * FP32 * rows),
                       saves=False, grad=False, access="reduce"),
                memory("te_ce.loss_and_grad", x * a + 3 * FP32 * rows, x * a + FP32 * rows, src, "loss",
                       (x * a, x * a), saves=False, grad=False)]
    src = "megatron-core 0.16.1 fusions/fused_cross_entropy.py:12-61 (torch.compile'd)"
    return [memory("ce.logits_max", x * a, x * FP32 + FP32 * rows, src, "loss", (x * a, x * FP32), saves=False,
                   grad=False, access="upcast"),
            memory("ce.exp_sum", x * FP32 + rows * (FP32 + INDEX), x * FP32 + rows * (3 * FP32 + INDEX + 1), src,
                   "loss", (x * FP32, x * FP32), saves=False, grad=False, access="reduce"),
            memory("ce.div", x * FP32 + 2 * FP32 * rows, x * FP32 + FP32 * rows, src, "loss", (x * FP32, x * FP32),
                   saves=False, grad=False)]


def megatron_fused_ce_backward(x: float, sh: Shape) -> list[Op]:
    """The fused cross-entropy's backward over `x` logits. native: calculate_gradients compiled to one kernel (read off
    inductor's code: `cpp_fused__to_copy_..._index_put_mul_...`) reading the saved fp32 softmax and writing its
    functional fp32 copy, the bf16 gradient and the update back into the saved softmax; autograd then casts the bf16
    gradient to the logits' dtype when that is not bf16 (engine.cpp validate_outputs). te: element_mul_kernel scales
    the gradient written into the logits in place (triton/cross_entropy.py:345-371; the loss's gradient is a tensor,
    not the 1.0 its check skips)."""
    a = sh.act
    if sh.loss_fusion == "te":
        return [memory("te_ce.element_mul", x * a, x * a, "TransformerEngine v2.9 triton/cross_entropy.py:345-371",
                       "loss", (x * a, x * a), saves=False, grad=False)]
    src = "megatron-core 0.16.1 fusions/fused_cross_entropy.py:64-84 (torch.compile'd)"
    ops = [memory("ce.gradients", x * FP32, x * (2 * FP32 + 2), src, "loss", (x * FP32, x * 2), saves=False,
                  grad=False)]
    # NB: fp16 logits (2 bytes, as bf16) get the bf16 gradient cast to fp16 too: that pass is not timed (under)
    if a != 2:
        ops.append(memory("ce.grad_cast", x * 2, x * a, "autograd engine.cpp validate_outputs", "loss", (0, 0),
                          saves=False, grad=False, access="upcast" if a > 2 else "vector"))
    return ops


XENTROPY = "flash-attn v1.0.9 csrc/xentropy/xentropy_kernel.cu"


def xentropy_ce(rows: float, x: float, sh: Shape) -> list[Op]:
    """flash-attn's fused softmax cross-entropy forward (--loss xentropy; memory: analytic/loss.py xentropy_head) over
    `rows` tokens' `x` logits in their own dtype: cunn_SoftMaxXEntropyForward (xentropy_kernel.cu:430-470), one
    block a row, reduces the row's max, then its sum of exp(x - max) (two reading passes, :452 and :466), and writes
    the fp32 loss and log-sum-exp of each row; then losses.masked_fill_ of the ignored labels
    (losses/cross_entropy.py:38) and the mean's sum and division (:130). NB: the second pass over a row (its 16-bit
    logits, ~100 KiB at a 50k vocabulary) may be served from L2: timed as read from memory (slower)."""
    a = sh.act
    src = f"{XENTROPY}:430-470 cunn_SoftMaxXEntropyForward; flash_attn/losses/cross_entropy.py:38,130"
    return [memory("xentropy.forward", 2 * x * a + rows * INDEX, 2 * FP32 * rows, src, "loss", (0, 0), saves=False,
                   grad=False, **REDUCE),
            memory("xentropy.mask_mean", rows * (FP32 + INDEX), rows * FP32 + FP32, src, "loss", (0, 0),
                   saves=False, grad=False, kernels=3)]


def xentropy_ce_backward(x: float, sh: Shape) -> list[Op]:
    """Its backward: grad_loss masked (cross_entropy.py:93-94: the mean's gradient expanded, made contiguous and
    masked, a few row-sized kernels) and cunn_SoftMaxXEntropyBackward (xentropy_kernel.cu:596-630), which reads the
    logits and the log-sum-exp and writes the gradient into a new tensor of the logits' dtype (:697, inplace_backward
    False)."""
    a, rows = sh.act, sh.tokens  # (the LM head scores every token: head.head_backward_extra)
    src = f"{XENTROPY}:596-630,697 cunn_SoftMaxXEntropyBackward; flash_attn/losses/cross_entropy.py:93-94"
    return [memory("xentropy.grad_loss", rows * (FP32 + INDEX), rows * FP32, src, "loss", (0, 0), saves=False,
                   grad=False, kernels=2),
            memory("xentropy.backward", x * a + rows * (2 * FP32 + INDEX), x * a, src, "loss", (0, 0), saves=False,
                   grad=False)]


def metric_losses(rows: float, x: float, sh: Shape, passes: int) -> list[Op]:
    """The loop's train metrics over the held logits ([loss] metric_passes, stacks/*.toml): `passes` torch
    cross-entropy forwards on the `x` logits of `rows` tokens, without grad, under the loop's autocast (Composer
    0.17.2 trainer.py:2176-2188 _eval_train_metrics inside _get_precision_context; metrics/nlp.py:100,121
    LanguageCrossEntropy's CrossEntropyLoss(reduction='sum'), which LanguagePerplexity inherits, :188; models/
    huggingface.py:446 eval_forward reuses the held outputs, no second forward): each the fp32 copy (cross_entropy
    is on CUDA autocast's float32 list: torch.amp docs, "CUDA Ops that can autocast to float32"), log_softmax and
    nll_loss of lm_loss."""
    plain = replace(sh, loss_fusion="", autocast=True)
    return [op for _ in range(passes) for op in lm_loss(rows, x, plain)]
