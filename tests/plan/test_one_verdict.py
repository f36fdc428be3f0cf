"""One verdict per layout: `plan`, `fit`, `sweep`, `report` and the web API answer what `trainfit estimate` answers
for the same settings — step time, tokens/s, peak, reserved, device total, headroom and fit. Each comparison is
against an independent call through the public API (trainfit.estimate with the settings a user would type), not the
plan's own Estimate object. Fast (no torch)."""
from __future__ import annotations

import json

import pytest

import trainfit
from trainfit.analytic import compute_time
from trainfit.api import Request, load_spec
from trainfit.hardware import get_gpu
from trainfit.plan.search import PlanQuery, search
from trainfit.report.json_out import dumps
from trainfit.setup import Setup

GPU = "H100-80GB"
RESERVE = 1.5  # GiB: the plan judges with the user's --reserve, as estimate does
# the settings a plan prints (report/plan.py, --emit), which a user passes to `trainfit estimate`
PLAN_SETTINGS = ("batch", "seq", "grad_accum", "precision", "optimizer", "recompute", "dp", "tp", "pp", "zero",
                 "sequence_parallel", "stack", "cp", "vpp", "pp_split", "ep", "etp", "moe_dispatcher", "overlap_moe_comm",
                 "tp_comm_overlap", "loss_fusion", "recompute_modules", "overlap_param_gather",
                 "overlap_comm")
# (model, the stacks that build it): torchtitan builds untied, bias-free llama models only (stacks/torchtitan.toml)
MODELS = (("llama-3.1-8b", ("hf", "torchtitan", "megatron", "deepspeed")),
          ("qwen2.5-1.5b", ("hf", "megatron", "deepspeed")),
          ("mistral-7b", ("hf", "megatron", "deepspeed")),
          ("tiny-mixtral", ("megatron",)))  # a MoE model: its expert layouts (ep, etp) searched


def estimate_of(model: str, s: Setup, **run):
    """`trainfit estimate MODEL --batch ... --gpu ...`: the public API, from the settings alone, with the op lists'
    times computed afresh (not read from what the search memoised: compute_time.clear_memos)."""
    compute_time.clear_memos()
    return trainfit.estimate(model, **{k: getattr(s, k) for k in PLAN_SETTINGS}, **run)


def same(a, b) -> bool:
    return a == b if isinstance(a, (bool, type(None))) or isinstance(b, (bool, type(None))) else \
        a == pytest.approx(b, rel=1e-9, abs=0)


def verdict(step_seconds, tokens_per_second, peak, reserved, device_total, required, headroom, fits) -> dict:
    return dict(step_seconds=step_seconds, tokens_per_second=tokens_per_second, peak=peak, reserved=reserved,
                device_total=device_total, required=required, headroom=headroom, fits=fits)


def of_estimate(e) -> dict:
    m, t = e.memory, e.time
    return verdict(t.step_seconds, t.tokens_per_second, m.peak, m.reserved, m.device_total, m.required, t.headroom,
                   t.fits)


def assert_same(got: dict, want: dict, where: str) -> None:
    bad = {k: (got[k], want[k]) for k in want if not same(got[k], want[k])}
    assert not bad, f"{where}: {bad}"


@pytest.mark.parametrize("model, stacks", MODELS, ids=[m for m, _ in MODELS])
def test_every_plan_candidate_is_its_estimate(model, stacks):
    spec, gpu = load_spec(model), get_gpu(GPU)
    layouts = set()
    for stack in stacks:
        # recompute none/full for hf and deepspeed (their policies); torchtitan's and megatron's own (op, layer:N,
        # selective); every ZeRO stage and precision each stack runs
        recs = ("none", "full") if stack in ("hf", "deepspeed") else None
        r = search(spec, gpu, PlanQuery(gpus=4, seq=2048, global_batch_tokens=2**16, stacks=(stack,), top=8,
                                        recomputes=recs, reserve=RESERVE))
        assert len(r.candidates) >= 3, (model, stack)
        # ranked by the time they show: the search's inner loop times with the estimate's model
        tps = [c.time.tokens_per_second for c in r.candidates]
        assert tps == sorted(tps, reverse=True), (model, stack)
        for c in r.candidates:
            s = c.setup
            e = estimate_of(model, s, gpu=GPU, reserve=RESERVE)
            assert e is not c.estimate and e.setup == s  # the same step, resolved as estimate resolves it
            plan = verdict(c.time.step_seconds, c.time.tokens_per_second, c.peak, c.estimate.memory.reserved,
                           c.estimate.memory.device_total, c.estimate.memory.required, c.headroom,
                           c.estimate.time.fits)
            assert plan["fits"] is True
            assert_same(plan, of_estimate(e), f"{model} {stack} {s.dp}x{s.tp}x{s.pp} ZeRO-{s.zero} {s.recompute}")
            layouts.add((s.stack, s.dp, s.tp, s.pp, s.zero, s.cp, s.vpp, s.pp_split, s.ep, s.etp))
        assert len({lay for lay in layouts if lay[0] == stack}) >= (3 if stack == "deepspeed" else 4), (model, stack)
    assert len(layouts) >= 4 * len(stacks) - 1


