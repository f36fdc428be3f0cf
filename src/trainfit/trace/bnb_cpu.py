"""On --device cpu, trace bitsandbytes' 8-bit optimizer update with the CPU kernel a real CPU step runs.

Under fake tensors `torch.ops.bitsandbytes.optimizer_update_8bit_blockwise` runs its registered fake kernel
(bitsandbytes 0.50 _ops.py:458: in place, nothing allocated) — right for CUDA, whose kernel updates the 8-bit
states in place (backends/cuda/ops.py:1118). The CPU kernel is PyTorch code (backends/cpu/ops.py:469-580): it
dequantises both states to fp32, makes fp32 copies of the gradient and the parameter, updates, and requantises
— temporaries of ~4 full-size fp32 tensors of the parameter being stepped. For a CPU step we run that same
function on the fake tensors (by replacing the functional wrapper the optimizers call, functional.py:1169, whose
arguments it takes unchanged), so the trace sees those temporaries as the real step allocates them.
"""
from __future__ import annotations

import contextlib

EIGHT_BIT = ("adamw-8bit", "paged-adamw-8bit")


@contextlib.contextmanager
def bnb_cpu_kernels(setup):
    if setup.device != "cpu" or setup.optimizer not in EIGHT_BIT:
        yield
        return
    try:
        import bitsandbytes.functional as F
    except ImportError:  # the optimizer's own construction says what to install
        yield
        return
    from bitsandbytes.backends.cpu.ops import _optimizer_update_8bit_blockwise_cpu

    original = F.optimizer_update_8bit_blockwise
    F.optimizer_update_8bit_blockwise = _optimizer_update_8bit_blockwise_cpu
    try:
        yield
    finally:
        F.optimizer_update_8bit_blockwise = original
