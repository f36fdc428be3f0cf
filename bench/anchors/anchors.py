"""The tools people use today, on the same cases as bench/targets/accuracy.py, against the same measured peaks.

    python -m bench run accuracy                 # first: the measured peaks (bench/results/accuracy.json)
    bash bench/anchors/setup.sh DIR              # once: the tools' own venvs, DIR/{anchors,ds,lla}-venv
    TRAINFIT_ANCHORS_VENVS=DIR python -m bench run anchors     # -> bench/results/anchors.md and anchors.json
    python -m bench run anchors -- --only tiny-llama --no-memtracker --accelerate-python VENV/bin/python ...

Where the tools' venvs are: TRAINFIT_ANCHORS_VENVS (the DIR of setup.sh), or one --<tool>-python flag per tool; a
tool with neither is reported as not set up.

Anchors (each tool with its intended settings; what it predicts is compared with what we measured):
- accelerate `estimate-memory` (bench/anchors/accelerate_anchor.py, its own venv): model size per dtype and
  "Training using Adam".
- DeepSpeed ZeRO model-state estimators (bench/anchors/deepspeed_anchor.py, its own venv): model states per
  GPU; compared with the measured peak and with the measured model states (weights + gradients + optimizer
  state + master weights).
- llm-analysis (bench/anchors/llm_analysis_anchor.py, its own venv: it pins transformers 4.31).
- PyTorch's MemTracker (`torch.distributed._tools.mem_tracker.MemTracker`), here in our venv, around the
  very same real step (training: forward, backward, optimizer step; inference: prefill, then one decode
  step, each in its own tracker session with the cache tracked as external state).
A tool missing from this machine is reported as such, not reimplemented.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.data import results_dir

ABOUT = {"summary": "accelerate, DeepSpeed, llm-analysis and MemTracker on the accuracy cases",
         "minutes": 30, "quick": None}

HERE = Path(__file__).resolve().parent
VENVS = "TRAINFIT_ANCHORS_VENVS"  # the folder bench/anchors/setup.sh made the tools' venvs in
KEYS = ("model", "mode", "precision", "optimizer", "recompute", "attention", "batch", "seq", "grad_accum")
TOOLS = {  # name -> (script, its venv under TRAINFIT_ANCHORS_VENVS, label)
    "accelerate": ("accelerate_anchor.py", "anchors-venv", "accelerate estimate-memory"),
    "deepspeed": ("deepspeed_anchor.py", "ds-venv", "DeepSpeed ZeRO-2 model states"),
    "llm_analysis": ("llm_analysis_anchor.py", "lla-venv", "llm-analysis"),
}


def tool_python(venv: str) -> str | None:
    """The python of the tool's venv under TRAINFIT_ANCHORS_VENVS, or None when that is not set."""
    folder = os.environ.get(VENVS)
    return str(Path(folder) / venv / "bin" / "python") if folder else None


def case_key(r: dict) -> str:
    return "|".join(str(r[k]) for k in KEYS)


def load_rows(path: Path) -> tuple[list[dict], str]:
    data = json.loads(path.read_text())
    if isinstance(data, list):
        return data, ""
    return data["rows"], data.get("meta", "")


def make_setup(r: dict):
    from trainfit.setup import Setup

    kw = dict(batch=r["batch"], seq=r["seq"], precision=r["precision"], attention=r["attention"], device="cpu",
              mode=r["mode"])
    if r["mode"] == "train":
        kw.update(optimizer=r["optimizer"], recompute=r["recompute"], grad_accum=r["grad_accum"])
    return Setup(**kw)


def param_counts(spec, setup) -> tuple[int, int]:
    """(params, largest layer's params) of the real HF model, counted on the meta device the way DeepSpeed's
    `estimate_zero*_model_states_mem_needs_all_live` counts a live model (tied weights once; a 'layer' is a
    module's own parameters)."""
    import torch

    from trainfit.step.build import build_model

    with contextlib.redirect_stderr(open(os.devnull, "w")):
        model = build_model(spec, setup.with_(mode="train", precision="fp32") if setup.mode == "infer" else setup,
                            device="meta")
    total = sum(p.numel() for p in model.parameters())
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    del model
    torch.nn.Module  # noqa: B018 (torch imported for the build)
    return int(total), int(largest)


