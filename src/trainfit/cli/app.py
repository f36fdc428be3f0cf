"""Command line: parses arguments into the library's dataclasses and hands results to a report.

Every error a user can cause is one line on stderr and exit code 2 (DESIGN.md §6).
"""
from __future__ import annotations

import functools
import logging
import os
import re
import sys
from typing import Optional

import typer

from .. import api, serving_versions
from ..engines import MEASURED, TRACED_MODULE
from ..errors import SetupError, TrainfitError
from ..setup import Request
from ..setup.settings import given_flags
from .options import EngineOpt, Group, GroupedCommand, JsonOpt, lazy_group, with_settings
from .spinner import spinner

app = typer.Typer(
    help="Will it train (or serve) on my hardware? Memory, compute and time of a training step or of inference, "
    "per GPU, from the model's architecture.\n\nStart with: trainfit estimate llama-3.1-8b --gpu H100-80GB, or "
    "your own config: trainfit check my_job.toml --gpu H100-80GB",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    cls=Group,
)


def _check_emit(req: Request, emit: str, json: bool, engine: str) -> None:
    if emit not in ("vllm", "sglang"):
        raise SetupError(f"--emit {emit!r}: estimate emits vllm or sglang (with --mode serve); training configs come "
                         "from `trainfit plan --emit`")
    if req.mode != "serve":
        raise SetupError(f"--emit {emit} prints a serving command: add --mode serve")
    if serving_versions.engine_of(req.server) != emit:
        raise SetupError(f"--emit {emit} prints the command of the server the estimate models: add --server {emit}")
    if json or engine != "analytic":
        raise SetupError(f"--emit {emit} prints one command: drop --json and --engine")
    # the load and the timing (the engine's memory, which the command's flags size, reads none of them)
    timed = given_flags(req, EMIT_UNREAD)
    if timed:
        raise SetupError(f"--emit {emit} prints the engine's command, which {', '.join(timed)} "
                         f"{'does' if len(timed) == 1 else 'do'} not change (the load and its timing): drop "
                         f"{'it' if len(timed) == 1 else 'them'}, or leave out --emit to see the throughput")


# Serving settings of the load and its timing, which the engine's command (plan/emit_vllm.py, emit_sglang.py: the
# memory's knobs, analytic/serving.py) never reads
EMIT_UNREAD = ("concurrency", "request_rate", "ttft_ms", "prompt_len", "completion_len", "mfu", "power_limit")


@app.command(cls=GroupedCommand)
@with_settings()
def estimate(req: Request, engine: str = EngineOpt,
             measure: bool = typer.Option(False, "--measure", help="Also run the real step here and show each engine's error."),
             emit: Optional[str] = typer.Option(None, "--emit", help="vllm or sglang: print the `vllm serve` (--server vllm) or `python -m sglang.launch_server` (--server sglang) command that runs this setup (--mode serve), instead of the tables."),
             json: bool = JsonOpt) -> None:
    """Memory (by category and phase, with the peak), FLOPs and — with --gpu — fit, step time and cost, per GPU.

    Examples:\n
      trainfit estimate llama-3.1-8b --gpu H100-80GB\n
      trainfit estimate ./config.json --batch 4 --seq 2048 --precision amp-bf16 --recompute full --json\n
      trainfit estimate llama-3.1-70b --stack megatron --dp 8 --tp 8 --pp 2 --grad-accum 8 --zero 1 --gpu H100-80GB\n
      trainfit estimate llama-3.1-8b --mode infer --batch 16 --seq 8192 --precision bf16 --gpu L4\n
      trainfit estimate llama-3.1-70b --mode serve --tp 4 --max-model-len 32768 --gpu H100-80GB
    """
    if emit is not None:
        _check_emit(req, emit, json, engine)
    if req.alloc_conf is not None and (engine not in ("trace", "all", "analytic") or measure):
        raise SetupError(f"--alloc-conf sets the caching allocator the trace engine replays (and the analytic "
                         f"engine's expandable_segments); {'--measure' if measure else '--engine ' + engine} does "
                         "not read it (a real step runs under the process's PYTORCH_CUDA_ALLOC_CONF): add --engine "
                         "trace (or all), or drop it")
    slow = engine in ("trace", "all", "measure") or measure
    what = {"trace": "tracing the step on fake tensors", "all": "analytic, then tracing the step on fake tensors",
            "measure": "running the real step"}.get(engine, "estimating")
    with spinner(what + (" and running the real step" if measure else ""), quiet=json or not slow):
        results = api.run_engines(req, engine, measure_too=measure)
    if emit is not None:
        from ..plan.emit_sglang import sglang_command
        from ..plan.emit_vllm import vllm_command
        e = results[0]
        command = sglang_command if emit == "sglang" else vllm_command
        typer.echo(command(req.model, e.setup, e.detail.serving))
        return
    show_estimates(req, results, json)


