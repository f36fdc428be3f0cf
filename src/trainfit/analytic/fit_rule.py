"""THE fit rule: whether a step runs on a GPU, and by how much (no torch).

One definition for every command that answers "fits?" (estimate, fit and its advice, plan, sweep, report, the web
page): they all reach it through the analytic engine's estimate or, in the planner's inner loop, through the same
functions below; the trace engine judges its own allocator replay with `verdict` (fit_rule.with_fit).

    fits  <=>  required(step) <= capacity(gpu, setup, reserve)

- capacity: the bytes the step's own tensors may take from PyTorch's caching allocator: the GPU's memory as CUDA
  reports it, less the user's --reserve, less what the device holds beside the step's tensors whatever the step
  does (overheads.fixed_bytes: the CUDA context, the cuBLAS workspace, the NCCL communicators' buffers).
- required: the bytes the step's tensors need from the allocator for every request of the step to be served on a
  device that has no more. Not reserved: reserved is what an unconstrained run caches. When a cudaMalloc fails,
  the allocator frees every cached segment that holds no live block and retries before it raises
  (c10/cuda/CUDACachingAllocator.cpp DeviceCachingAllocator::malloc: release_cached_blocks, then alloc_block
  again; release_blocks frees only non-split segments), so the cached blocks of freed tensors are given back. What
  it cannot give back is the slack inside segments that still hold a live block:
    required = allocated peak + unreleasable fragmentation (pinned_block + segment_slack)
  The trace engine's required is the allocator simulator's own least capacity (alloc/replay.py least_capacity);
  bench/studies/alloc_capacity.py sets this rule beside it.
"""
from __future__ import annotations

from dataclasses import replace

from .. import overheads
from ..errors import SetupError
from ..estimate import Fit
from ..hardware import GPU
from ..setup import Setup
from ..spec import ModelSpec
from ..units import fmt_bytes


def reserve_bytes(reserve: float) -> int:
    """--reserve (trainfit.setup RunSettings: GiB per GPU the user keeps free beyond the modelled device total) in
    bytes, as `capacity` takes it."""
    return int(reserve * 2**30)


def capacity(gpu: GPU, setup: Setup, reserve: int = 0, spec=None) -> int:
    """Bytes of `gpu` the step's tensors may use: its memory less `reserve` bytes (--reserve) and less the fixed
    overheads of this setup's processes and communicators (overheads.fixed_bytes; `spec`, the model, as it takes
    it)."""
    return gpu.memory - reserve - overheads.fixed_bytes(gpu, setup, spec)


def required(spec: ModelSpec, setup: Setup, mem, pc=None) -> int:
    """Bytes the training step's tensors need from the caching allocator (mem: analytic.memory.TrainMemory): the
    allocated peak, the freed block pinned beside it (pinned_block) and the rounding of its live states into
    segments (segment_slack). The blocks the unconstrained step caches beyond that (analytic.engine.step_reserve:
    the other freed blocks, FSDP2's side-stream blocks, the gradients' and foreach temporaries' free segments) are
    whole free segments at the OOM retry: released.
    Against the allocator simulator's least capacity on 33 traced steps (bench/studies/alloc_capacity.py, BENCHMARKS.md
    §43): -10.9 % to +8.7 %, mean 0.0 %, mean |error| 3.4 %; the 10 real-size steps measured on an H200 -2.1 % to
    +6.8 %, mean +1.3 % (the unconstrained reserved the fit read before: -11.7 % to +32.6 %, mean +5.4 %).
    NB: over where no later tensor is carved from the freed block (opt-125m +8.7 %; llama-3.2-1b's tied embedding
    gradient, +3 to +7 %), under where more than one is pinned (full recompute's re-run forwards carve the loss's
    and the MLP's freed blocks: gpt2, pythia-160m -9 to -11 %; llama-3.1-8b bf16, two of the loss's blocks: -2.1 %)
    and by the activations' 20 MiB segment slack in sub-GiB steps; mostly over on real-size steps (a conservative
    verdict). The floor of the reported reserved (overheads.device_memory), which leaves segment_slack out."""
    return mem.peak + pinned_block(_engine.transient_blocks(spec, setup, mem, pc)) + segment_slack(spec, setup, mem)


def pinned_block(blocks: list[int]) -> int:
    """The freed block that stays reserved at the OOM retry (blocks: analytic.engine.transient_blocks, the blocks
    the step frees before its peak): the largest. Once the loss (or a layer) frees it, it is the largest free block
    of its pool, and a later request no other cached block holds is carved from it (get_free_block: the smallest
    free block >= the request; alloc_found_block splits it); that tensor lives through the peak, so the segment is
    split and release_blocks keeps it, with the free remainder, which cannot serve the next request of the freed
    block's size. NB: one such block, whole: over where nothing is carved from it, under where several are."""
    return max(blocks, default=0)


