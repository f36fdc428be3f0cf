"""CUDA truth (issue 18): real steps on a GPU against every prediction trainfit makes for them.

    python -m bench run cuda_truth                  # on a CUDA machine: the matrix below, ~8 minutes on one H100
    python -m bench run cuda_truth --dry-run        # anywhere: the same harness, tiny models, --device cpu semantics
    python -m bench run cuda_truth --only llama     # cases whose id contains "llama"; --max-minutes N stops early
    python -m bench run cuda_truth --only fp8       # torchao float8 (tensorwise, rowwise) on torchtitan's step and its
                                                    # base, TinyLlama 2 x 1024: about 1 minute on one H200 (sm89+)

For each case (HF models of four families from 124M to 3B with random weights; fp32 / amp-bf16 / bf16 / bf16-master;
flash vs eager attention; foreach vs fused AdamW; recompute none / full; the torchtitan stack on one rank, also
with torchao's Float8Linear (--low-precision tensorwise / rowwise, eager: fp8_cases, fp8_deltas); peft
LoRA and bitsandbytes QLoRA; inference prefill + decode) it runs the measure engine's real step (torch's
max_memory_allocated per phase, max_memory_reserved, the device memory in use as cudaMemGetInfo reports it, the
median step time) and one step under torch.profiler (kernel time by kind: GEMMs, attention, the rest), then puts
beside them the trace engine's peak and simulated reserved (--device cuda semantics), and the analytic engine's
peak, reserved, device total, step time and its time by kind. Writes bench/results/gpu/<gpu>-<date>-<chip>-truth.json (its
markdown table on demand: --render FILE)
(BENCHMARKS.md links them). Targets (issue 18): allocated within 1 % (trace) and 3 % (analytic), reserved within
5 %, kernel time by kind within 15 % for the large ops.

The dry run executes every step of that path on CPU (the CPU profiler's op times stand in for kernels, the catalog
H100 for the GPU the analytic times are computed on) so CI keeps the harness working for the day a GPU is at hand.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import re
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from bench import data
from bench.gpu.device import device_and_gpu, device_totals, host as host_issue

ABOUT = {"summary": "real steps on a GPU against every prediction (needs CUDA; --dry-run on CPU)",
         "minutes": 8, "quick": ["--dry-run"]}

RESULTS = data.results_dir() / data.GPU_DIR


@dataclass(frozen=True)
class Case:
    id: str
    model: str
    settings: dict = field(default_factory=dict)
    needs: tuple[str, ...] = ()  # importable packages the case needs (skipped without them)


def cuda_cases() -> list[Case]:
    base = dict(batch=2, seq=1024)
    out = [Case(f"{m}-amp-bf16", m, dict(base, precision="amp-bf16"))
           for m in ("gpt2", "llama-3.2-1b", "qwen2.5-1.5b", "llama-3.2-3b")]
    m = "llama-3.2-1b"
    out += [Case(f"{m}-{p}", m, dict(base, precision=p)) for p in ("fp32", "bf16", "bf16-master")]
    out += [Case(f"{m}-amp-bf16-eager", m, dict(base, precision="amp-bf16", attention="eager")),
            Case(f"{m}-amp-bf16-foreach", m, dict(base, precision="amp-bf16", optimizer_impl="foreach")),
            Case(f"{m}-amp-bf16-full-recompute", m, dict(base, precision="amp-bf16", recompute="full")),
            Case("tinyllama-1.1b-torchtitan", "tinyllama-1.1b", dict(base, precision="amp-bf16", stack="torchtitan"),
                 ("torchtitan",)),  # torchtitan's llama3 has no tied embeddings: an untied Llama
            Case(f"{m}-lora", m, dict(base, precision="bf16", lora_rank=16), ("peft",)),
            Case(f"{m}-qlora", m, dict(base, precision="bf16", lora_rank=16, quant="nf4", kbit_prep="peft"),
                 ("peft", "bitsandbytes")),
            Case(f"{m}-infer", m, dict(batch=8, seq=1024, precision="bf16", mode="infer")),
            Case("gpt2-amp-bf16-eager", "gpt2", dict(base, precision="amp-bf16", attention="eager")),
            Case("gpt2-fp32", "gpt2", dict(base, precision="fp32")),
            Case("llama-3.1-8b-bf16", "llama-3.1-8b", dict(base, precision="bf16")),
            Case("qwen2.5-1.5b-infer", "qwen2.5-1.5b", dict(batch=8, seq=1024, precision="bf16", mode="infer"))]
    return out + fp8_cases("tinyllama-1.1b", base)


FP8 = ("tensorwise", "rowwise")  # torchao's float8 recipes on torchtitan's step (trainfit/step/torchtitan_lowp.py)


def fp8_cases(model: str, base: dict, precision: str = "amp-bf16") -> list[Case]:
    """torchtitan with torchao's Float8Linear (--low-precision) beside the same step without it, all ids holding
    "fp8" (`--only fp8`): the base case's kinds against the recipes' give what the recipe changed, measured
    (fp8_deltas) and predicted. torchtitan's one-GPU step runs under autocast (its maybe_enable_amp): amp-bf16."""
    needs = ("torchtitan", "torchao")
    s = dict(base, precision=precision, stack="torchtitan")
    return [Case(f"{model}-torchtitan-fp8-base", model, s, needs)] + \
        [Case(f"{model}-torchtitan-fp8-{r}", model, dict(s, low_precision=r), needs) for r in FP8]


