"""`trainfit plan`: the CLI command (registered by cli.py with `app.command()(plan)`). It only parses arguments and
hands the result to a report or a config writer."""
from __future__ import annotations

from typing import Optional

import typer

from .. import serving_versions
from ..errors import SetupError
from ..setup import BY_NAME, check_value
from ..setup.request import refuse_price_without_tokens
from .options import ModelArg, written_params

STACK_DEFAULT = BY_NAME["stack"].default  # the stack planned when --stack is not given


def _csv(text: str, what: str, cast=str) -> tuple:
    items = [x.strip() for x in text.split(",") if x.strip()]
    try:
        return tuple(cast(x) for x in items)
    except ValueError:
        raise SetupError(f"--{what} takes a comma-separated list, got {text!r}") from None


def _stacks_help() -> str:
    """--stack's help: what each stack's search covers, read off its facts ([plan] precisions and recomputes, its ZeRO
    stages and [parallel] axes) and the planner's searched settings (plan/space.py), not restated here."""
    from ..plan.space import CP_MIN_SEQ, SEARCHED, TIMED
    from ..stacks import get_stack, names

    each = []
    for name in names():
        s = get_stack(name)
        axes = [a.name.replace("_", "-") + (f" (sequences of {CP_MIN_SEQ // 1024}k and more)" if a.name == "cp" else "")
                for a in (*SEARCHED, *TIMED) if a.name in s.axes] + (["recompute-modules"] if s.runs("recompute-modules")
                                                                       else [])
        each.append(f"{name} recompute {', '.join(s.plan_recomputes)}, ZeRO {', '.join(map(str, s.zero_stages))}, "
                    f"precision {', '.join(s.plan_precisions)}" + (f", {', '.join(axes)}" if axes else ""))
    return ("Training stack(s) whose step is planned, comma-separated: " + ", ".join(names()) + "; several are "
            "compared in one table (a stack column). Each searches dp × tp × pp as it runs them and its own options "
            "(stacks/*.toml): " + "; ".join(each) + ".")


