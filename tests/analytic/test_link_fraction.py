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


# AMD, "Understanding RCCL Bandwidth and xGMI Performance on AMD Instinct MI300X" (ROCm/rocm-blogs
# blogs/software-tools-optimization/mi300x-rccl-xgmi/README.md, 2025-03-02): rccl-tests all_reduce_perf on 8 MI300X
# (RCCL 2.22.3, ROCm 6.3.0, one process per GPU), out-of-place time per call in µs. The xGMI mesh's 448 GB/s line
# rate would give 2 * 7/8 * bytes / 448e9: 4.19 ms at 1 GiB, 30 % under the measured 5.97 ms.
RCCL_MI300X_ALLREDUCE_US = {512 << 20: 3026.2, 1 << 30: 5970.6, 2 << 30: 11891.0}


@pytest.mark.parametrize("nbytes", sorted(RCCL_MI300X_ALLREDUCE_US))
def test_mi300x_allreduce_at_rccl_tests_time(nbytes):
    from trainfit.analytic.parallel.collectives import Links
    t = Links.of(get_gpu("MI300X")).allreduce(8, 8, nbytes)
    assert t == pytest.approx(RCCL_MI300X_ALLREDUCE_US[nbytes] * 1e-6, rel=0.03)
