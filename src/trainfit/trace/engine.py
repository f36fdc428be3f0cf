"""The trace engine's entry points: `trace_spec(spec, setup)` and `trace(model_or_factory, batch, setup)`.

Both build the real PyTorch model under FakeTensorMode (shapes, dtypes and every allocation are
real; no memory is used), put it in steady state, run the standard step (trainfit.step.run_step)
under an AllocationRecorder and return an `Estimate` (engine="trace").

Scope: one unsharded rank on CPU kernels. NB for `--device cuda` setups the trace still runs CPU
kernels and CPU autocast op lists (fake CUDA tensors cannot run autocast on a CPU-only build); sizes
are rounded like the CUDA caching allocator, but kernels whose CUDA outputs differ (SDPA's extra
outputs, cuBLAS workspaces) are not modelled.
"""
from __future__ import annotations

import importlib
import time
from typing import Callable

import torch

from ..errors import EngineUnavailableError, SetupError
from ..estimate import Estimate, Flops, Memory
from ..setup import Setup
from ..spec import ModelSpec
from .analysis import Analysis
from .fake import fake_mode, translated_errors


def _check_setup(setup: Setup) -> None:
    if setup.tp > 1 or setup.pp > 1 or setup.zero:
        raise EngineUnavailableError(
            "the trace engine runs one unsharded rank: --tp/--pp/--zero are not traced; use the analytic engine")


def _n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # parameters() already skips tied duplicates