def plan(
    model: str = ModelArg,
    gpu: str = typer.Option(..., "--gpu", help="GPU type (see `trainfit gpus`), or a .json/.toml file with the catalog's fields."),
    gpu_memory: Optional[float] = typer.Option(None, "--gpu-memory", help=BY_NAME["gpu_memory"].meta.help),
    power_limit: Optional[float] = typer.Option(None, "--power-limit", help=BY_NAME["power_limit"].meta.help),
    cluster: Optional[str] = typer.Option(None, "--cluster", help=BY_NAME["cluster"].meta.help),
    host_memory: Optional[float] = typer.Option(None, "--host-memory", help=BY_NAME["host_memory"].meta.help),
    gpus: int = typer.Option(1, "--gpus", help="Number of GPUs; every plan uses all of them (dp × tp × pp × cp = gpus)."),
    seq: Optional[int] = typer.Option(None, "--seq", "-s", help="Sequence length, tokens. Default: 2048, or the model's learned position table where it is shorter (BERT 512, GPT-2 1024)."),
    global_batch_tokens: Optional[str] = typer.Option(None, "--global-batch-tokens", help="Tokens per optimizer step (e.g. 4M); micro-batch × seq × accumulation × dp matches it within --batch-tolerance. Default: accumulation just fills the pipeline."),
    tokens: Optional[str] = typer.Option(None, "--tokens", help="Training budget in tokens (e.g. 15T): time, GPU-hours, cost and energy per plan."),
    stack: str = typer.Option(STACK_DEFAULT, "--stack", "--stacks", help=_stacks_help()),
    precision: Optional[str] = typer.Option(None, "--precision", help="Precision policies to search, comma-separated: fp32, amp-bf16, amp-fp16, bf16, bf16-master, fp16-master (each stack searches those it runs). Default: hf amp-bf16,bf16-master; torchtitan amp-bf16; megatron and deepspeed bf16-master."),
    optimizer: str = typer.Option("adamw", "--optimizer", help="sgd, momentum, adam, adamw, adafactor, adamw-8bit, paged-adamw-8bit, paged-adamw, lion, adamw-torchao-8bit, adamw-torchao-4bit, adamw-torchao-fp8 (not searched)."),
    recompute: Optional[str] = typer.Option(None, "--recompute", help="Recompute policies to search, comma-separated: none, full, selective, op, layer:N, uniform:N, block:N (each stack searches those it runs; selective is megatron's core-attention recompute: hf's equals none under the flash attention plans run, torchtitan's is op). Default: each stack's own."),
    zero: Optional[str] = typer.Option(None, "--zero", help="ZeRO stages to search, comma-separated (3 = FSDP full shard). Default: each stack's own."),
    tp: Optional[int] = typer.Option(None, "--tp", help="Fix the tensor-parallel degree: only plans with it are searched and ranked (--mode serve too)."),
    pp: Optional[int] = typer.Option(None, "--pp", help="Fix the pipeline-parallel degree: only plans with it are searched and ranked."),
    dp: Optional[int] = typer.Option(None, "--dp", help="Fix the data-parallel degree."),
    reserve: float = typer.Option(BY_NAME["reserve"].default, "--reserve", help=BY_NAME["reserve"].meta.help + " The same fit as `trainfit estimate`'s (analytic/fit_rule.py)."),
    margin: Optional[str] = typer.Option(None, "--margin", hidden=True),
    efficiency: Optional[float] = typer.Option(None, "--efficiency", help="Override: time compute as FLOPs at this flat fraction of the dense peak (default: each kernel timed by the roofline, analytic/ops/)."),
    batch_tolerance: float = typer.Option(0.05, "--batch-tolerance", help="Allowed relative deviation from --global-batch-tokens."),
    top: int = typer.Option(5, "--top", help="How many plans to show."),
    price: Optional[float] = typer.Option(None, "--price", help=BY_NAME["price"].meta.help + " --mode serve: the replicas' price per hour, which ranks the plans."),
    emit: Optional[str] = typer.Option(None, "--emit", help="Print a launch config for the best plan the engine can run: deepspeed (JSON), accelerate (FSDP YAML), torchtitan (job-config TOML for torchtitan's own registry models; --tokens sets its steps), torchrun (torchtitan command line), megatron (Megatron-LM pretrain_gpt.py command line)."),
    verify: bool = typer.Option(False, "--verify", help="Confirm the top plans' peaks with the trace engine (needs torch): one rank of the step, sharded on a fake process group when dp > 1; tp/pp plans are skipped with the reason."),
    json: bool = typer.Option(False, "--json", help="Print one JSON object instead of tables."),
    mode: str = typer.Option("train", "--mode", help="train (parallel layouts for a training step) or serve (the cheapest GPUs and TP that serve --concurrency sequences of --max-model-len tokens, or --request-rate requests/s within --ttft-ms and --tpot-ms, under vLLM or SGLang (--server); --gpu may list several types, or all)."),
    concurrency: Optional[int] = typer.Option(None, "--concurrency", help="--mode serve: sequences served at once."),
    max_model_len: Optional[int] = typer.Option(None, "--max-model-len", help="--mode serve: the longest request, tokens (vLLM's --max-model-len). Default: the model's max_position_embeddings."),
    tpot_ms: Optional[float] = typer.Option(None, "--tpot-ms", help="--mode serve: the most time per output token, milliseconds, at that load."),
    kv_cache_dtype: Optional[str] = typer.Option(None, "--kv-cache-dtype", help="--mode serve: bf16, fp16 or fp8."),
    server: Optional[str] = typer.Option(None, "--server", help="--mode serve: " + BY_NAME["server"].meta.help + " Default: vllm."),
    request_rate: Optional[float] = typer.Option(None, "--request-rate", help="--mode serve (instead of --concurrency): " + BY_NAME["request_rate"].meta.help),
    ttft_ms: Optional[float] = typer.Option(None, "--ttft-ms", help="--mode serve, with --request-rate: " + BY_NAME["ttft_ms"].meta.help),
    serve_prompt_len: Optional[int] = typer.Option(None, "--prompt-len", help="--mode serve, with --request-rate: prompt tokens per request (default 512); --max-model-len defaults to prompt + completion."),
    serve_completion_len: Optional[int] = typer.Option(None, "--completion-len", help="--mode serve, with --request-rate: output tokens per request (default 512)."),
    workers: Optional[int] = typer.Option(None, "--workers", help="Processes a large search (1,000+ groups) is shared over, on Linux; the plans are the same. Default: this machine's CPUs, up to 8."),
) -> None:
    """The fastest parallel layout that fits: dp × tp × pp, ZeRO stage, micro-batch, accumulation, recompute and
    precision, ranked by tokens/s with each time term shown. When no such plan fits, the memory knobs the stack runs
    are searched level by level (plan/knobs.py): Liger and the tiled MLP, Ulysses, activation offload, then the
    states' offload (judged against --host-memory or the cluster's host memory where it is known).

    Examples:\n
      trainfit plan llama-3.1-70b --gpu H100-80GB --gpus 64 --global-batch-tokens 4M --seq 8192 --tokens 15T\n
      trainfit plan llama-3.1-8b --gpu A100-40GB --gpus 8 --global-batch-tokens 1M --seq 4096 --emit deepspeed > ds.json\n
      trainfit plan llama-3.1-8b --gpu H100-96GB --gpus 8 --seq 8192 --stacks hf,torchtitan\n
      trainfit plan llama-3.1-8b --gpu H100-80GB --gpus 8 --seq 8192 --stack torchtitan --tokens 1B --emit torchtitan > job.toml\n
      trainfit plan mistral-7b --gpu RTX-4090 --gpus 1 --seq 2048\n
      trainfit plan gpt-3-175b --gpu A100-80GB --gpus 1024 --global-batch-tokens 3.2M --seq 2048 --json
    """
    from ..api import HOST_MEMORY_UNREAD_PLAN, load_gpu, token_model
    if margin is not None:
        raise SetupError("--margin is gone: plan judges the fit as `trainfit estimate` does (its fit rule: required <= "
                         "GPU memory less the fixed overheads); keep memory free with --reserve GiB")
    if mode not in ("train", "serve"):
        raise SetupError(f"--mode {mode!r}: plan searches train or serve")
    if mode == "serve":
        given = dict(gpus=gpus != 1, global_batch_tokens=global_batch_tokens is not None, tokens=tokens is not None,
                     stack=stack != STACK_DEFAULT, optimizer=optimizer != "adamw", recompute=recompute is not None,
                     zero=zero is not None, pp=pp is not None, dp=dp is not None,
                     reserve=reserve != BY_NAME["reserve"].default,
                     efficiency=efficiency is not None, batch_tolerance=batch_tolerance != 0.05, verify=verify,
                     seq=seq is not None, gpu_memory=gpu_memory is not None, power_limit=power_limit is not None,
                     cluster=cluster is not None, host_memory=host_memory is not None, workers=workers is not None)
        wrote = written_params(given)  # (a flag written at its default value asks for training too)
        off = [f"--{k.replace('_', '-')}" for k, v in given.items() if v or k in wrote]
        if off:
            raise SetupError(f"{' and '.join(off)} {'apply' if len(off) > 1 else 'applies'} to --mode train only; "
                             "--mode serve takes --concurrency or --request-rate (with --ttft-ms, --prompt-len, "
                             "--completion-len), --max-model-len, --tpot-ms, --kv-cache-dtype, "
                             "--server, --tp, --precision, --price, --top")
        if top < 1:  # (--mode train: PlanQuery's own check)
            raise SetupError(f"--top must be >= 1, got {top}")
        if request_rate is not None:
            _plan_rate(model, gpu, price, request_rate, concurrency, ttft_ms, tpot_ms, serve_prompt_len,
                       serve_completion_len,
                       max_model_len, kv_cache_dtype, precision, tp, top, emit, json, server or "vllm")
            return
        rate_only = [f for f, v in (("--ttft-ms", ttft_ms), ("--prompt-len", serve_prompt_len),
                                    ("--completion-len", serve_completion_len)) if v is not None]
        if rate_only:
            raise SetupError(f"{' and '.join(rate_only)} {'size' if len(rate_only) > 1 else 'sizes'} a plan for a "
                             "request rate: add --request-rate R (requests/s) instead of --concurrency")
        _plan_serve(model, gpu, price, concurrency, max_model_len, tpot_ms, kv_cache_dtype, precision, tp, top,
                    emit, json, server or "vllm")
        return
    serve_only = [f for f, v in (("--concurrency", concurrency), ("--max-model-len", max_model_len),
                                 ("--tpot-ms", tpot_ms), ("--kv-cache-dtype", kv_cache_dtype),
                                 ("--server", server), ("--request-rate", request_rate), ("--ttft-ms", ttft_ms),
                                 ("--prompt-len", serve_prompt_len), ("--completion-len", serve_completion_len))
                     if v is not None]
    if serve_only:
        raise SetupError(f"{' and '.join(serve_only)} {'apply' if len(serve_only) > 1 else 'applies'} to --mode serve "
                         "only: add --mode serve")
    if workers is not None and workers < 1:
        raise SetupError(f"--workers {workers}: give 1 or more processes (1: search in this one)")
    check_value(BY_NAME["price"], price)  # the one definitions of --price (finite, >= 0) and --gpu-memory
    refuse_price_without_tokens(price, tokens)
    check_value(BY_NAME["gpu_memory"], gpu_memory)
    check_value(BY_NAME["power_limit"], power_limit)
    check_value(BY_NAME["reserve"], reserve)
    check_value(BY_NAME["host_memory"], host_memory)
    from ..units import parse_count
    from ..report import plan as report
    from ..plan.emit import ENGINES
    from ..plan.search import PlanQuery
    from ..setup import default_seq

    gbt = parse_count(global_batch_tokens, "--global-batch-tokens") if global_batch_tokens is not None else None
    if gbt is None and batch_tolerance != 0.05:
        raise SetupError("--batch-tolerance is the deviation allowed from --global-batch-tokens: add it, or drop "
                         "--batch-tolerance")
    budget_tokens = parse_count(tokens, "--tokens") if tokens is not None else None
    if emit in serving_versions.ENGINES:  # (a serving engine's command: plan --mode serve writes it)
        raise SetupError(f"--emit {emit} prints a serving command: add --mode serve (with --concurrency or "
                         f"--request-rate); training launch configs: --emit {', '.join(ENGINES)}")
    if emit is not None and emit not in ENGINES:
        raise SetupError(f"--emit {emit!r} is not one of: {', '.join(ENGINES)}")
    if emit is not None and json:
        raise SetupError(f"--emit {emit} prints a launch config, --json the plans: choose one of them")
    spec, g = token_model(model, "plan"), load_gpu(gpu, price, gpu_memory, power_limit, cluster, host_memory)
    # (--seq: the model's default as `trainfit estimate` takes it, setup/request.py default_seq)
    q = PlanQuery(gpus=gpus, seq=seq if seq is not None else default_seq(spec), global_batch_tokens=gbt, precisions=_csv(precision, "precision") if precision is not None else None,
                  optimizer=optimizer, recomputes=_csv(recompute, "recompute") if recompute is not None else None,
                  zeros=_csv(zero, "zero", int) if zero is not None else None, stacks=_csv(stack, "stack"),
                  tp=tp, pp=pp, dp=dp, reserve=reserve,
                  efficiency=efficiency,
                  batch_tolerance=batch_tolerance, top=top)
    if emit is not None:
        from ..plan.emit import check_model

        check_model(emit, spec)  # a model the engine cannot build: say so before searching
    result = _searched(spec, g, q, budget_tokens, quiet=json, workers=workers or default_workers())
    if host_memory is not None and result.candidates and "knobs" not in result.stats:
        # plans fit without the memory knobs (search.py: the knob levels, the offloads among them, searched only
        # where nothing fits plainly): no offload was judged against the node's memory
        result.notes = (*result.notes, HOST_MEMORY_UNREAD_PLAN)
    if verify and result.candidates:
        from ..plan.verify import verify as run_verify

        _, note = run_verify(spec, result.candidates)
        if note:
            result.notes = (*result.notes, note)
    if emit:
        _emit(emit, spec, g, q, result, budget_tokens, verify)
        return
    if json:
        typer.echo(report.dumps(report.plan_dict(result)))
        return
    report.render(result, echo=typer.echo)