def recorded_settings(settings: dict) -> dict:
    """A committed case's settings as the step it measured ran them: runs before the hf step clipped its gradients
    (2026-11-27 and earlier; the key max_grad_norm recorded since) ran hf training steps without clipping, so those
    get max_grad_norm 0 (torchtitan's step always clipped, its default 1.0); quantised bases recorded without a
    kbit_prep key ran no preparation."""
    if settings.get("quant") in ("nf4", "fp4", "int8") and "kbit_prep" not in settings:
        # runs before --kbit-prep (the key recorded since) built the quantised base without peft's preparation
        settings = {**settings, "kbit_prep": "none"}
    if settings.get("mode", "train") in ("train", "rl") and settings.get("stack", "hf") == "hf" \
            and "max_grad_norm" not in settings:
        return {**settings, "max_grad_norm": 0.0}
    return settings


def dry_run_cases() -> list[Case]:
    base = dict(batch=1, seq=128, device="cpu")
    return [Case("tiny-llama-fp32", "tiny-llama", dict(base, precision="fp32")),
            Case("tiny-llama-amp-bf16-full-recompute", "tiny-llama", dict(base, precision="amp-bf16", recompute="full")),
            Case("tiny-gpt2-amp-bf16", "tiny-gpt2", dict(base, precision="amp-bf16")),
            Case("tiny-llama-lora", "tiny-llama", dict(base, precision="bf16", lora_rank=8), ("peft",)),
            Case("tiny-llama-infer", "tiny-llama", dict(batch=2, seq=128, device="cpu", precision="bf16", mode="infer"))] \
        + fp8_cases("tiny-llama", base, precision="bf16")  # NB: bf16 on CPU: torchao's Float8Linear follows only
    # CUDA's autocast (float8_linear.py:258-262 torch.is_autocast_enabled()), so under CPU autocast it runs fp32


# ---- kernel time by kind -----------------------------------------------------------------------------------------

OPTIMIZER = ("multi_tensor_apply", "fusedopti", "adam", "optim")  # the optimizer step's kernels
GEMM = ("gemm", "cutlass", "cublas", "xmma", "sm90_", "sm80_", "aten::mm", "aten::addmm", "aten::bmm", "aten::matmul",
        "aten::linear",
        # fp8 GEMMs: torch._scaled_mm (torchao's Float8Linear; the aten op on CPU) runs cuBLASLt's fp8 kernels
        # (sm90_xmma_gemm_e4m3..., nvjet_..., matched above or here) or, with row scales, aten's cutlass kernel
        "scaled_mm", "nvjet")
# NB: torchao's amax and fp8 casts (eager: abs, max/amax, reciprocal, mul, clamp, copies to Float8_e4m3fn;
# compiled: triton_red_fused_abs_max..., triton_poi_fused__to_copy_clamp...) are memory-bound kernels: "other",
# where the analytic op list times them (analytic/ops/gemm.py fp8_casts, ops/torchao_casts.py)
# NB: softmax kernels (the loss's log-softmax, eager attention's softmax) count as "other": under eager attention
# the kinds are not comparable (its q·k and p·v run as GEMMs here and as attention in the analytic split)
ATTENTION = ("flash", "fmha", "attention", "attn", "sdpa")


