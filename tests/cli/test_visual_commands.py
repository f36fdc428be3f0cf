"""The visual commands through a throwaway typer app (cli/app.py registers the same functions)."""
from __future__ import annotations

import builtins
import importlib.resources
import importlib.util
import json

import pytest
import typer
from typer.testing import CliRunner

pytest.importorskip("matplotlib")

from trainfit.errors import EngineUnavailableError, TrainfitError  # noqa: E402
from trainfit.cli import visual as commands  # noqa: E402

HAS_TORCH = importlib.util.find_spec("torch") is not None and importlib.util.find_spec("transformers") is not None


@pytest.fixture(scope="module")
def app():
    a = typer.Typer(pretty_exceptions_enable=False, rich_markup_mode=None)
    for fn in (commands.timeline, commands.sweep, commands.report, commands.serve):
        a.command()(fn)
    return a


def invoke(app, *args):
    return CliRunner().invoke(app, list(args), catch_exceptions=True)


def test_help_has_examples(app):
    for name in ("timeline", "sweep", "report", "serve"):
        r = invoke(app, name, "--help")
        assert r.exit_code == 0, r.output
        assert "Examples" in r.output and f"trainfit {name}" in r.output


def test_sweep_json_and_plot(app, tmp_path):
    out = tmp_path / "seq.png"
    r = invoke(app, "sweep", "llama-3.1-8b", "--vary", "seq", "512:4096", "--attention", "eager,flash",
               "-o", str(out), "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["variants"] == ["eager", "flash"] and d["values"] == [512, 1024, 2048, 4096]
    assert d["output"] == str(out) and out.stat().st_size > 5000
    r = invoke(app, "sweep", "llama-3.2-1b", "--vary", "batch", "1:64", "--gpu", "H100-80GB")
    assert r.exit_code == 0, r.output
    assert "fits on H100-80GB up to batch" in r.output


def test_sweep_user_errors_are_trainfit_errors(app):
    r = invoke(app, "sweep", "llama-3.1-8b", "--vary", "colour", "1,2")
    assert isinstance(r.exception, TrainfitError)
    r = invoke(app, "sweep", "no-such-model", "--vary", "batch", "1:4")
    assert isinstance(r.exception, TrainfitError)


def test_sweep_names_a_host_memory_no_point_reads(app):
    """--host-memory is read where a point keeps something in host memory (fit_rule.host_verdict); a sweep shows no
    advice, so a point that does not fit (batch 64 on an L4) reads it no more than one that does: a note, in the JSON
    and under the table."""
    from trainfit.api import HOST_MEMORY_UNREAD_SWEEP

    base = ("sweep", "gpt2", "--vary", "batch", "1,64", "--gpu", "L4", "--host-memory", "512")
    r = invoke(app, *base, "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert [x["fits"] for x in d["rows"]] == [True, False] and d["notes"] == [HOST_MEMORY_UNREAD_SWEEP]
    r = invoke(app, *base)
    assert r.exit_code == 0 and "--host-memory judges no point of this sweep" in " ".join(r.output.split())
    r = invoke(app, *base, "--offload", "optimizer", "--json")  # CPUOffloadOptimizer's states: judged there
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["notes"] == []
    r = invoke(app, *base[:-2], "--json")
    assert r.exit_code == 0 and json.loads(r.output)["notes"] == []


def test_timeline_refuses_host_memory(cli, tmp_path):
    """timeline draws the trace engine's step, which judges no host memory: refused in one line, before any trace."""
    code, out, err = cli("timeline", "gpt2", "--gpu", "H100-80GB", "--host-memory", "512",
                         "-o", str(tmp_path / "t.png"))
    assert code == 2 and out == "" and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert err.startswith("error: --host-memory is read by the analytic engine")
    assert "timeline draws the trace engine's step" in err and err.strip().endswith("drop it")
    assert not (tmp_path / "t.png").exists()


def test_report_without_trace(app, tmp_path):
    out = tmp_path / "r.html"
    r = invoke(app, "report", "llama-3.2-1b", "--gpu", "H100-80GB", "--no-trace", "--vary", "seq", "512:4096",
               "-o", str(out))
    assert r.exit_code == 0, r.output
    text = out.read_text()
    assert "Memory at each phase" in text and "Training vs inference" in text and "Sweep over seq" in text
    r = invoke(app, "report", "llama-3.2-1b", "-o", str(tmp_path / "r.txt"))
    assert isinstance(r.exception, TrainfitError)


def test_timeline_without_trace_engine_is_one_clear_error(app, tmp_path, monkeypatch):
    real_import = builtins.__import__

    def no_torch(name, *a, **kw):
        if name.endswith("trace.engine"):  # `from ..trace.engine import trace_spec`, as without torch
            raise ImportError("No module named 'torch'", name="torch")
        return real_import(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_torch)
    r = invoke(app, "timeline", "tiny-llama", "-o", str(tmp_path / "t.png"))
    assert isinstance(r.exception, EngineUnavailableError)
    msg = str(r.exception)
    assert "\n" not in msg and "trace engine" in msg and "pip install 'trainfit[torch]'" in msg
    assert not (tmp_path / "t.png").exists()


@pytest.mark.skipif(not HAS_TORCH, reason="the trace engine needs torch and transformers")
def test_timeline_from_the_trace_engine(app, tmp_path):
    out = tmp_path / "step.svg"
    r = invoke(app, "timeline", "tiny-llama", "--device", "cpu", "--seq", "32", "--gpu", "T4", "-o", str(out), "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)  # (stderr may carry a library's import warnings: the first torch import of a run)
    assert d["trace"]["engine"] == "trace" and d["trace"]["detail"]["timeline"]
    text = out.read_text()
    assert "activations" in text and "T4 memory" in text and "backward" in text


@pytest.mark.skipif(not HAS_TORCH, reason="the trace engine needs torch and transformers")
def test_timeline_verdict_is_estimates_fit_rule(cli, tmp_path):
    """timeline's fits / does not fit is `estimate --engine trace`'s (required within capacity, less --reserve): it
    had judged the peak against the GPU's memory, saying 'fits' where estimate says the step does not (--reserve
    read by nothing)."""
    setup = ("tiny-llama", "--seq", "512", "--batch", "8", "--gpu", "H100-80GB", "--reserve", "78")
    code, out, err = cli("estimate", *setup, "--engine", "trace", "--json")
    assert code == 0, err
    fit = json.loads(out)["fit"]
    assert not fit["fits"]  # the setup: what the step requires is over what --reserve leaves
    code, out, err = cli("timeline", *setup, "-o", str(tmp_path / "t.png"))
    assert code == 0, err
    assert "; does not fit on H100-80GB" in out and "; fits" not in out
    from trainfit.units import fmt_bytes

    assert f"required {fmt_bytes(fit['required'])} of capacity {fmt_bytes(fit['capacity'])}" in out


@pytest.mark.parametrize("flags,needs", [(("--sequence-parallel",), "--tp > 1"),
                                         (("--tp-comm-overlap",), "--tp > 1"),
                                         (("--vpp", "2"), "--pp > 1"), (("--pp-split", "first:1,last:1"), "--pp > 1")])
def test_timeline_offers_no_setting_that_needs_tp_or_pp(cli, tmp_path, flags, needs):
    """timeline has no --tp or --pp (the trace engine runs neither), yet offered the settings that need one above 1:
    timeline tiny-llama --stack torchtitan --sequence-parallel said 'it needs --tp > 1', and --tp was then 'No such
    option'. They are not offered: one line naming the option unknown."""
    code, out, err = cli("estimate", "tiny-llama", "--stack", "megatron", *flags)  # the rule at --tp 1 --pp 1
    assert code == 2 and f"needs {needs}" in err
    code, out, err = cli("timeline", "--help")
    assert code == 0 and flags[0] not in out
    code, out, err = cli("timeline", "tiny-llama", "--stack", "torchtitan", *flags, "-o", str(tmp_path / "t.png"))
    assert code == 2 and len(err.strip().splitlines()) == 1 and f"No such option: {flags[0]}" in err


@pytest.mark.skipif(not HAS_TORCH, reason="the trace engine needs torch and transformers")
def test_timeline_offers_no_power_limit(cli, tmp_path):
    """timeline took --power-limit 200 and drew the same step: the cap lowers the compute rates (estimate's step
    time), which the timeline has not (the trace engine's estimate has no time). Not offered, as --mfu is not."""
    from trainfit import api

    big = dict(model="llama-3.1-8b", gpu="H100-80GB")  # (compute-bound: tiny-llama's step is the host's launches)
    assert (api.analytic(api.Request(**big, power_limit=200)).time.step_seconds
            > api.analytic(api.Request(**big)).time.step_seconds)
    base = dict(model="tiny-llama", gpu="H100-80GB", seq=64)
    capped = api.Request(**base, power_limit=200)
    traced, plain = api.trace(capped, extrapolate=False), api.trace(api.Request(**base), extrapolate=False)
    assert traced.time is None and (traced.memory, traced.fit) == (plain.memory, plain.fit)
    code, out, err = cli("timeline", "--help")
    assert code == 0 and "--power-limit" not in out and "--mfu" not in out
    code, out, err = cli("timeline", "tiny-llama", "--gpu", "H100-80GB", "--power-limit", "200", "-o",
                         str(tmp_path / "t.png"))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "No such option: --power-limit" in err


def test_serve_without_web_extra(app, monkeypatch):
    real_import = builtins.__import__

    def no_uvicorn(name, *a, **kw):
        if name == "uvicorn":
            raise ImportError("No module named 'uvicorn'", name="uvicorn")
        return real_import(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_uvicorn)
    r = invoke(app, "serve", "--port", "8123")
    assert isinstance(r.exception, EngineUnavailableError) and "trainfit[web]" in str(r.exception)
    r = invoke(app, "serve", "--port", "0")
    assert isinstance(r.exception, TrainfitError)


@pytest.mark.skipif(not HAS_TORCH, reason="the trace engine needs torch and transformers")
def test_fast_timeline_caption_names_flags_timeline_has(cli, tmp_path):
    """timeline --fast (a 16-layer model: a 5-layer trace extrapolated) captioned its curve 'run with --full-trace for
    the whole model's curve'; no command has --full-trace. Every flag the caption names is one of timeline's."""
    import re

    config = json.loads((importlib.resources.files("trainfit.models.catalog") / "tiny-llama.json").read_text())
    config["num_hidden_layers"] = 16
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    code, out, err = cli("timeline", str(path), "--seq", "64", "--fast", "-o", str(tmp_path / "t.svg"))
    assert code == 0, err
    text = (tmp_path / "t.svg").read_text().replace("- -", "--")  # (the text rides in XML comments: '--' spaced)
    assert "-layer trace" in text  # (the extrapolated curve's note)
    code, helped, err = cli("timeline", "--help")
    flags = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]+", text))
    assert flags and all(f in helped for f in flags), flags
    assert "without --fast" in text
