"""THE step-time model: compute + exposed communication of a parallel layout, term by term (no torch).

`trainfit estimate --gpu`, `trainfit plan`, the HTML report and the web page all time a step with `layout_step_time`
(or, in the planner's inner loop, `step_time` on precomputed costs), so one layout has one step time everywhere.
`--mfu` replaces it with a flat utilisation (analytic/timing.py) — an override, not the model.

step = (m + (p−1)/v) · t_mb + exposed DP communication + optimizer step, where t_mb is one micro-batch
(forward + backward, incl. recompute) on the slowest pipeline stage, including its tensor-parallel
all-reduces and pipeline sends. m = micro-batches per step (grad_accum), p = pipeline stages, v = virtual
stages per rank (--vpp, Megatron's interleaved schedule).

Sources:
  * compute: the kernels the step runs (analytic/ops/: GEMMs, attention, memory-bound elementwise ops, for one
    layer's forward/backward/recompute and the embedding, head and loss), each timed by the roofline
    (analytic/roofline.py, per-GPU kernel data in data/kernels.toml; analytic/compute_time.py) — no global
    efficiency factor. `efficiency` (plan --efficiency) = a number replaces it with the flat model: hardware FLOPs
    (analytic/flops.py) over peak × efficiency, an override like --mfu. StepTime.efficiency reports the fraction
    of the dense peak the matmuls and attention reached.
  * optimizer.step(): the bytes the stack's optimizer kernel moves (fused: one pass; foreach / for-loop: torch's
    8 Adam passes) at the roofline's bandwidth, plus its launches (compute_time.optimizer_seconds).
  * communication: each parallel axis owns its term beside its memory, with its sources and what it overlaps —
    parallel/tensor.py (TP/SP all-reduces), pipeline.py (sends and the bubble; layers per stage follow --pp-split,
    the slowest stage sets the pace), context.py (ring attention), expert.py (all-to-alls), zero.py (DP/ZeRO
    gradient and weight collectives), fsdp2.py (FSDP2's copies); collectives.py: NCCL's cost model, the links and the
    ranks' placement. Tensor-parallel all-reduces, pipeline sends and expert dispatch/combine are on the critical
    path (the latter hidden behind another micro-batch under --overlap-moe-comm); ring attention hides behind the
    attention, data parallelism behind the backward (and ZeRO-3's forward).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import NamedTuple

from ..errors import SetupError
from ..estimate import StepTime
from ..hardware import GPU
from ..setup import Setup
from ..spec import ModelSpec
from . import long_context, torchao_optim
from .parallel import deepspeed_offload, fsdp_offload
from .roofline import host_memory_bandwidth
from . import memo
from .batch_free import MICRO_BATCH
from .compute_time import (cached_stage_compute, layer_times, master_cast_seconds, optimizer_seconds,
                           pipeline_free)
from .ops import WHOLE_LAYER, checkpointed_layers
from .grad_clip import ClipWork, clip_seconds, clip_work, clipped_params
from .host_queue import combined_1f1b
from .flops import attention_flops_per_token, forward_per_token, head_matmul_per_token, recompute_per_token
from .float8 import compute_speedup
from .te_recipes import gather_saving, runs_te
from .parallel.collectives import Links, ranks_per_node
from .parallel.expert import ep_comm_seconds, exposed_ep_seconds, split_params
from .parallel.fsdp2 import copy_seconds as fsdp2_copy_seconds
from .parallel.pipeline import bubble_seconds, pp_comm_seconds, split
from .parallel.tensor import tp_comm_seconds
from .parallel.zero import dp_comm, group_per_node
from .megatron_recompute import ep_rerun_share
from .mtp import mtp_layers, stage_mtp
from .recompute import forward_rerun_share
from .roofline import host_seconds_per_kernel, kernels_for
from .stacks import model_for
from .stragglers import slowest_gpu_factor
from .params import ParamCounts, count_params
from .precision import StateBytes, state_bytes
from .timing import compute_dtype


@dataclass(frozen=True)
class ModelCosts:
    """Per-token FLOPs of a model at one sequence length, split so that stages can be costed."""

    layer_forward: float  # per token, one layer (matmuls + attention)
    head_forward: float  # per token, the task head
    attention_per_layer: float  # per token, one layer's attention core (selective recompute redoes this)
    forward_total: float  # per token, the whole model
    pc: ParamCounts | None = field(default=None, compare=False)  # (the op lists' MoE layer mix)

    @classmethod
    def of(cls, spec: ModelSpec, seq: int, pc: ParamCounts, doc_len: int | None = None) -> "ModelCosts":
        """`doc_len`: packed documents (analytic/packing.py): the attention core over a document's keys, not the
        row's (the FLOPs it runs, the MFU's numerator with it)."""
        fpt = forward_per_token(spec, seq, pc)
        head = 2 * head_matmul_per_token(spec, seq)  # the task head: LM (+ MLM transform) or classifier (flops.py)
        attention = attention_flops_per_token(spec, seq)
        if doc_len:
            fpt += attention_flops_per_token(spec, doc_len) - attention
            attention = attention_flops_per_token(spec, doc_len)
        return cls((fpt - head) / spec.layers, head, attention / spec.layers, fpt, pc)


class MicroBatchCompute(NamedTuple):
    """One micro-batch's compute on the slowest pipeline stage, in seconds."""

    forward: float
    backward: float
    recompute: float
    attention_forward: float  # one layer's attention core forward (ring attention overlaps it)
    achieved: float  # the fraction of the dense peak the matmuls and attention reached (StepTime.efficiency)
    memory_share: float  # the memory-bound share of the time (overlap.py's HBM contention)
    terms: dict  # per step, by kernel kind (StepTime.compute_terms)
    total: object = None  # compute_time.ListTime of the stage's op list (None under the flat override)
    forward_kernels: float = 0.0  # kernels of the forward alone (the host issues each: moe_host_syncs)
    sync_stall: float = 0.0  # the forward's GPU idle between the dispatcher's host syncs (host_queue.py)
    combined_stall: float = 0.0  # the same under the combined 1F1B schedule (host_queue.combined_stall)
    combined_phases: tuple = ()  # the compute beside each EP exchange under combined 1F1B (host_queue.combined_phases)


