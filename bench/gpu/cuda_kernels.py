"""Kernel microbenchmarks on a GPU (issue 14: per-op efficiency curves measured, not assumed).

    python -m bench run cuda_kernels                 # on a CUDA machine, ~1.5 minutes
    python -m bench run cuda_kernels --dry-run       # anywhere: tiny sizes on CPU (the harness itself; CI runs it)

Times, with CUDA events over repeated launches, the kernels an eager training step spends its time in, each beside
trainfit's roofline prediction for it (analytic/roofline.py):
  elementwise   copy / add / fp32->bf16 cast / in-place scale, bf16 and fp32, 256 K to 256 M elements: achieved
                bytes/s against the hbm_fraction bandwidth (the "other" kernels of bench/gpu/cuda_truth.py);
  step_ops      the memory-bound ops of an eager LLM step (RMSNorm's fp32 pieces, SiLU, adds, a transpose copy,
                log-softmax) at 2,048 tokens x 768-8,192 wide;
  sdpa          torch's scaled_dot_product_attention, causal, forward and backward, by backend (the default
                dispatch, cuDNN, FlashAttention-2, memory-efficient) over sequence and head dim;
  sdpa_variants fp32 and dropout 0.1 by backend (the default and the memory-efficient kernel), the fits' checks;
  gemm          the forward and both backward GEMMs of each linear layer of the models bench/gpu/cuda_truth.py runs,
                at its 2 x 1024 tokens (vocabularies not a multiple of 8 included: GPT-2's 50,257);
  adamw         torch.optim.AdamW (fused and foreach) over Llama-3.2-1B's parameter tensors, fp32 and bf16;
  lora          the six thin GEMMs of a LoRA pair on Llama-3.2-1B's linear shapes, ranks 8 / 16 / 64, fp32 and bf16;
  host          the host's time to issue one eager op (a small add; a small linear's forward + backward);
  sustained     one large bf16 GEMM back to back for 20 s: its rate per second beside NVML's SM clock, power and
                temperature (the chip-to-chip spread of analytic/stragglers.py, measured per machine);
  sustained_step  real training steps back to back for 30 s each (SUSTAINED_STEPS: a step whose GEMMs are about
                half its time and one that is mostly GEMMs), each step's time beside NVML's SM clock and power, and
                the analytic engine's prediction: whether a training step, not only a lone GEMM, settles below the
                clock its kernels were timed at in short bursts (docs/benchmarks/published-time.md).
Writes bench/results/gpu/<gpu>-<date>-<chip>-kernels.json: ground truth of rule 1 (DEVELOPERS: real steps on a GPU).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
import time
from pathlib import Path

from bench import data
from bench.gpu.device import device_and_gpu, device_totals, host, nvml_device

ABOUT = {"summary": "kernel microbenchmarks vs the roofline (needs CUDA; --dry-run on CPU)",
         "minutes": 1.5, "quick": ["--dry-run"]}

RESULTS = data.results_dir() / data.GPU_DIR
MODELS = ("gpt2", "llama-3.2-1b", "qwen2.5-1.5b", "llama-3.2-3b", "llama-3.1-8b")


def timer(device: str):
    """seconds(fn, reps): per call, the kernels' own time (torch.profiler's device time of every kernel the `reps`
    calls launched, summed) on a GPU, so a host slower than the kernels does not inflate it; on CPU (the dry run)
    the wall time. Also keeps, in `seconds.wall`, the last CUDA-event wall time per call (kernels + host gaps)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    def seconds(fn, reps: int = 10) -> float:
        fn()  # warm-up (autotuning, the allocator, cuDNN's graph cache)
        if device != "cuda":
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            return (time.perf_counter() - t0) / reps
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            fn()
        b.record()
        b.synchronize()
        seconds.wall = a.elapsed_time(b) / 1e3 / reps
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                fn()
            torch.cuda.synchronize()
        kernels = {}
        for ev in prof.key_averages():
            t = getattr(ev, "self_device_time_total", 0)
            if t and not ev.key.startswith(("aten::", "Activity Buffer", "Command Buffer", "ProfilerStep")):
                kernels[ev.key[:160]] = kernels.get(ev.key[:160], 0.0) + t / 1e6 / reps  # names can share a prefix
        seconds.kernels = kernels
        return sum(kernels.values())
    seconds.wall, seconds.kernels = None, {}
    return seconds


