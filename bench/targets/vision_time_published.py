"""ResNet-50 v1.5 training throughput: the analytic vision step time (analytic/vision_time.py) against NVIDIA's
published single-GPU rows (all out of sample: nothing here was fitted to them).

    python -m bench run vision_time_published      # a few seconds; prints a markdown table

Source: NVIDIA/DeepLearningExamples PyTorch/Classification/ConvNets/resnet50v1.5/README.md, "Training performance
results" (pytorch-21.03 NGC container), the 1-GPU rows of "NVIDIA DGX A100 (8x A100 80GB)" and "NVIDIA DGX-1 16GB
(8x V100 16GB)"; batch per GPU and memory format from PyTorch/Classification/ConvNets/configs.yml (models: resnet50:
DGXA100 AMP/TF32 batch_size 256, AMP memory_format nhwc; DGX1V AMP 256 nhwc, FP32 112). SGD with momentum 0.875
(README "Optimizer"). DLE's own training script with DALI data loading, torchvision-style ResNet-50 v1.5 (the
same convolutions as transformers' ResNet-50, which trainfit models); its AMP is fp16 autocast + GradScaler.
"""
from __future__ import annotations

import argparse
from bench.figures import record
from trainfit.api import Request, run_engines

ABOUT = {"summary": "ResNet-50 training throughput vs NVIDIA's published rows", "minutes": 0.1, "quick": None}

# (gpu, DLE precision, trainfit precision, batch, channels_last, published images/s)
ROWS = [
    ("A100-80GB", "TF32", "fp32", 256, False, 938),
    ("A100-80GB", "AMP", "amp-fp16", 256, True, 2470),
    ("V100-16GB", "FP32", "fp32", 112, False, 367),
    ("V100-16GB", "AMP", "amp-fp16", 256, True, 1200),
]

FLAT = 0.4  # the flat MFU the vision engine used before the step-time model (VISION_MFU), for the record


def predicted(gpu: str, precision: str, batch: int, channels_last: bool, mfu: float | None = None) -> float:
    """trainfit's images/s for one row: the analytic engine's step-time model, or (mfu) the flat --mfu override."""
    req = Request(model="resnet-50", batch=batch, precision=precision, optimizer="momentum", gpu=gpu,
                  channels_last=channels_last, mfu=mfu)
    return run_engines(req, "analytic")[0].time.tokens_per_second


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    print("| GPU | DLE precision (trainfit) | batch | layout | published img/s | trainfit img/s | error "
          "| before: flat --mfu 0.4 | error |")
    print("|---|---|---|---|---|---|---|---|---|")
    errs = []
    for gpu, dle, prec, batch, nhwc, pub in ROWS:
        got = predicted(gpu, prec, batch, nhwc)
        errs.append((got - pub) / pub)
        flat = predicted(gpu, prec, batch, nhwc, FLAT)
        print(f"| {gpu} | {dle} ({prec}) | {batch} | {'NHWC' if nhwc else 'NCHW'} | {pub:,} | {got:,.0f} | "
              f"{(got - pub) / pub:+.1%} | {flat:,.0f} | {(flat - pub) / pub:+.1%} |")
    a = sorted(abs(e) for e in errs)
    record("vision_time_published", "ResNet-50 v1.5 training throughput vs NVIDIA's published 1-GPU rows", None,
           f"{len(errs)} rows (out of sample): median |error| {a[len(a) // 2]:.1%}, worst {max(errs, key=abs):+.1%}",
           {"rows": len(errs), "median_abs": a[len(a) // 2], "worst": max(errs, key=abs)}, "published")


if __name__ == "__main__":
    main()
