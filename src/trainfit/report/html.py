"""`trainfit report`: one self-contained HTML file (inline CSS and SVG; nothing fetched when it is opened).

Sections: the verdict and breakdown (analytic engine), the step's memory timeline (trace engine when it is
available, else the analytic phase chart), training vs inference (api.compare: the same batch and batch 1),
a sweep (report/sweep.py), and the plan when --gpus is given and the planner (trainfit.plan) is installed.
The page computes nothing: every number comes from an engine through the library's API.
"""
from __future__ import annotations

import datetime as _dt
from html import escape
from pathlib import Path

from .. import api
from ..compare_setup import NOTE_START
from ..errors import TrainfitError
from ..estimate import Estimate
from ..setup import GPU_SETTINGS, SETTINGS
from ..spec import VisionSpec
from ..units import fmt_bytes, fmt_count, fmt_seconds
from . import plots
from .output import check_writable, writing
from .held import DEVICE_TOTAL_LABEL, REQUIRED_LABEL, RESERVED_LABEL, fit_numbers, held_sentence, verdict_word
from .sweep import SweepResult, run_sweep, sweep_html_table
from .time_bar import time_section
from .terminal import PHASE_NAMES, budget_rows, not_counted, step_time_label, compare_summary, memory_rows, setup_line, time_cells

CSS = """
:root { --fg:#1d2330; --muted:#5b6475; --line:#e3e6ec; --ok:#1a7f37; --bad:#c62828; --accent:#4C72B0; }
* { box-sizing: border-box; }
body { font: 15px/1.5 -apple-system, BlinkMacSystemFont, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif;
       color: var(--fg); margin: 0; background: #f6f7f9; }
main { max-width: 1180px; margin: 0 auto; padding: 24px 28px 60px; }
header h1 { margin: 0 0 4px; font-size: 26px; }
header .setup { color: var(--muted); font-size: 13px; }
.verdict { display:flex; gap: 14px; flex-wrap: wrap; margin: 18px 0 6px; }
.card { background: #fff; border: 1px solid var(--line); border-radius: 8px; padding: 12px 16px; min-width: 170px; }
.card .k { color: var(--muted); font-size: 12px; text-transform: uppercase; letter-spacing: .04em; }
.card .v { font-size: 22px; font-weight: 600; }
.ok { color: var(--ok); font-weight: 600; } .bad { color: var(--bad); font-weight: 600; }
section { background: #fff; border: 1px solid var(--line); border-radius: 8px; padding: 16px 20px; margin-top: 18px; }
section h2 { margin: 0 0 10px; font-size: 19px; }
section p.note, .muted { color: var(--muted); font-size: 13px; }
.row { display: grid; grid-template-columns: minmax(0, 3fr) minmax(0, 2fr); gap: 20px; align-items: start; }
.row.even { grid-template-columns: minmax(0, 1fr) minmax(0, 1fr); }
@media (max-width: 900px) { .row, .row.even { grid-template-columns: 1fr; } }
svg { max-width: 100%; height: auto; }
table { border-collapse: collapse; font-size: 13.5px; width: 100%; }
th, td { border-bottom: 1px solid var(--line); padding: 4px 8px; text-align: left; }
table.num td:not(:first-child), table.num th:not(:first-child) { text-align: right; font-variant-numeric: tabular-nums; }
tr.peak td { font-weight: 700; } tr.sub td { color: var(--muted); }
ul.notes { color: var(--muted); font-size: 12.5px; padding-left: 18px; }
footer { color: var(--muted); font-size: 12px; margin-top: 24px; }
"""


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("trainfit")
    except Exception:  # pragma: no cover - not installed as a distribution
        return "dev"


def _svg(fig) -> str:
    return f"<figure>{plots.svg_text(fig)}</figure>"


def _table(head: list[str], rows: list[list[str]], cls: str = "num", row_classes: list[str] | None = None) -> str:
    out = [f"<table class='{cls}'><thead><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr></thead><tbody>"]
    for i, r in enumerate(rows):
        rc = f" class='{row_classes[i]}'" if row_classes and row_classes[i] else ""
        out.append(f"<tr{rc}>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>")
    out.append("</tbody></table>")
    return "\n".join(out)


