"""Trace a training step of any nn.Module: `trace(model_or_factory, batch, setup)`; `trace_factory(ref, batch,
setup)` for a 'package.module:function' factory (trainfit trace).

The module is made fake (a real module is copied with FakeCopyMode, a factory is called under the
fake mode, so a 70B factory costs nothing), wrapped so that `model(**batch).loss` works, and run
through the same standard step (trainfit.step.run_step) and recorder as `trace_spec`.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import importlib
import inspect
import time
from collections.abc import Callable

import torch
from torch._subclasses.fake_tensor import FakeCopyMode, is_fake

from ..errors import EngineUnavailableError, SetupError, TrainfitError
from ..estimate import Estimate
from ..setup import Setup, trains_any
from .cuda_kernels import cuda_kernels
from .engine import (
    NOTES,
    check_setup,
    device_notes,
    estimate_from,
)
from .optimizer_scalars import optimizer_scalar_reads
from .fake import fake_limitation, fake_mode, translated_errors


def load_factory(ref: str) -> Callable:
    """"pkg.module:function" -> the function (a model factory for `trace`)."""
    mod_name, _, attr = ref.partition(":")
    if not mod_name or not attr:
        raise SetupError(f"model factory {ref!r} must look like 'package.module:function'")
    try:
        obj = getattr(importlib.import_module(mod_name), attr)
    except (ImportError, AttributeError) as e:
        raise SetupError(f"cannot load model factory {ref!r}: {_first_line(e)}") from e
    except Exception as e:  # the module itself fails: a syntax error, an exception at import time
        raise SetupError(f"cannot load model factory {ref!r}: importing {mod_name} raised "
                         f"{type(e).__name__}: {_first_line(e)}; fix the module") from e
    except SystemExit as e:  # (not an Exception: it would end trainfit with the module's code and no word)
        raise SetupError(f"cannot load model factory {ref!r}: importing {mod_name} called sys.exit({e.code!r}); "
                         "guard the module's script part with `if __name__ == \"__main__\":`") from e
    if not callable(obj):
        raise SetupError(f"model factory {ref!r} is not callable")
    return obj


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0].rstrip(". ") if text else type(e).__name__


@contextlib.contextmanager
def _user_code(what: str, doing: str, fix: str):
    """Errors raised by the user's own code (the factory, the module's forward) as one-line SetupErrors;
    fake-tensor limitations as EngineUnavailableErrors (fake.fake_limitation); trainfit's own errors as they are."""
    try:
        yield
    except TrainfitError:
        raise
    except Exception as e:
        limitation = fake_limitation(e, what)
        if limitation is not None:
            raise limitation from e
        raise SetupError(f"{doing} raised {type(e).__name__}: {_first_line(e)}; {fix}") from e
    except SystemExit as e:  # (not an Exception: it would end trainfit with the user's code and no word)
        raise SetupError(f"{doing} called sys.exit({e.code!r}); {fix}") from e


class _Out:
    def __init__(self, loss):
        self.loss = loss


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


def _as_batch(batch) -> tuple[dict, bool]:
    """A micro-batch as keyword fields, and whether the module takes them positionally."""
    if isinstance(batch, dict):
        return batch, False
    if isinstance(batch, torch.Tensor):
        return {"input": batch}, True
    if isinstance(batch, (tuple, list)):
        return {f"arg{i}": t for i, t in enumerate(batch)}, True
    raise SetupError(f"batch must be a tensor, a tuple of tensors or a dict of tensors, not {type(batch).__name__}")


