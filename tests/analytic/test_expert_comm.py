"""Expert parallelism's exchanges (analytic/parallel/expert.py) and the expert data-parallel reduce (parallel/zero.py),
against hand derivations, a brute-force enumeration of routings and Megatron-Core's own rank generator."""
from itertools import combinations

import pytest

from trainfit.analytic.parallel.collectives import Links
from trainfit.analytic.parallel.expert import distinct_groups, ep_comm_seconds, exposed_ep_seconds
from trainfit.analytic.parallel.zero import dp_comm, group_span
from trainfit.errors import SetupError
from trainfit.hardware import get_gpu
from trainfit.models.resolve import load_model
from trainfit.setup import Setup

LINKS = Links(intra=400e9, inter=50e9, gpus_per_node=8)  # round numbers: NVLink 400 GB/s, one 400 Gb/s NIC per GPU
H100 = get_gpu("H100-80GB")


def _brute(experts, k, groups):
    """Mean distinct groups over every k-subset of experts (experts/groups consecutive experts per group)."""
    per = experts // groups
    subsets = list(combinations(range(experts), k))
    return sum(len({e // per for e in s}) for s in subsets) / len(subsets)


def _brute_limited(experts, k, groups, route_groups, picked):
    """Group-limited routing: every choice of `picked` of the route groups, then every k-subset of their experts."""
    per_route, per = experts // route_groups, experts // groups
    total = count = 0
    for chosen in combinations(range(route_groups), picked):
        pool = [e for g in chosen for e in range(g * per_route, (g + 1) * per_route)]
        for s in combinations(pool, k):
            total += len({e // per for e in s})
            count += 1
    return total / count


@pytest.mark.parametrize("experts,k,groups", [(8, 2, 2), (12, 3, 4), (16, 4, 4), (16, 6, 8), (10, 1, 5)])
def test_distinct_nodes_per_token_match_every_routing(experts, k, groups):
    assert distinct_groups(experts, k, groups) == pytest.approx(_brute(experts, k, groups), rel=1e-12)


@pytest.mark.parametrize("experts,k,groups,route_groups,picked", [(16, 4, 4, 4, 2), (16, 4, 2, 8, 3), (12, 2, 3, 6, 2),
                                                                  (16, 4, 8, 4, 2), (24, 3, 12, 4, 3)])
def test_node_limited_routing_matches_every_routing(experts, k, groups, route_groups, picked):
    got = distinct_groups(experts, k, groups, picked, route_groups)
    assert got == pytest.approx(_brute_limited(experts, k, groups, route_groups, picked), rel=1e-12)
    if route_groups == groups:  # DeepSeek-V3's node-limited routing: at most `picked` nodes per token
        assert got <= picked


def test_two_node_dispatch_by_hand():
    # Qwen3-30B-A3B: 128 experts, top-8, hidden 2048; EP 16 over two 8-GPU nodes; 4096 tokens of 2-byte activations
    spec = load_model("qwen3-30b-a3b")
    assert (spec.moe.num_experts, spec.moe.top_k, spec.hidden) == (128, 8, 2048)
    tokens, token_bytes = 4096, 2048 * 2
    a2a = Setup(stack="megatron", precision="bf16-master", dp=16, ep=16, moe_imbalance=1.0)
    # alltoall: 8 copies of each token, one in 16 to each rank: 8 of 16 ranks on the other node, over the NIC, while
    # the 7 other ranks of the node get theirs over NVLink at the same time (the NIC's share is the longer)
    one = 8 / 16 * tokens * 8 * token_bytes / 50e9  # 0.0172 s
    assert 7 / 16 * tokens * 8 * token_bytes / 400e9 < one
    assert ep_comm_seconds(spec, a2a, LINKS, tokens, 2, 1) == pytest.approx(4 * one, rel=1e-12)
    # deepep: a node is missed when all 8 experts fall in the other node's 64: P = 64·63·…·57 / (128·127·…·121)
    miss_node = 1.0
    for i in range(8):
        miss_node *= (64 - i) / (128 - i)
    remote = 2 * (1 - miss_node) / 2  # distinct nodes × the share that is not the rank's own: ~1.0 token
    miss_gpu = 1.0  # a GPU (8 of the experts) missed: all 8 among the other 120
    for i in range(8):
        miss_gpu *= (120 - i) / (128 - i)
    fan_out = 16 * (1 - miss_gpu) * 7 / 8  # distinct GPUs but the landing one: ~5.7 copies over NVLink
    # the RDMA senders and the NVLink forwarders run at once (DeepEP internode.cu WarpRole): the longer of the two
    rdma, nvl = tokens * token_bytes * remote / 50e9, tokens * token_bytes * fan_out / 400e9
    deepep = max(rdma, nvl)
    flex = Setup(stack="megatron", precision="bf16-master", dp=16, ep=16, moe_dispatcher="deepep", moe_imbalance=1.0)
    assert ep_comm_seconds(spec, flex, LINKS, tokens, 2, 1) == pytest.approx(4 * deepep, rel=1e-12)
    assert 4 * deepep < 0.5 * 4 * one  # the NIC carries ~1 copy per token instead of 4
    # imbalance 1.5: the busiest GPU's NVLink share grows by 1.5, the NICs' by the busiest node's excess, which
    # averages its 8 ranks: 1 + 0.5 · E[max of 2 N(0,1)] / (E[max of 16] · √8) = 1 + 0.5 · 0.5642 / (1.7660 · 2.8284)
    skew = Setup(stack="megatron", precision="bf16-master", dp=16, ep=16, moe_dispatcher="deepep", moe_imbalance=1.5)
    node = 1 + 0.5 * 0.5642 / (1.7660 * 2.8284)  # 1.056
    assert ep_comm_seconds(spec, skew, LINKS, tokens, 2, 1) == pytest.approx(4 * max(rdma * node, nvl * 1.5),
                                                                              rel=1e-3)
    a2a_skew = Setup(stack="megatron", precision="bf16-master", dp=16, ep=16, moe_imbalance=1.5)
    assert ep_comm_seconds(spec, a2a_skew, LINKS, tokens, 2, 1) == pytest.approx(4 * one * 1.5, rel=1e-12)
    # allgather: every rank gathers the 16 ranks' tokens (15 others', once each) and reduce-scatters them back
    ag = Setup(stack="megatron", precision="bf16-master", dp=16, ep=16, moe_dispatcher="allgather")
    assert ep_comm_seconds(spec, ag, LINKS, tokens, 2, 1) == pytest.approx(4 * 15 * tokens * token_bytes / 50e9)


def test_expert_tp_gathers_what_the_group_received():
    """--etp 2, alltoall, one node (Qwen3-30B-A3B: 128 experts, top-8, hidden 2048): after the all-to-all the
    expert-TP pair all-gathers its ranks' received copies (token_dispatcher.py:685-701) and reduce-scatters the
    experts' outputs before the combine (:774-781). Hand derivation of the volumes: a rank of the tp 2 × ep 4 layout
    routes its own 1000 / 2 tokens under sequence parallelism, receives their 8 copies' worth (balanced), and the
    pair gathers 2 × 500 × 8 rows of 2048 × 2 bytes."""
    spec = load_model("qwen3-30b-a3b")
    kw = dict(stack="megatron", precision="bf16-master", dp=8, tp=2, sequence_parallel=True, ep=4, moe_imbalance=1.0)
    one, two = Setup(**kw, etp=1), Setup(**kw, etp=2)
    local = 1000 / 2
    gathered = 2 * local * 8 * 2048 * 2
    ring = (LINKS.all_gather(2, 2, gathered) + LINKS.reduce_scatter(2, 2, gathered)) / 2
    # at etp 1 the ep group's 4 ranks are 1 apart, at etp 2 2 apart: both inside the node, the same a2a volume
    a2a = 3 * local * 8 * 2048 * 2 / 4 / 400e9
    assert ep_comm_seconds(spec, one, LINKS, 1000, 2, 1) == pytest.approx(4 * a2a, rel=1e-12)
    assert ep_comm_seconds(spec, two, LINKS, 1000, 2, 1) == pytest.approx(4 * (a2a + ring), rel=1e-12)
    # the flex dispatcher instead sends each token to both expert-TP ranks of every expert group it picks (its
    # experts and top-k scaled by tp_size: token_dispatcher.py:1346-1360), over the node's 8 GPUs: a GPU group (32
    # of the experts) missed when all 8 picks fall in the other 96
    miss = 1.0
    for i in range(8):
        miss *= (96 - i) / (128 - i)
    flex = Setup(**kw, etp=2, moe_dispatcher="deepep")
    assert ep_comm_seconds(spec, flex, LINKS, 1000, 2, 1) == pytest.approx(
        4 * local * 2048 * 2 * 2 * 4 * (1 - miss) * 7 / 8 / 400e9, rel=1e-12)


def test_megatron_moe_layers_run_no_dense_mlp_collectives():
    """Megatron routes each rank's own T/tp tokens (moe_layer.py:379-383) and gathers over the expert-TP group only:
    a MoE layer without a shared expert runs the attention's tensor-parallel all-gathers and reduce-scatters, not a
    dense MLP's. Hand: Qwen3-30B-A3B (every layer MoE, no shared expert) at tp 2, 4 layers, no overlap:
    4 × (2 pairs forward and backward of the attention) × (AG + RS of T·h); with a shared expert (Qwen1.5-MoE) the
    MLP's pairs are back, as on the other stacks' MoE layers (a dense MLP's stand-in)."""
    from trainfit.analytic.parallel.expert import dense_mlp_share
    from trainfit.analytic.parallel.tensor import tp_comm_seconds

    qwen3 = load_model("qwen3-30b-a3b")
    assert qwen3.moe.shared_intermediate == 0
    meg = Setup(stack="megatron", precision="bf16-master", dp=4, tp=2, sequence_parallel=True, ep=4)
    x = 4096 * 2048 * 2
    pair = LINKS.all_gather(2, 2, x) + LINKS.reduce_scatter(2, 2, x)
    assert dense_mlp_share(qwen3, meg) == 0.0
    assert tp_comm_seconds(qwen3, meg, LINKS, 4096, 2, 4, 0.0) == pytest.approx(4 * 2 * pair, rel=1e-12)
    shared = load_model("qwen1.5-moe-a2.7b")
    assert shared.moe.shared_intermediate > 0 and dense_mlp_share(shared, meg) == 1.0
    titan = Setup(stack="torchtitan", precision="amp-bf16", dp=4, tp=2, sequence_parallel=True, zero=3)
    assert dense_mlp_share(qwen3, titan) == 1.0


def test_one_node_deepep_stays_on_nvlink():
    spec = load_model("qwen3-30b-a3b")
    s = Setup(stack="megatron", precision="bf16-master", dp=8, ep=8, moe_dispatcher="deepep", moe_imbalance=1.0)
    miss = 1.0
    for i in range(8):
        miss *= (112 - i) / (128 - i)  # a GPU's 16 experts all missed
    assert ep_comm_seconds(spec, s, LINKS, 1000, 2, 1) == pytest.approx(
        4 * 1000 * 4096 * 8 * (1 - miss) * 7 / 8 / 400e9, rel=1e-12)


def test_overlap_hides_the_exchange_up_to_the_other_micro_batch():
    base = dict(stack="megatron", precision="bf16-master", dp=8, ep=8, grad_accum=4)
    on = Setup(**base, overlap_moe_comm=True)
    # first forward and last backward alone (A), the 3 other phases expose only what outlasts the compute
    assert exposed_ep_seconds(on, 1.0, 0.6) == pytest.approx((1.0 + 3 * 0.4) / 4)
    assert exposed_ep_seconds(on, 1.0, 2.0) == pytest.approx(1.0 / 4)
    assert exposed_ep_seconds(Setup(**base), 1.0, 2.0) == 1.0
    assert exposed_ep_seconds(Setup(**{**base, "grad_accum": 1}, overlap_moe_comm=True), 1.0, 2.0) == 1.0


def test_experts_reduce_over_the_expert_data_parallel_group():
    # ZeRO-1 (distributed optimizer): dense over the 64 dp ranks, experts over 64 / ep = 8; both cross nodes. The
    # dense group has 8 ranks on each node: a ring per rail, 8 x 50 GB/s, capped by NVLink (collectives.py bus);
    # the expert group's ranks sit ep = 8 apart, one per node: one NIC. NCCL's latency on top (tens of µs).
    s = Setup(stack="megatron", precision="bf16-master", dp=64, ep=8, zero=1)
    assert s.expert_dp == 8
    got = dp_comm(H100, s, LINKS, 4e9, 2e9, 0.0, 0.0, 0.0, 8e9, 4e9)
    dense_bw = min(LINKS.intra, 8 * 50e9)
    assert got.total == pytest.approx(63 / 64 * 6e9 / dense_bw + 7 / 8 * 12e9 / 50e9, rel=1e-2)
    assert got.bandwidth == "inter"


@pytest.mark.parametrize("tp,pp,cp,dp,ep,etp", [(2, 4, 1, 4, 1, None), (1, 2, 1, 8, 4, None), (2, 2, 2, 4, 8, 1),
                                               (4, 1, 1, 4, 2, 2), (1, 1, 1, 16, 8, None), (1, 4, 2, 2, 2, None)])
def test_group_placement_is_megatrons(tp, pp, cp, dp, ep, etp):
    from megatron.core.parallel_state import RankGenerator

    s = Setup(stack="megatron", precision="bf16-master", tp=tp, pp=pp, cp=cp, dp=dp, ep=ep, etp=etp,
              sequence_parallel=tp > 1)
    order = "tp-cp-ep-dp-pp"  # parallel_state.py initialize_model_parallel's default
    dense = RankGenerator(tp=tp, ep=1, dp=dp, pp=pp, cp=cp, order=order).get_ranks("dp-cp")
    edp = s.world_size // (s.expert_tp * ep * pp)
    expert = RankGenerator(tp=s.expert_tp, ep=ep, dp=edp, pp=pp, cp=1, order=order).get_ranks("dp")
    for groups, span in ((dense, group_span(s)), (expert, group_span(s, expert=True))):
        for ranks in groups:
            assert LINKS.within_node(span) == (len({r // 8 for r in ranks}) == 1)
            assert max(ranks) - min(ranks) < span  # the ranks lie inside the span


def test_dispatch_settings_are_refused_where_they_do_not_apply():
    with pytest.raises(SetupError, match="--moe-dispatcher"):
        Setup(stack="torchtitan", dp=8, moe_dispatcher="deepep")
    with pytest.raises(SetupError, match="--ep > 1"):
        Setup(stack="megatron", precision="bf16-master", dp=8, overlap_moe_comm=True)
    with pytest.raises(SetupError, match="--vpp"):
        Setup(stack="megatron", precision="bf16-master", dp=8, pp=2, ep=8, overlap_moe_comm=True)
    with pytest.raises(SetupError, match="allgather"):
        Setup(stack="megatron", precision="bf16-master", dp=8, ep=8, overlap_moe_comm=True, moe_dispatcher="allgather")
    with pytest.raises(SetupError, match="recompute"):
        Setup(stack="megatron", precision="bf16-master", dp=8, ep=8, overlap_moe_comm=True, recompute="full")
    with pytest.raises(SetupError, match="--ep > 1"):
        Setup(stack="megatron", precision="bf16-master", dp=8, moe_dispatcher="deepep")


def test_deepseek_v3_routes_to_at_most_four_nodes():
    # DeepSeek-V3: 256 experts in 8 groups, top-8 among the best 4 groups (config n_group, topk_group); EP 64 over
    # 8 nodes: the groups are the nodes, so a token reaches 4 · (1 − C(96, 8)/C(128, 8)) nodes instead of the
    # 8 · (1 − C(224, 8)/C(256, 8)) of unlimited routing
    spec = load_model("deepseek-v3")
    assert (spec.moe.route_groups, spec.moe.route_group_topk, spec.moe.top_k) == (8, 4, 8)
    limited = distinct_groups(256, 8, 8, 4, 8)
    miss, free = 1.0, 1.0
    for i in range(8):
        miss *= (96 - i) / (128 - i)
        free *= (224 - i) / (256 - i)
    assert limited == pytest.approx(4 * (1 - miss), rel=1e-12)  # 3.58 nodes
    assert distinct_groups(256, 8, 8) == pytest.approx(8 * (1 - free), rel=1e-12)  # 5.32 nodes


@pytest.mark.parametrize("bf16_reduce, grad_bytes", [(False, 4), (True, 2)])
def test_gpt_oss_experts_cross_the_expert_group_once(bf16_reduce, grad_bytes):
    """gpt-oss-120b on 64 B200s, EP 8, distributed optimizer: the model card's split (OpenAI, gpt-oss-120b & gpt-oss-20b
    Model Card, 2025, Table 1: 114.71B MLP parameters of 116.83B) — each rank holds the 2.12B others whole and 1/8 of
    the experts, reduce-scattering the gradients and all-gathering the weights over 64 ranks and over the 8 expert
    data-parallel ranks respectively, both across nodes (the dense group on 8 rails a node, the experts' on one).
    The gradients move in the main-grad buffer's dtype: fp32 under --bf16 (Megatron-LM core_v0.16.1 arguments.py:
    711-724, distributed_data_parallel.py:147), bf16 with --grad-reduce-in-bf16; the weights in bf16 either way
    (param_and_grad_buffer.py:274-290 all-gathers bucket.param_data). So the reduce-scatter's bytes double: 4 + 2 vs
    2 + 2 bytes a parameter on the wire."""
    from trainfit.analytic.step_time import layout_step_time

    gpu = get_gpu("B200")
    s = Setup(stack="megatron", precision="bf16-master", dp=64, ep=8, zero=1, seq=4096, batch=4, grad_accum=2,
              grad_reduce_in_bf16=bf16_reduce)
    tm = layout_step_time(load_model("gpt-oss-120b"), s, gpu)
    inter = Links.of(gpu).inter
    dense, experts = 116.83e9 - 114.71e9, 114.71e9 / 8
    # the dense group's 8 ranks per node ride 8 rails (capped by NVLink); the expert group one rank per node, one NIC
    dense_bw = min(Links.of(gpu).intra, 8 * inter)
    wire = grad_bytes + 2  # reduce-scatter of the grad buffer + all-gather of the bf16 params, (n - 1)/n of each
    assert tm.dp_comm_total == pytest.approx(63 / 64 * dense * wire / dense_bw + 7 / 8 * experts * wire / inter,
                                             rel=1e-2)


def test_overlap_pairs_each_exchange_with_its_own_compute():
    """Under combined 1F1B each of a layer's four exchanges (A/4 = 0.25 each) hides behind one stretch of compute
    only (model_chunk_schedule_plan.py:190-252): stretches of 0.1, 0.3, 0.2 and 0.3 leave 0.15 + 0 + 0.05 + 0 = 0.2
    exposed, where the whole micro-batch's 0.9 of compute against its 1.0 of exchanges would leave 0.1; with the
    first forward and last backward alone, (1.0 + 3 x 0.2) / 4 over 4 micro-batches."""
    on = Setup(stack="megatron", precision="bf16-master", dp=8, ep=8, grad_accum=4, overlap_moe_comm=True)
    assert exposed_ep_seconds(on, 1.0, 0.9, (0.1, 0.3, 0.2, 0.3)) == pytest.approx((1.0 + 3 * 0.2) / 4)
    assert exposed_ep_seconds(on, 1.0, 0.9) == pytest.approx((1.0 + 3 * 0.1) / 4)


def test_overlapped_compute_runs_on_the_sms_the_exchange_leaves():
    """DeepEP's kernels hold Megatron's moe_deepep_num_sms = 20 SMs (transformer_config.py:722) of the H100's 132 while
    they run: beside a 0.25 s exchange the 0.3 s stretch does 0.25 x 112/132 of its work, then the rest on all SMs,
    so the pair takes 0.25 + (0.3 - 0.25 x 112/132) = 0.3379 s: 0.0379 s more than the compute alone, where
    free SMs would hide the exchange whole. Hand-simulated, over 4 micro-batches (the first and last alone)."""
    from trainfit.hardware import get_gpu

    on = Setup(stack="megatron", precision="bf16-master", dp=8, ep=8, grad_accum=4, overlap_moe_comm=True,
               moe_dispatcher="deepep")
    h100 = get_gpu("H100-80GB")
    pair = 0.25 + (0.3 - 0.25 * 112 / 132) - 0.3
    assert exposed_ep_seconds(on, 1.0, 1.2, (0.3,) * 4, h100) == pytest.approx((1.0 + 3 * 4 * pair) / 4, rel=1e-9)
    # an exchange longer than the slowed stretch is the wall time
    assert exposed_ep_seconds(on, 4.0, 1.2, (0.3,) * 4, h100) == pytest.approx((4.0 + 3 * 4 * 0.7) / 4, rel=1e-9)
    # without a GPU (no SM data) the old rule: only what outlasts the compute
    assert exposed_ep_seconds(on, 1.0, 1.2, (0.3,) * 4) == pytest.approx(1.0 / 4)


def test_the_dispatcher_sms_setting_takes_more_from_the_hidden_compute():
    """--moe-dispatcher-sms 32 (Megatron-Bridge's HybridEP override, scripts/performance/utils/helpers.py:111-113)
    leaves 100 of the H100's 132 SMs to the stretch beside each exchange: 0.25 s of exchange then costs the 0.3 s
    stretch 0.25 x 32/132 more, against 16/132 at HybridEP's default (transformer_config.py:725)."""
    from trainfit.hardware import get_gpu

    h100 = get_gpu("H100-80GB")
    base = dict(stack="megatron", precision="bf16-master", dp=8, ep=8, grad_accum=4, overlap_moe_comm=True,
                moe_dispatcher="hybridep")
    for sms, s in ((16, Setup(**base)), (32, Setup(**base, moe_dispatcher_sms=32))):
        pair = 0.25 * sms / 132
        assert exposed_ep_seconds(s, 1.0, 1.2, (0.3,) * 4, h100) == pytest.approx((1.0 + 3 * 4 * pair) / 4, rel=1e-9)


@pytest.mark.parametrize("kw,words", [
    (dict(moe_dispatcher="alltoall"), "needs --moe-dispatcher deepep or hybridep"),
    (dict(moe_dispatcher="deepep", stack="torchtitan", precision="amp-bf16", zero=3), "not run by --stack torchtitan"),
])
def test_dispatcher_sms_is_refused_where_it_means_nothing(kw, words):
    from trainfit.errors import SetupError

    with pytest.raises(SetupError, match=words):
        Setup(**{**dict(stack="megatron", precision="bf16-master", dp=8, ep=8, moe_dispatcher_sms=24), **kw})


def test_dispatcher_sms_must_leave_the_gpu_some():
    import trainfit
    from trainfit.errors import SetupError

    with pytest.raises(SetupError, match="H100-80GB has 132 SMs"):
        trainfit.estimate("qwen3-30b-a3b", stack="megatron", precision="bf16-master", dp=8, ep=8, grad_accum=2,
                          moe_dispatcher="deepep", moe_dispatcher_sms=132, gpu="H100-80GB")


def test_nccl_all_to_all_holds_the_p2p_channels():
    """NCCL runs the all-to-all dispatcher's grouped send/receive on its p2p channels, the ring's count rounded up
    to a power of two (ncclTopoComputeP2pChannels, quoted in NVIDIA/nccl#1198): 24 ring channels on an NVSwitch
    H100 node (tests/test_overheads.py) -> 32 p2p; the all-gather dispatcher's collective keeps the ring's 24."""
    from trainfit.analytic.parallel.expert import exchange_sms
    from trainfit.hardware import get_gpu

    h100 = get_gpu("H100-80GB")
    base = dict(stack="megatron", precision="bf16-master", dp=8, ep=8)
    assert exchange_sms(Setup(**base, moe_dispatcher="alltoall"), h100) == 32
    assert exchange_sms(Setup(**base), h100) == 32  # the default dispatcher is alltoall
    assert exchange_sms(Setup(**base, moe_dispatcher="allgather"), h100) == 24
