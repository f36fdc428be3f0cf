"""The standard training step (DESIGN.md §3), shared by the measure and trace engines.

    for each micro-batch:            phase("forward")
        with autocast (amp-*):       loss = model(**b).loss / len(batches)
                                     phase("backward")
        loss.backward()
    phase("optimizer"); clip_grad_norm_ (the HF Trainer's max_grad_norm, `clip_gradients`); optimizer.step();
    optimizer.zero_grad(set_to_none=True); phase("end")

Precision policies (see trainfit.setup):
- fp32:        fp32 params, grads, optimizer state.
- amp-bf16/16: fp32 params, grads and state; forward/backward under torch.autocast (low-precision
               activations and autocast's cached low-precision weight copies). NB: amp-fp16 runs
               without a GradScaler (the scaler's own memory is a few scalars; its unscale pass is
               in place).
- bf16:        bf16 params and grads; the torch optimizer runs directly on them (bf16 state).
- bf16-master: bf16 params and grads, plus an fp32 master copy held by `MasterWeightOptimizer`:
               the torch optimizer steps the fp32 masters (fp32 state). Memory per parameter:
               2 (bf16 weight) + 2 (bf16 grad, until zero_grad) + 4 (fp32 master) + optimizer state
               in fp32 (Adam: 8), and during `step()` a transient 4 (fp32 copy of every grad, all
               alive while the inner optimizer steps, freed right after) plus the inner optimizer's
               own per-parameter temporaries.
"""
from __future__ import annotations

import contextlib
import math
from typing import TYPE_CHECKING, Callable, Iterable

import torch
from torch.overrides import _get_current_function_mode_stack

from ..errors import EngineUnavailableError
from ..setup import BNB_OPTIMIZERS, TORCHAO_OPTIMIZERS
from .build import autocast_dtype, build_model, make_batches
from .in_backward import InBackwardOptimizer
from .optimizers import bnb_optimizer
from .torchao_optim import torchao_optimizer
from ..analytic.torchao_optim import block_size as torchao_block

if TYPE_CHECKING:  # pragma: no cover
    from ..setup import Setup
    from ..spec import ModelSpec

LR = 1e-3


def _params(params_or_model) -> list:
    """The trainable parameters of a model or a list of them; a list of param groups ({"params": [...]}, as a
    trainer builds them) stays groups, each with its trainable parameters in its own order."""
    if isinstance(params_or_model, torch.nn.Module):
        return [p for p in params_or_model.parameters() if p.requires_grad]
    items = list(params_or_model)
    if items and all(isinstance(g, dict) for g in items):
        return [{"params": [p for p in g["params"] if p.requires_grad]} for g in items]
    return [p for p in items if p.requires_grad]


def _flat(params: list) -> list[torch.nn.Parameter]:
    """The parameters of `_params`' answer in their order, groups flattened (the wrappers keep one group)."""
    return [p for g in params for p in g["params"]] if params and isinstance(params[0], dict) else params


def _torch_optimizer(params: list, name: str, kernel: str = "for-loop",
                     block_size: int | None = None) -> torch.optim.Optimizer:
    # kernel = Setup.optimizer_kernel (the stack's fact or --optimizer-impl): for-loop (one parameter's
    # temporaries alive at a time), foreach (multi-tensor kernels, whole-group temporaries) or fused (in place).
    flags = {"for-loop": dict(foreach=False), "foreach": dict(foreach=True), "fused": dict(fused=True)}[kernel]
    if name == "sgd":
        return torch.optim.SGD(params, lr=LR, **flags)
    if name == "momentum":
        return torch.optim.SGD(params, lr=LR, momentum=0.9, **flags)
    if name == "adam":
        return torch.optim.Adam(params, lr=LR, **flags)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=LR, **flags)
    if name == "adafactor":
        return torch.optim.Adafactor(params, lr=1e-2, **flags)
    if name in BNB_OPTIMIZERS:
        return bnb_optimizer(params, name, LR)
    if name in TORCHAO_OPTIMIZERS:
        return torchao_optimizer(params, name, LR, block_size)
    raise EngineUnavailableError(f"--optimizer {name!r} is not supported by this engine")


