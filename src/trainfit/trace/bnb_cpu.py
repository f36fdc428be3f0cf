"""On --device cpu, trace bitsandbytes' optimizer updates with the CPU kernels a real CPU step runs.

Under fake tensors `torch.ops.bitsandbytes.optimizer_update_8bit_blockwise` and `optimizer_update_32bit` run their
registered fake kernels (bitsandbytes 0.50 _ops.py:458 and :391: in place, nothing allocated) — right for CUDA,
whose kernels update the states in place (backends/cuda/ops.py:1059, :1118). The CPU kernels are PyTorch code:
the 8-bit one (backends/cpu/ops.py:469-580) dequantises both states to fp32, makes fp32 copies of the gradient
and the parameter, updates and requantises; the 32-bit one (:345-448, also the fp32 states of tensors under 4,096
elements in the 8-bit optimizers) makes fp32 copies of the gradient and the parameter and, for AdamW, the update
and the root of the second moment; Lion its update — temporaries of a few full-size fp32 tensors of the parameter
being stepped. For a CPU step we run those same functions on the fake tensors, in place of the functional
wrappers the optimizers call (functional.py:1080, :1169), so the trace sees the temporaries the real step makes.
"""
from __future__ import annotations

import contextlib
import inspect

from ..setup import BNB_OPTIMIZERS


@contextlib.contextmanager
def bnb_cpu_kernels(setup):
    if setup.device != "cpu" or setup.optimizer not in BNB_OPTIMIZERS:
        yield
        return
    try:
        import bitsandbytes.functional as F
    except ImportError:  # the optimizer's own construction says what to install
        yield
        return
    from bitsandbytes.backends.cpu.ops import _optimizer_update_32bit_cpu, _optimizer_update_8bit_blockwise_cpu

    originals = F.optimizer_update_32bit, F.optimizer_update_8bit_blockwise
    wrapper_signature = inspect.signature(F.optimizer_update_32bit)

    def update_32bit(*args, **kwargs):
        # The wrapper's arguments, named, into the kernel's order (functional.py:1147-1166 passes them so).
        bound = wrapper_signature.bind(*args, **kwargs)
        bound.apply_defaults()
        named = dict(bound.arguments)
        # NB: the norm is only read when max_unorm > 0 (LAMB/LARS, which trainfit does not offer).
        named["param_norm"] = 0.0
        _optimizer_update_32bit_cpu(**named)

    F.optimizer_update_32bit, F.optimizer_update_8bit_blockwise = update_32bit, _optimizer_update_8bit_blockwise_cpu
    try:
        yield
    finally:
        F.optimizer_update_32bit, F.optimizer_update_8bit_blockwise = originals
