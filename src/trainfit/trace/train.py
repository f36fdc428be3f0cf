"""Record one standard training step (trainfit.step.run_step) of a model that is already in steady state.

Works the same on fake and on real tensors: the tests run it on real CPU tensors next to the
profiler to check that the recorder sees what the allocator sees.
"""
from __future__ import annotations

import torch

from ..analytic.optimizer import PAGED_MIN
from ..step import stack_step
from .analysis import TRAIN_PHASES, Analysis, analyse
from .modules import ModuleStack
from .recorder import (
    BUFFER,
    GRADIENT,
    INPUT,
    MASTER_WEIGHT,
    OPTIMIZER_STATE,
    PARAMETER,
    AllocationRecorder,
)


def warm_up_optimizer(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Make the optimizer state resident without a forward/backward: zero grads + one optimizer step.

    Why not `trainfit.step.prepare`'s full warm-up step: on fake tensors it doubles the trace time
    (~2 s for a 7B model) and leaves exactly the same resident state (the optimizer allocates its
    state from the parameters' shapes on its first step, whatever the gradient values).
    """
    # The warm-up step runs the multi-tensor (foreach) implementation: a handful of ops for all
    # parameters instead of ~15 per parameter (on fake tensors the cost is per op, ~1 s for a 7B
    # model otherwise). Both implementations create the same state in `_init_group`; the measured
    # step then runs the configured implementation.
    groups = getattr(optimizer, "inner", optimizer).param_groups
    saved = [g.get("foreach") for g in groups]
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
    try:
        for g in groups:
            if "foreach" in g and not g.get("fused"):
                g["foreach"] = True
        optimizer.step()
    finally:
        for g, f in zip(groups, saved):
            if f is not None or "foreach" in g:
                g["foreach"] = f
    optimizer.zero_grad(set_to_none=True)


def adopt_resident(rec: AllocationRecorder, model, optimizer, batches, unified: bool = False) -> None:
    """Count what is resident at the step start: weights, buffers, master weights, optimizer state, batches.
    `unified` (CUDA semantics): bitsandbytes' paged states are not the allocator's; their bytes go to
    rec.paged_bytes."""
    names = {}
    for name, p in model.named_parameters():
        rec.adopt(p, PARAMETER, name)
        names[p] = name
    for name, b in model.named_buffers():
        rec.adopt(b, BUFFER, name)
    masters = getattr(optimizer, "master_params", None)  # trainfit.step.MasterWeightOptimizer
    if masters is not None:
        for p, m in zip(optimizer.model_params, masters):
            rec.adopt(m, MASTER_WEIGHT, names.get(p, "") + " (master)")
            names[m] = names.get(p, "") + " (master)"
    rec.paged_bytes = 0
    for p, state in optimizer.state.items():
        for key, t in state.items():
            if not isinstance(t, torch.Tensor):
                continue
            if unified and getattr(optimizer, "is_paged", False) and key in ("state1", "state2") \
                    and p.numel() >= PAGED_MIN:
                # on CUDA bitsandbytes allocates these in unified memory, beside torch's allocator
                # (optim/optimizer.py:383-389); on a CPU it falls back to ordinary tensors, as traced here
                rec.paged_bytes += t.numel() * t.element_size()
                continue
            rec.adopt(t, OPTIMIZER_STATE, f"{names.get(p, '')}.{key}")
    for i, b in enumerate(batches):
        for key, t in (b.items() if isinstance(b, dict) else enumerate(b)):
            if isinstance(t, torch.Tensor):
                rec.adopt(t, INPUT, f"batch[{i}].{key}")


def _grad_hooks(rec: AllocationRecorder, model):
    """Gradients are born as some backward op's output and stolen by AccumulateGrad: re-label the
    storage once it is a parameter's .grad."""
    handles = []
    for name, p in model.named_parameters():
        if p.requires_grad:
            def hook(p, name=name + ".grad"):
                if p.grad is not None:  # --optimizer-in-backward's hook (registered first) applied and freed it
                    rec.adopt(p.grad, GRADIENT, name)  # must return None
                rec.mark(("grad", name))
            handles.append(p.register_post_accumulate_grad_hook(hook))
    return handles


def record_train_step(model, optimizer, batches, setup, count_flops=True, round_cuda=False, named=None,
                      segments=False):
    """Run one standard step under an AllocationRecorder. Returns (recorder, Analysis).

    `segments`: also record structural marks and per-segment maxima (for layer extrapolation).
    `named`: the module whose names label parameters and modules (default `model`; a wrapper that
    only adapts the call passes the user's module so names read "0.weight", not "module.0.weight").
    """
    named = model if named is None else named
    modules = ModuleStack(named)
    rec = AllocationRecorder(modules, count_flops=count_flops, round_cuda=round_cuda)
    if segments:
        rec.seg_marks = []
        modules.on_mark = rec.mark
        modules.on_backward = rec.mark_backward
    handles = _grad_hooks(rec, named)
    try:
        with modules, rec:
            adopt_resident(rec, named, optimizer, batches, unified=round_cuda)
            start = rec.event
            rec.reset_peak()
            stack_step(setup).run_step(model, optimizer, batches, setup, phase=rec.set_phase)
    finally:
        for h in handles:
            h.remove()
    return rec, analyse(rec, start, TRAIN_PHASES)


__all__ = ["Analysis", "adopt_resident", "record_train_step", "warm_up_optimizer"]