def _notes(notes) -> str:
    return "<ul class='notes'>" + "".join(f"<li>{escape(n)}</li>" for n in notes) + "</ul>" if notes else ""


# ---- sections ------------------------------------------------------------------------------------------
def _verdict(e: Estimate) -> str:
    cards = [("peak memory per GPU", fmt_bytes(e.memory.peak), f"at {PHASE_NAMES.get(e.memory.peak_phase, e.memory.peak_phase)}"),
             ("parameters", fmt_count(e.params), f"{e.params:,}")]
    t = e.time
    if t is not None:
        fit = f"<span class='{'ok' if t.fits else 'bad'}'>{verdict_word(t, e.setup.mode)}</span>"
        held = f" ({fmt_bytes(t.gpu_memory)})" if t.gpu_memory else ""
        judged = (f"{fit_numbers(e.fit)}, "
                  if e.fit is not None else "")
        cards.insert(0, (f"on {escape(t.gpu)}{held}", fit, f"{judged}headroom {fmt_bytes(t.headroom)}"))
        if e.setup.mode == "train":
            cards.append((step_time_label(e), fmt_seconds(t.step_seconds),
                          f"{fmt_count(t.tokens_per_second)} tokens/s"))
        elif e.setup.mode == "serve":  # the engine under load (analytic/serving_time.py)
            ld = e.detail.serving.load
            cards.append(("output", f"{t.tokens_per_second:,.0f} tok/s",
                          f"TTFT {fmt_seconds(ld['ttft_seconds'])}, TPOT {fmt_seconds(ld['tpot_seconds'])}"
                          if ld else "no request fits the KV cache"))
        elif e.setup.mode == "rl":  # (Timing's prefill_seconds is the whole generate phase: estimate's table)
            cards.append((step_time_label(e), fmt_seconds(t.step_seconds),
                          f"{t.decode_tokens_per_second:,.0f} generated tokens/s"))
        elif t.decode_tokens_per_second is None:  # an encoder (BERT): nothing is decoded
            cards.append(("prefill", fmt_seconds(t.prefill_seconds), "an encoder: no decode"))
        else:
            cards.append(("decode", f"{t.decode_tokens_per_second:,.0f} tok/s", f"prefill {fmt_seconds(t.prefill_seconds)}"))
    body = "".join(f"<div class='card'><div class='k'>{k}</div><div class='v'>{v}</div><div class='muted'>{escape(s)}</div></div>"
                   for k, v, s in cards)
    return f"<div class='verdict'>{body}</div>"


def _would_fit(req: api.Request, e: Estimate) -> str:
    """When it does not fit: the changes that would, fastest first (studies/fit_advice.py, as `estimate` lists)."""
    if e.time is None or e.time.fits:
        return ""
    rows = [[escape(x.flags), escape(x.why), f"{fmt_bytes(x.required)} of {fmt_bytes(x.capacity)}",
             fmt_seconds(x.step_seconds), x.times] for x in api.fit_advice(req, e)]
    if not rows:
        return ""
    return ("<section><h2>What would fit</h2><p class='muted'>Each change checked by the analytic engine's fit rule "
            "(required within capacity); slowdown = time per token per GPU against this setup's.</p>"
            + _table(["change", "why", "needs", "step", "slowdown"], rows) + "</section>")


