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
    # + the cuBLAS workspace (inside the allocator's pool) + one cached block of the largest freed tensor: the
    # loss's fp32 logits, batch 2 × seq 8192 × vocab 128,256 × 4 bytes
    logits = 2 * 8192 * 128_256 * 4
    assert m.reserved == m.peak + 32 * MiB + logits
    assert m.overheads == {"cuda_context": 400 * MiB, "nccl_dp": 924_844_032}
    assert m.device_total == m.reserved + 400 * MiB + 924_844_032
    assert e.time.headroom == gpu.memory - m.device_total and e.time.fits
    # the planner's capacity for this setup is the same basis: peak <= capacity <=> device total <= GPU memory
    assert capacity(gpu, 0.0, s) - (m.reserved - 32 * MiB) == e.time.headroom
    # no GPU: reserved is the peak, no device total
    bare = estimate(spec, s)
    assert bare.memory.reserved == bare.memory.peak + logits and bare.memory.device_total is None


def test_reserve_is_an_extra_margin_on_top_of_the_device_total():
    spec = load_spec("llama-3.2-1b")
    gpu = get_gpu("H100-80GB")
    a = estimate(spec, Setup(), gpu)
    b = estimate(spec, Setup(), gpu, reserve=2.0)
    assert a.time.headroom - b.time.headroom == 2 * 2**30
