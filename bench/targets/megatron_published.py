"""--stack megatron against the published Megatron-LM runs of Korthikanti et al. 2022 (shared/calibration.md C3).

All four models trained on A100-80GB with TP 8, seq 2048, vocab 51200 (175B and 530B with interleaved 1F1B, 3 model
chunks per device), both with full recompute and with SP + selective recompute: each prediction must fit in 80 GB.
Validation only (nothing is fitted). Run: python -m bench run megatron_published
"""
from __future__ import annotations

import argparse
from bench.figures import record
from trainfit.analytic.memory import train_memory
from trainfit.models.hf_config import spec_from_config
from trainfit.setup import Setup

ABOUT = {"summary": "--stack megatron vs Korthikanti et al. 2022's runs: each fits 80 GB",
         "minutes": 0.2, "quick": None}

A100_80GB = 80e9
# name: heads, hidden, layers, pp, global batch, micro-batch, vpp
RUNS = {"22B": (64, 6144, 48, 1, 4, 4, 1), "175B": (96, 12288, 96, 8, 64, 1, 3),
        "530B": (128, 20480, 105, 35, 280, 1, 3), "1T": (160, 25600, 128, 64, 512, 1, 1)}


def gpt(heads: int, h: int, layers: int):
    return spec_from_config({
        "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": h, "n_head": heads, "n_layer": layers,
        "vocab_size": 51200, "n_positions": 2048, "n_inner": 4 * h, "activation_function": "gelu",
        "resid_pdrop": 0.1, "attn_pdrop": 0.1, "embd_pdrop": 0.1, "tie_word_embeddings": True}, f"gpt-{h}")


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    fit = []
    print(f"{'model':6} {'recompute':22} {'GiB/GPU':>8} {'states':>7} {'acts':>6} {'phase':>14}  fits 80GB")
    for name, (heads, h, layers, pp, gbs, mb, vpp) in RUNS.items():
        spec = gpt(heads, h, layers)
        for label, kw in (("full", dict(recompute="full")),
                          ("SP + selective", dict(recompute="selective", sequence_parallel=True))):
            try:
                setup = Setup(stack="megatron", precision="bf16-master", tp=8, pp=pp, vpp=vpp, batch=mb, seq=2048,
                              grad_accum=gbs // mb, attention="eager", **kw)
            except Exception as e:  # a layout trainfit refuses: say so
                print(f"{name:6} {label:22} refused: {e}")
                continue
            m = train_memory(spec, setup)
            states = m.weights + m.gradients + m.master + m.optimizer
            fit.append(m.peak <= A100_80GB)
            print(f"{name:6} {label:22} {m.peak / 2**30:8.1f} {states / 2**30:7.1f} {m.activations / 2**30:6.1f} "
                  f"{m.peak_phase:>14}  {'yes' if m.peak <= A100_80GB else 'NO'}")
    record("megatron_published", "--stack megatron vs Korthikanti et al. 2022's runs (A100-80GB, TP 8)",
           "on the right side", f"{sum(fit)} of {len(fit)} published runs fit in 80 GB",
           {"runs": len(fit), "fit": sum(fit)}, "published")


if __name__ == "__main__":
    main()
