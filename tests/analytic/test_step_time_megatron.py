"""The step-time model's Megatron axes: interleaved bubble, fp16 tensor cores, context and expert parallelism."""
from __future__ import annotations

import pytest

from trainfit.analytic.step_time import layout_step_time
from trainfit.hardware import get_gpu
from trainfit.models.resolve import load_model
from trainfit.setup import Setup


def _mb_time(tm) -> float:  # m × one micro-batch on the slowest stage (everything the bubble is a fraction of)
    return tm.compute + tm.recompute + tm.tp_comm + tm.pp_comm + tm.cp_comm + tm.ep_comm


@pytest.mark.parametrize("v", [1, 2, 4])
def test_interleaved_bubble_is_narayanans(v):
    # Narayanan et al. 2021 §2.2.2: bubble time fraction = (1/v) · (p − 1)/m
    spec = load_model("llama-3.1-405b")
    p, m = 16, 32
    s = Setup(stack="megatron", precision="bf16-master", tp=8, pp=p, dp=4, vpp=v, grad_accum=m, seq=8192,
              pp_split="embedding-loss", sequence_parallel=True, recompute="full")
    tm = layout_step_time(spec, s, get_gpu("H100-80GB"))
    assert tm.bubble / _mb_time(tm) == pytest.approx((p - 1) / (v * m), rel=1e-9)


def test_fp16_master_runs_on_v100_tensor_cores():
    # NVIDIA V100 datasheet: 125 TFLOP/s fp16 tensor core vs 15.7 TFLOP/s fp32 — fp16-master must not be timed at fp32
    spec = load_model("gpt2-xl")
    gpu = get_gpu("V100-32GB")
    kw = dict(stack="megatron", tp=1, pp=1, dp=1, batch=4, seq=1024)
    fp16 = layout_step_time(spec, Setup(precision="fp16-master", **kw), gpu)
    fp32 = layout_step_time(spec, Setup(precision="fp32", **kw), gpu)
    assert fp32.step_seconds / fp16.step_seconds > 4


def test_context_parallel_splits_compute_and_passes_kv():
    spec = load_model("llama-3.1-8b")
    gpu = get_gpu("H100-80GB")
    kw = dict(stack="megatron", precision="bf16-master", tp=8, pp=1, seq=131072, batch=1, sequence_parallel=True,
              recompute="full")
    one = layout_step_time(spec, Setup(cp=1, dp=2, **kw), gpu)
    two = layout_step_time(spec, Setup(cp=2, dp=1, **kw), gpu)  # same 16 GPUs, the sequence split in two
    assert one.cp_comm == 0
    # each rank computes on s / cp tokens (against all s keys: the causal attention FLOPs halve too); the roofline's
    # fixed per-kernel launch costs and shape-dependent GEMM efficiency do not halve exactly
    assert two.compute == pytest.approx(one.compute / 2, rel=0.01)
    # ring attention overlaps the K/V passing with the attention compute (quadratic in s, the K/V linear): at 128k
    # tokens the ring hides behind the attention; at 2k, over the inter-node ring (t·cp = 16 > 8 GPUs per node), not
    assert two.cp_comm == 0
    # (Llama-2-7B: no GQA, 4x the K/V of Llama-3.1-8B's per rank, so the 2k ring is clearly longer than the
    # attention kernel it overlaps)
    short = layout_step_time(load_model("llama-2-7b"), Setup(cp=2, dp=1, **{**kw, "seq": 2048}), gpu)
    assert short.cp_comm > 0


def test_expert_parallel_all_to_all():
    spec = load_model("mixtral-8x7b")
    gpu = get_gpu("H100-80GB")
    kw = dict(stack="megatron", precision="bf16-master", tp=1, pp=1, dp=8, seq=4096, batch=1, recompute="full")
    none = layout_step_time(spec, Setup(ep=1, **kw), gpu)
    ep8 = layout_step_time(spec, Setup(ep=8, moe_imbalance=1.0, **kw), gpu)  # balanced routing (moe_imbalance.py)
    assert none.ep_comm == 0
    # dispatch + combine, forward + backward: 4 all-to-alls of 4096 tokens × top-2 × 4096 hidden × 2 B, 7/8 leaving,
    # over NVLink (450 GB/s line rate, ~370 GB/s NCCL busbw: nccl-tests#212) on each of the 32 layers
    expect = 32 * 4 * 7 / 8 * 4096 * 2 * 4096 * 2 / 370e9
    assert ep8.ep_comm == pytest.approx(expect, rel=0.01)


def test_16_bit_grad_buffer_adds_the_main_grad_upcast():
    """Megatron's fp32 main params step on fp32 grads whatever the buffer: under --bf16 the fp32 main-grad buffer's
    own shard, with --grad-reduce-in-bf16 a .float() copy of each bf16 shard first (distrib_optimizer.py:2419): one
    more pass reading 2 and writing 4 bytes a parameter, one launch a tensor; the Adam update itself unchanged."""
    from trainfit.analytic import roofline
    from trainfit.analytic.compute_time import optimizer_seconds
    from trainfit.analytic.precision import state_bytes

    gpu, shard, tensors = get_gpu("H100-80GB"), 1e9, 100
    kw = dict(stack="megatron", precision="bf16-master", dp=8, zero=1)
    fp32_buf, bf16_buf = (Setup(grad_reduce_in_bf16=b, **kw) for b in (False, True))
    (s32, l32), (s16, l16) = (optimizer_seconds(gpu, s, state_bytes(s), shard, tensors) for s in (fp32_buf, bf16_buf))
    assert s16 - s32 == pytest.approx(roofline.memory_seconds(gpu, shard * (2 + 4), 0, "upcast"), rel=1e-9)
    assert (l16 - l32) / roofline.kernels_for(gpu).launch_seconds == pytest.approx(tensors)