def elementwise(device: str, gpu, sizes) -> list[dict]:
    import torch

    from trainfit.analytic.roofline import memory_seconds

    seconds, rows = timer(device), []
    for dtype in (torch.bfloat16, torch.float32):
        el = torch.finfo(dtype).bits // 8
        for n in sizes:
            x, y, z = (torch.randn(n, device=device).to(dtype) for _ in range(3))
            x32 = torch.randn(n, device=device)
            ops = {"copy": (lambda: z.copy_(x), 2 * n * el),
                   "add": (lambda: torch.add(x, y, out=z), 3 * n * el),
                   "scale_": (lambda: z.mul_(1.0001), 2 * n * el)}
            if dtype == torch.bfloat16:
                ops["cast_fp32_bf16"] = (lambda: z.copy_(x32), n * (4 + el))
            for op, (fn, nbytes) in ops.items():
                t = seconds(fn, reps=20)
                rows.append({"op": op, "dtype": str(dtype).split(".")[-1], "elements": n, "bytes": nbytes,
                             "seconds": t, "wall_seconds": seconds.wall, "bytes_per_second": nbytes / t,
                             "predicted_seconds": memory_seconds(gpu, nbytes, kernels=1)})
    return rows


def step_ops(device: str, gpu, tokens: int, widths) -> list[dict]:
    """The memory-bound ops an eager LLM step runs, at its sizes (tokens x width): RMSNorm's fp32 pieces (upcast,
    square, row mean, broadcast multiply), SiLU, the residual add, a head-major transpose copy (attention's
    (b, s, h, d) -> (b, h, s, d)), a row softmax (the loss), and column sums over the tokens (a bias's or a norm
weight's gradient): bytes counted as the tensors read and written."""
    import torch

    from trainfit.analytic.roofline import memory_seconds

    seconds, rows = timer(device), []
    for w in widths:
        xb, yb = (torch.randn(tokens, w, device=device, dtype=torch.bfloat16) for _ in range(2))
        xf = xb.float()
        r = torch.randn(tokens, 1, device=device)
        n = tokens * w
        ops = {"upcast_bf16_fp32": (lambda: xb.float(), n * 6),
               "square_fp32": (lambda: xf.pow(2), n * 8),
               "mean_last_fp32": (lambda: xf.mean(-1, keepdim=True), n * 4 + tokens * 4),
               "broadcast_mul_fp32": (lambda: xf * r, n * 8 + tokens * 4),
               "silu_bf16": (lambda: torch.nn.functional.silu(xb), n * 4),
               "add_bf16": (lambda: xb + yb, n * 6),
               "transpose_copy_bf16": (lambda: xb.view(2, tokens // 2, -1, 64).transpose(1, 2).contiguous(), n * 4),
               "softmax_fp32": (lambda: torch.log_softmax(xf, -1), n * 8),
               "colsum_bf16": (lambda: xb.sum(0), n * 2 + w * 2),
               "colsum_fp32": (lambda: xf.sum(0), n * 4 + w * 4)}
        for op, (fn, nbytes) in ops.items():
            t = seconds(fn, reps=20)
            rows.append({"op": op, "tokens": tokens, "width": w, "bytes": nbytes, "seconds": t,
                         "bytes_per_second": nbytes / t, "predicted_seconds": memory_seconds(gpu, nbytes, kernels=1),
                         "kernels": seconds.kernels})
    return rows


def _sdpa_backends(device: str, names: tuple[str, ...]) -> dict:
    """name -> torch's SDPBackend to pin (None: torch's own pick); on CPU only the default."""
    from torch.nn.attention import SDPBackend

    pinned = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
              "efficient": SDPBackend.EFFICIENT_ATTENTION}
    return {n: pinned.get(n) for n in names if n == "default" or device == "cuda"}


def _time_sdpa(seconds, device: str, shape, dtype, dropout: float, backends: dict) -> list[dict]:
    """One causal SDPA call on `shape` (b, h, s, d) in HF's layout, forward and forward + backward, per backend: its
    kernel times (the backward's: the pair's less the forward's) and kernels, or the error of a backend that does
    not take this shape, dtype, dropout or GPU."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    b, h, s, d = shape
    # HF's layout: the projections' (b, s, h, d) output viewed as (b, h, s, d) (transformers' attention modules)
    q, k, v = (torch.randn(b, s, h, d, device=device, dtype=dtype).transpose(1, 2).requires_grad_() for _ in range(3))
    g = torch.randn(b, h, s, d, device=device, dtype=dtype)
    rows = []
    for name, be in backends.items():
        ctx = (lambda: sdpa_kernel(be)) if be is not None else (lambda: _nullcontext())

        def fwd():
            with ctx():
                return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)

        def fwd_bwd():
            torch.autograd.grad(fwd(), (q, k, v), g)
        try:
            tf = seconds(fwd, reps=5)
            fwd_kernels = seconds.kernels
            tb = seconds(fwd_bwd, reps=5) - tf
        except RuntimeError as e:
            rows.append({"backend": name, "shape": list(shape), "error": str(e).splitlines()[0][:160]})
            continue
        rows.append({"backend": name, "shape": list(shape), "fwd_seconds": tf, "bwd_seconds": tb,
                     "fwd_kernels": fwd_kernels, "kernels": seconds.kernels})
    return rows


def sdpa(device: str, gpu, shapes) -> list[dict]:
    import torch

    from trainfit.analytic.roofline import attention_seconds

    seconds, rows = timer(device), []
    backends = _sdpa_backends(device, ("default", "cudnn", "flash", "efficient"))
    for b, h, s, d in shapes:
        pred = {p: attention_seconds(gpu, "flash", b * h, s, s, d, True, "bf16", backward=p == "bwd")
                for p in ("fwd", "bwd")}
        flops = 4 * b * h * s * s * d / 2  # causal: half of QK^T and PV (FA2 paper's FLOP count)
        for r in _time_sdpa(seconds, device, (b, h, s, d), torch.bfloat16, 0.0, backends):
            if "error" not in r:
                r.update(fwd_tflops=flops / r["fwd_seconds"] / 1e12,
                         bwd_tflops=2.5 * flops / max(r["bwd_seconds"], 1e-12) / 1e12,
                         predicted_fwd_seconds=pred["fwd"], predicted_bwd_seconds=pred["bwd"])
            rows.append(r)
    return rows


def sdpa_variants(device: str, gpu, shapes) -> list[dict]:
    """What the sdpa section leaves out, for the kernel models to be checked on: fp32 (the memory-efficient kernel's
    3xTF32 matmuls, roofline._attention_peak) and dropout 0.1 inside the kernel (kernels.toml [dropout]), by backend:
    torch's default pick and the memory-efficient kernel. Kernel time from torch.profiler, as in sdpa."""
    import torch

    seconds, rows = timer(device), []
    backends = _sdpa_backends(device, ("default", "efficient"))
    for shape in shapes:
        for dtype, p in (("fp32", 0.0), ("fp32", 0.1), ("bf16", 0.0), ("bf16", 0.1)):
            tdt = torch.float32 if dtype == "fp32" else torch.bfloat16
            rows += [{**r, "dtype": dtype, "dropout": p} for r in _time_sdpa(seconds, device, shape, tdt, p, backends)]
    return rows


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def linear_shapes(model: str) -> list[tuple[str, int, int]]:
    """(name, out_features, in_features) of each distinct linear layer of `model` (built on the meta device)."""
    import torch

    from trainfit.models.resolve import load_model
    from trainfit.setup import Setup
    from trainfit.step.build import build_model

    spec = load_model(model)
    net = build_model(spec, Setup(precision="bf16"), device="meta")
    seen = {}
    for name, mod in net.named_modules():
        w = getattr(mod, "weight", None)
        if isinstance(mod, torch.nn.Linear) or type(mod).__name__ == "Conv1D":  # GPT-2's Conv1D is a linear
            out_f, in_f = (w.shape[1], w.shape[0]) if type(mod).__name__ == "Conv1D" else tuple(w.shape)
            seen.setdefault((out_f, in_f), name.split(".")[-1])
    return [(n, o, i) for (o, i), n in seen.items()]


def gemm(device: str, gpu, models, tokens: int) -> list[dict]:
    import torch

    from trainfit.analytic.roofline import gemm_seconds

    seconds, rows = timer(device), []
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    for model in models:
        for name, n, k in linear_shapes(model):
            x = torch.randn(tokens, k, device=device, dtype=dtype)
            w = torch.randn(n, k, device=device, dtype=dtype)
            dy = torch.randn(tokens, n, device=device, dtype=dtype)
            # Y = X W^T (m=tokens, n, k); dX = dY W (m=tokens, n=k, k=n); dW = dY^T X (m=n, n=k, k=tokens)
            for which, fn, (mm, nn, kk) in (("fwd", lambda: x @ w.t(), (tokens, n, k)),
                                             ("dgrad", lambda: dy @ w, (tokens, k, n)),
                                             ("wgrad", lambda: dy.t() @ x, (n, k, tokens))):
                t = seconds(fn, reps=10)
                rows.append({"model": model, "layer": name, "pass": which, "mnk": [mm, nn, kk], "seconds": t,
                             "wall_seconds": seconds.wall, "kernel": max(seconds.kernels, key=seconds.kernels.get,
                                                                        default=None),
                             "tflops": 2 * mm * nn * kk / t / 1e12,
                             "predicted_seconds": gemm_seconds(gpu, mm, nn, kk, "bf16")})
    return rows


def lora(device: str, gpu, model: str, tokens: int, ranks, dtypes) -> list[dict]:
    """The six GEMMs of a LoRA pair (peft lora/layer.py Linear: B(A(x))) on each of `model`'s linear shapes, per
    rank and dtype: forward x·Aᵀ (tokens, r, in) and h·Bᵀ (tokens, out, r); backward B's dgrad (tokens, r, out) and
    wgrad (out, r, tokens), A's dgrad (tokens, in, r) and wgrad (r, in, tokens). One thin dimension each: peft keeps
    the adapters in fp32 and casts the input to them without autocast (analytic/lora_ops.py), so fp32 runs too."""
    import torch

    from trainfit.analytic.roofline import gemm_seconds

    seconds, rows = timer(device), []
    for dt in dtypes:
        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dt]
        for name, n, k in {(n, k): (name, n, k) for name, n, k in linear_shapes(model)}.values():
            for r in ranks:
                def mat(a, b):
                    return torch.randn(a, b, device=device, dtype=dtype)
                x, h, dy, dh, a_w, b_w = mat(tokens, k), mat(tokens, r), mat(tokens, n), mat(tokens, r), mat(r, k), \
                    mat(n, r)
                for which, fn, mnk in (("A.fwd", lambda: x @ a_w.t(), (tokens, r, k)),
                                       ("B.fwd", lambda: h @ b_w.t(), (tokens, n, r)),
                                       ("B.dgrad", lambda: dy @ b_w, (tokens, r, n)),
                                       ("B.wgrad", lambda: dy.t() @ h, (n, r, tokens)),
                                       ("A.dgrad", lambda: dh @ a_w, (tokens, k, r)),
                                       ("A.wgrad", lambda: dh.t() @ x, (r, k, tokens))):
                    t = seconds(fn, reps=10)
                    rows.append({"model": model, "layer": name, "rank": r, "dtype": dt, "pass": which,
                                 "mnk": list(mnk), "seconds": t, "wall_seconds": seconds.wall,
                                 "kernel": max(seconds.kernels, key=seconds.kernels.get, default=None),
                                 "predicted_seconds": gemm_seconds(gpu, *mnk, dt)})
    return rows


