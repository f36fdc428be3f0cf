"""Sweeps: one knob varied over a range, one line per variant (e.g. --attention eager,flash).

`run_sweep` asks the analytic engine (api.analytic) for every point; the table, the JSON and the plot
(plots.plot_sweep) only format what it returned. A point whose setup is impossible (say --tp 3 for 32
heads) is kept as a row with its error, so a sweep over tp or zero shows which values are valid.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from .. import api
from ..errors import SetupError, TrainfitError
from ..estimate import Estimate
from ..setup import BY_NAME, check_value, refuse_written

# knob -> (Request field, numeric?, axis label)
KNOBS = {
    "batch": ("batch", True, "micro-batch per GPU (sequences)"),
    "seq": ("seq", True, "sequence length (tokens)"),
    "grad-accum": ("grad_accum", True, "gradient-accumulation micro-batches"),
    "dp": ("dp", True, "data-parallel GPUs"),
    "gpus": ("dp", True, "GPUs (data parallel)"),
    "tp": ("tp", True, "tensor-parallel degree"),
    "pp": ("pp", True, "pipeline-parallel degree"),
    "zero": ("zero", True, "ZeRO stage"),
    "recompute": ("recompute", False, "activation recomputation"),
    "attention": ("attention", False, "attention kernel"),
    "precision": ("precision", False, "precision policy"),
    "optimizer": ("optimizer", False, "optimizer"),
}
VARIANT_KNOBS = ("attention", "recompute", "precision", "optimizer")
MAX_POINTS = 64
MAX_VARIANTS = 12


def parse_values(knob: str, text: str) -> list:
    """'512:16384' -> 512, 1024, ..., 16384 (doubling; for zero, consecutive stages); '1,4,16' -> a list;
    categorical knobs take comma lists ('none,selective,full')."""
    if knob not in KNOBS:
        raise SetupError(f"--vary {knob!r} is not a knob to sweep; choose one of: {', '.join(KNOBS)}")
    _, numeric, _ = KNOBS[knob]
    text = text.strip()
    if not text:
        raise SetupError(f"--vary {knob} needs values: a range like 1:64 or a comma list like 1,2,4")
    if not numeric:
        if ":" in text:
            raise SetupError(f"--vary {knob} takes a comma list (e.g. none,selective,full), not a range")
        return _unique([v.strip() for v in text.split(",") if v.strip()])
    try:
        if ":" in text:
            a, _, b = text.partition(":")
            lo, hi = int(a), int(b)
            if hi < lo:
                raise SetupError(f"--vary {knob} {text}: the range must go up (low:high)")
            if knob == "zero":
                values = list(range(lo, hi + 1))
            else:
                if lo <= 0:
                    raise SetupError(f"--vary {knob} {text}: a doubling range must start at 1 or more")
                values, v = [], lo
                while v <= hi and len(values) <= MAX_POINTS:
                    values.append(v)
                    v *= 2
                if values[-1] != hi:
                    values.append(hi)  # always include the upper end the user asked for
        else:
            values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SetupError(f"--vary {knob} {text!r}: give whole numbers as low:high (doubling) or a comma list") from None
    if len(values) > MAX_POINTS:
        raise SetupError(f"--vary {knob} {text}: {len(values)} points is too many (at most {MAX_POINTS})")
    return sorted(_unique(values))


def _unique(values: list) -> list:
    seen, out = set(), []
    for v in values:
        if v not in seen:
            seen.add(v)
            out.append(v)
    return out


def split_list(text: str | None) -> list[str]:
    """A comma list's values, each once, in order ('bf16,,' is bf16; 'none,full,none' is none, full)."""
    return _unique([v.strip() for v in text.split(",") if v.strip()]) if text else []


