"""The RL step (--mode rl) per phase on this CPU: the real step (measure/rl.py), its trace on fake tensors
(trace/rl.py) and the analytic phases (analytic/rl.py), and the 7B GRPO estimate of issue 16.

    python -m bench run rl_step            # prints the tables docs/benchmarks/models.md quotes

The step: step/grpo.py, TRL 1.16's GRPO order (generate, the reference's log-probs, the policy's micro-batches
through TRL's fused head, the optimizer step) on tiny-llama with random weights, --device cpu semantics.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys

from bench.figures import pct, record
from trainfit.analytic.rl import rl_memory
from trainfit.api import Request, analytic, load_spec
from trainfit.setup import Setup

ABOUT = {"summary": "the GRPO step per phase: real CPU step vs trace vs analytic", "minutes": 2, "quick": None}

CASES = [  # (label, settings): two sizes, three precisions
    ("2 prompts × 4, 32 + 16 tokens, accum 2", dict(batch=2, group_size=4, prompt_len=32, completion_len=16,
                                                    grad_accum=2)),
    ("1 prompt × 2, 16 + 4 tokens, accum 2", dict(batch=1, group_size=2, prompt_len=16, completion_len=4,
                                                  grad_accum=2)),
]
PRECISIONS = ("fp32", "amp-bf16", "bf16")


@contextlib.contextmanager
def quiet():
    """The profiler's C++ start/stop lines go to fd 2."""
    sys.stderr.flush()
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def cpu_table() -> list[tuple[int, float]]:
    """Prints the per-phase table; each comparison's (trace - measured) bytes and (analytic - trace) / trace."""
    from trainfit.measure.rl import measure_rl
    from trainfit.trace.rl import trace_rl

    spec = load_spec("tiny-llama")
    print("| case | precision | phase | measured (B) | trace | analytic | trace vs measured | analytic vs trace |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    out = []
    for label, kw in CASES:
        for precision in PRECISIONS:
            s = Setup(mode="rl", device="cpu", precision=precision, beta=0.04, **kw)
            with quiet():
                an, _, _ = trace_rl(spec, s)
                peak, phase, measured = measure_rl(spec, s)
            model = rl_memory(spec, s)
            for name, real in measured.items():
                tr, a = an.phases[name], model.phases[name]
                mark = " (peak)" if name == phase else ""
                print(f"| {label} | {precision} | {name}{mark} | {real:,} | {tr:,} | {a:,} | "
                      f"{(tr - real) / real:+.3%} | {(a - tr) / tr:+.2%} |")
                out.append((tr - real, (a - tr) / tr))
    return out


def issue_table() -> None:
    base = dict(mode="rl", rl_algo="grpo", group_size=8, prompt_len=1024, completion_len=4096, gpu="H100-80GB")
    rows = [("TRL defaults (amp-bf16, beta 0, micro-batch 8)", {}),
            ("beta 0.04 (reference), accum 8, recompute full", dict(beta=0.04, grad_accum=8, recompute="full")),
            ("+ colocated vLLM (0.3)", dict(beta=0.04, grad_accum=8, recompute="full", rollout="vllm")),
            ("bf16 weights, beta 0.04, accum 8, recompute full", dict(precision="bf16", beta=0.04, grad_accum=8,
                                                                      recompute="full")),
            ("LoRA r16, beta 0.04, accum 8", dict(lora_rank=16, beta=0.04, grad_accum=8))]
    gib = 2**30
    print("| qwen2.5-7b GRPO (8 × (1024 + 4096)) | generate | score | forward end | backward | optimizer | peak "
          "(phase) | device total | fits | step s (generate / score / train) |")
    print("|---|---:|---:|---:|---:|---:|---|---:|---|---|")
    for label, kw in rows:
        e = analytic(Request(model="qwen2.5-7b", **base, **kw))
        p = e.memory.phases
        secs = e.detail.rl.phase_seconds
        cells = " | ".join(f"{p[k] / gib:.1f}" if k in p else "–"
                           for k in ("generate", "score", "forward_end", "backward", "optimizer_step"))
        print(f"| {label} | {cells} | {e.memory.peak / gib:.1f} GiB ({e.memory.peak_phase}) | "
              f"{e.memory.device_total / gib:.1f} GiB | {'yes' if e.time.fits else 'no'} | {e.time.step_seconds:.1f} "
              f"({secs['generate']:.1f} / {secs['score']:.1f} / {secs['train']:.1f}) |")


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    issue_table()
    print()
    comparisons = cpu_table()
    trace_bytes = max(abs(b) for b, _ in comparisons)
    analytic = max((g for _, g in comparisons), key=abs)
    record("rl_step", "RL post-training: a tiny GRPO step, per phase", "trace 0.5 %, analytic 3 %",
           f"trace within {trace_bytes:,} B of the real step in all {len(comparisons)} phase comparisons; "
           f"analytic within {pct(analytic, False, 2)}",
           {"comparisons": len(comparisons), "trace_worst_bytes": trace_bytes,
            "analytic_worst_pct": round(analytic * 100, 3)}, "cpu-memory",
           rows=[{"table": "cpu", "stack": "hf (RL, GRPO)", "case": "every phase", "cases": len(comparisons),
                  "trace vs real": f"≤ {trace_bytes:,} B", "analytic vs real": f"vs trace ≤ {pct(analytic, False, 2)}"}])


if __name__ == "__main__":
    main()