def default_workers() -> int:
    """The CPUs this process may run on (its affinity: a container's or taskset's limit), up to 8."""
    import os

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(8, cpus))


def _searched(spec, g, q, budget_tokens, quiet: bool, workers: int = 1):
    """search() with a transient bar over its layouts on stderr (a MoE model's search takes seconds), over `workers`
    processes where the search is large (plan/parallel.py). The bar refreshes as the search reports (no refresh
    thread: a parallel search forks only a process with one thread)."""
    from rich.console import Console
    from rich.progress import Progress

    from ..plan.search import search

    console = Console(stderr=True)
    # (off when stderr is not a terminal: a redirected run's stderr keeps only its messages, one line per error)
    with Progress(transient=True, auto_refresh=False, disable=quiet or not console.is_terminal,
                  console=console) as bar:
        task = bar.add_task("searching layouts", total=None)

        def step(i: int, n: int) -> None:
            bar.update(task, completed=i, total=n, description=f"searching layouts {i}/{n}" if i < n else
                       "judging and timing the fastest layouts")
            bar.refresh()
        return search(spec, g, q, tokens=budget_tokens, progress=step, workers=workers)


def _emit(engine, spec, g, q, result, budget_tokens, verify: bool = False) -> None:
    """Config on stdout (so `> ds.json` works), the chosen plan, its --verify trace and any caveat on stderr."""
    from dataclasses import replace

    from ..report import plan as report

    from ..plan import knobs
    from ..plan.emit import emit as write
    from ..plan.emit import caveats, runnable_query, supports
    from ..plan.search import search

    pick = next((c for c in result.candidates if supports(engine, c.setup) is None), None)
    if pick is None:
        again = search(spec, g, replace(q, top=50, **runnable_query(engine, q)), tokens=budget_tokens)
        pick = next((c for c in again.candidates if supports(engine, c.setup) is None), None)
        if pick is None:
            why = supports(engine, result.candidates[0].setup) if result.candidates else "nothing fits at all"
            raise SetupError(f"--emit {engine}: no plan that {engine} can run fits ({why}); try another --emit")
        best = result.candidates[0] if result.candidates else None
        if best is not None:
            typer.echo(f"note: the best plan of --stack {','.join(q.stacks)} ({best.setup.dp}×{best.setup.tp}×"
                       f"{best.setup.pp} on the {best.setup.stack} stack, {best.time.tokens_per_second:,.0f} tokens/s) "
                       f"cannot run on {engine} ({supports(engine, best.setup)}); emitting the fastest plan {engine} "
                       f"runs (on the {pick.setup.stack} stack, {pick.time.tokens_per_second:,.0f} tokens/s)", err=True)
    s = pick.setup
    experts = (f", ep {s.ep}" if s.ep > 1 else "") + (f", etp {s.etp}" if s.etp is not None else "")
    cp = f" × cp {s.cp}" if s.cp > 1 else ""  # (world = dp × tp × pp × cp)
    typer.echo(f"plan: dp {s.dp} × tp {s.tp} × pp {s.pp}{cp}{experts}, ZeRO-{s.zero}, micro-batch {s.batch} × accumulation "
               f"{s.grad_accum}, {s.recompute} recompute, {s.precision}, stack {s.stack}"
               f"{(' ' + knobs.setup_flags(s)) if knobs.setup_flags(s) else ''}: "
               f"{pick.time.tokens_per_second:,.0f} tokens/s, peak {pick.peak / 2**30:.1f} GiB"
               + (f"; {_budget_words(pick.budget)}" if pick.budget else ""), err=True)
    if verify:  # (the trace of the table's plans: the one emitted, or a later one the table did not hold)
        v = getattr(pick, "verify", None)
        typer.echo("verify: " + (report.verify_words(v) if v else "not traced (--verify traces the table's plans; "
                                 f"{engine} runs none of them)"), err=True)
    for note in (*result.notes, *caveats(engine, s)):  # (the plans' caveats, as the table prints them; the config's)
        typer.echo(f"· {note}", err=True)
    for w in pick.warnings:  # what the stack's own code warns of for the plan emitted (the table prints them too)
        typer.echo(f"warning: {w}", err=True)
    typer.echo(write(engine, s, spec, g.gpus_per_node, budget_tokens), nl=False)


