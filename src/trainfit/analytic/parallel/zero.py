"""Data parallelism with ZeRO: which model states one rank keeps, and the buffers sharding adds.

Stages per Rajbhandari et al. 2020 ("ZeRO: Memory Optimizations Toward Training Trillion Parameter Models",
§5.1, Fig. 1): stage 1 (P_os) shards the optimizer states (and fp32 masters), stage 2 (P_os+g) also the
gradients, stage 3 (P_os+g+p) also the parameters — each over the `dp` ranks. What torch actually runs adds
buffers the paper leaves out; each is a term below.

Communication (Rajbhandari et al. 2020, §7): stage 0 all-reduces gradients once per step; stage 1 reduce-scatters
them and all-gathers the updated weights; stage 2 reduce-scatters every micro-batch (its gradients are sharded, so
they cannot be accumulated whole); stage 3 also all-gathers the weights in every micro-batch's forward and again in
its backward (1.5× the DDP volume, §7.2.2). The group is the dp × cp ranks that hold the same shard; a MoE's routed
experts are exchanged over their own expert data-parallel group (dp_comm), each group on the link its placement in
the stack's rank order gives it (group_span).
Overlap assumption: data-parallel communication overlaps the backward compute of the same micro-batch (the last one
for stages 0/1, each one for stages 2/3; ZeRO-3's forward all-gathers overlap the forward) and only the part longer
than that compute is exposed — but never less than one 25 MiB bucket (DDP's default bucket_cap_mb), which must wait
for the last layer's gradients. The ZeRO-1/2 weight all-gather after the optimizer step is exposed. The overlapped
compute runs on the SMs NCCL leaves free (analytic/overlap.py): its slowdown is counted here.
NB: the collectives' HBM traffic slows only the overlapped memory-bound kernels, not the GEMMs' reads (optimistic).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from ...hardware import GPU
from ...setup import Setup
from ..overlap import exposed
from ..params import ParamCounts
from ..precision import StateBytes
from .collectives import Links, ranks_per_node
from .fsdp1 import runs_fsdp1
from .pipeline import Stage

BUCKET_BYTES = 25 * 2**20  # torch DDP bucket_cap_mb default


@dataclass(frozen=True)
class ModelStates:
    """Bytes of one rank's model states (resident through the step) and its data-parallel buffers."""

    weights: float
    gradients: float
    master: float
    optimizer: float
    comm: float  # DDP's gradient buckets / FSDP2's parameter shards beside the gathered ones

    @property
    def resident(self) -> float:
        return self.weights + self.master + self.optimizer + self.comm


def shard_ranks(setup: Setup) -> int:
    """The ranks one data-parallel shard group spans: dp, times cp where the stack shards its states over the
    context-parallel ranks too (Stack.zero_shard_axes; torchtitan's FSDP mesh is dp_shard × cp: torchtitan 0.2.2
    distributed/parallel_dims.py:137 fsdp = dp_shard * cp)."""
    return setup.dp * (setup.cp if "cp" in setup.stack_facts.zero_shard_axes else 1)


def shard(setup: Setup, from_stage: int) -> int:
    """The divisor of a state that ZeRO shards from stage `from_stage` on (Rajbhandari §5.1), over shard_ranks."""
    return shard_ranks(setup) if setup.zero >= from_stage else 1


def params_at_rest(n: float, setup: Setup) -> float:
    """Parameters whose storage one rank owns between steps, of the `n` on its tensor/pipeline/expert shard: 1/dp of
    them where data parallelism shards the parameters (ZeRO-3, Rajbhandari §5.1 P_os+g+p; FSDP2's fully_shard at
    either stage it runs, parallel/fsdp2.py fsdp2_strategy: reshard_after_forward=False unshards them only between
    the forward and the backward), all of them otherwise (DDP, ZeRO-1/2, Megatron's distributed optimizer).
    NB: DeepSpeed's ZeRO-3 keeps parameters under its persistence threshold whole on every rank
    (parallel/deepspeed.py persistent_params): under by those few."""
    from .fsdp2 import fsdp2_strategy

    return n / shard_ranks(setup) if (setup.zero >= 3 or fsdp2_strategy(setup)) else n