# profiler rows with a device time that are not kernels: a record_function range's span on the GPU (with CPU
# activity on, Kineto's gpu_user_annotation, e.g. torch/optim/optimizer.py's `Optimizer.step#AdamW.step`: its
# kernels' time again), the profiler's own buffer requests, and CUPTI's "Command Buffer Full" (the host waiting on
# a full launch queue: a GPU-bound step). The H200 runs of 2026-11-27 counted the first and the last as kernels. Also
# a custom op's record, as aten's (skipped by name where the profile is read): bitsandbytes::gemm_4bit, ::dequantize_4bit
# and ::dequantize_blockwise in the QLoRA step carry their kDequantizeBlockwise kernels' time again (1.49 + 1.24 + 0.23
# ms against 2.49 + 0.47 ms of those kernels in H200-2026-11-27-unrecorded-10-truth.json), gemm_4bit's sorted as a GEMM.
NOT_KERNELS = ("Optimizer.", "ProfilerStep", "Activity Buffer Request", "Command Buffer Full", "bitsandbytes::")


def not_a_kernel(name: str) -> bool:
    return name.startswith(NOT_KERNELS)


def kind_of(name: str) -> str:
    n = name.lower()
    if any(k in n for k in OPTIMIZER):
        return "optimizer"
    if any(k in n for k in ATTENTION):
        return "attention"
    if any(k in n for k in GEMM):
        return "gemm"
    return "other"


