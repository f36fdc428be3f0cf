"""Each parallel axis's communication term (analytic/parallel/<axis>.py), by the property its source states."""
import pytest

from trainfit.analytic.parallel.collectives import Links
from trainfit.analytic.parallel.context import cp_comm_seconds
from trainfit.analytic.parallel.expert import ep_comm_seconds
from trainfit.analytic.parallel.tensor import tp_comm_seconds
from trainfit.analytic.parallel.zero import dp_comm
from trainfit.hardware import get_gpu
from trainfit.models.resolve import load_model
from trainfit.setup import Setup

H100 = get_gpu("H100-80GB")  # 8 GPUs per node
LINKS = Links.of(H100)


def test_a_group_leaves_the_node_past_its_gpus():
    # placement: tp innermost, then cp, dp, pp (Megatron's tp-cp-ep-dp-pp); a dp × cp group spanning tp·dp·cp ranks
    inside = Setup(stack="megatron", precision="bf16-master", tp=2, dp=4, zero=1)
    across = Setup(stack="megatron", precision="bf16-master", tp=2, dp=8, zero=1)
    assert dp_comm(H100, inside, LINKS, 1e9, 1e9, 1.0, 1.0, 0.0).bandwidth == "intra"
    far = dp_comm(H100, across, LINKS, 1e9, 1e9, 0.0, 0.0, 0.0)
    assert far.bandwidth == "inter"
    # ZeRO-1: a ring reduce-scatter of the gradients and an all-gather of the weights, (n-1)/n of each, over the
    # 4 rails the group's 4 ranks per node own (4 x 50 GB/s < NVLink's 370); each with NCCL's Simple latency
    # 8.4 + 6 intra steps x 3.4 + 1 inter step x 14 = 42.8 µs (tuning.cc:337-356 at v2.27.5-1)
    assert far.total == pytest.approx(2 * (42.8e-6 + 7 / 8 * 1e9 / (4 * H100.inter_node_bandwidth)))


def test_a_tensor_parallel_group_wider_than_a_node_crosses_the_network():
    """--tp 16 on 8-GPU nodes: the ring runs over the node's 8 rails, at min(NVLink, 8 x NIC) (NCCL tuning.cc:266,
    276), not all on NVLink as inside a node (before: every TP group was taken as one node's)."""
    spec = load_model("llama-3.1-70b")
    s = Setup(stack="megatron", precision="bf16-master", tp=16, dp=2, zero=1, sequence_parallel=True, seq=8192)
    x = 8192 * spec.hidden * 2  # one b·s·h activation
    per_pair = LINKS.all_gather(16, 8, x) + LINKS.reduce_scatter(16, 8, x)
    assert per_pair > LINKS.all_gather(16, 16, x) + LINKS.reduce_scatter(16, 16, x)
    # one layer: 4 all-reduces (2 forward, 2 backward), each an all-gather and a reduce-scatter under SP
    assert tp_comm_seconds(spec, s, LINKS, 8192, 2, 1, 0.0) == pytest.approx(4 * per_pair)


def test_ring_attention_keeps_one_kv_head_per_rank_past_the_kv_heads():
    spec = load_model("llama-3.1-8b")  # 8 kv heads
    assert spec.kv_heads == 8
    at_kv = Setup(stack="megatron", precision="bf16-master", tp=8, cp=2)
    past = Setup(stack="megatron", precision="bf16-master", tp=16, cp=2)
    one = cp_comm_seconds(spec, at_kv, LINKS, 4096, 2, 1, 0.0, 0.0)
    assert one > 0 and cp_comm_seconds(spec, past, LINKS, 4096, 2, 1, 0.0, 0.0) == pytest.approx(one)
    # forward cp-1 hops + backward twice that, all exposed with no attention to hide behind; full recompute re-runs
    kv = 2 * 4096 * spec.head_dim * 2
    assert one == pytest.approx(3 * kv / H100.inter_node_bandwidth)
    full = Setup(stack="megatron", precision="bf16-master", tp=8, cp=2, recompute="full")
    assert cp_comm_seconds(spec, full, LINKS, 4096, 2, 1, 0.0, 1.0) == pytest.approx(2 * one)


