"""Fixed overheads (trainfit/overheads.py, data/overheads.toml) against independent sources, derived by hand."""
import statistics
import tomllib
from pathlib import Path

from trainfit import nccl_buffers, overheads
from trainfit.analytic import fit_rule
from trainfit.analytic.engine import estimate
from trainfit.analytic.memory import train_memory
from trainfit.hardware import get_gpu
from trainfit.models.resolve import load_model as load_spec
from trainfit.analytic.fit_rule import capacity
from trainfit.setup import Setup
from bench import data

ROOT = Path(__file__).resolve().parents[1]

MiB = 2**20


def test_nccl_channels_from_the_topology_search():
    """NCCL v2.21.5 graph/search.cc on a flat node, by hand; the counts published NCCL logs print."""
    from trainfit import nccl_buffers as nb
    # H100 SXM: 18 NVLinks x 20.6 GB/s (topo.h SM90_NVLINK_BW) = 370.8 GB/s to the NVSwitch. sm_90 speeds 60, 50,
    # 40, 30, 24: 6 x 60 = 360, 7 x 50 = 350, 9 x 40 = 360, 12 x 30 = 360 (not larger), 24 / 60 < 0.49 stops: 6
    # channels at 60; ncclTopoDupChannels (60 >= 50) -> 12; ncclTopoPostset -> 24. Published: "24 coll channels"
    # on 8 x H100 (p5.48xlarge NCCL INFO lines).
    assert nb.ring_channels({"nvlinks": 18, "sm": 90}) == 24
    # H800: 8 NVLinks = 164.8 GB/s: 2 x 60, 3 x 50, 4 x 40 = 160 (best), 5 x 30, 6 x 24, 8 x 20 = 160 (not larger);
    # dup: 40 < 50 but 4 channels is not > 4 -> 8; Postset -> 16. Published: NVIDIA/nccl#892, 8 x H800:
    # "16 coll channels".
    assert nb.ring_channels({"nvlinks": 8, "sm": 90}) == 16
    # A100 SXM: 12 x 20 = 240 GB/s; older speeds start at 40: 6 x 40 = 240 reaches the total; dup -> 12 -> 24
    # (NVIDIA/nccl#652, kwen2501: "24 would have been the number of channels needed for intra-node bandwidth").
    assert nb.ring_channels({"nvlinks": 12, "sm": 80}) == 24
    # L4, PCIe Gen4 x16: 16 x 120 / 80 = 24 GB/s; speeds from 20: 1 x 20, 1 x 18, 1 x 15, 2 x 12 = 24 reaches it;
    # 12 < 25: no dup; Postset -> 4.
    assert nb.ring_channels({"pcie": "gen4", "sm": 89}) == 4
    # T4, Gen3 x16 = 12 GB/s: 1 x 12 reaches it -> 2.
    assert nb.ring_channels({"pcie": "gen3", "sm": 75}) == 2


