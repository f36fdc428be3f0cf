"""The trace's reserved against a committed CUDA truth run, with and without the block the harness's model build
left in the cache (no GPU needed; ~6 minutes on 2 cores).

    python bench/reserved_build_block.py bench/results/cuda-H200-2026-11-27.json [--only CASE ...]

Until 2026-11-27 the measure engine built each model with transformers' `from_config` under
`torch.device("cuda")`: for a model with tied embeddings that makes the LM head's own weight, then `tie_weights`
replaces it with the word embedding and the freed block stays cached (the runs' segment snapshots hold a second
embedding-sized segment: 526,385,152 B twice for llama-3.2-1b). A user's model never holds it (from_pretrained
builds on the meta device), so trainfit does not predict it, and the measure engine now releases it
(step/build.py). To compare the allocator simulation with what those runs measured, this replays each traced step
with that block made after the weights and freed before the first step (records as alloc/replay.py reads them),
beside the plain replay, at full depth and extrapolated (trace/extrapolate.py, the default from 16 layers).
Error = trace reserved less the allocator-held workspaces / the step's own measured reserved − 1.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import trainfit.alloc.replay as alloc_replay  # noqa: E402

_plain_replay = alloc_replay.replay
_BLOCK = {"bytes": 0}


def _replay_with_build_block(records, start, *args, **kwargs):
    """alloc/replay.py replay, with the freed LM head weight of an on-device build in the cache: born after the
    resident weights (event 0 sorts it first among the births there, and the residents are adopted before it in
    a real build only by construction order, which the replay does not keep: NB), freed just before the step."""
    if _BLOCK["bytes"]:
        head = SimpleNamespace(nbytes=_BLOCK["bytes"], birth=0, death=start - 0.5, stream=0, cat="parameter")
        records = [head, *records]
    return _plain_replay(records, start, *args, **kwargs)


def rows(path: Path, only: list[str] | None = None, depths: tuple[str, ...] = ("full", "extrapolated"),
         labels: tuple[str, ...] = ("plain", "build")):
    """One dict per measured case: the error of each (plain | build) x depth replay. The replay is wrapped only
    while this runs."""
    alloc_replay.replay = _replay_with_build_block
    try:
        yield from _rows(path, only, depths, labels)
    finally:
        alloc_replay.replay = _plain_replay


def _rows(path: Path, only: list[str] | None, depths: tuple[str, ...], labels: tuple[str, ...]):
    from trainfit.hardware import get_gpu
    from trainfit.models.resolve import load_model
    from trainfit.overheads import allocator_held
    from trainfit.setup import Setup
    from trainfit.trace.engine import trace_spec

    run = json.loads(path.read_text())
    gpu = get_gpu(run["gpu"])
    for case in run["cases"]:
        own = (case.get("measured_own") or {}).get("reserved")
        if not own or (only and case["id"] not in only):
            continue
        spec = load_model(case["model"])
        setup = Setup(**{"device": "cuda", **case["settings"]})
        held = sum(allocator_held(gpu, setup).values())
        # the head's weight in the parameters' dtype: fp32 under fp32 / amp, 16-bit otherwise (step/build.py)
        head = spec.vocab * spec.hidden * (4 if setup.precision in ("fp32", "amp-bf16", "amp-fp16") else 2)
        out = {"id": case["id"], "tied": spec.tied_embeddings}
        for label, block in (("plain", 0), ("build", head)) if spec.tied_embeddings else (("plain", 0),):
            if label not in labels and spec.tied_embeddings:
                continue
            _BLOCK["bytes"] = block
            for depth in depths:
                e = trace_spec(spec, setup, extrapolate=depth == "extrapolated")
                out[f"{label}_{depth}"] = (e.memory.reserved - held) / own - 1
        _BLOCK["bytes"] = 0
        if not spec.tied_embeddings:  # no head of its own to free: the harness's build left nothing cached
            out.update({f"build_{d}": out[f"plain_{d}"] for d in depths})
        yield out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--only", nargs="*", default=None)
    a = ap.parse_args()
    print("| case | tied | full depth: plain | with the build's block | extrapolated: plain | with the build's block |")
    print("|---|---|---:|---:|---:|---:|")
    for r in rows(a.run, a.only):
        print(f"| {r['id']} | {'yes' if r['tied'] else 'no'} | {r['plain_full']:+.2%} | {r['build_full']:+.2%} | "
              f"{r['plain_extrapolated']:+.2%} | {r['build_extrapolated']:+.2%} |", flush=True)


if __name__ == "__main__":
    main()
