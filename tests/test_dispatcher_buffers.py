"""The MoE dispatchers' own buffers per rank against the sizes worked by hand from their code — DeepEP's
(deepep_buffers.py; dd758ca csrc/legacy/config.hpp:53-97, deep_ep/buffers/legacy.py:245-288, csrc/legacy/buffer.hpp:
100-150) and HybridEP's (hybridep_buffers.py; hybrid-ep 94a9f8f csrc/hybrid_ep/buffer/intranode.cu:193-290,
internode_doca.cu:383-592) — and the estimate and the planner taking them off the GPU. Fast (no torch)."""
from __future__ import annotations

from trainfit import deepep_buffers, hybridep_buffers
from trainfit.analytic.engine import estimate
from trainfit.analytic.fit_rule import capacity
from trainfit.api import load_spec
from trainfit.hardware import get_gpu
from trainfit.plan.search import planned_setup

MiB = 2**20


def test_one_nvlink_domain_by_hand():
    """Hidden 2048 in bf16 (4,096 bytes), 8 ranks, 20 SMs (10 channels): a received token's slot is 4,096 + 8
    (SourceMeta) + 128 × (8 + 4) (top-k indices, weights) + 128 × 4 (scales) = 6,152 bytes; dispatch and combine
    both receive 256 tokens a channel; 10 × 8 × ((2·1 + 3) × 4 + 256 × 6,152) = 125,994,560, rounded up to 128:
    125,994,624; no RDMA buffer within 8 ranks; + 160 bytes of signals and pointers + the 32 MiB workspace."""
    assert deepep_buffers.hint_bytes(4096, 8, 20) == (125_994_624, 0)
    assert deepep_buffers.buffer_bytes(4096, 8, 20) == 125_994_624 + 160 + 32 * MiB


def test_across_nodes_by_hand():
    """DeepSeek-V3's hidden 7168 in bf16 (14,336 bytes), 64 ranks (8 nodes of 8), 20 SMs: a slot is 16,392 bytes;
    NVLink: 10 × 8 × ((2·8 + 3) × 4 + 288 × 16,392) = 377,677,760 → 377,677,824; RDMA: both configs receive 128
    tokens (a multiple of their send counts, 8), each twice with an int4: 10 × 8 × ((8·2 + 2) × 2 × 4 + 128 × 2 ×
    (16,392 + 16)) = 336,047,360; with NVSHMEM's 256 MiB start that is 576.5 MiB of the heap: two 512 MiB granules."""
    assert deepep_buffers.hint_bytes(14336, 64, 20) == (377_677_824, 336_047_360)
    assert deepep_buffers.buffer_bytes(14336, 64, 20) == 377_677_824 + 160 + 32 * MiB + 1024 * MiB


def test_the_rdma_receive_count_rounds_to_the_send_count():
    """16 ranks (2 nodes): the dispatch config receives 128 RDMA tokens in chunks of 20, so 140 (the combine's
    128 in 12s: 132); 10 × 2 × ((8·2 + 2) × 2 × 4 + 140 × 2 × 16,408) = 91,887,680 → 91,887,744, which with the 256 MiB
    start fits one 512 MiB granule; NVLink: 10 × 8 × ((2·2 + 3) × 4 + 288 × 16,392) = 377,673,920 → 377,673,984."""
    assert deepep_buffers.hint_bytes(14336, 16, 20) == (377_673_984, 91_887_744)
    assert deepep_buffers.buffer_bytes(14336, 16, 20) == 377_673_984 + 160 + 32 * MiB + 512 * MiB


def test_more_sms_more_channels():
    """24 SMs are 12 channels: the hidden-2048 NVLink buffer grows by 12/10 (151,193,472 = 12 × 8 × 1,574,932)."""
    assert deepep_buffers.hint_bytes(4096, 8, 24)[0] == 151_193_472


def test_hybridep_within_one_node_by_hand():
    """Qwen3-30B-A3B (hidden 2048, 128 experts) at EP 8 on one node, 4,096 tokens a rank, 16 experts a rank: each of
    the group's 8 × 4,096 tokens has a slot of 2,048 × 2 (bf16) + 16 × 8 × 4 (probabilities of the node's experts)
    + 2,048 / 128 × 4 (scales) = 4,672 bytes: 153,092,096; + 2 × 64 chunks × 8 ranks × 4 bytes of flags."""
    assert hybridep_buffers.buffer_bytes(2048, 4096, 16, 8, 8) == 153_092_096 + 4096