def profile_kinds(spec, setup, device: str) -> dict:
    """Seconds by kind over one real step: CUDA kernels on a GPU; on CPU the top-level aten ops' self time. Also the
    kernels launched, the largest ones by name, and the host's time to issue one step (timed before the device
    synchronises: when it is near the step time, the step is bound by the host's launches, not by the kernels)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from trainfit.step import stack_step

    step = stack_step(setup)
    model, optimizer, batches = step.prepare(spec, setup, device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    step.run_step(model, optimizer, batches, setup)  # warm-up
    sync()
    t0 = time.perf_counter()
    step.run_step(model, optimizer, batches, setup)
    host = time.perf_counter() - t0
    sync()
    wall = time.perf_counter() - t0
    # CPU activity beside CUDA: the aten ops that launched the kernels and the runtime calls (cudaLaunchKernel,
    # cudaMemsetAsync, ...) the host issued, i.e. what the host-issue bound counts (analytic/step_time.py host_issue)
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA] if device == "cuda" else [ProfilerActivity.CPU]
    # record_shapes: each aten op's input shapes, strides and dtypes beside the kernels it launched itself, so the
    # bytes a memory-bound op moves can be set against its kernel time (the "other" kind's achieved bandwidth)
    with profile(activities=activities, record_shapes=True) as prof:
        step.run_step(model, optimizer, batches, setup)
        sync()
    by_shape: dict[tuple, list] = {}
    for ev in prof.events():
        t = getattr(ev, "self_device_time_total", 0) if device == "cuda" else 0
        if t and ev.name.startswith("aten::"):
            key = (ev.name, str(ev.input_shapes), str(getattr(ev, "input_dtypes", None)),
                   str(getattr(ev, "structured_input_strides", None) or ""))
            acc = by_shape.setdefault(key, [0, 0.0])
            acc[0] += 1
            acc[1] += t / 1e6
    aten_kernels = [{"op": k[0], "shapes": k[1], "dtypes": k[2], "strides": k[3], "count": n, "seconds": sec}
                    for k, (n, sec) in sorted(by_shape.items(), key=lambda kv: -kv[1][1])]
    out = {"gemm": 0.0, "attention": 0.0, "other": 0.0, "optimizer": 0.0}
    kernels, top, aten, runtime = 0, [], {}, {}
    for ev in prof.key_averages():
        if ev.key.startswith("aten::"):
            aten[ev.key] = ev.count
        elif ev.key.startswith("cuda") and not getattr(ev, "self_device_time_total", 0):
            runtime[ev.key] = ev.count  # CUDA runtime API calls on the host
        if device == "cuda":
            t = getattr(ev, "self_device_time_total", 0) or getattr(ev, "self_cuda_time_total", 0)
            if not t or ev.key.startswith("aten::") or getattr(ev, "is_user_annotation", False) \
                    or not_a_kernel(ev.key):
                continue  # kernels only (aten ops' and annotated ranges' device time is their kernels')
        else:
            t = ev.self_cpu_time_total
            if not ev.key.startswith("aten::"):
                continue
        out[kind_of(ev.key)] += t / 1e6
        kernels += ev.count
        top.append((t / 1e6, ev.count, ev.key[:120]))
    del model, optimizer, batches
    top.sort(reverse=True)
    # every kernel by name (not only the largest): the analytic kernel count is checked against the whole list
    return {"kinds": out, "kernels": kernels, "host_seconds": host, "wall_seconds": wall,
            "top": [{"seconds": t, "count": n, "name": k} for t, n, k in top],
            "aten_ops": dict(sorted(aten.items(), key=lambda kv: -kv[1])), "runtime_calls": runtime,
            "aten_kernels": aten_kernels[:150]}


def profile_infer(spec, setup, device: str) -> dict:
    """Kernels of an inference step's prefill and of its decode step, each profiled on its own (the step's phase
    callback starts and stops the profiler): their count, summed kernel time, and the pass's wall time."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from trainfit.measure.infer import prepare_inference
    from trainfit.step.infer import inference_step

    model, ids = prepare_inference(spec, setup, device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    inference_step(model, ids, setup, spec.causal)  # warm-up
    sync()
    act = [ProfilerActivity.CUDA] if device == "cuda" else [ProfilerActivity.CPU]
    running, passes = [], {}  # the pass being profiled: (name, profiler, start)

    def phase(name: str) -> None:
        sync()
        now = time.perf_counter()
        if running:
            done, prof, start = running.pop()
            prof.stop()
            passes[done] = (prof, now - start)
        if name != "end":
            prof = profile(activities=act)
            prof.start()
            running.append((name, prof, now))

    inference_step(model, ids, setup, spec.causal, phase=phase)
    out = {}
    for name, (prof, wall) in passes.items():
        rows = [e for e in prof.key_averages() if (getattr(e, "self_device_time_total", 0) if device == "cuda"
                                                    else e.key.startswith("aten::")) and not not_a_kernel(e.key)]
        out[name] = {"kernels": sum(e.count for e in rows),
                     "kernel_seconds": sum(getattr(e, "self_device_time_total", 0) for e in rows) / 1e6,
                     "wall_seconds": wall}
    del model, ids
    return out


def _memory(mem) -> dict:
    return {k: getattr(mem, k, None) for k in ("weights", "gradients", "optimizer_states", "master_weights",
                                               "activations", "temporaries")} | \
        {"phase_peaks": getattr(mem, "phase_peaks", None)}


# ---- one case ------------------------------------------------------------------------------------------------------

def _err(pred, truth):
    return None if pred is None or not truth else (pred - truth) / truth


def process_memory(device: str) -> dict:
    """What the process already holds on the device before a case (after a collection and emptying the cache): the
    cuBLAS workspaces (made by warm_up, never freed) and whatever an earlier case left alive. The cases run in one
    process, so each case's measured peak and reserved are taken above this."""
    import gc

    import torch

    gc.collect()
    if device != "cuda":
        return {"allocated": 0, "reserved": 0}
    torch.cuda.empty_cache()
    return {"allocated": torch.cuda.memory_allocated(), "reserved": torch.cuda.memory_reserved()}


def warm_up(device: str) -> dict:
    """A forward and backward matmul: the forward's thread and autograd's device thread each take their cuBLAS
    workspace (overheads.allocator_held predicts 2 for a training step). Returns the bytes they hold."""
    import torch

    if device != "cuda":
        return {"allocated": 0, "reserved": 0}
    a = torch.randn(256, 256, device=device, requires_grad=True)
    (a @ a).sum().backward()
    torch.cuda.synchronize()
    del a
    return process_memory(device)


def run_case(case: Case, gpu, device: str, before: dict | None = None, steps: int = 2,
             snapshots: Path | None = None) -> dict:
    import importlib.util

    from trainfit.analytic.engine import estimate
    from trainfit.measure import measure
    from trainfit.measure.runner import StepOutOfMemoryError
    from trainfit.models.resolve import load_model
    from trainfit.overheads import allocator_held, with_device_total
    from trainfit.setup import TRAINING, Setup
    from trainfit.trace import trace_spec

    row = {"id": case.id, "model": case.model, "settings": case.settings}
    missing = [p for p in case.needs if importlib.util.find_spec(p) is None]
    if missing:
        return {**row, "skipped": f"needs {', '.join(missing)}"}
    spec = load_model(case.model)
    setup = Setup(**{"device": device, **case.settings})
    if setup.mode in TRAINING and setup.stack_facts.max_grad_norm:
        # the clipping the step ran, so that a replay estimates the same step whatever the defaults become
        row["settings"] = {**case.settings, "max_grad_norm": setup.grad_clip_norm}
    t0 = time.perf_counter()
    try:
        an = estimate(spec, setup, gpu=gpu)
        st = an.detail.step_time.as_dict() if an.detail.step_time else None
        row["analytic"] = {"peak": an.memory.peak, "phase": an.memory.peak_phase, "reserved": an.memory.reserved,
                           "decode_seconds": (setup.batch / an.time.decode_tokens_per_second
                                              if an.time and an.time.decode_tokens_per_second else None),
                           "passes": analytic_passes(an),
                           "device_total": an.memory.device_total,
                           "step_seconds": an.time.step_seconds if an.time else None,
                           "kinds": analytic_kinds(st or {}, gpu),
                           "memory": _memory(an.memory),
                           "step_time": st}
    except Exception as e:  # a refusal is a result too (the analytic engine does not model every case)
        row["analytic"] = {"error": str(e).splitlines()[0]}
    try:
        tr = with_device_total(trace_spec(spec, setup), gpu if device == "cuda" else None)
        row["trace"] = {"peak": tr.memory.peak, "phase": tr.memory.peak_phase, "reserved": tr.memory.reserved,
                        "device_total": tr.memory.device_total, "memory": _memory(tr.memory)}
    except Exception as e:
        row["trace"] = {"error": str(e).splitlines()[0]}
    try:
        m = measure(spec, setup, steps=steps, warmup=1, device=device)
        row["measured"] = {"peak": m.peak, "phase": m.peak_phase, "reserved": m.reserved_peak,
                           "device_used": m.device_used, "step_seconds": m.step_seconds,
                           "step_times": list(m.step_times), "decode_seconds": m.decode_seconds or None, "phase_peaks": m.phase_peaks,
                           "weights": m.weights, "gradients": m.gradients, "optimizer_states": m.optimizer_states,
                           "activations": m.activations, "kv_cache": m.kv_cache, "baseline": m.baseline}
        if device == "cuda":  # the segments the step left cached (released only by empty_cache), beside the trace's
            import torch

            from trainfit.alloc.replay import segment_histogram

            row["measured"]["segments"] = segment_histogram(s["total_size"] for s in torch.cuda.memory_snapshot())
            row["trace"]["segments"] = tr.detail.records.get("segments") if "error" not in row["trace"] else None
        if setup.mode == "train":
            prof = profile_kinds(spec, setup, device)
            row["measured"]["kinds"] = prof.pop("kinds")
            row["measured"]["profile"] = prof
        elif setup.mode == "infer":
            row["measured"]["passes"] = profile_infer(spec, setup, device)
    except StepOutOfMemoryError as e:
        row["measured"] = {"oom": str(e)}
    except Exception as e:
        row["measured"] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
                           "traceback": traceback.format_exc(limit=3)}
    if snapshots is not None and device == "cuda" and setup.mode == "train":  # for `trainfit explain`; a step that
        from bench.gpu.snapshots import record  # ran out of memory above leaves the OOM observer's snapshot

        row["snapshot"] = record(spec, setup, device, snapshots, case.id)
    meas, a, t = row.get("measured", {}), row.get("analytic", {}), row.get("trace", {})
    # the step's own tensors: the measured peak above what the process held before (workspaces, earlier cases'
    # leftovers) against the engines' peak; reserved likewise against the engines' reserved less the library
    # buffers they add (allocator_held: the workspaces, which the process already holds)
    before = before or {"allocated": 0, "reserved": 0}
    row["before"] = before
    held = sum(allocator_held(gpu if device == "cuda" else None, setup).values())
    own = {"peak": meas["peak"] - before["allocated"] if "peak" in meas else None,
           "reserved": meas["reserved"] - before["reserved"] if meas.get("reserved") else None,
           "device_used": (meas["device_used"] - before["reserved"] + held) if meas.get("device_used") else None}
    row["measured_own"] = own
    less = lambda x: None if x is None else x - held  # noqa: E731
    row["errors"] = {
        "trace_peak": _err(t.get("peak"), own["peak"]),
        "analytic_peak": _err(a.get("peak"), own["peak"]),
        "trace_reserved": _err(less(t.get("reserved")), own["reserved"]),
        "analytic_reserved": _err(less(a.get("reserved")), own["reserved"]),
        "analytic_device_total": _err(a.get("device_total"), own["device_used"]),
        "analytic_step": _err(a.get("step_seconds"), meas.get("step_seconds")) if device == "cuda" else None,
    }
    if device == "cuda" and a.get("kinds") and meas.get("kinds"):
        row["errors"]["kinds"] = {k: _err(a["kinds"].get(k), v) for k, v in meas["kinds"].items() if v}
    row["seconds"] = round(time.perf_counter() - t0, 1)
    return row


