"""The host and the GPU's stream between two host synchronisations, kernel by kernel.

An eager host issues kernels one after another (roofline.host_seconds_per_kernel each) into a CUDA stream that runs
them in order; a kernel starts when both it has been issued and the one before it has finished. Where the host waits
on the GPU (Megatron's alltoall dispatcher: the D2H copies of the token counts recorded after its preprocess,
megatron-core 0.16.1 transformer/moe/token_dispatcher.py:438 cuda_dtoh_point "before_permutation_1", :871-895 the
copies and their event, and the wait on that event before the expert-parallel all-to-all, :663-665 and :897-899
d2h_event.synchronize()), the stream is drained up to the copies and the host starts the next stretch with no lead.
A blocking host-to-device copy (DRAIN_OPS: gpt-oss's activation makes its linear offset a device tensor in each
call, ops/megatron_moe.py quick_geglu_prelude) waits for the whole stream: the same, from that op on.
The stretch then lasts as the ordered sum of each kernel's max(issue, previous end) + its time, not max(host, GPU)
over the whole stretch: a run of short kernels the host cannot feed (the per-expert quantises and GEMMs) leaves the
GPU idle even where long kernels (attention) later in the same stretch would hide the host's total.
"""
from __future__ import annotations

from .ops.op import Op

SYNC_OP = "dispatch_a2a"  # ops/megatron_moe.py dispatch_ops: the all-to-all the host waits before issuing
D2H_OP = "dispatch_metadata"  # ops/megatron_moe.py dispatch_ops: the preprocess whose last kernels are the D2H copies
# ops after which the host waits for the stream to finish everything issued (torch's blocking copy: memcpy_and_sync)
DRAIN_OPS = frozenset({"experts_act_offset"})  # ops/megatron_moe.py quick_geglu_prelude


def has_sync(ops: list[Op]) -> bool:
    """Whether a layer's forward waits on the host once (the dispatcher's copies and the all-to-all after them)."""
    names = {o.name for o in ops}
    return SYNC_OP in names and D2H_OP in names


def waits(ops: list[Op]) -> bool:
    """Whether a layer's forward waits on the GPU anywhere: the dispatcher's sync (has_sync) or a blocking copy."""
    return has_sync(ops) or any(o.name in DRAIN_OPS for o in ops)


def _op_end(gpu_free: float, issue_start: float, kernels: float, seconds: float, host: float) -> float:
    """When the stream finishes an op of `kernels` equal kernels (`seconds` in all) whose first is issued at
    `issue_start` + `host` and each next one `host` later, on a stream free from `gpu_free`. Kernel j ends at
    max(end(j-1), issue_start + j·host) + g with g = seconds / kernels; unrolled, the latest constraint is the last
    kernel's issue when host ≥ g, else the first's."""
    if kernels <= 0:
        return gpu_free + seconds
    g = seconds / kernels
    fed = issue_start + (kernels * host + g if host >= g else host + seconds)
    return max(gpu_free + seconds, fed)


def sync_stall(ops: list[Op], seconds: list[float], host: float) -> float:
    """Seconds per layer the GPU idles, in the steady state of a stack of identical MoE layers each with its host
    synchronisations (module doc), beyond the layer's GPU time: the period between two successive layers' first
    syncs less the sum of `seconds` (each op's GPU time, in the order of `ops`, one layer's forward). 0 when the list
    has no sync (a dispatcher that does not wait: ops/moe.py's block) or the host is free (`host` 0)."""
    if not waits(ops) or host <= 0:
        return 0.0
    gpu_t = host_t = 0.0
    syncs, d2h = [], 0.0
    for _ in range(3):  # the first layer starts from an empty stream; the second and third give the steady period
        first = None
        for op, s in zip(ops, seconds):
            if op.name == SYNC_OP:
                host_t = max(host_t, d2h)  # d2h_event.synchronize(): the host waits for the copies
                first = host_t if first is None else first
            gpu_t = _op_end(gpu_t, host_t, op.kernels, s, host)
            host_t += op.kernels * host
            if op.name == D2H_OP:
                d2h = gpu_t
            if op.name in DRAIN_OPS:  # cudaStreamSynchronize after the copy: the host waits for all of it
                host_t = max(host_t, gpu_t)
                first = host_t if first is None else first
        syncs.append(first)
    return max(0.0, syncs[-1] - syncs[-2] - sum(seconds))