def micro_batch_compute(spec: ModelSpec, setup: Setup, gpu: GPU, costs: ModelCosts, st: StateBytes,
                        efficiency: float | None, layers_per_stage: tuple[int, int, int], tokens: float,
                        dense_peak: float) -> MicroBatchCompute:
    """`efficiency` None: the roofline-timed op list of the slowest stage; a fraction of the dense peak: the flat
    override (no memory-bound kernels)."""
    m, t = setup.grad_accum, setup.tp
    first, middle, last = layers_per_stage
    if efficiency is None:
        sc = cached_stage_compute(spec, setup, gpu, st, costs.pc or count_params(spec), layers_per_stage)
        tot = sc.total
        matmul_s = tot.gemm + tot.attention
        achieved = tot.flops / (matmul_s * dense_peak) if matmul_s > 0 else 0.0
        terms = {k: m * getattr(tot, k) for k in ("gemm", "attention", "memory", "launches")}
        mem = tot.memory / tot.seconds if tot.seconds > 0 else 0.0
        return MicroBatchCompute(sc.forward.seconds, sc.backward.seconds, sc.recompute.seconds, sc.attention_forward,
                                 achieved, mem, terms, tot, sc.forward.kernels, sc.sync_stall,
                                 sc.combined_stall, sc.combined_phases)
    peak = dense_peak * efficiency
    # The slowest stage: the last one carries the LM head (Narayanan et al. 2021 balance layers, not the head).
    stage_fwd_tok = max(first * costs.layer_forward, middle * costs.layer_forward,
                        last * costs.layer_forward + costs.head_forward)
    stage_layers_n = max(first, middle, last)
    peak *= compute_speedup(spec, setup, gpu, costs.layer_forward, stage_layers_n * costs.layer_forward / stage_fwd_tok)
    fwd = tokens * stage_fwd_tok / t
    rec = tokens * recompute_per_token(spec, setup, stage_layers_n, costs.layer_forward, costs.attention_per_layer) / t
    return MicroBatchCompute(fwd / peak, 2 * fwd / peak, rec / peak, tokens * costs.attention_per_layer / t / peak,
                             efficiency, 0.0, {})


def trained_states(spec: ModelSpec, setup: Setup, st: StateBytes, stage_params: int, stage_layers: int):
    """(parameters trained on the rank, their state bytes, their tensors and sizes where not the model's own): with
    LoRA only the adapters are reduced and stepped (analytic/lora.py: fp32 unless --lora-dtype)."""
    if not setup.lora_rank:
        return stage_params, st, None, None
    from .lora import adapter_params, adapter_setup, adapter_sizes

    sizes = adapter_sizes(spec, setup, stage_layers)
    return (adapter_params(spec, setup) * stage_layers / spec.layers, state_bytes(adapter_setup(setup, st)), len(sizes),
            sizes)