def segment_slack(spec: ModelSpec, setup: Setup, mem) -> int:
    """The bytes the segments of the peak's live parameter states hold beyond them (overheads.held_segments: 512 B
    rounding, a segment of its own rounded to 2 MiB for a request of 10 MiB or more, 20 MiB segments for 1-10 MiB
    ones, 2 MiB small-pool segments): the weights, fp32 master weights, the gradients the peak holds and the
    per-element optimizer states (not bitsandbytes' paged ones: beside the allocator), one tensor per parameter
    (foreach_segments.parameter_tensors) where torch.optim steps them (engine._torch_optim_on_cuda: hf and
    torchtitan, no LoRA). NB: under elsewhere (Megatron's and
    DeepSpeed's flat buffers: one segment each, slack < 2 MiB; LoRA's frozen weights), for the activations (their
    own segments, and 20 MiB packing where they are 1-10 MiB: small steps), and for packing taken as perfect."""
    if not _engine._torch_optim_on_cuda(setup):
        return 0
    st = _precision.state_bytes(setup)
    per = _optimizer.temporary_bytes(setup, st)
    kinds = [st.weight, st.master, st.grad if mem.at_peak.get("gradients", 0) else 0]
    if not mem.paged_optimizer_states:  # paged: unified memory, not segments
        kinds += [per] * _optimizer.state_tensors(setup, st)
    requests = [(int(n * b), c) for n, c in _foreach_segments.parameter_tensors(spec, setup) for b in kinds if b]
    return overheads.held_segments(requests) - sum(n * c for n, c in requests)


def infer_required(spec: ModelSpec, setup: Setup, m) -> int:
    """Bytes an inference run's tensors need from the caching allocator (m: analytic.inference.InferMemory): as in
    training, the peak with the largest block freed before it (one layer's MLP intermediate: analytic.engine
    infer_reserve) and the weights' segment slack (overheads.held_segments of one tensor per parameter). NB: the KV
    cache's and activations' own slack left out (under)."""
    from .engine import infer_reserve
    from .foreach_segments import parameter_tensors
    from .precision import state_bytes

    if setup.device != "cuda":
        return max(m.prefill_peak, m.decode_peak)
    w = state_bytes(setup).weight
    requests = [(int(n * w), c) for n, c in parameter_tensors(spec, setup)]
    return infer_reserve(spec, setup, m) + overheads.held_segments(requests) - sum(n * c for n, c in requests)


def verdict(gpu: GPU, setup: Setup, needed: int, reserve: int = 0, paged: int = 0, spec=None) -> Fit:
    """The verdict on `gpu`: the step needs `needed` bytes (required, or the trace's least capacity) within
    capacity(gpu, setup, reserve). `paged`: bitsandbytes' paged optimizer states (CUDA unified memory beside the
    allocator, overheads.with_paged), resident in what the step leaves and evicted to the host beyond it, so they
    take headroom but never make a step not fit. `spec`: as capacity takes it."""
    cap = capacity(gpu, setup, reserve, spec)
    if cap <= 0:  # nothing left for the step: the question is wrong, not the step too large
        raise SetupError(f"{gpu.name}: its {fmt_bytes(gpu.memory)} less --reserve {fmt_bytes(reserve)} and the "
                         f"fixed overheads {fmt_bytes(overheads.fixed_bytes(gpu, setup, spec))} (CUDA context, cuBLAS "
                         "workspace, NCCL) leave nothing for the step; lower --reserve or raise --gpu-memory")
    resident = min(paged, max(0, cap - needed))
    headroom = cap - needed - resident
    return Fit(gpu=gpu.name, gpu_memory=gpu.memory, capacity=cap, required=needed + resident, headroom=headroom,
               fits=headroom >= 0)


def node_ranks(gpu: GPU, setup: Setup) -> int:
    """The job's ranks on one node: its GPUs per node, or the whole job when it is smaller."""
    return max(1, min(setup.world_size, gpu.gpus_per_node))


def host_verdict(fit: Fit, gpu: GPU, setup: Setup, host_per_rank: int) -> Fit:
    """`fit` with the node's host memory judged: every rank on the node keeps `host_per_rank` bytes there (the
    offloaded states and the pinned buffers the stack makes: analytic/memory.py Detail.host_memory), against the
    node's host memory (GPU.host_memory: --host-memory or the cluster's). Unjudged (capacity None) where the node's
    memory is not known. NB: the processes' own host memory (the interpreter, CUDA's and the libraries' pages, a
    checkpoint loaded on the CPU) is not counted: under."""
    if not host_per_rank:
        return fit
    need = host_per_rank * node_ranks(gpu, setup)
    cap = gpu.host_memory or None
    return replace(fit, host_required=need, host_capacity=cap, fits=fit.fits and (cap is None or need <= cap))


def host_note(fit: Fit, setup: Setup, gpu: GPU) -> str | None:
    """One line on the node's host memory where it is short, else None."""
    if fit.host_capacity is None or fit.host_required <= fit.host_capacity:
        return None
    from ..units import fmt_bytes

    return (f"does not fit in host memory: the node's {node_ranks(gpu, setup)} rank(s) keep "
            f"{fmt_bytes(fit.host_required)} in host memory (offloaded states and pinned buffers), "
            f"{fmt_bytes(fit.host_required - fit.host_capacity)} over its {fmt_bytes(fit.host_capacity)} "
            "(--host-memory or the cluster's): offload less, or use nodes with more memory")


def with_fit(est, gpu: GPU | None, reserve: int = 0, spec=None):
    """A trace estimate judged on `gpu` (est.memory.required: the allocator simulator's least capacity): its Fit
    (`spec` as capacity takes it). Unchanged without a GPU or a required figure (CPU runs: no caching allocator)."""
    needed = est.memory.required
    if gpu is None or needed is None:
        return est
    return replace(est, fit=verdict(gpu, est.setup, needed, reserve, est.detail.paged_optimizer_states or 0, spec))


# (imported last, as the module, not its names: engine.py imports this module; a function-level import costs its
# resolution on every call, and this one sits on the engine's and the planner's hot path)
from . import engine as _engine, foreach_segments as _foreach_segments, optimizer as _optimizer, \
    precision as _precision  # noqa: E402