def bench_rows(quick: bool) -> list[dict]:
    """The accuracy matrix's cases as rows without measurements (to run the anchors before or beside it)."""
    from bench.targets import accuracy

    rows = []
    for name, s in accuracy.cases(quick):
        r = {"model": name, "mode": s.mode, "precision": s.precision, "optimizer": s.optimizer,
             "recompute": s.recompute, "attention": s.attention_kernel, "batch": s.batch, "seq": s.seq,
             "grad_accum": s.grad_accum}
        if s.mode == "infer":
            r.update(optimizer="—", recompute="—", grad_accum=1)
        rows.append(r)
    return rows


def cases_for_tools(rows: list[dict], require_measured: bool = True) -> list[dict]:
    from trainfit.models.resolve import load_model

    out, seen, counts = [], set(), {}
    for r in rows:
        if require_measured and "measured" not in r:
            continue
        k = case_key(r)
        if k in seen:
            continue
        seen.add(k)
        spec = load_model(r["model"])
        setup = make_setup(r)
        if r["model"] not in counts:
            counts[r["model"]] = param_counts(spec, setup)
        cfg = {k2: v for k2, v in dict(spec.config).items() if k2 != "_trainfit"}
        cfg.setdefault("model_type", spec.config.get("model_type") or spec.family)
        n, largest = counts[r["model"]]
        out.append({"id": k, **{k2: r[k2] for k2 in KEYS}, "config": cfg, "params": n, "largest_layer_params": largest})
    return out


def run_tool(name: str, python: str | None, cases_path: str) -> dict:
    script, _, _ = TOOLS[name]
    if python is None:
        return {"error": f"not set up: set {VENVS} (bash bench/anchors/setup.sh DIR) or pass "
                         f"--{name.replace('_', '-')}-python"}
    if not Path(python).exists():
        return {"error": f"{python} not found (run bench/anchors/setup.sh, or pass --{name.replace('_', '-')}-python)"}
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out_path = f.name
    t0 = time.perf_counter()
    p = subprocess.run([python, str(HERE / script), cases_path, out_path], capture_output=True, text=True)
    secs = time.perf_counter() - t0
    if p.returncode != 0:
        tail = (p.stderr or p.stdout).strip().splitlines()[-1:] or ["failed"]
        return {"error": f"{script} exited {p.returncode}: {tail[0]}"}
    data = json.loads(Path(out_path).read_text())
    os.unlink(out_path)
    data["seconds"] = round(secs, 2)
    return data


# -- MemTracker ------------------------------------------------------------------------------------------
def _tracker_peak(mt) -> int:
    snap = mt.get_tracker_snapshot("peak")
    return int(max(v["Total"] for v in snap.values()))


def memtracker_case(r: dict) -> dict:
    """MemTracker around the real standard step (same seed and steady state as trainfit.measure)."""
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker

    from trainfit.models.resolve import load_model

    spec, setup = load_model(r["model"]), make_setup(r)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    if setup.mode == "train":
        from trainfit.step.standard import prepare, run_step

        model, opt, batches = prepare(spec, setup)  # includes a warm-up step: optimizer state resident
        mt = MemTracker()
        mt.track_external(model, opt, *[t for b in batches for t in b.values()])
        t1 = time.perf_counter()
        with mt:
            run_step(model, opt, batches, setup)
        return {"step": _tracker_peak(mt), "tracked_s": round(time.perf_counter() - t1, 2),
                "total_s": round(time.perf_counter() - t0, 2)}
    import inspect

    from trainfit.measure.infer import cache_tensors, inference_step, prepare_inference

    model, ids = prepare_inference(spec, setup)
    inference_step(model, ids, setup, spec.causal)  # warm-up, as trainfit.measure does
    params = inspect.signature(model.forward).parameters
    kw = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
    causal = spec.causal and "past_key_values" in params
    amp = {"amp-bf16": torch.bfloat16, "amp-fp16": torch.float16}.get(setup.precision)
    res = {}
    t1 = time.perf_counter()
    with torch.no_grad(), torch.autocast("cpu", dtype=amp or torch.bfloat16, enabled=amp is not None):
        mt = MemTracker()
        mt.track_external(model, ids)
        with mt:  # prefill (the same calls as trainfit.measure.infer.inference_step)
            if causal:
                out = model(input_ids=ids, use_cache=True, **kw)
                cache = getattr(out, "cache", None) or out.past_key_values  # renamed in transformers 5.24
                next_ids = out.logits[:, -1:].argmax(-1)
            else:
                out = model(input_ids=ids)
            del out
        res["prefill"] = _tracker_peak(mt)
        if causal:
            mt = MemTracker()
            mt.track_external(model, ids, next_ids, *cache_tensors(cache))
            with mt:
                arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
                model(input_ids=next_ids, use_cache=True, **{arg: cache}, **kw)
            res["decode"] = _tracker_peak(mt)
    res["tracked_s"] = round(time.perf_counter() - t1, 2)
    res["total_s"] = round(time.perf_counter() - t0, 2)
    return res


