"""Context parallelism as torch's experimental ring attention over SDPA runs it (torch 2.13
torch/distributed/tensor/experimental/_context_parallel/_attention.py; torchtitan 0.2.2 applies it to every block's
inner attention: distributed/context_parallel.py:27-86, models/llama3/infra/parallelize.py:99-105).

Where it differs from Megatron's ring (parallel/context.py, whose per-rank K/V size it shares):
  * the rotate method: torch's default is all-gather (_attention.py:71-77 `_ContextParallelOptions.rotate_method =
    ALL_GATHER`). torchtitan's training step never changes it: only the validator's create_context_parallel_ctx
    calls set_rotate_method with parallelism.context_parallel_rotate_method (components/validate.py:207-214,
    distributed/utils.py:200-216); train.py:469-477 shards the inputs (prepare_context_parallel_input) and the
    attention modules run under the dispatcher. So a layer's forward all-gathers every rank's K/V once
    (_AllGatherRotater.exchange_buffers, :273-300), launched before the first (local, diagonal) SDPA and waited
    before the second (_templated_ring_attention, :428-440): it hides behind that first step only;
  * the backward all-gathers K/V again (a new rotater per call, :519) and passes the K/V gradients round the ring
    with all-to-all hops in fp32 (`dkv_rotater` is always ALL_TO_ALL, :520; accum_dtype fp32 under
    convert_to_f32, :512-516): cp hops, each launched after a step's SDPA backward and waited after the next one's
    (:592-627), the last after the loop (:646): exposed whole;
  * the load-balanced (head-tail) sharding: each rank holds chunks r and 2cp−1−r of the 2cp chunks
    (distributed/context_parallel.py:186-190 _HeadTailLoadBalancer; config/job_config.py:431 'headtail'), so each of
    the cp steps computes 1/cp of the rank's causal attention (:451-471: the diagonal step two half-blocks and a
    full block of (s/2cp)², every later step (s/cp)·(s/2cp));
  * the buffers (one layer's backward): fp32 accumulators for dQ, dK, dV (:512-516), the all-gathered K/V and the
    flat K/V copied for it (:524-534), the fp32 dK/dV being sent and the one received (:595-627).
The attention FLOPs are split as Megatron's are (ops/attention.py: s/cp queries against s keys, causal).
NB: the cp SDPA calls of a layer (each (s/cp)·(s/2cp) but the diagonal one) are timed as one kernel over the rank's
queries: their launches and smaller grids are not counted (optimistic).
"""
from __future__ import annotations

from ...setup import Setup
from ...spec import ModelSpec
from .collectives import Links, ranks_per_node
from .context import local_kv_elements

FP32 = 4  # convert_to_f32 (_attention.py:74): the merged output and the gradient accumulators are fp32


def ring_comm_seconds(spec: ModelSpec, setup: Setup, links: Links, tokens: float, act_bytes: float, layers: int,
                      attention_forward: float, rerun: float) -> float:
    """One micro-batch's exposed ring communication on a stage of `layers` layers, `tokens` per rank (the module
    doc); `attention_forward`: one layer's forward attention seconds on this rank, the backward taken as twice it;
    `rerun`: the share of layers whose forward runs again in the backward (its all-gather with it)."""
    t, cp = setup.tp, setup.cp
    if cp <= 1:
        return 0.0
    kv = local_kv_elements(spec, setup, tokens)
    per_node = ranks_per_node(t, cp, links.gpus_per_node)  # the cp group: ranks t apart (mesh pp, batch, cp, tp)
    gather = links.all_gather(cp, per_node, cp * kv * act_bytes)  # every rank's K/V (the all-gather's output)
    hop = kv * FP32 / links.over(t * cp)  # one fp32 dK/dV all-to-all hop to the next rank
    step_f, step_b = attention_forward / cp, 2 * attention_forward / cp  # one ring step's SDPA (head-tail)
    if setup.stack_facts.fact("context_parallel", "rotate_method") == "alltoall":
        # K/V hop by hop (_AllToAllRotater, :253-270): each hop hides behind one step's SDPA; in the backward it
        # shares the steps with the dK/dV hops (one process group: the collectives run in turn)
        kv_hop = kv * act_bytes / links.over(t * cp)
        forward = (cp - 1) * max(kv_hop - step_f, 0.0)
        backward = (cp - 1) * max(kv_hop + hop - step_b, 0.0) + hop
    else:
        forward = max(gather - step_f, 0.0)
        backward = max(gather - step_b, 0.0) + (cp - 1) * max(hop - step_b, 0.0) + hop
    return layers * (forward * (1 + rerun) + backward)


def ring_backward_bytes(spec: ModelSpec, setup: Setup, tokens: float, act_bytes: float) -> float:
    """Bytes one layer's ring-attention backward holds beyond the dQ/dK/dV a plain SDPA backward makes (the module
    doc): fp32 dQ, dK, dV accumulators, the gathered K/V (cp chunks) and its flat input, the fp32 dK/dV sent and
    received. NB: all taken live at once and at the layer's backward high point (an upper bound by up to the
    smaller ones); _partial_update's torch.cat copies of an fp32 dK/dV (:605-620) not counted (under by one)."""
    cp = setup.cp
    if cp <= 1:
        return 0.0
    kv = local_kv_elements(spec, setup, tokens)
    q = tokens * spec.heads * spec.head_dim / max(1, setup.tp)
    gathered = 2 if setup.stack_facts.fact("context_parallel", "rotate_method") == "alltoall" else cp + 1
    return FP32 * (q + kv) + gathered * kv * act_bytes + 2 * FP32 * kv
