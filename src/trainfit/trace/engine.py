"""The trace engine's entry point for catalog/config models: `trace_spec(spec, setup)` (user modules:
user.py). Both build the real PyTorch model under FakeTensorMode (shapes, dtypes and every allocation are
real; no memory is used), put it in steady state, run the standard step (trainfit.step.run_step)
under an AllocationRecorder and return an `Estimate` (engine="trace").

Scope: one unsharded rank (--dp/--zero: trace/distributed.py, a fake process group). For `--device cuda`
setups the trace runs CUDA's own SDPA kernels and fused dropout on fake tensors (cuda_kernels.py), the
foreach optimizers, and rounds sizes like the CUDA caching allocator. NB: other ops still run CPU kernels
and CPU autocast op lists (fake CUDA tensors cannot run autocast on a CPU-only build), and cuBLAS
workspaces are not counted (NB: an under-count of a few MiB where they come from the caching allocator;
to be checked on a GPU). For `--device cpu` the scratch that matmul, flash-attention and convolution
kernels allocate inside one op (it depends on this CPU's ISA: oneDNN on AVX512/AMX) is measured by running
each such op once on this CPU (kernel_scratch.py); the estimate's `detail.records["cpu_isa"]` says which
CPU that was.
"""
from __future__ import annotations

import contextlib

import time

import torch

from ..analytic.layout import validate_layout
from ..errors import EngineUnavailableError
from ..estimate import Detail, Estimate, Flops, Memory
from ..setup import TRAINING, Setup
from ..spec import ModelSpec
from .analysis import Analysis
from .cuda_kernels import cuda_kernels
from .bnb_cpu import bnb_cpu_kernels
from .optimizer_scalars import optimizer_scalar_reads
from .fake import fake_mode, translated_errors, vision_constants
from .kernel_scratch import cpu_isa, summary
from .kernel_scratch import notes as scratch_notes
from .recorder import as_categories
from ..vlm_setup import lm_seq


SERVE_ONLY_ANALYTIC = ("--mode serve models a serving engine's start-up on a GPU (analytic/serving.py), which the "
                       "trace and measure engines do not run: use trainfit estimate --mode serve")


def check_setup(setup: Setup) -> None:
    if setup.mode == "serve":
        raise EngineUnavailableError(SERVE_ONLY_ANALYTIC)
    if setup.tp > 1 or setup.pp > 1 or setup.zero:
        raise EngineUnavailableError(
            "the trace engine does not trace --tp/--pp (use the analytic engine); --dp with --zero is traced one rank at "
            "a time with a fake process group (trainfit estimate --engine trace --dp N --zero Z)")


def _n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # parameters() already skips tied duplicates


