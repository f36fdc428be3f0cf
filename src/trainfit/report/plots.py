"""Pictures of an Estimate: the memory timeline of a step, phase charts, sweeps (matplotlib, Agg backend).

Reports never compute: every function here draws numbers that an engine produced. The file format
follows the output path's extension (.png, .svg, .pdf). matplotlib is an optional dependency
(`pip install 'trainfit[viz]'`); importing this module without it raises a one-line TrainfitError.

Timeline format (the trace engine's `Estimate.detail.records["timeline"]`, see trace/analysis.py): a list of
points `{"event": int, "phase": str, "bytes": {category: int}}` in event order, one every few
allocation events plus one at each phase start. Categories and phases are trainfit.estimate's Category and
Phase values, as in every engine's Memory.
"""
from __future__ import annotations

import io
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from ..errors import EngineUnavailableError, TrainfitError
from ..estimate import Estimate
from ..units import GiB, KiB, MiB, TiB
from .output import check_writable, writing
from .held import DEVICE_TOTAL_LABEL, RESERVED_LABEL, held_sentence

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

    from ..hardware import GPU
    from .sweep import SweepResult


def _mpl():
    """matplotlib with the Agg backend, or a one-line error saying how to install it."""
    try:
        import matplotlib
    except ImportError as e:
        raise EngineUnavailableError("plots need matplotlib: pip install 'trainfit[viz]'") from e
    matplotlib.use("Agg", force=True)
    from matplotlib.figure import Figure

    return matplotlib, Figure


# ---- categories: every engine's names -> one display category ------------------------------------------
@dataclass(frozen=True)
class Category:
    key: str
    label: str
    color: str
    hatch: str | None = None


# Stack order, bottom to top: what is resident for the whole step first, then what the step makes.
CATEGORIES = (
    Category("params", "parameters", "#4C72B0"),
    Category("master", "fp32 master weights", "#64B5CD"),
    Category("opt", "optimizer state", "#DD8452"),
    Category("comm", "DDP gradient buckets", "#B07AA1"),
    Category("grads", "gradients", "#C44E52"),
    Category("acts", "activations", "#55A868"),
    Category("kv", "KV cache", "#DA8BC3"),
    Category("temps", "temporaries", "#9A9A9A"),
    Category("inputs", "inputs (batch)", "#CCB974"),
    Category("other", "other (gradients, activations, temporaries)", "#C8C8C8", "//"),
    Category("mixed", "activations + gradients (freed / built in backward)", "#A9CBA0", "//"),
)
_BY_KEY = {c.key: c for c in CATEGORIES}
CATEGORY_OF = {  # trainfit.estimate.Category -> display category (every engine reports the same names)
    "weights": "params", "buffers": "params", "master_weights": "master", "optimizer_states": "opt",
    "comm_buffers": "comm", "gradients": "grads", "activations": "acts", "temporaries": "temps", "inputs": "inputs",
    "kv_cache": "kv", "other": "other",
}
PHASE_LABELS = {"forward_end": "forward", "backward": "backward", "optimizer_step": "optimizer step",
                "prefill": "prefill", "decode": "decode", "setup": "setup"}
PHASE_SHADES = {"forward_end": "#EAF2FB", "backward": "#FBEFE6", "optimizer_step": "#F0EAF7",
                "prefill": "#EAF2FB", "decode": "#FBEFE6"}


def by_category(raw: dict[str, int]) -> dict[str, int]:
    """Engine category names -> display category keys (summed), zeros dropped, in stack order."""
    out: dict[str, int] = {}
    for k, v in raw.items():
        key = CATEGORY_OF.get(k, "other")
        out[key] = out.get(key, 0) + int(v)
    return {c.key: out[c.key] for c in CATEGORIES if out.get(c.key)}


def category_label(key: str) -> str:
    return _BY_KEY[key].label


# ---- units ---------------------------------------------------------------------------------------------
def byte_unit(largest: float) -> tuple[str, int]:
    """The unit for an axis whose largest value is `largest` (a unit is used from 2 of it: 1.5 TiB reads 1536 GiB)."""
    for name, size in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if largest >= 2 * size:
            return name, size
    return "B", 1


def _fmt(n: float, unit: tuple[str, int]) -> str:
    v = n / unit[1]
    return f"{v:,.1f} {unit[0]}" if v < 100 else f"{v:,.0f} {unit[0]}"