def model_states(n: float, optimizer_bytes: float, st: StateBytes, setup: Setup) -> ModelStates:
    """n: parameters on this rank before ZeRO; optimizer_bytes: their unsharded optimizer state."""
    dp, z = shard_ranks(setup), setup.zero
    weights = n * st.weight / shard(setup, 3)
    grads = n * st.grad / shard(setup, 2)
    master = n * st.master / shard(setup, 1)
    opt = optimizer_bytes / shard(setup, 1)
    # DDP copies gradients into its own bucket buffers (torch/nn/parallel/distributed.py, gradient_as_bucket_view=
    # False by default): a second gradient-sized allocation resident through the step. ZeRO-2/3 reduce-scatter in
    # small buckets. ZeRO-1 as torch runs it (DDP + ZeroRedundancyOptimizer) keeps those buckets too. ZeRO-2 as
    # FSDP2 runs it (fully_shard(reshard_after_forward=False)) keeps the sharded parameter storage it gathers from
    # beside the full parameters (Rajbhandari's P_os+g, as DeepSpeed runs it, has only the full ones: n/dp fewer).
    comm = n * st.grad if (dp > 1 and z <= 1) else (n * st.weight / dp if z == 2 else 0)
    if z == 2 and unsharded_bytes(setup, st):
        # under the hf stack's FSDP (an FSDP2 MixedPrecisionPolicy, analytic/precision.py, or none) the weights are
        # the shards; the unsharded copies kept from forward to backward are freed group by group (unsharded_at)
        weights, comm = n * st.weight / dp, 0.0
    return ModelStates(weights, grads, master, opt, comm)


def gathered_params(pc: ParamCounts, setup: Setup, st: StateBytes, stage: Stage) -> float:
    """ZeRO-3 / FSDP2: the current layer's and the prefetched next layer's full parameters are gathered
    (Rajbhandari §5.3: parameters are broadcast layer by layer), and the root module (embeddings, final norm,
    LM head) stays unsharded from its forward all-gather to its backward (FSDP2's root is not resharded).
    Under the hf stack's FSDP (unsharded_bytes: param_dtype under a MixedPrecision(Policy), else the stored dtype)
    the gathered root is a whole copy beside its shard, as the layers' are (the trace's FSDP1 and FSDP2 steps hold
    it whole: +14 % over the trace on a 0.1 M-parameter fp32 job counted the old way, tests/callbacks); elsewhere
    (Megatron-FSDP) the (1 - 1/dp) gathered from the other ranks, as before."""
    if setup.zero < 3:
        return 0
    t, dp = setup.tp, shard_ranks(setup)
    root = (pc.embedding * stage.embedding + (pc.final + pc.lm_head) * stage.head) / t
    whole = unsharded_bytes(setup, st)
    root *= whole if whole else st.weight * (1 - 1 / dp)
    return 2 * pc.per_layer_dense / t * (st.param or st.weight) + root


def unsharded_bytes(setup: Setup, st: StateBytes) -> float | None:
    """Bytes per parameter of the unsharded copies whose moments `unsharded_at` counts: param_dtype under a
    MixedPrecision(Policy) (st.param); without one, under the stack's own FSDP wrapper (its [fsdp] versions:
    accelerate's FSDP1 or FSDP2 over each decoder layer and the root) at --zero 2/3, the stored dtype: FSDP1
    all-gathers into `_full_param_padded`, a buffer beside the flat parameter's local shard in the stored dtype
    when no MixedPrecision is given (torch/distributed/fsdp/_flat_param.py:1280-1292), and FSDP2's unsharded
    parameters are their own tensors beside the sharded DTensors (_fsdp_param.py init_unsharded_param), so the same
    moments hold, in fp32. None elsewhere (the constant `gathered_params` is used)."""
    if st.param:
        return st.param
    fsdp = setup.stack_facts.facts.get("fsdp", {})
    if fsdp.get("versions") and setup.zero >= 2 and shard_ranks(setup) > 1:
        return st.weight
    return None


