"""Cost functions of dropout and the residual add (fused in Megatron-core)."""
from __future__ import annotations

from .op import Op, Shape, add_backward, memory

def dropout(name: str, x: float, sh: Shape, group: str) -> list[Op]:
    """CUDA native_dropout: reads x, writes y and a 1-byte mask (activations.dropout_mask_bytes)."""
    a = sh.act
    return [memory(name, x * a, x * (a + 1), "aten native_dropout", group, (0, x), saves=False)]


def residual(name: str, x: float, p: float, sh: Shape, group: str, src: str) -> list[Op]:
    """[dropout on the branch output,] then the residual add (reads the branch and the stream, writes the stream);
    Megatron-core fuses the two (megatron/core/fusions/fused_bias_dropout.py bias_dropout_add: one kernel). The add's
    backward passes the stream's gradient on to both, cast to the branch's dtype where it is narrower (autocast:
    a 16-bit branch on the fp32 stream, add_backward; the H200 profiles' two [2, 1024, h] copies per layer)."""
    a, r = sh.act, sh.residual
    if p > 0 and sh.fused_elementwise:
        return [memory(f"{name}_bias_dropout_add", x * (r + a), x * (r + 1), "megatron fused_bias_dropout.py", group,
                    saves=False)]
    drop = dropout(f"{name}_dropout", x, sh, group) if p > 0 else []
    return drop + [memory(f"{name}_residual", x * (r + a), x * r, src, group, saves=False,
                       bwd_ops=add_backward(f"{name}_residual", x, r, a))]
