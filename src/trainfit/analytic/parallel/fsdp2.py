"""FSDP2 as torchtitan wraps and runs it: per-group all-gathers in param_dtype, reduce-scatters in reduce_dtype.

torchtitan (stacks/torchtitan.toml [fsdp], [mixed_precision]) calls fully_shard on the token embedding, on each
TransformerBlock, on [final norm, output] together (reshard_after_forward=False: FSDP would gather it again at
once for the backward) and on the root (no parameters of its own), with MixedPrecisionPolicy(param_dtype=bf16,
reduce_dtype=fp32) (torchtitan/models/llama3/infra/parallelize.py:287-357 apply_fsdp). The blocks and the
embedding reshard after forward (ZeRO-3) unless the policy is "never" (trainfit's --zero 2) or pipeline parallelism
is on (policy "default": `reshard_after_forward = not pp_enabled`).

What one rank holds, from torch/distributed/fsdp/_fully_shard (torch 2.13):
  * resident: the fp32 parameter shards, their fp32 gradient shards (the reduce-scatter outputs,
    _fsdp_collectives.py foreach_reduce: `new_sharded_grad = torch.as_strided(reduce_output, ...)`) and the
    optimizer's state of the shards — ZeRO-3's 16Ψ/dp (Rajbhandari et al. 2020 §5.1) for every --zero FSDP runs;
  * a group's unsharded parameters in param_dtype from its pre-forward (or pre-backward) all-gather copy-out to its
    reshard (_fsdp_param_group.py wait_for_unshard / reshard);
  * in backward, the next group's all-gather output, prefetched at this group's pre-backward
    (_fsdp_param_group.py _backward_prefetch) and freed after its copy-out; in forward one group's all-gather output
    is kept until the next group's copy-out (`comm_ctx.all_gather_state`), and the root's post-forward frees the
    last (_fsdp_state.py:335-342): none is left at the loss;
  * the group's unsharded gradients in param_dtype, made by its backward, copied into a reduce_dtype
    reduce-scatter input (foreach_reduce: `reduce_scatter_comm.allocate(..., dtype=reduce_dtype)`, chunk_cat) and
    freed; that input is kept until the next group's post-backward (`comm_ctx.reduce_scatter_states`, at most
    `reduce_scatter_max_input_buffers` = 1, _fsdp_param_group.py:112, 641-658).
NB: FSDP2 pads each parameter's dim 0 to a multiple of dp and the all-gather copy-in casts each shard to
param_dtype first (1/dp of a group, transient): neither is counted (under-counts by < 1/dp of a group).
"""
from __future__ import annotations

from dataclasses import dataclass

from ...hardware import GPU
from ...overheads import held_segments
from ...setup import Setup
from ...spec import ModelSpec
from ..params import ParamCounts
from ..roofline import memory_seconds
from ..precision import StateBytes
from ..stacks import model_for
from .expert import routed_expert_params
from .fsdp1 import runs_fsdp1
from .pipeline import Stage
from .zero import ModelStates, shard, shard_ranks


def torchtitan_fsdp(setup: Setup) -> bool:
    """FSDP as the stack's own wrapping runs it (torchtitan: parallel_dims.fsdp_enabled, dp_shard × cp > 1): the
    stack's [fsdp] fact names torchtitan's groups (embedding, each block, [norm, output], root)."""
    return (setup.mode == "train" and shard_ranks(setup) > 1 and setup.zero >= 2
            and setup.stack_facts.facts.get("fsdp", {}).get("groups") == "embedding, each block, [norm, output], root")


def fsdp2_strategy(setup: Setup) -> bool:
    """Whether the step runs FSDP2 (fully_shard) at all: torchtitan's own wrapping (torchtitan_fsdp) or trainfit's
    hf/--zero 2-3 strategy (step/strategy.py: fully_shard on each decoder layer and the root)."""
    return setup.mode == "train" and shard_ranks(setup) > 1 and setup.zero >= 2 and model_for(setup).torch_data_parallel


def reshards_after_forward(setup: Setup) -> bool:
    """torchtitan's reshard_after_forward for the embedding and the blocks: --zero 3 ("default" policy) unless
    pipeline parallelism is on (`not pp_enabled`); --zero 2 is the "never" policy."""
    return setup.zero >= 3 and setup.pp == 1


def fsdp2_model_states(n: float, optimizer_bytes: float, st: StateBytes, setup: Setup) -> ModelStates:
    """Every state sharded over dp (FSDP shards the parameters for --zero 2 too; only their unsharded copies live
    longer): fp32 parameters, fp32 gradients (reduce_output), optimizer state."""
    dp = shard_ranks(setup)
    return ModelStates(n * st.weight / dp, n * st.grad / dp, n * st.master / shard(setup, 1),
                       optimizer_bytes / dp, 0.0)