def unsharded_at(pc: ParamCounts, setup: Setup, st: StateBytes, stage: Stage, trainable: float | None = None) -> dict:
    """Under an FSDP2 MixedPrecisionPolicy on trainfit's hf strategy (st.param: each decoder layer and the root,
    step/strategy.py), the param_dtype unsharded copies one rank holds at the step's moments where they differ from
    `gathered_params` (phases.peak's gathered_at; {} without the policy). FSDP2 frees a group's unsharded parameters
    at its post-backward reshard (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py post_backward), and the
    root (embedding, final norm, LM head) is resharded last, after the embedding's backward:
      * --zero 2 (reshard_after_forward=False): every group's copy from the forward to its own backward, so the
        last layer's backward still holds all of them, the first layer's the root's and its own, the embedding's
        the root's alone (each finished layer's copy traded for its fp32 gradient shard);
      * --zero 3: the loss's backward holds the root and the last layer, prefetched by the root's pre-backward
        (_fsdp_param_group.py _backward_prefetch); layer k's backward holds k and the prefetched k-1 beside the
        root (gathered_params); the first layer prefetches nothing (the root is unsharded already): its own and
        the root's; the embedding's, the root's alone.
    The layer before the last (phases.peak's next_layer_backward) holds both a prefetched copy (zero 3) and the
    last layer's kept reduce-scatter input. From the second layer's backward on, the previous layer's reduce-scatter
    input (reduce_dtype, flat, unsharded) is kept until the next post-backward (comm_ctx.reduce_scatter_states, _fsdp_param_group.py:641-658), beside the
    layer's own gradients; the root's comes last, after the embedding's backward.
    At the forward's end the last layer's flat all-gather output is still held (comm_ctx.all_gather_state, freed by
    the root's post-forward: _fsdp_state.py:335-342) when the loss runs inside the model's forward (the stack's
    [loss] in_forward: transformers' ForCausalLMLoss), beside the copies: all of them (zero 2) or the root's.
    `trainable`: a layer's parameters that get gradients where not all do (LoRA's adapters, analytic/lora.py): the
    reduce-scatter input is theirs, and the frozen root reduces nothing."""
    p = unsharded_bytes(setup, st)
    if not p or setup.zero < 2:
        return {}
    t = setup.tp
    layer = pc.per_layer_dense / t * p
    root = (pc.embedding * stage.embedding + (pc.final + pc.lm_head) * stage.head) / t * p
    # (FSDP1 all-gathers into the flat parameter itself: no separate output to hold, parallel/fsdp1.py)
    held = layer if setup.stack_facts.facts.get("loss", {}).get("in_forward") and not runs_fsdp1(setup) else 0.0
    r = st.reduce or st.grad
    # the previous layer's reduce-scatter input; FSDP1 drops its own at the end of its post-backward hook
    # (_runtime_utils.py:846-861: the flat gradient, or its reduce_dtype cast, reduce-scattered as it is, then freed;
    # on CUDA its block waits for the reduce-scatter on the post-backward stream, :772, reserved but not allocated)
    kept = 0.0 if runs_fsdp1(setup) else (pc.per_layer_dense if trainable is None else trainable) / t * r
    before_first = kept if stage.layers > 1 else 0.0
    # the root's backward (the embedding's, then its post-backward), where phases.peak counts every gradient as its
    # fp32 shard: the root's are still unsharded in param_dtype; during the embedding's backward beside the root's
    # parameters and layer 0's kept input, then (parameters resharded, that input recycled) beside its own
    # reduce-scatter input
    n_root = root / p
    embedding = max(root + kept, n_root * r) + root - n_root * st.grad / shard_ranks(setup)
    if trainable is not None:  # a frozen root: its parameters beside layer 0's kept input, no gradient
        embedding = root + kept
    if setup.zero == 2:
        every = root + stage.layers * layer
        return {"forward_end": every + held, "loss_backward": every, "last_layer_backward": every,
                "next_layer_backward": every - layer + kept,
                "first_layer_backward": root + layer + before_first, "embedding_backward": embedding}
    return {"forward_end": root + held, "loss_backward": root + layer, "next_layer_backward": root + 2 * layer + kept,
            "first_layer_backward": root + layer + before_first, "embedding_backward": embedding}


