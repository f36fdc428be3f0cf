"""The search space: parallel layouts of N GPUs that the model's shape allows, and the (micro-batch, accumulation)
splits of a global batch. Pure arithmetic, no memory or time here."""
from __future__ import annotations

from dataclasses import dataclass

from ..spec import ModelSpec


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def tp_allowed(spec: ModelSpec, tp: int, gpus_per_node: int) -> bool:
    """Megatron's constraints (Shoeybi et al. 2019 §3): tp splits attention heads and the MLP width; key/value
    heads are split or replicated (GQA: tp divides kv heads or kv heads divide tp); tp stays inside a node (its
    all-reduces are on the critical path and need NVLink). Mirrors analytic.engine.validate_layout."""
    if tp > gpus_per_node or spec.heads % tp:
        return False
    if spec.kv_heads % tp and tp % spec.kv_heads:
        return False
    return not (spec.intermediate and spec.intermediate % tp)


@dataclass(frozen=True)
class Layout:
    dp: int
    tp: int
    pp: int


def layouts(spec: ModelSpec, gpus: int, gpus_per_node: int, tp: int | None = None, pp: int | None = None,
            dp: int | None = None) -> list[Layout]:
    """Every dp × tp × pp == gpus with tp valid for the model and pp dividing the layers (fixed where given)."""
    out = []
    for t in divisors(gpus):
        if (tp is not None and t != tp) or not tp_allowed(spec, t, gpus_per_node):
            continue
        for p in divisors(gpus // t):
            if (pp is not None and p != pp) or spec.layers % p:
                continue
            d = gpus // (t * p)
            if dp is not None and d != dp:
                continue
            out.append(Layout(d, t, p))
    return out


def batch_splits(layout: Layout, global_seqs: float | None, max_batch: int, tolerance: float) -> list[tuple[int, int]]:
    """(micro-batch, grad_accum) pairs for one layout.

    With a global batch of `global_seqs` sequences: micro-batch × accumulation × dp must equal it within
    `tolerance` (relative), accumulation ≥ pp so that 1F1B can fill the pipeline (Narayanan et al. 2021 §2.2).
    Without one: accumulation = pp (the least that fills the pipeline; 1 without pipelining) and micro-batches
    of 1, 2, 4, ... up to `max_batch` (the largest that fits) and `max_batch` itself.
    """
    p = layout.pp
    if global_seqs is None:
        accum = p if p > 1 else 1
        bs, b = [], 1
        while b <= max_batch:
            bs.append(b)
            b *= 2
        if max_batch >= 1 and max_batch not in bs:
            bs.append(max_batch)
        return [(b, accum) for b in bs]
    per_rank = global_seqs / layout.dp
    out = []
    for b in range(1, max_batch + 1):
        accum = max(1, round(per_rank / b))
        if accum < p:
            break  # larger micro-batches leave even fewer micro-batches
        if abs(b * accum * layout.dp - global_seqs) <= tolerance * global_seqs:
            out.append((b, accum))
    return out


def max_micro_batch(layout: Layout, global_seqs: float | None, tolerance: float, cap: int = 4096) -> int:
    """The largest micro-batch the batch constraint could ever allow (before memory)."""
    if global_seqs is None:
        return cap
    return max(0, min(cap, int(global_seqs * (1 + tolerance) / (layout.dp * layout.pp))))