def _breakdown(e: Estimate, traced: Estimate | None) -> str:
    head = ["memory per GPU", "analytic"] + (["trace"] if traced is not None else [])
    rows, classes = [], []
    tmem = None
    if traced is not None:
        tmem = dict(memory_rows(traced))
    for name, v in memory_rows(e):
        rows.append([escape(name), fmt_bytes(v)] + ([fmt_bytes(tmem[name]) if name in tmem else ""] if tmem is not None else []))
        classes.append("")
    for phase, v in e.memory.phases.items():
        mark = " ◀ peak" if phase == e.memory.peak_phase else ""
        tv = traced.memory.phases.get(phase) if traced is not None else None
        rows.append([f"at {PHASE_NAMES.get(phase, phase)}", fmt_bytes(v) + mark]
                    + ([fmt_bytes(tv) if tv is not None else ""] if traced is not None else []))
        classes.append("sub")
    rows.append(["peak", f"{fmt_bytes(e.memory.peak)} ({PHASE_NAMES.get(e.memory.peak_phase, e.memory.peak_phase)})"]
                + ([f"{fmt_bytes(traced.memory.peak)} ({PHASE_NAMES.get(traced.memory.peak_phase, traced.memory.peak_phase)})"]
                   if traced is not None else []))
    classes.append("peak")
    for label, fld in ((REQUIRED_LABEL, "required"), (RESERVED_LABEL, "reserved"), (DEVICE_TOTAL_LABEL, "device_total")):
        mine, theirs = getattr(e.memory, fld), getattr(traced.memory, fld) if traced is not None else None
        if mine is not None or theirs is not None:
            rows.append([label, fmt_bytes(mine) if mine is not None else ""]
                        + ([fmt_bytes(theirs) if theirs is not None else ""] if traced is not None else []))
            classes.append("sub")
    mem = _table(head, rows, row_classes=classes)
    f = e.flops
    crow = [["parameters", f"{fmt_count(e.params)} ({e.params:,})"]]
    if e.params_per_rank != e.params:
        crow.append(["parameters per GPU", fmt_count(e.params_per_rank)])
    if not_counted(e) is not None:
        crow.append(["FLOPs", not_counted(e)])
    elif e.setup.mode == "rl":
        crow += [["FLOPs per step (generate + score + train)", fmt_count(f.step, "FLOP")],
                 ["model FLOPs per trained token", fmt_count(f.per_token, "FLOP")]]
    elif e.setup.mode == "train":
        crow += [["FLOPs per step (fwd / bwd / recompute)", f"{fmt_count(f.forward)} / {fmt_count(f.backward)} / {fmt_count(f.recompute)}"],
                 ["FLOPs per step (hardware)", fmt_count(f.step, "FLOP")],
                 ["model FLOPs per token", fmt_count(f.per_token, "FLOP")]]
    else:
        crow += [["prefill FLOPs", fmt_count(f.forward, "FLOP")], ["forward FLOPs per token", fmt_count(f.per_token, "FLOP")]]
    t = e.time
    if t is not None and e.setup.mode == "rl":
        crow += [[step_time_label(e), fmt_seconds(t.step_seconds)]]
        crow += [[f"&nbsp;&nbsp;{name.replace('_', ' ')}", fmt_seconds(secs)]
                 for name, secs in e.detail.rl.phase_seconds.items()]
    elif t is not None and e.setup.mode == "train":
        crow += [[step_time_label(e), fmt_seconds(t.step_seconds)], ["tokens/s (all GPUs)", fmt_count(t.tokens_per_second)]]
    elif t is not None and e.setup.mode == "serve":
        ld = e.detail.serving.load
        crow += [["TTFT", fmt_seconds(ld["ttft_seconds"])], ["TPOT", fmt_seconds(ld["tpot_seconds"])],
                 ["output tokens/s (replica)", f"{ld['output_tokens_per_second']:,.0f}"]] if ld else []
    elif t is not None:
        crow += [["prefill time", fmt_seconds(t.prefill_seconds)],
                 [f"largest batch at {e.setup.seq} tokens", f"{t.max_batch:,}"],
                 [f"longest context at batch {e.setup.batch}", f"{t.max_seq:,}"]]
    crow += [[escape(label), escape(value)] for label, value in budget_rows(t)]  # (--tokens; also under --mfu)
    comp = _table(["compute", "value"], crow)
    gap = ""
    if traced is not None and traced.memory.peak:
        g = (e.memory.peak - traced.memory.peak) / traced.memory.peak
        gap = (f"<p class='note'>The analytic peak is {abs(g):.1%} {'above' if g > 0 else 'below'} the trace engine's "
               "(a fake-tensor run of the real PyTorch step).</p>")
    if e.memory.device_total is not None:
        gap += f"<p class='note'>{escape(held_sentence())}</p>"
    return (f"<section id='breakdown'><h2>Breakdown</h2><div class='row'><div>{mem}{gap}</div><div>{comp}</div></div>"
            f"{_notes(e.notes)}</section>")


