"""Routing imbalance: the routed token-copies the busiest expert-parallel rank receives over the mean (X >= 1).

With expert parallelism every rank waits at the combine all-to-all for the busiest one, and that rank holds the most
routed activations: its expert GEMMs run on X times the balanced T·top_k/ep copies and its dispatch buffers, expert
intermediates and permuted outputs are X times larger (ops/moe.py, megatron_activations.layer_terms). Where it comes
from (busiest_rank_load):
  --moe-imbalance X   the user's value (e.g. profiled from the run's own tokens-per-expert counts);
  --moe-force-balance the stack's forced balance ([moe] force_balance): Megatron's --moe-router-force-load-balancing
                      replaces the router's logits by N(0, 1) noise (megatron-core 0.16.1 megatron/core/transformer/
                      moe/router.py:655-657, moe_utils.py:1110-1131 RandomSTE), so each token's top-k is a uniform
                      draw: the imbalance is the sampling floor below; torchtitan's _debug_force_load_balance assigns
                      the copies round-robin (round_robin_load);
  otherwise           dropless learned routing: DROPLESS (fitted on C8), or the sampling floor where that is larger;
  --moe-capacity-factor cf  Megatron's --moe-expert-capacity-factor caps it: a source rank sends each expert at most
                      ceil(T·top_k / E · cf) copies (moe_utils.py:193-211 get_capacity, :800-850
                      apply_router_token_dropping), so a local expert receives at most cf times its mean.
With --ep 1 (every rank holds every expert) no rank is busier: 1.0.

X is one (micro-batch, MoE layer) pair's: time waits for that pair's busiest rank, layer by layer. Memory holds many
pairs at once (a pipeline stage's layers × its in-flight micro-batches), and the busiest rank differs from pair to
pair; held_load is the load of the rank that holds the most, averaged over its held pairs.
"""
from __future__ import annotations

import math
from functools import lru_cache

# Dropless learned routing in a training run: the busiest rank's load X fitted on C8 (shared/calibration.md: Qwen3-235B-
# A22B, EP 8, Megatron's alltoall dispatcher, dropless), the only published MoE run a constant may be fitted on:
# `python -m bench run moe_order --fit` solves C8's predicted step time = its published 24.2 s for X (1.91: the C8 row
# is -16.2 % at 1.10). Checked, not fitted: MoE-Zoo's four Qwen3-235B long-context pairs, the same layout run
# dropless and force-balanced (bench/results/moe_order.md), take a 9-25 % slower dropless step that 1.10 read as 1-2 %.
# The mechanism that makes X this large early in a run: a fresh router maps each token's hidden state, which the
# token's own embedding dominates, to nearly fixed experts, and token frequencies are Zipfian, so a few experts take
# the frequent tokens (the aux loss only evens them out over training). NB: one value for every model, EP degree and
# batch, fitted at EP 8 with 16 experts per rank: a later, balanced run, or an aux-loss-free router with its bias
# (DeepSeek-V3's), sits lower (errs slow): a trained router measured 1.069 (median max/mean rank load over 16 EP
# ranks without EPLB, vLLM PR #50647, Kimi K3 serving), and Megatron-Core's own buffer margin for real-world skew is
# 1.10 (Megatron-LM d98e8a6 transformer_config.py:1370 moe_paged_stash_buffer_size_factor_cuda); larger EP with
# fewer experts per rank likely higher (errs fast).
DROPLESS = 1.91


@lru_cache(maxsize=None)
def expected_max_normal(n: int) -> float:
    """E[max of n independent standard normals] = ∫ x · n φ(x) Φ(x)^(n-1) dx (order statistics), by the
    trapezoid rule on [-10, 10] (the integrand is below 1e-20 beyond)."""
    if n <= 1:
        return 0.0
    steps, lo, hi = 4000, -10.0, 10.0
    dx = (hi - lo) / steps
    total = 0.0
    for j in range(steps + 1):
        x = lo + j * dx
        pdf = math.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
        cdf = 0.5 * (1 + math.erf(x / math.sqrt(2)))
        total += (0.5 if j in (0, steps) else 1.0) * x * n * pdf * cdf ** (n - 1)
    return total * dx


def sampling_floor(tokens: float, top_k: int, experts: int, ep: int) -> float:
    """E[busiest rank's copies] / mean when `tokens` tokens each pick top_k distinct experts uniformly at random
    among `experts`, experts/ep on each of ep ranks (Megatron's forced balance; the noise any router keeps).
    Per token the copies landing on one rank are hypergeometric (experts, experts/ep, top_k): mean k/ep, variance
    k·p(1-p)·(E-k)/(E-1) with p = 1/ep; over the tokens (independent) the rank's count C_r has mean μ = T·k/ep and
    variance σ² = T times that. The ep counts sum to T·k, so they are exchangeable with correlation -1/(ep-1):
    C_r ≈ μ + s·(Z_r - mean(Z)) with Z iid N(0, 1) and s = σ·sqrt(ep/(ep-1)); E[max C] ≈ μ + s·E[max Z].
    NB: the normal approximation of the binomial-like counts, good when μ is large (a few copies per rank:
    under-counts the tail); group-limited routing (DeepSeek-V3's node groups) is not the uniform draw."""
    if ep <= 1 or tokens <= 0:
        return 1.0
    p = 1.0 / ep
    mean = tokens * top_k * p
    var = tokens * top_k * p * (1 - p) * (experts - top_k) / max(experts - 1, 1)
    return 1.0 + math.sqrt(var * ep / (ep - 1)) * expected_max_normal(ep) / mean


