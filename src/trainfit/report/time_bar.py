"""`trainfit report`'s "where the time goes": the step-time terms as one horizontal stacked bar (inline SVG, no
matplotlib), read generically from the step-time result so that new terms appear without code changes."""
from __future__ import annotations

from html import escape

from ..estimate import Estimate
from ..units import fmt_seconds
from .terminal import budget_line, step_term_rows
from .held import verdict_word

# seaborn "deep" (the palette report/plots.py uses), cycled over the terms in StepTime's order
PALETTE = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C", "#CCB974",
           "#64B5CD")
WIDTH, BAR_H, LEGEND_ROW = 760, 34, 20


def time_bar_svg(rows: list[tuple[str, float, float]]) -> str:
    """rows: (term, seconds, share of the step) — one <rect> per term, widths proportional to the share."""
    x, rects = 0.0, []
    for i, (name, secs, share) in enumerate(rows):
        w = share * WIDTH
        label = f"{name.replace('_', ' ')}: {fmt_seconds(secs)} ({share:.1%})"
        rects.append(f"<rect class='term' data-term='{escape(name)}' x='{x:.2f}' y='0' width='{w:.2f}' "
                     f"height='{BAR_H}' fill='{PALETTE[i % len(PALETTE)]}'><title>{escape(label)}</title></rect>")
        x += w
    legend = [f"<rect x='{(i % 3) * 250}' y='{BAR_H + 10 + (i // 3) * LEGEND_ROW}' width='12' height='12' "
              f"fill='{PALETTE[i % len(PALETTE)]}'/><text x='{(i % 3) * 250 + 18}' y='{BAR_H + 21 + (i // 3) * LEGEND_ROW}' "
              f"font-size='12'>{escape(name.replace('_', ' '))} {share:.1%}</text>"
              for i, (name, _, share) in enumerate(rows)]
    height = BAR_H + 16 + ((len(rows) + 2) // 3) * LEGEND_ROW
    return (f"<svg class='time-bar' viewBox='0 0 {WIDTH} {height}' "
            f"width='{WIDTH}' height='{height}' role='img' aria-label='where the time goes'>"
            + "".join(rects) + "".join(legend) + "</svg>")


def time_section(e: Estimate) -> str:
    """The section, or '' when the step has no terms (inference, --mfu, no GPU)."""
    rows = step_term_rows(e)
    if not rows:
        return ""
    t = e.time
    verdict = verdict_word(t, e.setup.mode) + ("" if t.fits else " (timed anyway)")
    extra = f" Budget on {t.train_tokens:,.0f} tokens: {budget_line(t)}." if t.train_seconds is not None else ""
    return (f"<section id='time'><h2>Where the time goes</h2><p class='note'>One optimizer step on {escape(t.gpu)}: "
            f"{fmt_seconds(t.step_seconds)} ({verdict}); each term of the step-time model, as a share of the step."
            f"{escape(extra)}</p><figure>{time_bar_svg(rows)}</figure></section>")