def show_estimates(req: Request, results: list, json: bool, extra: dict | None = None) -> None:
    """The estimate's report (tables, or --json) of `results`, with the changes that would fit when it does not;
    `extra`: more keys for the JSON object (`trainfit check`: what the files said)."""
    from ..report import json_out, terminal
    from ..report.held import verdict_word

    if json:
        if len(results) == 1:
            typer.echo(json_out.dumps({**api.estimate_dict(req, results[0]), **(extra or {})}))
        else:
            typer.echo(json_out.dumps({"estimates": [e.to_dict() for e in results],
                                       **api.gaps(results)}))
        return
    advice = api.fit_advice(req, results[0])
    if len(results) == 1:
        terminal.render_estimate(results[0])
    else:
        terminal.render_side_by_side(results, reference=len(results) - 1)
        for note in results[0].notes:  # the side-by-side table shows no notes: an engine --engine all skipped, an
            # unread --host-memory, a warning
            if note.startswith(("trace engine skipped", "warning:")) or note == api.HOST_MEMORY_UNREAD:
                typer.echo(f"· {note}")
    if advice:
        t, mode = results[0].time, results[0].setup.mode
        further = "; `trainfit fit` searches further" if mode == "train" else ""  # (fit answers --mode train only)
        typer.echo(f"{verdict_word(t, mode)} on {t.gpu}; what would, fastest first (each checked by the analytic "
                   f"engine{further}):")
        for x in advice:
            typer.echo("  " + x.line())


@app.command(cls=GroupedCommand)
@with_settings(only=MEASURED, defaults={"device": "cpu"},
               helps={"device": "cpu (here) or cuda."})
def measure(req: Request,
            steps: int = typer.Option(3, "--steps", help="Timed steps after the measured one."),
            warmup: int = typer.Option(1, "--warmup", help="Warm-up steps (>= 1: optimizer state resident)."),
            trace: bool = typer.Option(False, "--trace", help="Also run the trace engine's prediction."),
            force: bool = typer.Option(False, "--force", help="Run even when the prediction exceeds free memory."),
            nproc: int = typer.Option(1, "--nproc", help="Processes on this node (torch.distributed.run; gloo on cpu, NCCL on cuda)."),
            dp: Optional[int] = typer.Option(None, "--dp", help="Data-parallel ranks in all (default: nproc × nnodes)."),
            nnodes: Optional[str] = typer.Option(None, "--nnodes", help="Passed to torch.distributed.run (multi-node)."),
            node_rank: Optional[int] = typer.Option(None, "--node-rank", help="Passed to torch.distributed.run."),
            rdzv_endpoint: Optional[str] = typer.Option(None, "--rdzv-endpoint", help="Passed to torch.distributed.run, e.g. host:29500."),
            rdzv_backend: Optional[str] = typer.Option(None, "--rdzv-backend", help="Passed to torch.distributed.run."),
            rdzv_id: Optional[str] = typer.Option(None, "--rdzv-id", help="Passed to torch.distributed.run."),
            json: bool = JsonOpt) -> None:
    """Run the real standard step here (random weights) and read its true peak; compare with the predictions.

    Examples:\n
      trainfit measure tiny-llama --batch 2 --seq 128 --precision amp-bf16 --steps 5\n
      trainfit measure tiny-llama --mode infer --batch 4 --seq 256 --precision bf16   # prefill + one decode step\n
      trainfit measure tiny-llama --nproc 4 --zero 3 --device cpu        # FSDP2 over 4 gloo processes, per rank\n
      trainfit measure ./config.json --nproc 8 --nnodes 2 --node-rank 0 --rdzv-endpoint host:29500 --zero 1
    """
    from rich.progress import Progress

    if steps < 0 or warmup < 1 or nproc < 1:
        raise TrainfitError("--steps must be >= 0, --warmup >= 1 and --nproc >= 1")
    launcher = [f"--{k.replace('_', '-')}={v}" for k, v in (("nnodes", nnodes), ("node_rank", node_rank),
                ("rdzv_endpoint", rdzv_endpoint), ("rdzv_backend", rdzv_backend), ("rdzv_id", rdzv_id)) if v is not None]
    if dp is None:
        try:
            parts = [int(x) for x in str(nnodes).split(":")] if nnodes else [1]
        except ValueError:
            parts = []
        if not 1 <= len(parts) <= 2 or min(parts) < 1:
            raise TrainfitError(f"--nnodes {nnodes!r} must be a positive number of nodes or a range MIN:MAX (e.g. 2 or 1:4)")
        nodes = parts[-1]
        dp = nproc * nodes
    if dp != req.dp:
        from dataclasses import replace

        req = replace(req, dp=dp)
    if nproc > 1 or launcher:
        _measure_ranks(req, nproc, tuple(launcher), steps, warmup, force, json)
        return
    with Progress(transient=True, disable=json) as bar:
        # the build includes the first warm-up step (optimizer state resident): its own unit, so the bar moves
        task = bar.add_task("building the model and its first warm-up step", total=1 + warmup + 1 + steps)
        labels = {"build": "building the model and its first warm-up step", "warmup": "warm-up",
                  "peak": "measured step", "time": "timed steps"}

        def progress(stage, i, n):
            done = {"build": 0, "warmup": 1 + i, "peak": 1 + warmup + i, "time": 2 + warmup + i}[stage]
            bar.update(task, completed=done, description=f"{labels[stage]} {i}/{n}")

        measured, predictions = api.measure_with_predictions(req, steps, warmup, progress, force, trace)
    from ..report import json_out, terminal

    if json:
        d = measured.to_dict()
        d["predictions"] = {p.engine: {"peak": p.memory.peak, "error": (p.memory.peak - measured.memory.peak) / measured.memory.peak}
                            for p in predictions}
        typer.echo(json_out.dumps(d))
        return
    terminal.render_side_by_side([*predictions, measured], reference=len(predictions))
    tm, rss = measured.time, measured.detail.records.get("rss_peak")
    typer.echo(f"step {tm.step_seconds * 1e3:.1f} ms · {tm.tokens_per_second:,.0f} tokens/s on {tm.gpu}"
               + (f" · process RSS peak {rss / 2**20:,.0f} MiB (secondary)" if rss else ""))


