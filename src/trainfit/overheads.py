"""What the GPU holds beyond live tensors (issue 13; DESIGN.md §4c), from data/overheads.toml (no torch).

    allocated (memory.peak)  <  reserved (memory.reserved)  <  device total (memory.device_total, nvidia-smi)

- `allocator_held`: buffers libraries take through PyTorch's caching allocator — the cuBLAS workspace
  (CublasHandlePool.cpp allocates it with the CUDA caching allocator), so it is inside `max_memory_reserved`, not
  beside it; it is not one of the model's tensors, so the engines' peak leaves it out.
- `overheads`: memory beside the allocator — the CUDA context (driver state and lazily loaded kernels), NCCL's
  buffers, one set per communicator the stack creates (`communicators`), sized by the GPU's interconnect
  (nccl_buffers), SGLang's custom all-reduce buffers (`custom_allreduce_bytes`) and DeepEP's or HybridEP's buffers
  under --moe-dispatcher deepep / hybridep (`dispatcher_buffers`: sized by the model, so these take its spec).

Both are fixed (fixed_bytes): the fit rule (analytic/fit_rule.py) takes them off the GPU's memory to get the
capacity the step's tensors may use. Reserved is what an unconstrained run caches, not what it needs: the
allocator gives its free cached segments back when a cudaMalloc fails (fit_rule.required).

Every figure is a data entry with its source and the versions it holds for (data/overheads.toml).
"""
from __future__ import annotations

import math
from functools import lru_cache

from . import deepep_buffers, hybridep_buffers, nccl_buffers, serving_versions
from .alloc.caching_allocator import K_LARGE_BUFFER, K_MIN_LARGE_ALLOC, K_SMALL_BUFFER, K_SMALL_SIZE, \
    allocation_size, round_size
from .alloc.config import AllocConf
from .analytic.stacks import model_for
from .data import load_toml
from .hardware import GPU, get_gpu

_DEFAULT_CONF = AllocConf()  # torch's defaults: the analytic engine models no PYTORCH_CUDA_ALLOC_CONF


@lru_cache(maxsize=1)
def data() -> dict:
    return load_toml("overheads.toml")


def cuda_context(gpu: GPU, after_step: bool = False) -> int:
    """The CUDA context of one process on `gpu` (lazy module loading on): its generation's figure, else the default
    one; `after_step`: once a step has loaded its kernels (measured where the entry has after_step_bytes). NB: else
    the context right after the first CUDA calls, which kernels loaded lazily during the step add to (under-counts:
    +256 MiB on an H200). A figure measured on one GPU of the entry (reference_gpu) is carried to the others by the
    local memory the context reserves per resident thread (local_memory). NB: ROCm has no figure here; AMD GPUs get
    the CUDA default (direction unknown)."""
    ctx = data()["cuda_context"]  # by GPU.kernels: the catalog GPU of the chip (a GPU file names it)
    entry = next((e for e in ctx.values() if gpu.kernels in e.get("gpus", ())), ctx["default"])
    held = int(entry["after_step_bytes"] if after_step and "after_step_bytes" in entry else entry["bytes"])
    ref = entry.get("reference_gpu")
    if ref and ref != gpu.kernels:
        held += local_memory(gpu) - local_memory(get_gpu(ref))
    return held


def local_memory(gpu: GPU) -> int:
    """The local memory a CUDA context reserves: every resident thread's stack (overheads.toml [local_memory])."""
    # the SM facts live with the kernel data (kernels.toml); imported here, not at the top: analytic imports overheads
    from .analytic.roofline import kernels_for

    kn = kernels_for(gpu)
    return kn.sms * kn.threads_per_sm * int(data()["local_memory"]["per_thread_bytes"])


