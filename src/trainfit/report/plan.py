"""The plan as JSON (issue 5's contract) and as a terminal table. Reports never compute: numbers come from the
search result."""
from __future__ import annotations

from dataclasses import asdict

from .json_out import dumps  # noqa: F401  (re-exported for the command)
from ..analytic.terms import time_terms
from ..units import fmt_bytes, fmt_count, fmt_energy, fmt_seconds
from ..plan import knobs
from ..plan.search import DEFAULT_STACKS, Candidate, PlanResult, timed_settings
from ..plan.space import SEARCHED, TIMED
from ..setup.settings import BY_NAME

AXES = {a.name: a for a in SEARCHED + TIMED}  # (the searched settings' values as the table lists them)


def layout_text(s) -> str:
    """dp×tp×pp, then the extra axes where set: sequence parallelism (every tp > 1 plan's: a row copied into
    `estimate` needs --sequence-parallel too), cp, virtual stages, the uneven split, ep, etp."""
    out = f"{s.dp}×{s.tp}×{s.pp}"
    extra = ["sp" if s.sequence_parallel and s.tp > 1 else "", f"cp{s.cp}" if s.cp > 1 else "",
             f"v{s.vpp}" if s.vpp > 1 else "",
             "" if s.pp_split == "even" else ("emb/loss" if s.pp_split == "embedding-loss" else s.pp_split),
             f"ep{s.ep}" if s.ep > 1 else "", f"etp{s.etp}" if s.etp is not None else ""]
    extra = [e for e in extra if e]
    return out + (f" ({', '.join(extra)})" if extra else "")

def candidate_dict(c: Candidate) -> dict:
    s = c.setup
    setup = {k: v for k, v in asdict(s).items() if k not in ("mode", "kv_dtype")}
    mem = c.estimate.memory
    d = {
        "setup": setup,
        "global_batch_tokens": s.tokens_per_step,
        "memory": {"peak": mem.peak, "peak_phase": mem.peak_phase, "reserved": mem.reserved,
                   "device_total": mem.device_total, "required": mem.required, "capacity": c.capacity, "headroom": c.headroom,
                   "fits": c.estimate.time.fits, "weights": mem.weights, "gradients": mem.gradients, "optimizer_states": mem.optimizer_states,
                   "master_weights": mem.master_weights, "activations": mem.activations,
                   "temporaries": mem.temporaries, "phases": mem.phases},
        "time": c.time.as_dict(),
        "flops": asdict(c.estimate.flops),
    }
    if c.budget:
        d["budget"] = c.budget
    if getattr(c, "verify", None):
        d["verify"] = c.verify
    if c.warnings:
        d["warnings"] = list(c.warnings)
    return d


def plan_dict(r: PlanResult) -> dict:
    q = r.query
    out = {
        "model": r.model,
        "gpu": r.gpu.name,
        "gpu_memory": r.gpu.memory,
        "gpus": q.gpus,
        "query": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(q).items()},
        "candidates": [candidate_dict(c) for c in r.candidates],
        "search": r.stats,
        "notes": list(r.notes),
    }
    if r.diagnosis is not None:
        dg = r.diagnosis
        out["nothing_fits"] = {"reason": dg.reason, "message": dg.message, "leanest_device_total": dg.leanest_device_total,
                               "min_gpus": dg.min_gpus, "suggestions": dg.suggestions,
                               "leanest_time": dg.leanest_time}
    return out


def run_flags(s) -> str:
    """The flags beyond the table's columns a plan's setup runs with, as `trainfit estimate` takes them: its memory
    knobs (plan/knobs.py) and the communication settings the search turns on (plan/search.py timed_settings)."""
    timed = [BY_NAME[name].as_flag(getattr(s, name)) for name in timed_settings()]
    return " ".join(x for x in (knobs.setup_flags(s), *timed) if x)


def verify_words(v: dict) -> str:
    """--verify's result for one plan (plan/verify.py): the trace's peak beside the analytic one, or why it was
    skipped."""
    return v["skipped"] if "skipped" in v else \
        f"trace peak {fmt_bytes(v['trace_peak'])} vs analytic {fmt_bytes(v['analytic_peak'])} ({v['gap']:+.1%})"