def fp8_deltas(rows: list[dict]) -> None:
    """For each --low-precision case, what the recipe changed against its base case (the same settings without it,
    fp8_cases), kind by kind, measured and predicted: the GEMMs (bf16 -> fp8 rate) and "other" (the amax and cast
    kernels added, the autocast weight copies the converted projections no longer make). Written into the row as
    row["fp8"] and, on a GPU, row["errors"]["fp8_delta"] (the predicted change against the measured, per kind)."""
    def key(r):
        return r["model"], tuple(sorted((k, v) for k, v in r["settings"].items()
                                        if k not in ("low_precision", "max_grad_norm")))

    bases = {key(r): r for r in rows if "settings" in r and r["settings"].get("low_precision", "none") == "none"}
    for r in rows:
        if r.get("settings", {}).get("low_precision", "none") == "none" or key(r) not in bases:
            continue
        b = bases[key(r)]
        out = {"base": b["id"]}
        for side, kinds in (("measured", lambda x: x.get("measured", {}).get("kinds")),
                            ("analytic", lambda x: x.get("analytic", {}).get("kinds"))):
            k8, k0 = kinds(r), kinds(b)
            out[side] = {k: k8[k] - k0.get(k, 0.0) for k in k8} if k8 and k0 else None
        r["fp8"] = out
        if r["settings"].get("device", "cuda") == "cuda" and out["measured"] and out["analytic"]:
            r.setdefault("errors", {})["fp8_delta"] = {k: _err(out["analytic"].get(k), v)
                                                      for k, v in out["measured"].items() if v}


