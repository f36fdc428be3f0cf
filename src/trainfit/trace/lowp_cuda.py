"""torchao's Float8Linear under autocast, for a `--device cuda` trace that runs CPU autocast on fake tensors.

Float8Linear.forward duplicates F.linear's autocast cast by asking for CUDA's autocast only: `if
torch.is_autocast_enabled(): input = input.to(torch.get_autocast_gpu_dtype())` (torchao 0.18
float8/float8_linear.py:258-262, "hardcode to GPU's autocast dtype"). On a GPU under torchtitan's maybe_enable_amp
(one rank, no FSDP) the projection inputs are thus cast to bf16 and saved in bf16; under the trace's CPU autocast the
no-argument query says False and the input would stay fp32. While a --device cuda trace runs a --low-precision
recipe, the no-argument queries answer for CPU autocast, which stands for CUDA's in that trace (cuda_autocast.py).
NB: any other caller of the no-argument query in the traced step sees the same (torchtitan's Llama has none).
(On --device cpu nothing changes: the real CPU step keeps the fp32 input, as the trace does.)
"""
from __future__ import annotations

import contextlib

import torch


@contextlib.contextmanager
def float8_sees_autocast(setup):
    if setup.device != "cuda" or getattr(setup, "low_precision", "none") == "none":
        yield
        return
    enabled, gpu_dtype = torch.is_autocast_enabled, torch.get_autocast_gpu_dtype

    def is_autocast_enabled(*args, **kwargs):
        return enabled(*args, **kwargs) if args or kwargs else enabled("cpu")

    torch.is_autocast_enabled = is_autocast_enabled
    torch.get_autocast_gpu_dtype = lambda: torch.get_autocast_dtype("cpu")
    try:
        yield
    finally:
        torch.is_autocast_enabled, torch.get_autocast_gpu_dtype = enabled, gpu_dtype