def _cast_floating(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """model.to(dtype) for a model of fake tensors: Module.to would swap_tensors, which fake tensors
    copied with FakeCopyMode refuse (they carry weakrefs); assigning .data converts in place."""
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            if t.is_floating_point():
                t.data = t.data.to(dtype)


def _fake_model(model_or_factory, batch, mode):
    """(fake model, example batch) from a module or a factory. Call inside `mode` for factories."""
    if isinstance(model_or_factory, torch.nn.Module):
        with FakeCopyMode(mode):
            return copy.deepcopy(model_or_factory), batch
    name = getattr(model_or_factory, "__name__", type(model_or_factory).__name__)
    shape = "take no required argument (or a batch/batch_size one) and return an nn.Module or (nn.Module, example batch)"
    with _user_code(name, f"calling model factory {name}", f"a factory must {shape}"):
        made = model_or_factory()
    model, example = made if isinstance(made, tuple) and len(made) == 2 else (made, None)
    if not isinstance(model, torch.nn.Module):
        got = type(made).__name__ if made is model else f"({type(model).__name__}, ...)"
        raise SetupError(f"model factory {name} returned {got}; it must return an nn.Module or (nn.Module, example batch)")
    return model, (batch if batch is not None else example)


def _fake_batches(batch, mode, dtype: torch.dtype, n: int) -> tuple[list[dict], bool]:
    """`n` fake micro-batches like `batch` (each its own tensors, as in a real loop); floating inputs
    in the parameters' dtype (a bf16 model is fed bf16)."""
    if batch is None:
        raise SetupError("trace() needs an example batch (or a factory returning (model, batch))")
    fields, positional = _as_batch(batch)
    first = {}
    for k, v in fields.items():
        if isinstance(v, torch.Tensor):
            v = v if is_fake(v) else mode.from_tensor(v)
            if v.is_floating_point() and dtype != torch.float32:
                v = v.to(dtype)
        first[k] = v
    more = [{k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in first.items()} for _ in range(n - 1)]
    return [first] + more, positional


def _groups(model: torch.nn.Module, param_groups: list[list[int]] | None):
    """The fake model's parameters in the live optimizer's param groups (positions in model.parameters()), or the
    model itself (one group in module order) when none are given."""
    if param_groups is None:
        return model
    params = list(model.parameters())
    return [{"params": [params[i] for i in g]} for g in param_groups]


def trace(model_or_factory, batch=None, setup: Setup | None = None, *, flops: bool = True,
          param_groups: list[list[int]] | None = None) -> Estimate:
    """Trace a training step of any nn.Module.

    model_or_factory: an nn.Module (its real weights are copied as fake tensors; it is not run or
    changed), a callable returning a model or (model, example_batch), or "pkg.mod:fn".
    `batch`: one micro-batch (tensor, tuple or dict), repeated `setup.grad_accum` times. The model
    is cast to bf16 for bf16 precisions.
    `param_groups`: the optimizer's param groups as positions in the module's parameters() (a live trainer's own
    grouping, callbacks/live.py optimizer_groups): the traced optimizer steps them in that order, group by group,
    as the real one does (the for-loop kernel holds the previous parameter's temporaries into the next one's;
    foreach kernels allocate per group). None: one group in module order.
    """
    from ..step import make_optimizer
    from ..step.build import param_dtype
    from ..step.standard import enable_recompute
    from .train import record_train_step, warm_up_optimizer

    setup = setup or Setup(device="cpu")
    check_setup(setup)
    if setup.stack_facts.trains != "any":  # (stacks/*.toml [model])
        raise SetupError(f"--stack {setup.stack} runs that stack's own model; a user module runs the standard step "
                         f"(--stack {' or '.join(trains_any())})")
    if setup.mode != "train":
        raise EngineUnavailableError("trace(model, ...) traces training steps; for inference use trace_spec")
    if isinstance(model_or_factory, str):
        model_or_factory = load_factory(model_or_factory)
    t0 = time.perf_counter()
    mode = fake_mode()
    dtype = param_dtype(setup)
    name = getattr(model_or_factory, "__name__", type(model_or_factory).__name__)
    with translated_errors(name), mode, cuda_kernels(setup), optimizer_scalar_reads():
        model, batch = _fake_model(model_or_factory, batch, mode)
        name = type(model).__name__ if isinstance(model_or_factory, torch.nn.Module) else name
        if not any(p.requires_grad for p in model.parameters()):
            raise SetupError(f"{name} has no trainable parameters: a training step has nothing to update; "
                             "trace a module with parameters")
        batches, positional = _fake_batches(batch, mode, dtype, setup.grad_accum)
        if dtype != torch.float32:
            _cast_floating(model, dtype)
        model.train()
        with _user_code(name, f"the training step of {name} on its example batch",
                        f"check that the example batch matches the module's forward() and that --optimizer "
                        f"{setup.optimizer} --precision {setup.precision} run on it (the step runs both)"):
            if setup.recompute != "none":
                enable_recompute(model, setup)
            wrapped = _LossModule(model, positional)
            optimizer = make_optimizer(_groups(model, param_groups), setup)
            warm_up_optimizer(wrapped, optimizer)
            rec, an = record_train_step(wrapped, optimizer, batches, setup, count_flops=flops,
                                        round_cuda=setup.device == "cuda", named=model)
    # the estimate speaks of the batch it ran, not of --batch/--seq's defaults (a factory's own example batch)
    samples, length = _example_size(batches[0])
    ran = {"batch": samples, **({"seq": length} if length else {})} if samples else {}
    if any(getattr(setup, k) != v for k, v in ran.items()):
        setup = setup.with_(**ran)
    tokens = setup.batch * setup.grad_accum * (length or 1)  # (per sample where the inputs hold no token ids)
    est = estimate_from(type(model).__name__, model, setup, rec, an, tokens, time.perf_counter() - t0,
                        NOTES + tuple(device_notes(setup)))
    if samples and not length:  # no sequence: the reports show the example's inputs in its place
        est = dataclasses.replace(est, detail=est.detail.with_records(example_batch={
            k: [list(v.shape), str(v.dtype).removeprefix("torch.")] for k, v in batches[0].items()
            if isinstance(v, torch.Tensor)}))
    return est


def _example_size(fields: dict) -> tuple[int | None, int | None]:
    """(samples, tokens per sample) of one micro-batch: the first tensor's leading dimension (NB: taken as the batch
    dimension, as --batch resizes it), and the length of its token ids where an integer tensor of two or more
    dimensions is among the inputs (a language model's input_ids), else None."""
    tensors = [v for v in fields.values() if isinstance(v, torch.Tensor) and v.dim() > 0]
    if not tensors:
        return None, None
    ids = next((t for t in tensors if t.dim() >= 2 and not t.is_floating_point() and not t.is_complex()
                and t.dtype != torch.bool), None)
    return int(tensors[0].shape[0]), (int(ids.shape[1]) if ids is not None else None)


def trace_factory(ref: str, batch: int | None, setup: Setup) -> Estimate:
    """Trace the nn.Module a 'package.module:function' factory returns; `batch` sets the example's leading
    dimension (passed to the factory when it takes `batch` or `batch_size`)."""
    factory = load_factory(ref)
    if batch is None:
        return trace(factory, None, setup)
    params = inspect.signature(factory).parameters
    key = next((k for k in ("batch", "batch_size") if k in params), None)
    if key is not None:  # called by the trace inside its fake mode: a 70B factory allocates nothing
        return trace(functools.partial(factory, **{key: batch}), None, setup)
    return trace(lambda: _resized(factory(), batch), None, setup)


def _resized(made, batch: int):
    """(model, example) with the example's leading dimension set to `batch` (values do not matter to a trace)."""
    if not isinstance(made, tuple):
        raise SetupError("--batch needs the factory to return (model, example batch) or to take a batch argument")
    model, example = made

    def resize(t):
        if isinstance(t, torch.Tensor) and t.dim() > 0:
            return torch.zeros((batch, *t.shape[1:]), dtype=t.dtype, device=t.device)
        return t

    if isinstance(example, dict):
        example = {k: resize(v) for k, v in example.items()}
    elif isinstance(example, (tuple, list)):
        example = type(example)(resize(v) for v in example)
    else:
        example = resize(example)
    return model, example
