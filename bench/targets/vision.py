"""Vision models in the accuracy matrix: the catalog's tiny ResNet, ConvNeXt and ViT configs (transformers'
*ForImageClassification, random weights), 64x64 images, through trainfit's three engines.

    python -m bench run vision          # ~1 minute on 2 cores; prints a markdown table

Per setup: the analytic engine (analytic/vision.py) against the trace under CUDA semantics (512-byte blocks; no CPU
kernel scratch), and the trace against the real CPU step measured by the measure engine's CPU reader (profiler
allocation records) under CPU semantics (the trace probes oneDNN's scratch on this CPU).
"""
from __future__ import annotations

import argparse
from trainfit.api import Request, run_engines

ABOUT = {"summary": "vision models: analytic vs trace vs real CPU step", "minutes": 1, "quick": None}

SETUPS = [(model, precision, batch) for model in ("tiny-resnet", "tiny-resnet-basic", "tiny-convnext", "tiny-vit")
          for precision in ("fp32", "amp-bf16", "bf16") for batch in (4,)]


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    print("| model | precision | batch | analytic (cuda) | trace (cuda) | err | trace (cpu) | measured CPU step | err |")
    print("|---|---|---|---|---|---|---|---|---|")
    for model, precision, batch in SETUPS:
        kw = dict(model=model, batch=batch, precision=precision, optimizer="momentum")
        analytic, traced_cuda = (e.memory.peak for e in run_engines(Request(**kw), "all"))
        cpu = Request(**kw, device="cpu")
        traced = run_engines(cpu, "trace")[-1].memory.peak
        real = run_engines(cpu, "measure")[-1].memory.peak
        print(f"| {model} | {precision} | {batch} | {analytic:,} | {traced_cuda:,} | "
              f"{(analytic - traced_cuda) / traced_cuda:+.2%} | {traced:,} | {real:,} "
              f"| {(traced - real) / real:+.3%} |", flush=True)


if __name__ == "__main__":
    main()