def _fmt_bytes(n: float) -> str:
    from ..units import fmt_bytes

    return fmt_bytes(n)


# ---- saving --------------------------------------------------------------------------------------------
FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf"}


def check_output(path: str | Path) -> str:
    """The image format of `path` (png, svg or pdf), or a one-line TrainfitError; commands call it before any
    engine runs, so that a bad -o costs nothing."""
    path = Path(path)
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise TrainfitError(f"-o {path}: cannot tell the image format; end the file name in .png, .svg or .pdf")
    check_writable(path)
    return fmt


def save(fig: "Figure", path: str | Path, dpi: int = 110) -> Path:
    """Write the figure in the format its extension names (.png, .svg or .pdf)."""
    path = Path(path)
    fmt = check_output(path)
    kw = {"metadata": {"Date": None}} if fmt == "svg" else {}
    with writing(path):
        fig.savefig(path, format=fmt, dpi=dpi, bbox_inches="tight", **kw)
    return path


def svg_text(fig: "Figure") -> str:
    """The figure as an inline <svg> element (no XML prolog, no metadata): for self-contained HTML."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    text = buf.getvalue()
    text = text[text.index("<svg"):]
    text = re.sub(r"<metadata>.*?</metadata>", "", text, flags=re.S)
    # xlink is only a namespace name, but keep every "http" out of the inline SVG: the namespaces are implied
    # inside HTML5, and the report's self-containment check then has nothing to explain.
    text = re.sub(r'\s+xmlns(:xlink)?="http://www\.w3\.org/[^"]*"', "", text)
    return text.strip()


def _figure(width: float, height: float, ncols: int = 1):
    matplotlib, Figure = _mpl()
    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(1, ncols) if ncols > 1 else fig.subplots()
    return fig, axes


def _caption(fig, text: str) -> None:
    """The caption under a figure, each line wrapped to about the figure's width: saved with bbox_inches='tight', one
    long line widened the image to its own length (a timeline's held-memory sentence: 2,878 px for a 1,210 px plot)."""
    import textwrap

    width = int(fig.get_figwidth() * 72 / (8 * 0.55))  # characters of 8 pt text across the figure (~0.55 em each)
    lines = [w for line in text.split("\n")
             for w in (textwrap.wrap(line, width, break_on_hyphens=False, break_long_words=False) or [""])]
    fig.text(0.0, -0.02, "\n".join(lines), fontsize=8, color="#555555", ha="left", va="top")


def _style(ax) -> None:
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.grid(axis="y", color="#E5E5E5", linewidth=0.8)
    ax.set_axisbelow(True)


def _capacity(ax, gpu: "GPU | None", unit, **kw) -> None:
    if gpu is None:
        return
    ax.axhline(gpu.memory / unit[1], color="#D62728", linestyle="--", linewidth=1.4, zorder=5,
               label=f"{gpu.name} memory ({_fmt_bytes(gpu.memory)})", **kw)


def setup_caption(e: Estimate) -> str:
    from .terminal import setup_line

    return setup_line(e)


# ---- timeline ------------------------------------------------------------------------------------------
@dataclass
class TimelineSeries:
    x: list[float]  # allocation order (remapped, see timeline_series)
    stacks: dict[str, list[int]]  # display category -> bytes at each x, stack order
    spans: list[tuple[str, float, float]]  # (phase, first x, last x) for each contiguous phase run
    totals: list[int]


def timeline_series(timeline: Iterable[dict], min_phase_share: float = 0.1) -> TimelineSeries:
    """Stacks by display category and phase spans. x is allocation order, remapped piecewise-linearly so
    that each phase run is at least `min_phase_share` of the width (the optimizer step of a foreach
    optimizer is a handful of events, which would otherwise be an invisible sliver at the end)."""
    points = list(timeline)
    if not points:
        raise TrainfitError("the estimate has no timeline to draw (only the trace engine records one)")
    x0 = points[0]["event"]
    ev = [p["event"] - x0 for p in points]
    cats = [by_category(p.get("bytes", {})) for p in points]
    keys = [c.key for c in CATEGORIES if any(k.get(c.key) for k in cats)]
    stacks = {k: [c.get(k, 0) for c in cats] for k in keys}
    runs: list[list] = []  # [phase, first event, last event, first index]
    for i, (x, p) in enumerate(zip(ev, points)):
        if runs and runs[-1][0] == p["phase"]:
            runs[-1][2] = x
        else:
            if runs:  # a phase runs until the next one starts
                runs[-1][2] = x
            runs.append([p["phase"], x, x, i])
    total = max(ev[-1], 1)
    widths = [max(b - a, min_phase_share * total) for _, a, b, _ in runs]
    scale = total / sum(widths)
    xs = [0.0] * len(ev)
    spans: list[tuple[str, float, float]] = []
    start = 0.0
    for j, (phase, a, b, first) in enumerate(runs):
        w = widths[j] * scale
        last = runs[j + 1][3] if j + 1 < len(runs) else len(ev)
        for i in range(first, last):
            xs[i] = start + ((ev[i] - a) / (b - a) * w if b > a else 0.0)
        spans.append((phase, start, start + w))
        start += w
    totals = [sum(c.values()) for c in cats]
    return TimelineSeries(xs, stacks, spans, totals)


def _peak_text(e: Estimate, unit) -> str:
    m = e.memory
    held = sorted(by_category(m.at_peak).items(), key=lambda kv: -kv[1])
    parts = [f"{category_label(k)} {_fmt(v, unit)}" for k, v in held[:4] if v]
    text = f"peak {_fmt(m.peak, unit)} in {PHASE_LABELS.get(m.peak_phase, m.peak_phase)}"
    if parts:
        text += "\nheld by: " + ", ".join(parts[:2]) + ("," if len(parts) > 2 else "")
        if len(parts) > 2:
            text += "\n" + ", ".join(parts[2:])
    top = e.detail.records.get("top_tensors", [])
    step_born = [t for t in top if t.get("born") not in (None, "setup")]
    if step_born:
        t = step_born[0]
        text += f"\nlargest made by the step: {t.get('module') or '?'} ({t.get('category')}, {_fmt_bytes(t['bytes'])})"
    return text


def plot_timeline(e: Estimate, path: str | Path | None = None, gpu: "GPU | None" = None,
                  measured: Estimate | None = None, title: str | None = None) -> "Figure":
    """Memory over the step, stacked by category, phases shaded, the peak annotated; the GPU's capacity as a
    line when `gpu` is given; `measured` (a measure-engine Estimate) overlaid as its peak and per-phase peaks.

    NB: the measure engine records peaks per phase, not a curve, so the overlay is a step line per phase.
    """
    tl = e.detail.records.get("timeline")
    if not tl:
        raise TrainfitError(f"the {e.engine} estimate has no timeline; the trace engine records one "
                            "(trainfit timeline runs it)")
    s = timeline_series(tl)
    held = [v for v in (e.memory.reserved, e.memory.device_total) if v is not None]
    top = max([e.memory.peak, max(s.totals)] + held + ([measured.memory.peak] if measured else []))
    unit = byte_unit(top)
    fig, ax = _figure(11, 5.6)
    _style(ax)
    xmax = max(s.spans[-1][2], 1)
    for phase, a, b in s.spans:
        ax.axvspan(a, b, color=PHASE_SHADES.get(phase, "#F4F4F4"), zorder=0, linewidth=0)
        ax.axvline(a, color="#B0B0B0", linewidth=0.8, zorder=1)
    ys = [[v / unit[1] for v in s.stacks[k]] for k in s.stacks]
    ax.stackplot(s.x, ys, labels=[category_label(k) for k in s.stacks],
                 colors=[_BY_KEY[k].color for k in s.stacks], linewidth=0, zorder=2, alpha=0.95)
    ax.plot(s.x, [t / unit[1] for t in s.totals], color="#333333", linewidth=0.8, zorder=3)
    # phase names along the top, inside the axes
    seen: dict[str, int] = {}
    many = {p: sum(1 for q, _, _ in s.spans if q == p) for p, _, _ in s.spans}
    for phase, a, b in s.spans:
        seen[phase] = seen.get(phase, 0) + 1
        label = PHASE_LABELS.get(phase, phase) + (f" {seen[phase]}" if many[phase] > 1 else "")
        if (b - a) / xmax > 0.04:
            ax.text((a + b) / 2, 1.0, label, transform=ax.get_xaxis_transform(), ha="center", va="bottom",
                    fontsize=9, color="#555555")
    # peak: the timeline is sampled, so the highest sampled point in the peak's phase stands for it
    in_phase = [i for i, p in enumerate(tl) if p["phase"] == e.memory.peak_phase] or list(range(len(tl)))
    i = max(in_phase, key=s.totals.__getitem__)
    px, py = s.x[i], e.memory.peak / unit[1]
    ax.plot([px], [py], marker="v", color="black", markersize=8, zorder=6)
    ax.annotate(_peak_text(e, unit), xy=(px, py), xytext=(0.02, 0.97), textcoords="axes fraction",
                ha="left", va="top", fontsize=9, zorder=7,
                bbox={"boxstyle": "round,pad=0.4", "fc": "white", "ec": "#999999", "alpha": 0.95},
                arrowprops={"arrowstyle": "->", "color": "#444444", "linewidth": 0.9})
    _capacity(ax, gpu, unit)
    _held_lines(ax, e, unit)
    if measured is not None:
        _overlay_measured(ax, s, measured, unit)
    ax.set_xlim(0, xmax)
    ymax = max(top, gpu.memory if gpu else 0) / unit[1]
    ax.set_ylim(0, ymax * 1.32)
    ax.set_ylabel(f"live memory per GPU ({unit[0]})")
    ax.set_xticks([])
    ax.set_xlabel("step progress → (allocation order; short phases drawn wider)")
    what = "training step" if e.setup.mode == "train" else "inference (prefill, then one decode step)"
    ax.set_title(title or f"{e.model} — {what}, memory timeline ({e.engine} engine)", loc="left", fontsize=12,
                 pad=18)
    caption = setup_caption(e)
    if e.memory.reserved is not None and e.memory.reserved != e.memory.peak:
        caption += "\n" + held_sentence("The curve", device_total=e.memory.device_total is not None)
    layers = e.detail.records.get("timeline_layers")
    if layers:
        caption += (f"\nNB: curve from a {layers}-layer trace (the peak in the box is extrapolated to the full "
                    "model); `trainfit timeline` without --fast draws the whole model's curve")
    _caption(fig, caption)
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles[::-1], labels[::-1], loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8.5,
              frameon=False)
    if path is not None:
        save(fig, path)
    return fig


