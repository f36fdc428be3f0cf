"""The simulated allocator's state as PyTorch's memory snapshot: the dict `torch.cuda.memory._snapshot()` returns
(torch 2.13 torch/cuda/memory.py:1034-1106, its Snapshot/Segment/Block/Frame TypedDicts), so that the same reader
(trainfit.snapshot) takes a GPU's snapshot and a replayed trace's.

One segment per cudaMalloc'd range (an expandable segment: per contiguous mapped range, as `Allocator.segments`
counts them), its blocks by address: allocated ones `active_allocated` with their requested size and frames,
cached ones `inactive` (no cross-stream frees are simulated: no `active_awaiting_free`). The caller's `describe`
gives each allocated block's requested size (what the tensor asked for: size - requested is round_size's slack)
and its frames.
"""
from __future__ import annotations

from typing import Callable

from .caching_allocator import Allocator


def snapshot_dict(a: Allocator, describe: Callable[[int], tuple[int, list[dict]]]) -> dict:
    """{"segments": [...], "device_traces": [[]]} of allocator `a`. describe(address of an allocated block) ->
    (requested bytes, frames innermost first: [{"filename", "line", "name"}])."""
    segments = []
    for head in a.segment_heads():
        out, b = [], head
        while b is not None and b.mapped:
            if b.allocated:
                requested, frames = describe(b.ptr)
                out.append({"address": b.ptr, "size": b.size, "requested_size": requested,
                            "state": "active_allocated", "frames": frames})
            else:
                out.append({"address": b.ptr, "size": b.size, "requested_size": 0, "state": "inactive",
                            "frames": []})
            b = b.next
        allocated = sum(x["size"] for x in out if x["state"] == "active_allocated")
        segments.append({"address": head.ptr, "total_size": sum(x["size"] for x in out), "stream": head.stream,
                         "segment_type": "small" if head.pool.small else "large", "segment_pool_id": (0, 0),
                         "allocated_size": allocated, "active_size": allocated,
                         "requested_size": sum(x["requested_size"] for x in out), "blocks": out})
    return {"segments": segments, "device_traces": [[]]}
