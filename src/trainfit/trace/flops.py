"""FLOPs of the traced step, counted inside the recorder's dispatch hook.

Formulas: PyTorch's own `torch.utils.flop_counter.flop_registry` (the ones FlopCounterMode uses:
2*m*n*k per matmul, the SDPA counts, convolutions), called directly from our hook instead of running
FlopCounterMode as a second dispatch mode, which would add its pytree walks and module tracker to
every op. The registry has no entry for the CPU flash-attention kernel that SDPA picks on CPU, so we
map it to the registry's SDPA counts (same formula as the CUDA flash kernel: it counts the full
score matrix, NB causal masking halves the useful work but not the count, as in FlopCounterMode),
and every SDPA kernel's count is taken with k/v broadcast to the query's heads (GQA), which torch
before 2.13 asserts against (seen on torch 2.11 on an H200: every GQA model's CUDA trace failed).

Split: ops in a "forward" phase are forward; ops in "backward" while a module's forward is running
are recomputation (checkpointing re-enters module forwards during backward); the rest of backward is
backward. Optimizer element-wise work is not counted (the registry counts matmul-like ops only).
"""
from __future__ import annotations

from collections import defaultdict

import torch
from torch.utils import flop_counter as fc

aten = torch.ops.aten


def _shape(x):
    return x.shape if isinstance(x, torch.Tensor) else x


def _heads_of(x, heads: int):
    """k/v's shape with the query's heads: GQA kernels broadcast k/v heads, and torch's own SDPA counts before
    2.13 assert equal heads (flop_counter.py sdpa_flop_count), so the counts are taken on the broadcast shape."""
    b, _, s, d = x.shape
    return (b, heads, s, d)


def _sdpa_fwd(query, key, value, *args, **kwargs) -> int:
    h = query.shape[1]
    return fc.sdpa_flop_count(query.shape, _heads_of(key, h), _heads_of(value, h))


def _sdpa_bwd(grad_out, query, key, value, *args, **kwargs) -> int:
    h = query.shape[1]
    return fc.sdpa_backward_flop_count(grad_out.shape, query.shape, _heads_of(key, h), _heads_of(value, h))


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
        for packet, fn in fc.flop_registry.items():
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
            n = fn(*args, **kwargs)
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
