"""KV cache, FLOPs and time against hand derivations and published rules."""
import pytest

from trainfit.analytic.engine import estimate
from trainfit.hardware import get_gpu
from trainfit.models.resolve import load_model
from trainfit.setup import Setup

GiB = 1 << 30


def test_llama31_8b_kv_cache_is_one_gib_per_8k_sequence():
    # 2 (k, v) · 32 layers · 8 kv heads · 128 head_dim · 8192 tokens · 2 bytes = 2^30 (issue 2)
    e = estimate(load_model("llama-3.1-8b"), Setup(mode="infer", precision="bf16", batch=1, seq=8192))
    assert e.memory.kv_cache == GiB


def test_kv_cache_scales_with_batch_and_mqa():
    spec = load_model("llama-3.1-8b")
    assert estimate(spec, Setup(mode="infer", precision="bf16", batch=16, seq=8192)).memory.kv_cache == 16 * GiB
    # GQA: llama-2-70b has 8 kv heads of 64 → 8x smaller cache than its 64 query heads would need
    l70 = load_model("llama-2-70b")
    kv = estimate(l70, Setup(mode="infer", precision="bf16", batch=1, seq=4096)).memory.kv_cache
    assert kv == 2 * 80 * 8 * 128 * 4096 * 2


def test_six_n_rule_for_gpt3():
    # Kaplan et al. 2020: C ≈ 6N per token, attention adding 6·n_layer·n_ctx·d_attn (here halved: causal)
    spec = load_model("gpt-3-175b")
    e = estimate(spec, Setup(seq=2048))
    n = e.params
    assert e.flops.per_token == pytest.approx(6 * n, rel=0.03)
    attn = 6 * 96 * 12288 * (2048 + 1) / 2 * 2
    assert e.flops.per_token > 6 * (n - 50257 * 12288 - 2048 * 12288)  # lookups cost nothing, head does
    assert e.flops.per_token - attn == pytest.approx(6 * (n - 2048 * 12288), rel=0.01)


def test_full_recompute_adds_one_forward_of_the_layers():
    spec = load_model("llama-2-7b")
    base = estimate(spec, Setup(seq=4096))
    full = estimate(spec, Setup(seq=4096, recompute="full"))
    head = 2 * 32000 * 4096 * 4096
    assert full.flops.recompute == pytest.approx(base.flops.forward - head, rel=1e-9)
    assert full.flops.step / base.flops.step == pytest.approx(4 / 3, rel=0.02)  # Narayanan et al. 2021: 4 passes


def test_step_time_at_stated_mfu():
    spec = load_model("llama-3.1-8b")
    gpu = get_gpu("H100-80GB")
    e = estimate(spec, Setup(batch=1, seq=4096), gpu, mfu=0.5)
    assert e.time.step_seconds == pytest.approx(e.flops.step / (989.4e12 * 0.5), rel=0.01)
    e2 = estimate(spec, Setup(batch=1, seq=4096), gpu, mfu=0.5, tokens=1e12)
    hours = 1e12 / e2.time.tokens_per_second / 3600
    assert e2.time.gpu_hours == pytest.approx(hours)
    assert e2.time.cost_usd == pytest.approx(hours * gpu.price_per_hour)
    assert e2.time.energy_kwh == pytest.approx(hours * 0.7)


def test_eager_decode_is_bound_by_the_weights_and_the_host():
    """A decode token reads every weight (16 GB of bf16) once, so no more than 3.35 TB/s / 16 GB ≈ 209 tokens/s at
    batch 1; an eager HF decode step also issues each of its ~700 kernels from the host (no_grad: 23.3 µs each,
    measured on H200 hosts, kernels.toml [host]), which binds it at batch 1 (measured: llama-3.2-1b's decode
    kernels ran 1.3 ms of a 14-19 ms step, bench/results/gpu/H200-2026-11-27-unrecorded-6-truth.json)."""
    spec = load_model("llama-3.1-8b")
    gpu = get_gpu("H100-80GB")
    setup = Setup(mode="infer", precision="bf16", batch=1, seq=1024)
    e = estimate(spec, setup, gpu)
    assert e.time.decode_tokens_per_second < gpu.memory_bandwidth / e.memory.weights
    assert e.detail.decode.host_bound and not e.detail.prefill.host_bound
    # --mfu names the prefill's utilisation: the decode step stays the op list's, host-bound
    flat = estimate(spec, setup, gpu, mfu=0.4)
    assert flat.time.decode_tokens_per_second == e.time.decode_tokens_per_second and flat.detail.decode.host_bound


def test_largest_batch_really_is_the_largest():
    spec = load_model("llama-3.1-8b")
    gpu = get_gpu("L4")
    e = estimate(spec, Setup(mode="infer", precision="bf16", batch=1, seq=4096), gpu)
    b = e.time.max_batch
    # the Ada context (426 MiB, unsloth-zoo#1053) carried to the L4's 58 SMs (426 - 142 x 1536 KiB + 58 x 1536 KiB)
    # + the cuBLAS workspace (CublasHandlePool.cpp)
    cap = gpu.memory - 300 * 2**20 - (4096 * 1024 * 2 + 16 * 1024 * 8)
    assert b >= 1 and e.fit.capacity == cap
    # judged by the fit rule, as the fit is: what the run needs from the caching allocator (analytic/fit_rule.py)
    assert estimate(spec, Setup(mode="infer", precision="bf16", batch=b, seq=4096)).memory.required <= cap
    assert estimate(spec, Setup(mode="infer", precision="bf16", batch=b + 1, seq=4096)).memory.required > cap
