"""Let optimizers read Python scalars from fake tensors while they step (the trace engine's Adafactor).

Some optimizers turn a tensor into a Python number inside step(): torch.optim.Adafactor reads its step count and
the RMS of each parameter and of each update with `.item()` (torch/optim/_adafactor.py:377,381,415 for-loop,
:526-531,595 foreach), which is `aten._local_scalar_dense` — an op fake tensors cannot answer (no data). Those
numbers only scale the update (learning-rate schedule, relative step size, update clipping): no shape, dtype or
allocation of the step depends on them, so a placeholder value gives the same memory. We answer the read with
1.0, but only while an optimizer steps (torch.optim's global step pre/post hooks, which every Optimizer subclass
runs, torch/optim/optimizer.py:289-325): a `.item()` in the model (e.g. MoE routing counts that size tensors)
still fails loudly, because there the value decides shapes.
"""
from __future__ import annotations

import contextlib

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils._python_dispatch import TorchDispatchMode

PLACEHOLDER = 1.0  # any finite number: the optimizers above only multiply, divide and clamp with it


class _ScalarReads(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default and isinstance(args[0], FakeTensor):
            t = args[0]
            return PLACEHOLDER if t.dtype.is_floating_point else (True if t.dtype == torch.bool else 1)
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def optimizer_scalar_reads():
    """Inside: every optimizer.step() runs with `.item()` on fake tensors answered by a placeholder."""
    active: list[_ScalarReads] = []

    def pre(optimizer, args, kwargs):
        mode = _ScalarReads()
        mode.__enter__()
        active.append(mode)

    def post(optimizer, args, kwargs):
        active.pop().__exit__(None, None, None)

    handles = [register_optimizer_step_pre_hook(pre), register_optimizer_step_post_hook(post)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()
        while active:  # a step that raised never reached its post hook
            active.pop().__exit__(None, None, None)