def _flops(rec, tokens: int) -> Flops:
    if rec.flops is None:
        return Flops(0, 0, 0, 0, 0, 0)
    k = rec.flops.by_kind
    model_step = k["forward"] + k["backward"]
    return Flops(forward=k["forward"], backward=k["backward"], recompute=k["recompute"],
                 step=model_step + k["recompute"], model_step=model_step, per_token=model_step // max(tokens, 1))


def grad_bytes(model: torch.nn.Module) -> int:
    """Bytes of all gradients of a training step: every trainable parameter's .grad has its dtype. Like the
    analytic and measure engines, `Memory.gradients` is this full size; `at_peak` says how much is live at the peak.
    Sharded parameters (FSDP2 DTensors) count this rank's shard: their gradients are sharded alike."""
    from ..step.strategy import local

    return sum(local(p).numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def replay_args(rec, setup: Setup) -> dict:
    """The traced step as alloc.replay's replay and least_capacity take it: records, start, end and the lazy states.
    torch.optim makes its states in the first optimizer.step() (adam.py _init_group), which the measured process's
    warm-up step runs after its backward; the stacks that use it replay them there (stacks/*.toml [optimizers]
    lazy_states). NB: DeepSpeed's ZeRO makes them at initialize (stage_1_and_2.py initialize_optimizer_states): kept
    resident.
    A distributed trace (trace/distributed.py `wrapped_at`) is replayed from its wrapped model on: the storages made
    and freed before it (the unsharded parameters the wrapper replaced by shards, the construction's temporaries)
    were built on the host, not on the GPU. NB: fully_shard holds one unit's unsharded parameters on the device while
    it shards them (torch 2.13 _fsdp_init.py:369-401), accelerate's efficient loading one parameter at a time
    (accelerate 1.16 utils/fsdp_utils.py:633-643); left out, so required can read low by the cache they leave, and
    reserved either way (Llama-3.1-8B dp 8 ZeRO-3 with them put back at the start of their unit's fully_shard:
    required 30.98 GiB against 30.81, reserved 36.26 against 36.43)."""
    from .recorder import OPTIMIZER_STATE

    lazy_at = None
    if setup.mode in ("train", "rl") and setup.stack_facts.fact("optimizers", "lazy_states"):
        lazy_at = next((e for e, name in rec.phase_marks if name == "optimizer" and e >= rec.step_start), None)
    records = rec.records
    wrapped_at = getattr(rec, "wrapped_at", None)
    if wrapped_at is not None:
        records = [r for r in records if r.death is None or r.death >= wrapped_at]
    return dict(records=records, start=rec.step_start, end=rec.stop, lazy=lambda r: r.cat == OPTIMIZER_STATE,
                lazy_at=lazy_at)


def replay_of(rec, setup: Setup, alloc_conf: str | None):
    """The caching-allocator replay of the traced step (trainfit.alloc.replay.Replay), with `required`: the least
    capacity at which the simulator serves every request (least_capacity: its OOM path releases the free cached
    segments and retries, as c10's malloc does), what the fit is judged on. None for CPU runs (no caching
    allocator there)."""
    if setup.device != "cuda":
        return None
    from dataclasses import replace

    from ..alloc.replay import least_capacity, replay

    step = replay_args(rec, setup)
    free = replay(conf=alloc_conf, **step)
    return replace(free, required=least_capacity(conf=alloc_conf, unconstrained=free, **step))


def _memory(an: Analysis, gradients: int, replayed=None) -> Memory:
    at = an.at_peak
    return Memory(
        weights=an.baseline.get("parameter", 0),
        gradients=gradients,
        optimizer_states=at.get("optimizer_state", 0),
        master_weights=an.baseline.get("master_weight", 0),
        activations=an.activations,
        temporaries=at.get("temporary", 0),
        kv_cache=at.get("kv_cache", 0),
        peak=an.peak,
        peak_phase=an.peak_phase,
        phases=dict(an.phases),
        at_peak=as_categories(at),
        reserved=replayed and replayed.reserved,
        required=replayed and replayed.required,
    )


def estimate_from(name, model, setup, rec, an, tokens, seconds, notes=(), alloc_conf: str | None = None) -> Estimate:
    n = _n_params(model)
    records = {
        "top_tensors": an.top_tensors,
        "activations_by_module": an.activations_by_module,
        "timeline": an.timeline,
        "baseline": an.baseline,
        "trace_seconds": round(seconds, 3),
        "storages": len(rec.records),
    }
    replayed = replay_of(rec, setup, alloc_conf)
    if replayed is not None:  # the simulator's segments at the end of the step, to set beside a real process's
        from ..alloc.replay import segment_histogram

        records["segments"] = segment_histogram(replayed.segment_sizes)
    if rec.flops is not None:
        records["flops_by_module"] = dict(sorted(rec.flops.by_module.items(), key=lambda kv: -kv[1]))
    notes = tuple(notes) + tuple(kernel_records(records, [rec]))
    # bitsandbytes' paged states (unified memory, beside the allocator)
    paged = getattr(rec, "paged_bytes", 0) or None
    return Estimate(engine="trace", model=name, params=n, params_per_rank=n, setup=setup,
                    memory=_memory(an, grad_bytes(model) if setup.mode in TRAINING else 0, replayed),
                    flops=_flops(rec, tokens),
                    notes=tuple(notes), detail=Detail(paged_optimizer_states=paged, records=records))


def kernel_records(records: dict, recs) -> list[str]:
    """For CPU-semantics traces: the CPU's ISA and the kernel-scratch probes (kernel_scratch.py) into the
    estimate's `records`; returns the notes they call for (kernels too big to probe)."""
    scratches = [r.kernels for r in recs if r.kernels is not None]
    if not scratches:
        return []
    summ = summary(scratches)
    records["cpu_isa"] = cpu_isa()
    records["kernel_scratch"] = summ
    return scratch_notes(summ)


NOTES = (
    "trace: real PyTorch step on fake tensors; every storage counted from the op that returns it to its last reference",
    "NB: scratch buffers allocated and freed inside one kernel are not seen, except (CPU runs) mixed-dtype cast "
    "copies and matmul/attention/convolution/softmax/index_put scratch probed on this CPU (can under-read a peak "
    "inside another kernel)",
)


RESERVED_NOTE = ("reserved: the step's allocations and frees replayed through a simulation of the CUDA caching "
                 "allocator (trainfit.alloc), each on the stream it is made on (FSDP2's all-gather and reduce-scatter "
                 "streams keep their own cached blocks); NB frees are immediate (no record_stream delays). required: "
                 "the least capacity at which that replay serves every request, its OOM path releasing the free "
                 "cached segments and retrying as c10's malloc does (alloc/replay.py least_capacity): the fit is "
                 "judged on it, reserved is what an unconstrained run caches")


def device_notes(setup: Setup) -> list[str]:
    from ..step import stack_step

    notes = [n for n in (stack_step(setup).NOTE,) if n]  # the stack's own line (hf has none)
    if setup.device == "cuda":
        notes.append("NB: traced with CPU kernels and CPU autocast lists, sizes rounded to the CUDA allocator's "
                     "512 B")
        notes.append(RESERVED_NOTE)
    if setup.dp > 1:
        notes.append("NB: one data-parallel rank traced without DDP's gradient buckets (+ about one gradient copy)")
    return notes


def trace_spec(spec: ModelSpec, setup: Setup, *, flops: bool = True, extrapolate: bool = True,
               alloc_conf: str | None = None) -> Estimate:
    """Trace the standard step (training, or prefill + decode for mode="infer") of the HF model for `spec`; a
    vision-language model's estimate carries its vision tower and language model apart (components.py).

    alloc_conf: the caching allocator's settings (PYTORCH_CUDA_ALLOC_CONF syntax) for `memory.reserved`.
    extrapolate: trace 3, 4 and 5 periods of the repeated decoder layers and extrapolate to the
    full depth when every number is exactly linear across those traces (extrapolate.py); otherwise,
    or when the model is shallow (< 16 periods), trace the full model.
    """
    from ..components import with_components

    return with_components(spec, _trace_spec(spec, setup, flops=flops, extrapolate=extrapolate, alloc_conf=alloc_conf))


def _trace_spec(spec: ModelSpec, setup: Setup, *, flops: bool = True, extrapolate: bool = True,
                alloc_conf: str | None = None) -> Estimate:
    """trace_spec's estimate, before the VLM components."""
    check_setup(setup)
    validate_layout(spec, setup)  # e.g. --seq past a model's learned positions: refused before tracing
    if setup.mode == "infer":
        from .inference import trace_inference

        return trace_inference(spec, setup, flops=flops, alloc_conf=alloc_conf)
    if extrapolate:
        from .extrapolate import trace_extrapolated

        est = trace_extrapolated(spec, setup, flops=flops, alloc_conf=alloc_conf)
        if est is not None:
            return est
    t0 = time.perf_counter()
    model, rec, an = trace_train(spec, setup, flops=flops)
    return estimate_from(spec.name, model, setup, rec, an, setup.batch * lm_seq(spec, setup) * setup.grad_accum,
                     time.perf_counter() - t0, NOTES + tuple(device_notes(setup)), alloc_conf=alloc_conf)


def trace_train(spec: ModelSpec, setup: Setup, *, flops: bool = True, segments: bool = False):
    """Build, warm up and record one training step on fake tensors: (model, recorder, Analysis)."""
    from ..step import hf as hf_step
    from ..step import make_optimizer, stack_step
    from ..step.standard import enable_recompute
    from .train import record_train_step, warm_up_optimizer

    step = stack_step(setup)
    with translated_errors(spec.name), fake_mode(), cuda_kernels(setup), optimizer_scalar_reads(), \
            bnb_cpu_kernels(setup), vision_constants(spec):
        if step is hf_step:  # the transformers model, with transformers' refusals in one line
            model = build_hf(spec, setup)
            enable_recompute(model, setup)
        else:
            model = step.build(spec, setup, fake=True)
        optimizer = make_optimizer(model, setup)
        batches = step.make_batches(spec, setup)
        warm_up_optimizer(model, optimizer)
        rec, an = record_train_step(model, optimizer, batches, setup, count_flops=flops,
                                    round_cuda=setup.device == "cuda", segments=segments)
    return model, rec, an


@contextlib.contextmanager
def _values_unset(spec: ModelSpec):
    """A vision-language model's truncated-normal initialisation made without reading a value: SigLIP's
    trunc_normal_ (modeling_siglip.py _init_weights via transformers initialization.py trunc_normal_, Gemma 3's tower)
    calls torch's, which reads a tensor value (aten._local_scalar_dense) fake tensors cannot give. While the model is
    built, transformers' table of torch init functions (initialization.py TORCH_INIT_FUNCTIONS) maps trunc_normal_ to
    an in-place normal_ clamped to [a, b]: the same tensors, other values, which the trace never reads."""
    if spec.vision is None:
        yield
        return
    from transformers import initialization as init

    def trunc_normal(tensor, mean=0.0, std=1.0, a=-2.0, b=2.0, generator=None):
        return tensor.normal_(mean, std, generator=generator).clamp_(a, b)

    before = init.TORCH_INIT_FUNCTIONS["trunc_normal_"]
    init.TORCH_INIT_FUNCTIONS["trunc_normal_"] = trunc_normal
    try:
        yield
    finally:
        init.TORCH_INIT_FUNCTIONS["trunc_normal_"] = before


def build_hf(spec: ModelSpec, setup: Setup) -> torch.nn.Module:
    """trainfit.step.build_model, with transformers' refusals (an attention kernel the architecture
    lacks, an unknown model class) turned into one-line EngineUnavailableErrors."""
    from ..step import build_model

    try:
        with _values_unset(spec):
            return build_model(spec, setup)
    except (ValueError, ImportError, KeyError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        hint = " (try --attention eager)" if "attention" in first.lower() else ""
        raise EngineUnavailableError(f"transformers cannot build {spec.name}: {first}{hint}") from e