def test_sequence_parallel_dispatches_a_tp_share_of_the_tokens():
    spec = load_model("mixtral-8x7b")
    # (balanced routing: moe_imbalance.py scales the busiest rank's exchange)
    # (etp 1: no expert-TP gather after the exchange, parallel/expert.py)
    plain = Setup(stack="megatron", precision="bf16-master", tp=2, ep=4, etp=1, dp=4, moe_imbalance=1.0)
    sp = Setup(stack="megatron", precision="bf16-master", tp=2, ep=4, etp=1, dp=4, sequence_parallel=True,
               moe_imbalance=1.0)
    whole = ep_comm_seconds(spec, plain, LINKS, 4096, 2, 1)
    assert whole == pytest.approx(4 * 3 / 4 * 4096 * spec.moe.top_k * spec.hidden * 2 / LINKS.intra)
    assert ep_comm_seconds(spec, sp, LINKS, 4096, 2, 1) == pytest.approx(whole / 2)
    assert ep_comm_seconds(load_model("llama-3.1-8b"), plain, LINKS, 4096, 2, 1) == 0.0  # a dense model


def test_float8_halves_the_all_gathers_bytes():
    spec = load_model("llama-3.1-8b")
    bf16 = Setup(stack="torchtitan", tp=2)
    fp8 = Setup(stack="torchtitan", tp=2, low_precision="tensorwise")
    # torchao's tensorwise TP casts before both directions' all-gathers (float8_tensor_parallel.py: the block inputs
    # forward, the row-parallel outputs' gradients backward): of the 4 all-reduces' all-gather halves, each moves 1
    # byte instead of 2; the reduce-scatter halves keep 2
    assert tp_comm_seconds(spec, fp8, LINKS, 4096, 2, 1, 0.0) == pytest.approx(
        3 / 4 * tp_comm_seconds(spec, bf16, LINKS, 4096, 2, 1, 0.0))


def _tp_overlap_cases():
    spec = load_model("llama-3.1-70b")
    kw = dict(stack="megatron", precision="bf16-master", tp=4, dp=2, sequence_parallel=True, seq=8192)
    return spec, Setup(**kw), Setup(**kw, tp_comm_overlap=True)


def test_tp_comm_overlap_with_free_gemms_leaves_every_collective_exposed(monkeypatch):
    # TE's ring exchange waits on each chunk's send when the GEMM beside it takes no time (comm_gemm_overlap.cpp
    # split_overlap_ag/rs): the collectives cost what they cost unoverlapped, plus the reduce-scatter's sum of its
    # tp chunks (one memory-bound kernel per forward reduce-scatter: 2 per layer)
    from trainfit.analytic import roofline
    from trainfit.analytic.parallel import tp_overlap

    spec, plain, over = _tp_overlap_cases()
    monkeypatch.setattr(roofline, "gemm_seconds", lambda *a, **k: 0.0)
    x = 8192 * spec.hidden * 2
    reduce = roofline.memory_seconds(H100, x + x / 4)
    exposed = tp_comm_seconds(spec, over, LINKS, 8192, 2, 1, 0.0, H100)
    assert exposed == pytest.approx(tp_comm_seconds(spec, plain, LINKS, 8192, 2, 1, 0.0) + 2 * reduce)
    assert tp_overlap.layer_seconds(spec, over, H100, LINKS, 8192, 2, (2, 2), 0.0) == pytest.approx(exposed)


def test_tp_comm_overlap_behind_long_gemms_leaves_only_the_chunk_sums(monkeypatch):
    # GEMMs far longer than the collectives, their time proportional to their rows (so splitting them in tp chunks
    # costs nothing): every collective hides; what is left is the reduce kernel of each forward reduce-scatter, and
    # a MoE layer runs no dense MLP's collectives on Megatron (its dispatcher's are timed with the exchange)
    from trainfit.analytic import roofline

    spec, plain, over = _tp_overlap_cases()
    monkeypatch.setattr(roofline, "gemm_seconds", lambda gpu, m, n, k, dtype, batch=1: m * 1.0)
    x = 8192 * spec.hidden * 2
    reduce = roofline.memory_seconds(H100, x + x / 4)
    assert tp_comm_seconds(spec, over, LINKS, 8192, 2, 1, 0.0, H100) == pytest.approx(2 * reduce)
    # full recompute re-runs the forward: its two reduce-scatters again
    assert tp_comm_seconds(spec, over, LINKS, 8192, 2, 1, 1.0, H100) == pytest.approx(4 * reduce)
    moe = load_model("mixtral-8x7b")
    y = 8192 * moe.hidden * 2
    assert tp_comm_seconds(moe, over, LINKS, 8192, 2, 1, 0.0, H100) == pytest.approx(
        roofline.memory_seconds(H100, y + y / 4))


