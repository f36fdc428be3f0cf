"""The attention kernel model (analytic/roofline.py attention_seconds) against NVIDIA's published cuDNN sweeps:
full, causal and sliding-window attention on an H200 and a GB200, forward and backward.

    python -m bench run attention_published     # the validation table, writes bench/results/attention.md

Validation only (nothing is fitted on these and none is a test gate). The kernel is cuDNN's fused attention, what
torch's SDPA and Transformer Engine run first on sm90 and sm100 (kernels.toml sdpa); the model's cuDNN rates are
the H200 fit of our own runs ([generation.hopper.cudnn]) and a published B200 figure ([generation.blackwell]
attention.cudnn, CUDNNFE). Error = predicted / published time − 1 (positive: predicted slower).
"""
from __future__ import annotations

import statistics

from bench.data import results_dir
from bench.figures import record
from trainfit.analytic import roofline
from trainfit.hardware import get_gpu

ABOUT = {"summary": "attention kernel model vs published cuDNN sweeps (full, causal, sliding window)",
         "minutes": 0.1, "quick": None}

SWEEPS = ("https://github.com/NVIDIA/cudnn-frontend/tree/3929da2ef4c1dba1bb8acb68727b9134f26f40c0/benchmark/"
          "sdpa_benchmark_training/results")
SOURCES = {"H200": f"{SWEEPS}/h200_919_only_cudnn (llama3.1_20260227_034703.csv, gpt_oss_20260227_034819.csv; "
                   "cuDNN 9.19)",
           "GB200": f"{SWEEPS}/llama3.1/gb200/llama3.1_20260424_100750.csv, gpt_oss/gb200/gpt_oss_20260424_100011.csv "
                    "(cuDNN 9.22, frontend 1.21.1)"}

# (GPU, batch, query heads, head dim, causal, sliding window (0: none), sequence, forward ms, backward ms): bf16,
# the non-deterministic backward, the sweeps' own rows
POINTS = [
    ("H200", 1, 64, 128, True, 0, 2048, 0.142, 0.464), ("H200", 1, 64, 128, True, 0, 4096, 0.465, 1.45),
    ("H200", 1, 64, 128, True, 0, 8192, 1.708, 5.083), ("H200", 1, 64, 128, True, 0, 16384, 6.531, 19.002),
    ("H200", 1, 64, 128, True, 0, 32768, 25.566, 75.688),
    ("H200", 1, 64, 128, False, 0, 2048, 0.217, 0.681), ("H200", 1, 64, 128, False, 0, 4096, 0.819, 2.453),
    ("H200", 1, 64, 128, False, 0, 8192, 3.182, 9.262), ("H200", 1, 64, 128, False, 0, 16384, 12.524, 35.947),
    ("H200", 1, 64, 128, False, 0, 32768, 50.769, 153.841),
    ("H200", 2, 64, 64, True, 1024, 2048, 0.166, 0.488), ("H200", 2, 64, 64, True, 1024, 4096, 0.358, 1.042),
    ("H200", 2, 64, 64, True, 1024, 8192, 0.738, 2.149), ("H200", 2, 64, 64, True, 1024, 16384, 1.499, 4.392),
    ("H200", 2, 64, 64, True, 1024, 32768, 3.021, 9.045),
    ("GB200", 2, 64, 128, True, 0, 2048, 0.125, 0.389), ("GB200", 2, 64, 128, True, 0, 4096, 0.391, 1.198),
    ("GB200", 2, 64, 128, True, 0, 8192, 1.397, 4.127), ("GB200", 2, 64, 128, True, 0, 16384, 5.15, 16.554),
    ("GB200", 2, 64, 128, True, 0, 32768, 21.692, 71.756),
    ("GB200", 2, 64, 128, False, 0, 2048, 0.192, 0.611), ("GB200", 2, 64, 128, False, 0, 4096, 0.687, 2.037),
    ("GB200", 2, 64, 128, False, 0, 8192, 2.483, 7.831), ("GB200", 2, 64, 128, False, 0, 16384, 10.369, 32.014),
    ("GB200", 2, 64, 128, False, 0, 32768, 43.056, 139.364),
    ("GB200", 2, 128, 64, True, 128, 2048, 0.109, 0.237), ("GB200", 2, 128, 64, True, 128, 4096, 0.21, 0.465),
    ("GB200", 2, 128, 64, True, 128, 8192, 0.414, 0.911), ("GB200", 2, 128, 64, True, 128, 16384, 0.822, 1.818),
    ("GB200", 2, 128, 64, True, 128, 32768, 2.634, 3.692),
]