def measured_kinds(measured: dict) -> dict | None:
    """A committed case's kernel seconds by kind. Where the profile lists every kernel (runs from 2026-11-27 on) they
    are summed again from it without the rows that are not kernels (NOT_KERNELS), which that day's first runs
    counted."""
    top = (measured.get("profile") or {}).get("top") or []
    if not any(not_a_kernel(t["name"]) for t in top):
        return measured.get("kinds")
    out = dict.fromkeys(("gemm", "attention", "other", "optimizer"), 0.0)
    for t in top:
        if not not_a_kernel(t["name"]):
            out[kind_of(t["name"])] += t["seconds"]
    return out


def analytic_passes(e) -> dict:
    """An analytic inference estimate's passes timed op by op (its detail.prefill and detail.decode), as dicts."""
    return {k: p.as_dict() if p else None for k, p in (("prefill", e.detail.prefill), ("decode", e.detail.decode))}


def analytic_kinds(step: dict, gpu=None) -> dict[str, float] | None:
    """An analytic step's kernel time (its detail.step_time.as_dict(): analytic/step_time.py compute_terms and the
    optimizer) in the profile's kinds; None under the flat --mfu/--efficiency override (no terms). A profile sums
    kernel durations, which hold only part of each kernel's launch term (kernels.toml kernel_floor_seconds on
    `gpu`): that part of every launch is counted with the memory-bound rest, the gaps between kernels not at all.
    NB: the GEMMs' and fused attention's own floors land in "other" too (a few percent of it)."""
    from trainfit.analytic import roofline

    terms = step.get("compute_terms") or {}
    if not terms:
        return None
    kn = roofline.kernels_for(gpu) if gpu is not None else None
    floor = kn.kernel_floor_seconds / kn.launch_seconds if kn and kn.kernel_floor_seconds else 1.0
    # the master's casts are TensorIterator copies, which the profile sorts with the other elementwise kernels
    casts = step.get("optimizer_casts", 0.0)
    return {"gemm": terms.get("gemm", 0.0), "attention": terms.get("attention", 0.0),
            "other": terms.get("memory", 0.0) + terms.get("launches", 0.0) * floor + casts,
            "optimizer": step.get("optimizer", 0.0) - casts}


