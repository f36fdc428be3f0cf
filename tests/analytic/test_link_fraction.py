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
    # 2(n-1)/n * bytes / busbw, busbw ~207 GB/s measured by all_reduce_perf on 8x A100 NVLink (nccl-tests #149/#178)
    x = 1 * 2048 * 4096 * 2
    hand = 32 * 4 * 2 * 7 / 8 * x / 207e9
    assert tm.tp_comm == pytest.approx(hand, rel=0.02)


def test_h100_ring_busbw_is_370_of_450():
    # sjeaugey, NVIDIA/nccl-tests#212: 450 GB/s line rate, ~370 GB/s effective after protocol overhead
    from trainfit.analytic.roofline import kernels_for
    gpu = get_gpu("H100-80GB")
    assert gpu.intra_node_bandwidth * kernels_for(gpu).link_fraction == pytest.approx(370e9, rel=0.01)
