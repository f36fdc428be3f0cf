"""A vision model in the accuracy matrix: ViT (transformers' ViTForImageClassification, random weights) on CPU.

    python bench/vision.py          # ~1 minute; prints a markdown table

Truth: the real standard step measured with the measure engine's CPU reader (profiler allocation records) on the
module itself; prediction: the trace engine's any-module path (`trainfit.trace.trace`). The analytic engine models
transformer language models only (ModelSpec has no patch embedding or image head), so it has no column here.
"""
from __future__ import annotations

import contextlib
import os

import torch
from transformers import ViTConfig, ViTForImageClassification

from trainfit.measure.runner import _peak_cpu
from trainfit.setup import Setup
from trainfit.step import make_optimizer, run_step
from trainfit.step.build import param_dtype
from trainfit.trace import trace

CONFIG = dict(image_size=64, patch_size=8, hidden_size=192, num_hidden_layers=4, num_attention_heads=6,
              intermediate_size=768, num_labels=100)


def build(batch: int, dtype: torch.dtype):
    torch.manual_seed(0)
    model = ViTForImageClassification(ViTConfig(**CONFIG, attn_implementation="sdpa")).to(dtype)
    example = {"pixel_values": torch.randn(batch, 3, 64, 64, dtype=dtype), "labels": torch.randint(0, 100, (batch,))}
    return model, example


def main() -> None:
    print("| model | precision | optimizer | recompute | batch | measured peak (B) | phase | trace | err |")
    print("|---|---|---|---|---|---|---|---|---|")
    for precision, optimizer, batch in (("fp32", "adamw", 8), ("amp-bf16", "adamw", 8), ("bf16", "momentum", 16),
                                        ("fp32", "sgd", 32)):
        setup = Setup(batch=batch, seq=1, precision=precision, optimizer=optimizer, device="cpu")
        model, example = build(batch, param_dtype(setup))
        model.train()
        optimizer_ = make_optimizer(model, setup)
        run_step(model, optimizer_, [example], setup)  # warm-up: optimizer state resident
        with open(os.devnull, "w") as devnull, contextlib.redirect_stderr(devnull):
            real = _peak_cpu(model, optimizer_, [example], setup)
        # a real module is copied as fake tensors (ViT's truncated-normal init cannot run on fake tensors)
        fresh, fresh_example = build(batch, torch.float32)
        traced = trace(fresh, fresh_example, setup, flops=False)
        err = (traced.memory.peak - real.peak) / real.peak
        print(f"| vit (4 layers, 192 wide, 64×64 images) | {precision} | {optimizer} | none | {batch} | {real.peak:,} "
              f"| {real.peak_phase} | {traced.memory.peak:,} | {err:+.3%} |", flush=True)


if __name__ == "__main__":
    main()
