"""oneDNN's 16-bit matmul scratch: the analytic formula (analytic/onednn.py) against what the op really allocates
through c10 on this CPU, read by the trace engine's probe (trace/kernel_scratch.py scratch_of: the profiler's memory
events around one real call). A few seconds on 2 cores.

    python -m bench run onednn_scratch [--threads 1 2] [--full]
    ONEDNN_MAX_CPU_ISA=AVX512_CORE python -m bench run onednn_scratch   # gemm:jit:bf16, as on AVX-512 CPUs without BF16

Shapes: the layers' GEMMs (M = tokens or a weight gradient's rows, K, N = 16..4096), forward (A plain, B transposed,
as nn.Linear's mm), the input gradient (B plain) and the weight gradient (A transposed); --full adds a grid.
On a CPU whose oneDNN has no 16-bit path (plain AVX2, or ONEDNN_MAX_CPU_ISA=AVX2) both sides read 0.
"""
from __future__ import annotations

import argparse

ABOUT = {"summary": "oneDNN's 16-bit matmul scratch: formula vs this CPU", "minutes": 0.1, "quick": None}


LAYER_SHAPES = [  # (M, K, N, A transposed, B transposed)
    (256, 128, 128, False, True), (256, 128, 256, False, True), (256, 128, 384, False, True),
    (256, 256, 128, False, True), (256, 128, 1000, False, True), (2, 128, 1000, False, True),
    (2, 128, 128, False, True), (2, 256, 128, False, True), (256, 128, 512, False, False),
    (256, 512, 128, False, False), (512, 256, 128, True, False), (128, 256, 512, True, False),
    (128, 256, 128, True, False), (1000, 256, 128, True, False), (1024, 512, 1024, False, True),
    (4096, 4096, 64, True, False), (100, 1000, 17, False, True), (17, 64, 4096, False, True),
]


def grid() -> list[tuple]:
    return [(m, k, n, ta, tb) for m in (2, 16, 17, 64, 100, 256, 1024) for k in (16, 64, 128, 1000)
            for n in (17, 64, 128, 1000) for ta, tb in ((False, True), (True, False))]


def measured(m: int, k: int, n: int, ta: bool, tb: bool) -> int:
    """The c10 bytes one real bf16 mm of these shapes and layouts allocates and frees inside the op."""
    import torch

    from trainfit.trace.kernel_scratch import scratch_of

    a = torch.zeros(k, m, dtype=torch.bfloat16).t() if ta else torch.zeros(m, k, dtype=torch.bfloat16)
    b = torch.zeros(n, k, dtype=torch.bfloat16).t() if tb else torch.zeros(k, n, dtype=torch.bfloat16)
    peak, live = scratch_of(lambda: torch.ops.aten.mm(a, b))
    return peak - live


def rows(threads: list[int], full: bool = False):
    """(shape, threads, formula, measured) for each shape and thread count."""
    import torch

    from trainfit.analytic.onednn import matmul_scratch, onednn_matmul

    shapes = LAYER_SHAPES + (grid() if full else [])
    before = torch.get_num_threads()
    try:
        for t in threads:
            torch.set_num_threads(t)
            for m, k, n, ta, tb in shapes:
                formula = matmul_scratch(m, k, n, transposed_a=ta, transposed_b=tb, threads=t) if onednn_matmul("bf16") else 0
                yield (m, k, n, ta, tb), t, formula, measured(m, k, n, ta, tb)
    finally:
        torch.set_num_threads(before)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--full", action="store_true")
    args = ap.parse_args(argv)
    from trainfit.analytic.onednn import effective_isa, onednn_matmul

    print(f"effective ISA {effective_isa()}, oneDNN bf16 matmul: {onednn_matmul('bf16')}")
    bad = 0
    for (m, k, n, ta, tb), t, formula, real in rows(args.threads, args.full):
        ok = formula == real
        bad += not ok
        print(f"{'ok ' if ok else 'BAD'} M={m:5d} K={k:5d} N={n:5d} A{'ᵀ' if ta else ' '} B{'ᵀ' if tb else ' '} "
              f"threads {t}: formula {formula:9d} measured {real:9d}")
    print(f"{bad} mismatches")


if __name__ == "__main__":
    main()