def render(r: PlanResult, echo=print) -> None:
    from rich.table import Table

    from .console import console as stdout_console

    q = r.query
    gb = f", global batch {fmt_count(q.global_batch_tokens)} tokens" if q.global_batch_tokens else ""
    title = f"trainfit plan: {r.model} on {q.gpus} × {r.gpu.name} (seq {q.seq}{gb})"
    if not r.candidates:
        stdout_console().print(f"[bold]{title}[/bold]")
        dg = r.diagnosis
        echo(f"nothing fits: {dg.message}")
        lt = getattr(dg, "leanest_time", None)
        if lt:
            terms = ", ".join(f"{k.replace('_', ' ')} {fmt_seconds(v)}" for k, v in time_terms(lt).items() if v > 0)
            echo(f"the leanest plan, timed anyway (does not fit): step {fmt_seconds(lt['step_seconds'])}, "
                 f"{lt['tokens_per_second']:,.0f} tokens/s, MFU {lt['mfu']:.1%} ({terms})")
        if dg.suggestions:
            echo("what would: " + "; ".join(dg.suggestions))
        return
    t = Table(title=title, header_style="bold")
    show_stack = tuple(q.stacks) != DEFAULT_STACKS  # the stack column once another stack is planned or compared
    cols = ("#", *(("stack",) if show_stack else ()), "dp×tp×pp", "ZeRO", "micro×accum", "recompute", "precision",
            "tokens/s", "MFU", "step", "peak", "headroom")
    for col in cols:
        t.add_column(col, justify="left" if col in ("stack", "recompute", "precision", "dp×tp×pp") else "right")
    for i, c in enumerate(r.candidates, 1):
        s, tm = c.setup, c.time
        t.add_row(str(i), *((s.stack,) if show_stack else ()), layout_text(s), str(s.zero),
                  f"{s.batch}×{s.grad_accum}",
                  f"{s.recompute} ({s.recompute_modules})" if s.recompute_modules else s.recompute, s.precision,
                  f"{tm.tokens_per_second:,.0f}",
                  f"{tm.mfu:.1%}", fmt_seconds(tm.step_seconds), fmt_bytes(c.peak), fmt_bytes(c.headroom))
    terms = Table(title="step time by term (exposed; they add up to the step)", header_style="bold")
    rows = [time_terms(c.time.as_dict()) for c in r.candidates]
    names = [k for k in rows[0] if any(row.get(k) for row in rows)]  # StepTime's terms, read generically
    for col in ("#", *(k.replace("_", " ") for k in names), "DP comm before overlap", "DP link"):
        terms.add_column(col, justify="right")
    for i, (c, row) in enumerate(zip(r.candidates, rows), 1):
        tm = c.time
        terms.add_row(str(i), *(fmt_seconds(row[k]) if row.get(k) else "-" for k in names),
                      fmt_seconds(tm.dp_comm_total) if tm.dp_comm_total else "-", tm.dp_bandwidth)
    con = stdout_console()
    con.print(t)
    con.print(terms)
    if any(c.budget for c in r.candidates):
        bt = Table(title=f"training budget: {fmt_count(r.candidates[0].budget['train_tokens'])} tokens", header_style="bold")
        for col in ("#", "time", "GPU-hours", "cost", "energy", "W per GPU"):
            bt.add_column(col, justify="right")
        for i, c in enumerate(r.candidates, 1):
            b = c.budget
            bt.add_row(str(i), fmt_seconds(b["train_seconds"]), fmt_count(b["gpu_hours"]), f"${b['cost_usd']:,.0f}",
                       fmt_energy(b['energy_kwh']), f"{b.get('average_power_watts', 0):,.0f}")
        con.print(bt)
    for i, c in enumerate(r.candidates, 1):
        if getattr(c, "verify", None):
            echo(f"verify #{i}: {verify_words(c.verify)}")
    st = r.stats
    if show_stack:
        for name, d in st["stacks"].items():
            axes = "".join(f"; {k} {', '.join(AXES[k].label(x) for x in v)}"
                           for k, v in d.get("axes", {}).items() if len(v) > 1)
            mods = d.get("recompute_modules", [None])
            recs = ", ".join(d["recomputes"]) + (f" (selective's modules: {'; '.join(m or 'core_attn' for m in mods)})"
                                                 if len(mods) > 1 else "")
            echo(f"{name}: searched {d['groups']} groups over recompute {recs}; ZeRO "
                 f"{', '.join(map(str, d['zeros']))}; precision {', '.join(d['precisions'])}{axes}")
    if st.get("knobs"):
        echo(f"no plain plan fits: searched again with the stacks' memory knobs up to {st['knobs']} (plan/knobs.py)")
    for i, c in enumerate(r.candidates, 1):
        if run_flags(c.setup):
            echo(f"#{i} runs {run_flags(c.setup)}")
        for w in c.warnings:
            echo(f"#{i} warning: {w}")
    echo(f"searched {st['searched']:,} configurations ({st['groups']} layout/ZeRO/recompute/precision groups, "
         f"memory judged for {st['memory_judged']:,} of them, {st['fits']:,} fitting; "
         f"{st['engine_calls']:,} analytic-engine calls) in "
         f"{st['seconds'] * 1e3:.0f} ms ({st['searched_per_second']:,.0f}/s); fits as `trainfit estimate` judges "
         f"(the fit rule: required <= GPU memory - the fixed overheads{f' - {q.reserve:g} GiB (--reserve)' if q.reserve else ''}), "
         "each plan's numbers the estimate's; " + (
             f"compute at a flat {q.efficiency:.0%} of peak (--efficiency override)" if q.efficiency is not None else
             "compute: each kernel timed by the roofline (--efficiency N: a flat fraction of peak instead)"))
    for n in r.notes:
        echo(f"note: {n}")