@dataclass
class SweepResult:
    model: str
    vary: str
    values: list
    variants: list[str]  # labels ("" when there is a single variant)
    rows: list[dict]
    gpu: object | None  # hardware.GPU
    mfu: float
    base: dict  # the Request's fields (the setup held fixed)
    notes: list[str] = field(default_factory=list)
    resolved: dict = field(default_factory=dict)  # the settings the request leaves to defaults, as a point's setup has them

    @property
    def numeric(self) -> bool:
        return KNOBS[self.vary][1]

    @property
    def axis_label(self) -> str:
        return KNOBS[self.vary][2]

    @property
    def time_name(self) -> str:
        """What the rows' step_seconds times: an inference's prefill (Timing.step_seconds is its prefill_seconds;
        estimate's table calls it prefill time), else the step."""
        return "prefill time" if self.base.get("mode") == "infer" else "step time"

    @property
    def log_x(self) -> bool:
        vals = [v for v in self.values if isinstance(v, int) and v > 0]
        return self.numeric and self.vary != "zero" and len(vals) == len(self.values) and max(vals) / min(vals) >= 8

    @property
    def log_y(self) -> bool:
        peaks = [r["peak"] for r in self.rows if r.get("error") is None and r["peak"] > 0]
        return bool(peaks) and max(peaks) / min(peaks) > 200

    @property
    def caption(self) -> str:
        b = self.base
        mode = b.get("mode") or "train"
        fixed = {k: b[k] for k in ("batch", "seq", "grad_accum", "precision", "optimizer", "recompute", "attention",
                                   "dp", "tp", "pp", "zero", "mode", "device")
                 if k != KNOBS[self.vary][0] and not (k in _variant_fields(self) and len(self.variants) > 1)
                 and mode in BY_NAME[k].meta.modes}  # (the settings the mode reads: no optimizer in inference)
        shown = {k: v if v is not None else self.resolved.get(k, "default") for k, v in fixed.items()}
        text = "fixed: " + ", ".join(f"{k.replace('_', '-')} {v}" for k, v in shown.items())
        text += " · analytic engine, per GPU"
        return "\n".join([text, *self.notes])

    def fits_up_to(self, variant: str):
        """The largest swept value that still fits the GPU, per variant (None: none fits / no GPU)."""
        ok = [r["value"] for r in self.rows if r["variant"] == variant and r.get("error") is None and r["fits"]]
        return ok[-1] if ok else None

    def fit_where(self, variant: str) -> str | None:
        """Where `variant` fits on the GPU (a sweep with --gpu), from its valid rows' verdicts, as the words after
        "fits" that the table, the report and the plot print (None: no value fits). "up to" only where the values
        that fit are the lowest swept, "from" where they are the highest (more GPUs, a higher ZeRO stage), else the
        values themselves."""
        mine = [r for r in self.rows if r["variant"] == variant]
        rows = [r for r in mine if r.get("error") is None]  # (an invalid value is n/a: neither fits nor not)
        ok = [r["value"] for r in rows if r["fits"]]
        fits = [bool(r["fits"]) for r in rows]
        if not ok:
            return None
        if len(ok) == len(mine):
            return f"at every {self.vary} swept"
        if self.numeric and fits == sorted(fits, reverse=True):
            return f"up to {self.vary} {ok[-1]}"
        if self.numeric and fits == sorted(fits):
            return f"from {self.vary} {ok[0]} on"
        return f"at {self.vary} {', '.join(map(str, ok))} only"

    def to_dict(self) -> dict:
        return {"model": self.model, "vary": self.vary, "values": self.values, "variants": self.variants,
                "gpu": self.gpu.name if self.gpu is not None else None, "mfu": self.mfu, "engine": "analytic",
                "setup": self.base, "rows": self.rows, "notes": self.notes,
                # fits_up_to: the largest swept value that fits, whatever fits below it; fit_where: the words the
                # table prints ("up to batch 4", "from gpus 16 on", "at tp 2, 8 only"), None where none fits
                **({"fits_up_to": {v: self.fits_up_to(v) for v in self.variants},
                    "fit_where": {v: self.fit_where(v) for v in self.variants}} if self.gpu is not None else {})}


def _variant_fields(s: SweepResult) -> set[str]:
    return {k for k in VARIANT_KNOBS if len(split_list(str(s.base.get(k) or ""))) > 1}


def _row(variant: str, value, e: Estimate | None, error: str | None) -> dict:
    if e is None:
        return {"variant": variant, "value": value, "error": error}
    m, t = e.memory, e.time
    row = {"variant": variant, "value": value, "error": None, "peak": m.peak, "peak_phase": m.peak_phase,
           "weights": m.weights, "gradients": m.gradients, "optimizer_states": m.optimizer_states,
           "master_weights": m.master_weights, "activations": m.activations, "temporaries": m.temporaries,
           "kv_cache": m.kv_cache, "flops_step": e.flops.step, "reserved": m.reserved, "device_total": m.device_total,
           "required": m.required, "fits": None, "headroom": None, "step_seconds": None, "tokens_per_second": None}
    if t is not None:
        row.update(fits=t.fits, headroom=t.headroom, step_seconds=t.step_seconds, tokens_per_second=t.tokens_per_second)
    return row