def _measure_ranks(req, nproc, launcher, steps, warmup, force, json) -> None:
    from rich.progress import Progress

    from ..report import json_out, terminal

    with Progress(transient=True, disable=json) as bar:
        task = bar.add_task(f"{nproc} processes", total=None)
        per_rank, ranks = api.measure_ranks(req, nproc, launcher, steps, warmup,
                                            lambda stage, i, n: bar.update(task, description=f"rank 0: {stage} {i}/{n}"), force)
    worst = max(per_rank, key=lambda e: e.memory.peak)
    predicted = api.analytic(req)
    if json:
        d = worst.to_dict()
        d["ranks"] = ranks
        d["predictions"] = {"analytic": {"peak": predicted.memory.peak,
                                         "error": (predicted.memory.peak - worst.memory.peak) / worst.memory.peak}}
        typer.echo(json_out.dumps(d))
        return
    terminal.render_side_by_side([predicted, worst], reference=1,
                                 labels=["analytic", f"measured (rank {worst.detail.records['rank']})"])
    for r in ranks:
        typer.echo(f"rank {r['rank']}: peak {r['peak'] / 2**20:,.2f} MiB ({r['peak_phase']}), step {r['step_seconds'] * 1e3:,.1f} ms, "
                   f"in collectives {r['comm_seconds'] * 1e3:,.1f} ms")


@app.command("trace", cls=GroupedCommand)
@with_settings(only=TRACED_MODULE, model=False,
               helps={"recompute": "none, or full (torch.utils.checkpoint around each direct child module)."})
def trace_module(req: Request,
                 factory: str = typer.Argument(..., help="'package.module:function' returning an nn.Module or (module, example batch)."),
                 batch: Optional[int] = typer.Option(None, "--batch", "-b", help="Micro-batch: passed to the factory's batch/batch_size argument, else the example batch's first dimension is resized."),
                 json: bool = JsonOpt) -> None:
    """Trace a training step of any nn.Module on fake tensors (no real memory): peak, phase, what holds it.

    The module's output (or its .loss, or its first element) is the loss; a non-scalar output is averaged.

    Example: trainfit trace my_pkg.models:build --batch 32 --precision amp-bf16
    """
    from dataclasses import replace

    from ..api import trace_factory
    from ..report import json_out, terminal

    setup = replace(req, batch=1 if batch is None else batch).setup()  # an explicit --batch is validated
    with spinner(f"tracing {factory} on fake tensors", quiet=json):
        result = trace_factory(factory, batch, setup)
    if json:
        typer.echo(json_out.dumps(result.to_dict()))
        return
    terminal.render_estimate(result)
    top = result.detail.records["top_tensors"][:8]
    if top:
        typer.echo("largest tensors at the peak:")
        for x in top:
            typer.echo(f"  {x['bytes'] / 2**20:10.2f} MiB  {x['category']:15s} {x['module']}  {x['shape']} {x['dtype']}")


