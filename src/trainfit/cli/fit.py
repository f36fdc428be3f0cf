"""`trainfit fit`: can I train this model on this GPU, and how? The fastest setups that fit, each as a command."""
from __future__ import annotations

import shlex

import typer

from .options import JsonOpt, with_settings
from .spinner import spinner


LongestOpt = typer.Option(False, "--longest-context", help="Answer the longest --seq whose step fits the GPU for "
                          "this setup, and under each technique that lengthens it (recompute, QLoRA, 8-bit "
                          "states, Liger's fused loss, offload, context parallelism where the stack runs it), "
                          "longest first; --seq is ignored.")


@with_settings(defaults={"batch": 1}, exclude=("tokens", "price", "mfu", "alloc_conf"))  # (fit reads none of them)
def fit(req, json: bool = JsonOpt, longest_context: bool = LongestOpt) -> None:
    """Can MODEL train on --gpu, and how? Starting from the setup you give (default: full fine-tuning, micro-batch
    1), the fastest setups that fit the GPU (the fit rule: what the step needs from the caching allocator within
    the GPU's memory less the fixed overheads): the changes each needs (checkpointing, 8-bit or
    in-backward optimizer, pure bf16, LoRA, QLoRA, more GPUs...), its memory, step time and tokens/s, and the
    `trainfit estimate` command that shows it in full. The micro-batch of each is grown as far as it fits.

    Examples:\n
      trainfit fit llama-3.1-8b --gpu RTX-4090 --seq 2048\n
      trainfit fit qwen2.5-7b --gpu A100-80GB --seq 4096 --json
    """
    from .. import api
    from ..analytic.fit_rule import reserve_bytes, verdict
    from ..analytic.layout import validate_layout
    from ..errors import SetupError
    from ..setup import BY_NAME
    from ..studies.fit_advice import fastest_that_fit
    from .options import written

    if req.gpu is None:
        raise SetupError("trainfit fit judges a GPU: give --gpu NAME (see `trainfit gpus`)")
    if req.mode != "train":
        raise SetupError(f"trainfit fit answers for a training step (--mode train), not --mode {req.mode}: use "
                         f"`trainfit estimate --mode {req.mode}`"
                         + (" or `trainfit plan --mode serve`" if req.mode == "serve" else ""))
    spec = api.token_model(req.model, "fit")
    setup, gpu = req.setup(spec), api.gpu_of(req)
    validate_layout(spec, setup)  # the layout given is the model's to take, as estimate checks it (not replaced)
    # a --reserve / --gpu-memory that leaves nothing: one line
    verdict(gpu, setup, 0, reserve_bytes(req.reserve), spec=spec)
    # the setup as given, as estimate runs it: one the analytic engine refuses (LoRA on a MoE) is its one line, not
    api.analytic(req, spec)  # "nothing trainfit tried fits" (the search judges every change of it as None)
    if longest_context:
        if "seq" in written([BY_NAME["seq"]]):
            raise SetupError("--longest-context finds the longest --seq that fits: drop --seq")
        return longest(req, spec, setup, gpu, json)
    with spinner(f"searching setups of {req.model} that fit {gpu.name}", quiet=json):
        found = fastest_that_fit(spec, setup, gpu, reserve=req.reserve)
    rows = [dict(x.as_dict(), command=estimate_command(req, spec, x.setup, gpu.name)) for x in found]
    if json:
        from ..report.json_out import dumps

        typer.echo(dumps({"model": req.model, "gpu": gpu.name, "seq": setup.seq, "fits": rows}))
        return
    if not rows:
        typer.echo(f"nothing trainfit tried fits {req.model} at seq {setup.seq} on {gpu.name} (memory knobs, up to "
                   "1024 GPUs with ZeRO-3 or a node's tensor parallelism, with recompute); try a shorter --seq, "
                   "`trainfit plan` for pipeline layouts, or a smaller model")
        return
    from rich.table import Table

    from ..report.console import console as stdout_console

    from ..units import fmt_seconds

    GIB = 2**30

    t = Table(title=f"{req.model} on {gpu.name}, seq {setup.seq}: fastest setups that fit", title_justify="left")
    for col in ("change", "needs / capacity", "step", "tokens/s/GPU", "vs fastest"):
        t.add_column(col, justify="left" if col == "change" else "right", overflow="fold", ratio=3 if col == "change" else None)
    best = rows[0]["tokens_per_second"] / rows[0]["gpus"]
    for r in rows:
        per = r["tokens_per_second"] / r["gpus"]
        t.add_row(r["flags"] or "(as given)", f"{r['required'] / GIB:.1f} / {r['capacity'] / GIB:.1f} GiB",
                  fmt_seconds(r["step_seconds"]), f"{per:,.0f}", f"{best / per:.2f}x")
    stdout_console().print(t)
    typer.echo("why: " + rows[0]["why"])
    typer.echo("see it in full: " + rows[0]["command"])


