"""THE fit rule: whether a training step runs on a GPU, and by how much (no torch).

One definition for every command that answers "fits?" (estimate, fit and its advice, plan, sweep, report, the web
page): they all reach it through the analytic engine's estimate or, in the planner's inner loop, through the same
two functions below.

    fits  <=>  required(step) <= capacity(gpu, setup, reserve)

- capacity: the bytes the step's own tensors may take from PyTorch's caching allocator: the GPU's memory as CUDA
  reports it, less the user's --reserve, less what the device holds beside the step's tensors whatever the step
  does (overheads.fixed_bytes: the CUDA context, the cuBLAS workspace, the NCCL communicators' buffers).
- required: the bytes the step's tensors need from the allocator for every request of the step to be served.
"""
from __future__ import annotations

from .. import overheads
from ..hardware import GPU
from ..setup import Setup
from ..spec import ModelSpec


def reserve_bytes(reserve: float) -> int:
    """--reserve (trainfit.setup RunSettings: GiB per GPU the user keeps free beyond the modelled device total) in
    bytes, as `capacity` takes it."""
    return int(reserve * 2**30)


def capacity(gpu: GPU, setup: Setup, reserve: int = 0) -> int:
    """Bytes of `gpu` the step's tensors may use: its memory less `reserve` bytes (--reserve) and less the fixed
    overheads of this setup's processes and communicators (overheads.fixed_bytes)."""
    return gpu.memory - reserve - overheads.fixed_bytes(gpu, setup)


def required(spec: ModelSpec, setup: Setup, mem, pc=None) -> int:
    """Bytes the training step's tensors need from the caching allocator (mem: analytic.memory.TrainMemory): what
    the step reserves (analytic.engine.step_reserve)."""
    from .engine import step_reserve

    return step_reserve(spec, setup, mem, pc)