def reduce_scatter_transient(pc: ParamCounts, largest: int, st: StateBytes, setup: Setup,
                             lora: tuple[float, float, float] | None = None) -> float:
    """ZeRO-2/3 in backward: a module's full gradient lives until its reduce-scatter — a whole layer's, or the
    LM head's/embedding's; gloo (the CPU backend) also clones the reduce-scatter input and, where backward
    re-gathers parameters (ZeRO-3), all-gathers into its own flat buffer; NCCL does neither
    (torch/csrc/distributed/c10d/ProcessGroupGloo.cpp, _reduce_scatter_base / _allgather_base).
    Under the hf stack's FSDP (unsharded_bytes: a MixedPrecision or none) none: a layer's unsharded gradients are
    counted as its backward makes them (memory.py gb_layer), the root's (LM head, embedding) with the head's
    gradients and at the root's post-backward, and the reduce-scatter inputs FSDP2 keeps, by unsharded_at.
    `lora`: (a layer's trainable parameters, their gradient bytes, the layer's gathered bytes) where only adapters
    train (analytic/lora.py): the gradients reduced are theirs, the parameters gathered the whole layer's."""
    z, dp = setup.zero, shard_ranks(setup)
    if z < 2:
        return 0
    layer = pc.per_layer_dense / setup.tp
    if unsharded_bytes(setup, st):  # (the hf stack's FSDP, with or without a MixedPrecision: unsharded_at)
        return 0.0
    trained, gb, gathered = lora or (layer, st.grad, layer * st.weight)
    extra = max(largest, trained) * gb * (1 - 1 / dp)
    if setup.device == "cpu":
        extra += trained * gb + (gathered if z >= 3 else 0)
    # NB (FSDP2 mixed precision on CPU): gloo's copies come at a layer's post-backward (the reduce-scatter input's
    # clone) and pre-backward (the prefetch's all-gather buffer), not at its backward's high point, so they are not
    # added to it; the pre-backward moment they make is not modelled (under-counts a CPU peak by up to one layer's
    # param_dtype copy: -3.6 % on tiny-llama, --zero 3, BENCHMARKS.md)
    return extra


class DataParallelComm(NamedTuple):
    """One step's data-parallel communication: what is exposed in every micro-batch and once per step, its total
    (hidden or not), and the link it runs on ("intra" / "inter" node)."""

    per_micro_batch: float
    once: float
    total: float
    bandwidth: str


def group_span(setup: Setup, expert: bool = False) -> int:
    """The consecutive ranks a data-parallel group covers, by the stack's rank order ([parallel] order, innermost
    first; absent: tp, cp, dp, pp, collectives.py's placement). The dense group is the dp × cp ranks of one tp and pp rank; the expert one
    (`expert`) the expert data-parallel ranks of one etp, ep and pp rank. Megatron-Core orders 'tp-cp-ep-dp-pp'
    (parallel_state.py:562), its dense ranks with ep 1 and its expert ranks etp-ep-edp-pp with cp 1 (:775-806)."""
    order = setup.stack_facts.facts.get("parallel", {}).get("order", "tp-cp-dp-pp").split("-")
    if expert:
        sizes = dict(tp=setup.expert_tp, cp=1, ep=setup.ep, dp=setup.expert_dp, pp=setup.pp)
    else:
        sizes = dict(tp=setup.tp, cp=setup.cp, ep=1, dp=setup.dp, pp=setup.pp)
    last = max(order.index(a) for a in (("dp",) if expert else ("cp", "dp")))
    span = 1
    for axis in order[:last + 1]:
        span *= sizes.get(axis, 1)
    return span


