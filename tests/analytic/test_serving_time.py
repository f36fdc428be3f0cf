"""Serving throughput from the op lists (analytic/serving_time.py): one decode engine step against a hand roofline,
continuous batching's load curve, and --mfu's scope."""
from __future__ import annotations

import pytest

from trainfit.analytic import roofline, serving, serving_time
from trainfit.analytic.engine import estimate
from trainfit.analytic.parallel.collectives import Links
from trainfit.analytic.params import count_params
from trainfit.hardware import get_gpu
from trainfit.models.resolve import load_model
from trainfit.setup import Setup

# Llama 3.1 8B's config.json: hidden 4096, 32 layers, 32 heads of 128, 8 KV heads, intermediate 14336, vocab 128256
H, L, KV_HEADS, D, I = 4096, 32, 8, 128, 14336


def _engine(tp: int = 2, **kw):
    spec, gpu = load_model("llama-3.1-8b"), get_gpu("H200")
    setup = Setup(mode="serve", precision="bf16", tp=tp, max_model_len=8192, **kw)
    pc = count_params(spec)
    return spec, setup, gpu, pc, serving.serve_memory(spec, setup, gpu, pc)


def test_a_decode_step_is_the_hand_roofline():
    """B = 8 sequences at 4,096 cached tokens on 2 H200s: the layers' weights stream once (the GEMMs at M = 8 are
    memory-bound), every cached K and V is read once, and each layer all-reduces twice with vLLM's one-stage
    custom all-reduce (8 × 4096 × 2 bytes = 64 KiB < 512 KiB)."""
    spec, setup, gpu, pc, sv = _engine()
    kn = roofline.kernels_for(gpu)
    bw = gpu.memory_bandwidth * kn.hbm_fraction
    B, ctx, tp = 8, 4096, 2
    step = serving_time.engine_step(spec, setup, gpu, pc, sv.kv_bytes_per_token, B, ctx, 0, 1, sv.knobs.capture_sizes)
    # weights per GPU of the 32 layers: q, o (h × h), k, v (h × kv), gate, up, down (h × i), bf16, split over TP
    layer_weights = (2 * H * H + 2 * H * KV_HEADS * D + 3 * H * I) * 2 / tp
    assert step.kernels.gemm == pytest.approx(L * layer_weights / bw, rel=0.10)
    kv = B * ctx * L * 2 * (KV_HEADS // tp) * D * 2  # K and V, bf16, this rank's 4 KV heads
    assert step.kernels.attention == pytest.approx(kv / bw, rel=0.02)
    one_stage = (tp - 1) * B * H * 2 / Links.of(gpu).intra + kn.launch_seconds
    assert step.allreduce == pytest.approx(2 * L * one_stage, rel=1e-6)
    assert step.host == 0  # B = 8 is a captured size: one graph replay


def test_tpot_grows_and_throughput_saturates_with_concurrency():
    spec, setup, gpu, pc, sv = _engine()
    k = sv.knobs
    runs = [serving_time.steady_state(spec, setup, gpu, pc, sv.kv_bytes_per_token, k.max_num_batched_tokens,
                                      k.max_num_seqs, sv.kv_tokens, k.capture_sizes, c, 1024, 256)
            for c in (1, 8, 64, 256)]
    tpots = [r.tpot for r in runs]
    rates = [r.output_tokens_per_second for r in runs]
    assert tpots == sorted(tpots) and tpots[-1] > 2 * tpots[0]
    assert rates == sorted(rates) and rates[1] > 4 * rates[0]  # memory-bound: batching 8 is nearly free
    # a KV cache of 64 requests: 256 clients keep 192 in the queue; the rate stays, TTFT grows by the wait
    # (Little's law: 192 requests ahead at the rate the engine completes them)
    def held64(c):
        return serving_time.steady_state(spec, setup, gpu, pc, sv.kv_bytes_per_token, k.max_num_batched_tokens,
                                         k.max_num_seqs, 64 * 1280, k.capture_sizes, c, 1024, 256)
    full, over = held64(64), held64(256)
    assert over.running == 64 and over.output_tokens_per_second == pytest.approx(full.output_tokens_per_second)
    assert over.ttft - full.ttft == pytest.approx(192 / (full.output_tokens_per_second / 256))


def test_mfu_sets_the_prefill_only():
    spec, setup, gpu, pc, sv = _engine()
    caps = sv.knobs.capture_sizes

    def step(prefill, mfu):
        return serving_time.engine_step(spec, setup, gpu, pc, sv.kv_bytes_per_token, 16, 2048, prefill, 2048, caps,
                                        prefill_mfu=mfu).seconds
    decode = step(0, None)
    assert step(0, 0.2) == decode  # no prompt tokens: --mfu has nothing to set
    # the prompt tokens' share scales as 1 / mfu; the decodes' stays
    assert (step(512, 0.2) - decode) / (step(512, 0.4) - decode) == pytest.approx(2, rel=1e-6)


def test_infer_mfu_leaves_the_decode_step_alone():
    spec, gpu = load_model("llama-3.2-1b"), get_gpu("H100")
    s = Setup(mode="infer", batch=4, seq=2048)
    base, flat = estimate(spec, s, gpu), estimate(spec, s, gpu, mfu=0.3)
    assert flat.time.decode_tokens_per_second == base.time.decode_tokens_per_second
    assert flat.time.prefill_seconds != base.time.prefill_seconds


def test_serve_reports_ttft_tpot_and_rate():
    spec, gpu = load_model("llama-3.1-8b"), get_gpu("H200")
    e = estimate(spec, Setup(mode="serve", precision="bf16", max_model_len=8192, concurrency=32, prompt_len=512,
                             completion_len=128), gpu)
    ld = e.detail.serving.load
    assert ld["concurrency"] == 32 and ld["running"] == 32
    assert e.time.tokens_per_second == ld["output_tokens_per_second"]
    # a closed loop of 32 clients: each gets 128 tokens per TTFT + 127 TPOT
    per_request = ld["ttft_seconds"] + 127 * ld["tpot_seconds"]
    assert ld["output_tokens_per_second"] == pytest.approx(32 * 128 / per_request, rel=0.10)


def test_the_scheduler_binds_a_small_model_at_hundreds_of_requests():
    """A decode step of 500 Qwen3-0.6B requests on one H100 (one graph replay): beside the GPU's work the engine core's
    Scheduler.schedule() + update_from_output() over 500 requests is 500 × the version's measured seconds per
    request (servers.toml scheduler_host, bench/tools/vllm_scheduler_cpu). vLLM 0.33 schedules asynchronously
    (config/vllm.py:1685-1719): the step is the larger of the two; 0.11.0 does not (config/scheduler.py:138): the
    scheduler adds. SGLang's overlap scheduler overlaps an unmeasured cost: the GPU alone."""
    from trainfit import serving_versions
    spec, gpu = load_model("qwen3-0.6b"), get_gpu("H100-80GB")
    pc = count_params(spec)
    per = serving_versions.parse("vllm==0.33.0")["scheduler_host"][1]
    for server, overlapped in (("vllm==0.33.0", True), ("vllm==0.11.0", False), ("sglang", True)):
        setup = Setup(mode="serve", server=server, precision="bf16", max_model_len=2048)
        sizes = serving.serve_memory(spec, Setup(mode="serve", precision="bf16", max_model_len=2048), gpu,
                                     pc).knobs.capture_sizes
        assert sizes[-1] >= 500  # one graph replay: no per-kernel issue
        step = serving_time.engine_step(spec, setup, gpu, pc, 28 * 2 * 8 * 128 * 2, 500, 576, 0, 1, sizes)
        gpu_s = max(step.gpu_seconds, step.host)
        sched = 500 * serving_versions.parse(server).facts.get("scheduler_host", (0, 0))[1]
        assert (sched > 0) == server.startswith("vllm")
        assert step.overlapped == overlapped and step.scheduler == pytest.approx(sched)
        assert step.seconds == pytest.approx(max(gpu_s, step.host + sched) if overlapped else gpu_s + sched)
    assert 500 * per > gpu_s / 2  # the same order as the GPU's step (its 500 x 576 cached tokens' KV reads)
    one = serving_time.engine_step(spec, Setup(mode="serve", precision="bf16", max_model_len=2048), gpu, pc,
                                   28 * 2 * 8 * 128 * 2, 1, 576, 0, 1, (1, 2, 4, 8))
    assert one.seconds == one.gpu_seconds  # one request: the GPU binds, the scheduler hides behind it


def test_the_api_server_binds_a_small_model_streaming_hundreds_of_requests():
    """`vllm serve` streams each sampled token from one API server process beside the engine core: 500 Qwen3-0.6B
    decodes on one H100 cost the API server 500 × the version's measured seconds per token (servers.toml
    frontend_host, bench/tools/vllm_frontend_cpu), about the engine core's own step, and the step takes the larger.
    Offline (the LLM class: no API server) the same step is the engine core's alone; a 70B decode of 8 requests is
    GPU-bound either way (8 tokens: a fraction of a millisecond of streaming). SGLang's is not measured: 0."""
    from trainfit import serving_versions
    spec, gpu = load_model("qwen3-0.6b"), get_gpu("H100-80GB")
    pc = count_params(spec)
    for server in ("vllm==0.33.0", "vllm==0.19.0", "sglang"):
        setup = Setup(mode="serve", server=server, precision="bf16", max_model_len=2048)
        sizes = serving.serve_memory(spec, Setup(mode="serve", precision="bf16", max_model_len=2048), gpu,
                                     pc).knobs.capture_sizes
        args = (spec, setup, gpu, pc, 28 * 2 * 8 * 128 * 2, 500, 576, 0, 1, sizes)
        online, offline = (serving_time.engine_step(*args, streamed=s) for s in (True, False))
        per = serving_versions.parse(server).facts.get("frontend_host", 0.0)
        assert (per > 0) == server.startswith("vllm") and offline.api_server == 0
        assert online.api_server == pytest.approx(500 * per)
        assert online.seconds == pytest.approx(max(offline.seconds, 500 * per))
        if per:
            assert 0.5 < 500 * per / offline.seconds < 2  # the same order as the engine core's step
    big = load_model("llama-3.1-70b")
    setup = Setup(mode="serve", precision="bf16", tp=4, max_model_len=8192)
    args = (big, setup, gpu, count_params(big), 80 * 2 * 8 * 128 * 2 / 4, 8, 4096, 0, 1, (1, 2, 4, 8))
    assert serving_time.engine_step(*args, streamed=True).seconds == serving_time.engine_step(*args).seconds
    # the steady state streams by default (`vllm serve`); benchmark_throughput's offline engine does not
    sv = serving.serve_memory(spec, Setup(mode="serve", precision="bf16", max_model_len=2048), gpu, pc)
    k = sv.knobs
    st = [serving_time.steady_state(spec, Setup(mode="serve", precision="bf16", max_model_len=2048), gpu, pc,
                                    sv.kv_bytes_per_token, k.max_num_batched_tokens, k.max_num_seqs, sv.kv_tokens,
                                    k.capture_sizes, 1000, 512, 128, streamed=s) for s in (True, False)]
    assert st[0].step.api_server > 0 == st[1].step.api_server and st[0].tpot >= st[1].tpot
    # the estimate says which process binds, with both times
    from trainfit import estimate
    e = estimate("qwen3-0.6b", gpu="H100-80GB", mode="serve", concurrency=1000, prompt_len=256, completion_len=256)
    step = e.detail.serving.load["step_seconds"]
    assert step["api_server"] == step["total"] > 0
    assert any(n.startswith(f"the API server binds: streaming a step's tokens takes it {step['api_server'] * 1e3:.1f}")
               for n in e.notes)


def test_a_batch_over_what_the_engine_holds_runs_in_waves():
    """benchmark_latency's one batch of 96 equal requests against an engine that runs at most 32 at once: the
    scheduler stops admitting at max_num_seqs (0.19.0 v1/core/sched/scheduler.py:568) and the 32 running requests,
    equal in length, all finish on the same step, so the next 32 start then: three back-to-back batches of 32. A
    KV pool of 40 whole requests (512 + 128 tokens each) holds 80 as two waves of 40; a batch within both limits
    is one wave."""
    spec, setup, gpu, pc, sv = _engine()
    k = sv.knobs

    def latency(batch, max_seqs=None, kv_tokens=None):
        return serving_time.batch_latency(spec, setup, gpu, pc, sv.kv_bytes_per_token, batch, 512, 128,
                                          k.capture_sizes, k.max_num_batched_tokens, max_seqs, kv_tokens)
    one32, one40 = latency(32), latency(40)
    assert latency(96, max_seqs=32) == pytest.approx(3 * one32, rel=1e-12)
    assert latency(80, kv_tokens=40 * 640) == pytest.approx(2 * one40, rel=1e-12)
    assert latency(32, max_seqs=32, kv_tokens=32 * 640) == one32
    assert latency(96) < 3 * one32  # unlimited: one batch of 96 shares the weight reads of every decode step
