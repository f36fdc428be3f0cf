"""Accuracy of the analytic (and trace) engines against real CPU steps: training and inference.

    python -m bench run accuracy            # the full matrix, writes bench/results/accuracy.md and .json
    python -m bench run accuracy --quick    # a representative subset (what CI runs): accuracy-quick.md / .json
    python -m bench run anchors         # then: the other tools on the same cases (bench/results/anchors.md)

Truth: `trainfit.measure` — the real standard step on this CPU (training: forward, backward,
optimizer step; inference: prefill of the batch, then one decode step on the full KV cache), peak from
PyTorch's profiler allocation records. Models: the tiny-* catalog configs (random weights). Predictions
use --device cpu semantics. An inference case gives two rows: the prefill peak and the decode peak
(each engine's per-phase figure); a training case gives one row (the step's peak).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

from bench.figures import pct, record
from trainfit.analytic.engine import estimate
from trainfit.errors import TrainfitError
from trainfit.models.resolve import load_model
from trainfit.setup import Setup

ABOUT = {"summary": "trace and analytic peaks vs real CPU training and inference steps",
         "minutes": 6, "quick": ["--quick"]}

FAMILIES = ["tiny-llama", "tiny-qwen2", "tiny-gpt2", "tiny-neox", "tiny-phi3", "tiny-gemma2", "tiny-bert", "tiny-opt"]
# inference: every family, the MoE too (tiny-bert is an encoder: one forward, prefill only)
INFER_FAMILIES = FAMILIES + ["tiny-mixtral"]
INFER_PHASES = ("prefill", "decode")


def cases(quick: bool) -> list[tuple[str, Setup]]:
    out = []
    base = dict(batch=2, seq=128, device="cpu", optimizer="adamw")
    fams = FAMILIES[:4] + ["tiny-bert"] if quick else FAMILIES
    for fam in fams:
        for prec in ("fp32", "amp-bf16") if quick else ("fp32", "amp-bf16", "bf16"):
            for rec in ("none", "full"):
                out.append((fam, Setup(**{**base, "precision": prec, "recompute": rec})))
    if quick:
        ib = dict(batch=4, seq=256, device="cpu", mode="infer", precision="bf16")
        out += [(f, Setup(**ib)) for f in ("tiny-llama", "tiny-gpt2", "tiny-bert")]
        out.append(("tiny-llama", Setup(**{**ib, "seq": 384, "attention": "eager"})))
        return out
    for opt in ("sgd", "momentum", "adam", "adafactor"):  # optimizers
        out.append(("tiny-llama", Setup(**{**base, "optimizer": opt, "precision": "fp32"})))
    for acc in (2, 4):  # gradient accumulation
        out.append(("tiny-llama", Setup(**{**base, "grad_accum": acc})))
        out.append(("tiny-gpt2", Setup(**{**base, "grad_accum": acc, "precision": "fp32"})))
    out.append(("tiny-llama", Setup(**{**base, "precision": "bf16-master"})))
    for b in (1, 4, 8):  # batch sweep (linear)
        out.append(("tiny-llama", Setup(**{**base, "batch": b, "precision": "fp32"})))
    for s in (64, 256, 512):  # sequence sweep, eager attention (quadratic) and sdpa (linear)
        out.append(("tiny-llama", Setup(**{**base, "seq": s, "attention": "eager", "precision": "fp32"})))
        out.append(("tiny-llama", Setup(**{**base, "seq": s, "precision": "fp32"})))
    out.append(("tiny-mixtral", Setup(**{**base, "precision": "fp32"})))
    out += infer_cases()
    return out


def infer_cases() -> list[tuple[str, Setup]]:
    """Prefill + decode: every family in bf16, precisions, batch and sequence sweeps (sdpa linear in seq,
    eager quadratic in the prefill), a case where the KV cache outweighs the weights. seq + 1 stays within
    the tiny configs' 512 positions (GPT-2/OPT/BERT have learned positions; the decode token is at `seq`)."""
    ib = dict(batch=4, seq=256, device="cpu", mode="infer", precision="bf16")
    out = [(f, Setup(**ib)) for f in INFER_FAMILIES]
    for prec in ("fp32", "fp16", "amp-bf16"):
        out.append(("tiny-llama", Setup(**{**ib, "precision": prec})))
    out.append(("tiny-gpt2", Setup(**{**ib, "precision": "fp32"})))
    for b in (1, 8, 16):
        out.append(("tiny-llama", Setup(**{**ib, "batch": b})))
    for sq in (64, 128, 384):
        out.append(("tiny-llama", Setup(**{**ib, "seq": sq})))
    for sq in (128, 256, 384):
        out.append(("tiny-llama", Setup(**{**ib, "seq": sq, "attention": "eager"})))
    for sq in (256, 384):
        out.append(("tiny-gpt2", Setup(**{**ib, "seq": sq, "attention": "eager"})))
    out.append(("tiny-qwen2", Setup(**{**ib, "batch": 16, "seq": 480})))  # KV cache > weights
    return out


