"""THE step-time model: compute + exposed communication of a parallel layout, term by term (no torch).

`trainfit estimate --gpu`, `trainfit plan`, the HTML report and the web page all time a step with `layout_step_time`
(or, in the planner's inner loop, `step_time` on precomputed costs), so one layout has one step time everywhere.
`--mfu` replaces it with a flat utilisation (analytic/timing.py) — an override, not the model.

step = (m + (p−1)/v) · t_mb + exposed DP communication + optimizer step, where t_mb is one micro-batch
(forward + backward, incl. recompute) on the slowest pipeline stage, including its tensor-parallel
all-reduces and pipeline sends. m = micro-batches per step (grad_accum), p = pipeline stages, v = virtual
stages per rank (--vpp, Megatron's interleaved schedule).

Sources:
  * compute: the kernels the step runs (analytic/ops.py: GEMMs, attention, memory-bound elementwise ops, for one
    layer's forward/backward/recompute and the embedding, head and loss), each timed by the roofline
    (analytic/roofline.py, per-GPU kernel data in data/kernels.toml; analytic/compute_time.py) — no global
    efficiency factor. `efficiency` (plan --efficiency) = a number replaces it with the flat model: hardware FLOPs
    (analytic/flops.py) over peak × efficiency, an override like --mfu. StepTime.efficiency reports the fraction
    of the dense peak the matmuls and attention reached.
  * optimizer.step(): the bytes the stack's optimizer kernel moves (fused: one pass; foreach / for-loop: torch's
    8 Adam passes) at the roofline's bandwidth, plus its launches (compute_time.optimizer_seconds).
  * pipeline bubble: (p−1)/(v·m) of the ideal time (Narayanan et al. 2021, §2.2.1 eq. 1 and §2.2.2); the
    interleaved schedule sends v× as many activations between stages (ibid. §2.2.2). Layers per stage follow
    --pp-split (parallel/pipeline.py); the slowest stage sets the pace.
  * context parallelism (Megatron ring attention, megatron/core/transformer/dot_product_attention_context_parallel
    and Liu et al. 2023 "Ring Attention"): each rank computes on b·s/cp tokens; per layer the K/V of its chunk
    (2 · b·(s/cp) · kv_heads·head_dim/t elements) pass cp−1 times around the ring in the forward and twice that in
    the backward (K/V again + their gradients), overlapped with the attention compute: only the excess is exposed.
    Gradients are reduced over the dp × cp ranks (Megatron's data-parallel-with-context-parallel group).
  * expert parallelism (Megatron's alltoall token dispatcher, moe/token_dispatcher.py): per MoE layer each rank
    sends its tokens × top_k × hidden × 2 bytes to the experts and back (dispatch + combine), in the forward and
    again in the backward: 4 all-to-alls, (ep−1)/ep of the volume leaving the rank. NB: on the critical path (not
    overlapped): pessimistic for --overlap-moe-expert-parallel-comm.
  * ring collectives (Patarasuk & Yuan 2009; NCCL "bus bandwidth"): all-reduce 2(n−1)/n · bytes / bw, bw = the NVLink
    rate × the bus-bandwidth fraction NCCL reaches (data/kernels.toml link_fraction) inside a node,
    reduce-scatter and all-gather (n−1)/n · bytes / bw each.
  * tensor parallelism (Shoeybi et al. 2019 §3, Fig. 4): 2 all-reduces of b·s·h activations per layer in the
    forward and 2 in the backward; full recompute repeats the forward's 2 (Korthikanti et al. 2022 §4.1). With
    sequence parallelism they become all-gather + reduce-scatter pairs of the same volume (ibid. §4.2.2).
  * ZeRO (Rajbhandari et al. 2020, §7): stage 0 all-reduces gradients once per step; stage 1 reduce-scatters
    them and all-gathers the updated weights; stage 2 reduce-scatters every micro-batch (its gradients are
    sharded, so they cannot be accumulated whole); stage 3 also all-gathers the weights in every micro-batch's
    forward and again in its backward (1.5× the DDP volume, §7.2.2).

Placement: tensor-parallel ranks innermost, then pipeline, then data parallel (tp × pp packed into nodes
first). A group whose ranks all sit in one node uses the intra-node bandwidth, otherwise the per-GPU
inter-node bandwidth (one NIC per GPU, as in DGX/HGX nodes).

Overlap assumption (stated, one rule for all): data-parallel communication overlaps the backward compute of
the same micro-batch (the last one for stages 0/1, each one for stages 2/3; ZeRO-3's forward all-gathers
overlap the forward) and only the part longer than that compute is exposed — but never less than one
25 MiB bucket (DDP's default bucket_cap_mb), which must wait for the last layer's gradients. The ZeRO-1/2
weight all-gather after the optimizer step is exposed. Tensor-parallel all-reduces and pipeline sends are on
the critical path (not overlapped).
The overlapped compute runs on the SMs NCCL leaves free (analytic/overlap.py); the slowdown is counted in dp_comm.
NB: the collectives' HBM traffic slows only the overlapped memory-bound kernels, not the GEMMs' reads (optimistic);
exposed TP comm is pessimistic for stacks with TP/GEMM overlap (Megatron --tp-comm-overlap). Latency terms
(α in the α-β model) are ignored: optimistic for very large rings and small messages.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache

from ..errors import SetupError
from ..estimate import StepTime
from ..hardware import GPU
from ..setup import Setup
from ..spec import ModelSpec
from .compute_time import cached_stage_compute, master_cast_seconds, optimizer_seconds
from .grad_clip import ClipWork, clip_seconds, clip_work, clipped_params
from .flops import attention_flops_per_token, forward_per_token, head_matmul_per_token, recompute_per_token
from .float8 import compute_speedup
from .overlap import exposed
from .parallel.fsdp2 import copy_bytes as fsdp2_copy_bytes, fsdp2_strategy, reshards_after_forward
from .stacks import model_for
from .roofline import host_seconds_per_kernel, kernels_for, memory_seconds
from .stragglers import slowest_gpu_factor
from .params import ParamCounts, count_params
from .precision import StateBytes, state_bytes
from .parallel.pipeline import split
from .timing import compute_dtype

BUCKET_BYTES = 25 * 2**20  # torch DDP bucket_cap_mb default


def ring_allreduce(n: int, nbytes: float, bw: float) -> float:
    return 0.0 if n <= 1 else 2 * (n - 1) / n * nbytes / bw


def ring_half(n: int, nbytes: float, bw: float) -> float:
    """Reduce-scatter or all-gather of a tensor of `nbytes` (full size) over n ranks."""
    return 0.0 if n <= 1 else (n - 1) / n * nbytes / bw


@dataclass(frozen=True)
class ModelCosts:
    """Per-token FLOPs of a model at one sequence length, split so that stages can be costed."""

    layer_forward: float  # per token, one layer (matmuls + attention)
    head_forward: float  # per token, the task head
    attention_per_layer: float  # per token, one layer's attention core (selective recompute redoes this)
    forward_total: float  # per token, the whole model
    pc: ParamCounts | None = field(default=None, compare=False)  # (the op lists' MoE layer mix)

    @classmethod
    def of(cls, spec: ModelSpec, seq: int, pc: ParamCounts) -> "ModelCosts":
        fpt = forward_per_token(spec, seq, pc)
        head = 2 * head_matmul_per_token(spec, seq)  # the task head: LM (+ MLM transform) or classifier (flops.py)
        return cls((fpt - head) / spec.layers, head, attention_flops_per_token(spec, seq) / spec.layers, fpt, pc)


def step_time(spec: ModelSpec, setup: Setup, gpu: GPU, costs: ModelCosts, stage_params: int, st: StateBytes,
              efficiency: float | None = None, virtual_stages: int | None = None,
              layers_per_stage: tuple[int, int, int] | None = None) -> StepTime:
    """Time of one optimizer step of `setup` on `gpu`. `stage_params`: parameters held by the busiest rank
    (its tensor-parallel shard of its pipeline stage), whose gradients and weights the DP group exchanges.
    `efficiency`: None = the roofline-timed op list; a fraction of the dense peak = the flat override."""
    b, s, m = setup.batch, setup.seq, setup.grad_accum
    t, p, d, cp = setup.tp, setup.pp, setup.dp, setup.cp
    v = virtual_stages or setup.vpp
    # fp16-master computes in fp16: V100/T4 fp16 tensor cores (timing.compute_dtype, hardware.GPU.flops_for)
    dense_peak = gpu.flops_for(compute_dtype(setup))
    tokens = b * s / cp  # this rank's share of each micro-batch (context parallelism splits the sequence)
    first, middle, last = layers_per_stage or split(spec.layers, p, setup.pp_split)  # (layers × 3 when p = 1)
    stage_layers_n = max(first, middle, last)
    terms: dict = {}
    if efficiency is None:
        sc = cached_stage_compute(spec, setup, gpu, st, costs.pc or count_params(spec), (first, middle, last))
        c_f, c_b, c_r = sc.forward.seconds, sc.backward.seconds, sc.recompute.seconds
        attn_f = sc.attention_forward
        tot = sc.total
        matmul_s = tot.gemm + tot.attention
        achieved = tot.flops / (matmul_s * dense_peak) if matmul_s > 0 else 0.0
        terms = {k: m * getattr(tot, k) for k in ("gemm", "attention", "memory", "launches")}
        mem = tot.memory / tot.seconds if tot.seconds > 0 else 0.0  # memory-bound share (overlap.py's HBM contention)
    else:
        peak = dense_peak * efficiency
        # The slowest stage: the last one carries the LM head (Narayanan et al. 2021 balance layers, not the head).
        stage_fwd_tok = max(first * costs.layer_forward, middle * costs.layer_forward,
                            last * costs.layer_forward + costs.head_forward)
        peak *= compute_speedup(spec, setup, gpu, costs.layer_forward,
                                stage_layers_n * costs.layer_forward / stage_fwd_tok)
        fwd = tokens * stage_fwd_tok / t
        rec = tokens * recompute_per_token(spec, setup, stage_layers_n, costs.layer_forward,
                                           costs.attention_per_layer) / t
        c_f, c_b, c_r = fwd / peak, 2 * fwd / peak, rec / peak
        attn_f = tokens * costs.attention_per_layer / t / peak
        achieved = efficiency
        mem = 0.0  # the flat override has no memory-bound kernels

    # NCCL reaches link_fraction of the NVLink line rate (protocol overhead; data/kernels.toml)
    intra = gpu.intra_node_bandwidth * kernels_for(gpu).link_fraction
    inter, gpn = gpu.inter_node_bandwidth, gpu.gpus_per_node
    act_bytes = st.act
    x = tokens * spec.hidden * act_bytes  # one b·s·h activation
    # TP: 2 all-reduces per layer forward, 2 backward, +2 with full recompute (Korthikanti et al. 2022 §4.1) — and
    # with per-op SAC, whose re-run forward all-reduces again (the functional all_reduce is not on torchtitan's save
    # list; reduce_scatter, sequence parallelism's, is: NB counted as re-run too), and for layer:N's re-run layers
    rerun = {"full": 1.0, "op": 1.0}.get(setup.recompute, 0.0)
    if setup.recompute.startswith("layer:"):
        rerun = (stage_layers_n // setup.layers_every) / stage_layers_n
    n_ar = 4 + 2 * rerun
    if getattr(setup, "float8", False):
        # torchtitan's tensorwise Float8 TP casts each block input to fp8 before its sequence-parallel all-gather
        # (torchtitan models/llama3/infra/parallelize.py:83-86, 191-203 PrepareFloat8ModuleInput; torchao
        # float8/float8_tensor_parallel.py:176-177 "the float8 cast happens before the all-gather"): in each forward
        # (and re-run forward) all-reduce the all-gather half moves 1 byte per element, the reduce-scatter half of the
        # row-parallel outputs and the backward's gradients keep act_bytes
        n_ar -= (2 + 2 * rerun) * 0.5 * (1 - 1 / act_bytes)
    tp_mb = stage_layers_n * n_ar * ring_allreduce(t, x, intra) if t > 1 else 0.0
    # PP: the activation goes forward and its gradient back once per micro-batch and stage boundary; each TP rank
    # sends its 1/t share (Narayanan et al. 2021 §4.1 scatter/gather; sequence parallelism shards it anyway).
    pp_bw = intra if t * p <= gpn else inter
    pp_mb = 2 * v * (x / t) / pp_bw if p > 1 else 0.0
    # CP (Megatron rank order tp-cp-ep-dp-pp, parallel_state.py): the ring spans t·cp consecutive ranks
    cp_mb = 0.0
    if cp > 1:
        kv = 2 * tokens * spec.kv_heads * spec.head_dim / max(1, t) * act_bytes  # K and V of the local chunk
        if t > spec.kv_heads:  # GQA with tp > kv heads: each rank keeps one (replicated) kv head
            kv = 2 * tokens * spec.head_dim * act_bytes
        cp_bw = intra if t * cp <= gpn else inter
        ring = (cp - 1) * kv / cp_bw  # forward: cp − 1 hops of the local K/V
        per_layer = max(ring - attn_f, 0.0) + max(2 * ring - 2 * attn_f, 0.0)
        cp_mb = stage_layers_n * per_layer * (1 + rerun)  # full recompute re-runs the forward ring
    # EP: 4 all-to-alls per MoE layer (dispatch + combine, forward + backward) of tokens × top_k × hidden × 2 B
    ep_mb = 0.0
    if setup.ep > 1 and spec.is_moe:
        e = setup.ep
        ep_bw = intra if setup.expert_tp * e <= gpn else inter
        sent = (tokens / (t if setup.sequence_parallel else 1)) * spec.moe.top_k * spec.hidden * act_bytes
        ep_mb = stage_layers_n * 4 * (e - 1) / e * sent / ep_bw

    # DP: the busiest rank's gradients and weights, reduced over the dp × cp ranks that hold the same shard.
    dpc = d * cp
    dp_bw_name = "intra" if t * p * dpc <= gpn else "inter"
    dp_bw = intra if dp_bw_name == "intra" else inter
    # FSDP2 mixed precision (torchtitan) all-gathers the parameters in param_dtype and reduce-scatters in reduce_dtype
    # (parallel/fsdp2.py); otherwise the collectives move the states' own dtypes
    trained, st_opt, tensors, sizes = stage_params, st, None, None
    if setup.lora_rank:  # only the adapters are reduced and stepped (analytic/lora.py: fp32 unless --lora-dtype)
        from .lora import adapter_params, adapter_setup, adapter_sizes
        from .precision import state_bytes

        trained = adapter_params(spec, setup) * stage_layers_n / spec.layers
        st_opt = state_bytes(adapter_setup(setup, st))
        sizes = adapter_sizes(spec, setup, stage_layers_n)
        tensors = len(sizes)
    g_bytes, w_bytes = trained * (st_opt.reduce or st_opt.grad), stage_params * (st.param or st.weight)
    bucket = min(BUCKET_BYTES, g_bytes)
    bucket_t = ring_allreduce(dpc, bucket, dp_bw)
    z = setup.zero
    per_mb_exposed = 0.0  # stretches every micro-batch (ZeRO-2/3)
    once_exposed = 0.0
    if dpc > 1:
        if z == 0:
            total = ring_allreduce(dpc, g_bytes, dp_bw)
            once_exposed = max(exposed(gpu, total, c_b + c_r, mem, dp_bw), bucket_t)
        elif z == 1:
            rs, ag = ring_half(dpc, g_bytes, dp_bw), ring_half(dpc, w_bytes, dp_bw)
            total = rs + ag
            once_exposed = max(exposed(gpu, rs, c_b + c_r, mem, dp_bw), bucket_t / 2) + ag
        elif z == 2:
            rs, ag = ring_half(dpc, g_bytes, dp_bw), ring_half(dpc, w_bytes, dp_bw)
            total = m * rs + ag
            per_mb_exposed = max(exposed(gpu, rs, c_b + c_r, mem, dp_bw), bucket_t / 2)
            once_exposed = ag
        else:
            rs, ag = ring_half(dpc, g_bytes, dp_bw), ring_half(dpc, w_bytes, dp_bw)
            total = m * (2 * ag + rs)
            # forward all-gathers hide behind the forward, backward all-gather + reduce-scatter behind the backward
            per_mb_exposed = (exposed(gpu, ag, c_f, mem, dp_bw)
                              + max(exposed(gpu, ag + rs, c_b + c_r, mem, dp_bw), bucket_t / 2))
        if z >= 2 and fsdp2_strategy(setup):
            # FSDP2's copies on the compute stream: each all-gather's copy-out (two per micro-batch when the forward
            # reshards, one otherwise: the backward reshards either way) and each reduce-scatter's copy-in, one
            # kernel per FSDP group (parallel/fsdp2.py copy_bytes)
            out_b, in_b = fsdp2_copy_bytes(st, st_opt, stage_params, trained)
            gathers = 2 if reshards_after_forward(setup) else 1
            groups = stage_layers_n + 2  # the blocks, the embedding and the head's group (NB: per stage, ±1)
            per_mb_exposed += memory_seconds(gpu, gathers * out_b + in_b, kernels=(gathers + 1) * groups)
    else:
        total = 0.0

    t_mb = c_f + c_b + c_r + tp_mb + pp_mb + cp_mb + ep_mb + per_mb_exposed
    bubble = (p - 1) / v * t_mb if p > 1 else 0.0  # Narayanan et al. 2021 §2.2.2: (p−1)/(v·m) of m·t_mb
    # optimizer.step() on the rank's shard: the bytes its kernel moves and its launches (compute_time.py).
    # NB: --offload's CPU step is timed as the GPU one (as before): optimistic for ZeRO-Offload
    shard = trained / (dpc if z >= 1 else 1)
    tensors = tensors or model_for(setup).tensors_per_rank(  # the stack's own parameter tensors
        spec, stage_layers_n, p == 1 or first == stage_layers_n, p == 1 or last == stage_layers_n)
    clipped = clipped_params(setup, trained)  # the gradients the stack's clip reads on this rank
    opt_mem, opt_launch = optimizer_seconds(gpu, setup, st_opt, shard, tensors, sizes=sizes, grads=clipped)
    clip = clip_work(setup, st_opt, clipped, tensors, sizes=sizes)
    clip_comm = clip_allreduce_seconds(setup, clip, intra, inter, gpn)
    opt = opt_mem + opt_launch + clip_comm
    host = m * offload_exposed(spec, setup, gpu, c_f, c_b + c_r)
    step = m * t_mb + bubble + once_exposed + opt + host
    world = t * p * d * cp
    issue = kernels = slowest = 0.0
    if efficiency is None:
        # every collective waits for the slowest of the job's GPUs (stragglers.py): its GEMMs and attention run
        # slower than the mean chip the kernel model times
        slowest = m * (tot.gemm + tot.attention) * slowest_gpu_factor(world)
        step += slowest
        # the host issues ahead while the GPU computes or waits (on the network, the pipeline): it is exposed only
        # where issuing takes longer than all of that
        kernels = m * tot.kernels + opt_launch / kernels_for(gpu).launch_seconds
        issue = host_issue_exposed(setup, kernels, step)
    step += issue

    tok_step = b * s * m * d
    model_flops = 3 * costs.forward_total * tok_step
    # NB: recompute FLOPs of the whole model as p stages of layers // p (uneven splits differ by a layer)
    rec_total = p * recompute_per_token(spec, setup, spec.layers // p, costs.layer_forward,
                                        costs.attention_per_layer) * tok_step
    return StepTime(
        compute=m * (c_f + c_b), recompute=m * c_r, tp_comm=m * tp_mb, cp_comm=m * cp_mb, ep_comm=m * ep_mb,
        pp_comm=m * pp_mb, bubble=bubble,
        dp_comm=m * per_mb_exposed + once_exposed, optimizer=opt, host_copies=host, host_issue=issue,
        straggler=slowest, step_seconds=step,
        tokens_per_second=tok_step / step, mfu=model_flops / (world * step * dense_peak),
        hfu=(model_flops + rec_total) / (world * step * dense_peak), dp_comm_total=total, dp_bandwidth=dp_bw_name,
        efficiency=achieved, compute_terms=terms, kernels=kernels,
        optimizer_casts=master_cast_seconds(gpu, setup, st_opt, shard, tensors),
        grad_clip=clip_seconds(gpu, clip) + clip_comm,
    )


def clip_allreduce_seconds(setup: Setup, clip: ClipWork, intra: float, inter: float, gpn: int) -> float:
    """The clip's all-reduces of its norm (grad_clip.ClipWork.allreduces), by the ring model over their group, placed
    as the step's other groups are (tensor-parallel ranks innermost, then pipeline, then data parallel): a group
    runs at the intra-node bandwidth when the ranks it spans fit in a node. NB: a few bytes each, so the ring's
    bandwidth term is ~0 and its latency, which the comm model leaves out (module docstring), is all of it:
    optimistic by a small-message all-reduce's latency (tens of µs) per group."""
    t, p = setup.tp, setup.pp
    spans = {"dp": (setup.dp * setup.cp, t * p * setup.dp * setup.cp), "model": (t * p, t * p),
             "world": (setup.world_size, setup.world_size)}
    return sum(ring_allreduce(spans[g][0], nbytes, intra if spans[g][1] <= gpn else inter)
               for g, nbytes in clip.allreduces)