@app.command(cls=GroupedCommand)
@with_settings(exclude=("mode", "tokens", "mfu", "price", "alloc_conf"), mode="train")
def compare(req: Request, json: bool = JsonOpt) -> None:
    """Training vs inference of the same model, side by side, with the ratio — at this batch and at batch 1; with
    --gpu, each one's time. Inference reads the flags that apply to it; a note names those it does not use.

    Example: trainfit compare llama-3.1-8b --batch 8 --seq 4096
    """
    results = api.compare(req)
    from ..compare_setup import NOTE_START
    from ..report import json_out, terminal

    if json:
        typer.echo(json_out.dumps({k: v.to_dict() for k, v in results.items()}))
        return
    labels, ests = list(results), list(results.values())
    terminal.render_side_by_side(ests, labels=labels, reference=0, times=True)
    typer.echo(terminal.compare_summary(ests))
    shown = [n for n in ests[0].notes if n == api.HOST_MEMORY_UNREAD_COMPARE]
    shown += [n for n in ests[1].notes if n.startswith(NOTE_START)]  # (every inference column carries it)
    for note in shown:
        typer.echo("· " + note)


@app.command(cls=GroupedCommand)
def models(json: bool = JsonOpt) -> None:
    """The model catalog: names you can pass to `estimate` (a config.json path works too); image classifiers
    last (their batch is images: docs/vision.md)."""
    rows = api.catalog_models() + api.vision_models()
    if json:
        from ..report.json_out import dumps

        typer.echo(dumps(rows))
        return
    from rich import box
    from rich.table import Table

    from ..report.console import console as report_console
    from ..units import fmt_count

    console = report_console()  # (piped: wide enough for every column, hub ids too)
    wide = console.width >= 120  # the hub id column only where it fits; names are never cut
    t = Table(title="trainfit models", header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1),
              show_edge=False)
    for col in ("name", "family", "params", "layers", "hidden", "heads", "vocab") + (("hub id",) if wide else ()):
        t.add_column(col, justify="right" if col in ("params", "layers", "hidden", "vocab") else "left",
                     no_wrap=True, min_width=max((len(r["name"]) for r in rows), default=4) if col == "name" else len(col))
    for r in rows:
        t.add_row(r["name"], r["family"], fmt_count(r["params"]).replace(" ", ""), str(r["layers"]), str(r["hidden"]),
                  f"{r['heads']}/{r['kv_heads']}" if r["heads"] else "-",
                  f"{r['vocab'] / 1000:.0f}k" if r["vocab"] >= 10_000 else str(r["vocab"] or "-"), *((r.get("hf_id") or "",) if wide else ()))
    console.print(t)
    if not wide:
        console.print("heads: query/key-value; hub ids: trainfit models --json, or a wider terminal")


