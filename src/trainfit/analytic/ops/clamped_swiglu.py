"""gpt-oss's experts' elementwise kernels: the clamped SwiGLU (GptOssExperts._apply_gate, transformers 5.24
models/gpt_oss/modeling_gpt_oss.py:82-88) and the per-expert biases of the grouped GEMMs (integrations/moe.py:480,
:508 `bias[expert_ids_g]`, :419 `out.add_(bias)`), over the S = T·top_k routed copies (analytic/clamped_swiglu.py
for what they save). Forward, each one kernel: the gate's and up's clamps (reading the strided halves of gate_up),
alpha·gate, sigmoid, gate·sigmoid, up + 1, (up + 1)·glu. Backward (tools/autograd/derivatives.yaml): each product's
two multiplies, sigmoid_backward, alpha's multiply, each clamp's mask (le; ge, le and logical_and_ for the two-sided
one) and where, and the two strided slices' slice_backward (a zero-filled (S, 2i) each) summed; up + 1 passes its
gradient on. A bias: the gather of its rows (reading the int64 expert ids), the in-place add; backward, the index's
index_put into a zeroed (E, n) gradient."""
from __future__ import annotations

from ..activations import INDEX
from .op import Op, Shape, bwd_kernel, memory, no_kernel

SRC = "modeling_gpt_oss.py:82-88 GptOssExperts._apply_gate"
MASK = 1  # a bool element


def clamped_swiglu(name: str, x: float, sh: Shape, group: str) -> list[Op]:
    """The clamped SwiGLU over x = S·i elements of each half (gate_up holds 2x)."""
    a = x * sh.act
    m = x * MASK

    def k(n: str, r: float, w: float, kernels: int = 1) -> Op:
        return bwd_kernel(f"{name}.{n}", r, w, kernels=kernels)
    # (name, reads, writes, backward kernels)
    fwd = [
        ("gate_clamp", a, a, (k("gate_clamp.mask", a, m), k("gate_clamp.where", m + a, a))),
        ("up_clamp", a, a, (k("up_clamp.mask", 2 * a, 2 * m, kernels=2), k("up_clamp.and", 2 * m, m),
                            k("up_clamp.where", m + a, a),
                            # the two strided halves' gradients, each scattered into a zeroed (S, 2i), summed
                            k("slice_backward", 2 * a, 4 * a, kernels=2), k("halves_sum", 4 * a, 2 * a))),
        ("alpha", a, a, (k("alpha.backward", a, a),)),
        ("sigmoid", a, a, (k("sigmoid.backward", 2 * a, a),)),
        ("glu", 2 * a, a, (k("glu.backward_gate", 2 * a, a), k("glu.backward_sigmoid", 2 * a, a),
                           k("gate_grad_sum", 2 * a, a))),
        ("up_plus_one", a, a, (no_kernel(f"{name}.up_plus_one.backward"),)),
        ("product", 2 * a, a, (k("product.backward_up", 2 * a, a), k("product.backward_glu", 2 * a, a))),
    ]
    return [memory(f"{name}.{n}", r, w, SRC, group, (a if j == 0 else 0, a if j == len(fwd) - 1 else 0), bwd_ops=b)
            for j, (n, r, w, b) in enumerate(fwd)]


def expert_bias(name: str, routed: float, n: float, experts: int, sh: Shape) -> list[Op]:
    """A grouped GEMM's bias over `routed` copies of `n` outputs: the gather of the rows and the in-place add;
    backward, the gradient's index_put into the (E, n) zeros (the add passes the gradient on)."""
    a = sh.act
    rows = routed * n * a
    table = experts * n * a
    return [memory(f"{name}.gather", routed * INDEX + table, rows, "integrations/moe.py:480/:508 bias[expert_ids_g]",
                   saves=False, bwd_ops=(bwd_kernel(f"{name}.gather.backward", routed * INDEX + rows, table),)),
            memory(f"{name}.add_", 2 * rows, rows, "integrations/moe.py:419 out.add_(bias)", saves=False,
                   bwd_ops=(no_kernel(f"{name}.add_.backward"),))]
