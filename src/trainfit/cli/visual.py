"""The visual commands: `timeline`, `sweep`, `report`, `serve` (issue 6).

Plain typer-compatible functions; cli.py registers them with `app.command()(fn)`. Like the rest of the CLI
they only parse arguments into the library's dataclasses and hand results to a report; errors a user can
cause are TrainfitErrors (one line, exit code 2, printed by cli.main).
"""
from __future__ import annotations

from typing import Optional, Tuple

import typer

from .. import api
from ..cancel import DEFAULT_TIME_LIMIT
from ..errors import EngineUnavailableError, SetupError, TrainfitError
from .options import JsonOpt, with_settings, written_params
from .spinner import spinner
from ..setup import BY_NAME, Request, refuse_written


def _vary_not_fixed(knob: str, req: Request) -> None:
    """Refuse a knob both swept (--vary) and fixed by its own flag: the flag would be silently overridden."""
    from ..report.sweep import KNOBS

    field = KNOBS[knob][0] if knob in KNOBS else None
    if field is None:
        return  # sweep.parse_values names the valid knobs
    value, default = getattr(req, field), getattr(Request(model=req.model), field)
    if value != default:
        flag = "--" + field.replace("_", "-")
        raise SetupError(f"--vary {knob} sets {flag} at each point of the sweep; drop {flag} {value}")


def _plots():
    from ..report import plots

    plots._mpl()  # a missing matplotlib is one line, before any engine runs
    return plots


# (the trace engine runs no --tp or --pp, so neither is offered, nor the settings that need one above 1: setup/rules.py
# refuses --sequence-parallel and --tp-comm-overlap without --tp > 1, --vpp and a --pp-split without --pp > 1; nor
# the settings of the step's time and cost, which the timeline has not: --mfu, --tokens, --price, --power-limit)
@with_settings(exclude=("mfu", "tokens", "price", "power_limit", "tp", "pp", "sequence_parallel", "tp_comm_overlap",
                        "vpp", "pp_split"))
def timeline(req: Request,
             output: str = typer.Option("timeline.png", "--output", "-o", help="Image to write: .png, .svg or .pdf."),
             measure: bool = typer.Option(False, "--measure", help="Also run the real step here (use --device cpu) and overlay its measured peaks."),
             fast: bool = typer.Option(False, "--fast", help="Trace a few layers and extrapolate the peak (deep models: seconds instead of a minute); the curve is then the short trace's."),
             json: bool = JsonOpt) -> None:
    """Memory over one step, stacked by category (parameters, optimizer state, gradients, activations,
    temporaries), phases shaded, the peak annotated with what holds it; --gpu draws the GPU's capacity.
    From the trace engine (the real PyTorch step on fake tensors; needs trainfit[torch]).

    Examples:\n
      trainfit timeline llama-3.1-8b --batch 1 --seq 2048 --precision amp-bf16 --gpu H100-80GB -o step.png\n
      trainfit timeline ./config.json --device cpu --measure -o step.png\n
      trainfit timeline tiny-llama --device cpu --grad-accum 2 --measure -o accum.svg\n
      trainfit timeline llama-3.1-70b --fast -o 70b.png
    """
    api.refuse_host_memory(req, "timeline draws the trace engine's step, which judges the device only", "drop it")
    plots = _plots()
    plots.check_output(output)  # a bad -o before the trace, not after it
    g = api.gpu_of(req)  # a bad --gpu before the trace too
    if measure and req.mode != "train":
        raise SetupError("--measure overlays a measured training step; drop --mode infer")
    if fast and req.mode != "train":
        raise SetupError("--fast extrapolates a training trace over the layers; inference is traced whole: drop --fast")
    try:
        with spinner("tracing the step on fake tensors", quiet=json):
            traced = api.trace(req, extrapolate=fast)
    except SetupError as e:  # the engine's refusals name estimate's --engine, which timeline has not
        if "--engine" not in str(e):
            raise
        why = str(e).replace("--engine analytic", "the analytic engine").replace("--engine trace", "the trace engine")
        raise SetupError(f"timeline draws the trace engine's step: {why}; `trainfit estimate` answers with the "
                         "analytic engine") from e
    measured = None
    if measure:
        with spinner("running the real step here", quiet=json):
            measured = api.measure(req)
    plots.plot_timeline(traced, output, gpu=g, measured=measured)
    if json:
        from ..report.json_out import dumps

        out = {"output": output, "trace": traced.to_dict()}
        if measured is not None:
            out["measured"] = measured.to_dict()
        typer.echo(dumps(out))
        return
    from ..units import fmt_bytes
    from ..report.terminal import PHASE_NAMES

    m = traced.memory
    line = f"wrote {output}: peak {fmt_bytes(m.peak)} at {PHASE_NAMES.get(m.peak_phase, m.peak_phase)} (trace engine)"
    f = traced.fit  # the fit rule's verdict, as `estimate --engine trace` judges it (api.trace: with_fit)
    if f is not None:
        line += (f"; {'fits' if f.fits else 'does not fit'} on {g.name} (required {fmt_bytes(f.required)} of "
                 f"capacity {fmt_bytes(f.capacity)})")
    elif g is not None:  # (no caching allocator replayed, e.g. --device cpu: the peak against the GPU's memory)
        line += f"; {'fits' if m.peak <= g.memory else 'does not fit'} on {g.name} ({fmt_bytes(g.memory)})"
    typer.echo(line)
    if measured is not None:
        mp = measured.memory.peak
        typer.echo(f"measured peak {fmt_bytes(mp)} (trace {(m.peak - mp) / mp:+.2%}); the measure engine records "
                   "peaks per phase, not a curve: drawn as a dotted line and per-phase bars")


