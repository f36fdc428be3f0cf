"""Fit the multi_tensor_apply constants on committed kernel microbenchmarks (no GPU needed).

    python -m bench run fit_multi_tensor bench/results/gpu/H200-2026-11-27-e2d374c2-kernels.json \\
        --model-runs bench/results/gpu/H200-2026-11-27-{unrecorded-8,unrecorded-9,79777263,e2d374c2}-kernels.json

bench/gpu/cuda_kernels.py adamw timed torch's AdamW step (foreach and fused) on a GPU, kernel by kernel
(torch.profiler): over a model's own parameters and over LoRA adapters at two ranks. This fits, from the foreach
step's kernels whose arithmetic does not depend on the data (compute_time.FOREACH_ADAM's mul_, add_, lerp_ and
addcmul_: multiplies and adds):
  * the streaming fraction of the foreach kernels (kernels.toml access foreach32 / foreach16): their bytes over
    their time on the model's parameters (every chunk full: HBM-bound), the median over the --model-runs;
  * the latency of one iteration of a CTA (kernels.toml [multi_tensor_apply] iteration_seconds): least squares of
    the relative error of the LoRA rows' same kernels, timed by analytic/multi_tensor.py launch by launch with
    kernels.toml's foreach32 (write the fractions first, then fit the latency).
It prints the kernels.toml values, then every kernel class's error with them, the fitted ones and the others: the
sqrt, the divisions and the fused kernel, whose arithmetic takes its special-value paths on the benchmark's
all-zero tensors (sqrt(0), 0 / x), are reported, not fitted. Ground truth of rule 1 (DEVELOPERS: real steps on a GPU).
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

ABOUT = {"summary": "fit the multi_tensor_apply constants on committed runs", "minutes": 0.1, "quick": None}

# a profiler key (cut at 160 characters) -> (metadata, list depth, the functor's first letter where the key has it)
_KERNEL = re.compile(r"(TensorListScalarListMetadata|TensorListMetadata|FusedOptimizerTensorListMetadata)"
                     r"<(?:float, )?(\d)>(?:, at::native::\(anonymous namespace\)::(\w))?")
# the foreach AdamW step's kernels (torch 2.13 ForeachFunctors.cuh functor names) -> its ops in FOREACH_ADAM
FOREACH_KERNELS = {("TensorListMetadata", 1, "B"): ("mul_", "add_"),  # BinaryOpScalarFunctor
                   ("TensorListMetadata", 2, "T"): ("lerp_",),  # TernaryOpScalarFunctor
                   ("TensorListMetadata", 3, "P"): ("addcmul_",),  # PointwiseOpScalarFunctor
                   ("TensorListMetadata", 2, "U"): ("sqrt",),  # UnaryOpFunctor
                   ("TensorListScalarListMetadata", 1, None): ("div_",),
                   ("TensorListScalarListMetadata", 3, None): ("addcdiv_",)}
FITTED = ("mul_", "add_", "lerp_", "addcmul_")


def ops_of(key: str) -> tuple[str, ...]:
    """The FOREACH_ADAM ops one profiler key of a foreach step times (empty for any other kernel)."""
    m = _KERNEL.search(key)
    if not m:
        return ()
    kind, depth, letter = m.group(1), int(m.group(2)), m.group(3)
    return FOREACH_KERNELS.get((kind, depth, letter if kind == "TensorListMetadata" else None), ())


def _passes(ops: tuple[str, ...]):
    """FOREACH_ADAM's passes that are these ops."""
    from trainfit.analytic.compute_time import FOREACH_ADAM

    return [p for p in FOREACH_ADAM if p[0] in ops]


def _bytes_per_element(row: dict, counts: tuple[int, int, int]) -> float:
    """Bytes per element of a pass over an AdamW row's tensors (param, one state, grad: all the row's dtype)."""
    el = 4 if row["dtype"] == "float32" else 2
    return sum(counts) * el


def stream_fraction(rows: list[dict], gpu) -> float | None:
    """The fitted foreach kernels' bytes over their time on a model's parameters, / the GPU's streaming bandwidth
    (datasheet x hbm_fraction); None if the row's kernels did not keep their names apart."""
    from trainfit.analytic.roofline import kernels_for

    nbytes = seconds = 0.0
    for r in rows:
        for key, t in r["kernels"].items():
            ops = ops_of(key)
            if ops and set(ops) <= set(FITTED):
                seconds += t
                nbytes += r["params"] * sum(_bytes_per_element(r, c) for *_, c in _passes(ops))
    if not seconds:
        return None
    return nbytes / seconds / (gpu.memory_bandwidth * kernels_for(gpu).hbm_fraction)


def lora_rows(run: dict, kernel: str) -> list[dict]:
    return [r for r in run.get("adamw", []) if r.get("rank") and r["kernel"] == kernel and r["dtype"] == "float32"]