def micro_batch_comm(spec: ModelSpec, setup: Setup, links: Links, st: StateBytes, layers: tuple[int, int, int],
                     tokens: float, v: int, attention_forward: float, compute: float,
                     phases: tuple = (), gpu: GPU | None = None) -> tuple[float, ...]:
    """Each parallel axis's communication in one micro-batch on the critical path (parallel/<axis>.py), in seconds:
    (tp, pp, cp, ep); `attention_forward`: one layer's attention core forward (ring attention overlaps it),
    `compute`: the micro-batch's forward + backward + recompute (--overlap-moe-comm hides the exchanges behind it),
    `phases`: the compute beside each EP exchange under combined 1F1B (host_queue.combined_phases); `gpu`: times the
    GEMMs --tp-comm-overlap hides the TP collectives behind (parallel/tp_overlap.py)."""
    act, stage_layers_n = st.act, max(layers)
    rerun = forward_rerun_share(setup, stage_layers_n)
    # the MTP layers' decoder layers communicate as the others do (mtp.py; 0 without them)
    comm_n = max(n + k for n, k in zip(layers, stage_mtp(spec, setup)))
    tp_mb = tp_comm_seconds(spec, setup, links, tokens, act, comm_n, rerun, gpu)
    pp_mb = pp_comm_seconds(spec, setup, links, tokens, act, v)
    cp_mb = model_for(setup).cp_comm_seconds(spec, setup, links, tokens, act, comm_n, attention_forward, rerun)
    cp_mb += long_context.a2a_seconds(spec, setup, links, act, comm_n, rerun)  # --ulysses: exposed all-to-alls
    ep_mb = ep_comm_seconds(spec, setup, links, tokens, act, comm_n)
    ep_mb *= 1 + ep_rerun_share(setup)  # --recompute-modules moe: the forward's all-to-alls again (megatron_recompute)
    ep_mb = exposed_ep_seconds(setup, ep_mb, compute, phases, gpu)
    return tp_mb, pp_mb, cp_mb, ep_mb


