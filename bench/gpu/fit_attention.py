"""Fit a fused attention kernel's timing constants on a committed kernel microbenchmark (no GPU needed).

    python -m bench run fit_attention bench/results/gpu/H200-2026-11-27-unrecorded-9-kernels.json --backend efficient --fill 0
    python -m bench run fit_attention bench/results/gpu/H200-2026-11-27-e2d374c2-kernels.json --backend efficient --fill 0 \
        --dtype fp32 --dropout --check bench/results/gpu/H200-2026-11-27-79777263-kernels.json

bench/gpu/cuda_kernels.py timed torch's causal SDPA by backend on a GPU (the kernel's own time from
torch.profiler). The model it fits is roofline.FittedAttention's: one call = FLOPs / (peak x fraction x tile
factor) + a fixed time, the tile factor roofline.flash_efficiency with the kernel's own tiles (read from its name)
and `fill` pipeline-fill steps per CTA. For each head dim and direction, fraction and fixed time are the least
squares fit of the relative error (time is linear in 1 / fraction and the fixed time). Prints the kernels.toml
values and each shape's error, on the fitted run and on `--check` (another chip's run: out of sample).
Ground truth of rule 1 (DEVELOPERS: real steps on a GPU). It fits the memory-efficient kernel's constants
(kernels.toml [generation.hopper.efficient], with --fill 0) and, on the sdpa_variants rows, its fp32 and dropout
variants and cuDNN's dropout variant ([...efficient.fp32], [...cudnn.dropout], ...). `--bytes-per-element`: the
backward's pre/post passes (cuDNN's dot_do_o and convert_dq: kernels.toml backward_bytes_per_element), taken off
at HBM bandwidth before the fit, as the engine adds them back.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

ABOUT = {"summary": "fit a fused attention kernel's timing constants on a committed run",
         "minutes": 0.1, "quick": None}

# the kernel's tile [queries, keys] from its name: cuDNN's ..._64x64x64_..., the memory-efficient kernel's
# fmha_cutlass{F,B}_<dtype>_aligned_64x128_...
_TILE = re.compile(r"(?:_|^)(\d+)x(\d+)(?:x\d+)?_")


def kernel_tiles(row: dict) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """(forward tile, backward tile) of an SDPA row's main kernels, or None when the names do not say."""
    out = []
    for key, mark in (("fwd_kernels", ("cutlassF", "fprop")), ("kernels", ("cutlassB", "bprop"))):
        names = [n for n in (row.get(key) or {}) if any(m in n for m in mark)]
        m = _TILE.search(names[0]) if names else None
        if not m:
            return None
        out.append((int(m.group(1)), int(m.group(2))))
    return out[0], out[1]


def main_kernel_seconds(row: dict, backward: bool) -> float:
    """The fused kernel's own time: the backward's row also holds the copies and fills around it."""
    if not backward:
        return row["fwd_seconds"]
    mark = ("cutlassB", "bprop", "dot_do_o", "reduce_head", "convert_dq")
    own = [t for n, t in (row.get("kernels") or {}).items() if any(m in n for m in mark)]
    return sum(own) if own else row["bwd_seconds"]


def peak_seconds(row: dict, gpu, backward: bool, fill: int, kernel: str = "efficient", tile=None) -> float:
    """The call's FLOPs at the full peak over its tile factor: the model's time is this / fraction + fixed time.
    The peak is the row's dtype's as the kernel runs it (roofline._attention_peak: fp32 as 3xTF32); the tile the
    kernel's name says, or `tile` (both ways)."""
    from trainfit.analytic.roofline import _attention_flops, _attention_peak, flash_efficiency, kernels_for

    b, h, s, d = row["shape"]
    block = tuple(tile) if tile else kernel_tiles(row)[backward]
    seq = flash_efficiency(kernels_for(gpu), b * h, s, s, d, True, block=block, fill=fill)
    flops = _attention_flops(b * h, s, s, d, True) * (2.5 if backward else 1.0)
    return flops / (_attention_peak(gpu, kernel, row.get("dtype", "bf16")) * seq)


def passes_seconds(row: dict, gpu, backward: bool, bytes_per_element: float) -> float:
    """The backward's pre/post passes at HBM bandwidth, as roofline._fitted_seconds adds them."""
    from trainfit.analytic.roofline import _bandwidth, kernels_for

    b, h, s, d = row["shape"]
    return b * h * s * d * bytes_per_element / _bandwidth(gpu, kernels_for(gpu)) if backward else 0.0