def group_per_node(setup: Setup, links: Links, expert: bool = False) -> tuple[int, int]:
    """(ranks, ranks on each node) of the dense (dp × cp) or the `expert` data-parallel group: its ranks sit
    group_span / ranks apart (collectives.ranks_per_node)."""
    n = setup.expert_dp if expert else setup.dp * setup.cp
    return n, ranks_per_node(group_span(setup, expert) // n, n, links.gpus_per_node)


def dp_comm(gpu: GPU, setup: Setup, links: Links, grad_bytes: float, weight_bytes: float, forward: float,
            backward: float, mem_share: float, expert_grad_bytes: float = 0.0,
            expert_weight_bytes: float = 0.0, layers: int = 1, reduce_hidden: bool = True) -> DataParallelComm:
    """The busiest rank's `grad_bytes` of gradients and `weight_bytes` of weights, exchanged over the dp × cp ranks
    per ZeRO stage, and its routed experts' `expert_grad_bytes` / `expert_weight_bytes` over the expert
    data-parallel ranks (Setup.expert_dp: Megatron-Core's separate expert_parallel_buffers over the expert data-
    parallel group, distributed/distributed_data_parallel.py:289-301, and the distributed optimizer's expert shards),
    overlapped with a micro-batch's `forward` and `backward` (with recompute) seconds, whose memory-bound share
    `mem_share` the collectives' HBM traffic slows (overlap.py). Each group's collectives run on its own rails: its
    ranks sit span / n apart (group_span), so ranks_per_node of them share each node (collectives.py). Each
    collective call pays NCCL's latency: ZeRO-3 / FSDP gathers and reduces each of the stage's `layers` (one unit
    each, as torchtitan's fully_shard per block) in its own call.
    NB: the two groups' collectives are summed, as if one waited for the other: pessimistic where they overlap.
    NB: ZeRO 0-2 are timed as one call per step (their buckets' sizes are the stacks' own: torch DDP 25 MiB,
    Megatron max(40M, 1M × dp) elements or one buffer without overlap_grad_reduce, megatron/core/distributed/
    distributed_data_parallel.py:62-68 in megatron-core 0.16.1): optimistic by a latency per further bucket.
    `reduce_hidden` False (the stack's reduce_behind_backward: DeepSpeed without overlap_comm): the gradients'
    reduction runs on the backward's stream or after it, whole."""
    m, z = setup.grad_accum, setup.zero
    groups = [(*group_per_node(setup, links), grad_bytes, weight_bytes)]
    if expert_grad_bytes or expert_weight_bytes:
        groups.append((*group_per_node(setup, links, expert=True), expert_grad_bytes, expert_weight_bytes))
    live = [grp for grp in groups if grp[0] > 1]
    within = all(g >= n for n, g, _, _ in live)
    bw = max((links.bus(n, g) for n, g, _, _ in live), default=links.intra)  # the HBM contention's link (overlap.py)
    calls = max(1, layers) if z >= 3 else 1
    per_mb = once = total = 0.0
    if live:
        allreduce = sum(links.allreduce(n, g, gb, calls) for n, g, gb, _ in live)
        rs = sum(links.reduce_scatter(n, g, gb, calls) for n, g, gb, _ in live)
        ag = sum(links.all_gather(n, g, wb, calls) for n, g, _, wb in live)
        n0, g0 = live[0][:2]  # the first group's bucket (the dense one's; the experts' where dp x cp is 1)
        bucket_t = links.allreduce(n0, g0, min(BUCKET_BYTES, live[0][2]))
        if z == 0:
            total = allreduce
            once = max(exposed(gpu, total, backward, mem_share, bw), bucket_t) if reduce_hidden else total
        elif z == 1:
            total = rs + ag
            # --overlap-param-gather (Megatron): each bucket's all-gather is dispatched as the next step's first
            # forward reaches the bucket before it and waited for by its modules' forward pre-hook (megatron-core
            # 0.16.1 distributed_data_parallel.py:384-417, distrib_optimizer.py:2611-2617), so it hides behind one
            # micro-batch's forward but for the first bucket's; without it the all-gather runs whole after the step.
            # NB: one forward of the stage's layers hides it (under --vpp each chunk's share behind its own): optimistic
            # by the buckets a chunk's forward cannot cover
            gather = max(exposed(gpu, ag, forward, mem_share, bw), bucket_t / 2) if setup.overlap_param_gather else ag
            once = (max(exposed(gpu, rs, backward, mem_share, bw), bucket_t / 2) if reduce_hidden else rs) + gather
        elif z == 2:
            total = m * rs + ag
            per_mb = max(exposed(gpu, rs, backward, mem_share, bw), bucket_t / 2) if reduce_hidden else rs
            once = ag
        else:
            total = m * (2 * ag + rs)
            # forward all-gathers hide behind the forward, backward all-gather + reduce-scatter behind the backward
            per_mb = exposed(gpu, ag, forward, mem_share, bw) + (
                max(exposed(gpu, ag + rs, backward, mem_share, bw), bucket_t / 2) if reduce_hidden
                else exposed(gpu, ag, backward, mem_share, bw) + rs)
    return DataParallelComm(per_mb, once, total, "intra" if within else "inter")
