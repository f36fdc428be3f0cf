"""Context parallelism's communication: Megatron's ring attention (megatron/core/transformer/
dot_product_attention_context_parallel and Liu et al. 2023 "Ring Attention").

Each rank computes on b·s/cp tokens; per layer the K/V of its chunk (2 · b·(s/cp) · kv_heads·head_dim/t elements)
pass cp−1 times around the ring in the forward and twice that in the backward (K/V again + their gradients),
overlapped with the attention compute: only the excess is exposed. Megatron's rank order is tp-cp-ep-dp-pp
(parallel_state.py): the ring spans t·cp consecutive ranks. Gradients are reduced over the dp × cp ranks
(Megatron's data-parallel-with-context-parallel group: parallel/zero.py dp_comm).
"""
from __future__ import annotations

from ...setup import Setup
from ...spec import ModelSpec
from .collectives import Links


def local_kv_elements(spec: ModelSpec, setup: Setup, tokens: float) -> float:
    """Elements of the K and V of a rank's `tokens` (its chunk of the sequence, one tensor-parallel shard of the kv
    heads): what a ring step passes to the next rank."""
    t = max(1, setup.tp)
    if t > spec.kv_heads:  # GQA with tp > kv heads: each rank keeps one (replicated) kv head
        return 2 * tokens * spec.head_dim
    return 2 * tokens * spec.kv_heads * spec.head_dim / t


def cp_comm_seconds(spec: ModelSpec, setup: Setup, links: Links, tokens: float, act_bytes: float, layers: int,
                    attention_forward: float, rerun: float) -> float:
    """One micro-batch's exposed ring-attention communication on a stage of `layers` layers, `tokens` per rank;
    `attention_forward`: one layer's forward attention seconds (what the ring hides behind); `rerun`: the share of
    layers whose forward runs again in the backward (full recompute re-runs the forward ring)."""
    t, cp = setup.tp, setup.cp
    if cp <= 1:
        return 0.0
    kv = local_kv_elements(spec, setup, tokens) * act_bytes
    ring = (cp - 1) * kv / links.over(t * cp)  # forward: cp − 1 hops of the local K/V
    per_layer = max(ring - attention_forward, 0.0) + max(2 * ring - 2 * attention_forward, 0.0)
    return layers * per_layer * (1 + rerun)
