"""The only way callers run an engine: routing, the stack checks, the layer-extrapolation policy and one-line errors
for a missing extra. Nothing outside this module (and the engines' own packages) imports trainfit.trace,
trainfit.measure or trainfit.analytic.engine: the import contract in pyproject.toml, checked by tests/test_layers.py.
The model and layout limits (analytic/layout.py: divisibility, learned positions, pipeline fill) are enforced by each
engine at its own entry, so direct library calls get them too. Callers: the API (trainfit.api: the CLI, the web
app, the report, the sweep), the planner's --verify and its serving plans.

  analytic  formulas (no torch), any layout
  trace     the real model on fake tensors: one process; dp > 1 (ZeRO/FSDP) runs one rank of the sharded step
            with a fake process group (trace/distributed.py); tp/pp are not traced (analytic only);
            trace_module / trace_factory: any nn.Module (trace/user.py)
  measure   real steps on this machine (--stack deepspeed: DeepSpeed's engine on --dp local torchrun ranks);
            measure_ranks: the step on N local torch.distributed ranks (trainfit measure --nproc)
"""
from __future__ import annotations

from .errors import EngineUnavailableError, SetupError
from .estimate import Estimate
from .hardware import GPU
from .setup import TORCHAO_OPTIMIZERS, Setup
from .spec import ModelSpec

ENGINES = ("analytic", "trace", "measure", "all")
# The settings a run of each reads (`trainfit measure`'s and `trainfit trace`'s options, trainfit.measure_step's and
# trace_module's keywords): the measure engine's one process of the standard step, the trace of a user's module
MEASURED = ("batch", "seq", "grad_accum", "precision", "optimizer", "recompute", "attention", "zero", "stack",
            "optimizer_impl", "device", "mode", "kv_dtype", "ep", "moe_force_balance")
TRACED_MODULE = ("grad_accum", "precision", "optimizer", "recompute", "device")


def check_stack(setup: Setup, engine: str) -> None:
    """Refuse, in one line, what the trace or measure `engine` does not run for this setup's mode and stack."""
    if setup.mode == "serve":
        raise SetupError(f"--mode serve models a serving engine's start-up on a GPU (analytic/serving.py), which the "
                         f"{engine} engine does not run: use `trainfit estimate --mode serve` (the analytic engine"
                         + ("; without --measure or --engine measure)" if engine == "measure" else ")"))
    if setup.mode == "rl":
        if setup.device != "cpu" or setup.rollout != "hf" or setup.rl_algo != "grpo" or setup.reward_model:
            raise SetupError(f"--engine {engine} --mode rl runs the minimal GRPO step (step/grpo.py) with CPU "
                             "semantics and an HF rollout: use --device cpu, --rl-algo grpo, --rollout hf and no "
                             "--reward-model, or --engine analytic")
        if setup.lora_rank or setup.recompute != "none" or setup.precision not in ("fp32", "amp-bf16", "bf16"):
            raise SetupError(f"--engine {engine} --mode rl runs full fine-tuning without recompute in fp32, amp-bf16 "
                             "or bf16: drop --lora-rank/--recompute, or use --engine analytic")
        if setup.dp > 1 or setup.zero or setup.rl_placement != "colocated":
            raise SetupError(f"--engine {engine} --mode rl runs the step on one process: drop --dp/--zero/"
                             "--rl-placement, or use --engine analytic")
        return
    if setup.ulysses > 1 or setup.tiled_mlp is not None or setup.loss == "tiled":
        raise SetupError(f"--ulysses, --tiled-mlp and --loss tiled are DeepSpeed's sequence-parallel and tiled "
                         f"kernels on ranks' process groups, which --engine {engine} does not run here; use --engine "
                         "analytic")
    if setup.loss != "full":
        raise SetupError(f"--loss {setup.loss}{' (--liger)' if setup.liger else ''}: its kernels (Liger's, TRL's, "
                         f"flash-attn's) need a GPU, which --engine {engine} does not run here; use --engine analytic")
    if setup.offload_activations:
        raise SetupError(f"--offload activations moves saved tensors to pinned host memory, which --engine {engine} "
                         "cannot tell apart from device memory on this CPU; use --engine analytic")
    if setup.offload_state == "params" and setup.stack_facts.facts.get("cpu_offload") is not None:
        raise SetupError(f"--offload params (FSDP's CPU offload) puts the shards in pinned host memory, which "
                         f"--engine {engine} does not run here (pin_memory needs an accelerator: torch 2.13 "
                         "fsdp/_flat_param.py:1260 for FSDP1); use --engine analytic")
    if setup.offload_state == "optimizer" and setup.zero == 0:
        raise SetupError(f"--offload optimizer on one GPU is torchao's CPUOffloadOptimizer, which asserts a CUDA or XPU "
                         f"device (torchao 0.18.0 optim/cpu_offload.py:55-59) and which --engine {engine} does not run "
                         "here; use --engine analytic")
    if setup.optimizer in TORCHAO_OPTIMIZERS and engine == "trace":
        raise SetupError(f"--optimizer {setup.optimizer}: torchao builds each state's quantisation map from real values "
                         "(.tolist()) and torch.compiles each parameter's step, which fake tensors do not run "
                         "(DataDependentOutputException); use --engine measure (a real CPU step) or analytic")
    if setup.stack_release:  # the trace and measure engines run the installed stack's code, not that release's
        raise SetupError(f"--stack-release {setup.stack_release}: --engine {engine} runs the installed "
                         f"{setup.stack}'s own code; use --engine analytic, which reads that release's facts")
    stack = setup.stack_facts  # which engines run its step: stacks/*.toml [engines]
    if setup.mode == "train" and not stack.engine_runs(engine):
        raise SetupError(f"--engine {engine} runs the stack's own step, which it does not for --stack {setup.stack} "
                         f"({stack.fact('engines', 'why') or 'not wired'}): use --engine analytic")


