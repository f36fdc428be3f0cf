"""The segments of gradients that no cached block holds: what they add to reserved beside the step's peak.

The caching allocator serves a request only from a free block at least its size (CUDACachingAllocator.cpp
get_free_block), and keeps every segment it opens until empty_cache. The first step's backward makes each parameter's
gradient while the activations it frees are cached; a gradient larger than every activation block
(largest_cached_block) is carved from the loss's freed blocks where they hold it (analytic.engine.transient_blocks),
else it opens a segment of its own (Llama-3.1-8B in bf16: its 112 MiB MLP gradients against 56 MiB intermediates).
zero_grad(set_to_none=True) frees them at the end of every step, and the next forward's activations are served from
their own, exact-size blocks (best fit), so those segments sit free at the next step's peak, early in the backward
(the gradients the peak holds are not free then). Except for one thing: torch.optim makes its states in the first
optimizer.step() (adam.py _init_group), after the backward, and a state no larger than an activation block takes
one of the activations' cached blocks; the next forward then serves those activations from the gradients' free
segments. So the gradients' own segments, less the states carved from the activations' cache, are reserved beyond
the peak.

NB: no parameter. Against the allocator simulator replaying traced steps (itself within 1.35 % of 18 steps measured
on an H200; bench/studies/grad_segments.py): Llama-3.1-8B bf16 -7.4 -> -0.4 %, torchtitan's TinyLlama -7.3 -> -2.1 %,
Llama-3.2-3B amp -2.1 -> +4.9 % (over: its 36 MiB q/o gradients, just above the 32 MiB intermediate, are counted
whole); the 23 small setups of bench/studies/alloc_fragmentation.py do not move. Not counted where gradients live in
preallocated buffers (Megatron, DeepSpeed), sharded (FSDP2: analytic.engine.fsdp2_side_streams), or are few (LoRA),
nor under foreach AdamW, whose temporaries take those blocks at optimizer.step() (analytic/foreach_segments.py);
packing is taken as perfect.
"""
from __future__ import annotations

from ..alloc.caching_allocator import K_LARGE_BUFFER, K_MIN_LARGE_ALLOC, K_SMALL_SIZE, round_size
from ..setup import Setup
from ..spec import ModelSpec
from .foreach_segments import _CONF, new_segments, parameter_tensors


def largest_cached_block(mlp_intermediate: int) -> int:
    """The largest block the forward's freed activations leave: one layer's MLP intermediate when it has a segment
    of its own (>= kMinLargeAlloc, 10 MiB), else a whole 20 MiB kLargeBuffer segment, in which the 1-10 MiB
    activations packed there merge back into one free block once all of them are freed (free_block's
    try_merge_blocks)."""
    return mlp_intermediate if mlp_intermediate >= K_MIN_LARGE_ALLOC else K_LARGE_BUFFER


def gradient_segments(spec: ModelSpec, setup: Setup, grad_bytes: float, state_bytes: float, states: int,
                      mlp_intermediate: int, blocks: list[int], live_gradients: int) -> int:
    """Bytes of the gradients' own segments free at the step's peak (module docstring). grad_bytes / state_bytes:
    bytes per element of a gradient and of one optimizer state; states: optimizer states per parameter;
    mlp_intermediate: one layer's MLP intermediate (engine.mlp_intermediate); blocks: the loss's cached blocks
    (engine.transient_blocks); live_gradients: the gradients the peak holds (their segments are not free then).
    The largest cached block is at least 10 MiB, so gradients under it, which share 20 MiB segments with the
    activations, never count."""
    largest = largest_cached_block(mlp_intermediate)
    tensors = parameter_tensors(spec, setup)[:-1]  # the embedding and head: engine.transient_blocks counts them
    big = [(n * grad_bytes, c) for n, c in tensors if round_size(int(n * grad_bytes), _CONF) > largest]
    opened = new_segments(big, blocks, 0, 0)
    carved = 0
    for n, c in tensors:
        size = round_size(int(n * state_bytes), _CONF)
        if K_SMALL_SIZE < size <= largest:
            carved += size * c * states
    return max(0, opened - carved - live_gradients)
