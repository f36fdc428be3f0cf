"""Tensor-parallel all-reduces run at the bus bandwidth NCCL measures on NVLink, not the line rate."""
import pytest

from trainfit.analytic.step_time import layout_step_time
from trainfit.hardware import get_gpu
from trainfit.models.resolve import load_model
from trainfit.setup import Setup


def test_tp_allreduce_at_measured_a100_busbw():
    spec = load_model("llama-2-7b")  # 32 layers, hidden 4096
    s = Setup(stack="megatron", precision="bf16-master", tp=8, dp=1, batch=1, seq=2048, recompute="none")
    tm = layout_step_time(spec, s, get_gpu("A100-80GB"))
    # hand: 4 all-reduces per layer (Shoeybi et al. 2019 Fig. 4) of one bf16 b*s*h activation, ring all-reduce
    # 2(n-1)/n * bytes / busbw, busbw ~207 GB/s measured by all_reduce_perf on 8x A100 NVLink (nccl-tests #149/#178),
    # as NCCL times it at 16 MiB: LL128 (0.92 of the bus) with its latency 14 + 14 steps x 1.9 µs on NVLink
    # (tuning.cc:134-156, 280, 337-356 at v2.27.5-1), faster than Simple's 8.4 + 14 x 3.4 µs at the full bus
    x = 1 * 2048 * 4096 * 2
    hand = 32 * 4 * ((14 + 14 * 1.9) * 1e-6 + 2 * 7 / 8 * x / (0.92 * 207e9))
    assert tm.tp_comm == pytest.approx(hand, rel=0.02)


def test_h100_ring_busbw_is_370_of_450():
    # sjeaugey, NVIDIA/nccl-tests#212: 450 GB/s line rate, ~370 GB/s effective after protocol overhead
    from trainfit.analytic.roofline import kernels_for
    gpu = get_gpu("H100-80GB")
    assert gpu.intra_node_bandwidth * kernels_for(gpu).link_fraction == pytest.approx(370e9, rel=0.01)