def run(quick: bool, with_trace: bool, only: str | None = None, mode: str | None = None,
        checkpoint=None) -> list[dict]:
    from trainfit.measure import measure

    trace = None
    if with_trace:
        with contextlib.suppress(ImportError):
            from trainfit.trace.engine import trace_spec as trace
    rows = []
    todo = [c for c in cases(quick) if (only is None or only in c[0]) and (mode is None or c[1].mode == mode)]
    for n, (name, setup) in enumerate(todo, 1):
        spec = load_model(name)
        row = {"model": name, "mode": setup.mode, "precision": setup.precision, "optimizer": setup.optimizer,
               "recompute": setup.recompute, "attention": setup.attention_kernel, "batch": setup.batch, "seq": setup.seq,
               "grad_accum": setup.grad_accum}
        if setup.mode == "infer":
            row.update(optimizer="—", recompute="—", grad_accum=1)
        try:
            t0 = time.perf_counter()
            with open(os.devnull, "w") as devnull, contextlib.redirect_stderr(devnull):
                m = measure(spec, setup, steps=0)
            row["measure_s"] = round(time.perf_counter() - t0, 2)
        except Exception as e:  # noqa: BLE001 - a failing case is a row, not the end of the matrix
            msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
            row["error"] = msg if isinstance(e, TrainfitError) else f"{type(e).__name__}: {msg}"
            rows.append(row)
            print(f"[{n}/{len(todo)}] {name} {setup.precision}: {row['error']}", file=sys.stderr)
            if checkpoint:
                checkpoint(rows)
            continue
        if setup.mode == "infer":
            rows += infer_rows(row, spec, setup, m, trace)
            print(f"[{n}/{len(todo)}] {name:13s} infer {setup.precision:9s} b={setup.batch} s={setup.seq} "
                  f"{setup.attention_kernel:5s} " + " ".join(
                      f"{r['phase']} {r['measured'] / 2**20:7.2f} MiB analytic {r['analytic_err']:+.2%}"
                      + (f" trace {r['trace_err']:+.2%}" if "trace_err" in r else "") for r in rows[-2:]
                      if r.get("setup_id") == row["setup_id"]), file=sys.stderr)
            if checkpoint:
                checkpoint(rows)
            continue
        t0 = time.perf_counter()
        a = estimate(spec, setup)
        row["analytic_ms"] = (time.perf_counter() - t0) * 1e3
        row.update(phase="step", measured=m.peak, measured_phase=m.peak_phase, analytic=a.memory.peak,
                   analytic_phase=a.memory.peak_phase, weights=m.weights, gradients=m.gradients,
                   optimizer_states=m.optimizer_states, master_weights=m.master_weights, params=m.params)
        row["analytic_err"] = (a.memory.peak - m.peak) / m.peak
        if trace is not None:
            t = _trace(trace, spec, setup, row)
            if t is not None:
                row.update(trace=t.memory.peak, trace_err=(t.memory.peak - m.peak) / m.peak)
        rows.append(row)
        extra = f" trace {row['trace_err']:+.2%}" if "trace_err" in row else ""
        print(f"[{n}/{len(todo)}] {name:13s} {setup.precision:11s} {setup.optimizer:9s} rec={setup.recompute:5s} "
              f"b={setup.batch} s={setup.seq} acc={setup.grad_accum} {setup.attention_kernel:5s} "
              f"measured {m.peak / 2**20:8.2f} MiB analytic {row['analytic_err']:+.2%}{extra}", file=sys.stderr)
        if checkpoint:
            checkpoint(rows)
    return rows


