"""Fixed overheads (trainfit/overheads.py, data/overheads.toml) against independent sources, derived by hand."""
from trainfit import overheads
from trainfit.analytic.engine import estimate
from trainfit.hardware import get_gpu
from trainfit.models.resolve import load_model as load_spec
from trainfit.plan.search import capacity
from trainfit.setup import Setup

MiB = 2**20


def test_nccl_connection_is_the_three_protocol_fifos_of_init_cc():
    # NCCL src/init.cc: DEFAULT_LL_BUFFSIZE = NCCL_LL_LINES_PER_THREAD (8) * NCCL_LL_MAX_NTHREADS (512) * NCCL_STEPS (8)
    # * sizeof(ncclLLFifoLine) (16); DEFAULT_LL128_BUFFSIZE = NCCL_LL128_ELEMS_PER_THREAD (120) *
    # NCCL_LL128_MAX_NTHREADS (640) * NCCL_STEPS (8) * sizeof(uint64_t) (8); DEFAULT_BUFFSIZE = 1 << 22 (NCCL_BUFFSIZE)
    assert overheads.nccl_connection_bytes() == 8 * 512 * 8 * 16 + 120 * 640 * 8 * 8 + (1 << 22) == 9_633_792


def test_nccl_communicator_channels_times_ring_and_tree_peers():
    conn = 9_633_792
    # 8 ranks in a node: 32 channels (MAXCHANNELS) x (ring: 1 receiving connection + tree chain: parent and child)
    assert overheads.nccl_communicator_bytes(8) == 32 * 3 * conn == 924_844_032  # 882 MiB
    # 2 ranks: the chain has one neighbour
    assert overheads.nccl_communicator_bytes(2) == 32 * 2 * conn
    assert overheads.nccl_communicator_bytes(1) == 0


def test_cublas_workspace_as_torch_sizes_it():
    # CublasHandlePool.cpp parseChosenWorkspaceSize: sm90 ? 4096 * 8 * 1024 : 4096 * 1024 * 2 + 16 * 1024 * 8
    assert overheads.blas_workspace(get_gpu("H100-80GB")) == 32 * MiB
    assert overheads.blas_workspace(get_gpu("A100-80GB")) == 8 * MiB + 128 * 1024
    # the ROCm branch: 128 MiB on gfx94x (MI300X)
    assert overheads.blas_workspace(get_gpu("MI300X")) == 128 * MiB


def test_every_entry_states_versions_and_source():
    d = overheads.data()
    entries = list(d["cuda_context"].values()) + [d["cublas_workspace"], d["hipblas_workspace"], d["nccl"]]
    for e in entries:
        assert e["versions"] and e["source"].startswith("https://")
    # the published context figures (pytorch#109888 ~400 MB; InvokeAI#9413 256 MiB; unsloth-zoo#1053 426 MiB)
    assert overheads.cuda_context(get_gpu("H100-80GB")) == 400 * MiB
    assert overheads.cuda_context(get_gpu("RTX-3090")) == 256 * MiB
    assert overheads.cuda_context(get_gpu("RTX-6000-Ada")) == 426 * MiB


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
    # compute stream: the embedding's and the output weight's unsharded bf16 copies, resharded before the peak
    copy_out = 2 * seg(525_336_576 * 2)
    # reduce-scatter stream: every group's fp32 gradient shard; none is counted by the peak (it comes in backward,
    # before the gradients exist: at_peak has none)
    assert m.at_peak.get("gradients", 0) == 0
    reduce_out = seg(525_336_576 * 4 // 8) + 32 * seg(218_112_000 * 4 // 8) + seg(525_340_672 * 4 // 8)
    assert reduce_out == (126 + 32 * 53 + 126) * 2 * MiB
    side = copy_in + copy_out + reduce_out
    assert m.reserved == m.peak + 64 * MiB + logits + side
    assert m.overheads == {"cuda_context": 400 * MiB, "nccl_dp": 924_844_032}
    assert m.device_total == m.reserved + 400 * MiB + 924_844_032
    assert e.time.headroom == gpu.memory - m.device_total and e.time.fits
    # the planner's capacity for this setup is the same basis: peak <= capacity <=> device total <= GPU memory
    assert capacity(gpu, 0.0, s) - (m.reserved - 64 * MiB) == e.time.headroom
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
