"""Sliding-window layers timed as the stack's fused attention runs them: it skips the key blocks outside each query
tile's window, so a windowed layer's attention costs its window's pairs over the few blocks its tiles walk
(roofline._block_steps), not the whole causal prefix.

Which stacks and models: where the stack's attention takes the model's window itself (stacks/*.toml [attention]
window = "skipped" with its window_families): Megatron through Transformer Engine's FusedAttention (cuDNN) or
flash-attn for gpt-oss and Gemma 3, torchtitan through flex attention's block mask for gpt-oss. transformers' SDPA
path passes the window as an explicit mask instead (activations.masked_window_share), as Megatron-Bridge's Gemma 2
does, and the kernels that take a mask compute every block: those layers keep the full causal cost.

The layers are split by kind (as compute_time.layer_kinds splits dense and MoE layers): the windowed share of the
stage's average layer runs a Shape with `window` set (ops.attention_core puts it on the attention op), the rest the
full causal one. NB: per pipeline stage the share is the model's, averaged (exact at pp 1)."""
from __future__ import annotations

from dataclasses import replace

from ..setup import Setup
from ..spec import ModelSpec
from .ops.op import Shape


def skipped(spec: ModelSpec, setup: Setup) -> bool:
    """The stack's fused attention skips the key blocks outside this model's sliding window ([attention] window,
    for its window_families: the models whose window the stack passes to the kernel)."""
    facts = setup.stack_facts.facts.get("attention", {})
    return facts.get("window") == "skipped" and spec.family in facts.get("window_families", ())


def windowed_share(spec: ModelSpec, setup: Setup) -> float:
    """The share of the layers whose attention is a sliding window shorter than the sequence, where the stack skips
    the blocks outside it; 0 elsewhere."""
    window = spec.sliding_window
    if not window or window >= setup.seq or not skipped(spec, setup):
        return 0.0
    return spec.sliding_layers / spec.layers


def split(spec: ModelSpec, setup: Setup, shapes: list[tuple[float, Shape]]) -> list[tuple[float, Shape]]:
    """`shapes` (share, Shape) with each one's windowed share apart: (share · w, the Shape with the window),
    (share · (1 − w), the Shape as it was). Unchanged where no layer is windowed (windowed_share 0) or the kernel is
    eager (its scores are all computed)."""
    w = windowed_share(spec, setup)
    if not w:
        return shapes
    out = []
    for q, sh in shapes:
        if sh.attention == "eager":
            out.append((q, sh))
            continue
        out += [(q * s, x) for s, x in ((w, replace(sh, window=spec.sliding_window)), (1 - w, sh)) if s > 0]
    return out
