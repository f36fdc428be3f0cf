"""The analytic engine against the trace engine on the terms closed from the families matrix's known gaps, at sizes
and setups the matrix does not run (docs/benchmarks/cpu-memory.md).

    python -m bench run gaps_vs_trace      # ~40 s on 2 cores; prints a markdown table

Each family is its catalog config shrunk as tests/analytic/test_vs_trace_families.py shrinks it (2 layers, hidden
128, the published MLA widths kept), traced on fake tensors (exact against real CPU steps) and priced analytically.
"""
from __future__ import annotations

import argparse


from tests.analytic.test_vs_trace_families import CONFIGS, shrink

from trainfit.analytic.engine import estimate
from trainfit.models.hf_config import spec_from_config
from trainfit.setup import Setup
from trainfit.trace import trace_spec

ABOUT = {"summary": "analytic vs trace on the families matrix's closed gaps, other sizes", "minutes": 1, "quick": None}

INFER = dict(mode="infer")
CASES = [  # (family, batch, seq, setup fields)
    ("deepseek_v2", 1, 96, dict(INFER, precision="fp32", device="cpu")),
    ("deepseek_v2", 2, 300, dict(INFER, precision="fp32", device="cpu")),
    ("deepseek_v2", 3, 64, dict(INFER, precision="bf16", device="cuda")),
    ("deepseek_v2", 2, 128, dict(INFER, precision="amp-bf16", device="cpu")),
    ("deepseek_v3", 3, 200, dict(INFER, precision="bf16", device="cpu")),
    ("deepseek_v3", 2, 400, dict(INFER, precision="bf16", device="cpu")),
    ("deepseek_v3", 1, 300, dict(INFER, precision="amp-bf16", device="cuda")),
    ("deepseek_v3", 2, 128, dict(INFER, precision="fp32", device="cuda")),
    ("qwen2_moe", 3, 64, dict(precision="fp32", recompute="full", optimizer="sgd", device="cpu")),
    ("opt", 5, 64, dict(INFER, precision="amp-bf16", device="cpu")),
    ("gemma2", 3, 64, dict(INFER, precision="amp-bf16", device="cpu")),
    ("gemma2", 2, 128, dict(INFER, precision="amp-bf16", device="cuda")),
    ("llama", 2, 128, dict(INFER, precision="bf16", device="cpu", attention="eager")),
    ("llama", 2, 128, dict(INFER, precision="amp-bf16", device="cuda", attention="eager")),
    # the second round (docs/benchmarks/cpu-memory.md): the MLP dropout's gradient, Gemma-2's post-feed-forward norm and the
    # checkpointed masks, MLA's gradients at the scores' moment, BERT's last-layer forward and math-path moments
    ("gpt2", 3, 64, dict(precision="fp32", recompute="full", optimizer="sgd", device="cpu")),
    ("gpt2", 1, 200, dict(precision="amp-bf16", recompute="full", optimizer="adamw", device="cpu")),
    ("gemma2", 3, 64, dict(precision="bf16", recompute="full", optimizer="adamw", device="cuda")),
    ("gemma2", 1, 200, dict(precision="amp-bf16", recompute="full", optimizer="sgd", device="cuda")),
    ("gemma2", 2, 128, dict(precision="fp32", recompute="full", optimizer="sgd", device="cpu")),
    ("llama", 2, 128, dict(precision="bf16", recompute="full", optimizer="sgd", device="cuda", attention="eager")),
    ("deepseek_v3", 3, 64, dict(precision="amp-bf16", optimizer="sgd", device="cpu")),
    ("deepseek_v2", 2, 96, dict(precision="fp32", optimizer="sgd", device="cpu")),
    ("bert", 3, 64, dict(precision="bf16", optimizer="adamw", device="cpu", head="seq-cls")),
    ("bert", 1, 200, dict(precision="amp-bf16", optimizer="adamw", device="cuda", head="seq-cls")),
    ("roberta", 2, 96, dict(precision="amp-bf16", optimizer="adamw", device="cpu", head="token-cls")),
    ("bert", 4, 64, dict(precision="bf16", optimizer="sgd", device="cpu", head="token-cls")),
]


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    print("| family | mode | head | precision | recompute | attention | device | batch | seq | trace peak | analytic peak "
          "| gap |")
    print("|" + "---|" * 12)
    gaps = []
    for family, batch, seq, fields in CASES:
        spec = spec_from_config(shrink(CONFIGS[family]), f"small-{family}")
        st = Setup(batch=batch, seq=seq, **fields)
        t, a = trace_spec(spec, st, flops=False).memory.peak, estimate(spec, st).memory.peak
        gaps.append(abs((a - t) / t))
        print(f"| {family} | {st.mode} | {st.head} | {st.precision} | {st.recompute} | {st.attention_kernel} | {st.device} | {batch} "
              f"| {seq} | {t:,} | {a:,} | {(a - t) / t:+.2%} |", flush=True)
    gaps.sort()
    print(f"\n{len(gaps)} cases · median |gap| {gaps[len(gaps) // 2]:.2%} · worst {gaps[-1]:.2%}")


if __name__ == "__main__":
    main()
