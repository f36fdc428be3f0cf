"""Today's roofline against a committed kernel microbenchmark run (no GPU needed).

    python -m bench run kernels_replay bench/results/gpu/H200-2026-11-27-unrecorded-8-kernels.json
    python -m bench run kernels_replay bench/results/gpu/H200-2026-11-27-unrecorded-12-kernels-lora.json   # LoRA's thin GEMMs
    python -m bench run kernels_replay bench/results/gpu/H200-2026-11-27-e2d374c2-kernels.json --rows   # AdamW over LoRA

bench/gpu/cuda_kernels.py timed, on a GPU, the kernels an eager step spends its time in (kernel time from
torch.profiler); this re-predicts each with analytic/roofline.py as it is now and prints the errors by section:
the GEMMs of five models' linear layers, torch's SDPA (the backend it picks by default; and fp32 and dropout 0.1
inside the kernel by backend, sdpa_variants), the memory-bound ops of a step by access class, AdamW's step (fused
and foreach) over a model's parameters and over LoRA adapters (analytic/multi_tensor.py's launches; the rows ran on
all-zero tensors, whose sqrt and divisions take slower paths than a real step's: docs/benchmarks/gpu-truth.md), and LoRA's six thin GEMMs per layer shape and rank by dtype (fp32: peft's
adapters without autocast, timed as cuBLAS's SIMT kernels, roofline._simt_gemm_seconds), each beside the prediction
the run stored when it was measured. Ground truth of rule 1 (DEVELOPERS: real steps on a GPU).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ABOUT = {"summary": "today's roofline against a committed kernel microbenchmark run", "minutes": 0.2, "quick": None}

# bench/gpu/cuda_kernels.py step_ops -> ops.Op.access (the class analytic/ops/ gives the op it stands for)
ACCESS = {"upcast_bf16_fp32": "upcast", "broadcast_mul_fp32": "strided", "transpose_copy_bf16": "transpose",
          "mean_last_fp32": "reduce", "softmax_fp32": "reduce", "square_fp32": "vector", "silu_bf16": "vector",
          "add_bf16": "vector"}


def _summary(name: str, errs: list[float]) -> str:
    if not errs:
        return f"{name}: no rows"
    return (f"{name}: {len(errs)} rows, median |error| {statistics.median(abs(e) for e in errs):.1%} "
            f"(median {statistics.median(errs):+.1%}), worst {max(errs, key=abs):+.1%}")


def replay(run: dict) -> dict[str, list[tuple[str, float]]]:
    """(label, (predicted - measured) / measured) per row of each section."""
    from trainfit.analytic.roofline import attention_seconds, gemm_seconds, memory_seconds
    from trainfit.hardware import get_gpu

    gpu = get_gpu(run["gpu"])
    out: dict[str, list[tuple[str, float]]] = {"gemm": [], "sdpa": [], "step_ops": [], "adamw": [], "adamw lora": []}
    for r in run.get("gemm", []):
        m, n, k = r["mnk"]
        # the engine times a weight gradient as (in, out, tokens) (ops.backward); the benchmark ran (out, in, tokens)
        shape = (n, m, k) if r["pass"] == "wgrad" else (m, n, k)
        out["gemm"].append((f"{r['model']} {r['layer']} {r['pass']} {r['mnk']}",
                            gemm_seconds(gpu, *shape, "bf16") / r["seconds"] - 1))
    for r in run.get("sdpa", []):
        if r.get("backend") != "default" or "error" in r:
            continue
        b, h, s, d = r["shape"]
        for p in ("fwd", "bwd"):
            t = attention_seconds(gpu, "sdpa", b * h, s, s, d, True, "bf16", backward=p == "bwd")
            out["sdpa"].append((f"{r['shape']} {p}", t / r[f"{p}_seconds"] - 1))
    for r in run.get("sdpa_variants", []):  # fp32 and dropout 0.1 inside the kernel, by backend
        if "error" in r:
            continue
        b, h, s, d = r["shape"]
        kernel = "efficient" if r["backend"] == "efficient" or r["dtype"] == "fp32" else "sdpa"  # torch's pick
        section = f"sdpa {r['dtype']}{' dropout' if r['dropout'] else ''} {kernel}"
        for p in ("fwd", "bwd"):
            t = attention_seconds(gpu, kernel, b * h, s, s, d, True, r["dtype"], backward=p == "bwd",
                                  dropout=bool(r["dropout"]))
            out.setdefault(section, []).append((f"{r['shape']} {p}", t / r[f"{p}_seconds"] - 1))
    for r in run.get("step_ops", []):
        access = ACCESS.get(r["op"])
        if access:
            t = memory_seconds(gpu, r["bytes"], 1, access)
            out["step_ops"].append((f"{r['op']} {r['tokens']}x{r['width']} ({access})", t / r["seconds"] - 1))
    for r in run.get("adamw", []):
        if merged_kernels(r):
            continue
        out["adamw lora" if r.get("rank") else "adamw"].append(
            (_adamw_label(r), adamw_seconds(gpu, r) / r["seconds"] - 1))
    for r in run.get("lora", []):
        m, n, k = r["mnk"]
        shape = (n, m, k) if r["pass"].endswith("wgrad") else (m, n, k)  # as the gemm rows above
        out.setdefault(f"lora {r['dtype']}", []).append(
            (_lora_label(r), gemm_seconds(gpu, *shape, r["dtype"]) / r["seconds"] - 1))
    return out


def merged_kernels(row: dict) -> bool:
    """An adamw row whose profiler keys merged its kernels (the first H200 run cut names at 100 characters and kept
    one of the foreach step's kernels under their common prefix): its total is not the step's."""
    return row["kernel"] == "foreach" and len(row.get("kernels") or {}) == 1


def adamw_seconds(gpu, row: dict) -> float:
    """The engine's optimizer.step() for an adamw row: its kernel (fused / foreach) over the row's tensors, the
    model's own (as the engine takes a model's: equal tensors) or the LoRA adapters peft adds at the row's rank
    (lora.adapter_sizes), without a gradient clip (bench/gpu/cuda_kernels.py adamw times opt.step() alone)."""
    from trainfit.analytic.compute_time import optimizer_seconds
    from trainfit.analytic.lora import adapter_sizes
    from trainfit.analytic.precision import state_bytes
    from trainfit.models.resolve import load_model
    from trainfit.setup import Setup

    setup = Setup(device="cuda", precision="fp32" if row["dtype"] == "float32" else "bf16",
                  optimizer_impl=row["kernel"], max_grad_norm=0.0)
    sizes = None
    if row.get("rank"):
        spec = load_model(row["model"])
        sizes = adapter_sizes(spec, Setup(lora_rank=row["rank"]), spec.layers)
        assert (len(sizes), sum(sizes)) == (row["tensors"], row["params"]), row
    mem, launch = optimizer_seconds(gpu, setup, state_bytes(setup), row["params"], row["tensors"], sizes=sizes)
    return mem + launch


def _adamw_label(r: dict) -> str:
    of = f"LoRA r{r['rank']}" if r.get("rank") else "model"
    return f"{r['kernel']} AdamW {r['dtype']} {of}: {r['params']:,} params in {r['tensors']} tensors"


def _lora_label(r: dict) -> str:
    return f"{r['layer']} r{r['rank']} {r['pass']} {r['mnk']}"


def at_measurement(run: dict) -> dict[str, list[tuple[str, float]]]:
    """The lora rows' errors as the roofline of the day they were measured predicted them (their predicted_seconds)."""
    out: dict[str, list[tuple[str, float]]] = {}
    for r in run.get("lora", []):
        out.setdefault(f"lora {r['dtype']}", []).append((_lora_label(r), r["predicted_seconds"] / r["seconds"] - 1))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path, help="a bench/results/gpu/<gpu>-<date>-<chip>-kernels.json from bench/gpu/cuda_kernels.py")
    ap.add_argument("--rows", action="store_true", help="print every row, not only the summaries")
    args = ap.parse_args(argv)
    run = json.loads(args.results.read_text())
    if run.get("dry_run"):
        print("a dry run's times are CPU times: nothing to compare", file=sys.stderr)
        return 2
    then = at_measurement(run)
    for section, rows in replay(run).items():
        print(_summary(section, [e for _, e in rows]))
        if section in then:
            print("    " + _summary("as predicted when measured", [e for _, e in then[section]]))
        if args.rows:
            for label, e in rows:
                print(f"    {label}: {e:+.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