def step_time(spec: ModelSpec, setup: Setup, gpu: GPU, costs: ModelCosts, stage_params: int, st: StateBytes,
              efficiency: float | None = None, virtual_stages: int | None = None,
              layers_per_stage: tuple[int, int, int] | None = None) -> StepTime:
    """Time of one optimizer step of `setup` on `gpu`. `stage_params`: parameters held by the busiest rank
    (its tensor-parallel shard of its pipeline stage), whose gradients and weights the DP group exchanges.
    `efficiency`: None = the roofline-timed op list; a fraction of the dense peak = the flat override."""
    b, s, m = setup.batch, setup.seq, setup.grad_accum
    p, d, cp = setup.pp, setup.dp, setup.cp
    v = virtual_stages or setup.vpp
    # fp16-master computes in fp16: V100/T4 fp16 tensor cores (timing.compute_dtype, hardware.GPU.flops_for)
    dense_peak = gpu.flops_for(compute_dtype(setup))
    tokens = long_context.rank_tokens(setup)  # this rank's share of each micro-batch (--cp, --ulysses split it)
    first, middle, last = layers_per_stage or split(spec.layers, p, setup.pp_split)  # (layers × 3 when p = 1)
    stage_layers_n = max(first, middle, last)
    c = micro_batch_compute(spec, setup, gpu, costs, st, efficiency, (first, middle, last), tokens, dense_peak)

    # --tiled-mlp: each layer's MLP forward once more, in its backward (long_context.py)
    tiled = long_context.tiled_mlp_seconds(spec, setup, tokens, stage_layers_n, dense_peak * c.achieved)
    if tiled:
        c = c._replace(recompute=c.recompute + tiled)
    links = Links.of(gpu)
    tp_mb, pp_mb, cp_mb, ep_mb = micro_batch_comm(spec, setup, links, st, (first, middle, last), tokens, v,
                                                  c.attention_forward, c.forward + c.backward + c.recompute,
                                                  c.combined_phases, gpu)
    # FSDP2 mixed precision (torchtitan) all-gathers the parameters in param_dtype and reduces in reduce_dtype
    # (parallel/fsdp2.py); Megatron reduces its main-grad buffer (fp32 under --bf16: parallel/megatron.py
    # grad_buffer_bytes) and gathers its 16-bit params; otherwise the collectives move the states' own dtypes
    trained, st_opt, tensors, sizes = trained_states(spec, setup, st, stage_params, stage_layers_n)
    pb = st.param or st.weight
    # the routed experts' gradients and weights go over the expert data-parallel group (parallel/zero.py dp_comm)
    held, held_experts = split_params(spec, costs.pc or count_params(spec), setup, stage_params, stage_layers_n)
    dense_n, expert_n = (trained, 0.0) if setup.lora_rank else (held, held_experts)
    trained = dense_n + expert_n
    part = "dense" if held_experts else "all"  # TE's fp8 param all-gather
    gathered = held * pb - gather_saving(spec, setup, stage_layers_n, pb, part)
    if setup.lora_rank:  # ZeRO-3 / FSDP gathers the frozen base (packed under --quant) with the adapters
        from .lora import gathered_counts

        pc_all = costs.pc or count_params(spec)
        gathered += stage_layers_n * pb * (
            gathered_counts(spec, setup, pc_all, st).per_layer_dense - pc_all.per_layer_dense) / setup.tp
    expert_gathered = held_experts * pb - gather_saving(spec, setup, stage_layers_n, pb, "experts") \
        if held_experts else 0.0
    rb = model_for(setup).reduced_grad_bytes(setup, st_opt)  # the reduced gradients' dtype (the stack's rule)
    dp = dp_comm(gpu, setup, links, dense_n * rb, gathered, c.forward, c.backward + c.recompute, c.memory_share,
                 expert_n * rb, expert_gathered, stage_layers_n, model_for(setup).reduce_behind_backward(setup))
    # FSDP2's copy-out writes and its copy-in reads what the rank unshards: under --ep its experts' E/(ep·etp)
    dp_mb = dp.per_micro_batch + fsdp2_copy_seconds(gpu, setup, st, st_opt, held + held_experts, trained,
                                                    stage_layers_n)

    t_mb = c.forward + c.backward + c.recompute + tp_mb + pp_mb + cp_mb + ep_mb + dp_mb
    bubble = bubble_seconds(p, v, t_mb)
    # optimizer.step() on the rank's shard: the bytes its kernel moves and its launches (compute_time.py).
    dpc, z = d * cp, setup.zero
    shard = dense_n / (dpc if z >= 1 else 1) + expert_n / (setup.expert_dp if z >= 1 else 1)
    if torchao_optim.offload_runs(setup):  # only the small parameters are stepped on the GPU (torchao_optim.py)
        shard = torchao_optim.device_params(spec, shard)
    # ZeRO-Offload: the partition is stepped on the host (parallel/deepspeed_offload.py), none on the GPU
    # so under FSDP2's CPU offload (parallel/fsdp_offload.py)
    zero_offload, fsdp_off = deepspeed_offload.runs(setup), fsdp_offload.runs(setup)
    zero_part, shard = (shard, 0.0) if (zero_offload or fsdp_off) else (0.0, shard)
    tensors = tensors or model_for(setup).tensors_per_rank(  # the stack's own parameter tensors
        spec, stage_layers_n, p == 1 or first == stage_layers_n, p == 1 or last == stage_layers_n)
    clipped = clipped_params(setup, trained)  # the gradients the stack's clip reads on this rank
    opt_mem, opt_launch = optimizer_seconds(gpu, setup, st_opt, shard, tensors, sizes=sizes, grads=clipped)
    clip = clip_work(setup, st_opt, clipped, tensors, sizes=sizes)
    clip_comm = clip_allreduce_seconds(setup, clip, links)
    opt = opt_mem + opt_launch + clip_comm
    host = m * offload_exposed(spec, setup, gpu, c.forward, c.backward + c.recompute)
    # the stack's own activation offloading (Megatron's --offload-layers: megatron_offload.py)
    host += m * model_for(setup).host_copy_seconds(spec, setup, gpu, c.forward, c.backward + c.recompute,
                                                   stage_layers_n)
    # NB optimistic where --offload combines activations with a state offload: each part's exposed copies are taken
    # against the whole host link and its pass, though both cross the same PCIe link in the same passes
    # torchao's CPUOffloadOptimizer: gradients to the host, AdamW on the CPU, parameters back (torchao_optim.py)
    host += torchao_optim.offload_seconds(spec, setup, kernels_for(gpu).host_link, c.backward + c.recompute, m)
    if zero_offload:  # DeepSpeed's ZeRO-Offload: PCIe copies and DeepSpeedCPUAdam (parallel/deepspeed_offload.py)
        host += deepspeed_offload.offload_seconds(setup, zero_part, st_opt.weight, m, _host_link(gpu),
                                                  host_memory_bandwidth(), c.forward, c.backward + c.recompute)
    if fsdp_off:  # FSDP2's CPUOffloadPolicy: shard copies over PCIe and torch's AdamW on the CPU
        host += fsdp_offload.offload_seconds(setup, zero_part, st.weight, st_opt.grad, m, _host_link(gpu),
                                             host_memory_bandwidth(), c.forward, c.backward + c.recompute)
    step = m * t_mb + bubble + dp.once + opt + host
    world = setup.world_size
    issue = kernels = slowest = 0.0
    if efficiency is None:
        slowest = straggler_seconds(m, c.total, world)
        step += slowest
        # the host issues ahead while the GPU computes or waits (on the network, the pipeline): it is exposed only
        # where issuing takes longer than all of that
        kernels = m * c.total.kernels + opt_launch / kernels_for(gpu).launch_seconds
        if moe_host_syncs(spec, setup):
            # the forward of each micro-batch runs between host synchronisations: the host cannot issue it ahead
            fwd_gpu = c.forward + (tp_mb + cp_mb + ep_mb) / 2
            # kernel by kernel between the syncs (host_queue.py), at least the stretch's whole-issue bound.
            # NB: the all-to-alls' time inside a stretch is not in it (their GPU wait is ep_comm's): pessimistic by
            # at most the exposed exchanges
            fwd_k = c.forward_kernels
            fwd = m * max(host_issue_exposed(setup, fwd_k, fwd_gpu), c.sync_stall)
            if combined_1f1b(setup):
                # each layer's forward runs with another micro-batch's backward of a layer, its nodes issued between
                # the forward's syncs: the host cannot carry a lead over the backward either, so the micro-batch's
                # whole issue time is set against its own GPU time, and kernel by kernel (host_queue.combined_stall).
                # NB: the pipeline's warm-up forwards and cool-down backwards, not combined, taken as combined
                # (optimistic by their forward-only stalls); recomputed modules' re-runs not in the stretch (optimistic)
                fwd_k, fwd_gpu = c.total.kernels, c.forward + c.backward + c.recompute + tp_mb + cp_mb + ep_mb
                fwd = m * max(host_issue_exposed(setup, fwd_k, fwd_gpu), c.combined_stall)
            issue = fwd + host_issue_exposed(setup, kernels - m * fwd_k, step - m * fwd_gpu)
        else:
            issue = host_issue_exposed(setup, kernels, step)
    step += issue

    tok_step = setup.tokens_per_step  # (--ulysses: d / N groups train different sequences)
    model_flops = 3 * costs.forward_total * tok_step
    if spec.encdec is not None:  # both stacks and the head over the target tokens, per input token (as _infer does)
        from .encoder_decoder import prefill_flops
        model_flops = 3 * prefill_flops(spec, setup) / (b * s) * tok_step
    # NB: recompute FLOPs of the whole model as p stages of layers // p (uneven splits differ by a layer)
    rec_total = p * recompute_per_token(spec, setup, spec.layers // p, costs.layer_forward,
                                        costs.attention_per_layer) * tok_step
    return StepTime(
        compute=m * (c.forward + c.backward), recompute=m * c.recompute, tp_comm=m * tp_mb, cp_comm=m * cp_mb,
        ep_comm=m * ep_mb, pp_comm=m * pp_mb, bubble=bubble,
        dp_comm=m * dp_mb + dp.once, optimizer=opt, host_copies=host, host_issue=issue,
        straggler=slowest, step_seconds=step,
        tokens_per_second=tok_step / step, mfu=model_flops / (world * step * dense_peak),
        hfu=(model_flops + rec_total) / (world * step * dense_peak), dp_comm_total=dp.total, dp_bandwidth=dp.bandwidth,
        efficiency=c.achieved, compute_terms=c.terms, kernels=kernels,
        optimizer_casts=master_cast_seconds(gpu, setup, st_opt, shard, tensors),
        grad_clip=clip_seconds(gpu, clip) + clip_comm,
    )