_SETUP_IDS = iter(range(1, 1 << 30))


def _trace(trace, spec, setup, row):
    """The trace engine's estimate, or None (its error is kept in the row: the engine is in development,
    so any exception is recorded rather than stopping the matrix)."""
    try:
        t0 = time.perf_counter()
        with open(os.devnull, "w") as devnull, contextlib.redirect_stderr(devnull):
            est = trace(spec, setup)
        row["trace_s"] = round(time.perf_counter() - t0, 2)
        return est
    except Exception as e:  # noqa: BLE001
        row["trace_error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        return None


def infer_rows(base: dict, spec, setup, m, trace) -> list[dict]:
    """One row per inference phase that the model has (encoders: prefill only); each engine's phase peak."""
    t0 = time.perf_counter()
    a = estimate(spec, setup)
    ms = (time.perf_counter() - t0) * 1e3
    t = _trace(trace, spec, setup, base) if trace is not None else None
    sid = next(_SETUP_IDS)
    base["setup_id"] = sid
    out = []
    for ph in INFER_PHASES:
        if ph not in m.phase_peaks:
            continue
        meas = m.phase_peaks[ph]
        row = {**base, "phase": ph, "measured": meas, "measured_phase": ph, "analytic_ms": ms,
               "analytic": a.memory.phases.get(ph, a.memory.peak), "analytic_phase": ph,
               "weights": m.weights, "kv_cache": m.kv_cache if ph == "prefill" else m.kv_cache_decode,
               "analytic_kv_cache": a.memory.kv_cache, "params": m.params, "step_peak": m.peak}
        row["analytic_err"] = (row["analytic"] - meas) / meas
        if t is not None:
            tv = t.memory.phases.get(ph)
            if tv is not None:
                row.update(trace=tv, trace_err=(tv - meas) / meas)
        out.append(row)
    return out


def summary(rows: list[dict], key: str) -> str:
    errs = [abs(r[key]) for r in rows if key in r]
    if not errs:
        return "n/a"
    worst = max((r for r in rows if key in r), key=lambda r: abs(r[key]))
    return (f"{len(errs)} cases · median |error| {statistics.median(errs):.2%} · worst {abs(worst[key]):.2%} "
            f"({describe(worst)})")


def describe(r: dict) -> str:
    if r.get("mode") == "infer":
        return f"{r['model']} {r['precision']} {r['phase']} b={r['batch']} s={r['seq']} {r['attention']}"
    return f"{r['model']} {r['precision']} {r['optimizer']} recompute {r['recompute']} b={r['batch']} s={r['seq']}"


def markdown(rows: list[dict], meta: dict | None = None) -> str:
    has_trace = any("trace_err" in r for r in rows)
    train = [r for r in rows if r.get("mode", "train") == "train"]
    infer = [r for r in rows if r.get("mode") == "infer"]
    lines = [f"- analytic vs measured: {summary(rows, 'analytic_err')}"]
    if has_trace:
        lines.append(f"- trace vs measured: {summary(rows, 'trace_err')}")
    for label, part in (("training", train), ("inference", infer)):
        if part and len(part) != len(rows):
            lines.append(f"  - {label}: analytic {summary(part, 'analytic_err')}"
                         + (f"; trace {summary(part, 'trace_err')}" if has_trace else ""))
    failed = [r for r in rows if "trace_error" in r]
    if failed:
        lines.append(f"- trace engine failed on {len(failed)} case(s): first error `{failed[0]['trace_error']}`")
    errors = [r for r in rows if "error" in r]
    if errors:
        lines.append(f"- {len(errors)} case(s) could not be measured (see the table)")
    if meta:
        lines.append(f"- {meta}")
    lines.append("")
    lines.append("Measured = `trainfit.measure` on CPU (PyTorch profiler allocation records). Training rows: the "
                 "step's peak; inference rows: the peak of the prefill, or of one decode step on the full KV cache. "
                 "err = (prediction − measured) / measured.")
    lines.append("")
    head = "| model | mode | precision | optimizer | recompute | attention | batch | seq | accum | measured peak (B) | phase | analytic | err |"
    sep = "|" + "---|" * 13
    if has_trace:
        head += " trace | err |"
        sep += "---|---|"
    lines += [head, sep]
    for r in rows:
        mode = r.get("mode", "train")
        label = r.get("phase", "") if mode == "infer" else "train"
        if "measured" not in r:
            lines.append(f"| {r['model']} | {mode} | {r['precision']} | {r['optimizer']} | {r['recompute']} | | | | | "
                         f"error: {r['error']} |")
            continue
        line = (f"| {r['model']} | {label} | {r['precision']} | {r['optimizer']} | {r['recompute']} | {r['attention']} | "
                f"{r['batch']} | {r['seq']} | {r['grad_accum']} | {r['measured']:,} | {r['measured_phase']} | "
                f"{r['analytic']:,} | {r['analytic_err']:+.2%} |")
        if has_trace:
            line += f" {r['trace']:,} | {r['trace_err']:+.2%} |" if "trace_err" in r else " — | — |"
        lines.append(line)
    return "\n".join(lines)


def rescore(row: dict) -> dict:
    """The row's analytic prediction recomputed with the current code; the measurement is untouched."""
    if "measured" not in row:
        return row
    infer = row["mode"] == "infer"
    setup = Setup(batch=row["batch"], seq=row["seq"], precision=row["precision"], device="cpu", mode=row["mode"],
                  attention=row["attention"], grad_accum=row["grad_accum"],
                  **({} if infer else {"optimizer": row["optimizer"], "recompute": row["recompute"]}))
    est = estimate(load_model(row["model"]), setup)
    predicted = est.memory.phases.get(row["phase"], est.memory.peak) if infer else est.memory.peak
    return {**row, "analytic": predicted, "analytic_phase": row["phase"] if infer else est.memory.peak_phase,
            "analytic_err": (predicted - row["measured"]) / row["measured"]}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a representative subset")
    ap.add_argument("--no-trace", action="store_true", help="skip the trace engine")
    ap.add_argument("--out", default="bench/results", help="folder for accuracy.md / accuracy.json")
    ap.add_argument("--only", default=None, help="run only cases whose model name contains this string")
    ap.add_argument("--mode", choices=("train", "infer"), default=None, help="run only training or inference cases")
    ap.add_argument("--render", nargs="+", default=None, metavar="JSON",
                    help="no runs: concatenate the rows of these accuracy JSON files and write OUT/accuracy.md/.json")
    ap.add_argument("--rescore", action="store_true",
                    help="with --render: keep the stored measurements (the truth) and trace results, recompute the "
                         "analytic predictions with the current code")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.render:
        rows, metas, wall = [], [], 0.0
        for path in args.render:
            data = json.loads(Path(path).read_text())
            rows += data["rows"] if isinstance(data, dict) else data
            if isinstance(data, dict):
                metas.append(data.get("meta", ""))
                wall += data.get("wall_s", 0.0)
        meta = "; ".join(m for m in metas if m)
        if args.rescore:
            rows = [rescore(r) for r in rows]
            note = "analytic predictions recomputed with the current code (--rescore)"
            meta = "; ".join([m for m in meta.split("; ") if m != note] + [note])
        (out / "accuracy.json").write_text(json.dumps({"meta": meta, "wall_s": round(wall, 1), "rows": rows}, indent=1))
        md = markdown(rows, meta)
        (out / "accuracy.md").write_text(md + "\n")
        print(md)
        return
    import tempfile

    partial = Path(tempfile.gettempdir()) / f"trainfit-accuracy-{os.getpid()}.partial.json"  # rows so far
    print(f"rows so far: {partial}", file=sys.stderr)
    t0 = time.perf_counter()
    rows = run(args.quick, not args.no_trace, args.only, args.mode,
               checkpoint=lambda rs: partial.write_text(json.dumps({"meta": "partial", "rows": rs}, indent=1)))
    wall = time.perf_counter() - t0
    import platform

    import torch
    import transformers

    meta = (f"{'quick subset' if args.quick else 'full matrix'}{f' ({args.mode} cases)' if args.mode else ''}"
            f"{f' (models *{args.only}*)' if args.only else ''}: {len(rows)} rows in {wall / 60:.1f} min on "
            f"{os.cpu_count()} CPU cores ({platform.processor() or platform.machine()}), torch {torch.__version__}, "
            f"transformers {transformers.__version__}, {time.strftime('%Y-%m-%d')}")
    name = "accuracy-quick" if args.quick else "accuracy"  # the quick subset leaves the full matrix's files alone
    (out / f"{name}.json").write_text(json.dumps({"meta": meta, "wall_s": round(wall, 1), "rows": rows}, indent=1))
    md = markdown(rows, meta)
    (out / f"{name}.md").write_text(md + "\n")
    partial.unlink(missing_ok=True)
    print(md)
    if not (args.only or args.mode):  # the figures are the whole matrix's (or the quick subset's)
        record_figures(rows, args.quick)


def record_figures(rows: list[dict], quick: bool) -> None:
    """The page's accuracy figures: trace and analytic (training, inference) against the measured peaks."""
    def stats(part: list[dict], key: str) -> tuple[int, float, float]:
        errs = [r[key] for r in part if key in r]
        return len(errs), statistics.median(abs(e) for e in errs), max(errs, key=abs)

    train = [r for r in rows if r.get("mode", "train") == "train"]
    infer = [r for r in rows if r.get("mode") == "infer"]
    (nt, mt, wt), (na, ma, wa), (ni, mi, wi) = (stats(rows, "trace_err"), stats(train, "analytic_err"),
                                                stats(infer, "analytic_err"))
    families = len({r["model"] for r in rows})
    accuracy = [{"table": "accuracy", "stack": "hf", "engine": engine, "truth": "real CPU step", "cases": n,
                 "median |error|": pct(m, False, 2), "worst": pct(w, digits=2)}
                for engine, n, m, w in (("trace", nt, mt, wt), ("analytic (training)", na, ma, wa),
                                        ("analytic (inference)", ni, mi, wi))]

    def trace_of(part: list[dict]) -> str:
        return pct(stats(part, "trace_err")[2], False, 2)

    cpu = [{"table": "cpu", "stack": "hf", "case": f"training, {len({r['model'] for r in train})} families × precisions "
            "× recompute", "cases": len(train), "trace vs real": trace_of(train),
            "analytic vs real": f"median {pct(ma, False, 2)}, worst {pct(wa, digits=2)}"},
           {"table": "cpu", "stack": "hf", "case": "prefill and decode", "cases": len(infer),
            "trace vs real": trace_of(infer), "analytic vs real": f"median {pct(mi, False, 2)}, worst {pct(wi, digits=2)}"}]
    record("accuracy", f"trace and analytic vs real CPU peaks (tiny models, {families} families)",
           "trace within 0.5 %; analytic median ≤ 2 %, worst ≤ 5 %",
           f"trace: {nt} rows, worst {pct(wt, False, 2)}; analytic training median {pct(ma, False, 2)}, worst "
           f"{pct(wa, False, 2)}; inference median {pct(mi, False, 2)}, worst {pct(wi, False, 2)}",
           {"trace_cases": nt, "trace_median_pct": round(mt * 100, 3), "trace_worst_pct": round(wt * 100, 3),
            "analytic_train_cases": na, "analytic_train_median_pct": round(ma * 100, 3),
            "analytic_train_worst_pct": round(wa * 100, 3), "analytic_infer_cases": ni,
            "analytic_infer_median_pct": round(mi * 100, 3), "analytic_infer_worst_pct": round(wi * 100, 3)},
           "cpu-memory", rows=accuracy + cpu, quick=quick)


if __name__ == "__main__":
    main()