def adamw(device: str, gpu, model: str, lora_ranks=()) -> list[dict]:
    """torch's AdamW step (fused and foreach, fp32 and bf16) over `model`'s parameters, then over the LoRA adapters
    peft adds at each rank of `lora_ranks` on every linear layer but the head (A: r x in, B: out x r, fp32): many
    small tensors, each under one multi_tensor_apply chunk (65,536 elements, ATen's MultiTensorApply.cuh)."""
    import torch

    from trainfit.models.resolve import load_model
    from trainfit.setup import Setup
    from trainfit.step.build import build_model

    spec = load_model(model)
    net = build_model(spec, Setup(precision="bf16"), device="meta")
    lists = [("model", None, [p.shape for p in net.parameters()], (torch.float32, torch.bfloat16))]
    linears = [tuple(m.weight.shape) for name, m in net.named_modules()
               if isinstance(m, torch.nn.Linear) and not name.endswith("lm_head")]
    lists += [(f"lora r{r}", r, [s for out_f, in_f in linears for s in ((r, in_f), (out_f, r))], (torch.float32,))
              for r in lora_ranks]
    seconds, rows = timer(device), []
    for what, rank, shapes, dtypes in lists:
        for dtype in dtypes:
            # random values, not zeros: on zeros the step's sqrt(0) and 0 / x take CUDA's slower special-value paths
            # (the runs up to H200-2026-11-27-e2d374c2-kernels: fused AdamW 1.2-2x its time inside real steps;
            # docs/benchmarks/gpu-truth.md)
            params = [(torch.randn(s, device=device, dtype=dtype) * 0.02).requires_grad_() for s in shapes]
            for p in params:
                p.grad = torch.randn_like(p) * 1e-3
            n = sum(p.numel() for p in params)
            for kind in (("fused", "foreach") if device == "cuda" else ("foreach",)):
                opt = torch.optim.AdamW(params, lr=1e-4, **{kind: True})
                t = seconds(opt.step, reps=3 if rank is None else 10)
                el = torch.finfo(dtype).bits // 8
                rows.append({"model": model, "params_of": what, "rank": rank, "dtype": str(dtype).split(".")[-1],
                             "kernel": kind, "params": n, "tensors": len(params), "seconds": t,
                             "wall_seconds": seconds.wall, "kernels": seconds.kernels,
                             # fused: read p, g, m, v and write p, m, v once (torch/optim/adam.py _fused_adam)
                             "stream_bytes": 7 * n * el, "bytes_per_second": 7 * n * el / t})
                del opt
            del params
    return rows


