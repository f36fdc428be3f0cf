"""Where the time goes: the step-time terms in `estimate --gpu`'s table, the HTML report's bar, and a layout that
does not fit timed anyway (issue 14)."""
import json
import re

import pytest

import trainfit
from trainfit.report.time_bar import time_section


def test_cli_shows_each_term_and_the_budget_line(cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # one table row per line
    code, out, err = cli("estimate", "llama-3.1-8b", "--gpu", "H100-80GB", "--dp", "4", "--tp", "2", "--pp", "2",
                         "--grad-accum", "4", "--tokens", "1T", "--stack", "megatron")
    assert code == 0, err
    code, js, _ = cli("estimate", "llama-3.1-8b", "--gpu", "H100-80GB", "--dp", "4", "--tp", "2", "--pp", "2",
                      "--grad-accum", "4", "--tokens", "1T", "--stack", "megatron", "--json")
    st = json.loads(js)["detail"]["step_time"]
    for term in ("compute", "tp_comm", "pp_comm", "bubble", "dp_comm", "optimizer"):
        assert st[term] > 0
        share = f"({st[term] / st['step_seconds']:.1%})"
        assert re.search(rf"{term.replace('_', ' ')}\s.*{re.escape(share)}", out), term
    assert "GPU-h" in out and "W per GPU" in out
    # the energy in the unit that keeps its digits: 1T tokens of an 8B model on 32 H100s is tens of MWh
    kwh = json.loads(js)["time"]["energy_kwh"]
    assert 1e3 <= kwh < 1e6 and f"{kwh / 1e3:,.1f} MWh at" in out, kwh


def test_energy_is_printed_in_the_unit_that_keeps_its_digits():
    """A short run's 0.76 kWh once printed "0.0 MWh" in the plan's budget table."""
    from trainfit.units import fmt_energy

    assert [fmt_energy(x) for x in (0.7583, 37.26, 37_260.0, 2.5e6)] == ["758 Wh", "37.3 kWh", "37.3 MWh", "2.5 GWh"]


def test_cli_times_a_layout_that_does_not_fit(cli):
    code, out, err = cli("estimate", "llama-3.1-70b", "--gpu", "A100-40GB")
    assert code == 0, err
    assert "does not fit" in out and "step time" in out and "compute" in out


def test_plan_times_the_leanest_plan_when_nothing_fits(cli):
    code, out, err = cli("plan", "llama-3.1-70b", "--gpu", "A100-40GB", "--gpus", "8", "--seq", "4096")
    assert out.count("nothing fits") == 1, out  # said once (it read 'nothing fits: nothing fits in ...')
    assert "nothing fits: in 39.49 GiB per A100-40GB, the leanest plan" in out  # (CUDA's 39.49 GiB: trainfit gpus)
    assert re.search(r"timed anyway \(does not fit\): step [\d.]+ m?s", out)


def test_html_bar_has_one_rect_per_term_with_its_share():
    e = trainfit.estimate("llama-3.1-8b", gpu="H100-80GB", dp=4, tp=2, pp=2, grad_accum=4, stack="megatron")
    html = time_section(e)
    st = e.detail.step_time.as_dict()
    rects = re.findall(r"<rect class='term' data-term='(\w+)' x='[\d.]+' y='0' width='([\d.]+)'", html)
    terms = [k for k in ("compute", "recompute", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "bubble", "dp_comm",
                         "optimizer", "host_copies", "host_issue", "straggler") if st[k] > 0]
    assert [r[0] for r in rects] == terms
    for name, width in rects:  # the bar is 760 px wide: each rect is its share of the step
        assert float(width) == pytest.approx(760 * st[name] / st["step_seconds"], abs=0.01)
    assert "Where the time goes" in html


def test_html_report_wires_the_section(monkeypatch):
    from trainfit.report import html as page

    monkeypatch.setattr(page, "_try_trace", lambda req, want: (None, "skipped in this test"))
    for name in ("_timeline", "_compare", "_plan"):
        monkeypatch.setattr(page, name, lambda *a, **k: "")
    monkeypatch.setattr(page, "_sweep", lambda *a, **k: ("", None))
    text = page.build_report(page.api.Request(model="llama-3.1-8b", gpu="H100-80GB", dp=4, tp=2))
    assert "<section id='time'>" in text and "class='time-bar'" in text
