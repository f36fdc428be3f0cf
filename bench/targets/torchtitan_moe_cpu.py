"""--stack torchtitan MoE models: the analytic engine vs torchtitan's own MoE step on CPU.

    python -m bench run torchtitan_moe_cpu [--out bench/results/torchtitan_moe_cpu.md]

torchtitan's qwen3, deepseek_v3, llama4 and gpt_oss Transformers with its own MoE module (router, TokenReorderer, the
padded grouped GEMMs, the bmm combine, shared experts; gpt_oss's biased experts and clamped SwiGLU, its flex attention
with sinks: on CPU a stand-in saving what flex attention saves), built from tiny configs by trainfit's measure engine
(trainfit/step/torchtitan_moe.py), one process, every recompute policy torchtitan runs × fp32 / amp-bf16 / bf16. The
real peak is read from c10's allocation records (trainfit/measure/cpu_peak.py); the analytic engine predicts it with
analytic/torchtitan_moe.py. The rows with dense layers beside the MoE ones (deepseek_v3's first, llama4's
alternating) price each layer by its kind (analytic/memory.py interleaved_kinds: its saved set, per-op SAC's stored
matmuls, its gradients and its backward high points).

The second table runs the same models on two CPU ranks (trainfit measure --nproc 2: torchrun, gloo) as their
parallelize functions do: FSDP over both ranks (llama4's apply_fsdp), at EP 1 and EP 2 (apply_moe_ep_tp:
ExpertParallel's all-to-all dispatch and combine, which gpt_oss's own apply_moe_ep_tp applies too without TP,
models/gpt_oss/infra/parallelize.py:298-306; the experts an FSDP group of their own over efsdp), routing forced
round-robin (--moe-force-balance: torchtitan's _debug_force_load_balance) so that the busiest rank's load is known;
the real peak is each rank's own (both ranks agree; read from the session's allocation records, which hold what
torchtitan's ExpertParallel keeps between steps), the analytic engine predicts it for --dp 2 --zero 3 --ep N.
Per-op SAC under EP fails in torchtitan's own step on torch 2.13.0 (pytorch/torchtitan#3427: not measurable);
deepseek_v3's 16-bit recomputation peaks in its CPU math-path MLA attention's re-run, at _safe_softmax (the analytic
engine's backward.py _mla_math_rerun_moment; the trace probes the kernel's own tensors).

The trace engine runs the same model and step on fake tensors (one process; one rank of a fake process group) beside
each row; where the step reads the router's counts (the EP dispatch's splits, gpt_oss's expert biases) it takes the
routing's: the forced one under forced balance (exact), else an even split of the tokens (gpt_oss's one-process and
EP 1 rows: the real router's counts pad each expert differently, by under 8 rows). The third table has no real step:
real-scale models on CUDA semantics (CUDA's kernels, 512-byte blocks), the analytic engine against the trace at
2 × 8,192 tokens per GPU, one GPU's unsharded step, one rank of FSDP 8 with EP 8 (forced balance, and learned routing
at the dropless default load, analytic/moe_imbalance.py DROPLESS: the trace's all-to-all receives that load,
step/torchtitan_moe.py received_splits), gpt-oss-20b (one GPU; FSDP 8 with EP 8) and DeepSeek-V3 (671B) on 64 GPUs
with EP 64.
"""
from __future__ import annotations

import argparse
import statistics

from bench.data import results_dir
from bench.figures import pct, record

ABOUT = {"summary": "--stack torchtitan MoE (qwen3, deepseek_v3, llama4, gpt_oss): analytic and trace vs torchtitan's "
                    "real MoE step, one process and two ranks with expert parallelism; analytic vs trace at real scale",
         "minutes": 8, "quick": None}

POLICIES = ("none", "full", "op")
PRECISIONS = ("fp32", "amp-bf16", "bf16")