# ---- the report --------------------------------------------------------------------------------------------------

def _pct(x) -> str:
    return "—" if x is None else f"{x:+.2%}"


def totals_lines(totals: dict, gpu) -> list[str]:
    """The device's own totals beside the catalog's (docs/benchmarks/fit-rule.md): CUDA's total (cudaMemGetInfo), nvidia-smi's
    (NVML), and the context at start (CUDA's total less its free memory before any case: this process's context
    alone) beside overheads.cuda_context; empty on CPU."""
    from trainfit.overheads import cuda_context

    if not totals.get("cuda_total"):
        return []
    at_start = totals["cuda_total"] - totals["cuda_free"]
    out = [f"Device: CUDA's total {totals['cuda_total']:,} B (catalog {gpu.memory:,}: "
           f"{_pct(_err(gpu.memory, totals['cuda_total']))}); context at start {at_start / 2**20:.1f} MiB "
           f"(catalog {cuda_context(gpu) / 2**20:.1f} MiB; "
           f"after a step {cuda_context(gpu, after_step=True) / 2**20:.1f})"]
    if totals.get("nvml_total"):
        out[0] += (f"; NVML's total {totals['nvml_total']:,} B (catalog's nvidia-smi {gpu.smi_memory:,}: "
                   f"{_pct(_err(gpu.smi_memory, totals['nvml_total']))})")
    return out + [""]