def run_sweep(req: api.Request, vary: str, values: str | list, variants: dict[str, str] | None = None) -> SweepResult:
    """Estimate `req` with `vary` set to each value, for each combination of the variant lists.

    variants: {"attention": "eager,flash", ...}; a knob with one value is simply part of the setup.
    """
    if req.mode == "serve":
        raise SetupError("a sweep varies a training or inference step; a serving engine's capacity is one estimate: "
                         "trainfit estimate --mode serve, or trainfit plan --mode serve to compare GPUs and TP")
    vals = parse_values(vary, values) if isinstance(values, str) else list(values)
    field_name = KNOBS[vary][0]
    others = {f"--{k}": getattr(req, k) for k in ("tp", "pp", "cp") if getattr(req, k) > 1}
    if vary == "gpus" and others:  # (GPUs = dp × tp × pp × cp: Setup.world_size)
        given = " ".join(f"{k} {v}" for k, v in others.items())
        raise SetupError(f"--vary gpus sets the data-parallel degree as the GPU count; with {given} each point runs "
                         f"{math.prod(others.values())}x as many GPUs: use --vary dp (its axis is dp)")
    refuse_written(frozenset({field_name}), req.mode)  # a knob the mode does not read would sweep nothing
    for v in vals:  # the setting's own definition: a value it refuses is one line, not a row of n/a
        check_value(BY_NAME[field_name], v, req.mode)
    lists = {k: split_list(v) for k, v in (variants or {}).items() if v}
    for k in lists:
        if not lists[k]:
            raise SetupError(f"--{k.replace('_', '-')} {variants[k]!r} names no value: give one, or a comma list")
        if k not in VARIANT_KNOBS:
            raise SetupError(f"variants can be given for {', '.join(VARIANT_KNOBS)}, not {k!r}")
        if KNOBS.get(k, (None,))[0] == field_name:
            raise SetupError(f"--vary {vary} and --{k} {variants[k]} name the same knob; give the values to --vary only")
    combos: list[dict] = [{}]
    for k, vs in lists.items():
        combos = [{**c, k: v} for c in combos for v in vs]
    if len(combos) > MAX_VARIANTS:
        raise SetupError(f"{len(combos)} variants is too many to draw (at most {MAX_VARIANTS}); give fewer values")
    multi = [k for k, vs in lists.items() if len(vs) > 1]
    labels = [" ".join(f"{k} {c[k]}" if len(multi) > 1 else str(c[k]) for k in multi) for c in combos]
    base = dataclasses.asdict(req) | {k: ",".join(vs) for k, vs in lists.items()}  # (as split: no empty or twice)
    notes: list[str] = []
    rows: list[dict] = []
    host_read = False  # whether a point's estimate reads --host-memory
    first = None  # the first point's estimate
    gpu = api.gpu_of(req)
    spec = api.load_spec(req.model)  # an unknown model is one error, not one per row
    for combo, label in zip(combos, labels):
        for v in vals:
            changes = {**combo, field_name: v}
            if field_name == "dp" and v == 1 and req.zero:
                changes["zero"] = 0  # ZeRO shards over dp ranks: with one GPU there is nothing to shard
                note = "at 1 GPU ZeRO is off (nothing to shard)"
                if note not in notes:
                    notes.append(note)
            try:
                point = dataclasses.replace(req, **changes)
                e = api.analytic(point)
                first = first or e
                rows.append(_row(label, v, e, None))
                # (a sweep shows no advice: a point that does not fit reads --host-memory no more than one that does)
                host_read = host_read or not api.host_memory_unread(point, e, advised=False)
            except TrainfitError as err:
                rows.append(_row(label, v, None, str(err)))
    valid = [r for r in rows if r["error"] is None]
    if not valid:
        raise SetupError(f"no point of the sweep is a valid setup: {rows[0]['error']}")
    # the defaults as the estimates resolved them (the model's sequence length, the stack's precision), for the caption
    resolved = {k: getattr(first.setup, k) for k in base if base[k] is None and hasattr(first.setup, k)}
    if req.host_memory is not None and not host_read:  # named, not ignored (api.HOST_MEMORY_UNREAD's rule)
        notes.append(api.HOST_MEMORY_UNREAD_SWEEP)
    for label in labels:  # a variant invalid at every point is a bad variant value (say --attention eager,magic)
        mine = [r for r in rows if r["variant"] == label]
        if all(r["error"] is not None for r in mine):
            raise SetupError(f"variant {label!r} is not valid at any point of the sweep ({mine[0]['error']}); drop it")
    return SweepResult(model=spec.name, vary=vary, values=vals, variants=labels,
                       rows=rows, gpu=gpu, mfu=req.mfu, base=base, notes=notes, resolved=resolved)