def _held_lines(ax, e: Estimate, unit) -> None:
    """The step's reserved memory (the caching allocator's high-water) and device total, as dashed levels."""
    m = e.memory
    for value, label, color in ((m.reserved, RESERVED_LABEL, "#7A4EAB"), (m.device_total, DEVICE_TOTAL_LABEL, "#222222")):
        if value is not None and (value != m.peak or label == DEVICE_TOTAL_LABEL):
            ax.axhline(value / unit[1], color=color, linestyle="--", linewidth=1.1, zorder=5,
                       label=f"{label} {_fmt(value, unit)}")


def _overlay_measured(ax, s: TimelineSeries, measured: Estimate, unit) -> None:
    m = measured.memory
    ax.axhline(m.peak / unit[1], color="black", linestyle=":", linewidth=1.6, zorder=5,
               label=f"measured peak ({_fmt(m.peak, unit)})")
    first = True
    for phase, a, b in s.spans:
        v = m.phases.get(phase)
        if v is None:
            continue
        ax.hlines(v / unit[1], a, b, colors="black", linewidth=2.2, zorder=5,
                  label="measured peak of each phase" if first else None)
        first = False


# ---- phase chart (no trace: the analytic engine's phases) ----------------------------------------------
def phase_breakdown(e: Estimate) -> list[tuple[str, dict[str, int]]]:
    """Per phase, bytes by display category, from what an Estimate states.

    The peak phase uses Memory.at_peak exactly. Other phases show the resident states exactly (weights,
    master, optimizer, DDP buckets) and split the rest only as far as the Estimate says it: activations at
    forward end, gradients at the optimizer step; the remainder is drawn hatched.
    """
    m = e.memory
    at = by_category(m.at_peak)
    resident = {k: at[k] for k in ("params", "master", "opt", "comm") if at.get(k)}
    if not resident:
        resident = by_category({"weights": m.weights, "master_weights": m.master_weights,
                                "optimizer_states": m.optimizer_states})
    out = []
    for phase, total in m.phases.items():
        if phase == m.peak_phase and sum(at.values()) == total:
            out.append((phase, dict(at)))
            continue
        cats = dict(resident)
        rest = total - sum(cats.values())
        if e.setup.mode == "infer":
            if m.kv_cache and rest > 0:
                cats["kv"] = min(m.kv_cache, rest)
                rest -= cats["kv"]
            key = "temps"
        elif phase == "forward_end":
            cats["acts"] = max(0, min(m.activations, rest))
            rest -= cats["acts"]
            key = "other"
        elif phase == "optimizer_step":
            cats["grads"] = max(0, min(m.gradients, rest))
            rest -= cats["grads"]
            key = "temps"
        else:
            key = "mixed"
        if rest > 0:
            cats[key] = cats.get(key, 0) + rest
        out.append((phase, {c.key: cats[c.key] for c in CATEGORIES if cats.get(c.key)}))
    return out


