"""The segments foreach AdamW's temporaries open: what torch.optim's multi-tensor step adds to reserved.

_multi_tensor_adam (torch/optim/adam.py) makes one whole-group temporary, exp_avg_sq_sqrt = _foreach_sqrt(exp_avg_sqs):
one tensor per parameter, of its size, in the states' dtype (the rest of the update is in place). They are made
after the backward, when the step's activations are freed blocks in the cache. The caching allocator serves a request
from a free block at least its size (CUDACachingAllocator.cpp get_free_block: the smallest such block, split), so a
temporary larger than every cached block opens a segment of its own, which stays reserved. Which blocks are cached
there: the loss's and the head's freed blocks (analytic.engine.transient_blocks, each counted in reserved) and the
saved activations, none larger than one layer's MLP intermediate (tokens x intermediate / tp in the activations'
dtype). So the temporaries are placed largest first, best fit into those blocks; what does not fit is new segments.
NB: packing into the activation blocks is taken as perfect and their total as the backward's allocated high point
less what the optimizer phase holds live: reads low where they are fragmented. Checked against the allocator
simulator on traced steps: bench/studies/foreach_reserved.py.
"""
from __future__ import annotations

from ..alloc.caching_allocator import K_SMALL_SIZE, allocation_size, round_size
from ..alloc.config import AllocConf
from ..setup import Setup
from ..spec import ModelSpec
from .families import family_traits

_CONF = AllocConf()  # torch's defaults, as overheads.py's: no PYTORCH_CUDA_ALLOC_CONF modelled


def parameter_tensors(spec: ModelSpec, setup: Setup) -> list[tuple[int, int]]:
    """(elements, how many) of the large parameter tensors one rank steps: each layer's projections (fused where the
    family fuses them: families.json), a MoE layer's grouped experts (transformers keeps all experts' gate_up_proj in
    one (E, 2·i, h) parameter), the word embedding and an untied head; TP splits the matrices and the vocabulary,
    FSDP/ZeRO-3 shards every tensor dp ways (a DTensor's local shard). NB: norms and biases left out (small-pool
    bytes, placed anywhere)."""
    h, t, traits = spec.hidden, setup.tp, family_traits(spec)
    q, kv = spec.q_dim, spec.kv_dim
    attn = [(h * (q + 2 * kv), 1)] if traits["fused_qkv"] else [(h * q, 1), (h * kv, 2)]
    attn.append((q * h, 1))
    i = spec.intermediate
    ups = 2 if spec.gated_mlp else 1
    dense = [(2 * i * h, 1)] if traits["fused_gate_up"] and spec.gated_mlp else [(i * h, ups)]
    dense.append((i * h, 1))
    layers = spec.layers // setup.pp
    moe_layers = 0
    out: list[tuple[int, int]] = []
    if spec.moe is not None:
        moe_layers = min(layers, spec.moe.sparse_layers or spec.layers)
        e, ei = spec.moe.num_experts, spec.moe.expert_intermediate
        out += [(e * (1 + spec.gated_mlp) * ei * h, moe_layers), (e * ei * h, moe_layers)]
    out += [(n, c * layers) for n, c in attn] + [(n, c * (layers - moe_layers)) for n, c in dense]
    out = [(n // t, c) for n, c in out if c]
    table = spec.vocab * (spec.embed_proj_dim or h) // t
    out.append((table, 1 + (not spec.tied_embeddings)))
    shard = setup.dp if setup.zero >= 3 else 1
    return [(-(-n // shard), c) for n, c in out]


def new_segments(temporaries: list[tuple[int, int]], blocks: list[int], largest_activation: int,
                 activation_cache: int) -> int:
    """Bytes of the segments the temporaries ((bytes, how many) pairs) open: placed largest first, each into the
    smallest cached block that holds it (`blocks`, split as get_free_block splits), else into the activations' cache
    when it is no larger than `largest_activation` and `activation_cache` has room, else a segment of its own
    (get_allocation_size: rounded to 2 MiB). Requests under 1 MiB come from the small pool: never counted."""
    free = sorted(b for b in blocks if b > 0)
    opened = 0
    for nbytes, count in sorted(temporaries, reverse=True):
        n = round_size(int(nbytes), _CONF)
        if n <= K_SMALL_SIZE:  # small pool: its own 2 MiB segments, packed
            continue
        left = count
        while left:  # into the cached blocks while one holds it (at most their bytes / n times)
            fit = next((k for k, b in enumerate(free) if b >= n), None)
            if fit is None:  # (the blocks only shrink: none holds the rest of this size either)
                break
            rest = free.pop(fit) - n
            if rest > 0:
                free.append(rest)
                free.sort()
            left -= 1
        if n <= largest_activation:  # then the activations' cache, as many as it has room for
            k = min(left, activation_cache // n)
            activation_cache -= k * n
            left -= k
        opened += left * allocation_size(n)  # the rest: a segment each (counted in closed form: layers may be many)
    return opened