def test_hybridep_across_nodes_by_hand():
    """DeepSeek-V3 (hidden 7168, 256 experts) at EP 16 over 2 nodes, 4,096 tokens, 16 experts a rank: NVLink
    4,096 × 16 × (14,336 + 512 + 224) = 987,758,592 + 8,192 of flags; RDMA dispatch 4,096 × (14,336 + 512 × 2 + 224)
    (its own tokens, probabilities for both nodes' experts) + 4,096 × 1 × 15,072 (those it forwards) = 125,566,976;
    combine 2 × 4,096 × 1 × (14,336 + 512) = 121,634,816; flags 4 × (64 + 2) × 8 = 2,112."""
    assert hybridep_buffers.buffer_bytes(7168, 4096, 16, 8, 16) == (987_758_592 + 8192 + 125_566_976 + 121_634_816
                                                                    + 2112)


def test_hybridep_sizes_at_least_512_tokens_in_64_token_chunks():
    assert [hybridep_buffers.padded_tokens(n) for n in (1, 512, 513, 1000, 4096)] == [512, 512, 576, 1024, 4096]


def test_the_estimate_and_the_capacity_take_them():
    gpu, spec = get_gpu("H100-80GB"), load_spec("qwen3-30b-a3b")
    base = dict(seq=4096, stack="megatron", precision="bf16-master", zero=1, dp=8, ep=8, recompute="full")
    plain = planned_setup(spec, **base)
    deepep = planned_setup(spec, moe_dispatcher="deepep", **base)
    assert capacity(gpu, plain, 0, spec) - capacity(gpu, deepep, 0, spec) == 125_994_624 + 160 + 32 * MiB
    a, b = estimate(spec, plain, gpu), estimate(spec, deepep, gpu)
    assert b.memory.overheads["deepep_buffers"] == 125_994_624 + 160 + 32 * MiB
    assert b.memory.device_total - a.memory.device_total == 125_994_624 + 160 + 32 * MiB


def test_the_planner_judges_a_deepep_plan_with_its_buffers():
    """DeepSeek-V3 on 256 H100s, torchtitan (its dispatchers: the all-to-all and DeepEP): the fastest plan runs
    DeepEP over 16 ranks (948,099,488 bytes of buffers: test_the_rdma_receive_count_rounds_to_the_send_count). With
    --reserve taking all but half of the buffers from its headroom, the all-to-all would still fit that setup and
    DeepEP would not: the planner (which judges a group's memory at the defaults' capacity) must not return it, and
    every plan it returns fits as its estimate says."""
    from trainfit.plan.search import PlanQuery, search

    gpu, spec = get_gpu("H100-80GB"), load_spec("deepseek-v3")
    q = dict(gpus=256, seq=4096, stacks=("torchtitan",), top=3)
    first = search(spec, gpu, PlanQuery(**q), workers=1).candidates[0]
    s = first.setup
    assert (s.moe_dispatcher, s.ep) == ("deepep", 16)
    assert first.estimate.memory.overheads["deepep_buffers"] == 948_099_488
    reserve = (first.headroom + 948_099_488 / 2) / 2**30
    got = search(spec, gpu, PlanQuery(**q, reserve=reserve), workers=1).candidates
    assert got and all(c.estimate.fit.fits for c in got)
    assert not any(c.setup.moe_dispatcher == "deepep" and (c.setup.dp, c.setup.ep, c.setup.zero, c.setup.recompute,
                                                          c.setup.batch) == (s.dp, s.ep, s.zero, s.recompute, s.batch)
                   for c in got)


def test_the_estimate_takes_hybrideps_for_the_rank_tokens_at_the_dispatcher():
    """Megatron's HybridEP buffer is sized on the first dispatch for the rank's tokens there: 4,096 at --tp 1 (EP 8:
    test_hybridep_within_one_node_by_hand); under --tp 2 with sequence parallelism 2,048, over the tp × ep group of
    8 (EP 4, expert TP 2: Megatron's default, the TP), 32 experts a rank: 2,048 × 8 × (4,096 + 32 × 8 × 4 + 64) =
    84,934,656 + 2 × 32 × 8 × 4 bytes of flags."""
    gpu, spec = get_gpu("H100-80GB"), load_spec("qwen3-30b-a3b")
    base = dict(seq=4096, stack="megatron", precision="bf16-master", zero=1, recompute="full",
                moe_dispatcher="hybridep")
    one = estimate(spec, planned_setup(spec, dp=8, ep=8, **base), gpu)
    assert one.memory.overheads["hybridep_buffers"] == 153_092_096 + 4096
    assert "deepep_buffers" not in one.memory.overheads
    two = estimate(spec, planned_setup(spec, dp=4, tp=2, ep=4, sequence_parallel=True, **base), gpu)
    assert (two.setup.expert_tp, two.memory.overheads["hybridep_buffers"]) == (2, 84_934_656 + 2048)
