"""Nemotron-H timed from the op list (analytic/ops/mamba2.py): a small model's training step and its prefill and
decode answer with a GPU (no --mfu), and the Mamba-2 scan's batched matmuls the step time counts (each kind of
block's list, times its blocks: compute_time.layer_kinds) are the ones the trace engine's whole model dispatches,
forward and backward (trace/kernel_shapes.py, CUDA semantics: tiny-nemotron-h's attention is SDPA's flash kernel,
so every bmm of the traced step is the scan's). Per kind of block the kernels are compared in
tests/analytic/test_ops_vs_trace.py."""
from __future__ import annotations

from collections import Counter

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from trainfit.analytic.compute_time import layer_kinds  # noqa: E402
from trainfit.analytic.engine import estimate  # noqa: E402
from trainfit.analytic.ops import backward, layer_forward, shape_of  # noqa: E402
from trainfit.analytic.ops.mamba2 import SCAN  # noqa: E402
from trainfit.analytic.params import count_params  # noqa: E402
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
    for w, moe, linear, block in layer_kinds(spec, count_params(spec)):
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