def _budget_words(b: dict) -> str:
    """A --tokens budget's time, GPU-hours, cost and energy in words (analytic/timing.py budget's keys)."""
    from ..units import fmt_count, fmt_energy, fmt_seconds

    return (f"{fmt_count(b['train_tokens'])} tokens in {fmt_seconds(b['train_seconds'])}, {b['gpu_hours']:,.0f} "
            f"GPU-h, ${b['cost_usd']:,.0f}, {fmt_energy(b['energy_kwh'])}")


def _plan_serve(model, gpu, price, concurrency, max_model_len, tpot_ms, kv_cache_dtype, precision, tp, top, emit,
                json, server) -> None:
    from ..api import token_model
    from ..plan.serve import serve_plans
    from ..report.plan import dumps
    from ..setup import Setup, serve_dtype

    if concurrency is None:
        raise SetupError("--mode serve plans for a number of concurrent sequences: add --concurrency N")
    _check_serve_outputs(tpot_ms, emit, json, server)
    check_value(BY_NAME["price"], price)
    spec = token_model(model, "plan")
    gpus = _serve_gpus(gpu, price)
    base = Setup(mode="serve", server=server, precision=precision or serve_dtype(spec), max_model_len=max_model_len,
                 kv_dtype=kv_cache_dtype, quant=spec.checkpoint_quant)  # (a quantised checkpoint loads as stored)
    plans, why_not = serve_plans(spec, gpus, concurrency, base, tpot_ms / 1e3 if tpot_ms else None, top, tp)
    if emit:
        _emit_serve(emit, model, spec, plans, why_not, "load", lambda best: (
            f"plan: {best.replicas} replica(s) of tp {best.tp} on {best.gpu}, {best.sequences_per_replica} sequences "
            f"each, {best.tpot_seconds * 1e3:.1f} ms per token"))
        return
    if json:
        typer.echo(dumps({"model": spec.name, "server": server, "concurrency": concurrency,
                          "plans": [p.as_dict() for p in plans],
                          "not_served": why_not}))
        return
    from rich import box
    from rich.table import Table

    from ..report.console import console as stdout_console

    engine = serving_versions.parse(server).label
    t = Table(title=f"{spec.name}: {concurrency} sequences of {base.max_model_len or spec.max_positions:,} tokens "
              f"({engine}), cheapest first", box=box.SIMPLE_HEAD, header_style="bold")
    for col in ("GPU", "tp", "replicas", "GPUs", "sequences each", "KV tokens each", "ms per token", "$/h"):
        t.add_column(col, justify="left" if col == "GPU" else "right")
    for p in plans:
        t.add_row(p.gpu, str(p.tp), str(p.replicas), str(p.gpus), str(p.sequences_per_replica), f"{p.kv_tokens:,}",
                  f"{p.tpot_seconds * 1e3:.1f}", f"{p.price_per_hour:,.2f}")
    stdout_console().print(t)
    if not plans:
        typer.echo("no GPU type serves that load within the target")
    for line in why_not:
        typer.echo(f"· not served: {line}")
    typer.echo("· decode time: one engine step op by op (its GEMMs, the paged KV reads with sequences at half of "
               "--max-model-len, TP all-reduces, the sampler, CUDA graphs); prices: the catalog's, or --price")