def fit(rows: list[dict], gpu, backward: bool, fill: int, kernel: str = "efficient",
        bytes_per_element: float = 0.0, tile=None) -> tuple[float, float]:
    """(fraction, fixed seconds) minimising sum((a x + c) / t - 1)^2 with x = peak_seconds, t the kernel's time less
    its pre/post passes."""
    xs = [peak_seconds(r, gpu, backward, fill, kernel, tile) for r in rows]
    ts = [main_kernel_seconds(r, backward) - passes_seconds(r, gpu, backward, bytes_per_element) for r in rows]
    # normal equations of sum((a x_i + c) / t_i - 1)^2 in (a, c)
    sxx = sum((x / t) ** 2 for x, t in zip(xs, ts))
    sxc = sum(x / t ** 2 for x, t in zip(xs, ts))
    scc = sum(1 / t ** 2 for t in ts)
    sx1 = sum(x / t for x, t in zip(xs, ts))
    sc1 = sum(1 / t for t in ts)
    det = sxx * scc - sxc * sxc
    a = (sx1 * scc - sc1 * sxc) / det
    c = (sxx * sc1 - sxc * sx1) / det
    return 1 / a, c


# which fused kernel a row ran, from its kernel names (a "default" row runs what torch picked)
_FAMILY = {"cudnn": "cudnn_generated", "efficient": "fmha_cutlass", "flash": "pytorch_flash"}


def _rows(run: dict, backend: str, dtype: str = "bf16", dropout: bool = False) -> list[dict]:
    """The rows that ran `backend`'s kernel on `dtype`, with or without dropout: the sdpa section's (bf16, no
    dropout) and the sdpa_variants section's, a "default" row counted where torch picked that kernel."""
    out = []
    for r in run.get("sdpa", []) + run.get("sdpa_variants", []):
        names = " ".join(r.get("kernels") or {})
        if ("error" in r or r.get("dtype", "bf16") != dtype or bool(r.get("dropout", 0)) != dropout
                or r.get("backend") not in (backend, "default") or _FAMILY[backend] not in names or not kernel_tiles(r)):
            continue
        out.append(r)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path, help="a bench/results/gpu/<gpu>-<date>-<chip>-kernels.json from bench/gpu/cuda_kernels.py")
    ap.add_argument("--backend", default="efficient", help="the SDPA backend's rows to fit (efficient, cudnn, flash)")
    ap.add_argument("--fill", type=int, default=1, help="pipeline-fill steps per CTA in the tile factor")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"), help="the rows' dtype (sdpa_variants for fp32)")
    ap.add_argument("--dropout", action="store_true", help="the rows with dropout 0.1 inside the kernel")
    ap.add_argument("--bytes-per-element", type=float, default=0.0,
                    help="the backward's pre/post passes per Q element (cuDNN: 14), taken off before the fit")
    ap.add_argument("--tile", type=int, nargs=2, metavar=("Q", "K"),
                    help="the tile both ways instead of the kernel names' (cuDNN's committed fit: 64 64)")
    ap.add_argument("--check", type=Path, help="another run of the same GPU to check the fit on")
    args = ap.parse_args(argv)
    from trainfit.hardware import get_gpu

    run = json.loads(args.results.read_text())
    gpu = get_gpu(run["gpu"])
    rows = _rows(run, args.backend, args.dtype, args.dropout)
    if not rows:
        print(f"no {args.backend} {args.dtype} rows{' with dropout' if args.dropout else ''} with kernel names in "
              f"{args.results}", file=sys.stderr)
        return 2
    dims = sorted({r["shape"][3] for r in rows})
    fitted = {(d, bwd): fit([r for r in rows if r["shape"][3] == d], gpu, bwd, args.fill, args.backend,
                            args.bytes_per_element, args.tile)
              for d in dims for bwd in (False, True)}
    for bwd in (False, True):
        name = "backward" if bwd else "forward"
        print(f"{name} = {[round(fitted[d, bwd][0], 3) for d in dims]}")
        print(f"{name}_fixed_seconds = {[round(fitted[d, bwd][1] * 1e6, 1) for d in dims]}  # us")
        tiles = sorted({(r['shape'][3], tuple(args.tile) if args.tile else kernel_tiles(r)[bwd]) for r in rows})
        print(f"{name}_tiles = {[list(t) for _, t in tiles]}")
    for label, path in (("fit", args.results), ("check", args.check)):
        if path is None:
            continue
        errs = []
        for r in _rows(json.loads(path.read_text()), args.backend, args.dtype, args.dropout):
            d = r["shape"][3]
            if d not in dims:
                continue
            line = [f"{label} {r['shape']}"]
            for bwd in (False, True):
                frac, fixed = fitted[d, bwd]
                e = (peak_seconds(r, gpu, bwd, args.fill, args.backend, args.tile) / frac + fixed
                     + passes_seconds(r, gpu, bwd, args.bytes_per_element)) / main_kernel_seconds(r, bwd) - 1
                errs.append(e)
                line.append(f"{'bwd' if bwd else 'fwd'} {e:+.1%}")
            print("  ".join(line))
        print(f"{label}: {len(errs)} calls, median |error| {statistics.median(abs(e) for e in errs):.1%}, "
              f"worst {max(errs, key=abs):+.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
