"""What the GPU scripts (cuda_truth, cuda_kernels, cuda_context) share: the device a run uses, NVML's handle on it,
what the device says it holds (and which chip it is), and the host's time to issue an eager kernel."""
from __future__ import annotations

import sys
import time


def device_and_gpu(dry: bool):
    """(device, the device's name, its catalog GPU) for a run: the catalog H100 on CPU semantics for a dry run; a
    GPU the catalog lacks is judged as an H100-80GB with its own memory. None (said on stderr) without CUDA."""
    import torch

    from trainfit.errors import UnknownGPUError
    from trainfit.hardware import get_gpu

    if dry:
        return "cpu", "H100-80GB", get_gpu("H100-80GB")
    if not torch.cuda.is_available():
        print("no CUDA device here: run with --dry-run (CPU semantics), or on a GPU machine", file=sys.stderr)
        return None
    name = torch.cuda.get_device_name()
    try:
        return "cuda", name, get_gpu(name)
    except UnknownGPUError:
        props = torch.cuda.get_device_properties(0)
        print(f"{name} is not in the catalog: judged as an H100-80GB with its own memory", file=sys.stderr)
        return "cuda", name, get_gpu("H100-80GB").with_memory(props.total_memory / 2**30)


def nvml_device():
    """(pynvml, this process's device handle), or the reason NVML is unavailable (a str): NVML is optional, both GPU
    scripts (this harness, cuda_kernels.py) keep running without it."""
    import torch

    try:
        import pynvml  # type: ignore

        pynvml.nvmlInit()
        return pynvml, pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
    except Exception as err:  # noqa: BLE001 — missing module, driver or permission: say which
        return f"unavailable: {err}"


def device_totals(device: str) -> dict:
    """What the device says it holds, beside the catalog's nvidia-smi total: cudaMemGetInfo's total and free (the
    total vLLM and SGLang size their pools from: analytic/serving.py NB) and NVML's total and used, read before any
    case runs (this process's CUDA context is made by the first call). None of them on CPU."""
    if device != "cuda":
        return {}
    import torch

    free, total = torch.cuda.mem_get_info()
    out = {"cuda_total": total, "cuda_free": free, "properties_total": torch.cuda.get_device_properties(0).total_memory}
    nvml = nvml_device()
    if isinstance(nvml, str):
        out["nvml"] = nvml
    else:
        lib, h = nvml
        info = lib.nvmlDeviceGetMemoryInfo(h)
        out.update(nvml_total=int(info.total), nvml_used=int(info.used))
        try:  # which chip: runs on the same one must not count twice in the chips' spread (analytic/stragglers.py)
            out["uuid"] = str(lib.nvmlDeviceGetUUID(h))
        except Exception:  # noqa: BLE001 — an old NVML: the run goes on without it
            pass
    return out


def host(device: str) -> dict:
    """The host's seconds per kernel issued from eager PyTorch, without waiting on the device: 2,000 small adds
    (one kernel each), and 300 small linears' forward + backward (autograd's engine thread too); kernels per call
    counted by the profiler on a GPU (on CPU: aten ops)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    a = torch.randn(64, device=device)
    lin = torch.nn.Linear(64, 64, device=device)
    x = torch.randn(8, 64, device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    out = {}
    for name, fn, reps in (("add", lambda: torch.add(a, a), 2000),
                           ("linear_fwd_bwd", lambda: lin(x).sum().backward(), 300)):
        for _ in range(50):
            fn()
        sync()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        host_s = (time.perf_counter() - t0) / reps
        sync()
        act = ProfilerActivity.CUDA if device == "cuda" else ProfilerActivity.CPU
        with profile(activities=[act]) as prof:
            for _ in range(10):
                fn()
            sync()
        if device == "cuda":
            n = sum(e.count for e in prof.key_averages() if getattr(e, "self_device_time_total", 0)
                    and not e.key.startswith(("aten::", "Activity Buffer", "Command Buffer")))
        else:
            n = sum(e.count for e in prof.key_averages() if e.key.startswith("aten::") and e.cpu_parent is None)
        kernels = max(1, n / 10)
        out[name] = {"kernels_per_call": kernels, "host_seconds_per_call": host_s,
                     "host_seconds_per_kernel": host_s / kernels}
    return out