def _check_serve_outputs(tpot_ms, emit, json, server) -> None:
    """The flags both serve searches share: a positive --tpot-ms; --emit of the engine --server names, not with
    --json."""
    if tpot_ms is not None and not tpot_ms > 0:
        raise SetupError(f"--tpot-ms must be a positive number of milliseconds, got {tpot_ms}")
    if emit is not None and emit not in serving_versions.ENGINES:  # (a training launch config: --mode train's)
        raise SetupError(f"--emit {emit!r}: plan --mode serve emits a serving command, "
                         f"{' or '.join(serving_versions.ENGINES)} (the --server it plans); training launch configs "
                         "come from --mode train")
    if emit is not None and emit != serving_versions.engine_of(server):
        raise SetupError(f"--emit {emit!r}: plan --mode serve --server {server} emits "
                         f"{serving_versions.engine_of(server)}")
    if emit is not None and json:
        raise SetupError(f"--emit {emit} prints a command, --json the plans: choose one of them")


def _emit_serve(emit: str, model: str, spec, plans: list, why_not: list, what: str, describe) -> None:
    """--emit vllm|sglang of `plan --mode serve`: the best plan's engine command on stdout, its summary (`describe`)
    on stderr; no plan: one line with why."""
    if not plans:
        raise SetupError(f"--emit {emit}: no plan serves that {what}" + (f" ({'; '.join(why_not)})" if why_not
                                                                         else ""))
    from ..engines import analytic
    from ..hardware import resolve_gpu
    from ..plan.emit_sglang import sglang_command
    from ..plan.emit_vllm import vllm_command

    best = plans[0]
    sv = analytic(spec, best.setup, resolve_gpu(best.gpu)).detail.serving
    sglang = serving_versions.engine_of(best.setup.server) == "sglang"
    command = (sglang_command if sglang else vllm_command)(model, best.setup, sv)  # (a refusal before any output)
    typer.echo(describe(best), err=True)
    typer.echo(command)


