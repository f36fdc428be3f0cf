"""--stack deepspeed against the ZeRO paper's largest trainable models on 32 GB V100s (validation only, nothing
fitted).

    python -m bench run deepspeed_published

Source: Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models": plain
data parallelism runs out of memory above ~1.4B parameters on 32 GB GPUs (§1), and ZeRO-1 (P_os) fits 6.2B
(the figures the issue quotes; the paper's exact batch and sequence settings of that claim are not restated
here). Settings assumed: GPT-2-like models (vocab 50257, seq 1024, 16 heads), fp16 mixed precision with Adam,
activation checkpointing of every layer (the paper's runs use it), micro-batch 1, 64 data-parallel ranks (the
paper's Fig. 1 example Nd). Each claimed size must be judged to fit; a model ~40 % larger must not.
NB: the paper's baseline is PyTorch DDP with Megatron's fp16 optimizer, so the 1.4B row is estimated both as
DeepSpeed ZeRO-0 (FP16_Optimizer, whose step flattens fp32 copies of every gradient: 8 B/param transient)
and as --stack hf with torch DDP.
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path


from bench.figures import record
import trainfit

ABOUT = {"summary": "--stack deepspeed vs the ZeRO paper's largest trainable models", "minutes": 0.2, "quick": None}

GiB = 2**30


def gpt_config(layers: int, hidden: int, path: Path) -> str:
    cfg = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "activation_function": "gelu_new",
           "n_layer": layers, "n_embd": hidden, "n_head": 16, "n_positions": 1024, "n_ctx": 1024,
           "vocab_size": 50257, "layer_norm_epsilon": 1e-5, "bos_token_id": 50256, "eos_token_id": 50256}
    f = path / f"gpt-{layers}x{hidden}.json"
    f.write_text(json.dumps(cfg))
    return str(f)


# (claim, layers, hidden, stack, zero, should fit)
CASES = (
    ("DDP max ~1.4B (§1)", 26, 2048, "hf", 0, True),
    ("DDP max ~1.4B (§1), as DeepSpeed ZeRO-0 (not the paper's baseline)", 26, 2048, "deepspeed", 0, None),
    ("DDP, ~2.0B (larger)", 38, 2048, "hf", 0, False),
    ("DDP, ~2.0B (larger), as DeepSpeed ZeRO-0", 38, 2048, "deepspeed", 0, False),
    ("ZeRO-1 (P_os) fits 6.2B", 30, 4096, "deepspeed", 1, True),
    ("ZeRO-1, ~8.7B (larger)", 42, 4096, "deepspeed", 1, False),
)
# ZeRO-Offload (Ren et al. 2021, "ZeRO-Offload: Democratizing Billion-Scale Model Training", abstract: "train models
# with over 13 billion parameters on a single GPU", a V100-32GB; deepspeed.ai/tutorials/zero-offload: "up to 13
# billion parameters ... on a single GPU"): ZeRO-2 + offload_optimizer on one rank. The paper's 13B layout is not
# restated here: a GPT-2-like 64 x 4096 (12.9B) and one ~40 % larger. (claim, layers, hidden, zero, should fit)
OFFLOAD_CASES = (
    ("ZeRO-Offload, one V100: 13B fits (abstract)", 64, 4096, 2, True),
    ("ZeRO-Offload, one V100: ~18B (larger)", 90, 4096, 2, False),
)


def rows():
    with tempfile.TemporaryDirectory() as d:
        for claim, layers, hidden, stack, zero, should in CASES:
            path = gpt_config(layers, hidden, Path(d))
            precision = "fp16-master" if stack == "deepspeed" else "amp-fp16"
            e = trainfit.estimate(path, stack=stack, precision=precision, zero=zero, dp=64, batch=1, seq=1024,
                                  recompute="full", optimizer="adamw", gpu="V100-32GB")
            yield claim, e.params, stack, zero, precision, e.memory.peak / GiB, e.time.fits, should
        for claim, layers, hidden, zero, should in OFFLOAD_CASES:
            path = gpt_config(layers, hidden, Path(d))
            e = trainfit.estimate(path, stack="deepspeed", precision="fp16-master", zero=zero, dp=1, batch=1,
                                  seq=1024, recompute="full", optimizer="adamw", offload="optimizer", gpu="V100-32GB")
            yield claim, e.params, "deepspeed", zero, "fp16-master", e.memory.peak / GiB, e.time.fits, should


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    print("| claim | params | stack | zero | precision | peak GiB | judged | expected | ok |")
    print("|---|---|---|---|---|---|---|---|---|")
    checked = []
    for claim, params, stack, zero, precision, peak, fits, should in rows():
        checked += [] if should is None else [fits == should]
        print(f"| {claim} | {params / 1e9:.2f}B | {stack} | {zero} | {precision} | {peak:.1f} | "
              f"{'fits' if fits else 'does not fit'} | {EXPECT[should]} | {'-' if should is None else OK[fits == should]} |")
    record("deepspeed_published", "--stack deepspeed vs the ZeRO paper's largest trainable models on V100-32GB",
           "on the right side", f"{sum(checked)} of {len(checked)} claims on the right side",
           {"claims": len(checked), "right_side": sum(checked)}, "published")


EXPECT = {True: "fits", False: "does not fit", None: "(no claim)"}
OK = {True: "yes", False: "NO"}


if __name__ == "__main__":
    main()
