"""The attention-sink kernels of gpt-oss's eager attention (transformers 5.24 models/gpt_oss/modeling_gpt_oss.py:
243-251; analytic/sink_attention.py for what they save), beside the eager core's GEMMs, scaling, mask add, softmax
and cast that roofline.unfused_attention times: the sinks expanded and torch.cat'ed to the scores (s + 1 columns),
the row max (values and int64 indices), its subtraction, and the probabilities' slice back to s columns. Backward
(tools/autograd/derivatives.yaml): the slice's slice_backward (a zero-filled s + 1 gradient), the subtraction's
negated gradient summed over the row, max's value_selecting_reduction_backward (zeros, then a scatter), the two
gradients of the logits summed, and the sinks' own gradient, the last column summed over batch and rows (cat's
backward is views)."""
from __future__ import annotations

from ..activations import INDEX
from .op import Op, Shape, bwd_kernel, memory

SRC = "modeling_gpt_oss.py:243-251 eager_attention_forward (sinks)"


def sink_ops(bh: float, s_q: float, s_kv: float, sh: Shape) -> list[Op]:
    """Over bh = batch·heads rows of s_q queries and s_kv keys; the logits in their promoted dtype (the scores'
    with the mask's, the residual stream's: sink_attention.softmax_bytes)."""
    sm = max(sh.act, sh.residual)
    scores = bh * s_q * s_kv * sm
    logits = bh * s_q * (s_kv + 1) * sm
    rows = bh * s_q * sm
    idx = bh * s_q * INDEX
    sinks = bh / sh.batch * sm
    return [
        memory("sinks_cat", scores + sinks, logits, SRC + " torch.cat", saves=False,
               bwd_ops=(bwd_kernel("sinks_cat.sinks_grad", rows, sinks),)),
        memory("sinks_max", logits, rows + idx, SRC + " max(dim=-1)", saves=False,
               bwd_ops=(bwd_kernel("sinks_max.backward", rows + idx, 2 * logits, kernels=2),
                        bwd_kernel("sinks_logits_grad_sum", 2 * logits, logits))),
        memory("sinks_sub", logits + rows, logits, SRC + " combined - max", saves=False,
               bwd_ops=(bwd_kernel("sinks_sub.neg", logits, logits), bwd_kernel("sinks_sub.sum", logits, rows))),
        memory("sinks_slice", 0, 0, SRC + " probs[..., :-1]", saves=False, kernels=0,
               bwd_ops=(bwd_kernel("sinks_slice.backward", scores, logits),)),
    ]
