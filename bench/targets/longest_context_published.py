"""The longest context HF + FlashAttention-2 QLoRA fits, published by Unsloth, against `trainfit fit --longest-context`
(analytic engine). Validation only: nothing here is fitted, and no row is a test gate.

    python -m bench run longest_context_published           # the table: published, predicted, error
    python -m bench run longest_context_published --kbit-prep none   # as before --kbit-prep (all 16-bit)

Source: Unsloth, "Fine-tune Llama 3.3 with Unsloth" (10 Dec 2024, https://unsloth.ai/blog/llama3-3), tables
"Llama 3.1 (8B) max. context length" and "Llama 3.3 (70B) max. context length", column "Hugging Face+FA2"; the same
tables are in unslothai/unsloth README.md "Context length benchmarks". Setup as the page states it: Llama 3.1 8B /
Llama 3.3 70B Instruct, 4-bit QLoRA (nf4) on every linear (q, k, v, o, gate, up, down), rank 32, batch 1, sequences
padded to the length; FlashAttention-2. Llama 3.3 70B has Llama 3.1 70B's architecture (config.json: the same
sizes), so trainfit's llama-3.1-70b stands for it. What the page does not state, and the rows assume: gradient
checkpointing on (peft's prepare_model_for_kbit_training turns it on by default), bf16 compute, AdamW (torch's
foreach: the Trainer's default then, FLAGS below), the default --kbit-prep (peft's preparation). Unsloth's earlier Llama 3.1 post (https://unsloth.ai/blog/llama3-1) has the same
table from older versions (12 GB: 1,044; 80 GB: 28,567; 70B at 80 GB: 7,433), left out: one source per boundary.
NB: "N GB" taken as N GiB of device memory (--gpu-memory N); a card's CUDA total is 1-3 % below its nominal size
(A100 80GB: 79.25 GiB), so the predictions run long by that share of the capacity over the per-token bytes.
NB: Unsloth's HF+FA2 column is linear in the memory (1,619 tokens per 4 GB from 12 to 80 GB, 932 at 12 GB): a
fitted line through their measurements, not seven independent boundaries.
Errors: predicted / published - 1 (positive: trainfit fits a longer context than the published run did). The two
OOM rows (published: nothing fits) count as agreeing when no length fits.
"""
from __future__ import annotations

import argparse
import statistics

ABOUT = {"summary": "HF + FA2 QLoRA longest context (Unsloth's tables) vs `trainfit fit --longest-context`",
         "minutes": 0.1, "quick": None}

SOURCE = "https://unsloth.ai/blog/llama3-3"
# AdamW as the HF Trainer of the page's date ran it: transformers' default optim is "adamw_torch" (torch.optim.AdamW,
# foreach on CUDA), "adamw_torch_fused" only for torch >= 2.8 (transformers 00349ae src/transformers/training_args.py,
# the `optim` entry of TrainingArguments' docstring; trainfit's hf stack, stacks/hf.toml, takes the later default):
# torch 2.8 came out in August 2025, after the page (December 2024)
FLAGS = dict(lora_rank=32, quant="nf4", batch=1, recompute="full", attention="flash2", precision="bf16",
             optimizer="adamw", optimizer_impl="foreach")
GPU = "A100-80GB"  # the page's 70B runs: "on a 80GB A100"; other sizes: the same card with --gpu-memory N
# (model, GiB of device memory, published longest context; 0 = "OOM")
PUBLISHED = [
    ("llama-3.1-8b", 8, 0),
    ("llama-3.1-8b", 12, 932),
    ("llama-3.1-8b", 16, 2551),
    ("llama-3.1-8b", 24, 5789),
    ("llama-3.1-8b", 40, 12264),
    ("llama-3.1-8b", 48, 15502),
    ("llama-3.1-8b", 80, 28454),
    ("llama-3.1-70b", 48, 0),
    ("llama-3.1-70b", 80, 6916),
]


def predict(model: str, gib: float, kbit_prep: str | None = None) -> int:
    """The longest --seq `trainfit fit --longest-context` answers for the setup as given (0: none fits)."""
    from trainfit.api import load_gpu
    from trainfit.models.resolve import load_model
    from trainfit.setup import Setup
    from trainfit.studies.fit_advice import _Judge
    from trainfit.studies.longest_context import longest_seq

    spec = load_model(model)
    setup = Setup(**FLAGS, kbit_prep=kbit_prep)
    return longest_seq(_Judge(spec, setup, load_gpu(GPU, memory=gib), 0.0))


def rows(kbit_prep: str | None = None) -> list[dict]:
    """One row per published boundary: setup flags, published and predicted longest context, error % (None for the
    OOM rows), source. kbit_prep: --kbit-prep (None: the stack's default)."""
    out = []
    for model, gib, published in PUBLISHED:
        flags = dict(FLAGS, kbit_prep=kbit_prep) if kbit_prep else dict(FLAGS)
        predicted = predict(model, gib, kbit_prep)
        out.append({"model": model, "gpu": GPU, "gpu_memory": gib, "flags": flags, "published": published,
                    "predicted": predicted, "error_pct": 100 * (predicted / published - 1) if published else None,
                    "agrees_oom": (predicted == 0) if not published else None, "source": SOURCE})
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="longest_context_published")
    p.add_argument("--kbit-prep", default=None, choices=("peft", "norms", "none"))
    a = p.parse_args(argv)
    rs = rows(a.kbit_prep)
    print(f"{'model':<15}{'GiB':>5}{'published':>11}{'predicted':>11}{'error':>9}")
    for r in rs:
        err = f"{r['error_pct']:+.0f} %" if r["error_pct"] is not None else ("agrees" if r["agrees_oom"] else "fits!")
        print(f"{r['model']:<15}{r['gpu_memory']:>5}{r['published'] or 'OOM':>11}{r['predicted'] or 'OOM':>11}"
              f"{err:>9}")
    errs = [r["error_pct"] for r in rs if r["error_pct"] is not None]
    print(f"median error {statistics.median(errs):+.1f} %, median |error| "
          f"{statistics.median(abs(e) for e in errs):.1f} %, worst {max(errs, key=abs):+.0f} % over {len(errs)} rows")


if __name__ == "__main__":
    main()