def longest(req, spec, setup, gpu, json: bool) -> None:
    """`trainfit fit --longest-context`: the longest sequence that fits, as given and per technique (studies/
    longest_context.py), longest first after the setup as given."""
    from ..studies.longest_context import longest_context

    with spinner(f"searching the longest sequence of {req.model} that fits {gpu.name}", quiet=json):
        found = longest_context(spec, setup, gpu, reserve=req.reserve)
    rows = [dict(x.as_dict(), command=estimate_command(req, spec, x.setup, gpu.name) if x.seq else None)
            for x in found]
    if json:
        from ..report.json_out import dumps

        typer.echo(dumps({"model": req.model, "gpu": gpu.name, "longest_context": rows}))
        return
    from rich.table import Table

    from ..report.console import console as stdout_console

    GIB = 2**30
    t = Table(title=f"{req.model} on {gpu.name}: longest sequence that fits", title_justify="left")
    for col in ("change", "longest --seq", "needs / capacity", "GPUs"):
        t.add_column(col, justify="left" if col == "change" else "right", overflow="fold")
    for r in rows:
        needs = "-" if r["required"] is None else f"{r['required'] / GIB:.1f} / {r['capacity'] / GIB:.1f} GiB" + (
            "" if r["seq"] else f" at --seq {r['judged_seq']:,}")
        t.add_row(r["flags"] or "(as given)", f"{r['seq']:,}" if r["seq"] else "none fits", needs, str(r["gpus"]))
    stdout_console().print(t)
    best = rows[1] if len(rows) > 1 else rows[0]
    if len(rows) > 1:
        typer.echo(f"lengthens it most: {best['flags']} ({best['why']}): --seq {best['seq']:,}")
    else:
        typer.echo("no technique trainfit tries lengthens it")
    if best["command"]:
        typer.echo("see it in full: " + best["command"])


def estimate_command(req, spec, setup, gpu: str) -> str:
    """The `trainfit estimate` command that shows `setup` in full: every setting in which it differs from the model's
    defaults (the user's own flags and the suggestion's changes together), and the run settings fit reads."""
    from dataclasses import fields

    from ..setup import BY_NAME, GPU_SETTINGS, Setup, run_settings

    default = type(req)(model=req.model).setup(spec)
    argv = ["trainfit", "estimate", req.model, "--gpu", gpu, "--seq", str(setup.seq)]
    for f in fields(Setup):
        v = getattr(setup, f.name)
        if f.name == "seq" or f.name not in BY_NAME or v == getattr(default, f.name):
            continue
        flag = BY_NAME[f.name].flag
        argv += [flag] if v is True else [flag, str(v)] if v is not False and v is not None else []
    for name in (*GPU_SETTINGS, *run_settings(req)):  # (the GPU's, its node's and the fit rule's, as fit read them)
        if name != "gpu" and getattr(req, name) != BY_NAME[name].request_default:
            argv += [BY_NAME[name].flag, str(getattr(req, name))]
    return shlex.join(argv)