def render(rows: list[dict], gpu_name: str, dry: bool, minutes: float, totals: list[str] = (), date=None) -> str:
    head = [f"# CUDA truth: {gpu_name}{' (dry run on CPU)' if dry else ''}", "", *totals,
            f"`python -m bench run cuda_truth{' --dry-run' if dry else ''}`, {date or _dt.date.today()}, {minutes:.1f} min. "
            "Errors are (prediction − measured) / measured; targets: trace peak 1 %, analytic peak 3 %, reserved "
            "5 %, kernel time by kind 15 %. Measured peak and reserved: the step's own, above what the process held "
            "before the case (the cuBLAS workspaces, compared on their own, and earlier cases' leftovers)."
            + (" Dry run: CPU semantics, step times not compared." if dry else ""), "",
            "| case | measured peak | trace | analytic | reserved: trace / analytic | device total | step time | "
            "kinds (gemm / attention / other / optimizer) |", "|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        if "skipped" in r:
            head.append(f"| {r['id']} | skipped: {r['skipped']} | | | | | | |")
            continue
        m, e = r.get("measured", {}), r.get("errors", {})
        if "peak" not in m:
            head.append(f"| {r['id']} | {m.get('oom') or m.get('error')} | | | | | | |")
            continue
        kinds = e.get("kinds") or {}
        own = r.get("measured_own", {}).get("peak") or m["peak"]
        head.append(f"| {r['id']} | {own:,} ({m['phase']}) | {_pct(e['trace_peak'])} | "
                    f"{_pct(e['analytic_peak'])} | {_pct(e['trace_reserved'])} / {_pct(e['analytic_reserved'])} | "
                    f"{_pct(e['analytic_device_total'])} | {_pct(e['analytic_step'])} | "
                    f"{' / '.join(_pct(kinds.get(k)) for k in ('gemm', 'attention', 'other', 'optimizer')) if kinds else '—'} |")
    return "\n".join(head) + "\n"


def render_file(path: Path) -> str:
    """A committed run's markdown table, from its JSON alone (the catalog's figures beside its device totals are
    today's)."""
    from trainfit.hardware import get_gpu

    run = json.loads(Path(path).read_text())
    gpu = get_gpu(run["gpu"])
    date = re.search(r"\d{4}-\d{2}-\d{2}", Path(path).name)
    return render(run["cases"], run["gpu"], run["dry_run"], run["minutes"],
                  totals_lines(run.get("memory_totals") or {}, gpu), date and date[0])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="tiny models, --device cpu semantics (no GPU needed)")
    ap.add_argument("--only", default=None, help="run the cases whose id contains this text")
    ap.add_argument("--steps", type=int, default=2,
                    help="timed steps per case (each recorded in step_times; step_seconds is their median)")
    ap.add_argument("--max-minutes", type=float, default=8.0, help="stop starting new cases after this long")
    ap.add_argument("--out", type=Path, default=RESULTS, help="folder for the .json result")
    ap.add_argument("--render", type=Path, metavar="FILE", help="print a committed run's markdown table and exit")
    ap.add_argument("--snapshots", action="store_true",
                    help="also save each training case's memory snapshot (torch's _snapshot() pickle at the backward's "
                         "start, or at an OOM) under <out>/snapshots/ for `trainfit explain`; CUDA only")
    args = ap.parse_args(argv)
    if args.render:
        print(render_file(args.render), end="")
        return 0

    import torch

    from trainfit.overheads import allocator_held
    from trainfit.setup import Setup

    dry = args.dry_run
    if dry and args.snapshots:
        print("--snapshots records CUDA memory snapshots: drop it with --dry-run", file=sys.stderr)
        return 2
    resolved = device_and_gpu(dry)
    if resolved is None:
        return 2
    device, name, gpu = resolved
    cases = dry_run_cases() if dry else cuda_cases()
    if args.only:
        cases = [c for c in cases if args.only in c.id]
    args.out.mkdir(parents=True, exist_ok=True)
    totals = device_totals(device)
    chip = "none" if dry else data.chip_id(totals.get("uuid"))
    path = args.out / data.gpu_file_name(gpu.name, str(_dt.date.today()), chip, "truth", "dry-run" if dry else "")

    def write(rows: list[dict], minutes: float) -> None:  # after every case: a run cut off keeps what it measured
        fp8_deltas(rows)
        path.write_text(json.dumps({"gpu": gpu.name, "device_name": name, "dry_run": dry,
                                                         "workspaces": ws, "predicted_workspaces": predicted_ws,
                                                         "host": host, "memory_totals": totals,
                                                         "torch": torch.__version__, "minutes": round(minutes, 2),
                                                         "cases": rows}, indent=1, default=str))

    rows, t0 = [], time.perf_counter()
    ws = warm_up(device)
    # this host's time to issue an eager op (the host-issue bound's rate, analytic/step_time.py host_issue): hosts
    # differ by ~2x between machines, so each run records its own beside its steps
    host = host_issue(device)
    predicted_ws = sum(allocator_held(gpu, Setup(device="cuda")).values())
    print(f"cuBLAS workspaces: {ws['allocated']:,} B allocated ({ws['reserved']:,} reserved); predicted for a training "
          f"step {predicted_ws:,}", file=sys.stderr, flush=True)
    for i, c in enumerate(cases, 1):
        if time.perf_counter() - t0 > args.max_minutes * 60:
            rows.append({"id": c.id, "skipped": f"--max-minutes {args.max_minutes} reached"})
            continue
        print(f"[{i}/{len(cases)}] {c.id}", file=sys.stderr, flush=True)
        rows.append(run_case(c, gpu, device, process_memory(device), args.steps,
                             args.out / "snapshots" if args.snapshots else None))
        print(f"    {json.dumps(rows[-1].get('errors') or rows[-1].get('skipped'), default=str)} "
              f"{rows[-1].get('seconds', 0)} s", file=sys.stderr, flush=True)
        if device == "cuda":
            torch.cuda.empty_cache()
        write(rows, (time.perf_counter() - t0) / 60)
    minutes = (time.perf_counter() - t0) / 60
    write(rows, minutes)
    print(f"wrote {path} ({minutes:.1f} min)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
