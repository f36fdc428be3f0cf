"""FLOPs of the traced step, counted inside the recorder's dispatch hook.

Formulas: PyTorch's own `torch.utils.flop_counter.flop_registry` (the ones FlopCounterMode uses:
2*m*n*k per matmul, the SDPA counts, convolutions), called directly from our hook instead of running
FlopCounterMode as a second dispatch mode, which would add its pytree walks and module tracker to
every op. The registry has no entry for the CPU flash-attention kernel that SDPA picks on CPU, so we
map it to the registry's SDPA counts, and every SDPA kernel's count is taken with k/v broadcast to the query's heads
(GQA), which torch before 2.13 asserts against (seen on torch 2.11 on an H200: every GQA model's CUDA trace failed).
A call with is_causal counts the (query, key) pairs the mask keeps (roofline.attention_pairs), not the full score
matrix FlopCounterMode counts (torch 2.13 flop_counter.py sdpa_flop_count reads no is_causal): the fused kernels
skip the masked key blocks (FlashAttention-2 §4.1 'divide by 2 for causal'; torch's CPU flash kernel,
aten/src/ATen/native/cpu/FlashAttentionKernel.cpp, stops each query block's key loop at the diagonal: a causal
4,096-token call runs in 0.61x the time of a full one on this project's 2-core test machine), so the count is the
hardware's, as the analytic engine's op lists count it (ops/op.py Op.flops). NB: the diagonal blocks are computed
whole, so the kernels execute slightly more than the kept pairs (a low count by at most half a block per row).
A call given a mask tensor (transformers' sliding-window, chunked and padding masks) and HF's eager attention count
every pair, as their kernels compute them, where the analytic engine counts the model's causal pairs (analytic/
flops.py): the trace reads higher for the models whose HF attention takes such a mask or runs eager (at 2,048 tokens,
bf16 CUDA semantics: tiny-gemma3 +29 %, tiny-gemma2 +39 %, tiny-llama4 +46 %, tiny-gpt-oss +71 %).
The registry also has no entry for the grouped GEMM (`aten._grouped_mm`, `aten._scaled_grouped_mm`; none in torch
2.13's flop_counter.py) that transformers 5.24 runs MoE experts through (integrations/moe.py:379-381,
called from `grouped_mm_experts_forward`), so we add `GROUPED_MM_FLOPS` below, in the form FlopCounterMode's
`custom_mapping` takes (shape formulas keyed by op packet); without it every MoE family's experts counted zero.
And torch 2.13's convolution backward formula counts a grouped convolution's weight gradient as if it were one group
(flop_counter.py conv_backward_flop: conv_flop_count(t(x_shape), t(grad_out_shape), ...) reads all input channels
against all output channels), `groups` times too many: a depthwise convolution's (ConvNeXt's 7x7, groups = channels)
by its channel count, 3.8x ConvNeXt-tiny's whole backward. CONV_BACKWARD_FLOPS below replaces it.

Split: ops in a "forward" phase are forward; ops in "backward" while a module's forward is running
are recomputation (checkpointing re-enters module forwards during backward); the rest of backward is
backward. Optimizer element-wise work is not counted (the registry counts matmul-like ops only).
"""
from __future__ import annotations

from collections import defaultdict

import torch
from torch.utils import flop_counter as fc

from ..analytic.roofline import attention_pairs

aten = torch.ops.aten


def _shape(x):
    return x.shape if isinstance(x, torch.Tensor) else x


def _heads_of(x, heads: int):
    """k/v's shape with the query's heads: GQA kernels broadcast k/v heads, and torch's own SDPA counts before
    2.13 assert equal heads (flop_counter.py sdpa_flop_count), so the counts are taken on the broadcast shape."""
    b, _, s, d = x.shape
    return (b, heads, s, d)


def _kept(query, key, causal: bool) -> float:
    """The share of the score matrix the call computes: the pairs an is_causal mask keeps (the module docstring).
    NB: bottom-right aligned (FlashAttention's); a call with is_causal has as many queries as keys in the traced
    steps (transformers' sdpa_attention passes is_causal only without a mask, i.e. no cache offset)."""
    if not causal:
        return 1.0
    s_q, s_kv = query.shape[2], key.shape[2]
    return attention_pairs(s_q, s_kv, True) / (s_q * s_kv)


def _sdpa_fwd(causal: bool, query, key, value, *args, **kwargs) -> int:
    h = query.shape[1]
    return round(fc.sdpa_flop_count(query.shape, _heads_of(key, h), _heads_of(value, h)) * _kept(query, key, causal))


def _sdpa_bwd(causal: bool, grad_out, query, key, value, *args, **kwargs) -> int:
    """The backward's model FLOPs: d(probs·v) and d(q·kᵀ), four products, twice the forward (Kaplan et al. 2020 §2.1:
    backward = 2 x forward), as the analytic engine counts them. torch's sdpa_backward_flop_count adds a fifth, the
    score matrix the fused kernel recomputes from q and k (its 'Step 1'): the kernel's own recomputation, not the
    model's, left out as checkpointing is out of the model FLOPs. NB: the GPU executes 1.25x the attention backward
    counted here."""
    h = query.shape[1]
    k = _heads_of(key, h)
    n = fc.sdpa_backward_flop_count(grad_out.shape, query.shape, k, _heads_of(value, h))
    b, _, s_q, d = query.shape
    rescored = fc.bmm_flop((b * h, s_q, d), (b * h, d, k[2]))
    return round((n - rescored) * _kept(query, key, causal))