@dataclass(frozen=True)
class Groups:
    """Parameters of torchtitan's FSDP groups on one rank (one TP shard)."""

    layer: float  # one TransformerBlock
    embedding: float  # tok_embeddings (0 off the first pipeline stage)
    head: float  # [norm, output] (0 off the last pipeline stage)
    layers: int  # blocks on this rank
    reduced_last: float  # of a block, the FSDP group whose post-backward runs last (its reduce-scatter input is kept)
    prefetched: float  # of a block, what the next block's pre-backward all-gathers ahead


def groups(spec: ModelSpec, pc: ParamCounts, setup: Setup, stage: Stage, layer_params: float) -> Groups:
    """Under expert parallelism torchtitan's apply_fsdp wraps each MoE block's routed experts as a group of their own
    over the efsdp mesh (models/llama4/infra/parallelize.py:381-410): their post-backward runs inside the block's
    backward and the block's own runs last, freeing the experts' reduce-scatter input, so the input kept while the
    next block runs backward is the block's without its experts (seen in a real 2-rank EP step on CPU).
    The experts' group is prefetched with its block (:463-494, set_modules_to_backward_prefetch), but over an efsdp
    mesh of one rank FSDP2 all-gathers nothing ahead: it makes the unsharded copy at the group's own pre-forward or
    pre-backward (torch 2.13 fsdp/_fully_shard/_fsdp_param_group.py:392-403, :437-450).
    NB: from the experts' post-backward to the block's (the rest of the MoE and the attention backward) the experts'
    input is held instead of the block's before: those moments are under-counted by the difference.
    NB: the groups are an average block's; where the blocks differ (DeepSeek's dense first blocks), the first MoE
    block's backward prefetches a dense block, larger: under-counted by the difference (DeepSeek-V3 on FSDP 64 with
    EP 64: -0.45 % against the trace, bench torchtitan_moe_cpu)."""
    t = setup.tp
    experts = expert_group_params(spec, pc, setup)
    return Groups(layer_params, pc.embedding / t * stage.embedding, (pc.final + pc.lm_head / t) * stage.head,
                  stage.layers, layer_params - experts, layer_params - (experts if setup.expert_dp == 1 else 0.0))


def expert_group_params(spec: ModelSpec, pc: ParamCounts, setup: Setup) -> float:
    """Of one (average) block's parameters on a rank, the routed experts torchtitan shards as their own FSDP group
    under expert parallelism (groups): E/(ep·etp) experts per MoE layer, sharded over efsdp (Setup.expert_dp), not
    dp; 0 without EP."""
    if setup.ep <= 1 or not spec.is_moe or spec.hybrid is not None:
        return 0.0
    return routed_expert_params(spec, pc) / (setup.ep * setup.expert_tp) * pc.moe_layers / spec.layers


def experts_unsharded_late(spec: ModelSpec, pc: ParamCounts, setup: Setup) -> float:
    """One MoE block's routed-expert parameters on a rank whose unsharded copy FSDP2 makes only at the experts'
    own pre-forward (their group over an efsdp mesh of one rank is not prefetched with the block: groups), 0
    otherwise: a re-run's moment before the experts run (the attention's) is without it, which fsdp2_buffers
    counts with the block's."""
    if not torchtitan_fsdp(setup) or setup.ep <= 1 or setup.expert_dp != 1 or spec.moe is None:
        return 0.0
    return routed_expert_params(spec, pc) / (setup.ep * setup.expert_tp)


def fsdp2_buffers(g: Groups, st: StateBytes, setup: Setup) -> dict:
    """FSDP2's bytes beside the sharded states and the gradients phases.peak counts, at each of its moments (the
    layer's own unsharded gradients so far are counted by the caller, in param_dtype)."""
    p = st.param or st.weight  # the unsharded parameters' and gradients' dtype
    r = st.reduce or st.grad  # the reduce-scatter input's
    if reshards_after_forward(setup):
        # only [norm, output] stays unsharded after its forward, to its backward
        at_loss = g.head * p
        last_unsharded = g.layer * p  # block L-1, all-gathered again at the head's pre-backward (prefetch)
        prefetched_last = g.prefetched * p if g.layers > 1 else g.embedding * p  # block L-2's all-gather output
        first_unsharded = g.layer * p
        prefetched_first = g.embedding * p  # block 0's pre-backward prefetches the embedding
        # block k, block k-1's all-gather output, k+1's RS input
        between = ((g.layer + g.prefetched) * p + g.reduced_last * r, 0.0)
    else:
        # nothing resharded after forward: every group's unsharded parameters live to its own post-backward
        at_loss = (g.embedding + g.layers * g.layer + g.head) * p
        last_unsharded = (g.embedding + g.layers * g.layer) * p  # the head resharded after its backward
        prefetched_last = 0.0  # already unsharded: the prefetch is a no-op
        first_unsharded = (g.embedding + g.layer) * p
        prefetched_first = 0.0
        between = (g.embedding * p + g.reduced_last * r, g.layer * p)  # blocks 0..k still unsharded
    # the reduce-scatter input of the group whose backward ran before (kept to the next post-backward)
    rs_before_last = g.head * r  # none on a pipeline stage without the head: its backward starts with this block
    rs_before_first = g.reduced_last * r if g.layers > 1 else rs_before_last
    # the embedding's gradient shard is counted by the caller among all the gradients; it exists only after the
    # embedding's post-backward copy-in, so it is taken out of the two moments of that backward:
    #   during: its unsharded parameters and gradient, beside block 0's reduce-scatter input;
    #   post-backward: parameters resharded and block 0's input freed, then its own reduce-scatter input filled
    #   from the unsharded gradient (both live)
    embedding = 0.0
    if g.embedding:
        shard_grad = g.embedding * st.grad / shard_ranks(setup)
        kept = g.reduced_last * r if g.layers else 0.0
        embedding = max(2 * g.embedding * p + kept, g.embedding * (r + p)) - shard_grad
    return {
        "forward_end": at_loss,
        "loss_backward": at_loss,
        "last_layer_backward": last_unsharded + prefetched_last + rs_before_last,
        "first_layer_backward": first_unsharded + prefetched_first + rs_before_first,
        "embedding_backward": embedding,
        "layer_backward": between,
    }