def host_issue_exposed(setup: Setup, kernels: float, gpu_seconds: float) -> float:
    """Seconds the GPU waits on an eager host: issuing `kernels` takes kernels × the host's time per kernel
    (kernels.toml [host]); when that exceeds the step's GPU timeline `gpu_seconds` (its kernels, and the exposed
    communication and bubble the host issues through) the step is host-bound by the difference. NB: the two are taken over the whole step, as if the host were ahead or behind throughout:
    optimistic where short and long kernels alternate (the GPU idles in the short stretches even when the sum
    of kernels is longer). Compiled steps are not charged (NB optimistic: inductor's launches are cheaper, not free)."""
    if getattr(setup, "compile", False):
        return 0.0
    return max(0.0, kernels * host_seconds_per_kernel() - gpu_seconds)


@lru_cache(maxsize=1024)
def stage_params(spec: ModelSpec, pc: ParamCounts, tp: int, pp: int, pp_split: str = "even") -> int:
    """Parameters on the busiest rank (first stage with the embedding, a middle one, or last with the head); memoised
    on its arguments (the planner times many setups of one layout)."""
    from .memory import Stage, rank_params

    probe = Setup(tp=tp, pp=pp, dp=1, grad_accum=max(pp, 1))
    if pp == 1:
        return rank_params(spec, pc, probe, Stage(0, spec.layers, True, True, 1))[0]
    first, middle, last = split(spec.layers, pp, pp_split)
    return max(rank_params(spec, pc, probe, Stage(0, first, True, False, 1))[0],
               rank_params(spec, pc, probe, Stage(1, middle, False, False, 1))[0] if pp > 2 else 0,
               rank_params(spec, pc, probe, Stage(pp - 1, last, False, True, 1))[0])