class MasterWeightOptimizer(torch.optim.Optimizer):
    """bf16 params/grads with fp32 master weights (Megatron / DeepSpeed bf16 style).

    Holds `master_params` (fp32 copies of the model's bf16 params); `inner` is the torch optimizer
    over the masters (its state is fp32). `step()`: for each param, master.grad = p.grad.float();
    then inner.step(); then each bf16 param is overwritten from its master and the master grads are
    dropped. `param_groups` and `state` are the inner optimizer's (keyed by master params).
    """

    def __init__(self, params: Iterable[torch.nn.Parameter], name: str, kernel: str = "for-loop",
                 block_size: int | None = None):
        self.model_params = list(params)
        with torch.no_grad():
            self.master_params = [p.detach().to(torch.float32).clone() for p in self.model_params]
        for m in self.master_params:
            m.requires_grad_(True)
        self.inner = _torch_optimizer(self.master_params, name, kernel, block_size)
        super().__init__(self.master_params, dict(self.inner.defaults))
        self.param_groups = self.inner.param_groups
        self.state = self.inner.state

    @torch.no_grad()
    def step(self, closure=None):  # noqa: D102
        for p, m in zip(self.model_params, self.master_params):
            m.grad = None if p.grad is None else p.grad.to(torch.float32)
        self.inner.step()
        for p, m in zip(self.model_params, self.master_params):
            p.copy_(m)
            m.grad = None

    def zero_grad(self, set_to_none: bool = True):  # noqa: D102
        for p in self.model_params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()
        for m in self.master_params:
            m.grad = None


def make_optimizer(params_or_model, setup: "Setup") -> torch.optim.Optimizer:
    """The optimizer of `setup.optimizer` (lr 1e-3; Adafactor 1e-2) over a model, its parameters, or param groups
    (a live trainer's grouping, kept: trace/user.py); bf16-master wraps it with fp32 masters (one group);
    --optimizer-in-backward makes one per parameter, stepped during the backward (step/in_backward.py)."""
    params = _params(params_or_model)
    # torchao's block size as the stack builds it (analytic/torchao_optim.py block_size)
    blk = torchao_block(setup) if setup.optimizer in TORCHAO_OPTIMIZERS else None
    if setup.precision == "bf16-master":
        return MasterWeightOptimizer(_flat(params), setup.optimizer, setup.optimizer_kernel, blk)
    if setup.optimizer_in_backward:
        return InBackwardOptimizer(_flat(params), lambda p: _torch_optimizer([p], setup.optimizer, setup.optimizer_kernel, blk))
    return _torch_optimizer(params, setup.optimizer, setup.optimizer_kernel, blk)


def _device_type(model: torch.nn.Module, setup: "Setup") -> str:
    try:
        t = next(model.parameters()).device.type
    except StopIteration:
        t = setup.device
    # meta (trace engine) has no autocast: use the device the setup targets.
    return t if t in ("cpu", "cuda") else setup.device


def _is_real(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import is_fake

    return not is_fake(t) and t.device.type != "meta"


@contextlib.contextmanager
def _unpacked_sequences():
    """Make HF's mask building take the same path on fake/meta tensors as on real ones.

    transformers' `find_packed_sequence_indices(position_ids)` returns None for ordinary (unpacked)
    batches after reading a tensor value; on a FakeTensor it cannot read it (`is_tracing` is true) and
    returns the packed-sequence mask instead, which makes `create_causal_mask` materialise a
    (batch, 1, seq, seq) boolean mask rather than passing `is_causal=True` to SDPA -- a different
    memory profile from the real step; on meta tensors it raises (`.item()`). Our batches
    (`make_batches`) are never packed, so on fake/meta inputs we return None, the real answer.
    Real tensors go through the original function unchanged.
    """
    try:
        from transformers import masking_utils
    except ImportError:  # pragma: no cover
        yield
        return
    original = getattr(masking_utils, "find_packed_sequence_indices", None)
    if original is None:  # pragma: no cover - other transformers versions
        yield
        return

    def patched(position_ids):
        if not _is_real(position_ids):
            return None
        return original(position_ids)

    masking_utils.find_packed_sequence_indices = patched
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = original


def run_step(model, optimizer, batches, setup: "Setup", phase: Callable[[str], None] = lambda name: None) -> float:
    """One standard step (module docstring). Returns the last micro-batch's loss (already divided by
    the number of micro-batches), or nan when the loss is fake/meta."""
    dtype = autocast_dtype(setup)
    device_type = _device_type(model, setup)
    n = len(batches)
    loss = None
    with _unpacked_sequences():  # also covers recomputation inside backward
        for b in batches:
            phase("forward")
            with torch.autocast(device_type=device_type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
                loss = model(**b).loss / n
            phase("backward")
            loss.backward()
    return optimizer_phase(model, optimizer, loss, setup, phase)


def clip_gradients(model, setup: "Setup") -> None:
    """The HF Trainer's gradient clipping (stacks/hf.toml [grad_clip]): once per optimizer step, after the last
    micro-batch's backward and before optimizer.step(), torch.nn.utils.clip_grad_norm_(model.parameters(),
    max_grad_norm) with torch's foreach=None, as accelerate calls it (trainer.py:1936-1943, accelerator.py:3047-3048);
    nothing when Setup.grad_clip_norm is 0 (--max-grad-norm 0, --optimizer-in-backward). Its temporaries (a norm per
    tensor, their stack, the total, the coefficient: a few KB) live at the optimizer phase's start. NB: fake tensors
    take torch's per-tensor path (clip_grad.py:100-103), which makes the same per-tensor norms as the CPU's
    _foreach_norm; CUDA's also holds an fp32 scratch of tensors × their most chunks (2.3 MB for llama-3.2-1b), not
    traced. NB: amp-fp16 runs without a GradScaler here, so there is no unscale_ before it (an in-place pass over the
    gradients)."""
    norm = setup.grad_clip_norm
    if norm > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), norm)


