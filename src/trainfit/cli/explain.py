"""`trainfit explain SNAPSHOT`: what held the memory in a PyTorch memory snapshot, against trainfit's prediction for
the same setup, and the change that frees the most."""
from __future__ import annotations

from typing import Optional

import typer

from .options import JsonOpt, with_settings

SnapshotArg = typer.Argument(..., help="A pickle from torch.cuda.memory._dump_snapshot(path) (or an out-of-memory "
                             "observer's _snapshot()). Read as data only: a pickle naming any class or function is "
                             "refused, since unpickling one could run code.")
ModelOpt = typer.Option(None, "--model", help="The model the snapshot ran (catalog name, config.json or hub id): "
                        "compare with trainfit's prediction for it and the setup flags given.")

ROWS = (("weights", ("weights", "buffers")), ("gradients", ("gradients",)),
        ("optimizer_states", ("optimizer_states",)), ("activations", ("activations",)),
        ("temporaries", ("temporaries",)),
        # what no frame rule names: the batch, fp32 master copies, communication buffers, a KV cache
        ("inputs_and_other", ("inputs", "master_weights", "comm_buffers", "kv_cache", "other")),
        ("unattributed", ()))


def predicted(memory) -> dict[str, int]:
    """The prediction's make-up at its peak (Memory.at_peak) in the snapshot's rows."""
    at = memory.at_peak
    return {row: sum(at.get(c, 0) for c in cats) for row, cats in ROWS}


@with_settings(model=False, exclude=("tokens", "price", "mfu", "alloc_conf"))  # (the analytic engine reads none)
def explain(req, snapshot: str = SnapshotArg, model: Optional[str] = ModelOpt, json: bool = JsonOpt) -> None:
    """What held the GPU memory in a PyTorch memory snapshot, by category (weights, gradients, optimizer states,
    activations, temporaries; the allocator's rounding, fragmented and cached free blocks) and by where it was
    allocated; with --model and the run's flags, beside trainfit's prediction for that setup and the change that
    frees the most. Record the snapshot with
    torch.cuda.memory._record_memory_history() before building the model (frames tell the categories), then
    torch.cuda.memory._dump_snapshot("snap.pickle") where memory is high, or from an out-of-memory observer
    (torch._C._cuda_attach_out_of_memory_observer).

    Examples:\n
      trainfit explain snap.pickle\n
      trainfit explain oom.pickle --model llama-3.2-1b --batch 2 --seq 1024 --precision amp-bf16 --gpu L4
    """
    from dataclasses import replace

    from .. import api, memory_snapshot
    from ..errors import SetupError
    from ..setup import Request

    api.refuse_host_memory(req, "explain compares device memory, which the node's host memory does not change",
                           "drop it")
    ex = memory_snapshot.explain(memory_snapshot.load(snapshot))
    est = frees = None
    if model is None:
        if req != Request(model="-"):
            raise SetupError("setup flags describe the run to compare with: add --model NAME (the model the "
                             "snapshot ran), or drop the flags")
    else:
        req = replace(req, model=model)
        spec, setup = api.resolve(req)
        est = api.analytic(req, spec)
        from ..studies.fit_advice import frees_most

        frees = frees_most(spec, setup, api.gpu_of(req) if req.gpu else None, reserve=req.reserve) \
            if setup.mode == "train" else []
    if json:
        from ..report.json_out import dumps

        d = {"snapshot": snapshot, "reserved": ex.reserved, "allocated": ex.allocated, "bytes": ex.bytes,
             "segments": ex.segments, "blocks": ex.blocks, "with_frames": ex.with_frames, "oom": ex.oom,
             "by_site": [{"where": w, "category": k, "bytes": n} for w, k, n in ex.by_site], "notes": ex.notes}
        if est is not None:
            d["predicted"] = {"model": model, "peak_phase": est.memory.peak_phase, "bytes": predicted(est.memory),
                              "peak": est.memory.peak, "reserved": est.memory.reserved,
                              "required": est.memory.required}
            d["frees_most"] = [{"flags": k.flags, "why": k.why, "frees": n} for k, n in frees]
        typer.echo(dumps(d))
        return
    _render(ex, est, model, frees)


def _render(ex, est, model, frees) -> None:
    from ..units import fmt_bytes

    pct = f"{ex.with_frames:.0%} of it with frames"
    typer.echo(f"reserved {fmt_bytes(ex.reserved)} in {ex.segments} segments; allocated {fmt_bytes(ex.allocated)} "
               f"in {ex.blocks} blocks ({pct})")
    if ex.oom is not None:
        typer.echo(f"out of memory: {fmt_bytes(ex.oom['size'] or 0)} requested with "
                   f"{fmt_bytes(ex.oom['device_free'] or 0)} free on the device")
    pred = predicted(est.memory) if est is not None else None
    head = f"  {'':<18}{'snapshot':>12}"
    if pred is not None:
        head += f"{'predicted':>12}   ({model} at its peak, {est.memory.peak_phase})"
    typer.echo(head)
    for row, _ in ROWS:
        line = f"  {row.replace('_', ' '):<18}{fmt_bytes(ex.bytes[row]):>12}"
        if pred is not None:
            line += f"{fmt_bytes(pred[row]):>12}"
        if ex.bytes[row] or (pred and pred[row]):
            typer.echo(line)
    for row in ("rounding", "fragmented", "cached", "awaiting_free"):
        if ex.bytes[row]:
            typer.echo(f"  {row.replace('_', ' '):<18}{fmt_bytes(ex.bytes[row]):>12}   (the allocator's: "
                       + {"rounding": "block sizes above the requests", "fragmented": "free blocks in segments "
                          "in use", "cached": "free segments, given back by empty_cache or an OOM retry",
                          "awaiting_free": "freed, waiting for another stream"}[row] + ")")
    if est is not None:
        m = est.memory
        typer.echo(f"  {'allocated':<18}{fmt_bytes(ex.allocated):>12}{fmt_bytes(m.peak):>12}   (predicted: the peak)")
        if m.reserved is not None:
            typer.echo(f"  {'reserved':<18}{fmt_bytes(ex.reserved):>12}{fmt_bytes(m.reserved):>12}")
    typer.echo("where it was allocated (largest):")
    for where, kind, n in ex.by_site[:8]:
        typer.echo(f"  {fmt_bytes(n):>11}  {kind.replace('_', ' '):<16} {where}")
    if frees:
        typer.echo("frees the most (the analytic engine, each change alone):")
        for k, n in frees:
            typer.echo(f"  {k.flags}: {fmt_bytes(n)} less ({k.why})")
    elif est is None:
        typer.echo("add --model and the run's flags to set trainfit's prediction beside it and name the change "
                   "that frees the most")
    for note in ex.notes:
        typer.echo(f"· {note}")