def test_plan_json_is_estimate_json(cli):
    """The CLI: a candidate of `plan --json` against `estimate --json` with its settings — the RTX 4090 case where a
    planner margin once hid the plan `estimate` said fits (llama-3.2-1b, pure bf16, 4352 tokens: ~0.9 GiB free)."""
    code, out, err = cli("plan", "llama-3.2-1b", "--gpu", "RTX-4090", "--gpus", "1", "--seq", "4352", "--precision",
                         "bf16", "--json")
    assert code == 0, err
    first = json.loads(out)["candidates"][0]
    s = first["setup"]
    assert (s["batch"], s["recompute"]) == (1, "none")
    args = ["estimate", "llama-3.2-1b", "--gpu", "RTX-4090", "--json"]
    for k in PLAN_SETTINGS:
        v = s[k]
        if v is None:  # a setting left to its default (e.g. --etp: --tp)
            continue
        if isinstance(v, bool):
            args += [f"--{k.replace('_', '-')}"] if v else []
        else:
            args += [f"--{k.replace('_', '-')}", str(v)]
    code, out, err = cli(*args)
    assert code == 0, err
    e = json.loads(out)
    m, t = e["memory"], e["time"]
    assert t["fits"] and 0 < t["headroom"] < 2**30
    got = verdict(first["time"]["step_seconds"], first["time"]["tokens_per_second"], first["memory"]["peak"],
                  first["memory"]["reserved"], first["memory"]["device_total"], first["memory"]["required"],
                  first["memory"]["headroom"], first["memory"]["fits"])
    assert_same(got, verdict(t["step_seconds"], t["tokens_per_second"], m["peak"], m["reserved"], m["device_total"],
                             m["required"], t["headroom"], t["fits"]), "plan --json vs estimate --json")


LAYOUT = dict(batch=2, seq=2048, dp=4, zero=3, recompute="full", precision="amp-bf16")


def test_fit_sweep_report_and_web_answer_the_estimate():
    model, gpu = "llama-3.1-8b", get_gpu(GPU)
    want = of_estimate(trainfit.estimate(model, gpu=GPU, reserve=RESERVE, **LAYOUT))
    req = Request(model=model, gpu=GPU, reserve=RESERVE, **LAYOUT)
    spec = load_spec(model)

    # fit (studies/fit_advice.py): the setup as given fits; every setup fit lists is its estimate
    from trainfit.studies.fit_advice import fastest_that_fit

    found = fastest_that_fit(spec, req.setup(spec), gpu, reserve=RESERVE)
    assert found
    for x in found:
        e = estimate_of(model, x.setup, gpu=GPU, reserve=RESERVE)
        assert (x.required, x.capacity, x.gpus) == (e.memory.required, e.fit.capacity, e.setup.world_size)
        assert same(x.step_seconds, e.time.step_seconds) and same(x.tokens_per_second, e.time.tokens_per_second)

    # sweep (report/sweep.py): the row at this layout's batch
    from trainfit.report.sweep import run_sweep

    row = next(r for r in run_sweep(req, "batch", "1,2,4").rows if r["value"] == LAYOUT["batch"])
    assert_same({k: row[k] for k in want}, want, "sweep")

    # report (report/html.py): the plan section's candidates, each its estimate
    from trainfit.report.html import plan_candidates

    cands, _ = plan_candidates(req, 4, global_batch_tokens=2**16)
    assert cands
    for c in cands:
        s = Setup(**{k: c["setup"][k] for k in PLAN_SETTINGS})
        got = verdict(c["time"]["step_seconds"], c["time"]["tokens_per_second"], *(c["memory"][k] for k in (
            "peak", "reserved", "device_total", "required", "headroom", "fits")))
        assert_same(got, of_estimate(estimate_of(model, s, gpu=GPU, reserve=RESERVE)), "report plan")

    # the web API: exactly `trainfit estimate --json`
    pytest.importorskip("fastapi")
    pytest.importorskip("httpx")
    from fastapi.testclient import TestClient

    from trainfit.web.app import create_app

    r = TestClient(create_app()).get("/api/estimate", params={"model": model, "gpu": GPU, "reserve": RESERVE,
                                                              **LAYOUT})
    assert r.status_code == 200, r.text
    web = r.json()
    m, t = web["memory"], web["time"]
    assert_same(verdict(t["step_seconds"], t["tokens_per_second"], m["peak"], m["reserved"], m["device_total"],
                        m["required"], t["headroom"], t["fits"]), want, "web")
    assert web == json.loads(dumps(trainfit.estimate(model, gpu=GPU, reserve=RESERVE, **LAYOUT).to_dict()))


def test_a_tp_row_of_the_plan_table_says_it_runs_sequence_parallel(capsys, monkeypatch):
    """Every tp > 1 plan runs --sequence-parallel; the table's row said '32×2×1' only, and that row typed into
    `estimate` (without --sequence-parallel) read 110.9 GiB where the plan had 66.2 (llama-3.1-70b, 64 H100s).
    The row now says '(sp)', and with it the estimate is the plan's."""
    from trainfit.cli import main

    monkeypatch.setenv("COLUMNS", "200")  # (the table's whole rows, as a wide terminal prints them)
    main(["plan", "llama-3.1-70b", "--gpus", "64", "--gpu", GPU, "--top", "5"])
    rows = [line for line in capsys.readouterr().out.splitlines() if "×2×1" in line]
    assert rows and all("(sp)" in r for r in rows)
    cells = [c.strip() for c in rows[0].split("│")]
    micro, _ = cells[4].split("×")
    peak = float(cells[10].split()[0])
    kw = dict(dp=32, tp=2, zero=int(cells[3]), batch=int(micro), recompute=cells[5], precision=cells[6], seq=2048,
              gpu=GPU)
    assert round(trainfit.estimate("llama-3.1-70b", sequence_parallel=True, **kw).memory.peak / 2**30, 2) == peak
    assert trainfit.estimate("llama-3.1-70b", **kw).memory.peak / 2**30 > peak + 10