def optimizer_phase(model, optimizer, loss, setup: "Setup", phase: Callable[[str], None]) -> float:
    """A step's end: phase("optimizer"), the gradients clipped (`clip_gradients`), the optimizer step, the gradients
    freed (zero_grad(set_to_none=True)), phase("end"); returns the last micro-batch's loss, nan when it is
    fake/meta."""
    phase("optimizer")
    clip_gradients(model, setup)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    phase("end")
    if loss is None or not _is_real(loss):
        return math.nan
    return loss.item()


def enable_recompute(model: torch.nn.Module, setup: "Setup") -> None:
    if setup.recompute == "none":
        return
    if setup.recompute == "selective":
        raise EngineUnavailableError(
            "--recompute selective: transformers has no selective (attention-only) checkpointing, so the "
            "trace/measure engines cannot run it; use --recompute full or none, or the analytic engine"
        )
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise EngineUnavailableError(
            f"--recompute full: {type(model).__name__} does not support gradient checkpointing in transformers"
        )
    # every decoder layer checkpointed (non-reentrant torch.utils.checkpoint), no CPU offload.
    # transformers >= 5.x names it activation_checkpointing_enable (gradient_... is a deprecated alias).
    kwargs = {"use_reentrant": False, "context_fn": _forward_function_modes}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def _forward_function_modes():
    """torch.utils.checkpoint's context_fn: the recomputation runs inside the backward, where the Python function
    modes of the forward are not on the stack (TorchFunctionMode: none there, checked), so it re-enters the forward's
    (the trace's CUDA autocast lists, trace/cuda_autocast.py): else an op they cast recomputes in another dtype and
    checkpoint refuses (check_recomputed_tensors_match). A real step has none: nothing changes."""
    modes = _get_current_function_mode_stack()

    @contextlib.contextmanager
    def again():
        with contextlib.ExitStack() as stack:
            for mode in modes:
                stack.enter_context(mode)
            yield

    return contextlib.nullcontext(), again()


def prepare(spec: "ModelSpec", setup: "Setup", device="cpu"):
    """(model, optimizer, batches) in steady state: built, recompute enabled, one warm-up step run
    so that the optimizer state is resident (Adam's exp_avg/exp_avg_sq, momentum buffers...)."""
    model = build_model(spec, setup, device=device)
    enable_recompute(model, setup)
    if setup.compile:  # the HF Trainer's torch_compile: the whole model, inductor (stacks/hf.toml [compile])
        model = torch.compile(model)
    optimizer = make_optimizer(model, setup)
    batches = make_batches(spec, setup, device=device)
    if not setup.compile:
        run_step(model, optimizer, batches, setup)
        return model, optimizer, batches
    try:
        run_step(model, optimizer, batches, setup)  # compiles
    except torch._dynamo.exc.BackendCompilerFailed as e:  # e.g. inductor on CPU without a C++ compiler
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise EngineUnavailableError(f"--compile: torch.compile failed here ({first[:200]}); use --engine analytic") \
            from None
    return model, optimizer, batches