def board_nvml(device: str):
    """(pynvml, handle) for reading the board while a section runs, or None: on CPU, or where NVML is unavailable
    (the sections' own timings still stand without it)."""
    nvml = nvml_device() if device == "cuda" else None
    return None if isinstance(nvml, str) else nvml


def clock_and_power(nvml) -> dict:
    """NVML's SM clock (MHz) and board power (W) now; {} without NVML."""
    if not nvml:
        return {}
    lib, h = nvml
    return {"sm_mhz": lib.nvmlDeviceGetClockInfo(h, lib.NVML_CLOCK_SM), "watts": lib.nvmlDeviceGetPowerUsage(h) / 1e3}


# (id, model, settings): the steps `sustained_step` repeats. The first, the truth harness's llama-3.1-8b bf16 case at
# twice its tokens, spends about half its time in GEMMs; the second, llama-3.2-3b at 16k tokens a step, mostly GEMMs.
SUSTAINED_STEPS = (("llama-3.1-8b-bf16-2x2048", "llama-3.1-8b", dict(batch=2, seq=2048, precision="bf16")),
                   ("llama-3.2-3b-bf16-8x2048", "llama-3.2-3b", dict(batch=8, seq=2048, precision="bf16")))
DRY_SUSTAINED_STEPS = (("tiny-llama-bf16", "tiny-llama", dict(batch=2, seq=64, precision="bf16")),)  # CPU, the harness