def adapter_runs(row: dict) -> tuple[tuple[int, int], ...]:
    """The row's adapter tensors as multi_tensor.runs_of gives them to the engine (lora.adapter_sizes)."""
    from trainfit.analytic.lora import adapter_sizes
    from trainfit.analytic.multi_tensor import runs_of
    from trainfit.models.resolve import load_model
    from trainfit.setup import Setup

    spec = load_model(row["model"])
    sizes = adapter_sizes(spec, Setup(lora_rank=row["rank"]), spec.layers)
    assert (len(sizes), sum(sizes)) == (row["tensors"], row["params"]), (row["tensors"], row["params"])
    return runs_of(sum(sizes), len(sizes), sizes)


def kernel_seconds(gpu, row: dict, ops: tuple[str, ...], latency: float | None) -> float:
    """The model's time of a foreach row's kernel that runs `ops` (their launches' costs included, as the profiler's
    kernel time holds each launch's ramp)."""
    from trainfit.analytic.multi_tensor import pass_seconds
    from trainfit.analytic.roofline import kernels_for

    total = 0.0
    for _, depth, scalar_list, counts in _passes(ops):
        t, n = pass_seconds(gpu, adapter_runs(row), depth, _bytes_per_element(row, counts), "foreach32",
                            scalar_list, iteration_seconds=latency)
        total += t + n * kernels_for(gpu).launch_seconds
    return total


def errors(gpu, rows: list[dict], latency: float | None, fitted: bool) -> dict[str, float]:
    """(predicted - measured) / measured per LoRA row and kernel class, the fitted classes or the others."""
    out = {}
    for r in rows:
        for key, t in r["kernels"].items():
            ops = ops_of(key)
            if ops and (set(ops) <= set(FITTED)) == fitted:
                out[f"r{r['rank']} {'+'.join(ops)}"] = kernel_seconds(gpu, r, ops, latency) / t - 1
    return out


def fused_errors(gpu, rows: list[dict], latency: float) -> dict[str, float]:
    """The fused rows' _fused_adamw_ kernel (FusedOptimizerTensorListMetadata<4>: param, grad, exp_avg, exp_avg_sq
    read, all but grad written) against the engine's fused pass at `latency`."""
    from trainfit.analytic.multi_tensor import pass_seconds
    from trainfit.analytic.roofline import kernels_for

    out = {}
    for r in rows:
        (t,) = [v for k, v in r["kernels"].items() if "FusedOptimizerTensorListMetadata" in k]
        s, n = pass_seconds(gpu, adapter_runs(r), 4, 7 * 4, "mta32", iteration_seconds=latency)
        out[f"r{r['rank']} fused"] = (s + n * kernels_for(gpu).launch_seconds) / t - 1
    return out


def fit_latency(gpu, rows: list[dict]) -> float:
    """Least squares of the fitted classes' relative errors over the latency, by golden-section search (the time is
    piecewise linear in it: each launch the larger of its stream time and its floor)."""
    def loss(x: float) -> float:
        return sum(e * e for e in errors(gpu, rows, x, True).values())

    lo, hi = 0.0, 2e-6
    g = (5 ** 0.5 - 1) / 2
    for _ in range(60):
        a, b = hi - g * (hi - lo), lo + g * (hi - lo)
        lo, hi = (lo, b) if loss(a) <= loss(b) else (a, hi)
    return (lo + hi) / 2


def main(argv: list[str] | None = None) -> int:
    from trainfit.hardware import get_gpu

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path, help="a kernels-<gpu>-<date>.json with LoRA adamw rows")
    ap.add_argument("--model-runs", type=Path, nargs="*", default=[],
                    help="kernel runs whose model-parameter foreach rows give the streaming fractions")
    args = ap.parse_args(argv)
    run = json.loads(args.results.read_text())
    gpu = get_gpu(run["gpu"])
    for dtype, name in (("float32", "foreach32"), ("bfloat16", "foreach16")):
        fr = [f for p in args.model_runs or [args.results]
              for f in [stream_fraction([r for r in json.loads(p.read_text()).get("adamw", [])
                                         if not r.get("rank") and r["kernel"] == "foreach" and r["dtype"] == dtype],
                                        gpu)] if f]
        if fr:
            print(f"access {name} = {statistics.median(fr):.3f}  (runs: {', '.join(f'{f:.3f}' for f in fr)})")
    rows = lora_rows(run, "foreach")
    if not rows:
        print("no LoRA foreach rows", file=sys.stderr)
        return 2
    latency = fit_latency(gpu, rows)
    print(f"[multi_tensor_apply] iteration_seconds = {latency:.3e}")
    for fitted in (True, False):
        print("fitted:" if fitted else "not fitted (arithmetic on zeros):")
        found = errors(gpu, rows, latency, fitted) | ({} if fitted else fused_errors(gpu, lora_rows(run, "fused"),
                                                                                         latency))
        for label, e in found.items():
            print(f"    {label}: {e:+.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