def clip_allreduce_seconds(setup: Setup, clip: ClipWork, links: Links) -> float:
    """The clip's all-reduces of its norm (grad_clip.ClipWork.allreduces) over their group, by NCCL's model, placed as
    the step's other groups are (parallel/collectives.py: tp-cp-dp-pp). A few bytes each: the latency is all of it."""
    t, p, dpc, node = setup.tp, setup.pp, setup.dp * setup.cp, links.gpus_per_node
    groups = {"dp": group_per_node(setup, links),
              "model": (t * p, t * ranks_per_node(t * dpc, p, node)),
              "world": (setup.world_size, min(setup.world_size, node))}
    return sum(links.allreduce(*groups[g], nbytes) for g, nbytes in clip.allreduces)


def host_issue_exposed(setup: Setup, kernels: float, gpu_seconds: float) -> float:
    """Seconds the GPU waits on an eager host: issuing `kernels` takes kernels × the host's time per kernel
    (kernels.toml [host]); when that exceeds the step's GPU timeline `gpu_seconds` (its kernels, and the exposed
    communication and bubble the host issues through) the step is host-bound by the difference. NB: the two are taken over the whole step, as if the host were ahead or behind throughout:
    optimistic where short and long kernels alternate (the GPU idles in the short stretches even when the sum
    of kernels is longer). Compiled steps are not charged (NB optimistic: inductor's launches are cheaper, not free)."""
    if getattr(setup, "compile", False):
        return 0.0
    return max(0.0, kernels * host_seconds_per_kernel() - gpu_seconds)


