"""Planner search speed: wall time, configurations searched per second, analytic-engine calls.

    python -m bench run plan_speed        # prints the table, writes its section of bench/results/plan.md
"""
from __future__ import annotations

import argparse
import time


from bench.figures import record
from bench import data
from trainfit.analytic import compute_time
from trainfit.api import load_spec
from trainfit.hardware import get_gpu
from trainfit.plan.search import DEFAULT_STACKS, PlanQuery, search

ABOUT = {"summary": "planner search speed: seconds, configurations searched per second", "minutes": 1, "quick": None}

CASES = [("llama-3.1-405b", "H100-80GB", 16384, 8192, 16 * 2**20), ("llama-3.1-405b", "H100-80GB", 16384, 8192, None),
         ("llama-3.1-70b", "H100-80GB", 64, 8192, 4e6), ("gpt-3-175b", "A100-80GB", 1024, 2048, 3.2e6),
         ("llama-3.1-8b", "A100-40GB", 8, 4096, 1e6), ("mistral-7b", "RTX-4090", 1, 2048, None),
         # a MoE model on the stack that runs expert parallelism: ep and etp searched too (plan/space.py SEARCHED)
         ("qwen3-30b-a3b", "H100-80GB", 16, 4096, 2**20, ("megatron",)),
         # without a global batch: each group's splits run to its largest fitting micro-batch (search.LAZY_LIMIT)
         ("mixtral-8x7b", "H100-80GB", 32, 2048, None, ("megatron",)),
         # DeepSeek-V3's pre-training batch: 15,360 sequences of 4,096 tokens (DeepSeek-V3 technical report,
         # arXiv 2412.19437 §4.2), on 1,024 H100s: every dp × tp × pp × pp_split × vpp × ep × etp layout of the space
         # (its 61 layers pipelined through Megatron's first:N,last:M splits: plan/space.py balanced_ends)
         ("deepseek-v3", "H100-80GB", 1024, 4096, 15360 * 4096, ("megatron",))]
# the machine: two cores (CI's), the search shared over both (search(workers=...): plan/parallel.py)
WORKERS = 2
DEEPSEEK = "deepseek-v3 on 1024 "  # (the target: its whole space in <= 10 s on two cores)


def rates(speeds: dict[str, dict]) -> list[float]:
    """Setups searched per second, over the cases that searched any (one where nothing fits searches none)."""
    return [v["searched_per_s"] for v in speeds.values() if v["searched_per_s"]]


def table_rows(speeds: dict[str, dict]) -> list[dict]:
    """The page's speed-table lines (bench/report.py) from the measured speeds."""
    big = max((v for k, v in speeds.items() if k.startswith("llama-3.1-405b on 16384 ")), key=lambda v: v["seconds"])
    return [{"table": "speed", "what": "planner, setups searched per second",
             "measured": f"{min(rates(speeds)):,.0f}–{max(rates(speeds)):,.0f}", "target": "≥ 100k"},
            {"table": "speed", "what": "planner, llama-3.1-405b on 16,384 GPUs", "measured": f"{big['seconds']:.3f} s",
             "target": "< 2 s"}] + [
            {"table": "speed", "what": "planner, deepseek-v3 on 1,024 GPUs (Megatron's space)",
             "measured": f"{v['seconds']:.1f} s", "target": "≤ 10 s"}
            for k, v in speeds.items() if k.startswith(DEEPSEEK)]


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    rows = ["## Search speed (bench/targets/plan_speed.py)", "",
            f"{WORKERS} processes where the search is large enough to share (plan/parallel.py: 1,000+ groups; the "
            "others run in one), best of 3, each from empty op-list memos (compute_time.clear_memos). `searched` = (layout, "
            "ZeRO, recompute, precision, micro-batch, accumulation) combinations inside the batch constraint, and for "
            "an expert layout on Megatron each MoE dispatcher and --overlap-moe-comm (plan/space.py TIMED) (the space: "
            "the groups and assignments the stack's code rules refuse are counted too, found only where the search "
            "builds a group), "
            "each either excluded by its group's memory (its room: each stage's states and saved layers alone, no "
            "engine call; or the largest-fitting micro-batch bound), skipped by an exact throughput bound (`bounded`: "
            "step_time.layer_floor for a group, step_floor for a split: it cannot enter the ranking; a group's memory "
            "is judged only when one of its splits is about to be timed, so `bounded` counts many that would not fit) "
            "or timed; `engine calls` = analytic memory evaluations (a setup that does not fit usually costs one pipeline stage), one set "
            "per group judged for all its dispatchers; `layouts taken` = layouts whose groups were built (a search "
            "that judges its groups when taken enters each layout as one entry, bounded above all its groups: plan/"
            "search.py _layout_entry; a small one builds every group: -).", "",
            "| model | GPUs | global batch | seconds | searched | layouts taken | timed | bounded | engine calls | "
            "searched/s | best plan |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    speeds = {}
    for model, gpu, n, seq, gbt, *stacks in CASES:
        stacks = stacks[0] if stacks else DEFAULT_STACKS
        spec, g = load_spec(model), get_gpu(gpu)
        best = None
        for _ in range(3):
            compute_time.clear_memos()  # cold: each repetition searches as a fresh `trainfit plan` process does
            t0 = time.perf_counter()
            r = search(spec, g, PlanQuery(gpus=n, seq=seq, global_batch_tokens=gbt, stacks=stacks), workers=WORKERS)
            dt = time.perf_counter() - t0
            best = dt if best is None or dt < best else best
        st = r.stats
        plan = "nothing fits" if not r.candidates else (
            lambda s: f"{s.dp}×{s.tp}×{s.pp}{f' ep{s.ep}' if s.ep > 1 else ''} ZeRO-{s.zero} {s.batch}×{s.grad_accum} "
                      f"{s.recompute} {s.precision}")(
            r.candidates[0].setup)
        speeds[f"{model} on {n} {gpu}" + (f", {gbt:,.0f} tokens per batch" if gbt else "")
               + (f", --stacks {','.join(stacks)}" if stacks != DEFAULT_STACKS else "")] = {"seconds": best, "searched_per_s": st["searched"] / best}
        on = f" ({', '.join(stacks)})" if stacks != DEFAULT_STACKS else ""
        taken = f"{st['layouts_taken']:,} of {st['layouts']:,}" if "layouts_taken" in st else "-"
        rows.append(f"| {model} on {gpu}{on} | {n} | {gbt or '-'} | {best:.3f} | {st['searched']:,} | {taken} | "
                    f"{st['timed']:,} | "
                    f"{st.get('bounded', 0):,} | {st['engine_calls']:,} | {st['searched'] / best:,.0f} | {plan} |")
    out = "\n".join(rows) + "\n"
    print(out)
    big = max(speeds.items(), key=lambda kv: kv[1]["seconds"])
    record("plan_speed", "planner search speed",
           "≥ 100k setups/s; 405B on 16,384 GPUs < 2 s; DeepSeek-V3 on 1,024 GPUs ≤ 10 s",
           f"{min(rates(speeds)):,.0f}–{max(rates(speeds)):,.0f} searched/s; slowest: {big[0].split(',')[0]} in {big[1]['seconds']:.2f} s",
           speeds, "speed", rows=table_rows(speeds))
    data.write_section("plan.md", "## Search speed", out, "# Planner benchmarks")


if __name__ == "__main__":
    main()