def _try_trace(req: api.Request, want: bool | None) -> tuple[Estimate | None, str]:
    """(trace estimate or None, why not), resolved as `trainfit estimate --engine trace` resolves it (api.trace: the
    model's defaults, e.g. a sequence within its learned positions). want=None: draw it when the trace engine runs
    (torch installed, the setup traceable), else say why; want=True: its error is the report's."""
    if want is False:
        return None, "not requested (--no-trace)"
    spec = api.load_spec(req.model)
    try:
        # the whole model's curve when that is quick; deep models: a short trace extrapolated (curve labelled); an
        # image classifier is traced whole
        return api.trace(req, extrapolate=not isinstance(spec, VisionSpec) and spec.layers > 40), ""
    except TrainfitError as e:
        # the engine's refusals name estimate's --engine, which report has not
        why = str(e).replace("--engine analytic", "the analytic engine").replace("--engine trace", "the trace engine")
        if want and why != str(e):
            raise type(e)(f"--trace draws the trace engine's step: {why}; drop --trace (the page then shows the "
                          "analytic engine's memory at each phase)") from e
        if want:
            raise
        return None, why


def _timeline(e: Estimate, traced: Estimate | None, why: str, gpu) -> str:
    if traced is not None and traced.detail.records.get("timeline"):
        fig = plots.plot_timeline(traced, gpu=gpu)
        return ("<section id='timeline'><h2>Memory over the step</h2>"
                "<p class='note'>Traced: the real PyTorch step run on fake tensors; every storage's birth and death, "
                "stacked by category.</p>" + _svg(fig) + "</section>")
    fig = plots.plot_phases(e, gpu=gpu)
    return ("<section id='timeline'><h2>Memory at each phase of the step</h2>"
            f"<p class='note'>No traced timeline ({escape(why)}); the analytic engine's memory at each phase's "
            "high point is shown instead.</p>" + _svg(fig) + "</section>")


def _compare(req: api.Request, gpu) -> str:
    if req.mode != "train" or isinstance(api.load_spec(req.model), VisionSpec):
        return ""  # (an image classifier has no prefill and decode to compare its step with)
    results = api.compare(req)
    labels = list(results)
    ests = list(results.values())
    fields = ["weights", "gradients", "optimizer_states", "master_weights", "activations", "kv_cache", "temporaries", "peak"]
    rows, classes = [], []
    for fld in fields:
        vals = [getattr(x.memory, fld) for x in ests]
        if not any(vals):
            continue
        ref = vals[0]
        rows.append([fld.replace("_", " ")] + [fmt_bytes(v) + (f" <span class='muted'>({v / ref:.0%})</span>" if ref and i else "")
                                               for i, v in enumerate(vals)])
        classes.append("peak" if fld == "peak" else "")
    if any(x.time is not None for x in ests):  # (with a GPU) each one's time, as `trainfit compare` shows it
        cells = [time_cells(x) for x in ests]
        rows += [["time", *(c[0] for c in cells)], ["tokens/s", *(c[1] for c in cells)]]
        classes += ["", ""]
    line = compare_summary(ests)
    summary = f"<p>{escape(line[0].upper() + line[1:])}</p>"
    unused = [n for n in ests[1].notes if n.startswith(NOTE_START)]  # (every inference column carries it)
    summary += "".join(f"<p class='note'>{escape(n[0].upper() + n[1:])}.</p>" for n in unused)
    fig = plots.plot_compare(results, gpu=gpu)
    table = _table([""] + [escape(x) for x in labels], rows, row_classes=classes)
    return (f"<section id='compare'><h2>Training vs inference</h2>{summary}<div class='row even'><div>{_svg(fig)}</div>"
            f"<div>{table}<p class='note'>Inference: prefill of a batch of prompts of {ests[1].setup.seq} tokens and one decode step "
            "with a full KV cache; (%) = share of the training value.</p></div></div></section>")


