"""Every analytic answer of a broad matrix, as JSON lines: the check that a refactoring changed no number.

    python -m bench run outputs_snapshot OUT.jsonl            # write the snapshot of this tree
    python -m bench run outputs_snapshot OUT.jsonl --diff BASE.jsonl   # and list every case whose answer differs

The matrix: every catalog model (token and vision) in each mode it takes, on an H100 (train, infer, serve, rl);
each stack × parallel layout × ZeRO/offload/recompute on a dense and a MoE model; the precisions, LoRA/QLoRA and
optimizers; serving with either engine; and `plan` for two models. Each line is {"case": ..., "answer": the
estimate's to_dict() (or the plan's dict), or {"error": the one-line refusal}}. Refusals are answers too: a
refactoring must refuse the same setups with the same line.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from trainfit import api
from trainfit.errors import TrainfitError
from trainfit.precision import TRAIN_PRECISIONS
from trainfit.setup import OPTIMIZERS

ABOUT = {"summary": "every analytic answer of a broad matrix: the refactoring check", "minutes": 3, "quick": None}

GPU = "H100-80GB"


def cases():
    """(name, kind, kwargs) of every case; kind 'estimate' (api.Request kwargs) or 'plan'."""
    tokens = [m["name"] for m in api.catalog_models()]
    vision = [m["name"] for m in api.vision_models()]
    for m in tokens:
        yield f"{m} train", "estimate", dict(model=m, gpu=GPU)
        yield f"{m} train b4 s1024 full", "estimate", dict(model=m, gpu=GPU, batch=4, seq=1024, recompute="full")
        yield f"{m} infer", "estimate", dict(model=m, gpu=GPU, mode="infer", batch=8)
        yield f"{m} serve", "estimate", dict(model=m, gpu=GPU, mode="serve")
        yield f"{m} serve sglang", "estimate", dict(model=m, gpu=GPU, mode="serve", server="sglang")
        yield f"{m} rl", "estimate", dict(model=m, gpu=GPU, mode="rl")
    for m in vision:
        yield f"{m} train", "estimate", dict(model=m, gpu=GPU)
        yield f"{m} train b64", "estimate", dict(model=m, gpu=GPU, batch=64)
    layouts = [dict(), dict(dp=8), dict(dp=8, zero=1), dict(dp=8, zero=2), dict(dp=8, zero=3), dict(tp=2),
               dict(tp=4, sequence_parallel=True), dict(pp=2, grad_accum=8), dict(tp=2, pp=2, dp=2, grad_accum=4),
               dict(cp=2), dict(dp=4, zero=3, offload="optimizer"), dict(dp=4, zero=3, offload="params"),
               dict(offload="activations"), dict(recompute="selective"), dict(recompute="full"),
               dict(compile=True), dict(vpp=2, pp=2, grad_accum=8), dict(ep=4, dp=4)]
    for stack in ("hf", "torchtitan", "megatron", "deepspeed"):
        for model in ("llama-3.1-8b", "mixtral-8x7b", "qwen3-30b-a3b"):
            for lay in layouts:
                text = " ".join(f"{k}={v}" for k, v in lay.items())
                yield f"{model} {stack} {text}", "estimate", dict(model=model, gpu=GPU, stack=stack, seq=4096, **lay)
    for p in TRAIN_PRECISIONS:
        yield f"llama-3.2-1b {p}", "estimate", dict(model="llama-3.2-1b", gpu=GPU, precision=p)
    for opt in OPTIMIZERS:
        yield f"llama-3.2-1b {opt}", "estimate", dict(model="llama-3.2-1b", gpu=GPU, optimizer=opt)
    for kw in (dict(lora_rank=16), dict(lora_rank=16, quant="nf4"), dict(lora_rank=64, lora_targets="attention")):
        yield f"llama-3.1-8b {kw}", "estimate", dict(model="llama-3.1-8b", gpu="A10G", **kw)
    for model, gpus in (("llama-3.1-8b", 8), ("llama-3.1-70b", 64)):
        yield f"plan {model} {gpus}", "plan", dict(model=model, gpus=gpus)


def answer(kind: str, kw: dict) -> dict:
    try:
        if kind == "plan":
            from trainfit.plan.search import PlanQuery, search
            from trainfit.report.plan import plan_dict

            d = plan_dict(search(api.load_spec(kw["model"]), api.load_gpu(GPU), PlanQuery(gpus=kw["gpus"], seq=4096)))
            d.pop("searched_per_second", None)
            d.pop("seconds", None)
            return d
        return api.analytic(api.Request(**kw)).to_dict()
    except TrainfitError as e:
        return {"error": str(e).splitlines()[0]}
    except TypeError as e:  # a setting this tree does not have (an older or newer tree)
        return {"error": f"TypeError: {e}"}


def _strip_timing(d):
    """Wall-clock fields differ run to run; everything else must not."""
    if isinstance(d, dict):
        return {k: _strip_timing(v) for k, v in d.items() if k not in ("searched_per_second", "search_seconds",
                                                                         "seconds", "elapsed_seconds")}
    if isinstance(d, list):
        return [_strip_timing(v) for v in d]
    return d


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--diff", help="a snapshot to compare with")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    n = 0
    with open(a.out, "w") as f:
        for name, kind, kw in cases():
            f.write(json.dumps({"case": name, "answer": _strip_timing(answer(kind, kw))}, sort_keys=True) + "\n")
            n += 1
    print(f"{n} cases in {time.perf_counter() - t0:.0f} s -> {a.out}", file=sys.stderr)
    if not a.diff:
        return 0
    base = {json.loads(line)["case"]: line for line in open(a.diff)}
    new = {json.loads(line)["case"]: line for line in open(a.out)}
    changed = [c for c in new if c in base and base[c] != new[c]]
    for c in changed:
        print(f"changed: {c}")
    missing = [c for c in base if c not in new]
    for c in missing:
        print(f"missing: {c}")
    print(f"{len(changed)} of {len(new)} cases changed, {len(missing)} missing", file=sys.stderr)
    return 1 if changed or missing else 0


if __name__ == "__main__":
    sys.exit(main())