def kind(causal: bool, window: int, d: int) -> str:
    return f"{'sliding window ' + str(window) if window else 'causal' if causal else 'full'}, d {d}"


def rows() -> list[dict]:
    out = []
    for gpu, b, h, d, causal, window, s, fwd, bwd in POINTS:
        g = get_gpu(gpu)
        for name, ms in (("forward", fwd), ("backward", bwd)):
            t = roofline.attention_seconds(g, "sdpa", b * h, s, s, d, causal, "bf16", name == "backward",
                                           window=window) * 1e3
            out.append({"gpu": gpu, "kind": kind(causal, window, d), "seq": s, "pass": name, "published": ms,
                        "predicted": t, "error": t / ms - 1})
    return out


def groups(rs: list[dict]) -> dict[str, list[float]]:
    g: dict[str, list[float]] = {}
    for r in rs:
        g.setdefault(f"{r['gpu']} · {r['kind']}", []).append(r["error"])
    return g


def main(argv: list[str] | None = None) -> None:
    rs = rows()
    gs = groups(rs)
    lines = ["# Attention kernel model vs published cuDNN sweeps (validation only)", "",
             __doc__.split("\n\n")[2].replace("\n", " "), "", "Sources: " + "; ".join(
                 f"{k}: {v}" for k, v in SOURCES.items()), "",
             "| GPU · kind | points | median |error| | worst |", "| --- | ---: | ---: | ---: |"]
    lines += [f"| {k} | {len(v)} | {statistics.median(abs(e) for e in v):.1%} | {max(v, key=abs):+.1%} |"
              for k, v in gs.items()]
    lines += ["", "| GPU | kind | sequence | pass | published ms | predicted ms | error |",
              "| --- | --- | ---: | --- | ---: | ---: | ---: |"]
    lines += [f"| {r['gpu']} | {r['kind']} | {r['seq']:,} | {r['pass']} | {r['published']:g} | {r['predicted']:.3f} | "
              f"{r['error']:+.1%} |" for r in rs]
    out = "\n".join(lines) + "\n"
    print(out)
    (results_dir() / "attention.md").write_text(out)
    errs = [abs(r["error"]) for r in rs]
    worst = max(rs, key=lambda r: abs(r["error"]))
    record("attention_published", "attention kernel model vs published cuDNN sweeps", None,
           f"{len(rs)} kernel times: median |error| {statistics.median(errs):.1%}, worst {worst['error']:+.1%}",
           {k: round(statistics.median(abs(e) for e in v), 4) for k, v in gs.items()}, "published",
           rows=[{"table": "published", "runs": f"cuDNN attention on the {gpu}: full, causal, sliding window (cudnn-frontend sweeps)",
                  "kind": "validation", "n": len(v), "median |error|": f"{statistics.median(abs(e) for e in v):.1%}",
                  "worst": f"{max(v, key=abs):+.1%}"} for gpu, v in by_gpu(rs).items()])


def by_gpu(rs: list[dict]) -> dict[str, list[float]]:
    g: dict[str, list[float]] = {}
    for r in rs:
        g.setdefault(r["gpu"], []).append(r["error"])
    return g


if __name__ == "__main__":
    main()
