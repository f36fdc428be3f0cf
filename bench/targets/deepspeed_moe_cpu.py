"""ZeRO-3 on an HF MoE model: the parameters DeepSpeed's own coordinator holds gathered, vs trainfit's analytic gather.

    python -m bench run deepspeed_moe_cpu [--model tiny-mixtral] [--out bench/results/deepspeed_moe_cpu.md]

One `torch.distributed.run --nproc-per-node 2` launch per case (gloo, CPU): trainfit's DeepSpeed step
(trainfit.step.deepspeed: build, deepspeed.initialize with the `--emit deepspeed` config, run_step) with
PartitionedParameterCoordinator.fetch_sub_module (deepspeed/runtime/zero/partitioned_param_coordinator.py:310) wrapped:
after each fetch (the module's own gather and the prefetch it kicks off, :420-485) the probe sums ds_numel over the
parameters that are not NOT_AVAILABLE (gathered or in flight) and not ds_persist (the small ones every rank keeps
whole), during the third step (the first two record the trace prefetching needs). The largest sum, and the module it
was taken at, are what the analytic gather (analytic/parallel/deepspeed.py gathered_numel) counts.

The ZeRO-3 knobs are DeepSpeed's defaults (stacks/deepspeed.toml) or, to put a tiny model in the regime of a large
one, scaled down (--prefetch/--max-live/--reuse, elements): Mixtral 8x7B's MoE block is 1.4e9 elements, above
stage3_max_live_parameters (1e9), so its prefetch stops there; tiny-mixtral's is 1.6e6.
"""
from __future__ import annotations

import argparse
import json
import os
import pickle

from bench.data import results_dir
from bench.targets.deepspeed_cpu import rank_job

ABOUT = {"summary": "--stack deepspeed ZeRO-3 on an MoE model: gathered parameters vs DeepSpeed's coordinator",
         "minutes": 2, "quick": None}


def gather_worker(job_path: str) -> None:
    """One rank: the DeepSpeed step with the coordinator's fetch wrapped (module docstring)."""
    import torch
    import torch.distributed as dist
    from deepspeed.runtime.zero import partitioned_param_coordinator as ppc
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    from trainfit.step import deepspeed as kit

    with open(job_path, "rb") as f:
        job = pickle.load(f)
    spec, setup, knobs = job["spec"], job["setup"], job["knobs"]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    seen = {"on": False, "max": 0, "at": "", "leaf": []}
    model_ref = {}
    orig = ppc.PartitionedParameterCoordinator.fetch_sub_module

    def fetch(self, module, forward):
        orig(self, module, forward)
        if not seen["on"]:
            return
        held = [(n, p.ds_numel) for n, p in model_ref["m"].named_parameters()
                if p.ds_status != ZeroParamStatus.NOT_AVAILABLE and not p.ds_persist]
        live = sum(k for _, k in held)
        if live > seen["max"]:
            seen.update(max=live, at=f"{type(module).__name__} ({'forward' if forward else 'backward'})", held=held)

    ppc.PartitionedParameterCoordinator.fetch_sub_module = fetch
    config = kit.ds_config(setup)
    config["zero_optimization"].update(knobs)
    torch.manual_seed(0)
    model = kit.build(spec, setup)
    model_ref["m"] = model
    import deepspeed

    kit._skip_shm_kernel(deepspeed)
    engine, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=kit.client_optimizer(model, setup),
                                                   config={**config, "zero_allow_untested_optimizer": True})
    seen["leaf"] = sorted({type(m).__name__ for m in model.modules() if getattr(m, "_z3_leaf", False)})
    torch.manual_seed(1000 + rank)
    batches = kit.make_batches(spec, setup)
    for _ in range(2):
        kit.run_step(engine, optimizer, batches, setup)
    seen["on"] = True
    kit.run_step(engine, optimizer, batches, setup)
    with open(os.path.join(job["dir"], f"rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "gathered_max": seen["max"], "at": seen["at"], "leaf": seen["leaf"],
                   "held": seen.get("held", [])}, f)


def gather_probe(spec, setup, knobs: dict | None = None, timeout: int = 600) -> list[dict]:
    """Per rank {gathered_max, at, leaf, held: the (name, elements) gathered at that moment}: gather_worker on
    setup.dp CPU ranks."""
    return rank_job(__spec__.name, "--gather-worker", {"spec": spec, "setup": setup, "knobs": knobs or {}},
                    setup.dp, "gather", timeout)


# (knobs, leaf MoE blocks): DeepSpeed's defaults, then knobs scaled to a tiny model (elements; persistence 1000 makes
# its attention projections partitioned, as a large model's are)
CASES = (({}, True),
         ({"stage3_max_reuse_distance": 300000, "stage3_max_live_parameters": 1200000,
           "stage3_prefetch_bucket_size": 60000, "stage3_param_persistence_threshold": 1000}, True),
         ({"stage3_max_reuse_distance": 0, "stage3_prefetch_bucket_size": 0, "stage3_param_persistence_threshold": 1000},
          True),
         ({"stage3_max_reuse_distance": 0, "stage3_prefetch_bucket_size": 0, "stage3_param_persistence_threshold": 1000},
          False),
         ({"stage3_max_reuse_distance": 500000, "stage3_max_live_parameters": 3000000,
           "stage3_prefetch_bucket_size": 200000, "stage3_param_persistence_threshold": 1000}, True),
         ({"stage3_max_reuse_distance": 500000, "stage3_max_live_parameters": 3000000,
           "stage3_prefetch_bucket_size": 200000, "stage3_param_persistence_threshold": 1000}, False))