def moe_host_syncs(spec: ModelSpec, setup: Setup) -> bool:
    """Whether the stack's MoE layer synchronises the host with the GPU in each layer's forward (stacks/*.toml [moe]
    host_sync: Megatron's alltoall dispatcher waits for its device-to-host copies of the token counts). After each
    sync the GPU's queue is empty and waits while the host issues the next kernels, so the host's lead cannot carry
    the forward's issue time across the backward's or the communication's GPU time: the forward's exposed host time
    is at least its own max(0, issue - GPU), per micro-batch, and at least the MoE layers' stretches stepped kernel
    by kernel (host_queue.sync_stall: short and long kernels alternate within a stretch). NB: a model mixing dense
    and MoE layers has unequal segments (the whole-forward bound optimistic there). The forward's share of the micro-batch's
    TP/CP/EP communication is taken as half (NB: the dispatch and combine all-to-alls, the forward's pair). NB: a
    recomputed MoE layer syncs again in the backward (its dispatcher reruns): not modelled, optimistic there."""
    return spec.is_moe and bool(setup.stack_facts.facts.get("moe", {}).get("host_sync"))


@lru_cache(maxsize=1024)
def stage_params(spec: ModelSpec, pc: ParamCounts, tp: int, pp: int, pp_split: str = "even",
                 mtp: tuple[int, int, int] = (0, 0, 0)) -> int:
    """Parameters on the busiest rank (first stage with the embedding, a middle one, or last with the head; `mtp`:
    the MTP layers of each, analytic/mtp.py stage_mtp); memoised on its arguments (the planner times many setups of
    one layout)."""
    from .memory import Stage, rank_params

    probe = Setup(tp=tp, pp=pp, dp=1, mode="infer")  # (rank_params reads its tp alone; infer: no stack's rules)
    if pp == 1:
        return rank_params(spec, pc, probe, Stage(0, spec.layers, True, True, 1, mtp[0]))[0]
    first, middle, last = split(spec.layers, pp, pp_split)
    return max(rank_params(spec, pc, probe, Stage(0, first, True, False, 1, mtp[0]))[0],
               rank_params(spec, pc, probe, Stage(1, middle, False, False, 1, mtp[1]))[0] if pp > 2 else 0,
               rank_params(spec, pc, probe, Stage(pp - 1, last, False, True, 1, mtp[2]))[0])


def layout_step_time(spec: ModelSpec, setup: Setup, gpu: GPU, efficiency: float | None = None,
                     pc: ParamCounts | None = None) -> StepTime:
    """The step time of one training setup on `gpu` (the planner's model, every term)."""
    pc = pc or count_params(spec)
    return step_time(spec, setup, gpu, ModelCosts.of(spec, setup.seq, pc, getattr(setup, "doc_len", None)),
                     stage_params(spec, pc, setup.tp, setup.pp, setup.pp_split, stage_mtp(spec, setup)),
                     state_bytes(setup), efficiency)


def step_floor(spec: ModelSpec, setup: Setup, gpu: GPU, pc: ParamCounts, st: StateBytes | None = None,
               exchanges: bool = True, efficiency: float | None = None) -> float:
    """A lower bound of layout_step_time(spec, setup, gpu, None, pc).step_seconds from the micro-batch alone: its
    compute (the memoised op lists' times: compute_time.cached_stage_compute) and its critical-path communication
    (micro_batch_comm), the terms of step_time's t_mb but the DP exchange's share. step_time's step is m·t_mb +
    bubble + DP + optimizer + host copies + straggler + host issue, every term >= 0, and the bubble grows with t_mb
    (pipeline.bubble_seconds); so m·t + bubble(t) + the straggler term, t those terms, stays below it. NB: summed
    apart from step_time's terms: the planner leaves a relative margin for the rounding. `st`: the setup's state
    bytes where known. The planner skips the setups whose throughput at this bound cannot enter its ranking
    (plan/search.py). Without `exchanges`, the expert exchanges are left out (micro_batch_comm's ep term, >= 0 and
    the only one that reads the dispatcher and --overlap-moe-comm): a floor of every setup that differs from `setup`
    only in those (tests/plan/test_floors.py). With `efficiency` (the flat override), the same bound of
    layout_step_time(spec, setup, gpu, efficiency, pc): its flat compute (micro_batch_compute), no straggler term."""
    m, st = setup.grad_accum, st or state_bytes(setup)
    layers = split(spec.layers, setup.pp, setup.pp_split)
    tokens = long_context.rank_tokens(setup)
    if efficiency is None:
        sc = cached_stage_compute(spec, setup, gpu, st, pc, layers)
        c, attention, phases = sc.forward.seconds + sc.backward.seconds + sc.recompute.seconds, sc.attention_forward, \
            sc.combined_phases
        slowest = straggler_seconds(m, sc.total, setup.world_size)
    else:
        f = micro_batch_compute(spec, setup, gpu, ModelCosts.of(spec, setup.seq, pc, getattr(setup, "doc_len", None)),
                                st, efficiency, layers, tokens, gpu.flops_for(compute_dtype(setup)))
        c, attention, phases = f.forward + f.backward + f.recompute, f.attention_forward, f.combined_phases
        slowest = 0.0  # (the flat override has no straggler term)
    comm = micro_batch_comm(spec, setup, Links.of(gpu), st, layers, tokens, setup.vpp, attention, c, phases, gpu)
    t = c + sum(comm if exchanges else comm[:3])  # (tp, pp, cp, ep)
    return m * t + bubble_seconds(setup.pp, setup.vpp, t) + slowest


