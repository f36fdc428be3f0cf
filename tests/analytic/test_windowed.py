"""Sliding-window layers (analytic/windowed.py): the fused kernel's block walk under a window against walking every
query tile and row, the windowed share per stack, and a gpt-oss layer's attention on Megatron as the two kinds of
layer timed apart. Fast (no torch)."""
from __future__ import annotations

import math
import random

import pytest

from trainfit.analytic import compute_time, roofline, windowed
from trainfit.analytic.ops.op import Op
from trainfit.analytic.params import count_params
from trainfit.analytic.precision import state_bytes
from trainfit.api import load_spec
from trainfit.hardware import get_gpu
from trainfit.setup import Setup


def walked(s_q: int, s_kv: int, br: int, bc: int, window: int) -> tuple[int, int, int]:
    """(tiles, total steps, longest) by walking each query tile from the block of its first row's first key to the
    block of its last row's last key (bottom-right causal, each row its last `window` keys)."""
    full, total, longest, d = math.ceil(s_kv / bc), 0, 0, s_kv - s_q
    for t in range(math.ceil(s_q / br)):
        last = min(full, max(0, math.ceil(((t + 1) * br + d) / bc)))
        first = max(0, t * br + d - window + 1) // bc
        steps = max(0, last - first)
        total, longest = total + steps, max(longest, steps)
    return math.ceil(s_q / br), total, longest


def counted(s_q: int, s_kv: int, window: int) -> int:
    """Pairs by counting each row's keys."""
    d = s_kv - s_q
    return sum(max(0, min(s_kv - 1, i + d) - max(0, i + d - window + 1) + 1) for i in range(s_q))


def test_window_block_steps_and_pairs_are_the_walk():
    rng = random.Random(63)
    for _ in range(2000):
        s_q, s_kv = rng.randint(0, 900), rng.randint(0, 900)
        br, bc = rng.choice((1, 64, 128, 176)), rng.choice((1, 32, 64, 128))
        window = rng.randint(1, 1000)
        if window >= s_kv:  # (no window: the causal walk, tests/cli/test_bounded_work.py)
            continue
        assert roofline._block_steps.__wrapped__(s_q, s_kv, br, bc, True, window) == walked(s_q, s_kv, br, bc, window)
        assert roofline.attention_pairs(s_q, s_kv, True, window) == pytest.approx(counted(s_q, s_kv, window), abs=1e-9)


def test_windowed_op_counts_the_windows_pairs():
    # gpt-oss's 128-token window over 4,096 tokens: rows 0-127 see 1..128 keys, the other 3,968 see 128 each
    pairs = 128 * 129 / 2 + (4096 - 128) * 128
    op = Op("attention", "attention", "bf16", 4096, 4096, 64, 64, causal=True, window=128)
    assert op.flops == pytest.approx(4 * 64 * pairs * 64)
    assert op._replace(window=0).flops == pytest.approx(4 * 64 * 4096 * 4097 / 2 * 64)


def test_windowed_share_follows_the_stack():
    spec = load_spec("gpt-oss-120b")  # every other of 36 layers: 18 sliding (gpt_oss.py layer_types)
    assert spec.sliding_window == 128 and spec.sliding_window_layers == 18
    assert windowed.windowed_share(spec, Setup(stack="megatron", seq=4096, precision="bf16-master")) == 0.5
    assert windowed.windowed_share(spec, Setup(stack="torchtitan", seq=4096)) == 0.5
    # transformers passes the window as an SDPA mask: every block computed
    assert windowed.windowed_share(spec, Setup(stack="hf", seq=4096)) == 0.0
    assert windowed.windowed_share(spec, Setup(stack="megatron", seq=128, precision="bf16-master")) == 0.0  # the window spans the sequence
    # Megatron-Bridge's Gemma 2 masks its window explicitly and its Mistral sets none: every block computed
    for name in ("gemma-2-9b", "mistral-7b"):
        assert windowed.windowed_share(load_spec(name), Setup(stack="megatron", seq=16384, precision="bf16-master")) == 0
    assert windowed.windowed_share(load_spec("gemma-3-27b"), Setup(stack="megatron", seq=4096,
                                                                   precision="bf16-master")) == pytest.approx(52 / 62)


def test_gpt_oss_layer_attention_is_its_two_kinds_of_layer():
    """The stage's average layer's attention forward on Megatron = half a full causal call and half a windowed one,
    each the fused kernel over the rank's heads (64 query heads of width 64, micro-batch 2 x 4,096)."""
    spec, gpu = load_spec("gpt-oss-120b"), get_gpu("H100-80GB")
    s = Setup(stack="megatron", seq=4096, batch=2, grad_accum=1, precision="bf16-master")
    compute_time.clear_memos()
    sc = compute_time.stage_compute(spec, s, gpu, state_bytes(s), count_params(spec), (spec.layers,) * 3)

    def call(window: int) -> float:
        return roofline.attention_seconds(gpu, "sdpa", 2 * 64, 4096, 4096, 64, True, "bf16", False, window=window)

    assert sc.attention_forward == pytest.approx(0.5 * call(0) + 0.5 * call(128), rel=1e-9)
    assert call(128) < call(0) / 5  # 128 of 2,048 keys a query sees on average