def test_async_tp_leaves_the_rowwise_recipes_all_gathers_exposed(monkeypatch):
    # torchtitan's async TP fuses a collective into a matmul only where the matmul consumes or produces it
    # (micro_pipeline_tp.py): rowwise float8 gathers in bf16 and casts after, so with GEMMs that hide everything the
    # rowwise layer keeps its four all-gathers (2 forward, 2 backward) and the bf16 layer none
    from trainfit.analytic import roofline

    monkeypatch.setattr(roofline, "gemm_seconds", lambda gpu, m, n, k, dtype, batch=1: m * 1.0)
    spec = load_model("llama-3.1-8b")
    kw = dict(stack="torchtitan", tp=4, sequence_parallel=True, compile=True, tp_comm_overlap=True)
    bf16, rowwise = Setup(**kw), Setup(**kw, low_precision="rowwise")
    x = 4096 * spec.hidden * 2
    reduce = roofline.memory_seconds(H100, x + x / 4)
    backward_rs = 2 * LINKS.reduce_scatter(4, 4, x)  # exposed: see the next test
    # the forward reduce-scatters hidden: each leaves its chunks' sum
    assert tp_comm_seconds(spec, bf16, LINKS, 4096, 2, 1, 0.0, H100) == pytest.approx(2 * reduce + backward_rs)
    assert tp_comm_seconds(spec, rowwise, LINKS, 4096, 2, 1, 0.0, H100) == pytest.approx(
        2 * reduce + backward_rs + 4 * LINKS.all_gather(4, 4, x))


def test_async_tp_leaves_the_backward_reduce_scatters_exposed(monkeypatch):
    # torchtitan's blocks run wq, wk, wv (and w1, w3) as separate column-parallel linears behind one gather
    # (models/llama3/model/model.py, infra/parallelize.py): the gradient the backward reduce-scatters is the sum of
    # their input gradients, which micro_pipeline_tp's _find_producer_matmul does not match. With GEMMs that hide
    # everything, a layer keeps its two backward reduce-scatters whole and, of the forward's, the chunks' sums only;
    # the unoverlapped layer's four collectives are the all-gathers and reduce-scatters of each block, both ways
    from trainfit.analytic import roofline

    monkeypatch.setattr(roofline, "gemm_seconds", lambda gpu, m, n, k, dtype, batch=1: m * 1.0)
    spec = load_model("llama-3.1-8b")
    kw = dict(stack="torchtitan", tp=8, sequence_parallel=True, compile=True)
    plain, over = Setup(**kw), Setup(**kw, tp_comm_overlap=True)
    x = 8192 * spec.hidden * 2
    ag, rs = LINKS.all_gather(8, 8, x), LINKS.reduce_scatter(8, 8, x)
    assert tp_comm_seconds(spec, plain, LINKS, 8192, 2, 1, 0.0) == pytest.approx(4 * ag + 4 * rs)
    reduce = roofline.memory_seconds(H100, x + x / 8)
    assert tp_comm_seconds(spec, over, LINKS, 8192, 2, 1, 0.0, H100) == pytest.approx(2 * reduce + 2 * rs)


def test_tp_comm_overlap_needs_sequence_parallelism_and_the_stacks_own_conditions():
    from trainfit.errors import SetupError
    from trainfit.setup import validate

    with pytest.raises(SetupError, match="--sequence-parallel"):
        validate(Setup(stack="megatron", precision="bf16-master", tp=2, tp_comm_overlap=True))
    with pytest.raises(SetupError, match="add --compile"):  # torchtitan's async TP needs the model compiled
        validate(Setup(stack="torchtitan", tp=2, sequence_parallel=True, tp_comm_overlap=True))
    with pytest.raises(SetupError, match="not run by --stack hf"):
        validate(Setup(stack="hf", tp=2, sequence_parallel=True, tp_comm_overlap=True))
