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
    cp: int = 1  # Megatron context parallelism
    vpp: int = 1  # Megatron interleaved 1F1B chunks per rank
    pp_split: str = "even"  # Megatron's layer split (parallel/pipeline.py)


# Context parallelism is searched from this sequence length on (Megatron's CP targets long context: Llama 3 used
# CP 16 only for its 128k stage, Dubey et al. 2024 §3.3.2); NB: shorter sequences could also use it.
CP_MIN_SEQ = 16384
VPP_MAX = 8  # interleaving depths searched: 1..VPP_MAX where the stage layers divide


def megatron_variants(spec: ModelSpec, lay: Layout, seq: int) -> list[Layout]:
    """Megatron's extra axes on one dp × tp × pp layout of the same GPUs: CP carved out of dp (world = dp·tp·pp·cp),
    pp_split even | embedding-loss, vpp where each stage's layers split into equal chunks (pipeline.check)."""
    from ..analytic.parallel.pipeline import chunked_layers
    from ..errors import SetupError

    out = []
    cps = [c for c in divisors(lay.dp) if c == 1 or (seq >= CP_MIN_SEQ and seq % (2 * c) == 0)]
    for how in (("even", "embedding-loss") if lay.pp > 1 else ("even",)):
        try:
            chunked = chunked_layers(spec.layers, lay.pp, how)
        except SetupError:
            continue
        vs = [v for v in range(1, VPP_MAX + 1) if v == 1 or (lay.pp > 1 and all(n % v == 0 for n in chunked))]
        for c in cps:
            for v in vs:
                out.append(Layout(lay.dp // c, lay.tp, lay.pp, c, v, how))
    return out


def layouts(spec: ModelSpec, gpus: int, gpus_per_node: int, tp: int | None = None, pp: int | None = None,
            dp: int | None = None, uneven: bool = False) -> list[Layout]:
    """Every dp × tp × pp == gpus with tp valid for the model and pp dividing the layers (fixed where given); with
    `uneven`, also pp dividing layers + 2 (Megatron's embedding-loss split)."""
    out = []
    for t in divisors(gpus):
        if (tp is not None and t != tp) or not tp_allowed(spec, t, gpus_per_node):
            continue
        for p in divisors(gpus // t):
            if (pp is not None and p != pp) or (spec.layers % p and not (uneven and (spec.layers + 2) % p == 0)):
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
    # interleaving runs micro-batch groups of pp: the accumulation is a multiple of pp (schedules.py:995-1015)
    step = p if layout.vpp > 1 else 1
    for b in range(1, max_batch + 1):
        accum = max(step, step * round(per_rank / (b * step)))
        if accum < p:  # the nearest count is too few to fill the pipeline: pp micro-batches, if within tolerance
            accum = p
            if abs(b * accum * layout.dp - global_seqs) > tolerance * global_seqs:
                break  # larger micro-batches leave even fewer micro-batches
        if abs(b * accum * layout.dp - global_seqs) <= tolerance * global_seqs:
            out.append((b, accum))
    return out


def max_micro_batch(layout: Layout, global_seqs: float | None, tolerance: float, cap: int = 4096) -> int:
    """The largest micro-batch the batch constraint could ever allow (before memory)."""
    if global_seqs is None:
        return cap
    return max(0, min(cap, int(global_seqs * (1 + tolerance) / (layout.dp * layout.pp))))