def _sweep(req: api.Request, vary: tuple[str, str] | None, variants: dict[str, str] | None) -> tuple[str, SweepResult | None]:
    if req.mode == "serve" and vary is None:  # a serving engine has no batch: its capacity is in `serving`
        return "", None
    knob, values = vary or ("batch", "1:64")
    s = run_sweep(req, knob, values, variants)
    fig = plots.plot_sweep(s)
    lines = []
    if s.gpu is not None:
        for v in s.variants:
            where = s.fit_where(v)
            who = f"{escape(v)}: " if v else ""
            lines.append(f"{who}fits on {escape(s.gpu.name)} {escape(where)}" if where is not None
                         else f"{who}<span class='bad'>does not fit at any {escape(s.vary)} swept</span>")
    text = "<p>" + "<br>".join(lines) + "</p>" if lines else ""
    return (f"<section id='sweep'><h2>Sweep over {escape(s.vary)}</h2>{text}{_svg(fig)}{sweep_html_table(s)}"
            f"<p class='note'>{escape(s.caption)}</p></section>"), s


# ---- the plan (issue 5's planner; optional) -------------------------------------------------------------
def plan_candidates(req: api.Request, gpus: int, global_batch_tokens: float | None = None) -> tuple[list[dict], str]:
    """Top candidates from the planner (trainfit.plan, issue 5) in its --json shape, and a note.

    Imported lazily: the report works without the planner (the section then says why it is missing).
    """
    if req.gpu is None:
        return [], "the plan needs a GPU type: pass --gpu with --gpus"
    try:
        from .plan import plan_dict
        from ..plan.search import PlanQuery, search
    except ImportError as e:
        return [], f"the planner is not available in this build ({e})"
    kw = {"precisions": (req.precision,)} if req.precision else {}
    spec = api.load_spec(req.model)  # (a token model: build_report refuses --gpus for the others)
    q = PlanQuery(gpus=gpus, seq=req.setup(spec).seq, global_batch_tokens=global_batch_tokens, optimizer=req.optimizer,
                  top=5, stacks=(req.stack,), reserve=req.reserve, **kw)
    d = plan_dict(search(spec, api.gpu_of(req), q, tokens=req.tokens))
    note = (d.get("nothing_fits") or {}).get("message", "")
    return d.get("candidates", []), note


# the settings plan_candidates hands the planner (PlanQuery has no base setup: every other one is its default)
PLAN_READS = ("seq", "precision", "optimizer", "stack", "mode", "tokens", "reserve", *GPU_SETTINGS)


def plan_unused_note(req: api.Request) -> str:
    """The flags given away from their defaults that the plan section does not read (a setting the plan drops is
    named, never dropped silently); '' when there is none."""
    flags = [s.flag for s in SETTINGS if s.name not in PLAN_READS and getattr(req, s.name) != s.request_default]
    if not flags:
        return ""
    return ("The plan does not use " + ", ".join(flags) + ": the planner searches full training of the model at "
            "--seq, --precision, --optimizer and --stack, choosing the parallel layout, ZeRO, micro-batch, "
            "accumulation and recompute itself.")


def _plan(req: api.Request, gpus: int | None, global_batch_tokens: float | None = None) -> str:
    if not gpus:
        return ""
    cands, note = plan_candidates(req, gpus, global_batch_tokens)
    unused = plan_unused_note(req)
    unused = f"<p class='note'>{escape(unused)}</p>" if unused else ""
    if not cands:
        return (f"<section id='plan'><h2>Plan for {gpus} × {escape(req.gpu or 'GPU')}</h2>"
                f"<p class='note'>{escape(note or 'no configuration fits')}</p>{unused}</section>")
    keys = ("dp", "tp", "pp", "zero", "batch", "grad_accum", "recompute", "precision")
    rows = []
    for c in cands[:8]:
        s, m, t = c.get("setup", {}), c.get("memory", {}), c.get("time", {}) or {}
        rows.append([str(s.get(k, "")) for k in keys]
                    + [fmt_bytes(m["peak"]) if "peak" in m else "", fmt_seconds(t["step_seconds"]) if t.get("step_seconds") else "",
                       fmt_count(t["tokens_per_second"]) if t.get("tokens_per_second") else ""])
    table = _table([k.replace("_", "-") for k in keys] + ["peak", "step time", "tokens/s"], rows)
    return (f"<section id='plan'><h2>Plan for {gpus} × {escape(req.gpu or 'GPU')}</h2>"
            f"<p class='note'>Fastest configurations that fit, ranked by tokens/s (<code>"
            f"{escape(plan_command(req, gpus, global_batch_tokens))}</code> shows each time term and writes launch "
            f"configs).</p>{unused}{table}</section>")


