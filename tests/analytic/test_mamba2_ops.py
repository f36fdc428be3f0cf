"""Nemotron-H timed from the op list (analytic/ops/mamba2.py): a small model's training step and its prefill and
decode answer with a GPU (no --mfu), and the Mamba-2 scan's batched matmuls the step time counts (each kind of
block's list, times its blocks: compute_time.layer_kinds) are the ones the trace engine's whole model dispatches,
forward and backward (trace/kernel_shapes.py, CUDA semantics: tiny-nemotron-h's attention is SDPA's flash kernel,
so every bmm of the traced step is the scan's). Per kind of block the training kernels are compared in
tests/analytic/test_ops_vs_trace.py; here, a Mamba block's prefill and decode step (the conv-state and the recurrent
state updates) against the kernels of the trace engine's inference step (step/infer.py)."""
from __future__ import annotations

from collections import Counter

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from dataclasses import replace  # noqa: E402

from trainfit.analytic.compute_time import layer_kinds  # noqa: E402
from trainfit.analytic.engine import estimate  # noqa: E402
from trainfit.analytic.ops import backward, layer_forward, shape_of  # noqa: E402
from trainfit.analytic.ops.mamba2 import SCAN  # noqa: E402
from trainfit.analytic.precision import state_bytes  # noqa: E402
from trainfit.analytic.timing import compute_dtype  # noqa: E402
from trainfit.hardware import get_gpu  # noqa: E402
from trainfit.models.resolve import load_model  # noqa: E402
from trainfit.setup import Setup  # noqa: E402
from trainfit.trace.kernel_shapes import step_kernels  # noqa: E402


def _key(phase: str, m: float, n: float, k: float, batch: float) -> tuple:
    """A batched GEMM as either operand order computes it: its output dims unordered, the contraction, the batch."""
    return phase, *sorted((round(m), round(n))), round(k), round(batch)


@pytest.mark.parametrize("precision", ["amp-bf16", pytest.param("bf16", marks=pytest.mark.heavy)])
def test_step_time_counts_the_traced_scan_kernels(precision):
    spec = load_model("tiny-nemotron-h")
    setup = Setup(batch=2, seq=128, precision=precision, device="cuda")
    e = estimate(spec, setup, get_gpu("H100-80GB"))
    assert e.time is not None and 0 < e.time.step_seconds < 1 and 0 < e.time.mfu < 1
    sh = shape_of(spec, setup, state_bytes(setup), compute_dtype(setup))
    listed: Counter = Counter()
    for w, moe, linear, block in layer_kinds(spec):
        fwd = layer_forward(spec, sh, moe, linear, block)
        for phase, ops in (("forward", fwd), ("backward", backward(fwd))):
            for op in ops:
                if op.kind == "gemm" and op.name.startswith(SCAN):
                    listed[_key(phase, op.m, op.n, op.k, op.batch)] += round(w * spec.layers)
    traced = Counter(_key(k.phase, k.m, k.n, k.k, k.batch) for k in step_kernels(spec, setup) if k.op == "bmm")
    assert listed and listed == traced, f"trace only {dict(traced - listed)}, op list only {dict(listed - traced)}"
    # five einsums per Mamba block forward (C·Bᵀ, M·x, the chunk states, the recurrence, C·states), two each back
    assert sum(c for key, c in traced.items() if key[0] == "forward") == 5 * spec.hybrid.mamba_layers


def test_inference_is_timed():
    spec = load_model("tiny-nemotron-h")
    e = estimate(spec, Setup(batch=2, seq=128, precision="bf16", device="cuda", mode="infer"), get_gpu("H100-80GB"))
    assert e.time.prefill_seconds > 0 and e.time.decode_tokens_per_second > 0


def _inference_kernels(spec, setup, mamba_blocks: int) -> list:
    """The kernels of the trace engine's inference step (prefill, then one decode step) of `spec` as one attention
    block (transformers' cache needs one to count the tokens seen) then `mamba_blocks` Mamba blocks."""
    from trainfit.models.hf_config import spec_from_config
    from trainfit.trace.kernel_shapes import inference_kernels

    cfg = {k: v for k, v in spec.config.items() if k not in ("layers_block_type", "layer_types")}
    pattern = "*" + "M" * mamba_blocks
    stack = spec_from_config({**cfg, "hybrid_override_pattern": pattern, "num_hidden_layers": len(pattern)},
                             spec.name)
    return inference_kernels(stack, setup)


def test_inference_lists_match_the_traced_mamba_block():
    """One Mamba block's prefill (the chunked scan, its cache writes aside) and decode step (causal_conv1d_update,
    mamba2_selective_state_update): GEMM shapes exact, kernels within 4, bytes within 10 %. An in-place copy_ into a
    state (the decode's conv and SSM states; transformers 5.25's cache write of the SSM state) moves its source and
    its destination once each; the trace counts the destination both as an argument and as the output
    (kernel_shapes.kernel_of): a third of a same-dtype copy_'s bytes is taken off (counted whole, the decode read
    +7.5 % under transformers 5.24, +10.9 % under 5.25; taken off, +0.4 % under both)."""
    spec = load_model("tiny-nemotron-h")
    setup = Setup(batch=2, seq=128, precision="bf16", device="cuda", mode="infer")
    more, fewer = (Counter(_inference_kernels(spec, setup, n)) for n in (3, 2))
    sh = shape_of(spec, setup, state_bytes(setup), compute_dtype(setup))
    for phase, shape in (("prefill", sh), ("decode", replace(sh, seq=1, decode=True))):
        traced = Counter({k: c for k, c in (more - fewer).items() if k.phase == phase})
        ops = layer_forward(spec, shape, block="mamba")
        assert Counter(_key(phase, k.m, k.n, k.k, k.batch) for k, c in traced.items() for _ in range(c)
                       if k.kind == "gemm") == Counter(_key(phase, o.m, o.n, o.k, o.batch) for o in ops
                                                       if o.kind == "gemm")
        assert abs(sum(traced.values()) - sum(o.kernels for o in ops)) <= 4
        nbytes = sum((k.nbytes * 2 // 3 if k.op == "copy_" else k.nbytes) * c for k, c in traced.items()
                     if k.kind == "memory")
        listed = sum(o.nbytes for o in ops if o.kind == "memory")
        assert abs(nbytes / listed - 1) <= 0.10, f"{phase}: trace {nbytes}, op list {listed:.0f}"