def layer_unsharded_grad_bytes(st: StateBytes) -> float:
    """Bytes per parameter of a block's gradients made in its backward, before its post-backward reduce-scatter:
    the unsharded parameters' dtype (param_dtype)."""
    return st.param or st.weight


def side_stream_blocks(group_params: dict[str, float], st: StateBytes, setup: Setup) -> int:
    """What FSDP2's all-gather copy-in stream holds in the caching allocator at its high-water, none of it usable by
    the compute stream (a block returns to its own stream's pool: CUDACachingAllocator.cpp free_block /
    get_free_block keyed by stream; trace/streams.py). `group_params`: parameters per group kind on this rank
    (unsharded, one TP shard); the segments the allocator holds for them: overheads.held_segments.

    Each group's all-gather output (flat, param_dtype, _fsdp_collectives.py:336-361) is allocated on the copy-in
    stream; consecutive groups coexist (the next one is prefetched), and a smaller kind's request is carved from a
    freed larger block (best fit + split, alloc_found_block), so the next larger kind opens a segment of its own:
    one segment per group kind. Under a mixed-precision policy the shards are first cast to param_dtype on that
    stream (:416-421), 1/dp of a group, the largest kind's held in a segment of its own.
    NB: one segment per kind over-reads where two kinds' sizes coincide closely enough to share one; the
    reduce-scatter stream's blocks (the sharded gradients) are counted by the caller."""
    p = st.param or st.weight
    requests = [(n * p, 1) for n in group_params.values()]
    if st.param and st.param != st.weight:
        requests.append((max(group_params.values()) * p / shard_ranks(setup), 1))
    return held_segments(requests)


def copy_bytes(st: StateBytes, st_grads: StateBytes, params: float, trained: float) -> tuple[float, float]:
    """(bytes of one all-gather's copy-out, bytes of one reduce-scatter's copy-in) over a rank's `params` (one TP
    shard of a pipeline stage; `trained`: those that get gradients), both on the compute stream (torch 2.13
    torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py wait_for_unshard -> _fsdp_collectives.py:431-489
    foreach_all_gather_copy_out: split_with_sizes_copy from the all-gather output into the unsharded parameters,
    read + write in param_dtype; foreach_reduce :603 foreach_reduce_scatter_copy_in: chunk_cat of the unsharded
    gradients (param_dtype) into the reduce-scatter input (reduce_dtype), before `reduce_scatter_stream.wait_stream
    (current_stream)`). The copy-in to the all-gather (1/dp of the bytes, on its own stream) is not counted."""
    p = st.param or st.weight
    g = st_grads.param or st_grads.weight  # the unsharded gradients have the unsharded parameters' dtype
    r = st_grads.reduce or st_grads.grad
    return 2 * p * params, (g + r) * trained


def copy_seconds(gpu: GPU, setup: Setup, st: StateBytes, st_grads: StateBytes, params: float, trained: float,
                 layers: int) -> float:
    """One micro-batch's FSDP2 copies on the compute stream (copy_bytes), 0 where the step runs no FSDP2: each
    all-gather's copy-out (two per micro-batch when the forward reshards, one otherwise: the backward reshards either
    way) and each reduce-scatter's copy-in, one kernel per FSDP group (the `layers` blocks, the embedding and the
    head's group: NB per stage, ±1). FSDP1 (--fsdp-version 1) gathers into and reduces from its flat parameter and
    gradient themselves: no such kernels (parallel/fsdp1.py)."""
    if not fsdp2_strategy(setup) or runs_fsdp1(setup):
        return 0.0
    out_b, in_b = copy_bytes(st, st_grads, params, trained)
    gathers = 2 if reshards_after_forward(setup) else 1
    n_groups = layers + 2
    return memory_seconds(gpu, gathers * out_b + in_b, kernels=(gathers + 1) * n_groups)
