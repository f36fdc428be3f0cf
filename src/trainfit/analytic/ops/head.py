"""The last stage: final norm, task head (trainfit.heads) and the loss."""
from __future__ import annotations

from ...heads import CLASSIFIERS, layout
from ...spec import ModelSpec
from ..activations import FP32
from .activation import activation
from .cast import WEIGHT_CASTS, autocast_inputs, weight_casts
from .loss import lm_loss, lm_loss_backward_extra, loss_scale, shifted_labels
from .norm import norm_ops
from .op import Op, Shape, gemm, memory


def head_forward(spec: ModelSpec, sh: Shape, logits_rows: float | None = None) -> list[Op]:
    """The last stage's final norm, task head (trainfit.heads) and loss (loss.lm_loss).
    `logits_rows` (generation): the LM head runs on those rows only (transformers' logits_to_keep: the norm sees
    every token, the head the last one per sequence) and there is no loss."""
    h, t, a = spec.hidden, sh.tp, sh.act
    T, Tn = sh.tokens, sh.norm_tokens
    ops = norm_ops(spec, "final_norm", Tn, sh, "final") if spec.final_norm else []
    head = layout(spec)
    if head.kind in CLASSIFIERS:
        rows = sh.batch if head.rows == "first" else T
        ops += autocast_inputs("head_in", rows, head.in_dim, 1, sh, "final")
        if head.pooler:
            ops.append(gemm("pooler", rows, h, h, sh, "modeling_bert.py BertPooler dense", bias=True))
        ops.append(gemm("classifier", rows, head.width, head.in_dim, sh, "heads.py classifier", bias=head.out_bias))
        return weight_casts(f"head.{WEIGHT_CASTS}", ops, sh) + ops
    if spec.mlm_transform:
        ops += autocast_inputs("mlm_in", T, h, 1, sh, "final")
        ops.append(gemm("mlm_dense", T, h, h, sh, "modeling_bert.py BertPredictionHeadTransform", bias=True))
        ops += activation(spec, "mlm_act", T * h, sh, "mlm")
        ops += norm_ops(spec, "mlm_norm", T, sh, "mlm", a)
    he = spec.embed_proj_dim or h
    v = spec.vocab / t
    if logits_rows is not None:
        T = logits_rows
    ops += autocast_inputs("lm_head_in", T, he, 1, sh, "final")
    head_gemm = gemm("lm_head", T, v, he, sh, "modeling_llama.py:468 lm_head", bias=spec.lm_head_bias)
    ops += weight_casts(f"head.{WEIGHT_CASTS}", [o for o in ops if o.kind == "gemm"] + [head_gemm], sh) + [head_gemm]
    x = T * v
    if spec.final_softcap:
        ops += [memory(f"logit_softcap{j}", x * a, x * a, "modeling_gemma2.py final_logit_softcapping", "loss", (0, 0))
                for j in range(3)]
    if logits_rows is not None:
        return ops
    return shifted_labels(sh) + ops + lm_loss(T, x, sh) + [loss_scale()]


def head_backward_extra(spec: ModelSpec, sh: Shape) -> list[Op]:
    """loss.backward()'s seed, a ones_like of the scalar loss (torch/csrc/autograd/autograd.cpp _make_grads
    `at::ones_like(output)`); the LM loss's backward extras (loss.lm_loss_backward_extra)."""
    seed = memory("loss.seed", 0, FP32, "autograd _make_grads ones_like", saves=False)
    if layout(spec).kind in CLASSIFIERS:
        return [seed]
    return [seed, *lm_loss_backward_extra(sh.tokens * spec.vocab / sh.tp, sh)]