def busiest_rank_load(spec, setup, tokens: float) -> float:
    """X for `setup` (a Setup or a light object with its fields): the busiest EP rank's routed copies over the
    balanced mean, for a micro-batch of `tokens` tokens per rank (the EP group routes ep times as many)."""
    m = spec.moe
    ep = getattr(setup, "ep", 1)
    if m is None or ep <= 1 or m.experts_every_token:  # Llama 4 runs every expert on every token: no routing
        return 1.0
    floor = sampling_floor(tokens * ep, m.top_k, m.num_experts, ep)
    given = getattr(setup, "moe_imbalance", None)
    if getattr(setup, "moe_force_balance", False):
        load = round_robin_load(tokens, m.top_k, m.num_experts, ep) if forced_by(setup) == "round-robin" else floor
    elif given is not None:
        load = float(given)
    else:
        load = max(DROPLESS, floor)
    cap = getattr(setup, "moe_capacity_factor", None)
    return min(load, cap) if cap is not None else load


def forced_by(setup) -> str | None:
    """The stack's forced balance ([moe] force_balance): "random-logits" (Megatron), "round-robin" (torchtitan),
    None where it has none."""
    facts = getattr(setup, "stack_facts", None)
    return facts.facts.get("moe", {}).get("force_balance") if facts is not None else None


def near_equal_parts(total: int, parts: int) -> list[int]:
    """`total` in `parts` near-equal whole parts, the first total mod parts of them one larger."""
    return [total // parts + (i < total % parts) for i in range(parts)]


def round_robin_expert_counts(copies: int, experts: int) -> list[int]:
    """The routed copies each expert receives from one source rank under torchtitan's forced balance (0.2.2
    models/moe/moe.py:234-249: a rank's `copies` = tokens·top_k go to experts arange(copies) % E): expert e gets
    copies // E, one more where e < copies mod E."""
    return near_equal_parts(copies, experts)


def round_robin_counts(copies: int, experts: int, ep: int) -> list[int]:
    """The routed copies each EP rank receives from one source rank under torchtitan's forced balance: the sum of
    round_robin_expert_counts over its experts, rank d holding experts d·L … (d+1)·L − 1 for L = E/ep (in closed
    form: the planner calls it per setup). Every source rank routes alike, so rank d receives ep times its count."""
    local = experts // ep
    return [local * (copies // experts) + min(max(copies % experts - d * local, 0), local) for d in range(ep)]


def round_robin_load(tokens: float, top_k: int, experts: int, ep: int) -> float:
    """The busiest rank's copies over the mean under torchtitan's forced balance (round_robin_counts): rank 0, with
    ep·(L·(n // E) + min(n mod E, L)) copies for n = tokens·top_k, over the mean n."""
    n = int(tokens * top_k)
    if n <= 0:
        return 1.0
    return ep * round_robin_counts(n, experts, ep)[0] / n


def least_load(setup) -> float:
    """A lower bound of held_load(busiest_rank_load(spec, setup, tokens), pairs) for every micro-batch and pair
    count: every load above is at least 1 (the busiest rank holds at least the mean; --moe-imbalance >= 1) but under a
    capacity factor below 1, which caps it, and held_load lies between its load and 1."""
    cap = getattr(setup, "moe_capacity_factor", None)
    return min(1.0, cap) if cap is not None else 1.0


def held_load(load: float, pairs: float) -> float:
    """The routed copies a rank holds over `pairs` (micro-batch, MoE layer) pairs at once, on the rank that holds the
    most, over the balanced pairs × mean, for a per-pair busiest-rank load `load` (busiest_rank_load).
    sampling_floor's model of one pair j: rank r's copies C_rj = μ + s·(Z_rj − mean_r Z_rj), Z iid N(0, 1), so
    load − 1 = s·E[max Z over ep]/μ (DROPLESS and a given X read through the same model). Pairs route independently
    (each layer its own router, each micro-batch its own tokens): S_r = Σ_j C_rj = nμ + s·Σ_j (Z_rj − mean_r Z_rj),
    and a sum of n iid N(0, 1) is √n·N(0, 1), so S_r = nμ + s·√n·(W_r − mean_r W_r) with W iid N(0, 1):
    E[max_r S_r] = nμ + s·√n·E[max W] = nμ·(1 + (load − 1)/√n).
    NB: independent pairs; a router's lasting preference for the same experts over a layer's micro-batches
    correlates them and the excess grows faster than √n (under-counts), as does a run's largest sum over its many
    steps above this expectation; a capacity factor's cap on each pair also caps their mean (kept: load ≤ cap)."""
    return 1.0 + (load - 1.0) / math.sqrt(max(pairs, 1.0))


def node_load(load: float, ep: int, per_node: int) -> float:
    """The busiest node's routed copies over the mean, for ranks whose busiest one takes `load` (busiest_rank_load),
    `ep` ranks in `per_node`-rank nodes (what a node's NICs receive under DeepEP's dispatch: parallel/expert.py).
    sampling_floor's model: rank r takes μ + s·(Z_r − mean Z), so load − 1 = s·E[max of ep Z]/μ; a node sums its n
    ranks: nμ + s·√n·W, W ~ N(0, 1), and the busiest of ep/n nodes takes nμ·(1 + s·E[max of ep/n W]/(√n·μ)):
    1 + (load − 1)·E[max of ep/n]/(E[max of ep]·√n). NB: independent ranks (as held_load); experts that a router
    favours together on one node would correlate them (under-counts)."""
    nodes = -(-ep // max(1, per_node))
    if nodes <= 1 or load <= 1.0:
        return 1.0
    return 1.0 + (load - 1.0) * expected_max_normal(nodes) / (expected_max_normal(ep) * math.sqrt(per_node))