def plot_stacked_bars(items: list[tuple[str, dict[str, int]]], path: str | Path | None = None,
                      gpu: "GPU | None" = None, title: str = "", caption: str = "",
                      mark: int | None = None, ratios_to: int | None = None) -> "Figure":
    """Vertical bars stacked by display category (keys of CATEGORIES), one per (label, bytes by category).
    `mark`: index of the bar to label as the peak; `ratios_to`: label each bar with its ratio to that bar."""
    totals = [sum(c.values()) for _, c in items]
    unit = byte_unit(max(totals + [gpu.memory if gpu else 0]))
    fig, ax = _figure(1.5 * len(items) + 4.5, 4.6)
    _style(ax)
    xs = list(range(len(items)))
    bottoms = [0.0] * len(items)
    for c in CATEGORIES:
        vals = [cats.get(c.key, 0) / unit[1] for _, cats in items]
        if not any(vals):
            continue
        ax.bar(xs, vals, bottom=bottoms, width=0.6, color=c.color, label=c.label, hatch=c.hatch,
               edgecolor="white" if not c.hatch else "#888888", linewidth=0.6, zorder=2)
        bottoms = [b + v for b, v in zip(bottoms, vals)]
    for i, t in enumerate(totals):
        text = _fmt(t, unit)
        if ratios_to is not None and i != ratios_to and totals[ratios_to]:
            text += f"\n({t / totals[ratios_to]:.0%})"
        if mark == i:
            text = "peak " + text
        ax.text(i, t / unit[1], text, ha="center", va="bottom", fontsize=9,
                fontweight="bold" if mark == i else "normal")
    _capacity(ax, gpu, unit)
    ax.set_xticks(xs, [label for label, _ in items])
    ax.set_xlim(-0.6, len(items) - 0.4)
    ax.set_ylim(0, max(totals + [gpu.memory if gpu else 0]) / unit[1] * 1.2)
    ax.set_ylabel(f"memory per GPU ({unit[0]})")
    if title:
        ax.set_title(title, loc="left", fontsize=12)
    if caption:
        _caption(fig, caption)
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles[::-1], labels[::-1], loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    if path is not None:
        save(fig, path)
    return fig