def _list_help(name: str) -> str:
    return BY_NAME[name].meta.help + " A comma list draws one line per value."


# (--tokens and --price: the sweep's table has no budget column to spend them on)
@with_settings(exclude=("precision", "optimizer", "recompute", "attention", "alloc_conf", "tokens", "price"))
def sweep(req: Request,
          vary: Tuple[str, str] = typer.Option(..., "--vary", help="KNOB VALUES: the knob (batch, seq, grad-accum, gpus, dp, tp, pp, zero, recompute, attention, precision, optimizer) and its values: low:high doubles (1:64 → 1,2,4,…,64; zero 0:3 counts), or a comma list."),
          precision: Optional[str] = typer.Option(None, "--precision", help=_list_help("precision")),
          optimizer: str = typer.Option("adamw", "--optimizer", help=_list_help("optimizer")),
          recompute: str = typer.Option("none", "--recompute", help=_list_help("recompute")),
          attention: str = typer.Option("auto", "--attention", help=_list_help("attention")),
          output: Optional[str] = typer.Option(None, "--output", "-o", help="Also draw the sweep: .png, .svg or .pdf."),
          json: bool = JsonOpt) -> None:
    """Peak memory and step time against one knob (analytic engine), one line per variant; with --gpu, where
    it stops fitting. Prints the table; -o draws it.

    Examples:\n
      trainfit sweep llama-3.1-8b --vary seq 512:16384 --attention eager,flash -o seq.png\n
      trainfit sweep llama-3.2-1b --vary batch 1:64 --gpu H100-80GB -o batch.png\n
      trainfit sweep llama-3.1-70b --vary gpus 8:64 --zero 3 --gpu H100-80GB --recompute none,full\n
      trainfit sweep mistral-7b --vary recompute none,selective,full --batch 8 --gpu A100-80GB --json
    """
    from ..report.sweep import render_table, run_sweep

    knob, values = vary
    variants = {"attention": attention, "recompute": recompute, "precision": precision, "optimizer": optimizer}
    # the variant options are the sweep's own: a training one written in another mode is refused as estimate's are
    refuse_written(written_params(variants), req.mode, req.rollout, req.server)
    single = {k: v for k, v in variants.items() if v and "," not in v}
    from dataclasses import replace

    req = replace(req, **single)
    multi = {k: v for k, v in variants.items() if v and "," in v}
    _vary_not_fixed(knob, req)
    plots = _plots() if output else None
    if output:
        plots.check_output(output)
    result = run_sweep(req, knob, values, multi)
    if output:
        plots.plot_sweep(result, output)
    if json:
        from ..report.json_out import dumps

        d = result.to_dict()
        if output:
            d["output"] = output
        typer.echo(dumps(d))
        return
    render_table(result)
    if output:
        typer.echo(f"wrote {output}")