# other families' MoE blocks (not leaves: gpt-oss's router and expert biases, DeepSeek's MLA and shared experts), at
# the scaled knobs (at DeepSpeed's defaults every parameter of these tiny configs is under the persistence threshold)
FAMILIES = ("tiny-gpt-oss", "tiny-deepseek")
FAMILY_KNOBS = CASES[1][0]


def probe_knobs(knobs: dict, leaf: bool) -> dict:
    """The zero_optimization entries of a case: without leaves, DeepSpeed's leaf_module classes emptied."""
    return {**knobs, **({} if leaf else {"leaf_module": {"classes": []}})}


def replayed(spec, knobs: dict, leaf: bool) -> int:
    """analytic/parallel/deepspeed.py gathered_numel for the case (recompute none, as the probe's step)."""
    from trainfit import stacks
    from trainfit.analytic.params import count_params
    from trainfit.analytic.parallel import zero3_replay
    from trainfit.analytic.parallel.deepspeed import gathered_numel

    facts = stacks.get_stack("deepspeed")
    if leaf:
        return gathered_numel(spec, count_params(spec), False, facts, **knobs)
    k = [int(knobs.get(n, facts.fact(n))) for n in ("stage3_param_persistence_threshold", "stage3_prefetch_bucket_size",
                                                    "stage3_max_live_parameters", "stage3_max_reuse_distance")]
    return zero3_replay.replay(zero3_replay.hf_model(spec, count_params(spec), False), False, *k)


def _leaf_families() -> list[str]:
    from trainfit import stacks

    return stacks.get_stack("deepspeed").fact("leaf_module", "families")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gather-worker")
    ap.add_argument("--model", default="tiny-mixtral")
    ap.add_argument("--out", default=str(results_dir() / "deepspeed_moe_cpu.md"))
    a = ap.parse_args(argv)
    if a.gather_worker:
        return gather_worker(a.gather_worker)
    import time

    import deepspeed

    from bench.targets import deepspeed_cpu as ds

    t0 = time.time()
    spec, setup = ds.case(a.model, 3, "bf16-master")
    lines = [f"{a.model}, ZeRO-3, batch {setup.batch}, seq {setup.seq}, 2 CPU ranks (gloo), deepspeed "
             f"{deepspeed.__version__}; `python -m bench run deepspeed_moe_cpu`", "",
             "Elements gathered at once (the most over the third step, either rank), DeepSpeed's coordinator "
             "(gather_probe) vs analytic/parallel/zero3_replay.py:", "",
             "| ZeRO-3 knobs (elements) | leaf MoE blocks | at | measured | replay | error |", "|---|---|---|---|---|---|"]
    for knobs, leaf in CASES:
        ranks = gather_probe(spec, setup, probe_knobs(knobs, leaf))
        m = max(r["gathered_max"] for r in ranks)
        r = replayed(spec, knobs, leaf)
        lines.append(f"| {', '.join(f'{k[7:]}={v:,}' for k, v in knobs.items()) or 'defaults'} | "
                     f"{', '.join(ranks[0]['leaf']) or 'none'} | {ranks[0]['at']} | {m:,} | {r:,} | "
                     f"{ds.err(r, m)} |")
    lines += ["", "Other families at the second row's knobs:", "", "| model | at | measured | replay | error |",
              "|---|---|---|---|---|"]
    for model in FAMILIES:
        fspec, fsetup = ds.case(model, 3, "bf16-master")
        ranks = gather_probe(fspec, fsetup, FAMILY_KNOBS)
        m = max(r["gathered_max"] for r in ranks)
        r = replayed(fspec, FAMILY_KNOBS, fspec.family in _leaf_families())
        lines.append(f"| {model} | {ranks[0]['at']} | {m:,} | {r:,} | {ds.err(r, m)} |")
    lines += ["", "The whole step's live bytes (the `--emit deepspeed` config), measured (max rank) vs analytic:", "",
              "| precision | measured peak | analytic | error | forward / backward / optimizer measured | analytic |",
              "|---|---|---|---|---|---|"]
    for precision in ("bf16-master", "fp32"):
        spec, setup = ds.case(a.model, 3, precision)
        ranks, est = ds.measure(spec, setup), ds.analytic(spec, setup)
        m = max(r["peak"] for r in ranks)
        ph = [max(r["phase_peaks"][k] for r in ranks) for k in ("forward", "backward", "optimizer")]
        ap_ = [est.phases[k] for k in ("forward_end", "backward", "optimizer_step")]
        lines.append(f"| {precision} | {m:,} | {est.peak:,} | {ds.err(est.peak, m)} | "
                     f"{' / '.join(f'{x:,}' for x in ph)} | {' / '.join(f'{x:,.0f}' for x in ap_)} |")
    lines[0] += f" ({time.time() - t0:.0f} s)"
    text = "\n".join(lines) + "\n"
    print(text)
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        f.write("# DeepSpeed ZeRO-3 on an MoE model, 2 CPU ranks: gathered parameters and peaks\n\n" + text)


if __name__ == "__main__":
    main()