def _vision(spec) -> bool:
    from .spec import VisionSpec

    return isinstance(spec, VisionSpec)


def analytic(spec: ModelSpec, setup: Setup, gpu: GPU | None = None, **run) -> Estimate:
    """`run`: the run settings (trainfit.setup.RunSettings: mfu, tokens, reserve, ...) as keywords."""
    if _vision(spec):  # image classifiers: analytic/vision.py
        from .analytic.vision import estimate as vision_estimate

        if run.get("alloc_conf"):
            raise SetupError("--alloc-conf: the analytic engine models the allocator's settings for token models "
                             "only: use --engine trace, or drop it")
        return vision_estimate(spec, setup, gpu, **run)
    from .analytic.engine import estimate

    return estimate(spec, setup, gpu, **run)  # alloc_conf: expandable_segments (analytic/expandable.py)


def _needs(what: str, missing: str, needs: str = "torch and transformers") -> str:
    return f"{what} needs {needs} ({missing} is missing): pip install 'trainfit[torch]'"


def _missing(what: str, e: ImportError, needs: str = "torch and transformers") -> EngineUnavailableError:
    return EngineUnavailableError(_needs(what, e.name, needs))


def _check_low_precision(setup: Setup, engine: str) -> None:
    """--low-precision in the trace and measure engines: the stack's step module converts the model where its
    library runs eager on CPU and fake tensors (torchtitan: torchao's Float8Linear, step/torchtitan_lowp.py) and
    refuses the rest in one line; a stack without such a converter is refused here."""
    if setup.low_precision == "none":
        return
    try:
        from .step import stack_step

        check = getattr(stack_step(setup), "check_low_precision", None)
    except ImportError as e:
        raise _missing(f"the {engine} engine", e) from e
    if check is None:
        raise SetupError(f"--low-precision {setup.low_precision}: the {engine} engine runs no low-precision library "
                         f"on --stack {setup.stack}: use --engine analytic")
    check(setup)