def run_memtracker(cases: list[dict], previous: dict | None = None) -> dict:
    """MemTracker on every case; `previous` (a MemTracker entry of an earlier anchors.json) supplies the cases
    it already measured (the real steps are deterministic), so only new cases are run."""
    import torch

    out = {"tool": f"torch {torch.__version__} MemTracker", "results": {}}
    old = (previous or {}).get("results", {})
    t0 = time.perf_counter()
    for i, c in enumerate(cases, 1):
        if c["id"] in old and "error" not in old[c["id"]]:
            out["results"][c["id"]] = old[c["id"]]
            continue
        try:
            with open(os.devnull, "w") as dn, contextlib.redirect_stderr(dn):
                out["results"][c["id"]] = memtracker_case(c)
        except Exception as e:  # noqa: BLE001
            out["results"][c["id"]] = {"error": f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"}
        print(f"[memtracker {i}/{len(cases)}] {c['id']}: {out['results'][c['id']]}", file=sys.stderr)
    # build + warm-up + tracked step of every case (reused ones included), and this run's wall time
    out["seconds"] = round(sum(r.get("total_s", 0) for r in out["results"].values()), 1)
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    return out


# -- report ----------------------------------------------------------------------------------------------
def prediction(tool: dict, r: dict):
    res = tool.get("results", {}).get(case_key(r))
    if not res or "error" in res:
        return None
    if r.get("mode") == "infer":
        return res.get(r["phase"])
    return res.get("step")


def model_states(r: dict) -> int | None:
    if r.get("mode", "train") != "train" or "weights" not in r:
        return None
    return r["weights"] + r["gradients"] + r["optimizer_states"] + r["master_weights"]


def err(pred, truth):
    return None if pred is None or not truth else (pred - truth) / truth


def summarise(errs: list[tuple[float, dict]]) -> str:
    if not errs:
        return "no cases"
    vals = [abs(e) for e, _ in errs]
    worst_e, worst_r = max(errs, key=lambda x: abs(x[0]))
    signed = statistics.median(e for e, _ in errs)
    what = worst_r.get("phase", "") if worst_r.get("mode") == "infer" else f"{worst_r['optimizer']} recompute {worst_r['recompute']}"
    desc = (f"{worst_r['model']} {worst_r['precision']} {what} b={worst_r['batch']} s={worst_r['seq']}"
            f"{' ' + worst_r['attention'] if worst_r['attention'] == 'eager' else ''}"
            f"{' accum ' + str(worst_r['grad_accum']) if worst_r.get('grad_accum', 1) > 1 else ''}")
    return (f"{len(errs)} cases · median |error| {statistics.median(vals):.1%} (median signed {signed:+.1%}) · "
            f"worst {worst_e:+.1%} ({desc.replace('  ', ' ')})")


def _why(tool: dict, rows: list[dict]) -> str:
    reasons: dict[str, int] = {}
    for r in rows:
        res = tool.get("results", {}).get(case_key(r))
        if res is None:
            why = "no result"
        elif "error" in res:
            why = res["error"].split(". ")[0][:120]
        elif prediction(tool, r) is None:
            why = "no figure for this phase/mode"
        else:
            continue
        reasons[why] = reasons.get(why, 0) + 1
    return "; ".join(f"{n}× `{w}`" for w, n in reasons.items())


def cell(pred, truth) -> str:
    if pred is None:
        return "—"
    return f"{pred / 2**20:,.1f} ({err(pred, truth):+.1%})"


def scored(measured: list[dict], tools: dict):
    """(name, label, version, mode, scope, [(error, row)], rows in scope) per estimator and mode, vs the measured
    peak: trainfit's two engines, then each tool that ran (accelerate and DeepSpeed on the Adam/AdamW training
    cases)."""
    for label, key in (("trainfit analytic", "analytic_err"), ("trainfit trace", "trace_err")):
        for mode in ("train", "infer"):
            part = [r for r in measured if key in r and r.get("mode", "train") == mode]
            if part:
                yield None, label, "", mode, "", [(r[key], r) for r in part], part
    for name, tool in tools.items():
        if "error" in tool:
            continue
        adam_only = name in ("accelerate", "deepspeed")  # they model Adam only: other optimizers are out of scope
        for mode in ("train", "infer"):
            part = [r for r in measured if r.get("mode", "train") == mode]
            scope = ", vs measured peak"
            if adam_only and mode == "train":
                n_all = len(part)
                part = [r for r in part if r["optimizer"] in ("adam", "adamw")]
                scope += f", Adam/AdamW cases; {n_all - len(part)} other-optimizer cases left out"
            e = [(err(prediction(tool, r), r["measured"]), r) for r in part]
            yield name, tool.get("label", name), tool.get("tool", ""), mode, scope, [x for x in e if x[0] is not None], \
                part


def record_figures(measured: list[dict], tools: dict) -> None:
    """bench/results/figures/anchors.json (BENCHMARKS.md's "other tools" table): per estimator and mode, the cases,
    the median |error|, the median signed error and the worst."""
    from bench.figures import pct, record

    rows, med = [], {}
    for _, label, ver, mode, _, e, _ in scored(measured, tools):
        if not e:
            continue
        sizes = [abs(x) for x, _ in e]
        worst = max((x for x, _ in e), key=abs)
        rows.append({"table": "anchors", "tool": label, "version": ver or "—", "mode": mode, "cases": len(e),
                     "median |error|": pct(statistics.median(sizes), signed=False),
                     "median signed": pct(statistics.median(x for x, _ in e)), "worst": pct(worst)})
        med[(label, mode)] = statistics.median(sizes)
    tool_meds = {name: med.get((tool.get("label", name), "train")) for name, tool in tools.items()}
    values = {f"{name}_train_median_pct": round(100 * m, 1) for name, m in tool_meds.items() if m is not None}
    others = ", ".join(f"{tools[n].get('label', n).split(' ')[0]} {pct(m * (1 if _signed(measured, tools[n]) > 0 else -1), digits=0)}"
                       for n, m in tool_meds.items() if m is not None and n != "memtracker")
    figure = (f"trainfit trace {pct(med.get(('trainfit trace', 'train'), 0), signed=False)}, analytic "
              f"{pct(med.get(('trainfit analytic', 'train'), 0), signed=False)} / "
              f"{pct(med.get(('trainfit analytic', 'infer'), 0), signed=False)}; {others} (training median)")
    record("anchors", "the tools people use today, on the accuracy cases (vs the real CPU peak)", None,
           figure[:120], values, "anchors", rows=rows)


def _signed(measured: list[dict], tool: dict) -> float:
    """A tool's median signed training error (the figure's sign)."""
    e = [err(prediction(tool, r), r["measured"]) for r in measured if r.get("mode", "train") == "train"]
    e = [x for x in e if x is not None]
    return statistics.median(e) if e else 0.0


def markdown(rows, tools: dict, meta: str) -> str:
    measured = [r for r in rows if "measured" in r]
    lines = ["# Anchors: the tools people use today, on the accuracy cases", ""]
    lines.append("Signed error = (prediction − measured peak) / measured peak. Measured = `trainfit.measure` "
                 "(the real step on CPU, PyTorch profiler allocation records), from the accuracy matrix"
                 + (f" ({meta})" if meta else "") + ". Inference rows compare each tool's prefill or decode figure "
                 "with that phase's measured peak. — = the tool has no figure for the case (see the summary).")
    lines.append("")
    lines.append("## Summary")
    for name, label, ver, mode, scope, e, part in scored(measured, tools):
        if e:
            lines.append(f"- **{label}**{f' [{ver}]' if ver else ''} ({mode}{scope}): {summarise(e)}")
        n_none = len(part) - len(e)
        if n_none and not e and name == "deepspeed":
            lines.append(f"  - {mode}: DeepSpeed has no inference estimator")
        elif n_none and name:
            lines.append(f"  - no figure for {n_none} {mode} case(s): " + _why(tools[name], part))
    for name, tool in tools.items():
        label = tool.get("label", name)
        if "error" in tool:
            lines.append(f"- **{label}**: did not run — {tool['error']}")
            continue
        ver = tool.get("tool", "")
        if name == "deepspeed":
            e = [(err(prediction(tool, r), model_states(r)), r) for r in measured
                 if model_states(r) and r["optimizer"] in ("adam", "adamw")]
            e = [x for x in e if x[0] is not None]
            if e:
                lines.append(f"- **{label}** [{ver}] (train, vs measured model states = weights + grads + "
                             f"optimizer state + master): {summarise(e)}")
            adam = [(err(prediction(tool, r), model_states(r)), r) for r in measured
                    if model_states(r) and r["precision"] == "bf16-master" and r["optimizer"] in ("adam", "adamw")]
            adam = [x for x in adam if x[0] is not None]
            if adam:
                lines.append(f"  - on its own recipe (bf16 params + fp32 master + Adam, i.e. bf16-master/adamw): "
                             f"{summarise(adam)}")
        if "seconds" in tool:
            lines.append(f"- **{label}** time: {tool['seconds']} s for all cases")
    lines.append("")
    lines.append("## Per case (predicted MiB, signed error vs measured peak)")
    lines.append("")
    names = list(tools)
    head = ("| model | mode | precision | optimizer | recompute | attn | batch | seq | accum | measured MiB | analytic | trace | "
            + " | ".join(tools[n].get("label", n) for n in names) + " |")
    lines += [head, "|" + "---|" * (12 + len(names))]
    for r in measured:
        mode = r["phase"] if r.get("mode") == "infer" else "train"
        a = f"{r['analytic_err']:+.1%}" if "analytic_err" in r else "—"
        t = f"{r['trace_err']:+.1%}" if "trace_err" in r else "—"
        cells = [cell(prediction(tools[n], r), r["measured"]) if "error" not in tools[n] else "n/a" for n in names]
        lines.append(f"| {r['model']} | {mode} | {r['precision']} | {r['optimizer']} | {r['recompute']} | {r['attention']} | "
                     f"{r['batch']} | {r['seq']} | {r['grad_accum']} | {r['measured'] / 2**20:,.2f} | {a} | {t} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", nargs="+", default=[str(results_dir() / "accuracy.json")],
                    help="measured cases (bench/targets/accuracy.py's JSON; several files are concatenated)")
    ap.add_argument("--out", default=str(results_dir()), help="folder for anchors.md / anchors.json")
    ap.add_argument("--only", default=None, help="only cases whose model name contains this string")
    ap.add_argument("--no-memtracker", action="store_true", help="skip MemTracker (it re-runs every real step)")
    for name, (_, venv, _) in TOOLS.items():
        ap.add_argument(f"--{name.replace('_', '-')}-python", default=tool_python(venv),
                        help=f"python of the {name} venv (default: ${VENVS}/{venv}/bin/python)")
    ap.add_argument("--from-bench", choices=("full", "quick"), default=None,
                    help="take the cases from bench/targets/accuracy.py instead of its results and only write the tools' "
                         "predictions (anchors.json), e.g. to run beside the accuracy matrix; then --reuse")
    ap.add_argument("--reuse", action="store_true", help="reuse the tools' predictions in OUT/anchors.json")
    ap.add_argument("--memtracker-cache", default=None, metavar="ANCHORS_JSON",
                    help="reuse MemTracker results for the cases this earlier anchors.json already has")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.from_bench:
        rows, meta = bench_rows(args.from_bench == "quick"), ""
    else:
        rows, metas = [], []
        for path in args.results:
            part, m = load_rows(Path(path))
            rows += part
            metas.append(m)
        meta = "; ".join(m for m in metas if m)
    if args.only:
        rows = [r for r in rows if args.only in r["model"]]
    if args.reuse:
        tools = json.loads((out / "anchors.json").read_text())["tools"]
    else:
        cases = cases_for_tools(rows, require_measured=not args.from_bench)
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(cases, f)
            cases_path = f.name
        tools = {}
        for name, (_, _, label) in TOOLS.items():
            tools[name] = {**run_tool(name, getattr(args, f"{name}_python"), cases_path), "label": label}
            print(f"{label}: {tools[name].get('error') or tools[name].get('tool')}", file=sys.stderr)
        if not args.no_memtracker:
            prev = None
            if args.memtracker_cache:
                prev = json.loads(Path(args.memtracker_cache).read_text())["tools"].get("memtracker")
            tools["memtracker"] = {**run_memtracker(cases, prev), "label": "MemTracker (real step)"}
        os.unlink(cases_path)
        (out / "anchors.json").write_text(json.dumps({"meta": meta, "tools": tools}, indent=1))
    if args.from_bench:
        print(f"wrote {out / 'anchors.json'}: the tools' predictions; run again with --reuse once "
              f"{args.results} exists", file=sys.stderr)
        return
    md = markdown(rows, tools, meta)
    (out / "anchors.md").write_text(md + "\n")
    record_figures([r for r in rows if "measured" in r], tools)
    if args.reuse and meta:  # keep the measured run's description with the predictions
        data = json.loads((out / "anchors.json").read_text())
        data["meta"] = meta
        (out / "anchors.json").write_text(json.dumps(data, indent=1))
    print(md)


if __name__ == "__main__":
    main()
