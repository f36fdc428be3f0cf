"""Routing imbalance (--moe-imbalance, --moe-force-balance, --moe-capacity-factor): the busiest expert-parallel rank's
load, its sampling floor against a Monte-Carlo draw of Megatron's forced-balance routing, and what it scales in memory
and in time."""
import math
from dataclasses import replace

import numpy as np
import pytest

from trainfit.analytic.layout import validate_layout
from trainfit.analytic.megatron_activations import layer_terms
from trainfit.analytic.moe_imbalance import (DROPLESS, busiest_rank_load, expected_max_normal, held_load,
                                            node_load, sampling_floor)
from trainfit.analytic.ops.layer import layer_forward
from trainfit.analytic.ops.shape import shape_of
from trainfit.analytic.precision import state_bytes
from trainfit.analytic.step_time import layout_step_time
from trainfit.analytic.timing import compute_dtype
from trainfit.errors import SetupError
from trainfit.hardware import get_gpu
from trainfit.models.resolve import load_model
from trainfit.setup import Setup

MEGATRON = dict(stack="megatron", precision="bf16-master", batch=1, seq=512, dp=4, ep=2)


def test_expected_max_of_normals_matches_the_closed_forms():
    # E[max of 2] = 1/sqrt(pi), E[max of 3] = 3/(2 sqrt(pi)) (order statistics of the standard normal)
    assert expected_max_normal(2) == pytest.approx(1 / math.sqrt(math.pi), abs=1e-6)
    assert expected_max_normal(3) == pytest.approx(3 / (2 * math.sqrt(math.pi)), abs=1e-6)
    assert expected_max_normal(1) == 0.0