def missing_extra(engine: str) -> str | None:
    """Why the trace or measure `engine` cannot run here (torch or transformers not installed), in one line; None
    when they are. Looks the packages up without importing them."""
    from importlib.util import find_spec

    missing = next((name for name in ("torch", "transformers") if find_spec(name) is None), None)
    return None if missing is None else _needs(f"the {engine} engine", missing)


def trace(spec: ModelSpec, setup: Setup, extrapolate: bool = True, flops: bool = True,
          alloc_conf: str | None = None) -> Estimate:
    """The trace engine for any setup it can run.

    extrapolate: trace a few repeated layers and extend to full depth only where every number is exactly linear
    (trace/extrapolate.py verifies it, and falls back to the full trace otherwise) — the same peak, seconds
    instead of a minute for deep models. Pass False when the caller draws the whole step's curve."""
    check_stack(setup, "trace")
    if _vision(spec):
        try:
            from .trace.vision import trace_vision
        except ImportError as e:
            raise _missing("the trace engine", e) from e
        return trace_vision(spec, setup)
    if setup.tp > 1 or setup.pp > 1:
        raise SetupError("the trace engine runs one process and does not split layers: --tp/--pp are analytic only "
                         "(use --engine analytic); --dp/--zero are traced one rank at a time")
    if setup.doc_len is not None:
        raise SetupError("--doc-len (packed documents) is analytic only: the trace engine's batches are one document "
                         "per sequence; use --engine analytic")
    if setup.cp > 1:
        # torch's ring attention dispatches the CUDA SDPA kernels only (torch 2.13 distributed/tensor/experimental/
        # _context_parallel/_attention.py:916-938: flash, efficient, cuDNN); on gloo ranks the CPU flash kernel has no
        # sharding strategy and raises (tests/stacks/test_torchtitan_cp_cpu.py)
        raise SetupError("the trace engine runs one process on CPU, where torch's ring attention has no kernel "
                         "(it dispatches CUDA's flash, memory-efficient and cuDNN SDPA only): --cp is analytic only "
                         "(use --engine analytic)")
    if setup.compile:
        raise SetupError("the trace engine runs eager kernels on fake tensors: --compile is modelled by the analytic "
                         "engine and measured by --engine measure")
    _check_low_precision(setup, "trace")
    if setup.mode == "rl":
        try:
            from .trace.rl import trace_rl_estimate
        except ImportError as e:
            raise _missing("the trace engine", e) from e
        return trace_rl_estimate(spec, setup)
    try:
        from .trace.engine import trace_spec
    except ImportError as e:
        raise _missing("the trace engine", e) from e
    if setup.dp > 1:
        from .trace.distributed import trace_distributed  # one rank of the sharded step, fake process group

        return trace_distributed(spec, setup, flops=flops, alloc_conf=alloc_conf)
    return trace_spec(spec, setup, extrapolate=extrapolate, flops=flops, alloc_conf=alloc_conf)


def trace_module(module_or_factory, batch, setup: Setup, param_groups: list[list[int]] | None = None) -> Estimate:
    """The trace engine on any nn.Module, a factory returning one, or (module, example batch); `batch`: one
    micro-batch (tensor, tuple or dict), or None when the factory gives it; `param_groups`: a live optimizer's
    grouping of the module's parameters (trace/user.py)."""
    try:
        from .trace.user import trace as run
    except ImportError as e:
        raise _missing("the trace engine", e, "torch") from e
    return run(module_or_factory, batch, setup, param_groups=param_groups)


def trace_factory(ref: str, batch: int | None, setup: Setup) -> Estimate:
    """The trace engine on the nn.Module a 'package.module:function' factory returns (trainfit trace), its example
    batch resized to `batch` when given."""
    try:
        from .trace.user import trace_factory as run
    except ImportError as e:
        raise _missing("the trace engine", e, "torch") from e
    return run(ref, batch, setup)


