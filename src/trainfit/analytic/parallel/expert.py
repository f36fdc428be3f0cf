"""Expert parallelism's communication: Megatron-Core's MoE token dispatchers (megatron-core 0.16.1,
megatron/core/transformer/moe/token_dispatcher.py; --moe-dispatcher). Which experts a rank holds: parallel/megatron.py
rank_params; the expert data-parallel exchange of their gradients: parallel/zero.py.

Per MoE layer a rank dispatches its tokens to the experts and combines their outputs back, in the forward, and in the
backward the gradients make the reverse trip: 4 exchanges per layer, each of the volume below (uniform routing):
  * alltoall (MoEAlltoAllTokenDispatcher, :348; all_to_all over the ep group, :666-669): the tokens are permuted by
    expert, so every one of a token's top-k copies is sent, (ep−1)/ep of them off the rank; NCCL runs the
    all-to-all as one ncclSend/ncclRecv per peer in a group (torch/csrc/cuda/nccl.cpp all2all_single_unequal_split),
    so the copies for peers in the node ride NVLink while those for other nodes leave through the NIC, at once:
    the longer of the two. With --etp > 1 the expert-TP group then all-gathers what its ranks received
    (dispatch_postprocess, :685-701: gather_from_sequence_parallel_region over the dispatcher's tp group, which is
    the expert-TP group, :72-76) and reduce-scatters the experts' outputs before the combine (:774-781): a ring over
    etp consecutive ranks (etp innermost in the expert rank order) of etp times the rank's received copies, added to
    each exchange;
  * allgather (MoEAllGatherTokenDispatcher, :208; gather_from_sequence_parallel_region over the tp × ep group,
    :265-276, and reduce_scatter_to_sequence_parallel_region back, :338): every rank gathers every rank's tokens,
    once each (no top-k copies): an all-gather (and a reduce-scatter) of the etp × ep ranks' tokens;
  * deepep / hybridep (MoEFlexTokenDispatcher, :1320; _DeepepManager :1091, _HybridEPManager :942; fused_a2a.py
    FusedDispatch :69 / FusedCombine :163, HybridEPDispatch :332 / HybridEPCombine :409): a token goes once to each
    destination node over RDMA and is fanned out inside the node over NVLink to each GPU holding one of its experts
    (DeepSeek-AI, "DeepSeek-V3 Technical Report" 2024, §3.2.2: cross-node IB then intra-node NVLink forwarding).
    RDMA: the token × its expected distinct remote nodes (`distinct_groups`); NVLink: the token × its expected
    distinct destination GPUs in a node other than the forwarding one. The two run at once: DeepEP's internode
    dispatch kernel gives half its SMs to RDMA senders and the other half to NVLink forwarders and receivers
    (DeepEP v1.2.1 csrc/kernels/internode.cu:370-401 WarpRole, is_forwarder = sm_id % 2 == 0), passing chunks of
    num_max_rdma_chunked_send_tokens through its buffers, and its combine the same way back (:1380-1385): the
    exchange takes the longer of the two. With --etp > 1 the flex dispatcher runs over the tp × ep group as if each
    expert were etp experts, one per expert-TP rank, each token's top-k times etp of them (MoEFlexTokenDispatcher,
    :1346-1360: num_experts and router_topk scaled by tp_size): a token reaches the same nodes, and etp GPUs for each
    expert group it picks. NB: HybridEP's kernels taken as DeepEP's.
Routing imbalance (analytic/moe_imbalance.py): the busiest rank receives X times the mean copies in the dispatch
and sends them back in the combine, and the exchange ends when it is done: the alltoall's time and DeepEP's NVLink
part scale by X (the allgather dispatcher gathers every token whatever the routing). DeepEP's RDMA part scales by the
busiest node's load instead (moe_imbalance.node_load): a token crosses to the rank of the destination node with the
sender's local index (the RDMA team is the ranks gpus_per_node apart: runtime.cu:61 nvshmem_team_split_strided;
internode.cu:74-76), so a node's NICs share what the node receives evenly, whichever of its GPUs holds the experts.
NB: the other ranks' sends to the busiest are taken as evenly spread over its links.

Overlap (--overlap-moe-comm, Megatron's overlap_moe_expert_parallel_comm: model_parallel_config.py:264; pipeline_
parallel/combined_1f1b.py:34-48): in 1F1B one micro-batch's forward runs beside another's backward, each one's EP
exchanges hidden by the other's attention/MLP compute; the first forward and the last backward run alone (and one
extra warm-up forward under pipelining: schedules.py:778). Within a combined layer each exchange hides behind one
stretch of the other micro-batch's compute only (models/common/model_chunk_schedule_plan.py:190-252 run, its doc:
"comm_stream: combine_bwd | dispatch_fwd->dispatch_bwd | combine_fwd; comp_stream: attn_fwd | mlp_bwd->mlp_bwd_dw->
mlp_fwd | attn_bwd"), and the stretches wait on each other (the MLP forward on the dispatched tokens, the dispatch
backward on the MLP backward's gradient): a layer takes Σ max(exchange_i, compute_i) over its four pairs
(host_queue.combined_phases). Exposed per step: A + (m − 1)·Σ max(0, A/4 − P_i) for A the exchanges of one
micro-batch (four equal ones per layer: dispatch and combine, forward and backward) and P_i the compute beside the
i-th; A + (m − 1)·max(0, A − C), C the micro-batch's compute, where the op lists give no phases. The exchange's
kernels hold SMs while they run, so the compute they hide behind runs on the others (analytic/overlap.py: each
pair takes max(exchange, compute stretched by the held SMs), not max(exchange, compute)): DeepEP's and HybridEP's
kernels on the SMs Megatron gives them (transformer_config.py:722 moe_deepep_num_sms = 20, :725
moe_hybridep_num_sms = 16; token_dispatcher.py:1153 set_deepep_num_sms -> fused_a2a.py:258-260 Buffer.set_num_sms,
:1044-1045 the HybridEP buffer's num_sms_dispatch_api / num_sms_combine_api), an NCCL all-to-all or all-gather on
its channels (exchange_sms): the all-gather dispatcher's collective on the ring's, the all-to-all's grouped
send/receive on NCCL's p2p channels, the ring's count rounded up to a power of two (NCCL src/graph/paths.cc
ncclTopoComputeP2pChannels, quoted in NVIDIA/nccl#1198: p2pnChannels = nextPow2(min(nChannels, MaxP2pNChannels));
NCCL_DEBUG logs print "16 coll channels, ... 16 p2p channels" on H800, nccl#892, "8 coll ... 8 p2p" on H20,
nccl#1189). NB: optimistic — the exchanges are taken as equal while the busiest rank's dispatch waits on its
receiving side, and their HBM traffic is not charged to the memory-bound kernels beside them.
"""
from __future__ import annotations