def layer_floor(spec: ModelSpec, setup: Setup, gpu: GPU, pc: ParamCounts, st: StateBytes) -> float | None:
    """A lower bound of step_floor(spec, x, gpu, pc, st, exchanges) for every x that differs from `setup` only in
    its recompute policy and modules, its expert-exchange settings and the settings only the DP exchange reads, from
    what one layer and the model's ends cost (_layer_parts, whatever the pipeline): each stage's layers × the
    layer's forward + backward, with the embedding on the first stage and the head and loss (once more per MTP
    layer) on the last, each stage's MTP layers as its other layers, as stage_compute sums them, less its terms >= 0
    (a VLM's tower, the recompute); the TP collectives of the busiest stage's layers (tp_comm_seconds: layers × one
    layer's, without the re-run's) and the pipeline sends, as micro_batch_comm times them, less the context-parallel
    and expert exchanges (>= 0); the pipeline bubble of that micro-batch and the stragglers' wait over the least of the
    stages' GEMMs and attention (the slowest stage's hold at least those). The planner bounds every split with it
    first, computing step_floor only for the splits it takes (plan/search.py). None where the stages are not so
    made (compute_time.pipeline_free)."""
    return layer_floors(spec, (setup,), gpu, pc, st)[0]


def layer_floors(spec: ModelSpec, setups, gpu: GPU, pc: ParamCounts, st: StateBytes,
                 rerun: bool = False) -> list[float | None]:
    """layer_floor of each of `setups`, which differ from one another in their micro-batch and accumulation alone
    (one layout's splits: plan/floors.py Floors.of_splits), what none of those changes worked out once: the
    pipeline_free key (each setup's is it with its micro-batch and, where Transformer Engine keeps it, its
    accumulation), the stages' layer counts, the links and the stragglers' factor. With `rerun`, under a policy that
    re-runs whole layers (ops.WHOLE_LAYER: full, layer:N, uniform:N, block:N) each stage's checkpointed layers'
    re-run too, as stage_compute adds it (checkpointed_layers × the average layer's re-run): a lower bound of
    step_floor(spec, x, gpu, pc, st, exchanges) for every x that differs from the setup only in its expert-exchange
    and DP-only settings (the other policies' re-runs, >= 0, left out)."""
    setup = setups[0]
    key = pipeline_free(spec, setup)
    if key is None:
        return [None] * len(setups)
    te = runs_te(setup)
    # each stage's decoder layers and MTP layers (mtp.py: a decoder layer each, timed as the stage's average layer)
    first, middle, last = (n + k for n, k in zip(split(spec.layers, setup.pp, setup.pp_split), stage_mtp(spec, setup)))
    ends = 1 + mtp_layers(spec, setup)  # the head and loss once more per MTP layer on the last stage
    links, factor = Links.of(gpu), slowest_gpu_factor(setup.world_size)
    # the checkpointed layers of each stage (first, middle, last) under a whole-layer policy, else none
    whole = rerun and setup.recompute_policy in WHOLE_LAYER
    reruns = [checkpointed_layers(setup, n) for n in (first, middle, last)] if whole else None
    out = []
    # the key's parts by (micro-batch, accumulation kept): a split's key is hashed as two numbers, not a Setup
    known = memo.remember(_LAYER_PARTS, (spec, key.keyed(MICRO_BATCH), gpu, st), dict)
    for x in setups:
        m = x.grad_accum
        at = (x.batch, m if te else 1)
        parts = known.get(at)
        if parts is None:
            k = key.keyed((("batch", at[0]), ("grad_accum", at[1])))  # (pipeline_free(spec, x))
            parts = known[at] = _layer_parts(spec, k, gpu, st, pc)
        per, first_end, last_end, tp_layer, again = parts
        last_end = last_end * ends
        if x.pp == 1:
            stages = [per * first + first_end + last_end]
        else:  # (pp 2: split's middle is no stage)
            stages = [per * first + first_end, *([per * middle] if x.pp > 2 else []), per * last + last_end]
        if reruns is not None:
            n_first, n_middle, n_last = reruns
            counts = [n_first] if x.pp == 1 else [n_first, *([n_middle] if x.pp > 2 else []), n_last]
            stages = [y + again * c for y, c in zip(stages, counts)]
        t = max(y.seconds for y in stages) + max(first, middle, last) * tp_layer + pp_comm_seconds(
            spec, x, links, long_context.rank_tokens(x), st.act, x.vpp)
        slowest = m * min(y.gemm + y.attention for y in stages) * factor
        out.append(m * t + bubble_seconds(x.pp, x.vpp, t) + slowest)
    return out