def cases():
    """(label, spec) of each model: the test file's tiny configs, and deepseek with its first layer dense."""
    from tests.stacks.test_torchtitan_moe import spec

    return [("qwen3", spec("qwen3")), ("deepseek_v3", spec("deepseek_v3")),
            ("llama4", spec("llama4", interleave_moe_layer_step=1)),
            ("deepseek_v3, 1 dense + 2 MoE layers", spec("deepseek_v3", first_k_dense_replace=1, num_hidden_layers=3)),
            ("llama4, dense and MoE layers alternating", spec("llama4")),
            ("gpt_oss, window 32 < seq", spec("gpt_oss")),
            ("gpt_oss, 4 layers, window 128 = seq", spec("gpt_oss", num_hidden_layers=4, sliding_window=128))]


def precisions(sp) -> tuple:
    """The precisions torchtitan trains the model in that trainfit models: gpt_oss's blocks are bf16 whatever
    training.dtype (stacks/torchtitan.toml [moe_models] blocks_bf16), so bf16 only."""
    from trainfit.stacks import get_stack

    facts = get_stack("torchtitan").facts["moe_models"]
    return ("bf16",) if facts["model"].get(sp.family) in facts["blocks_bf16"] else PRECISIONS


def traced(sp, s) -> int:
    """The trace engine's peak."""
    from trainfit import engines

    return engines.trace(sp, s).memory.peak


def _split_evenly(row: dict) -> bool:
    """A gpt_oss row whose routing is learned (one process, or EP 1): the trace repeats its experts' biases by an
    even split of the tokens (step/torchtitan_moe.py local_expert_rows), the real step by its router's counts."""
    return row["model"].startswith("gpt_oss") and row.get("ep", 1) == 1


def run() -> list[dict]:
    from trainfit.analytic.engine import estimate
    from trainfit.measure import measure
    from tests.stacks.test_torchtitan_moe import setup

    rows = []
    for label, sp in cases():
        for precision in precisions(sp):
            for recompute in POLICIES:
                s = setup(precision=precision, recompute=recompute)
                real = measure(sp, s, steps=0, warmup=1)
                est, tr = estimate(sp, s).memory.peak, traced(sp, s)
                rows.append({"model": label, "precision": precision, "recompute": recompute, "real": real.peak,
                             "analytic": est, "error": (est - real.peak) / real.peak, "trace": tr,
                             "trace_error": (tr - real.peak) / real.peak})
                print(f"{label:38s} {precision:9s} {recompute:5s} real {real.peak:>10,d}  analytic {est:>12,.0f}  "
                      f"{pct(rows[-1]['error'], digits=2)}  trace {pct(rows[-1]['trace_error'], digits=3)}", flush=True)
    return rows



SCALE_MODELS = ("qwen3-30b-a3b", "deepseek-v2-lite", "llama-4-scout")


def run_scale() -> list[dict]:
    """Real-scale catalog models on CUDA semantics: analytic vs trace (no real step here)."""
    from trainfit.analytic.engine import estimate
    from trainfit.api import load_spec
    from trainfit.setup import Setup

    one_gpu = [(name, "1 GPU", dict(precision=p, recompute=r)) for name in SCALE_MODELS for p in ("bf16", "fp32")
               for r in POLICIES]
    ep8 = [(name, "FSDP 8, EP 8, forced balance", dict(precision="bf16", recompute=r, dp=8, zero=3, ep=8,
                                                       moe_force_balance=True))
           for name in SCALE_MODELS[:2] for r in ("none", "full")]
    learned = [(name, "FSDP 8, EP 8, learned routing", dict(precision="bf16", recompute=r, dp=8, zero=3, ep=8))
               for name in SCALE_MODELS[:2] for r in ("none", "full")]
    # gpt-oss (its blocks bf16 whatever the precision: bf16 only), its expert biases repeated by the routing's counts
    gptoss = [("gpt-oss-20b", "1 GPU", dict(precision="bf16", recompute=r)) for r in POLICIES] + [
        ("gpt-oss-20b", "FSDP 8, EP 8, forced balance", dict(precision="bf16", recompute="full", dp=8, zero=3, ep=8,
                                                             moe_force_balance=True))]
    # DeepSeek-V3 (671B) on 64 GPUs, its experts over all of them
    ep64 = [("deepseek-v3", "FSDP 64, EP 64, forced balance", dict(precision="bf16", recompute="full", dp=64, zero=3,
                                                                   ep=64, moe_force_balance=True))]
    rows, specs = [], {}
    for name, layout, settings in one_gpu + ep8 + learned + gptoss + ep64:
        if name not in specs:  # (each model loaded once)
            specs[name] = load_spec(name)
        sp = specs[name]
        s = Setup(stack="torchtitan", batch=2, seq=8192, device="cuda", **settings)
        tr, est = traced(sp, s), estimate(sp, s).memory.peak
        rows.append({"model": name, "layout": layout, "precision": s.precision, "recompute": s.recompute,
                     "trace": tr, "analytic": est, "error": (est - tr) / tr})
        print(f"{name:18s} {layout:30s} {s.precision:5s} {s.recompute:5s} trace {tr / 2**30:9.3f} GiB  analytic "
              f"{est / 2**30:9.3f} GiB  {pct(rows[-1]['error'], digits=2)}", flush=True)
    return rows


