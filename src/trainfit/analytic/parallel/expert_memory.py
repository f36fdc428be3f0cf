"""Expert parallelism as torchtitan runs it (stacks/torchtitan.toml [expert_parallel], [expert_dispatch]): which
expert parameters one rank holds unsharded, the dispatch buffers of its all-to-all, (the experts' own FSDP group is the
expert data-parallel group parallel/zero.py dp_comm exchanges them over). The all-to-all's time is
parallel/expert.py's (ep_comm_seconds).

Parameters (torchtitan 0.2.2 distributed/expert_parallel.py, models/llama4/infra/parallelize.py apply_fsdp): the
routed experts are Shard(0) over ep (E/ep experts a rank), each split again over etp, then FSDP-sharded over the
efsdp = dp_shard·tp / (etp·ep) ranks; the router and shared experts stay in the block, split over tp and sharded
over dp_shard. At rest a rank holds E/(dp_shard·tp) of the experts whatever ep is (ep·efsdp·etp = dp_shard·tp): ep
changes the unsharded copies (a block's all-gather output and its unsharded gradients: E/(ep·etp) instead of E/tp)
and the experts' FSDP traffic, not the sharded states.
"""
from __future__ import annotations

from ...setup import Setup
from ...spec import ModelSpec
from ..params import ParamCounts
from .expert import routed_expert_params


def moe_mlp_on_rank(spec: ModelSpec, pc: ParamCounts, setup: Setup) -> float:
    """One MoE layer's MLP parameters on one rank, unsharded: with --ep > 1 the routed experts over ep × etp and the
    router and shared experts over tp (torchtitan parallel_dims.py sparse mesh; ExpertParallel Shard(0),
    ExpertTensorParallel Shard(0) + Shard(1)/(2): expert_parallel.py:97-100, 218-238); without EP all over tp."""
    if setup.ep <= 1 or spec.moe is None:
        return pc.moe_mlp / setup.tp
    routed = routed_expert_params(spec, pc)
    return (pc.moe_mlp - routed) / setup.tp + routed / (setup.ep * setup.expert_tp)


def dispatch_bytes(spec: ModelSpec, setup: Setup, tokens: float, act_bytes: float) -> float:
    """Bytes beside the routed tokens (of `tokens` on the rank) that one MoE layer's dispatch holds at once under
    --ep > 1, in the forward and again (as gradients) in the backward: the all-to-all's output (the tokens·top_k
    rows this rank's experts receive) while _permute copies it twice (a vstack with a zero row, then the index copy
    padded per local expert to the alignment: expert_parallel.py:137-164, models/moe/utils.py:42-59). Without EP the same _permute runs on the
    routed tokens themselves (moe.py:163-177), so the all-to-all output is EP's extra: one copy of
    tokens·top_k × hidden, less the padding rows the permuted copy no longer has (align per expert, E/ep experts
    instead of E).
    NB: balanced routing (each rank receives the tokens·top_k rows it sends): the busiest rank of an imbalanced
    router receives more, so under-counts there (torchtitan #1789). Under --moe-dispatcher deepep the same bytes
    (the planner judges a group's tensors once for all its dispatchers: memory.NOT_IN_MEMORY): DeepEP's dispatch
    delivers each token once per destination rank, not per expert, and _permute_tokens pads nothing (stacks/
    torchtitan.toml [expert_dispatch.deepep]), so over-counts there."""
    if setup.ep <= 1 or spec.moe is None:
        return 0.0
    m = spec.moe
    align = setup.stack_facts.fact("expert_dispatch", "align")
    rows = _routed_rows(spec, setup, tokens) - (m.num_experts - m.num_experts / setup.ep) * align
    return max(0.0, rows) * spec.hidden * act_bytes


def _routed_rows(spec: ModelSpec, setup: Setup, tokens: float) -> float:
    """The tokens·top_k rows one rank sends to (and, balanced, receives from) the all-to-all: under --etp 1 with
    --tp > 1 each tp rank routes 1/tp of the tokens (ReordererSequenceParallel, expert_parallel.py:258-306)."""
    if setup.tp > 1 and setup.expert_tp == 1:
        tokens /= setup.tp
    return tokens * spec.moe.top_k


def sac_saved_all_to_all(spec: ModelSpec, setup: Setup, tokens: float, act_bytes: float) -> float:
    """Bytes one MoE layer stores to its backward under torchtitan's per-op SAC when the model's save list holds
    all_to_all_single (stacks/torchtitan.toml [expert_dispatch] op_sac_saves: deepseek_v3's, llama4's): _custom_policy
    MUST_SAVEs the dispatch's output (the rows the rank's experts receive) and the combine's (the rows sent back), two
    tokens·top_k × hidden tensors in the routed tokens' dtype, beside the block's other stored outputs.
    NB: balanced routing (the busiest rank receives more: under-counts there). Under --moe-dispatcher deepep the
    same bytes (as dispatch_bytes): DeepEP's stored dispatch output is the received distinct tokens (with their
    top-k int64 indices and fp32 scores) and its combine output the rank's own tokens, fewer rows for top_k > 1:
    over-counts there."""
    if setup.ep <= 1 or spec.moe is None or setup.recompute != "op":
        return 0.0
    facts = setup.stack_facts.facts
    model = setup.stack_facts.moe_model(spec.family)
    if model not in facts.get("expert_dispatch", {}).get("op_sac_saves", ()):
        return 0.0
    return 2 * _routed_rows(spec, setup, tokens) * spec.hidden * act_bytes