def plot_phases(e: Estimate, path: str | Path | None = None, gpu: "GPU | None" = None) -> "Figure":
    """The analytic stand-in for a timeline: memory at each phase's high point, stacked by category."""
    items = phase_breakdown(e)
    mark = [p for p, _ in items].index(e.memory.peak_phase) if e.memory.peak_phase in e.memory.phases else None
    what = "training step" if e.setup.mode == "train" else "inference"
    caption = setup_caption(e)
    if any("mixed" in c or "other" in c for _, c in items):
        caption += "\nhatched: bytes the estimate does not split by category at that phase (only the peak is split)"
    return plot_stacked_bars([(PHASE_LABELS.get(p, p), c) for p, c in items], path, gpu,
                             title=f"{e.model} — {what}, memory at each phase ({e.engine} engine)",
                             caption=caption, mark=mark)


def plot_compare(results: dict[str, Estimate], path: str | Path | None = None, gpu: "GPU | None" = None) -> "Figure":
    """Training vs inference (api.compare's dict): each one's peak, stacked by what holds it."""
    items = [(label.replace(" (", "\n("), by_category(e.memory.at_peak) or {"other": e.memory.peak})
             for label, e in results.items()]
    first = next(iter(results.values()))
    return plot_stacked_bars(items, path, gpu, title=f"{first.model} — training vs inference, peak per GPU",
                             caption="(%) = share of the training peak", mark=None, ratios_to=0)