def sustained_step(device: str, gpu, seconds: float, steps=SUSTAINED_STEPS) -> list[dict]:
    """Each of `steps` run back to back for `seconds` after one warm-up step: per step its wall time (the device
    synchronised) and, on a GPU, NVML's SM clock and board power read after it; beside them the analytic engine's
    step time and GEMM share (the kernels timed cold, kernels.toml). A step that slows as the board reaches its power
    limit shows here as the later steps' time over the first ones', with the clock it settled at."""
    import torch

    from trainfit.analytic.step_time import layout_step_time
    from trainfit.models.resolve import load_model
    from trainfit.setup import Setup
    from trainfit.step import stack_step

    nvml = board_nvml(device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    out = []
    for case, model_name, settings in steps:
        spec, setup = load_model(model_name), Setup(**settings, device=device)
        step = stack_step(setup)
        model, optimizer, batches = step.prepare(spec, setup, device=device)
        step.run_step(model, optimizer, batches, setup)  # warm-up: the allocator, cuBLAS's heuristics
        sync()
        rows, start = [], time.perf_counter()
        while time.perf_counter() - start < seconds:
            t0 = time.perf_counter()
            step.run_step(model, optimizer, batches, setup)
            sync()
            now = time.perf_counter()
            rows.append({"t": round(now - start, 3), "step_seconds": now - t0, **clock_and_power(nvml)})
        del model, optimizer, batches
        if device == "cuda":
            torch.cuda.empty_cache()
        predicted = layout_step_time(spec, setup, gpu)
        terms = predicted.compute_terms
        out.append({"case": case, "model": model_name, "settings": settings, "steps": rows,
                    "predicted_step_seconds": predicted.step_seconds,
                    "predicted_gemm_share": (terms.get("gemm", 0.0) + terms.get("attention", 0.0))
                    / predicted.step_seconds if predicted.step_seconds else None})
    return out


def sustained(device: str, seconds: float) -> dict:
    """A large bf16 GEMM (8,192 cubed; 128 cubed in the dry run) back to back for `seconds`: its rate per ~1 s window
    beside the SM clock, board power and temperature NVML reads at the window's end. The chip-to-chip spread of the
    rate under a power cap is what analytic/stragglers.py's compute_spread measures (kernels.toml [cluster]); the
    first and last windows show how far a chip falls from its cold rate when it heats."""
    import torch

    n = 8192 if device == "cuda" else 128
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    nvml = board_nvml(device)  # without NVML the rates alone still say the spread
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    windows, start = [], time.perf_counter()
    while time.perf_counter() - start < seconds:
        sync()
        t0, calls = time.perf_counter(), 0
        while time.perf_counter() - t0 < min(1.0, seconds):
            for _ in range(20):
                a @ b
            calls += 20
            sync()
        dt = time.perf_counter() - t0
        w = {"t": round(time.perf_counter() - start, 2), "tflops": 2 * n**3 * calls / dt / 1e12}
        w.update(clock_and_power(nvml))
        if nvml:
            lib, h = nvml
            w["temp_c"] = lib.nvmlDeviceGetTemperature(h, lib.NVML_TEMPERATURE_GPU)
        windows.append(w)
    out = {"n": n, "dtype": str(dtype).split(".")[-1], "windows": windows}
    if nvml:
        lib, h = nvml
        out["power_limit_watts"] = lib.nvmlDeviceGetEnforcedPowerLimit(h) / 1e3
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="tiny sizes on CPU (no GPU needed)")
    ap.add_argument("--only", default=None,
                    help="one section: elementwise, step_ops, sdpa, sdpa_variants, gemm, adamw, lora, host, sustained or "
                         "sustained_step")
    ap.add_argument("--out", type=Path, default=RESULTS, help="folder for the .json results")
    args = ap.parse_args(argv)

    import torch

    dry = args.dry_run
    resolved = device_and_gpu(dry)
    if resolved is None:
        return 2
    device, name, gpu = resolved
    sections = {
        "elementwise": lambda: elementwise(device, gpu, [2**12] if dry else [2**k for k in range(18, 29, 2)]),
        "step_ops": lambda: step_ops(device, gpu, 64 if dry else 2048, (128,) if dry else (768, 2048, 4096, 8192)),
        "sdpa": lambda: sdpa(device, gpu, [(1, 2, 64, 32)] if dry else
                             [(16384 // s, 16, s, d) for d in (64, 128) for s in (512, 1024, 2048, 4096, 8192)]
                             + [(2, 32, 1024, 64), (2, 12, 1024, 128), (2, 24, 1024, 128), (2, 32, 1024, 128)]),
        "sdpa_variants": lambda: sdpa_variants(device, gpu, [(1, 2, 64, 32)] if dry else
                                               [(16384 // s, 16, s, d) for d in (64, 128) for s in (512, 1024, 2048, 4096)]
                                               + [(b, 12, s, 64) for b, s in ((2, 1024), (4, 1024), (8, 1024), (2, 2048))]
                                               + [(2, 16, 1024, 128)]),
        "gemm": lambda: gemm(device, gpu, ("tiny-gpt2",) if dry else MODELS, 64 if dry else 2048),
        "adamw": lambda: adamw(device, gpu, "tiny-llama" if dry else "llama-3.2-1b", (4,) if dry else (16, 64)),
        "lora": lambda: lora(device, gpu, "tiny-llama" if dry else "llama-3.2-1b", 64 if dry else 2048,
                             (4,) if dry else (8, 16, 64), ("fp32",) if dry else ("fp32", "bf16")),
        "host": lambda: host(device),
        "sustained": lambda: sustained(device, 0.3 if dry else 20.0),  # last: its heat does not reach the others
        "sustained_step": lambda: sustained_step(device, gpu, 0.3 if dry else 30.0,
                                                 DRY_SUSTAINED_STEPS if dry else SUSTAINED_STEPS),
    }
    out, t0 = {"gpu": gpu.name, "device_name": name, "dry_run": dry, "torch": torch.__version__}, time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    if device == "cuda":  # which chip (manifest.toml): the same NVML read as the truth harness's
        out["uuid"] = device_totals(device).get("uuid")
    chip = "none" if dry else data.chip_id(out.get("uuid"))
    path = args.out / data.gpu_file_name(gpu.name, str(_dt.date.today()), chip, "kernels",
                                         "-".join(filter(None, ["dry-run" if dry else "", args.only or ""])))
    for sec, fn in sections.items():
        if args.only and sec != args.only:
            continue
        print(f"{sec} ...", file=sys.stderr, flush=True)
        out[sec] = fn()
        out["minutes"] = round((time.perf_counter() - t0) / 60, 2)
        path.write_text(json.dumps(out, indent=1))  # after every section: a run cut off keeps what it measured
        if device == "cuda":
            torch.cuda.empty_cache()
    print(f"wrote {path} ({out.get('minutes', 0):.1f} min)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
