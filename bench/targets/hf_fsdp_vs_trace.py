"""--stack hf under FSDP2 with amp-bf16 (accelerate's MixedPrecisionPolicy, step/strategy.py): the analytic engine
against the distributed trace (rank 0 of a fake process group, which equals the real gloo step:
tests/stacks/test_hf_fsdp_mixed_precision.py), --zero 3 and 2, recompute none and full, CUDA and CPU semantics.

    python -m bench run hf_fsdp_vs_trace                   # the tiny configs (2 cores: about 3 minutes)
    python -m bench run hf_fsdp_vs_trace --real            # + llama-3.2-1b and qwen2.5-0.5b, dp 8, seq 1024, CUDA

Errors are signed: (analytic - trace) / trace.
"""
from __future__ import annotations

import argparse
import time

from bench.figures import pct, record
from trainfit.analytic.engine import estimate
from trainfit.models.hf_config import spec_from_config
from trainfit.models.resolve import load_model
from trainfit.setup import Setup
from trainfit.trace.distributed import trace_distributed

ABOUT = {"summary": "--stack hf under FSDP2 amp-bf16: analytic vs distributed trace", "minutes": 1, "quick": None}


def tiny(layers: int, vocab: int, tied: bool):
    return spec_from_config({"model_type": "llama", "hidden_size": 128, "intermediate_size": 512,
                             "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 2,
                             "vocab_size": vocab, "max_position_embeddings": 256, "tie_word_embeddings": tied},
                            f"tiny-L{layers}-V{vocab}" + ("-tied" if tied else ""))


# FSDP1 and the policy settings (--fsdp-version, --fsdp-param-dtype, --fsdp-reduce-dtype), beside the default; and
# fp32 without autocast (no MixedPrecision at all: the unsharded copies in the stored dtype, parallel/zero.py
# unsharded_bytes), FSDP2 and FSDP1
POLICIES = {"": {}, "FSDP1": {"fsdp_version": 1}, "no param_dtype": {"fsdp_param_dtype": "none"},
            "FSDP1, no param_dtype": {"fsdp_version": 1, "fsdp_param_dtype": "none"},
            "FSDP1, fp32 reduce": {"fsdp_version": 1, "fsdp_reduce_dtype": "fp32"},
            "fp32": {"precision": "fp32"}, "FSDP1, fp32": {"fsdp_version": 1, "precision": "fp32"}}


def rows(spec, dp: int, batch: int, seq: int, devices, recomputes, policies=("",)):
    for device in devices:
        for recompute in recomputes:
            for zero in (3, 2):
                for policy in policies:
                    s = Setup(**{"stack": "hf", "batch": batch, "seq": seq, "precision": "amp-bf16",
                                 "optimizer": "adamw", "device": device, "dp": dp, "zero": zero,
                                 "recompute": recompute, **POLICIES[policy]})
                    t0 = time.time()
                    traced = trace_distributed(spec, s).memory.peak
                    predicted = estimate(spec, s).memory.peak
                    yield (spec.name + (f" ({policy})" if policy else ""), dp, device, recompute, zero, traced,
                           predicted, (predicted - traced) / traced, time.time() - t0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--real", action="store_true", help="also llama-3.2-1b and qwen2.5-0.5b (dp 8, seq 1024, CUDA)")
    a = ap.parse_args(argv)
    cases = [(tiny(2, 1000, False), 2, 2, 64), (tiny(4, 1000, False), 2, 2, 64), (tiny(2, 8000, False), 2, 2, 64),
             (tiny(2, 8000, True), 2, 2, 64), (load_model("tiny-llama"), 2, 2, 64)]
    out = [r for spec, dp, b, s in cases for r in rows(spec, dp, b, s, ("cuda", "cpu"), ("none", "full"))]
    # the policy settings on the first model (CPU --zero 3 under gloo: its clones are not modelled, zero.py NB)
    policies = list(rows(cases[0][0], 2, 2, 64, ("cuda", "cpu"), ("none", "full"), tuple(p for p in POLICIES if p)))
    if a.real:
        for name in ("llama-3.2-1b", "qwen2.5-0.5b"):
            out += list(rows(load_model(name), 8, 1, 1024, ("cuda",), ("none", "full")))
    print("| model | dp | device | recompute | zero | trace B | analytic B | error | s |")
    print("|---|---:|---|---|---:|---:|---:|---:|---:|")
    for m, dp, dev, rc, z, tr, an, err, sec in out:
        print(f"| {m} | {dp} | {dev} | {rc} | {z} | {tr:,} | {an:,} | {err:+.2%} | {sec:.0f} |")
    for m, dp, dev, rc, z, tr, an, err, sec in policies:
        print(f"| {m} | {dp} | {dev} | {rc} | {z} | {tr:,} | {an:,} | {err:+.2%} | {sec:.0f} |")
    errs = sorted(abs(r[7]) for r in out)
    median, worst = errs[len(errs) // 2], max(out, key=lambda r: abs(r[7]))
    print(f"\n{len(out)} cases · median |error| {median:.2%} · worst {worst[7]:+.2%}")
    p_errs = sorted(abs(r[7]) for r in policies)
    p_median, p_worst = p_errs[len(p_errs) // 2], max(policies, key=lambda r: abs(r[7]))
    print(f"--fsdp-version 1 / --fsdp-param-dtype none / --fsdp-reduce-dtype fp32 / fp32: {len(policies)} cases · "
          f"median "
          f"|error| {p_median:.2%} · worst {p_worst[7]:+.2%} ({p_worst[0]}, {p_worst[2]}, ZeRO-{p_worst[4]})")
    if not a.real:  # the figures are the default run's
        record("hf_fsdp_vs_trace", "--stack hf under FSDP2 amp-bf16: analytic vs the distributed trace", None,
               f"FSDP2, {len(out)} cases: median {pct(median, False, 2)}, worst {pct(worst[7], digits=2)}; "
               f"FSDP1/policy, {len(policies)}: median {pct(p_median, False, 2)}, worst "
               f"{pct(p_worst[7], digits=2)}",
               {"cases": len(out), "median_pct": round(median * 100, 3), "worst_pct": round(worst[7] * 100, 3),
                "policy_cases": len(policies), "policy_median_pct": round(p_median * 100, 3),
                "policy_worst_pct": round(p_worst[7] * 100, 3)}, "stacks")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