@with_settings()
def report(req: Request,
           gpus: Optional[int] = typer.Option(None, "--gpus", help="Also plan for this many GPUs of --gpu (the planner's fastest layouts that fit)."),
           global_batch_tokens: Optional[str] = typer.Option(None, "--global-batch-tokens", help="With --gpus: tokens per optimizer step for the plan (e.g. 1M)."),
           vary: Optional[Tuple[str, str]] = typer.Option(None, "--vary", help="The report's sweep: KNOB VALUES as in `trainfit sweep` (default: batch 1:64)."),
           trace: Optional[bool] = typer.Option(None, "--trace/--no-trace", help="Draw the traced timeline (default: when the trace engine is installed; otherwise the analytic phase chart)."),
           output: str = typer.Option("report.html", "--output", "-o", help="The HTML file to write."),
           ) -> None:
    """One self-contained HTML page (inline SVG and CSS; opens offline): verdict and breakdown, the memory
    timeline of the step, training vs inference (same batch and batch 1), a sweep, and the plan with --gpus.

    Examples:\n
      trainfit report llama-3.1-8b --gpu H100-80GB -o report.html\n
      trainfit report llama-3.2-1b --batch 8 --gpu A100-40GB --vary seq 512:16384 -o 1b.html\n
      trainfit report llama-3.1-70b --gpu H100-80GB --gpus 64 --global-batch-tokens 4M --no-trace -o 70b.html
    """
    from ..units import parse_count
    from ..report.html import write_report

    _plots()
    if vary:
        _vary_not_fixed(vary[0], req)
    if gpus is not None and gpus < 1:
        raise SetupError(f"--gpus must be a positive integer, got {gpus}")
    if gpus is not None and req.mode != "train":  # (the plan is a training layout's; plan --mode serve sizes serving)
        raise SetupError(f"--gpus plans a training run; the report of --mode {req.mode} has no plan: drop --gpus"
                         + (" (for serving replicas: trainfit plan --mode serve)" if req.mode == "serve" else ""))
    if gpus is not None and req.gpu is None:
        raise SetupError(f"--gpus {gpus} plans for that many GPUs of one type: add --gpu (see `trainfit gpus`)")
    gbt = parse_count(global_batch_tokens, "--global-batch-tokens") if global_batch_tokens is not None else None
    if gbt is not None and gpus is None:
        raise SetupError("--global-batch-tokens sets the batch of the plan: add --gpus N (and --gpu), or drop it")
    if req.alloc_conf is not None and trace is False:
        raise SetupError("--alloc-conf sets the caching allocator the traced timeline replays: drop --no-trace, or "
                         "drop --alloc-conf")
    with spinner("building the report (trace, comparison, sweep" + (", plan" if gpus else "") + ")"):
        path = write_report(req, output, gpus=gpus, trace=trace, vary=tuple(vary) if vary else None,
                            global_batch_tokens=gbt)
    typer.echo(f"wrote {path} ({path.stat().st_size / 1024:,.0f} KiB, self-contained)")


def serve(host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (default: this machine only)."),
          port: int = typer.Option(8000, "--port", "-p", help="Port to listen on."),
          open_browser: bool = typer.Option(False, "--open", help="Open the page in the default browser."),
          time_limit: float = typer.Option(DEFAULT_TIME_LIMIT, "--time-limit", help="Seconds a request's computation may take: "
                                           "past it the work stops and the answer is HTTP 503 (work also stops "
                                           "when its client disconnects)."),
          ) -> None:
    """A local web app: pick a model (catalog or pasted config.json), a GPU and the knobs; see the breakdown,
    the fit verdict and the chart update. JSON API: /api/estimate?model=…&batch=…&seq=… (same object as
    `trainfit estimate --json`). Needs trainfit[web]. Each request computes under --time-limit and stops when
    its client disconnects; Ctrl-C stops the server and its running requests within about a second.

    Examples:\n
      trainfit serve --port 8000\n
      curl 'http://127.0.0.1:8000/api/estimate?model=llama-3.1-8b&batch=4&seq=4096&gpu=H100-80GB'
    """
    if not 0 < port < 65536:
        raise SetupError(f"--port must be between 1 and 65535, got {port}")
    try:
        import uvicorn

        from ..web.app import SHUTDOWN_GRACE, create_app, stop_all
    except ImportError as e:
        raise EngineUnavailableError(f"trainfit serve needs the web extra ({e.name} is missing): pip install 'trainfit[web]'") from e
    import socket

    try:  # a host that is no address of this machine, or a taken port: one line here, not uvicorn's log and exit
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        address = socket.getaddrinfo(host, port, family, socket.SOCK_STREAM)[0][4]
    except (OSError, UnicodeError) as e:
        raise TrainfitError(f"--host {host} is not an address this machine can listen on ({getattr(e, 'strerror', None) or e}): "
                            "use 127.0.0.1, 0.0.0.0 or one of this machine's addresses") from None
    try:
        with socket.socket(family) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as e:
        import errno

        if e.errno == errno.EADDRINUSE or e.errno == errno.EACCES:  # the port is taken or privileged
            raise TrainfitError(f"cannot listen on {host}:{port}: {e.strerror or e}; pick another --port") from None
        raise TrainfitError(f"cannot listen on --host {host}: {e.strerror or e}; use 127.0.0.1, 0.0.0.0 or one of "
                            "this machine's addresses") from None
    app = create_app(time_limit=time_limit)  # (a bad --time-limit: one line before anything listens)
    url = f"http://{host}:{port}/"
    typer.echo(f"trainfit web UI at {url} (Ctrl-C to stop)")
    if open_browser:
        import threading
        import webbrowser

        threading.Timer(1.0, webbrowser.open, args=(url,)).start()
    # Ctrl-C: the running computations are told to stop at once (each request answers 503 "the server is stopping"),
    # then uvicorn waits up to SHUTDOWN_GRACE for their answers before it cancels what is left
    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            stop_all(app)
            super().handle_exit(sig, frame)

    Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                          timeout_graceful_shutdown=SHUTDOWN_GRACE)).run()


__all__ = ["timeline", "sweep", "report", "serve"]
