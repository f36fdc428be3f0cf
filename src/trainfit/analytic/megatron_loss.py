"""Megatron's vocab-parallel cross-entropy on the last stage, per --loss-fusion (Setup.loss_fusion): what it saves for
its backward and what it holds at the forward's and the backward's high points, read from the implementation's facts
(stacks/megatron.toml [loss_fusion], each cited there). x = the rank's logits, tokens × vocab / tp elements.

- none (tensor_parallel/cross_entropy.py): the 16-bit logits beside their fp32 copy, which becomes the softmax in
  place and is saved with the target mask and masked targets; the backward turns the softmax into the gradient in
  place and autograd casts it to the logits' dtype (engine.cpp validate_outputs): the 16-bit gradient beside it.
- native (fusions/fused_cross_entropy.py, torch.compile'd by jit_fuser): the same forward buffers (each compiled
  function writes into its input: calculate_predicted_logits' subtract and exp and the div_ run in place). Its
  compiled backward (calculate_gradients: `grad_2d[arange, target] -= update` on the saved softmax, `mul_`, then
  `.to(torch.bfloat16)`) is functionalized: inductor writes the updated softmax into a new fp32 [rows, v] buffer
  and the bf16 gradient into another, and copies the update back into the saved softmax (read off its generated
  code, torch 2.9 inductor: buf0 fp32 and buf2 bf16 of one fused kernel), so fp32 + bf16 bytes of x sit beside
  the saved softmax; with 16-bit logits other than bf16 (or fp32 ones) autograd's cast follows the bf16 one, no larger.
  NB: read off inductor's CPU code (the same functionalization and reinplacing passes build the CUDA graph); the
  CPU step measures it (tests/stacks/test_megatron_loss_fusion.py).
- te (TransformerEngine v2.9 cross_entropy.py / triton/cross_entropy.py): no fp32 copy; two Triton kernels read the
  logits in their own dtype, 3 fp32 per row (max, sum, target logit) all-gathered over TP, and the second writes
  the gradient into the logits, which are saved (`ctx.save_for_backward(_input.detach())`): the backward scales them
  in place (element_mul_kernel), nothing new.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..setup import Setup
from .megatron_activations import FP32, INDEX, MASK

BF16 = 2  # the native backward's `grad_input.to(torch.bfloat16)` (fused_cross_entropy.py:82)


@dataclass(frozen=True)
class LossBytes:
    saved: float  # kept for the loss's backward, per micro-batch on the rank
    forward: float  # beside the saved set at the forward's high point (the 16-bit logits beside their fp32 copy)
    backward: float  # the loss's gradients beside the saved set at the backward's start


def impl_fact(setup: Setup) -> dict:
    """The [loss_fusion] facts of the setup's implementation (none unless --loss-fusion names one)."""
    return setup.stack_facts.facts["loss_fusion"][getattr(setup, "loss_fusion", "none")]


def cross_entropy_bytes(setup: Setup, a: int, v: float, tokens: float) -> LossBytes:
    """The cross-entropy over `tokens` rows of `v` logits (the rank's vocabulary share) of `a` bytes each."""
    f = impl_fact(setup)
    x = v * tokens
    if f["saved"] == "logits":  # te: the gradient in the logits, nothing else saved
        stats = f["row_stats"] * FP32 * tokens * (1 + (setup.tp if setup.tp > 1 else 0))  # own + all-gathered
        return LossBytes(saved=a * x, forward=stats, backward=0.0)
    copy = a * x if (f["upcast"] and a < FP32) else 0.0  # (`.float()` of fp32 logits is the same tensor)
    saved = FP32 * x + (MASK + INDEX) * tokens  # softmax, target mask, masked targets (cross_entropy.py:187)
    if f["gradient"] == "compiled":  # native: the compiled backward's fp32 copy and its bf16 output
        return LossBytes(saved=saved, forward=copy, backward=(FP32 + BF16) * x)
    return LossBytes(saved=saved, forward=copy, backward=a * x if a < FP32 else 0.0)


def largest_block(setup: Setup, a: int, x: float) -> float:
    """Bytes of the largest single tensor the cross-entropy over `x` logits of `a` bytes makes, freed once the output
    layer's backward has read the gradient (engine.transient_blocks: the freed block beside the backward's peak).
    none/native: the fp32 copy that becomes the saved softmax (cross_entropy.py:28 `.float()`; the native backward's
    new fp32 buffer is as large); te: no fp32 copy (triton/cross_entropy.py:284-316 allocates 3 fp32 per row), the
    logits themselves, saved and turned into their gradient in place (cross_entropy.py:50-61, :345-371)."""
    f = impl_fact(setup)
    if f["saved"] == "logits":
        return a * x
    return max(FP32, a) * x