def render_table(s: SweepResult, console=None) -> None:
    """The sweep as a rich table: one row per value, per variant its peak (and step time, fit with --gpu). Variants
    side by side where the console is wide enough, else one table per variant: rich shrinks a wide table's
    columns until each cell reads '6…' (at 80 columns, 4 variants of 4 columns)."""
    from rich.table import Table

    from .console import PIPED_WIDTH, console as stdout_console

    from ..units import fmt_bytes, fmt_count, fmt_seconds

    console = console or stdout_console()
    timed = s.gpu is not None
    by = {(r["variant"], r["value"]): r for r in s.rows}

    def table(variants: list, title: str, named: bool) -> Table:
        t = Table(title=title, header_style="bold")
        t.add_column(s.vary, justify="right", style="cyan")
        for v in variants:
            prefix = f"{v} " if v and named else ""
            t.add_column(f"{prefix}peak", justify="right")
            t.add_column(f"{prefix}{s.time_name}" if timed else f"{prefix}FLOPs/step", justify="right")
            if timed:  # the fit is judged on required (analytic/fit_rule.py), shown beside it
                t.add_column(f"{prefix}required", justify="right")
                t.add_column(f"{prefix}fits {s.gpu.name}", justify="center")
        for value in s.values:
            cells = [str(value)]
            for v in variants:
                r = by[(v, value)]
                if r["error"] is not None:
                    cells += ["[dim]n/a[/dim]", "[dim]invalid[/dim]"] + (["", ""] if timed else [])
                    continue
                cells.append(fmt_bytes(r["peak"]))
                cells.append(fmt_seconds(r["step_seconds"]) if timed else fmt_count(r["flops_step"]))
                if timed:
                    cells.append(fmt_bytes(r["required"]) if r["required"] is not None else "")
                    cells.append("[green]yes[/green]" if r["fits"] else "[red]no[/red]")
            t.add_row(*cells)
        return t

    title = f"{s.model} — sweep over {s.vary} (analytic, per GPU)"
    t = table(s.variants, title, named=True)
    # (the narrowest it goes without cutting a word, measured unclamped: wider than the console, rich crops cells)
    narrowest = console.measure(t, options=console.options.update_width(PIPED_WIDTH * 10)).minimum
    if len(s.variants) > 1 and narrowest > console.width:
        for v in s.variants:
            console.print(table([v], f"{title}: {v}", named=False))
    else:
        console.print(t)
    # (under the tables at the console's width: as a table caption it wrapped to a narrow table's, a word a line)
    console.print(f"[dim]{s.caption}[/dim]")
    errors = {r["error"] for r in s.rows if r["error"]}
    for err in sorted(errors):
        console.print(f"[dim]· n/a: {err}[/dim]")
    if timed:
        for v in s.variants:
            where = s.fit_where(v)
            who = f"{v}: " if v else ""
            console.print(f"{who}fits on {s.gpu.name} {where}" if where else
                          f"{who}[red]does not fit on {s.gpu.name} at any {s.vary} swept[/red]")


def sweep_html_table(s: SweepResult) -> str:
    """The same table as HTML (for the report)."""
    from html import escape

    from ..units import fmt_bytes, fmt_count, fmt_seconds

    timed = s.gpu is not None
    head = [escape(s.vary)]
    for v in s.variants:
        p = f"{v} " if v else ""
        head += [f"{p}peak", f"{p}{s.time_name}" if timed else f"{p}FLOPs/step"]
        head += [f"{p}required", f"{p}fits"] if timed else []
    by = {(r["variant"], r["value"]): r for r in s.rows}
    lines = ["<table class='num'><thead><tr>" + "".join(f"<th>{escape(h)}</th>" for h in head) + "</tr></thead><tbody>"]
    for value in s.values:
        cells = [str(value)]
        for v in s.variants:
            r = by[(v, value)]
            if r["error"] is not None:
                cells += [f"<span title='{escape(r['error'])}'>n/a</span>", ""] + (["", ""] if timed else [])
                continue
            cells += [fmt_bytes(r["peak"]), fmt_seconds(r["step_seconds"]) if timed else fmt_count(r["flops_step"])]
            if timed:
                cells.append(fmt_bytes(r["required"]) if r["required"] is not None else "")
                cells.append("<span class='ok'>yes</span>" if r["fits"] else "<span class='bad'>no</span>")
        lines.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    lines.append("</tbody></table>")
    return "\n".join(lines)