def test_nccl_communicator_bytes_per_rank():
    # P2P transport (transport/p2p.cc): receiver ncclRecvMem (4096) + LL 524,288 + LL128 4,915,200 + SIMPLE 4 MiB =
    # 9,637,888 B -> 10 MiB (CUDA_IPC_MIN 2 MiB); sender ncclSendMem 4096 -> 2 MiB. A middle rank of the chain
    # receives from 2 peers and sends to 2 (ring and chain share the neighbour's connection): 24 MiB per channel.
    assert 4096 + 524_288 + 4_915_200 + (1 << 22) == 9_637_888 and -(-9_637_888 // (2 * MiB)) == 5
    h100, l4, a100 = get_gpu("H100-80GB"), get_gpu("L4"), get_gpu("A100-80GB")
    assert nccl_buffers.communicator_bytes(h100, 4, nvls_local=0) == 24 * (2 * 10 + 2 * 2) * MiB  # 576 MiB
    # NVLS at 8 ranks (transport/nvls.cc): 16 channels x 2 x (128 KiB x 8 + 2 MiB) x 8 heads = 768 MiB more
    assert nccl_buffers.communicator_bytes(h100, 8) == (576 + 16 * 2 * 3 * 8) * MiB
    # 4 L4s over PCIe: 4 channels x 24 MiB
    assert nccl_buffers.communicator_bytes(l4, 4) == 96 * MiB
    # 2 A100s (NVLink, P2P read: SIMPLE on the sender): receiver 4096 + LL + LL128 -> 6 MiB, sender 4096 + 4 MiB ->
    # 6 MiB; one peer each way: 24 channels x 12 MiB
    assert nccl_buffers.communicator_bytes(a100, 2) == 24 * 12 * MiB
    assert nccl_buffers.communicator_bytes(a100, 1) == 0


def test_nvls_only_where_a_group_has_more_than_two_gpus_on_a_node():
    # Megatron tp 8 x dp 4 on 8-GPU H100 nodes (ranks in order tp, cp, dp, pp): rank 0's tp group is GPUs 0-7 of
    # its node: NVLS over 8 heads; its dp group is ranks 0, 8, 16, 24, one per node: NCCL sees 1 local GPU and
    # keeps NVLS off (transport/nvls.cc:241: gpuCount <= 2); the model group (tp x pp = 8) is the tp block again.
    s = Setup(stack="megatron", tp=8, dp=4, precision="bf16-master")
    o = overheads.overheads(get_gpu("H100-80GB"), s)
    assert overheads.local_ranks(s, "dp_cp", 4, 8) == 1 and overheads.local_ranks(s, "tp", 8, 8) == 8
    assert o["nccl_tp"] == o["nccl_model"] == (576 + 768) * MiB
    assert o["nccl_dp_cp"] == 576 * MiB


def test_sglang_turns_nvls_off_and_adds_its_custom_allreduce():
    # SGLang (engine.py: NCCL_NVLS_ENABLE = --enable-nccl-nvls, off) at tp 4 on H100s: the tp communicator without
    # NVLS, + custom all-reduce: 2 x 8 MiB cudaMalloc + an 8 MiB tensor in a 20 MiB allocator segment
    s = Setup(mode="serve", server="sglang", precision="bf16", tp=4)
    o = overheads.overheads(get_gpu("H100-80GB"), s)
    assert o["nccl_tp"] == 576 * MiB and o["custom_allreduce"] == (16 + 20) * MiB
    # 4 PCIe L4s: custom all-reduce refuses more than two PCIe-only GPUs
    assert "custom_allreduce" not in overheads.overheads(get_gpu("L4"), s)


def test_cublas_workspace_as_torch_sizes_it():
    # CublasHandlePool.cpp parseChosenWorkspaceSize: sm90 ? 4096 * 8 * 1024 : 4096 * 1024 * 2 + 16 * 1024 * 8
    assert overheads.blas_workspace(get_gpu("H100-80GB")) == 32 * MiB
    assert overheads.blas_workspace(get_gpu("A100-80GB")) == 8 * MiB + 128 * 1024
    # the ROCm branch: 128 MiB on gfx94x (MI300X)
    assert overheads.blas_workspace(get_gpu("MI300X")) == 128 * MiB


def test_every_entry_states_versions_and_source():
    d = tomllib.loads((ROOT / "src/trainfit/data/overheads.toml").read_text())  # with its provenance
    entries = list(d["cuda_context"].values()) + [d["cublas_workspace"], d["hipblas_workspace"], d["nccl"],
                                                   d["sglang_custom_allreduce"]]
    for e in entries:  # a published page, a named source with one, or our own committed GPU run (rule 1)
        def cited(p):
            src, refs = p["source"], p.get("measured_on", [])
            return (src.startswith("https://") or (ROOT / src.split()[0].rstrip(":")).is_file()
                    or bool(refs) and all(r in d["sources"] for r in refs))
        assert all(p["versions"] for p in e["provenance"].values()) and any(map(cited, e["provenance"].values()))
    # the published context figures (pytorch#109888 ~400 MB; InvokeAI#9413 256 MiB; unsloth-zoo#1053 426 MiB)
    assert overheads.cuda_context(get_gpu("A100-80GB")) == 400 * MiB
    assert overheads.cuda_context(get_gpu("RTX-3090")) == 256 * MiB
    assert overheads.cuda_context(get_gpu("RTX-6000-Ada")) == 426 * MiB


def test_a_context_measured_on_one_gpu_is_carried_to_another_by_its_local_memory():
    """NVIDIA: the context reserves local memory = max threads per SM x SMs x the per-thread stack (1 KiB by default).
    The Ada figure (426 MiB, RTX 6000 Ada: 142 SMs x 1536 threads) on an L4 (58 SMs, CUDA guide: 1536 threads per
    sm89 SM): 426 MiB - 142 x 1536 KiB + 58 x 1536 KiB = 426 - 213 + 87 = 300 MiB; the A10 (72 SMs, sm86) from the
    RTX 3090's 256 MiB (82 SMs): 256 - 123 + 108 = 241 MiB."""
    assert overheads.cuda_context(get_gpu("L4")) == 300 * MiB
    assert overheads.cuda_context(get_gpu("A10")) == 241 * MiB
    assert overheads.cuda_context(get_gpu("RTX-6000-Ada")) == overheads.cuda_context(get_gpu("L40S")) == 426 * MiB
    e = tomllib.loads((ROOT / "src/trainfit/data/overheads.toml").read_text())["local_memory"]
    assert e["per_thread_bytes"] == 1024 and e["provenance"]["per_thread_bytes"]["source"].startswith("https://")


def test_hopper_context_after_a_step_is_what_the_h200_runs_held_beside_the_allocator():
    """The committed H200 runs: cudaMemGetInfo's used less max_memory_reserved after each step is the memory beside the
    caching allocator (context, loaded kernels, library handles); the catalog's after-step figure is their median."""
    held = [c["measured"]["device_used"] - c["measured"]["reserved"]
            for run in data.gpu_runs("truth", "H200").values()
            for c in run["cases"] if c["measured"].get("device_used")]
    assert len(held) >= 100 and max(held) - min(held) < 25 * MiB
    h200 = get_gpu("H200")
    assert overheads.cuda_context(h200, after_step=True) == statistics.median(held)
    assert overheads.cuda_context(get_gpu("RTX-3090"), after_step=True) == 256 * MiB  # no measurement: at start
    # a serving engine sizes its pool before any step: the context at start (bench/gpu/cuda_context.py's reading right
    # after torch.cuda.init() in a fresh process); a training step carries the loaded one
    run = data.gpu_run("H200-2026-11-27-unrecorded-11-context")
    at_init = run["runs"]["LAZY"][0]
    assert at_init["stage"] == "init" and at_init["reserved"] == 0
    assert overheads.overheads(h200, Setup(mode="serve", precision="bf16", max_model_len=4096))["cuda_context"] \
        == at_init["used"]
    assert overheads.overheads(h200, Setup())["cuda_context"] == statistics.median(held)


def test_communicators_per_stack():
    assert overheads.communicators(Setup()) == {}
    assert overheads.communicators(Setup(dp=8, zero=3, stack="torchtitan")) == {"dp": 8}
    # Megatron (parallel_state.py): tp, pp, dp x cp, the model-parallel (tp x pp) and embedding groups
    meg = overheads.communicators(Setup(dp=2, tp=2, pp=2, grad_accum=2, stack="megatron", precision="bf16-master"))
    assert meg == {"tp": 2, "pp": 2, "dp_cp": 2, "model": 4, "embedding": 2}


def test_device_total_is_reserved_plus_overheads_and_fits_on_it():
    spec = load_spec("llama-3.1-8b")
    gpu = get_gpu("H100-96GB")
    s = Setup(batch=2, seq=8192, dp=8, zero=3, recompute="op", stack="torchtitan")
    e = estimate(spec, s, gpu)
    m = e.memory
    # + two cuBLAS workspaces of 32 MiB (inside the allocator's pool; the forward's thread and autograd's device thread each
    # hold one: 2 x 32 MiB measured on an H200) + one cached block of the largest freed tensor: the
    # loss's fp32 logits, batch 2 × seq 8192 × vocab 128,256 × 4 bytes
    logits = 2 * 8192 * 128_256 * 4
    # + FSDP2's blocks the compute stream cannot reuse (torchtitan groups: embedding, 32 blocks, [norm, output];
    # bf16 param_dtype, fp32 reduce_dtype, dp 8). Shapes: embedding = output = 128,256 × 4,096 = 525,336,576;
    # block = q,o 2 × 4096² + k,v 2 × 4096 × 1024 + w1,w2,w3 3 × 4096 × 14,336 + 2 norms × 4096 = 218,112,000;
    # [norm, output] = 525,340,672. Segments (CUDACachingAllocator get_allocation_size): >= 10 MiB rounds up to 2 MiB.
    seg = lambda n: -(-n // (2 * MiB)) * 2 * MiB  # noqa: E731
    # copy-in stream: each kind's bf16 all-gather output + the largest kind's bf16 shard cast (1/8)
    copy_in = seg(525_336_576 * 2) + seg(218_112_000 * 2) + seg(525_340_672 * 2) + seg(525_340_672 * 2 // 8)
    assert copy_in == 501 * 2 * MiB + 209 * 2 * MiB + 502 * 2 * MiB + 63 * 2 * MiB
    # compute stream: the embedding's unsharded bf16 copy, resharded after the forward; the peak is the loss's
    # backward (the fp32 logits' gradient beside the saved log-softmax), before [norm, output]'s backward, so the
    # output weight's copy is still live and in the peak (the allocator simulator at this step: one ~1 GiB free
    # block on the compute stream, the embedding's)
    from trainfit.analytic.memory import train_memory

    tm = train_memory(spec, e.setup)
    assert tm.peak == m.peak == tm.detail["loss_backward_allocated"]
    copy_out = seg(525_336_576 * 2)
    # reduce-scatter stream: every group's fp32 gradient shard; none is counted by the peak (it comes in backward,
    # before the gradients exist: at_peak has none)
    assert m.at_peak.get("gradients", 0) == 0
    reduce_out = seg(525_336_576 * 4 // 8) + 32 * seg(218_112_000 * 4 // 8) + seg(525_340_672 * 4 // 8)
    assert reduce_out == (126 + 32 * 53 + 126) * 2 * MiB
    side = copy_in + copy_out + reduce_out
    assert m.reserved == m.peak + 64 * MiB + logits + side
    # the dp group's NCCL buffers on 8 NVSwitch H100s: 24 channels x 24 MiB + NVLS 768 MiB (test above)
    # the context after a step: the H200 runs' median (test_hopper_context_after_a_step_...)
    assert m.overheads == {"cuda_context": 820_838_400, "nccl_dp": 1344 * MiB}
    assert m.device_total == m.reserved + 820_838_400 + 1344 * MiB
    # the fit rule (analytic/fit_rule.py): at the OOM retry the side streams' blocks and the copy-outs are free
    # segments, released; the loss's logits block stays pinned, with the fp32 shards' segment slack: weights and
    # two AdamW states per parameter, 1/8 each (no gradients at the peak): q,o 8 MiB and k,v 2 MiB pack 20 MiB
    # segments exactly, w1-w3 are 28 MiB, the embedding and output 250.5 MiB in 252 MiB segments
    slack = fit_rule.segment_slack(spec, s, train_memory(spec, s))
    assert slack == 3 * 2 * (252 * MiB - 128_256 * 4096 // 8 * 4)
    assert m.required == m.peak + logits + slack < m.reserved - 64 * MiB
    assert e.fit.capacity == gpu.memory - 64 * MiB - 820_838_400 - 1344 * MiB
    assert e.time.headroom == e.fit.headroom == e.fit.capacity - m.required and e.time.fits
    # the fit rule's capacity (the planner's too) for this setup
    assert capacity(gpu, s) - m.required == e.time.headroom
    # no GPU: reserved is the step's own blocks, no device total
    bare = estimate(spec, s)
    assert bare.memory.reserved == bare.memory.peak + logits + side and bare.memory.device_total is None


def test_tied_embedding_gradient_keeps_the_loss_blocks_cached():
    # llama-3.2-1b ties its 128,256 × 2,048 embedding: the head's and the embedding's partial gradients (fp32 under
    # amp-bf16) are summed at the end of backward (in place, the embedding's freed after); that 1 GiB request (the
    # embedding's partial) is larger than any of the loss's
    # fp32 logits blocks (256 tokens × 128,256 × 4 = 125 MiB), so the three the loss held at once -- the saved
    # log-softmax output, its gradient and the logits' gradient -- stay cached beside the partial's block.
    spec = load_spec("llama-3.2-1b")
    m = estimate(spec, Setup(batch=1, seq=256)).memory
    partial = 128_256 * 2048 * 4
    logits = 256 * 128_256 * 4
    assert m.reserved == m.peak + partial + 3 * logits


def test_held_segments_pack_by_pool():
    # kSmallBuffer 2 MiB segments for <= 1 MiB requests, kLargeBuffer 20 MiB for 1-10 MiB, 2 MiB multiples above
    assert overheads.held_segments({512 * 1024: 3}.items()) == 2 * MiB
    assert overheads.held_segments({3 * MiB: 7}.items()) == 40 * MiB
    assert overheads.held_segments({11 * MiB + 1: 2}.items()) == 2 * 12 * MiB
    assert overheads.held_segments({100: 1, 3 * MiB: 1, 10 * MiB: 1}.items()) == 2 * MiB + 20 * MiB + 10 * MiB


def test_reserve_is_an_extra_margin_on_top_of_the_device_total():
    spec = load_spec("llama-3.2-1b")
    gpu = get_gpu("H100-80GB")
    a = estimate(spec, Setup(), gpu)
    b = estimate(spec, Setup(), gpu, reserve=2.0)
    assert a.time.headroom - b.time.headroom == 2 * 2**30


def test_fsdp2_block_reduce_scatter_input_keeps_the_loss_blocks_cached():
    # tinyllama-1.1b under torchtitan FSDP2 (dp 2, bf16 param_dtype, fp32 reduce_dtype), batch 1 × 512 tokens.
    # Shapes: embedding = output = 32,000 × 2,048 = 65,536,000; block = q,o 2 × 2048² + k,v 2 × 2048 × 256 +
    # w1,w2,w3 3 × 2048 × 5632 + 2 norms × 2048 = 44,044,288; [norm, output] = 65,538,048.
    spec = load_spec("tinyllama-1.1b")
    m = estimate(spec, Setup(batch=1, seq=512, dp=2, zero=3, recompute="op", stack="torchtitan")).memory
    seg = lambda n: -(-n // (2 * MiB)) * 2 * MiB  # noqa: E731  (requests >= 10 MiB: own segment, 2 MiB multiples)
    # a block's flat fp32 reduce-scatter input (44,044,288 × 4 B = 168 MiB) is larger than the fp32 logits
    # (512 × 32,000 × 4 = 62.5 MiB), so the loss's three logits-sized blocks stay cached, beside one MLP
    # intermediate (512 × 5632 × 2 B)
    logits = 512 * 32_000 * 4
    assert 44_044_288 * 4 > logits
    cached = 512 * 5632 * 2 + 3 * logits
    copy_in = seg(65_536_000 * 2) + seg(44_044_288 * 2) + seg(65_538_048 * 2) + seg(65_538_048 * 2 // 2)
    assert copy_in == (63 + 43 + 63 + 32) * 2 * MiB
    copy_out = 2 * seg(65_536_000 * 2)
    reduce_out = seg(65_536_000 * 4 // 2) + 22 * seg(44_044_288 * 4 // 2) + seg(65_538_048 * 4 // 2)
    assert reduce_out == (63 + 22 * 43 + 63) * 2 * MiB
    side = copy_in + copy_out + max(0, reduce_out - int(m.at_peak["gradients"]))
    assert m.reserved == m.peak + cached + side