@app.command(cls=GroupedCommand)
def gpus(json: bool = JsonOpt) -> None:
    """The GPU catalog: memory (what CUDA can allocate; nvidia-smi's total beside it), bandwidth, dense peak FLOP/s
    (bf16, fp8 and fp4 where the chip has those tensor cores: — where not), power, price (`estimate --price` and `plan --price` override it). --json: each GPU as a GPU file writes it (`--gpu my_gpu.json`)."""
    from ..hardware import file_entry, list_gpus

    items = list_gpus()
    if json:
        from ..report.json_out import dumps

        # each entry is a GPU file (`--gpu file.json`) as written: memory is nvidia-smi's total, cuda_memory CUDA's
        typer.echo(dumps([file_entry(g) for g in items]))
        return
    from rich.table import Table

    from ..report.console import console
    from ..units import fmt_bytes

    t = Table(title="trainfit gpus (dense peaks)", header_style="bold", padding=(0, 1))
    for col in ("name", "memory (CUDA)", "nvidia-smi", "bandwidth", "bf16 / fp16 TFLOP/s", "fp32/tf32 TFLOP/s",
                "fp8 / fp4 TFLOP/s", "W", "$/h"):
        t.add_column(col, justify="left" if col == "name" else "right", no_wrap=col == "name",
                     min_width=max(len(g.name) for g in items) if col == "name" else None)

    def peaks(g, keys: tuple[str, ...], fmt: str) -> str:
        # (only a chip with the tensor cores lists the key: V100 and T4 list no bf16, Volta and Turing having
        # none, nor tf32, which Ampere brought; the --low-precision recipes need fp8/fp4's, analytic/float8.py)
        return " / ".join(format(g.peak_flops[k] / 1e12, fmt) if k in g.peak_flops else "—" for k in keys)

    for g in items:
        t.add_row(g.name, fmt_bytes(g.memory), fmt_bytes(g.smi_memory), f"{g.memory_bandwidth / 1e12:.2f} TB/s",
                  peaks(g, ("bf16", "fp16"), ",.0f"), peaks(g, ("fp32", "tf32"), ",.1f"),
                  peaks(g, ("fp8", "fp4"), ",.0f"), f"{g.power_watts:.0f}", f"{g.price_per_hour:.2f}")
    console().print(t)


def _register_optional_commands() -> None:
    """Commands that live beside their feature (planner, visuals); their heavy imports stay inside them."""
    from .explain import explain
    from .fit import fit
    from .check import check
    from .plan import plan
    from .visual import report, serve, sweep, timeline

    for command in (check, fit, plan, timeline, sweep, report, serve, explain):
        app.command(cls=GroupedCommand)(command)


_register_optional_commands()


@functools.lru_cache(maxsize=1)
def _click_command():
    """The click group typer builds from `app`, each command built when invoked (options.lazy_group): built once
    per process, not once per call of `main`."""
    return lazy_group(app)


def engine_named(message: str, argv: list[str]) -> str:
    """An engine's refusal names estimate's --engine (e.g. analytic/lora.py 'use --engine trace or measure'); under a
    command that has no --engine (sweep, compare, fit, plan, ...) it names the command that has it."""
    command = next((a for a in argv if not a.startswith("-")), None)
    if command in (None, "estimate"):  # (the one command with --engine: options.EngineOpt)
        return message
    return re.sub(r"(?<![\w`-])--engine (\w+)", r"`trainfit estimate --engine \1`", message)


def main(argv: list[str] | None = None) -> None:
    """Entry point: user errors (ours and click's usage errors) become one line and exit code 2."""
    # torchao, which transformers imports to look for its quantizer, warns of each optional CUDA/CPython-version
    # extension its wheel could not load (torchao/__init__.py: logger.warning(f"Failed to load {file}")): nothing
    # trainfit runs needs them, and the user did not ask for them
    logging.getLogger("torchao").setLevel(logging.ERROR)
    # and registers its enums with torch's deprecated pytree register_constant (torch/utils/_pytree.py:630 warns)
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
    # bitsandbytes (0.50.2) on an AVX512-BF16 CPU looks for the hub's `kernels` package for its 4-bit CPU GEMM when
    # imported (transformers' quantizer probe imports it) and warns when it is absent (backends/cpu/ops.py:242-255):
    # its own fallback runs, nothing the user asked for
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
    # torch 2.13's libkineto prints "USDT: ... profiler_start / profiler_stop" to stderr for each profiler session the
    # trace engine's CPU kernel probes open (hundreds in an RL trace); it reads KINETO_LOG_LEVEL when the first session
    # starts, and 6 is above its levels. A level the user set is kept.
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    # transformers' own warnings about the models trainfit builds from configs (5.24 modeling_utils.py:4778 "loss_type
    # =None ... unrecognized" for a config without one): its logging reads TRANSFORMERS_VERBOSITY when first imported
    # (utils/logging.py _get_default_logging_level). A level the user set is kept.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    command = _click_command()
    try:
        command.main(args=argv, prog_name="trainfit", standalone_mode=False)
    except TrainfitError as e:
        typer.echo(f"error: {engine_named(str(e), sys.argv[1:] if argv is None else argv)}", err=True)
        sys.exit(2)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except typer.Abort:
        sys.exit(130)
    except typer.TyperException as e:  # click's usage errors (typer vendors click)
        ctx = getattr(e, "ctx", None)
        where = f"trainfit {ctx.info_name} --help" if ctx is not None and ctx.parent is not None else "trainfit --help"
        typer.echo(f"error: {e.format_message()} (see `{where}`)", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
