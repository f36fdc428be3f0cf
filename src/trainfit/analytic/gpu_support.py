"""What a setup needs of its GPU's hardware, refused in one line where the GPU lacks it: the --low-precision recipe's
tensor cores (float8.check_gpu), TF32 tensor cores for --tf32 (timing.check_gpu), SMs left beside
--moe-dispatcher-sms (parallel/expert.check_gpu). No layout or memory knob on the same GPU lifts them: the estimate
runs this first, and `trainfit fit` refuses the setup as given rather than report that nothing fits."""
from __future__ import annotations

from ..hardware import GPU
from ..setup import Setup
from . import float8, timing
from .parallel import expert


def check_gpu(setup: Setup, gpu: GPU | None) -> None:
    float8.check_gpu(setup, gpu)
    expert.check_gpu(setup, gpu)
    timing.check_gpu(setup, gpu)
