"""DeepEP's buffers per rank (deepep_buffers.py) against the sizes worked by hand from DeepEP's code (dd758ca
csrc/legacy/config.hpp:53-97, deep_ep/buffers/legacy.py:245-288, csrc/legacy/buffer.hpp:100-150), and the estimate
and the planner taking them off the GPU. Fast (no torch)."""
from __future__ import annotations

from trainfit import deepep_buffers
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


def test_the_estimate_and_the_capacity_take_them():
    gpu, spec = get_gpu("H100-80GB"), load_spec("qwen3-30b-a3b")
    base = dict(seq=4096, stack="megatron", precision="bf16-master", zero=1, dp=8, ep=8, recompute="full")
    plain = planned_setup(spec, **base)
    deepep = planned_setup(spec, moe_dispatcher="deepep", **base)
    assert capacity(gpu, plain, 0, spec) - capacity(gpu, deepep, 0, spec) == 125_994_624 + 160 + 32 * MiB
    from trainfit.analytic.engine import estimate

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
