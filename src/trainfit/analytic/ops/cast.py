"""Cost functions of autocast's casts: a linear's input cast per call, the weight cast cache per forward."""
from __future__ import annotations

from ..activations import FP32
from .op import DOWNCAST, Op, Shape, memory

def autocast_inputs(name: str, tokens: float, width: float, calls: int, sh: Shape, group: str) -> list[Op]:
    """torch.autocast casts a linear's fp32 input to the compute dtype per call (q, k and v each cast the same
    input); compiled, the norm writes the low-precision tensor once (norm_ops)."""
    if not sh.autocast or sh.act == FP32:
        return []
    x = tokens * width
    return [memory(f"{name}.autocast{j}", x * FP32, x * sh.act, "torch.autocast (linear inputs)", group, (0, 0),
                saves=False, **DOWNCAST) for j in range(calls)]

WEIGHT_CASTS = "weight_casts"  # the names of autocast's weight cache's ops end so (layer and head lists)


def uncached(ops: list[Op]) -> list[Op]:
    """`ops` less the weight casts a later forward in the same autocast context does not run: autocast's cache
    keeps each weight's cast until the outermost context exits (autocast_mode.cpp cached_cast; clear_cache on exit),
    and the inference step runs the prefill and the decode in one context (step/infer.py inference_step, as a
    `generate` under one torch.autocast does)."""
    return [o for o in ops if not o.name.endswith(WEIGHT_CASTS)]


def weight_casts(name: str, ops: list[Op], sh: Shape) -> list[Op]:
    """Autocast's weight cache: each weight of an autocast matmul, and its bias, cast once per forward (torch/amp
    autocast_mode.cpp cached_cast: leaf tensors that require grad), each cast's backward casting the gradient back.
    The projections' weights, not the MoE experts' (grouped_mm runs outside autocast, moe.py). The H200 gpt2 amp
    profile: per layer 8 weight and 8 bias copies (4 of each shape, forward and backward)."""
    if not sh.autocast or sh.act == FP32:
        return []
    gemms = [o for o in ops if o.kind == "gemm"]
    n = sum(o.n * o.k * o.batch for o in gemms) + sum(o.n * o.batch for o in gemms if o.bias)
    return [memory(name, n * sh.weight, n * sh.act, "torch.autocast weight cast cache", "", saves=False,
                kernels=len(gemms) + sum(1 for o in gemms if o.bias), **DOWNCAST)]
