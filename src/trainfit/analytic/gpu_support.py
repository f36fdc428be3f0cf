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


def bf16_warning(setup: Setup, gpu: GPU | None, attention: bool = True) -> str | None:
    """A warning (not a refusal: the step runs) where the matmuls run in bf16 on a GPU without bf16 tensor cores,
    which its catalog entry says by listing no bf16 peak (V100, T4: Volta and Turing have fp16 tensor cores only).
    `attention`: the model runs SDPA (every token model, ViT)."""
    from .timing import compute_dtype

    if gpu is None or compute_dtype(setup) != "bf16" or "bf16" in gpu.peak_flops:
        return None
    head = f"warning: the {gpu.name} has no bf16 tensor cores"
    if setup.mode == "serve":
        # vllm/platforms/cuda.py: check_if_supports_dtype refuses bfloat16 below compute capability 8.0, and
        # --dtype auto takes the first of supported_dtypes there, float16
        return (f"{head}: vLLM refuses --dtype bfloat16 below compute capability 8.0 and serves a bf16 checkpoint in "
                "fp16 under --dtype auto; use --precision fp16 (the same bytes)")
    # the bf16 peak falls back to the fp32 one (hardware.GPU.flops_for); torch's sdp_utils.cpp
    # can_use_mem_efficient_attention takes fp16 and fp32 only below sm80, and flash needs sm80
    sdpa = ("; SDPA's flash and memory-efficient kernels do not take bf16 below sm80 (torch sdp_utils.cpp), so "
            "attention runs the math kernel, whose seq x seq scores are not counted here (NB: memory under)"
            if attention else "")
    return (f"{head}: bf16 matmuls run at about the fp32 rate (timed so){sdpa}; --precision "
            f"{'amp-fp16' if setup.mode in ('train', 'rl') else 'fp16'} runs on its fp16 tensor cores")
