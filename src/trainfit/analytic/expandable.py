"""The caching allocator under `expandable_segments:True` (PYTORCH_CUDA_ALLOC_CONF): reserved and required.

Source read: pytorch/pytorch c10/cuda/CUDACachingAllocator.cpp at 001074d2 (the commit alloc/caching_allocator.py
simulates; Note [Expandable Segments] and ExpandableSegment, unchanged in substance since torch 2.1):
- one segment per stream and pool, a virtual range of 1 1/8 x the device's memory (ExpandableSegment ctor), backed
  by physical pages as it grows: 20 MiB pages for the large pool, 2 MiB for the small (Note [Expandable Segments]:
  "we use 2MiB pages for our small pool and 20MiB pages for our large pool"); reserved is the mapped pages;
- blocks split at any size (should_split: `is_small || expandable_segments()` -> remaining >= kMinBlockSize) and
  free neighbours merge (free_block -> try_merge_blocks), so the tensors a step frees become one free range;
- a request no free block holds maps new pages at the lowest unmapped address, taking the free block before it
  (find_expandable_block, try_allocate_expandable_block): the segment grows by the request less that free tail;
- pages are unmapped only by empty_cache and malloc's OOM path (release_cached_blocks -> release_blocks ->
  unmap_block: every whole free page of a free block, in a segment that also holds live blocks).

So reserved is the segment's mapped high-water mark, and the free range a step leaves in the middle of it at that
moment is all it holds beside its live tensors. In a training step that moment is the loss's backward: the forward
frees the logits and their fp32 copy (HeadBytes.forward_transient: the model's outputs are dropped once the loss is
taken) next to each other, the loss backward's first gradient (nll_loss_backward's, HeadBytes.loss_grad) is carved
from that range, and the second (log_softmax_backward's) is carved too where the rest still holds it, else it grows
the segment beside the hole. Against the simulator replaying that sequence: tests/test_expandable_reserved.py.
At the OOM retry the free pages are unmapped, so the step needs its allocated peak (required).
"""
from __future__ import annotations

from ..errors import SetupError


def unmodelled(conf, analytic_applies: bool) -> str | None:
    """Why the analytic engine cannot answer under `conf` (alloc.config.AllocConf, or None), or None: it models
    expandable_segments alone, for a CUDA training step of a token model (`analytic_applies`)."""
    if conf is None:
        return None
    from ..alloc.config import AllocConf

    default = AllocConf()
    other = [k for k in ("max_split_size", "max_non_split_rounding_size", "garbage_collection_threshold",
                         "roundup_power2_divisions") if getattr(conf, k) != getattr(default, k)]
    if other:
        return f"--alloc-conf: the analytic engine models expandable_segments only, not {other[0]}"
    if conf.expandable_segments and not analytic_applies:
        return "--alloc-conf expandable_segments: the analytic engine models it for a CUDA training step of a token model"
    return None


def check(conf, analytic_applies: bool) -> bool:
    """Whether `conf` turns expandable segments on for the analytic engine; what it does not model (unmodelled) is
    refused in one line."""
    why = unmodelled(conf, analytic_applies)
    if why:
        raise SetupError(f"{why}: use --engine trace (the allocator simulator replays every setting), or drop it")
    return bool(conf and conf.expandable_segments)


def loss_hole(head) -> float:
    """The free range left inside the segment at the loss backward's start (head: analytic.loss.HeadBytes): what the
    forward freed at its end (the logits, their fp32 copy, the hidden states the model's forward held), less the
    loss backward's gradients carved from it in order (best fit: get_free_block takes the smallest free block that
    holds the request; alloc_found_block splits it). NB: 0 where the head does not lay out its gradients
    (loss_grad 0: tiled, chunked and fused losses, whose blocks are one slice's) - reads low there."""
    if not head.loss_grad:
        return 0.0
    hole = head.forward_transient
    for request in (head.loss_grad, head.backward_transient - head.loss_grad):
        if 0 < request <= hole:
            hole -= request
        elif request > hole:
            break  # it grows the segment past the hole; later requests come after the loss's saved output frees
    return max(0.0, hole)


def reserved(mem, hole: float, side_streams: int = 0) -> int:
    """Mapped high-water mark of the step's own tensors (mem: analytic.memory.TrainMemory): the allocated peak, or
    the loss backward's allocated bytes with the hole beside them where that is more; plus the side streams' own
    segments (FSDP2: one expandable segment per stream, overheads.reserved_from_allocated). NB: reads low by the
    free ranges between live blocks elsewhere (layer transients are carved from the free tail, and at the 20 MiB page
    rounding of each range: < 20 MiB a pool)."""
    at_loss = mem.detail.get("loss_backward_allocated", mem.peak)
    return int(max(mem.peak, at_loss + hole) + side_streams)


def required(mem) -> int:
    """Bytes the step needs from the allocator at capacity: its allocated peak, since the OOM retry unmaps every
    whole free page, holes included (release_blocks -> unmap_block), and maps them again where the request lands.
    NB: the pages' 20 MiB rounding of the live ranges is left out (under by < 20 MiB per free range)."""
    return int(mem.peak)
