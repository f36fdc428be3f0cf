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


def _combined(dgrad_us, attn_bwd_us):
    """A forward in Megatron's nodes (attention with the preprocess and permute; the dispatch all-to-all; ten expert
    GEMMs of 10 µs; the combine all-to-all and unpermute, 1 µs) and a backward of ten expert dgrads, the unpermute's
    and attention's backward and the main-grad accumulation (1 µs, attention's node: no forward op of its name)."""
    fwd = [memory("attention", 0, 0, "t"), memory("dispatch_metadata", 0, 0, "t"), memory("permute", 0, 0, "t"),
           memory("dispatch_a2a", 0, 0, "t"), memory("experts", 0, 0, "t", kernels=10),
           memory("combine_a2a", 0, 0, "t"), memory("unpermute", 0, 0, "t")]
    fs = [100 * US, 1 * US, 1 * US, 0.0, 100 * US, 0.0, 1 * US]
    bwd = [memory("unpermute.backward", 0, 0, "t"), memory("experts.dgrad", 0, 0, "t", kernels=10),
           memory("attention.backward", 0, 0, "t"), memory("grad_accumulate", 0, 0, "t")]
    bs = [1 * US, dgrad_us * US, attn_bwd_us * US, 1 * US]
    return fwd, fs, bwd, bs


def test_combined_backward_fills_the_forward_stretch():
    """Host 20 µs per kernel. The forward alone: from the sync at t0 the all-to-all (t0+20), the GEMMs fed one per
    issue (t0+230), the combine (t0+240, t0+261), attention issued at t0+280 ends t0+380, the preprocess t0+381 (the
    copies), the permute t0+382; the host, done at t0+320, passes the sync at t0+381: 178 µs idle of a 381 µs period
    (GPU 203). Combined with a backward of 200 µs of dgrads and 200 µs of attention backward (model_chunk_schedule_
    plan.py:190-252 order: unpermute backward, attention forward, dgrads, then the sync), the dgrads queued before
    the sync keep the stream busy through it: the steady state leaves 201 µs of them queued at each sync, every
    kernel waits on the one before it, and the period is the GPU's 605 µs: no idle."""
    from trainfit.analytic.host_queue import combined_stall

    fwd, fs, bwd, bs = _combined(200, 200)
    assert abs(sync_stall(fwd, fs, 20 * US) - 178 * US) < 1e-9
    assert combined_stall(fwd, fs, bwd, bs, 20 * US) < 1e-12


def test_combined_host_bound_by_hand():
    """A light backward (dgrads 50 µs, attention backward 50 µs): 29 kernels per combined layer, 580 µs of issue
    against 305 µs of GPU. Stepping from the sync at t0: a2a t0+20, GEMMs t0+230, combine t0+240 / t0+261, attention
    backward issued t0+280 ends t0+330, accumulation t0+331, unpermute backward t0+332, attention forward issued t0+340
    ends t0+440, the copies t0+441, permute t0+442, dgrads fed by their issue to t0+585; the host reaches the next
    sync at t0+580 (copies long landed): the period is the host's 580 µs, 275 µs idle."""
    from trainfit.analytic.host_queue import combined_stall

    fwd, fs, bwd, bs = _combined(50, 50)
    assert abs(combined_stall(fwd, fs, bwd, bs, 20 * US) - 275 * US) < 1e-9


def test_combined_phases_by_hand():
    """The compute beside each exchange of a combined layer (model_chunk_schedule_plan.py:190-252): the combine
    backward beside the unpermute backward (1 µs) and the attention forward with its preprocess and permute
    (100 + 1 + 1); the dispatch forward beside the expert dgrads (200); the dispatch backward beside the expert
    GEMMs (100); the combine forward beside its unpermute (1), the attention backward (50) and the main-grad
    accumulation (1, attention's node). The four partition the layer's forward and backward (556 µs)."""
    from trainfit.analytic.host_queue import combined_phases

    fwd, fs, bwd, bs = _combined(200, 50)
    phases = combined_phases(fwd, fs, bwd, bs)
    for got, want in zip(phases, (103, 200, 100, 52)):
        assert abs(got - want * US) < 1e-12
    assert abs(sum(phases) - (sum(fs) + sum(bs))) < 1e-12


def test_blocking_copy_drains_the_stream_by_hand():
    """A layer with no dispatcher sync but a blocking host-to-device copy (gpt-oss's linear offset: host_queue
    DRAIN_OPS): one 1 ms kernel, the copy, then ten 10 µs kernels; host 100 µs per kernel. Steady state, from the
    drain at t0 (the host waits for the stream): the ten kernels are issued at t0+0.1 … t0+1.0, the last ends
    t0+1.01; the next layer's long kernel is issued at t0+1.1 and ends t0+2.1, when the copy (issued at t0+1.2) has
    landed and the host passes the next drain. Period 2.1 ms, GPU work 1.1 ms: 1.0 ms idle per layer. Named anything
    else, the copy does not wait: no stall."""
    ms = 1e-3
    ops = [memory("long", 0, 0, "t"), memory("experts_act_offset", 0, 0, "t"), memory("short", 0, 0, "t", kernels=10)]
    secs = [1 * ms, 0.0, 0.1 * ms]
    assert abs(sync_stall(ops, secs, 0.1 * ms) - 1.0 * ms) < 1e-12
    assert sync_stall([ops[0], memory("copy", 0, 0, "t"), ops[2]], secs, 0.1 * ms) == 0.0