def _flops(rec, setup: Setup, tokens: int) -> Flops:
    if rec.flops is None:
        return Flops(0, 0, 0, 0, 0, 0)
    k = rec.flops.by_kind
    model_step = k["forward"] + k["backward"]
    return Flops(forward=k["forward"], backward=k["backward"], recompute=k["recompute"],
                 step=model_step + k["recompute"], model_step=model_step, per_token=model_step // max(tokens, 1))


def _memory(an: Analysis) -> Memory:
    at = an.at_peak
    return Memory(
        weights=an.baseline.get("parameter", 0),
        gradients=at.get("gradient", 0),
        optimizer_states=at.get("optimizer_state", 0),
        master_weights=an.baseline.get("master_weight", 0),
        activations=an.activations,
        temporaries=at.get("temporary", 0),
        kv_cache=at.get("kv_cache", 0),
        peak=an.peak,
        peak_phase=an.peak_phase,
        phases=dict(an.phases),
        at_peak=dict(at),
    )


def _estimate(name, model, setup, rec, an, tokens, seconds, notes=()) -> Estimate:
    n = _n_params(model)
    detail = {
        "top_tensors": an.top_tensors,
        "timeline": an.timeline,
        "baseline": an.baseline,
        "trace_seconds": round(seconds, 3),
        "storages": len(rec.records),
    }
    if rec.flops is not None:
        detail["flops_by_module"] = dict(sorted(rec.flops.by_module.items(), key=lambda kv: -kv[1]))
    return Estimate(engine="trace", model=name, params=n, params_per_rank=n, setup=setup,
                    memory=_memory(an), flops=_flops(rec, setup, tokens), notes=tuple(notes), detail=detail)


_NOTES = (
    "trace: real PyTorch step on fake tensors; every storage counted from the op that returns it to its last reference",
    "NB: scratch buffers allocated and freed inside one kernel are not seen (can under-read a peak inside such a kernel)",
)


def _device_notes(setup: Setup) -> list[str]:
    if setup.device == "cuda":
        return ["NB: traced with CPU kernels and CPU autocast lists, sizes rounded to the CUDA allocator's 512 B"]
    return []


def trace_spec(spec: ModelSpec, setup: Setup, *, flops: bool = True, extrapolate: bool = True) -> Estimate:
    """Trace the standard step (training, or prefill + decode for mode="infer") of the HF model for `spec`.

    extrapolate: trace 1, 2 and 3 periods of the repeated decoder layers and extrapolate to the
    full depth when every number is exactly linear across those traces (extrapolate.py); otherwise,
    or when the model is shallow, trace the full model.
    """
    _check_setup(setup)
    if setup.mode == "infer":
        from .inference import trace_inference

        return trace_inference(spec, setup, flops=flops)
    if extrapolate:
        from .extrapolate import trace_extrapolated

        est = trace_extrapolated(spec, setup, flops=flops)
        if est is not None:
            return est
    t0 = time.perf_counter()
    model, rec, an = trace_train(spec, setup, flops=flops)
    return _estimate(spec.name, model, setup, rec, an, setup.batch * setup.seq * setup.grad_accum,
                     time.perf_counter() - t0, _NOTES + tuple(_device_notes(setup)))


def trace_train(spec: ModelSpec, setup: Setup, *, flops: bool = True, segments: bool = False):
    """Build, warm up and record one training step on fake tensors: (model, recorder, Analysis)."""
    from ..step import make_batches, make_optimizer
    from ..step.standard import enable_recompute
    from .train import record_train_step, warm_up_optimizer

    with translated_errors(spec.name), fake_mode():
        model = build_hf(spec, setup)
        enable_recompute(model, setup)
        optimizer = make_optimizer(model, setup)
        batches = make_batches(spec, setup)
        warm_up_optimizer(model, optimizer)
        rec, an = record_train_step(model, optimizer, batches, setup, count_flops=flops,
                                    round_cuda=setup.device == "cuda", segments=segments)
    return model, rec, an


def build_hf(spec: ModelSpec, setup: Setup) -> torch.nn.Module:
    """trainfit.step.build_model, with transformers' refusals (an attention kernel the architecture
    lacks, an unknown model class) turned into one-line EngineUnavailableErrors."""
    from ..step import build_model

    try:
        return build_model(spec, setup)
    except (ValueError, ImportError, KeyError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        hint = " (try --attention eager)" if "attention" in first.lower() else ""
        raise EngineUnavailableError(f"transformers cannot build {spec.name}: {first}{hint}") from e


# -- any nn.Module --------------------------------------------------------------------------------
def load_factory(ref: str) -> Callable:
    """"pkg.module:function" -> the function (a model factory for `trace`)."""
    mod_name, _, attr = ref.partition(":")
    if not mod_name or not attr:
        raise SetupError(f"model factory {ref!r} must look like 'package.module:function'")
    try:
        obj = getattr(importlib.import_module(mod_name), attr)
    except (ImportError, AttributeError) as e:
        raise SetupError(f"cannot load model factory {ref!r}: {e}") from e
    if not callable(obj):
        raise SetupError(f"model factory {ref!r} is not callable")
    return obj


class _LossModule(torch.nn.Module):
    """Gives any module the HF interface run_step expects: model(**batch).loss.

    Loss: the output's `.loss` if it has one, else the first element of a tuple/list output, else
    the output itself; a non-scalar output is reduced with `.float().mean()` (NB: that reduction's
    own temporaries are counted; a real loss function would have others of similar size).
    """

    def __init__(self, module: torch.nn.Module, positional: bool):
        super().__init__()
        self.module = module
        self.positional = positional

    def forward(self, **batch):
        out = self.module(*batch.values()) if self.positional else self.module(**batch)
        loss = getattr(out, "loss", None)
        if loss is None:
            loss = out[0] if isinstance(out, (tuple, list)) else out
        if loss.dim() != 0:
            loss = loss.float().mean()
        return _Out(loss)


class _Out:
    def __init__(self, loss):
        self.loss = loss


def _as_batch(batch) -> tuple[dict, bool]:
    if isinstance(batch, dict):
        return batch, False
    if isinstance(batch, torch.Tensor):
        return {"input": batch}, True
    if isinstance(batch, (tuple, list)):
        return {f"arg{i}": t for i, t in enumerate(batch)}, True
    raise SetupError(f"batch must be a tensor, a tuple of tensors or a dict of tensors, not {type(batch).__name__}")


def trace(model_or_factory, batch=None, setup: Setup | None = None, *, flops: bool = True) -> Estimate:
    """Trace a training step of any nn.Module.

    model_or_factory: an nn.Module (real weights are copied as fake tensors, nothing is run on
    them), a callable returning a model or (model, example_batch) (called under fake mode, so even a
    70B factory costs nothing), or "pkg.mod:fn". `batch`: one micro-batch (tensor, tuple or dict);
    it is repeated `setup.grad_accum` times. The model is cast to bf16 for bf16 precisions.
    """
    from ..step import make_optimizer
    from ..step.build import param_dtype
    from ..step.standard import enable_recompute
    from .train import record_train_step, warm_up_optimizer

    setup = setup or Setup(device="cpu")
    _check_setup(setup)
    if setup.mode != "train":
        raise EngineUnavailableError("trace(model, ...) traces training steps; for inference use trace_spec")
    if isinstance(model_or_factory, str):
        model_or_factory = load_factory(model_or_factory)
    t0 = time.perf_counter()
    mode = fake_mode()
    name = getattr(model_or_factory, "__name__", type(model_or_factory).__name__)
    with translated_errors(name):
        if isinstance(model_or_factory, torch.nn.Module):
            from torch._subclasses.fake_tensor import FakeCopyMode
            import copy

            with FakeCopyMode(mode):
                model = copy.deepcopy(model_or_factory)
            name = type(model_or_factory).__name__
        with mode:
            if not isinstance(model_or_factory, torch.nn.Module):
                made = model_or_factory()
                model, example = made if isinstance(made, tuple) else (made, None)
                batch = batch if batch is not None else example
                name = type(model).__name__
            if batch is None:
                raise SetupError("trace() needs an example batch (or a factory returning (model, batch))")
            fields, positional = _as_batch(batch)
            # Real example tensors become fake (same shape/dtype); each micro-batch gets its own copy
            # as in a real loop, where every micro-batch is a fresh tensor.
            first = {k: (mode.from_tensor(v) if isinstance(v, torch.Tensor) and not _is_fake(v) else v)
                     for k, v in fields.items()}
            model = model.to(param_dtype(setup)) if param_dtype(setup) != torch.float32 else model
            model.train()
            if setup.recompute != "none":
                enable_recompute(model, setup)
            wrapped = _LossModule(model, positional)
            optimizer = make_optimizer(model, setup)
            warm_up_optimizer(wrapped, optimizer)
            batches = [first] + [{k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in first.items()}
                                 for _ in range(setup.grad_accum - 1)]
            rec, an = record_train_step(wrapped, optimizer, batches, setup, count_flops=flops,
                                        round_cuda=setup.device == "cuda", named=model)
    tokens = setup.batch * setup.seq * setup.grad_accum
    return _estimate(name, model, setup, rec, an, tokens, time.perf_counter() - t0,
                     _NOTES + tuple(_device_notes(setup)))


def _is_fake(t) -> bool:
    from torch._subclasses.fake_tensor import is_fake

    return is_fake(t)