def _is_causal(func, args, kwargs) -> bool:
    """The call's is_causal argument, wherever its schema puts it (the SDPA kernels differ: flash 4th, efficient 6th,
    their backwards later)."""
    names = [a.name for a in func._schema.arguments]
    i = names.index("is_causal")
    return bool(args[i] if i < len(args) else kwargs.get("is_causal", False))


def grouped_mm_flop(a_shape, b_shape, offs=None, *args, out_shape=None, **kwargs) -> int:
    """2·m·k·n summed over the groups, for every operand layout `_grouped_mm` accepts (torch/_meta_registrations.py
    `_create_grouped_mm_output_tensor`, torch.nn.functional.grouped_mm's docstring):
    2-D x 3-D, a (rows, k) split by offs, b (groups, k, n): the MoE forward and d(input), 2·rows·k·n;
    3-D x 2-D, a (groups, m, k), b (k, cols) split by offs, group g writing its columns: 2·m·k·cols;
    2-D x 2-D, a (m, K), b (K, n), the contraction K split by offs: the weight gradient, 2·m·K·n;
    3-D x 3-D, no offs: a batched GEMM, 2·groups·m·k·n.
    NB: fake tensors carry no offs values, so every row of the jagged operand is counted; the kernel skips rows
    past offs[-1], which transformers leaves only under expert parallelism (integrations/moe.py:452-459, its
    sentinel rows), so there the count reads high by the sentinel rows' share; without it offs[-1] is every row."""
    if len(a_shape) == 3 and len(b_shape) == 3:
        return fc.bmm_flop(a_shape, b_shape)
    m, k = a_shape[-2:]  # with a 2-D operand each group writes its own rows/columns/output slice: one m·k·n
    return 2 * m * k * b_shape[-1]


def scaled_grouped_mm_flop(a_shape, b_shape, scale_a=None, scale_b=None, offs=None, *args, out_shape=None,
                           **kwargs) -> int:
    """The FP8 grouped GEMM: the same products as `_grouped_mm` (its scales are per row/column multiplies, not
    counted, as the registry's `_scaled_mm_flop` does not count them)."""
    return grouped_mm_flop(a_shape, b_shape, offs)


def conv_backward_flop(grad_out_shape, x_shape, w_shape, _bias, _stride, _padding, _dilation, transposed,
                       _output_padding, _groups, output_mask, out_shape=None, **kwargs) -> int:
    """The input gradient and the weight gradient each make the forward's products once, reordered (each product
    x·w of the forward appears once in d(input) = sum grad_out·w and once in d(weight) = sum grad_out·x), so each
    costs the forward's count, which conv_flop_count takes with groups through the weight's shape (c_out, c_in /
    groups, k...): torch's own formula for d(input), and for d(weight) the count torch's over-reads by `groups`."""
    forward = fc.conv_flop_count(list(x_shape), list(w_shape), list(grad_out_shape), transposed)
    return forward * (bool(output_mask[0]) + bool(output_mask[1]))


# FlopCounterMode(custom_mapping=GROUPED_MM_FLOPS) counts the same on a real step.
GROUPED_MM_FLOPS = {aten._grouped_mm: grouped_mm_flop, aten._scaled_grouped_mm: scaled_grouped_mm_flop}
CONV_BACKWARD_FLOPS = {aten.convolution_backward: conv_backward_flop}


# SDPA kernels whose arguments begin (query, key, value) forward and (grad_out, query, key, value) backward
_SDPA = ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
         "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu")


class FlopCounter:
    def __init__(self, recorder):
        self.rec = recorder
        self.by_kind = {"forward": 0, "backward": 0, "recompute": 0, "other": 0}
        self.by_module: dict[str, int] = defaultdict(int)  # forward + recompute FLOPs per leaf module
        self.by_phase: dict[str, int] = defaultdict(int)
        reg = {}
        mapped = {**fc.flop_registry, **{p: fc.shape_wrapper(f) for p, f in GROUPED_MM_FLOPS.items()
                                         if p not in fc.flop_registry},  # a later torch's own formula wins
                  **{p: fc.shape_wrapper(f) for p, f in CONV_BACKWARD_FLOPS.items()}}
        for packet, fn in mapped.items():
            if isinstance(packet, torch._ops.OpOverloadPacket):
                for name in packet.overloads():
                    reg[getattr(packet, name)] = ("registry", fn)
        for name in _SDPA:  # the registry has no CPU flash entry, and counts GQA only from torch 2.13
            for op, fn in ((name, _sdpa_fwd), (f"{name}_backward", _sdpa_bwd)):
                if hasattr(aten, op):
                    reg[getattr(aten, op).default] = ("raw", fn)
        self.table = reg

    def count(self, func, args, kwargs, out) -> None:
        entry = self.table.get(func)
        if entry is None:
            return
        how, fn = entry
        kwargs = kwargs or {}
        if how == "registry":
            n = fn(*args, **kwargs, out_val=out)
        else:
            n = fn(_is_causal(func, args, kwargs), *args, **kwargs)
        phase = self.rec.phase
        mods = self.rec.modules
        inside = bool(mods is not None and mods.stack)
        if phase in ("forward", "prefill", "decode"):
            kind = "forward"
        elif phase == "backward":
            kind = "recompute" if inside else "backward"
        else:
            kind = "other"
        self.by_kind[kind] += n
        self.by_phase[phase] += n
        if inside and kind != "backward":
            self.by_module[mods.current] += n
