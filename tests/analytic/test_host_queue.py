"""The host/stream queue between the alltoall dispatcher's host syncs (analytic/host_queue.py), against a layer
stepped through by hand."""
from trainfit.analytic.host_queue import sync_stall
from trainfit.analytic.ops.op import memory

US = 1e-6


def _layer(sync="dispatch_a2a"):
    """One layer's forward in Megatron's order: attention (one 100 µs kernel), the router and the preprocess whose
    last kernels are the D2H copies (1 µs each), the permute (1 µs), the all-to-all the host waits before (no GPU time
    here), and ten per-expert GEMMs of 10 µs."""
    ops = [memory("attention", 0, 0, "t"), memory("router", 0, 0, "t"), memory("dispatch_metadata", 0, 0, "t"),
           memory("permute", 0, 0, "t"), memory(sync, 0, 0, "t"), memory("experts", 0, 0, "t", kernels=10)]
    return ops, [100 * US, 1 * US, 1 * US, 1 * US, 0.0, 100 * US]


def test_host_bound_stretch_by_hand():
    """Host 20 µs per kernel. From the sync at t0 the host issues the all-to-all (t0+20) and the ten GEMMs, each
    waiting for its issue (10 µs < 20 µs): the last issued at t0+220 ends t0+230; attention's kernel is issued at
    t0+240 and ends t0+340; router and preprocess end t0+342, when the copies land and the host, done issuing at
    t0+300, passes the next sync. Period 342 µs, GPU work 203 µs: 139 µs idle per layer, where the stretch's whole
    issue time less its GPU time (15 × 20 − 203) would give 97."""
    ops, secs = _layer()
    assert abs(sync_stall(ops, secs, 20 * US) - 139 * US) < 1e-9


def test_gpu_bound_stretch_idles_nothing():
    """Host 1 µs per kernel: the preprocess ends at the sync t0, the permute at t0+1, when the all-to-all is issued;
    the first GEMM is issued at t0+2 and from there the GEMMs (10 µs) outrun their issue: t0+102, attention t0+202,
    router and preprocess t0+204. Period 204 µs: the GPU waits only the one issue slot after the sync."""
    ops, secs = _layer()
    assert abs(sync_stall(ops, secs, 1 * US) - 1 * US) < 1e-9


def test_no_sync_no_stall():
    """A block whose dispatcher does not wait on the host (no dispatch_a2a: ops/moe.py) adds nothing here."""
    ops, secs = _layer(sync="other")
    assert sync_stall(ops, secs, 20 * US) == 0.0