def plan_command(req: api.Request, gpus: int, global_batch_tokens: float | None = None) -> str:
    """The `trainfit plan` command of the plan section: the settings plan_candidates hands the planner, each as plan's
    own flag where it is not the default."""
    import shlex

    from ..setup import BY_NAME

    def text(v) -> str:  # (a count as digits: 1e+06 is no number plan's parse_count reads)
        return str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)

    argv = ["trainfit", "plan", req.model, "--gpu", req.gpu, "--gpus", str(gpus)]
    if global_batch_tokens is not None:
        argv += ["--global-batch-tokens", text(global_batch_tokens)]
    for name in ("seq", "stack", "precision", "optimizer", "reserve", "tokens", *GPU_SETTINGS):
        value = getattr(req, name)
        if name not in ("gpu", "price") and value != BY_NAME[name].request_default:
            argv += [BY_NAME[name].flag, text(value)]
    return shlex.join(argv)


# ---- the page ------------------------------------------------------------------------------------------
def build_report(req: api.Request, gpus: int | None = None, trace: bool | None = None,
                 vary: tuple[str, str] | None = None, variants: dict[str, str] | None = None,
                 global_batch_tokens: float | None = None) -> str:
    """The whole report as one HTML string (raises TrainfitError for a bad model or setup)."""
    if gpus and isinstance(api.load_spec(req.model), VisionSpec):  # before any work
        raise TrainfitError(f"--gpus adds a plan of a transformer's parallel layouts; {req.model} is an image "
                            "classifier: leave out --gpus")
    e = api.analytic(req)
    if not gpus:  # (the plan reads --host-memory for the offloads it tries; the estimate and its advice, as estimate's)
        e = api.host_memory_noted(req, e)
    gpu = api.gpu_of(req)
    traced, why = _try_trace(req, trace)
    sweep_html, _ = _sweep(req, vary, variants)
    parts = [
        "<!DOCTYPE html>",
        "<html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width, initial-scale=1'>",
        f"<title>trainfit report — {escape(e.model)}</title>",
        f"<style>{CSS}</style></head><body><main>",
        f"<header><h1>{escape(e.model)} — will it {'train' if req.mode in ('train', 'rl') else 'serve'}?</h1>",
        f"<div class='setup'>{escape(setup_line(e))}</div></header>",
        _verdict(e),
        _would_fit(req, e),
        _breakdown(e, traced),
        time_section(e),
        _timeline(e, traced, why, gpu),
        _compare(req, gpu),
        sweep_html,
        _plan(req, gpus, global_batch_tokens),
        f"<footer>trainfit {escape(_version())} · generated {_dt.datetime.now().strftime('%Y-%m-%d %H:%M')} · "
        "all numbers per GPU, binary units (GiB = 2<sup>30</sup> bytes) · self-contained: open it anywhere, offline.</footer>",
        "</main></body></html>",
    ]
    return "\n".join(p for p in parts if p)


def write_report(req: api.Request, path: str | Path, **kw) -> Path:
    path = Path(path)
    if path.suffix.lower() not in (".html", ".htm"):
        raise TrainfitError(f"-o {path}: the report is an HTML file; end the name in .html")
    check_writable(path)  # before the report is built
    text = build_report(req, **kw)
    with writing(path):
        path.write_text(text, encoding="utf-8")
    return path