@pytest.mark.parametrize("tokens, top_k, experts, ep", [(512, 8, 128, 8), (2048, 2, 8, 4), (256, 8, 64, 16)])
def test_sampling_floor_matches_a_monte_carlo_draw_of_uniform_top_k(tokens, top_k, experts, ep):
    """Megatron's forced balance: N(0, 1) logits per token, top-k of them (router.py:655-657, RandomSTE), i.e. a
    uniform k-subset per token; the busiest of ep ranks (experts/ep consecutive experts each) over the mean."""
    rng = np.random.default_rng(0)
    ratios = []
    for _ in range(200):
        chosen = np.argpartition(rng.standard_normal((tokens, experts)), -top_k, axis=1)[:, -top_k:]
        per_rank = np.bincount((chosen // (experts // ep)).ravel(), minlength=ep)
        ratios.append(per_rank.max() / (tokens * top_k / ep))
    mc, se = float(np.mean(ratios)), float(np.std(ratios) / np.sqrt(len(ratios)))
    floor = sampling_floor(tokens, top_k, experts, ep)
    assert floor > 1.02  # a measurable excess, not a restated 1.0
    # within the draw's noise and the normal approximation's (a few % of the excess)
    assert floor == pytest.approx(mc, abs=4 * se + 0.05 * (mc - 1))


def test_the_load_follows_the_router_settings():
    spec = load_model("tiny-mixtral")  # 4 experts, top-2
    tokens = 512
    floor = sampling_floor(tokens * 2, 2, 4, 2)  # the EP group of 2 ranks routes twice the rank's tokens
    assert busiest_rank_load(spec, Setup(**{**MEGATRON, "ep": 1}), tokens) == 1.0  # a rank holds every expert
    assert busiest_rank_load(spec, Setup(**MEGATRON, moe_force_balance=True), tokens) == pytest.approx(floor)
    assert busiest_rank_load(spec, Setup(**MEGATRON), tokens) == max(DROPLESS, floor)
    assert busiest_rank_load(spec, Setup(**MEGATRON, moe_imbalance=1.5), tokens) == 1.5
    # a capacity factor caps what one expert takes from each source rank: ceil(T·k/E · cf) (moe_utils.get_capacity)
    assert busiest_rank_load(spec, Setup(**MEGATRON, moe_imbalance=1.5, moe_capacity_factor=1.2), tokens) == 1.2


def test_megatron_routed_activations_scale_on_the_busiest_rank():
    """Hand derivation (MoEAlltoAllTokenDispatcher + TEGroupedMLP, bf16, etp 1): per routed copy fc1's input (h, 2 B;
    fc2's output is not saved: the probabilities are applied in the activation, experts.py:680-746, and the combine
    unpermutes without them, token_dispatcher.py:833-840) and fc1's SwiGLU output (2i) with the activation output
    (i): k·2·(h + 3i) bytes per token. X = 1.5 adds half of it, and nothing else changes."""
    spec = load_model("tiny-mixtral")
    h, i, k = spec.hidden, spec.moe.expert_intermediate, spec.moe.top_k
    base = layer_terms(spec, Setup(**MEGATRON, moe_imbalance=1.0), moe=True)
    busy = layer_terms(spec, Setup(**MEGATRON, moe_imbalance=1.5), moe=True)
    routed = k * 2 * (h + 3 * i)
    assert sum(busy.split.values()) - sum(base.split.values()) == pytest.approx(0.5 * routed)
    assert busy.replicated == base.replicated


def test_held_pairs_match_a_monte_carlo_draw_of_their_sum():
    """n (micro-batch, layer) pairs each routed by a uniform top-k draw (forced balance), summed per rank: the rank
    holding the most over n × the balanced mean, against held_load(floor, n) = 1 + (floor − 1)/√n, and well below
    the one pair's busiest load that every pair would have if all were at their worst."""
    tokens, top_k, experts, ep, n = 256, 2, 16, 4, 16
    rng = np.random.default_rng(0)
    # per token, the copies landing on each rank's experts/ep experts: multivariate hypergeometric (k distinct)
    copies = rng.multivariate_hypergeometric([experts // ep] * ep, top_k, size=(300, n, tokens)).sum(axis=2)
    ratios = copies.sum(axis=1).max(axis=1) / (n * tokens * top_k / ep)
    mc, se = float(ratios.mean()), float(ratios.std() / np.sqrt(len(ratios)))
    floor = sampling_floor(tokens, top_k, experts, ep)
    assert held_load(floor, 1) == floor
    assert held_load(floor, n) == pytest.approx(mc, abs=4 * se + 0.05 * (mc - 1))
    assert mc - 1 < 0.3 * (floor - 1)  # 1/√16 of the excess, not all of it


def test_megatron_stage_holds_its_pairs_at_the_held_load():
    """Hand derivation: tiny-mixtral with 8 MoE layers on --pp 2, 4 micro-batches: stage 0 holds 4 layers of
    pp − 0 − 1 + 1 = 2 micro-batches (schedules.py warm-up + 1), n = 8 pairs. Per routed copy (bf16, etp 1, tp 1)
    k·2·(h + 3i) bytes; at --moe-imbalance 1.5 the stage's stored activations grow by
    8 pairs × 512 tokens × that × 0.5/√8 over 1.0 (not × 0.5: the busiest rank differs from pair to pair)."""
    from trainfit import engines

    spec = replace(load_model("tiny-mixtral"), layers=8)
    h, i, k = spec.hidden, spec.moe.expert_intermediate, spec.moe.top_k
    kw = dict(stack="megatron", precision="bf16-master", batch=1, seq=512, dp=2, ep=2, pp=2, grad_accum=4)
    base, busy = (engines.analytic(spec, Setup(**kw, moe_imbalance=x)) for x in (1.0, 1.5))
    assert busy.detail.records["stage"] == 0 and busy.detail.records["moe_pairs_held"] == 8
    routed = k * 2 * (h + 3 * i)
    assert busy.memory.activations - base.memory.activations == pytest.approx(8 * 512 * routed * 0.5 / math.sqrt(8),
                                                                              rel=1e-6)


def test_c8_fits_as_it_ran():
    """shared/calibration.md C8 ran on 80 GB H100s. Its busiest stage (rank 1: 3 layers, (2·30 + 2·32 + 1)/3
    micro-batches in flight under VPP 3: schedules.py) holds 125 (micro-batch, layer) pairs, whose routed copies
    are counted at 1 + 0.1/√125 of the balanced ones, not at the dropless 1.10 of one pair."""
    from bench.targets import time_published as tp
    from bench.targets.time_runs import C8_RUN
    from trainfit import engines

    spec, setup = tp.build_spec(C8_RUN), tp.build_setup(C8_RUN)
    e = engines.analytic(spec, setup, get_gpu(C8_RUN["gpu"]))
    assert e.detail.records["moe_pairs_held"] == pytest.approx(125)
    assert e.fit.fits and e.fit.headroom > 0


def test_expert_gemms_run_on_the_busiest_ranks_copies():
    spec = load_model("tiny-mixtral")
    setup = Setup(**MEGATRON, moe_imbalance=1.3)
    sh = shape_of(spec, setup, state_bytes(setup), compute_dtype(setup))
    ops = {o.name: o for o in layer_forward(spec, sh, moe=True)}
    balanced = 512 * 2 / 2  # T·top_k over the 4/2 local experts
    # 1.3 × 512 = 665.6 copies per expert, rounded up to whole 16-token rows past the balanced 512
    assert ops["experts_in"].m == balanced + 160
    assert ops["experts_out"].m == balanced + 160
    flat = {o.name: o for o in layer_forward(spec, replace(sh, moe_load=1.0), moe=True)}
    assert flat["experts_in"].m == balanced
    assert ops["router"].m == flat["router"].m  # the router runs on the rank's own tokens


def test_dropless_routing_is_slower_than_forced_balance():
    spec = load_model("mixtral-8x7b")
    gpu = get_gpu("H100-80GB")
    kw = dict(stack="megatron", precision="bf16-master", dp=8, ep=8, seq=4096, batch=1, recompute="full")
    forced = layout_step_time(spec, Setup(moe_force_balance=True, **kw), gpu)
    dropless = layout_step_time(spec, Setup(**kw), gpu)
    skewed = layout_step_time(spec, Setup(moe_imbalance=2.0, **kw), gpu)
    assert forced.step_seconds < dropless.step_seconds < skewed.step_seconds
    # the busiest rank receives and returns X times the mean copies (parallel/expert.py): the exchange scales by X
    x_forced = busiest_rank_load(spec, Setup(moe_force_balance=True, **kw), 4096)
    x_dropless = busiest_rank_load(spec, Setup(**kw), 4096)
    assert x_forced < x_dropless == pytest.approx(DROPLESS)
    assert dropless.ep_comm / forced.ep_comm == pytest.approx(x_dropless / x_forced, rel=1e-9)


def test_dropless_default_reproduces_c8():
    """The training default is fitted on C8 (shared/calibration.md: 24.2 s a step), through the public step-time path
    the benches read: C8 lands within 1 % of its published step at the kept (rounded) value."""
    from bench.targets.time_published import predict
    from bench.targets.time_runs import C8_RUN, published_step

    assert predict(C8_RUN) / published_step(C8_RUN) - 1 == pytest.approx(0, abs=0.01)


def test_node_load_matches_a_monte_carlo_draw_of_summed_ranks():
    """Ranks drawn as sampling_floor's model (C_r = μ + s·(Z_r − mean Z)), s set so that the busiest of ep ranks
    takes `load`; summed over nodes of per_node ranks: the busiest node over its mean, against node_load."""
    rng = np.random.default_rng(1)
    ep, per_node, load, mu = 32, 8, 1.86, 1000.0
    s = (load - 1) * mu / expected_max_normal(ep)
    z = rng.standard_normal((20000, ep))
    ranks = mu + s * (z - z.mean(axis=1, keepdims=True))
    nodes = ranks.reshape(-1, ep // per_node, per_node).sum(axis=2)
    mc = float((nodes.max(axis=1) / (per_node * mu)).mean())
    assert node_load(load, ep, per_node) == pytest.approx(mc, rel=0.01)
    assert 1.0 < node_load(load, ep, per_node) < 1 + (load - 1) / 2  # a node averages its ranks' excess
    assert node_load(load, 8, 8) == 1.0  # one node: no node is busier


def test_routing_settings_are_refused_where_they_do_not_apply():
    with pytest.raises(SetupError, match="runs no expert parallelism"):
        Setup(stack="hf", moe_imbalance=1.2)
    with pytest.raises(SetupError, match="no such router option"):
        Setup(stack="hf", moe_force_balance=True)
    with pytest.raises(SetupError, match="no such router option"):
        Setup(stack="hf", moe_capacity_factor=1.25)
    with pytest.raises(SetupError, match="give one of them"):
        Setup(**MEGATRON, moe_force_balance=True, moe_imbalance=1.2)
    with pytest.raises(SetupError, match=">= 1|at least"):
        Setup(**MEGATRON, moe_imbalance=0.5)
    with pytest.raises(SetupError, match="is dense"):
        validate_layout(load_model("tiny-llama"), Setup(stack="megatron", precision="bf16-master",
                                                        moe_imbalance=1.2))


@pytest.mark.parametrize("stack, flags", [
    (("--stack", "megatron", "--zero", "1"), ("--moe-imbalance", "1.5")),
    (("--stack", "megatron", "--zero", "1"), ("--moe-capacity-factor", "0.5")),
    (("--stack", "torchtitan", "--zero", "3"), ("--moe-imbalance", "1.5")),  # (torchtitan has no capacity factor)
    # torchtitan's forced balance is round-robin routing, no kernel of its own (Megatron's adds its noise: kept)
    (("--stack", "torchtitan", "--zero", "3"), ("--moe-force-balance",)),
])
def test_a_load_setting_at_ep_1_is_refused_not_ignored(cli, stack, flags):
    """At --ep 1 no rank is busier (busiest_rank_load is 1 whatever they say): --moe-imbalance and
    --moe-capacity-factor on a MoE model were accepted and changed nothing (the same step and peak as without them);
    now one line, exit 2. With --ep 2 they are read."""
    argv = ("estimate", "tiny-deepseek", "--gpu", "H100-80GB", "--dp", "2", *stack)
    code, out, err = cli(*argv, *flags)
    assert code == 2 and not out
    line = err.strip()
    assert "\n" not in line and flags[0] in line and "--ep 1" in line and "add --ep N" in line
    assert cli(*argv, "--ep", "2", *flags)[0] == 0