# ---- sweeps --------------------------------------------------------------------------------------------
def plot_sweep(sweep: "SweepResult", path: str | Path | None = None) -> "Figure":
    """Peak memory and step time (or FLOPs per step when no GPU is given) against the varied knob, one line
    per variant; points that do not fit the GPU are drawn as red crosses, the capacity as a line."""
    gpu = sweep.gpu
    numeric = sweep.numeric
    rows = [r for r in sweep.rows if r.get("error") is None]
    if not rows:
        raise TrainfitError("nothing to plot: every point of the sweep was an invalid setup")
    unit = byte_unit(max([r["peak"] for r in rows] + [gpu.memory if gpu else 0]))
    fig, (ax_m, ax_t) = _figure(12, 4.8, ncols=2)
    for ax in (ax_m, ax_t):
        _style(ax)
    positions = {v: (v if numeric else i) for i, v in enumerate(sweep.values)}
    timed = gpu is not None
    time_key, time_label = ("step_seconds", f"{sweep.time_name} (s)") if timed else ("flops_step",
                                                                                     "FLOPs per step (hardware)")
    markers = "osD^vP*X"
    for j, variant in enumerate(sweep.variants):
        pts = [r for r in rows if r["variant"] == variant]
        if not pts:
            continue
        xs = [positions[r["value"]] for r in pts]
        color = f"C{j % 10}"
        label = variant or "peak"
        ax_m.plot(xs, [r["peak"] / unit[1] for r in pts], marker=markers[j % len(markers)], color=color,
                  label=label, zorder=3)
        ax_t.plot(xs, [r[time_key] for r in pts], marker=markers[j % len(markers)], color=color,
                  label=label, zorder=3)
        if gpu is not None:
            bad = [(positions[r["value"]], r) for r in pts if not r["fits"]]
            if bad:
                ax_m.scatter([x for x, _ in bad], [r["peak"] / unit[1] for _, r in bad], marker="x", s=70,
                             color="#D62728", zorder=4, linewidths=2,
                             label="does not fit" if j == 0 or not _has_label(ax_m, "does not fit") else None)
                fit = sweep.fit_where(variant)  # (the words the table and the report print)
                where = f"fits {fit}" if fit is not None else "never fits"
                x, r = bad[0]
                ax_m.annotate(f"{variant + ': ' if variant else ''}{where}", xy=(x, r["peak"] / unit[1]),
                              xytext=(6, -14 - 12 * j), textcoords="offset points", fontsize=8.5, color=color)
    _capacity(ax_m, gpu, unit)
    for ax in (ax_m, ax_t):
        ax.set_xlabel(sweep.axis_label)
        if numeric:
            if sweep.log_x:
                ax.set_xscale("log", base=2)
            ax.set_xticks(list(sweep.values), [str(v) for v in sweep.values])
            ax.minorticks_off()
        else:
            ax.set_xticks(list(range(len(sweep.values))), [str(v) for v in sweep.values])
    ax_m.set_ylabel(f"peak memory per GPU ({unit[0]})")
    ax_m.set_ylim(bottom=0)
    ax_t.set_ylabel(time_label)
    if not timed:
        from matplotlib.ticker import EngFormatter

        ax_t.yaxis.set_major_formatter(EngFormatter(unit="FLOP"))
    ax_t.set_ylim(bottom=0)
    if sweep.log_y:
        ax_m.set_yscale("log")
        ax_t.set_yscale("log")
    ax_m.set_title(f"{sweep.model} — peak memory vs {sweep.vary}", loc="left", fontsize=11)
    ax_t.set_title((sweep.time_name if timed else "compute") + f" vs {sweep.vary}"
                   + (f" on {gpu.name} " + (f"(MFU {sweep.mfu:.0%})" if sweep.mfu else "(step-time model)") if timed else " (pass --gpu for step time)"),
                   loc="left", fontsize=11)
    ax_m.legend(fontsize=8.5, loc="upper left")
    if len(sweep.variants) > 1:
        ax_t.legend(fontsize=8.5, loc="upper left")
    _caption(fig, sweep.caption)
    if path is not None:
        save(fig, path)
    return fig


def _has_label(ax, label: str) -> bool:
    return label in ax.get_legend_handles_labels()[1]
