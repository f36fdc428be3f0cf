"""What a CUDA process holds outside PyTorch's caching allocator, stage by stage (issue 18; docs/benchmarks/gpu-truth.md).

    python -m bench run cuda_context            # on a CUDA machine, ~20 s: bench/results/gpu/<gpu>-<date>-<chip>-context.json

overheads.toml's `[cuda_context]` counts the memory a process holds beside the allocator's reserved: the context at
start (what SGLang's free memory at start reads) and after a step (what a training process holds, measured by
bench/gpu/cuda_truth.py). This splits the difference: each stage runs in a fresh process, once with CUDA's default lazy
module loading and once with CUDA_MODULE_LOADING=EAGER (every kernel of torch's libraries loaded at init), and
reads cudaMemGetInfo's used less torch's reserved after:
  init      torch.cuda.init() and one cudaMemGetInfo: the context alone
  tensor    one small tensor (the caching allocator's first segment)
  gemm      a bf16 matmul (cuBLAS/cuBLASLt handles, the GEMM kernels' modules)
  sdpa      scaled_dot_product_attention forward and backward, bf16, causal (the fused attention kernels' modules)
  adamw     one fused AdamW step (its kernel)
Ground truth of rule 1 (DEVELOPERS: real steps on a GPU).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import subprocess
import sys
from pathlib import Path

from bench import child_env, data
from bench.gpu.device import device_totals

ABOUT = {"summary": "what a CUDA process holds outside the caching allocator (needs CUDA)",
         "minutes": 0.3, "quick": None}

RESULTS = data.results_dir() / data.GPU_DIR
STAGES = ("init", "tensor", "gemm", "sdpa", "adamw")


def probe() -> list[dict]:
    """In this process: each stage in order, with cudaMemGetInfo's used and torch's reserved after it."""
    import torch
    import torch.nn.functional as F

    def read(stage: str) -> dict:
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        reserved = torch.cuda.memory_reserved()
        return {"stage": stage, "used": total - free, "reserved": reserved, "outside": total - free - reserved}

    torch.cuda.init()
    out = [read("init")]
    x = torch.ones(1, device="cuda")
    out.append(read("tensor"))
    a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    (a @ a).sum().item()
    out.append(read("gemm"))
    q = torch.randn(2, 16, 1024, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
    out.append(read("sdpa"))
    p = torch.nn.Parameter(torch.randn(1024, device="cuda"))
    p.grad = torch.randn_like(p)
    torch.optim.AdamW([p], fused=True).step()
    out.append(read("adamw"))
    del x, a, q, p
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=RESULTS, help="folder for the .json result")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    import torch

    if args.child:
        print(json.dumps(probe()))
        return 0
    if not torch.cuda.is_available():
        print("no CUDA device here: bench/gpu/cuda_context.py measures a GPU's context and has no CPU semantics",
              file=sys.stderr)
        return 2
    runs = {}
    for loading in ("LAZY", "EAGER"):
        env = {**os.environ, "CUDA_MODULE_LOADING": loading}
        done = subprocess.run([sys.executable, "-m", __spec__.name, "--child"], env=child_env(env), capture_output=True, text=True,
                              check=True)
        runs[loading] = json.loads(done.stdout.strip().splitlines()[-1])
        for r in runs[loading]:
            print(f"{loading:5s} {r['stage']:7s} used {r['used'] / 2**20:8.1f} MiB  reserved "
                  f"{r['reserved'] / 2**20:7.1f}  outside the allocator {r['outside'] / 2**20:7.1f}", file=sys.stderr)
    name = torch.cuda.get_device_name()
    args.out.mkdir(parents=True, exist_ok=True)
    uuid = device_totals("cuda").get("uuid")  # the chip's NVML uuid, as the truth harness reads it
    path = args.out / data.gpu_file_name(name.replace("NVIDIA ", "").replace(" ", "-"), str(_dt.date.today()),
                                         data.chip_id(uuid), "context")
    path.write_text(json.dumps({"device_name": name, "uuid": uuid, "torch": torch.__version__,
                                "cuda": torch.version.cuda,
                                "driver_note": "nvidia-smi's driver_version is in the run's log", "runs": runs},
                               indent=1))
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