def layout_step_time(spec: ModelSpec, setup: Setup, gpu: GPU, efficiency: float | None = None,
                     pc: ParamCounts | None = None) -> StepTime:
    """The step time of one training setup on `gpu` (the planner's model, every term)."""
    pc = pc or count_params(spec)
    return step_time(spec, setup, gpu, ModelCosts.of(spec, setup.seq, pc),
                     stage_params(spec, pc, setup.tp, setup.pp, setup.pp_split), state_bytes(setup), efficiency)


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


def offload_exposed(spec: ModelSpec, setup: Setup, gpu: GPU, forward: float, backward: float) -> float:
    """--offload activations: seconds per micro-batch the GPU waits on host copies. torchtune's OffloadActivations
    copies each saved tensor to pinned host memory on a side stream during the forward and brings it back one
    layer ahead during the backward (training/_activation_offloading.py), so each direction overlaps its pass:
    exposed = max(0, bytes / link − the pass's compute), each way (the offloaded bytes: analytic/memory.py).
    NB: the copies' HBM traffic is not charged to the overlapped kernels."""
    if setup.offload != "activations":
        return 0.0
    from .memory import train_memory

    link = kernels_for(gpu).host_link
    if not link:
        raise SetupError(f"--offload activations: no host link bandwidth is known for {gpu.name} (kernels.toml "
                         "host_link); use a catalog GPU")
    copied = train_memory(spec, setup).host_memory
    return max(0.0, copied / link - forward) + max(0.0, copied / link - backward)