RANK_POLICIES = ("none", "full")


def run_ranks() -> list[dict]:
    """The two-rank rows: one torchrun launch per model, every (precision, recompute, ep) setup in it."""
    from trainfit.analytic.engine import estimate
    from trainfit.measure.distributed import measure_distributed_many
    from tests.stacks.test_torchtitan_moe import setup

    rows = []
    models = cases()
    for label, sp in models[:3] + models[5:6]:  # qwen3, deepseek_v3, llama4 (MoE layers only) and gpt_oss
        setups = [setup(dp=2, zero=3, precision=p, recompute=r, ep=ep, moe_force_balance=ep > 1)
                  for ep in (1, 2) for p in precisions(sp) for r in RANK_POLICIES]
        for s, ranks in zip(setups, measure_distributed_many(sp, setups, 2, steps=0, warmup=2)):
            real = max(r.peak for r in ranks)
            est, tr = estimate(sp, s).memory.peak, traced(sp, s)
            rows.append({"model": label, "precision": s.precision, "recompute": s.recompute, "ep": s.ep,
                         "ranks": [r.peak for r in ranks], "real": real, "analytic": est,
                         "error": (est - real) / real, "trace": tr, "trace_error": (tr - real) / real})
            print(f"{label:12s} ep {s.ep} {s.precision:9s} {s.recompute:5s} real {[r.peak for r in ranks]} "
                  f"analytic {est:>12,.0f}  {pct(rows[-1]['error'], digits=2)}  "
                  f"trace {pct(rows[-1]['trace_error'], digits=3)}", flush=True)
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench run torchtitan_moe_cpu", description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(results_dir() / "torchtitan_moe_cpu.md"))
    args = ap.parse_args(argv)
    rows, ranked, scale = run(), run_ranks(), run_scale()
    errors = [abs(r["error"]) for r in rows]
    worst = max(rows, key=lambda r: abs(r["error"]))["error"]
    mixed = max((r for r in rows if "dense" in r["model"]), key=lambda r: abs(r["error"]))["error"]
    median = statistics.median(errors)
    lines = ["# --stack torchtitan MoE: analytic and trace vs torchtitan's real MoE step on CPU "
             "(`python -m bench run torchtitan_moe_cpu`)", "",
             __doc__.split("\n\n", 2)[2].strip(), "",
             "| model | precision | recompute | real peak (B) | analytic (B) | error | trace error |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {r['model']} | {r['precision']} | {r['recompute']} | {r['real']:,} | {r['analytic']:,.0f} | "
              f"{pct(r['error'], digits=2)} | {pct(r['trace_error'], digits=3)} |" for r in rows]
    rank_errors = [abs(r["error"]) for r in ranked]
    rank_worst = max(ranked, key=lambda r: abs(r["error"]))["error"]
    rank_median = statistics.median(rank_errors)
    lines += ["", "Two CPU ranks, FSDP over both, EP 1 and 2 (routing forced round-robin):", "",
              "| model | precision | recompute | ep | real peak per rank (B) | analytic (B) | error | trace error |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {r['model']} | {r['precision']} | {r['recompute']} | {r['ep']} | "
              f"{' / '.join(f'{p:,}' for p in r['ranks'])} | {r['analytic']:,.0f} | {pct(r['error'], digits=2)} | "
              f"{pct(r['trace_error'], digits=3)} |" for r in ranked]
    # the trace's own error where the routing is the real step's (every model but gpt_oss; gpt_oss forced at EP 2),
    # apart from gpt_oss under learned routing, whose experts' counts the trace splits evenly (its padding differs)
    traced_rows = [r for r in rows + ranked if not _split_evenly(r)]
    trace_worst = max(traced_rows, key=lambda r: abs(r["trace_error"]))["trace_error"]
    split_rows = [r for r in rows + ranked if _split_evenly(r)]
    split_worst = max(split_rows, key=lambda r: abs(r["trace_error"]))["trace_error"]
    scale_worst = max(scale, key=lambda r: abs(r["error"]))["error"]
    scale_median = statistics.median(abs(r["error"]) for r in scale)
    lines += ["", f"{len(ranked)} two-rank cases: median {pct(rank_median, False, 2)}, "
                  f"worst {pct(rank_worst, digits=2)}. Trace: {len(traced_rows)} cases routed as the real step, "
                  f"worst {pct(trace_worst, digits=4)}; {len(split_rows)} gpt_oss cases under learned routing (the "
                  f"trace splits the experts' counts evenly), worst {pct(split_worst, digits=3)}.",
              "", "Real-scale models, CUDA semantics, 2 × 8,192 tokens per GPU: (analytic − trace) / trace", "",
              "| model | layout | precision | recompute | trace (GiB) | analytic (GiB) | gap |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {r['model']} | {r['layout']} | {r['precision']} | {r['recompute']} | {r['trace'] / 2**30:,.3f} | "
              f"{r['analytic'] / 2**30:,.3f} | {pct(r['error'], digits=2)} |" for r in scale]
    lines += ["", f"{len(scale)} real-scale cases: median {pct(scale_median, False, 2)}, "
                  f"worst {pct(scale_worst, digits=2)}"]
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    record("torchtitan_moe_cpu", "--stack torchtitan MoE models: analytic and trace vs torchtitan's real MoE step on "
           "CPU; analytic vs trace at real scale", "median ≤ 2 %, worst ≤ 5 %; trace within 0.5 %",
           f"{len(rows)} cases: median {pct(median, False, 2)}, worst {pct(worst, digits=2)}; 2 ranks "
           f"{pct(rank_worst, digits=2)}; trace {pct(trace_worst, digits=3)} (gpt_oss split evenly "
           f"{pct(split_worst, digits=2)}); scale {pct(scale_worst, digits=2)}",
           {"cases": len(rows), "median_pct": round(median * 100, 3), "worst_pct": round(worst * 100, 3),
            "mixed_worst_pct": round(mixed * 100, 3), "rank_cases": len(ranked),
            "rank_median_pct": round(rank_median * 100, 3), "rank_worst_pct": round(rank_worst * 100, 3),
            "trace_cases": len(traced_rows), "trace_worst_pct": round(trace_worst * 100, 4),
            "trace_split_cases": len(split_rows), "trace_split_worst_pct": round(split_worst * 100, 3),
            "scale_cases": len(scale), "scale_median_pct": round(scale_median * 100, 3),
            "scale_worst_pct": round(scale_worst * 100, 3)}, "stacks",
           rows=[{"table": "accuracy", "stack": "torchtitan (MoE)", "engine": "analytic / trace",
                  "truth": "real CPU step, 1 process; every rank of 2 (FSDP, EP 1 and 2)",
                  "cases": f"{len(rows) + len(ranked)} / {len(traced_rows)}",
                  "median |error|": pct(statistics.median(errors + rank_errors), False, 2),
                  "worst": f"{pct(max((worst, rank_worst), key=abs), digits=2)} / {pct(trace_worst, digits=3)}"}])


if __name__ == "__main__":
    main()