def _layer_parts(spec: ModelSpec, key: Setup, gpu: GPU, st: StateBytes, pc: ParamCounts) -> tuple:
    """layer_floor's parts of a pipeline_free key: compute_time.layer_times (the layer's, the ends', the whole-layer
    re-run's) and one layer's TP collectives, in layer_floors' order."""
    per, first_end, last_end, again = layer_times(spec, key, gpu, st, pc)
    return per, first_end, last_end, tp_comm_seconds(spec, key, Links.of(gpu), long_context.rank_tokens(key), st.act,
                                                     1, 0.0, gpu), again


_LAYER_PARTS = memo.table()


def straggler_seconds(m: int, total, world: int) -> float:
    """What waiting for the slowest of the job's `world` GPUs adds to `m` micro-batches (stragglers.py): every
    collective waits for it, and its GEMMs and attention (`total`: the micro-batch's compute_time.ListTime) run
    slower than the mean chip the kernel model times."""
    return m * (total.gemm + total.attention) * slowest_gpu_factor(world)


def with_paged_migration(tm: StepTime, evicted: float, gpu: GPU) -> StepTime:
    """The step with bitsandbytes' evicted paged states brought back: its optimizer prefetches each parameter's
    states to the device and synchronises before the next (optim/optimizer.py:333-335, prefetch_state ->
    cudaMemPrefetchAsync), so with the device full every evicted byte is copied out and another in, exposed:
    2 x evicted / host link per step, added to the host-copies term.
    NB: optimistic — unified-memory migration runs below the link's line rate (driver faults, 2 MiB chunks)."""
    link = kernels_for(gpu).host_link
    if not evicted or not link:
        return tm
    extra = 2 * evicted / link
    new = tm.step_seconds + extra
    scale = tm.step_seconds / new
    return replace(tm, host_copies=tm.host_copies + extra, step_seconds=new,
                   tokens_per_second=tm.tokens_per_second * scale, mfu=tm.mfu * scale, hfu=tm.hfu * scale)


def _host_link(gpu: GPU) -> float:
    """The GPU's host link, bytes/s one way (kernels.toml host_link: its PCIe generation's line rate)."""
    link = kernels_for(gpu).host_link
    if not link:
        raise SetupError(f"--offload: no host link bandwidth is known for {gpu.name} (kernels.toml host_link); use a "
                         "catalog GPU")
    return link


def offload_exposed(spec: ModelSpec, setup: Setup, gpu: GPU, forward: float, backward: float) -> float:
    """--offload activations: seconds per micro-batch the GPU waits on host copies. torchtune's OffloadActivations
    copies each saved tensor to pinned host memory on a side stream during the forward and brings it back one
    layer ahead during the backward (training/_activation_offloading.py), so each direction overlaps its pass:
    exposed = max(0, bytes / link − the pass's compute), each way (the offloaded bytes: analytic/memory.py).
    NB: the copies' HBM traffic is not charged to the overlapped kernels."""
    if not setup.offload_activations:
        return 0.0
    from .memory import train_memory
    if long_context.checkpoint_offload(setup):
        # ArcticTraining's copies are synchronous on the compute stream (monkey_patches.py:87 `.to("cpu")`, :123
        # `.to(ctx.x_device)`): nothing overlaps them. NB: pageable host memory, taken at the pinned line rate:
        # optimistic
        link = kernels_for(gpu).host_link
        if not link:
            raise SetupError(f"--offload activations: no host link bandwidth is known for {gpu.name} (kernels.toml "
                             "host_link); use a catalog GPU")
        return 2 * train_memory(spec, setup).offloaded_activations / link

    link = kernels_for(gpu).host_link
    if not link:
        raise SetupError(f"--offload activations: no host link bandwidth is known for {gpu.name} (kernels.toml "
                         "host_link); use a catalog GPU")
    copied = train_memory(spec, setup).offloaded_activations
    return max(0.0, copied / link - forward) + max(0.0, copied / link - backward)