def combined_1f1b(setup) -> bool:
    """Whether Megatron co-schedules each layer's forward of one micro-batch with the backward of another
    (--overlap-moe-comm over more than one micro-batch: megatron-core 0.16.1 pipeline_parallel/combined_1f1b.py:34-57
    and :111-174, the no-pipelining and interleaved schedules)."""
    return bool(setup.overlap_moe_comm) and setup.grad_accum > 1


def _nodes(fwd: list[Op]) -> dict[str, str]:
    """Each forward op's node of Megatron's fine-grained layer (models/gpt/fine_grained_callables.py:427-502
    submodule_attn_forward: attention, pre-MLP norm, router and moe_layer.py:256-273 preprocess = the dispatcher's
    preprocess and permute; :504-518 dispatch = moe_layer.py:275-282 token_dispatch, the all-to-all; :520-542 the
    experts = moe_layer.py:313-327 sort, GEMMs, unsort; :544- combine = moe_layer.py:329-342 all-to-all, unpermute,
    residual)."""
    names = [o.name for o in fwd]
    a2a, back = names.index(SYNC_OP), names.index("combine_a2a") if "combine_a2a" in names else len(names)
    return {n: "attn" if i < a2a else "dispatch" if i == a2a else "mlp" if i < back else "combine"
            for i, n in enumerate(names)}


def combined_stall(fwd: list[Op], fwd_s: list[float], bwd: list[Op], bwd_s: list[float], host: float) -> float:
    """sync_stall of the combined 1F1B layer (combined_1f1b): one layer's forward and another micro-batch's backward
    of a layer, node by node in the order of models/common/model_chunk_schedule_plan.py:190-252 run: combine
    backward, attention forward (its preprocess records the D2H copies), MLP backward, dispatch forward (the host
    sync), dispatch backward, MLP and combine forward, attention backward. A backward op belongs to its forward op's
    node (its name's prefix); one without (the main-grad accumulation) to attention's. NB: without
    delay_wgrad_compute the weight gradients run inside each node's backward (backward_dw a no-op): taken so."""
    if not has_sync(fwd) or host <= 0:
        return 0.0
    order = [pair for phase in _combined_order(fwd, fwd_s, bwd, bwd_s) for pair in phase]
    return sync_stall([o for o, _ in order], [s for _, s in order], host)


def _combined_order(fwd: list[Op], fwd_s: list[float], bwd: list[Op], bwd_s: list[float]) -> list[list]:
    """The (op, seconds) of a combined 1F1B layer in the four stretches the compute stream runs while the
    communication stream runs one of the layer's exchanges each (model_chunk_schedule_plan.py:190-252 run):
    combine backward and attention forward; MLP backward (beside the dispatch forward); dispatch and MLP forward
    (beside the dispatch backward); combine forward and attention backward."""
    node = _nodes(fwd)
    f = {k: [(o, s) for o, s in zip(fwd, fwd_s) if node[o.name] == k] for k in ("attn", "dispatch", "mlp", "combine")}
    b = {k: [(o, s) for o, s in zip(bwd, bwd_s) if node.get(o.name.split(".")[0], "attn") == k]
         for k in ("attn", "dispatch", "mlp", "combine")}
    return [b["combine"] + f["attn"], b["mlp"] + b["dispatch"], f["dispatch"] + f["mlp"], f["combine"] + b["attn"]]


def combined_phases(fwd: list[Op], fwd_s: list[float], bwd: list[Op], bwd_s: list[float]) -> tuple[float, ...]:
    """GPU seconds of the compute beside each of a combined 1F1B layer's four EP exchanges, in the order of
    model_chunk_schedule_plan.py:190-252 run (its doc: "comm_stream: combine_bwd | dispatch_fwd->dispatch_bwd |
    combine_fwd; comp_stream: attn_fwd | mlp_bwd->mlp_bwd_dw->mlp_fwd | attn_bwd"): the combine backward beside the
    attention forward; the dispatch forward beside the MLP backward (the MLP forward needs its tokens); the dispatch
    backward beside the MLP forward (it sends the MLP backward's gradient); the combine forward beside the attention
    backward (parallel/expert.py exposed_ep_seconds). The combine's own memory kernels (unpermute) are counted with
    the compute they run beside. NB: without delay_wgrad_compute backward_dw is a no-op (the weight gradients inside
    mlp_bwd), as combined_stall takes it; Megatron-Bridge's a2a-overlap recipes set it (scripts/performance/utils/
    helpers.py:182-186 at v0.2.0), which moves the MLP's weight gradients beside the dispatch backward: not
    modelled (either direction, by the MLP's wgrad against the two exchanges)."""
    return tuple(sum(s for _, s in phase) for phase in _combined_order(fwd, fwd_s, bwd, bwd_s))
