"""The kernels of --loss fused-linear: Liger's fused linear cross-entropy, for the step-time model (no torch).

linkedin/Liger-Kernel src/liger_kernel/ops/fused_linear_cross_entropy.py (read at ead96b61, 2026-08-21):
fused_linear_cross_entropy_forward zeroes the input gradient (:72) and the weight gradient (:77-80), then runs the
tokens in chunks of next_pow2(ceil(BT / ceil(V / H))) rows (:68-70). Each chunk: the logits GEMM (:114), the Triton
cross-entropy kernel turning the chunk's logits into their gradient in place (:163; ops/cross_entropy.py
liger_cross_entropy_kernel: an online-softmax pass reading the row, :151, then a pass reading it again and writing
the gradient, :206-252), the input-gradient GEMM into its slice (:231) and the weight gradient accumulated by an
addmm/mm (:249-257). So the LM head's three GEMMs all run in the forward, at the chunk's row count, and the full
loss's logits upcast, log-softmax and nll kernels never run. Its backward (:292-340) only scales the two gradients
by the loss's gradient (element_mul_kernel, read + write), skipped when that gradient is exactly 1.0.
"""
from __future__ import annotations

from ..spec import ModelSpec
from ..units import next_pow2
from .activations import FP32, INDEX
from .ops import Op, Shape, gemm, memory

SRC = "Liger ops/fused_linear_cross_entropy.py"


def chunk_rows(tokens: float, vocab: float, hidden: int) -> int:
    """Rows per chunk (:68-70): next_pow2(ceil(BT / ceil(V / H))), at most BT."""
    inc = -(-int(vocab) // hidden)
    rows = -(-int(tokens) // inc)
    return min(next_pow2(rows), int(tokens))


def fused_linear_loss(spec: ModelSpec, sh: Shape, trains_head: bool) -> tuple[list[Op], list[Op]]:
    """(forward, backward) kernels of Liger's fused linear cross-entropy over the last stage's T tokens (the final
    norm is not included: ops.norm_ops, as for the full loss). `trains_head`: the LM head's weight gets a gradient
    (not under LoRA, where Liger's weight_needs_grad is False and the weight-gradient GEMM is skipped).
    NB: the weight-gradient accumulator is read and written by every chunk's addmm (beta = 1); the GEMM roofline
    counts its output once per chunk: under-counts V·H bytes per chunk after the first (a few % of the GEMM's time
    at 2k-row chunks). The grad_output scaling is always counted (HF's Trainer divides the loss by the accumulation
    steps or the token count, so it is rarely exactly 1.0)."""
    he = spec.embed_proj_dim or spec.hidden
    T, v, a = sh.tokens, spec.vocab / sh.tp, sh.act
    r = sh.residual  # the input gradient has the input's dtype (zeros_like(_input)): fp32 under autocast
    c = chunk_rows(T, v, he)
    n = -(-int(T) // c)
    gw = sh.grad if trains_head else 0  # the weight gradient's bytes per element (the weight's dtype)
    fwd = [memory("flce.zero_grads", 0, T * he * r + v * he * gw, SRC + ":72-80 zeros_like", saves=False,
               kernels=2 if trains_head else 1, grad=False)]
    for _ in range(n):
        fwd.append(gemm("flce.logits", c, v, he, sh, SRC + ":114")._replace(grad=False))
        fwd.append(memory("flce.cross_entropy", 2 * c * v * a + c * INDEX, c * v * a + c * FP32,
                       "Liger ops/cross_entropy.py:151,206-252 (two passes, gradient in place)", saves=False,
                       grad=False))
        fwd.append(gemm("flce.grad_input", c, he, v, sh, SRC + ":231")._replace(grad=False))
        if trains_head:
            fwd.append(gemm("flce.grad_weight", v, he, c, sh, SRC + ":249-257")._replace(grad=False))
    bwd = [memory("flce.scale_grad_input", T * he * r, T * he * r, SRC + ":292-315 element_mul_kernel", saves=False,
               grad=False)]
    if trains_head:
        bwd.append(memory("flce.scale_grad_weight", v * he * gw, v * he * gw, SRC + ":317-328 element_mul_kernel",
                       saves=False, grad=False))
    return fwd, bwd