def blas_workspace(gpu: GPU) -> int:
    """One cuBLAS (hipBLAS on ROCm) workspace as torch sizes it (CublasHandlePool.cpp parseChosenWorkspaceSize):
    32 MiB on sm_90, 4096 KiB × 2 + 16 KiB × 8 elsewhere; ROCm 128 MiB on gfx94x, else 32 MiB."""
    if gpu.vendor == "amd":
        w = data()["hipblas_workspace"]
        return int(w["gfx94_bytes"] if gpu.kernels in w["gfx94_gpus"] else w["other_bytes"])
    w = data()["cublas_workspace"]  # by GPU.kernels: the catalog GPU of the chip (a GPU file names it)
    return int(w["sm90_bytes"] if gpu.kernels in w["sm90_gpus"] else w["other_bytes"])


def local_ranks(setup, name: str, ranks: int, per_node: int) -> int:
    """How many of rank 0's group `name` sit on rank 0's node (per_node GPUs, ranks packed in order), from the
    stacks' rank orders: Megatron-Core tp, cp, dp, pp from the innermost (parallel_state.py
    initialize_model_parallel, order "tp-cp-ep-dp-pp"; experts etp, ep, expert-dp), torchtitan's DeviceMesh
    [pp, dp, cp, tp] (tp innermost), one data-parallel group elsewhere."""
    s = setup
    stage = s.world_size // s.pp  # ranks per pipeline stage
    # counted, not listed: the members below per_node, so the cost does not grow with the world size
    if name == "model":  # tp x pp: a tp block in each stage, ranks i + j·stage (only the stages that start on the node)
        return sum(min(s.tp, per_node - j * stage) for j in range(min(s.pp, -(-per_node // stage))))
    if name == "embedding":  # the first and last stage
        return sum(1 for r in (0, (s.pp - 1) * stage) if r < per_node)
    stride = {"tp": 1, "cp": s.tp, "dp_cp": s.tp, "dp": s.tp * s.cp, "pp": stage, "ep": s.expert_tp,
              "expert_dp": s.expert_tp * s.ep}[name]
    return min(ranks, -(-per_node // stride)) if per_node > 0 else 0  # ranks k·stride < per_node


def _sglang(setup) -> bool:
    return getattr(setup, "mode", "train") == "serve" and serving_versions.engine_of(getattr(setup, "server", "") or "") == "sglang"


def nvls_on(setup) -> bool:
    """Whether the stack leaves NCCL's NVLS on (NCCL_NVLS_ENABLE, default 2 = on where supported). SGLang sets it
    from --enable-nccl-nvls, off by default (0.4.3.post4 entrypoints/engine.py:356, 0.4.9.post2 :624)."""
    return not _sglang(setup)


def custom_allreduce_bytes(gpu: GPU, setup) -> int:
    """SGLang's custom all-reduce buffers at --tp 2, 4, 6 or 8 (0.4.9.post2 distributed/device_communicators/
    custom_all_reduce.py:147-148, :260-278; created by parallel_state.py:286-289): two cudaMalloc'd IPC buffers of
    _MAX_CAR_SIZE (8 MiB; the first adds the small signal block, not counted: under by ~3 KiB) and an 8 MiB
    `rank_data` tensor from the caching allocator, which holds it in a 20 MiB segment (held_segments). NB: that
    segment is inside torch's pool but no other term counts it, so it is listed here. Only where it is enabled: a
    node whose GPUs are all NVLink-connected, or two GPUs (:236-252; two PCIe GPUs also need peer access, taken as
    given: NB over where not)."""
    if not _sglang(setup):
        return 0
    link = nccl_buffers.interconnect(gpu)
    tp = setup.tp
    c = data()["sglang_custom_allreduce"]
    if tp not in c["world_sizes"] or link is None or (tp > 2 and "nvlinks" not in link):
        return 0
    return 2 * c["max_size_bytes"] + held_segments([(c["rank_data_bytes"], 1)])


def communicators(setup) -> dict[str, int]:
    """The NCCL communicators one rank joins: process-group name -> ranks (groups of one rank create none).

    torch creates a communicator per process group on its first collective (ProcessGroupNCCL, lazily), so only
    the groups the step communicates on count: in training the stack's (analytic/stacks StackModel.communicators),
    in inference (tp > 1) the tensor-parallel group.
    """
    groups = {"tp": setup.tp} if setup.mode == "infer" else model_for(setup).communicators(setup)
    return {k: v for k, v in groups.items() if v > 1}


def allocator_held(gpu: GPU | None, setup) -> dict[str, int]:
    """Library buffers inside the caching allocator's reserved pool (not model tensors): name -> bytes."""
    if gpu is None or setup.device != "cuda":
        return {}
    w = data()["cublas_workspace"]
    threads = int(w["train_threads"]) if getattr(setup, "mode", "train") == "train" else 1
    return {"cublas_workspace": int(w["streams"]) * threads * blas_workspace(gpu)}


# the MoE dispatchers holding buffers of their own beside the allocator (the only overheads a dispatcher changes)
OWN_BUFFERS = (deepep_buffers.DISPATCHER, hybridep_buffers.DISPATCHER)


def overheads(gpu: GPU | None, setup, spec=None) -> dict[str, int]:
    """Memory beside the caching allocator that nvidia-smi counts: name -> bytes (empty without a GPU). The context is
    the one after a step, except under a serving engine, which sizes its pool before any step. `spec`: the model,
    which sizes the dispatcher's buffers (needed under --moe-dispatcher deepep / hybridep: dispatcher_buffers)."""
    if gpu is None or setup.device != "cuda":
        return {}
    out = {"cuda_context": cuda_context(gpu, after_step=getattr(setup, "mode", "train") != "serve")}
    nvls = nvls_on(setup)
    for name, ranks in communicators(setup).items():
        local = local_ranks(setup, name, ranks, gpu.gpus_per_node) if nvls else 0
        out[f"nccl_{name}"] = nccl_buffers.communicator_bytes(gpu, ranks, local)
    car = custom_allreduce_bytes(gpu, setup)
    if car:
        out["custom_allreduce"] = car
    out.update(dispatcher_buffers(spec, setup, gpu))
    return out


def dispatcher_buffers(spec, setup, gpu: GPU) -> dict[str, int]:
    """One rank's buffers of the MoE dispatcher where `setup` dispatches over more than one rank with one that holds
    its own (OWN_BUFFERS; empty elsewhere): "deepep_buffers" (deepep_buffers: on the dispatcher's SMs, --moe-
    dispatcher-sms else the stack's, parallel/expert.exchange_sms; tokens of the model's hidden size in the step's
    activation dtype, at least 2 bytes) or "hybridep_buffers" (hybridep_buffers: the rank's tokens at the dispatcher,
    parallel/expert.local_tokens; its local experts; the group's ranks in its NVLink domain). Both over the group
    deepep_buffers.group names (megatron-core builds both over its flex dispatcher's tp × ep group)."""
    how = setup.moe_dispatcher
    if how not in OWN_BUFFERS or setup.ep <= 1:
        return {}
    if spec is None:
        raise TypeError(f"{how}'s buffers are sized by the model's hidden size: pass the model spec")
    from .analytic.parallel.collectives import ranks_per_node
    from .analytic.parallel.expert import exchange_sms, local_tokens
    from .analytic.long_context import rank_tokens
    from .analytic.params import local_experts
    from .analytic.precision import state_bytes

    ranks = deepep_buffers.group(setup)
    if how == deepep_buffers.DISPATCHER:
        hidden_bytes = spec.hidden * max(int(state_bytes(setup).act), 2)
        return {"deepep_buffers": deepep_buffers.buffer_bytes(hidden_bytes, ranks, exchange_sms(setup, gpu))}
    tokens = math.ceil(local_tokens(setup, rank_tokens(setup)))
    per_domain = ranks_per_node(1, ranks, gpu.gpus_per_node)
    experts = local_experts(spec, setup)
    return {"hybridep_buffers": hybridep_buffers.buffer_bytes(spec.hidden, tokens, experts, per_domain, ranks)}


def fixed_bytes(gpu: GPU | None, setup, spec=None) -> int:
    """Everything on the device that is not the step's own tensors: allocator-held buffers + overheads."""
    return sum(allocator_held(gpu, setup).values()) + sum(overheads(gpu, setup, spec).values())


def held_segments(requests) -> int:
    """The segments the caching allocator holds for requests ((bytes, how many) pairs) that are all live at once (or that
    it keeps apart), none served from an earlier block: round_size each (CUDACachingAllocator.cpp, 512 B
    granularity), then get_allocation_size's pools: requests <= 1 MiB are packed into 2 MiB small-pool segments
    (kSmallBuffer), 1-10 MiB ones into 20 MiB segments (kLargeBuffer, split by alloc_found_block), larger ones get
    a segment of their own rounded to 2 MiB (kRoundLarge). NB: packing is taken as perfect (under-reads by < one
    segment per pool)."""
    small = mid = large = 0
    for nbytes, count in requests:
        nbytes = int(nbytes)
        if nbytes <= 0:
            continue
        n = round_size(nbytes, _DEFAULT_CONF)
        if n <= K_SMALL_SIZE:
            small += n * count
        elif n < K_MIN_LARGE_ALLOC:
            mid += n * count
        else:
            large += allocation_size(n) * count
    return -(-small // K_SMALL_BUFFER) * K_SMALL_BUFFER + -(-mid // K_LARGE_BUFFER) * K_LARGE_BUFFER + large


def reserved_from_allocated(peak: int, transient: int = 0, side_streams: int = 0) -> int:
    """What a step's own tensors hold in the caching allocator when nothing limits it, from its allocated peak (the
    fit is judged on analytic/fit_rule.py required: a run short of memory releases the free segments below):
    - the peak;
    - the cached blocks of tensors freed before the peak (`transient`, analytic.engine.largest_transient: the
      largest one, or a tied embedding's partial gradient beside the loss's blocks): a freed block stays in
      its segment (CUDACachingAllocator.cpp free_block: blocks return to the pool, segments are released only by
      empty_cache or the OOM path), and the peak's tensors, made later in other sizes, are carved from other
      segments;
    - the blocks of side streams the peak does not count (`side_streams`: FSDP2's all-gather copy-in and
      reduce-scatter streams, analytic.engine.fsdp2_side_streams): a block freed on one stream serves only that
      stream (get_free_block searches the pool keyed by (stream, size)).
    Against the simulator (trainfit.alloc) replaying the trace of 23 setups (bench/results/alloc_fragmentation.md,
    the analytic peak in; rerun 2026-11-30): −16.6 % to +3.9 %, mean −3.8 %; the 18 with a peak >= 1 GiB −12.1 % to
    +3.9 %, mean −2.5 %, 14 of them within ±5 % (C2, torchtitan Llama-3.1-8B FSDP 8: −0.3 % of the published 82.4
    GiB, bench/targets/device_total_published.py). NB: mostly low, by blocks no rule here counts: pythia-1b −12.1 % (freed
    autocast weight casts, too small for the fp32 gradients made after them), torchtitan FSDP2 at 1024 tokens
    −6.2 %, gpt2 b1 s256 −6.0 %, gpt2 full recompute −5.7 %, sub-GiB steps −8 to −17 % (2-20 MiB segment slack of
    many small tensors). foreach AdamW's temporaries: analytic.engine.foreach_segments (bench/studies/foreach_reserved.py).
    NB: where the later backward request outgrows the logits (small b·s) the loss's blocks are counted, above they
    are not: not monotone in the batch at that crossing (plan/fit.py assumes it is: may stop one batch short)."""
    return peak + transient + side_streams


def device_memory(step_reserved: int, gpu: GPU | None, setup, required: int = 0,
                  spec=None) -> tuple[int, int | None, dict[str, int], dict[str, int]]:
    """(reserved, device_total, overheads, allocator-held buffers) from what the step's own tensors reserve (the
    analytic engine's reserved_from_allocated, the trace engine's allocator replay) (DESIGN.md §4c): reserved adds
    the library buffers taken through the caching allocator (cuBLAS workspace), device total = reserved + the
    fixed overheads beside it (None without a GPU: the context and workspace depend on it).
    required: the fit rule's bytes for the same tensors (fit_rule.required), a floor under step_reserved: a run the
    allocator does not limit caches at least what a limited one cannot release. The analytic reserved leaves out
    the live parameters' segment slack that required counts (fit_rule.segment_slack), so where the step frees
    little it read below required (bert-base seq-cls, batch 32 x 512: 7.66 against 7.67 GiB). NB: the floor
    still leaves the slack out where the freed blocks exceed it (under by at most segment_slack). `spec`: as
    overheads takes it."""
    held = allocator_held(gpu, setup)
    reserved = max(step_reserved, required) + sum(held.values())
    if gpu is None:
        return reserved, None, {}, held
    beside = overheads(gpu, setup, spec)
    return reserved, reserved + sum(beside.values()), beside, held


def with_paged(device_total: int, beside: dict[str, int], paged: int, gpu: GPU, reserve: int = 0) -> tuple[int, int]:
    """bitsandbytes' paged optimizer states (CUDA unified memory, beside the caching allocator; analytic/optimizer.py
    paged_state_bytes) on the device: resident as far as the rest leaves room, the remainder evicted to the host by
    the driver (oversubscription: the optimizer's kernels fault its pages back in each step). Adds the resident part
    to `beside` (in place) and returns (device total, evicted bytes). NB: the pages' migration time is not in the
    step time (optimistic by ~2 x evicted / host link per step)."""
    resident = int(min(paged, max(0, gpu.memory - reserve - device_total)))
    beside["paged_optimizer_states"] = resident
    return device_total + resident, int(paged) - resident


def describe(mem_overheads: dict[str, int], held: dict[str, int], cached_block: bool = False, tied: bool = False,
             side_streams: bool = False) -> str:
    """One sentence for the notes: what lies between the peak and the device total (`cached_block`: reserved also
    holds the cached blocks of reserved_from_allocated's training rule; `tied`: a tied embedding's gradient among
    them; `side_streams`: FSDP2's side-stream blocks too, where the setup runs FSDP2 on CUDA)."""
    from .units import fmt_bytes

    parts = [f"{k} {fmt_bytes(v)}" for k, v in held.items()]
    beside = [f"{k} {fmt_bytes(v)}" for k, v in mem_overheads.items()]
    block = (" + the cached blocks of freed tensors (the largest" + ("; a tied embedding's gradient and the loss's"
                                                                    if tied else "") + ")"
             + (" and FSDP2's side-stream blocks" if side_streams else "") if cached_block else "")
    return ("reserved = peak + " + (", ".join(parts) or "nothing") + block + " (through the caching allocator, "
            "what an unconstrained run caches; a run near capacity gets the freed blocks back at its OOM retry"
            + ("; NB: within a few % of the allocator simulator, mostly under" if cached_block else "")
            + "); device total (nvidia-smi) = reserved + "
            + (", ".join(beside) or "nothing") + " (data/overheads.toml, sources and versions there); capacity = "
            "GPU memory - --reserve - " + (", ".join(parts + beside) or "nothing"))


def with_device_total(est, gpu: GPU | None, spec=None):
    """A trace estimate (reserved from the allocator simulator) with the library buffers and the fixed overheads
    added (device_memory; `spec` as overheads takes it). Unchanged without a GPU or a reserved figure."""
    from dataclasses import replace

    m = est.memory
    if gpu is None or m.reserved is None:
        return est
    reserved, device_total, beside, _ = device_memory(m.reserved, gpu, est.setup, spec=spec)
    paged = est.detail.paged_optimizer_states
    if paged:
        device_total, evicted = with_paged(device_total, beside, paged, gpu)
        if evicted:
            est = replace(est, detail=replace(est.detail, host_memory=(est.detail.host_memory or 0) + evicted))
    return replace(est, memory=replace(m, reserved=reserved, device_total=device_total, overheads=beside))