def measure(spec: ModelSpec, setup: Setup, steps: int = 3, warmup: int = 1, progress=None) -> Estimate:
    """Real steps here (one process); the caller checks free memory first (api.check_room)."""
    check_stack(setup, "measure")
    _check_low_precision(setup, "measure")
    if setup.doc_len is not None:
        raise SetupError("--doc-len (packed documents) is analytic only: the measure engine's batches are one "
                         "document per sequence; use --engine analytic")
    if setup.cp > 1:  # (one process: no ring of cp ranks; torch's ring attention runs CUDA SDPA kernels only)
        raise SetupError("the measure engine runs one process: --cp splits each sequence over ranks and is analytic "
                         "only (use --engine analytic)")
    if setup.attention in ("triton", "flash2"):
        raise SetupError(f"--attention {setup.attention} names a kernel the measure engine does not pin; it runs "
                         "PyTorch's SDPA in its place: use --attention flash, or --engine analytic/trace (which save "
                         "what flash saves)")
    if _vision(spec):
        try:
            from .measure.vision import measure_vision
        except ImportError as e:
            raise _missing("the measure engine", e) from e
        return measure_vision(spec, setup, steps=steps, warmup=warmup)
    if setup.mode == "train" and setup.stack_facts.measured_on_ranks:
        return _measure_ranks(spec, setup, steps, warmup, progress)
    if setup.mode == "rl":
        try:
            from .measure.rl import measure_rl_estimate
        except ImportError as e:
            raise _missing("the measure engine", e) from e
        return measure_rl_estimate(spec, setup)
    try:
        from .measure import measure as run, to_estimate
    except ImportError as e:
        raise _missing("the measure engine", e) from e
    result = run(spec, setup, steps=steps, warmup=warmup, device=setup.device, progress=progress)
    return to_estimate(result, spec, setup)


def measure_ranks(spec: ModelSpec, setup: Setup, nproc: int, *, steps: int = 3, warmup: int = 2,
                  device: str | None = None, launcher_args: tuple = (), progress=None) -> tuple[list[Estimate], list[dict]]:
    """The step on `nproc` local torch.distributed.run ranks (trainfit.measure.distributed): each rank's Estimate
    and the ranks' JSON. The caller checks free memory first (api.check_room)."""
    try:
        from .measure.distributed import measure_distributed, ranks_json, to_estimates
    except ImportError as e:
        raise _missing("the measure engine", e) from e
    results = measure_distributed(spec, setup, nproc, steps=steps, warmup=max(2, warmup),
                                  device=device or setup.device, launcher_args=launcher_args, progress=progress)
    return to_estimates(results, spec, setup), ranks_json(results)


def _measure_ranks(spec: ModelSpec, setup: Setup, steps: int, warmup: int, progress) -> Estimate:
    """A stack whose step needs its process group (DeepSpeed): `setup.dp` local torch.distributed.run ranks
    (measure_ranks), the rank with the highest peak as the Estimate, every rank's peak in its records."""
    from dataclasses import replace

    if setup.device.split(":")[0] != "cpu":
        raise SetupError(f"--engine measure --stack {setup.stack} runs its --dp ranks on this machine's CPU (gloo): "
                         "use --device cpu, or trainfit measure --nproc on a GPU node")
    per_rank, _ = measure_ranks(spec, setup, setup.dp, steps=steps, warmup=warmup, device="cpu", progress=progress)
    worst = max(per_rank, key=lambda e: e.memory.peak)
    peaks = {e.detail.records["rank"]: e.memory.peak for e in per_rank}
    note = (f"{setup.dp} {setup.stack} ranks (torch.distributed.run, gloo); the highest peak is rank "
            f"{worst.detail.records['rank']}'s: " + ", ".join(f"rank {r} {p:,} B" for r, p in sorted(peaks.items())))
    return replace(worst, notes=(*worst.notes, note), detail=worst.detail.with_records(rank_peaks=peaks))


def cpu_peak_session():
    """A session over CPU steps a trainer runs itself (trainfit.callbacks): start(tensors live now), stop() ->
    the peak from c10's CPU allocator records (measure/cpu_peak.py PeakSession)."""
    try:
        from .measure.cpu_peak import PeakSession
    except ImportError as e:
        raise _missing("the CPU allocator's records", e, "torch") from e
    return PeakSession()