from math import comb

from ...hardware import GPU
from ...setup import Setup
from ...spec import ModelSpec
from ...units import next_pow2
from ..moe_imbalance import busiest_rank_load, node_load
from ..overlap import exposed, nccl_sms
from ..params import ParamCounts
from .collectives import Links, ranks_per_node, ring_half


def distinct_groups(experts: int, top_k: int, groups: int, picked: int = 0, route_groups: int = 0) -> float:
    """Expected distinct groups (nodes, or GPUs) among a token's top_k experts, `experts` split evenly into `groups`
    (experts/groups each), routing uniform. Without group-limited routing: groups · (1 − C(E − E/G, k) / C(E, k))
    (each group missed iff all k experts fall outside it). With group-limited routing (Megatron's
    moe_router_num_groups = `route_groups` groups, moe_router_group_topk = `picked` of them per
    token, then k experts among the picked groups' experts: transformer_config.py:598-614; DeepSeek-V3's node-limited
    routing when the route groups are the nodes): a group holding q = route_groups/groups route groups is hit
    by c of the picked ones with hypergeometric probability, then missed iff all k experts fall in the others; a
    group inside one route group (groups a multiple of route_groups: GPUs) is hit only if its route group is
    picked (picked/route_groups), then unless all k experts fall outside it. Other splits: taken as uniform
    (NB: pessimistic, a routing limit only ever cuts the distinct groups)."""
    e, k, g = experts, top_k, groups
    if g <= 1:
        return 1.0
    rg, m = route_groups, picked
    if not m or (rg % g and g % rg):
        return g * (1 - comb(e - e // g, k) / comb(e, k))
    pool, per = m * e // rg, e // rg  # experts the token picks among, experts per route group
    if g % rg == 0:
        return g * m / rg * (1 - comb(pool - e // g, k) / comb(pool, k))
    q = rg // g  # route groups per group
    hit = 0.0
    for c in range(0, min(q, m) + 1):
        p_c = comb(q, c) * comb(rg - q, m - c) / comb(rg, m)
        hit += p_c * (1 - comb(pool - c * per, k) / comb(pool, k))
    return g * hit


def routed_expert_params(spec: ModelSpec, pc: ParamCounts) -> int:
    """All routed experts' parameters of one MoE layer (the rest of the MoE block: router and shared expert)."""
    return spec.moe.num_experts * pc.expert if spec.moe is not None else 0


def split_params(spec: ModelSpec, pc: ParamCounts, setup: Setup, held: float, layers: int) -> tuple[float, float]:
    """(dense, routed expert) parameters of a rank whose `held` parameters count every routed expert of its `layers`
    layers split tp ways (tensor.rank_params): num_experts/ep of them are its own, each split etp ways
    (transformer/moe/experts.py TEGroupedMLP: num_local_experts = num_moe_experts // ep). NB: a hybrid (Mamba)
    model's MoE blocks are left in the dense count: its experts' gradients taken as reduced over dp × cp."""
    if not spec.is_moe or spec.hybrid is not None:
        return held, 0.0
    routed = layers * spec.moe_share * routed_expert_params(spec, pc)
    return held - routed / setup.tp, routed / (setup.ep * setup.expert_tp)


def local_tokens(setup: Setup, tokens: float) -> float:
    """The tokens a rank's dispatcher sends of the `tokens` its micro-batch has on the rank (long_context.
    rank_tokens): 1/tp of them under sequence parallelism."""
    return tokens / (setup.tp if setup.sequence_parallel else 1)


def exchange_seconds(spec: ModelSpec, setup: Setup, links: Links, tokens: float, act_bytes: float,
                     load: float = 1.0) -> float:
    """One dispatch (or combine) of one MoE layer for `tokens` on the rank (1/t of them each under sequence
    parallelism), by --moe-dispatcher, the busiest rank receiving `load` times the mean copies (module doc)."""
    e, etp, m = setup.ep, setup.expert_tp, spec.moe
    local = local_tokens(setup, tokens)
    token_bytes = spec.hidden * act_bytes
    how = setup.moe_dispatcher or "alltoall"
    if how == "allgather":
        n = etp * e  # the tp × ep group (expert rank generator: etp innermost, then ep)
        return ring_half(n, n * local * token_bytes, links.over(n))
    if how == "alltoall":
        per_node = ranks_per_node(etp, e, links.gpus_per_node)  # the ep group's ranks etp apart
        copies = local * m.top_k * token_bytes / e  # to each rank of the group
        a2a = load * max((e - per_node) * copies / links.inter, (per_node - 1) * copies / links.intra)
        if etp <= 1:
            return a2a
        gathered = etp * local * m.top_k * load * token_bytes  # the expert-TP group's received copies
        node = ranks_per_node(1, etp, links.gpus_per_node)  # (a group wider than a node spans nodes)
        return a2a + (links.all_gather(etp, node, gathered) + links.reduce_scatter(etp, node, gathered)) / 2
    # deepep / hybridep: over the tp × ep group (etp innermost), etp GPUs for each expert group picked
    per_node = ranks_per_node(1, etp * e, links.gpus_per_node)
    nodes = -(-(etp * e) // per_node)
    limit = (m.route_group_topk, m.route_groups)  # group-limited routing (DeepSeek-V3's node limit)
    # RDMA: the distinct nodes but the rank's own (each node as likely to be hit); NVLink: the distinct destination
    # GPUs but the one the token lands on in its node (one of per_node, as likely as any to be a destination). By
    # symmetry every rank forwards as much as it sends.
    remote = distinct_groups(m.num_experts, m.top_k, nodes, *limit) * (nodes - 1) / nodes
    in_node = etp * distinct_groups(m.num_experts, m.top_k, e, *limit) * (per_node - 1) / per_node
    # (the busiest node over the ep expert groups, per_node / etp of them a node: an expert-TP group's ranks share
    # their experts' load)
    rdma = local * token_bytes * remote / links.inter * node_load(load, e, max(1, per_node // etp))
    return max(rdma, local * token_bytes * in_node / links.intra * load)


def ep_comm_seconds(spec: ModelSpec, setup: Setup, links: Links, tokens: float, act_bytes: float,
                    layers: int) -> float:
    """One micro-batch's exchanges on a stage of `layers` layers: dispatch and combine, forward and backward
    (exposed or not: `exposed_ep_seconds`). At --ep 1 only the expert-TP group's gather and scatter, where etp > 1."""
    if not spec.is_moe or (setup.ep <= 1 and setup.expert_tp <= 1):
        return 0.0
    load = 1.0 if setup.moe_dispatcher == "allgather" else busiest_rank_load(spec, setup, tokens)
    return layers * 4 * exchange_seconds(spec, setup, links, tokens, act_bytes, load)


def exchange_sms(setup: Setup, gpu: GPU) -> int:
    """The SMs the dispatcher's exchange kernels hold while they run (module doc): DeepEP's and HybridEP's are
    --moe-dispatcher-sms, else the stack's default ([moe] dispatcher_sms); the NCCL dispatchers' NCCL's channels
    (the all-to-all's p2p channels, the all-gather's ring channels)."""
    how = setup.moe_dispatcher or "alltoall"
    own = setup.stack_facts.facts.get("moe", {}).get("dispatcher_sms", {})
    if how in own:
        return int(setup.moe_dispatcher_sms or own[how])
    ring = nccl_sms(gpu)
    return next_pow2(ring) if how == "alltoall" and ring > 0 else ring  # the p2p channels (module doc)


def check_gpu(setup: Setup, gpu: GPU | None) -> None:
    """--moe-dispatcher-sms must leave the GPU SMs to compute on (kernels.toml sms)."""
    from ...errors import SetupError
    from ..roofline import kernels_for

    n = getattr(setup, "moe_dispatcher_sms", None)
    if not n or gpu is None:
        return
    sms = kernels_for(gpu).sms
    if n >= sms:
        raise SetupError(f"--moe-dispatcher-sms {n}: {gpu.name} has {sms} SMs; give the dispatcher "
                         f"fewer (Megatron's default: 20 for deepep, 16 for hybridep)")


def exposed_ep_seconds(setup: Setup, exchanges: float, compute: float, phases: tuple[float, ...] = (),
                       gpu: GPU | None = None) -> float:
    """Of one micro-batch's `exchanges` seconds, the part exposed per micro-batch on average over the step's
    grad_accum micro-batches, each of `compute` seconds (forward + backward), with the hidden compute's slowdown
    counted as exposed: all of it without --overlap-moe-comm, else (A + (m − 1)·L) / m with L what the combined
    layers add (module doc): Σ over the four exchanges, each beside its own compute P_i (`phases`: host_queue.
    combined_phases, summed over the stage's layers), of what the pair takes beyond P_i, or the same for A beside C
    where the op lists do not give the phases. Without a `gpu` no SMs are taken (max(0, A/4 − P_i))."""
    m = setup.grad_accum
    if not setup.overlap_moe_comm or m <= 1:
        return exchanges
    sms = exchange_sms(setup, gpu) if gpu is not None else 0

    def added(comm: float, beside: float) -> float:
        return exposed(gpu, comm, beside, sms=sms) if gpu is not None else max(0.0, comm - beside)

    left = (sum(added(exchanges / len(phases), p) for p in phases) if phases else added(exchanges, compute))
    return (exchanges + (m - 1) * left) / m


def dense_mlp_share(spec: ModelSpec, setup: Setup) -> float:
    """Of a stage's layers, the share whose MLP runs a dense MLP's tensor-parallel collectives (its T·h input
    all-gathered, its output reduce-scattered under sequence parallelism; one all-reduce each without): every
    layer, but the MoE layers of a stack whose token dispatcher runs them instead ([moe] tp_collectives =
    "dispatcher": Megatron routes each rank's own T/tp tokens, moe_layer.py:379-383, and its dispatcher gathers
    over the expert-TP group only, exchange_seconds), unless a shared expert (a dense tensor-parallel MLP beside the
    experts, SharedExpertMLP) runs them there. NB: the other stacks' MoE layers keep a dense MLP's collectives as a
    stand-in."""
    m = spec.moe
    if m is None or m.shared_intermediate or setup.tp <= 1:
        return 1.0
    if setup.stack_facts.facts.get("moe", {}).get("tp_collectives") != "dispatcher":
        return 1.0
    return 1.0 - spec.moe_share