def _serve_gpus(gpu: str, price):
    from ..hardware import list_gpus, resolve_gpu

    names = [g.strip() for g in gpu.split(",") if g.strip()]
    gpus = [g for g in list_gpus() if g.vendor == "nvidia"] if names == ["all"] else [resolve_gpu(n) for n in names]
    if price is not None and len(gpus) > 1:  # one price for every type would rank them by it alone
        raise SetupError(f"--price {price:g} is one GPU type's hourly price, and --gpu {gpu} lists {len(gpus)} types: "
                         "drop --price (each type's catalog price, `trainfit gpus`), or plan one type with its price")
    return [g.with_price(price) for g in gpus]


def _plan_rate(model, gpu, price, rate, concurrency, ttft_ms, tpot_ms, prompt_len, completion_len, max_model_len,
               kv_cache_dtype, precision, tp, top, emit, json, server) -> None:
    """plan --mode serve --request-rate: replicas sized by serving_time's steady state (plan/serve.py)."""
    from ..api import token_model
    from ..plan.serve import serve_rate_plans
    from ..report.plan import dumps
    from ..setup import Setup, serve_dtype

    if concurrency is not None:
        raise SetupError("--concurrency and --request-rate both size the load: give one of them")
    for name, v in (("request_rate", rate), ("ttft_ms", ttft_ms), ("price", price), ("prompt_len", prompt_len),
                    ("completion_len", completion_len), ("max_model_len", max_model_len)):
        if v is not None:  # (the lengths not given take their defaults below)
            check_value(BY_NAME[name], v, "serve")
    _check_serve_outputs(tpot_ms, emit, json, server)
    spec = token_model(model, "plan")
    gpus = _serve_gpus(gpu, price)
    p = prompt_len or BY_NAME["prompt_len"].default
    o = completion_len or BY_NAME["completion_len"].default
    base = Setup(mode="serve", server=server, precision=precision or serve_dtype(spec), prompt_len=p,
                 completion_len=o, max_model_len=max_model_len or p + o, kv_dtype=kv_cache_dtype,
                 quant=spec.checkpoint_quant)  # (a quantised checkpoint loads as stored: setup/request.py)
    plans, why_not = serve_rate_plans(spec, gpus, rate, base, ttft_ms / 1e3 if ttft_ms else None,
                                      tpot_ms / 1e3 if tpot_ms else None, top, tp)
    if emit:
        _emit_serve(emit, model, spec, plans, why_not, "rate", lambda best: (
            f"plan: {best.replicas} replica(s) of tp {best.tp} on {best.gpu}, {rate / best.replicas:.3g} requests/s "
            f"each ({best.in_flight} in flight): TTFT {best.ttft_seconds * 1e3:.1f} ms, TPOT "
            f"{best.tpot_seconds * 1e3:.1f} ms"))
        return
    if json:
        typer.echo(dumps({"model": spec.name, "server": server, "request_rate": rate, "prompt_len": p,
                          "completion_len": o, "plans": [x.as_dict() for x in plans], "not_served": why_not}))
        return
    from rich import box
    from rich.table import Table

    from ..report.console import console as stdout_console

    engine = serving_versions.parse(server).label
    t = Table(title=f"{spec.name}: {rate:g} requests/s of {p} + {o} tokens ({engine}), cheapest first",
              box=box.SIMPLE_HEAD, header_style="bold")
    for col in ("GPU", "tp", "replicas", "GPUs", "in flight each", "req/s each", "TTFT ms", "TPOT ms", "$/h"):
        t.add_column(col, justify="left" if col == "GPU" else "right")
    for x in plans:
        t.add_row(x.gpu, str(x.tp), str(x.replicas), str(x.gpus), str(x.in_flight), f"{x.requests_per_second:.3g}",
                  f"{x.ttft_seconds * 1e3:.1f}", f"{x.tpot_seconds * 1e3:.1f}", f"{x.price_per_hour:,.2f}")
    stdout_console().print(t)
    if not plans:
        typer.echo("no GPU type serves that rate within the targets")
    for line in why_not:
        typer.echo(f"· not served: {line}")
    typer.echo("· each replica under continuous batching, engine steps op by op (analytic/serving_time.py): its "
               "share of the rate at the fewest requests in flight that complete it; prices: the catalog's, or --price")
