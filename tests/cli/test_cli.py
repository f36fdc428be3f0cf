"""The CLI as a user runs it: JSON contract, one-line errors with exit code 2, no torch at start-up."""
import json
import subprocess
import sys

import pytest





def test_estimate_json_contract(cli):
    code, out, _ = cli("estimate", "llama-3.1-8b", "--batch", "2", "--seq", "1024", "--gpu", "H100-80GB", "--json")
    assert code == 0
    d = json.loads(out)
    assert isinstance(d["params"], int) and d["params"] == 8_030_261_248
    for k in ("peak", "weights", "gradients", "optimizer_states", "activations", "kv_cache"):
        assert isinstance(d["memory"][k], int)
    assert d["memory"]["kv_cache"] == 0
    assert d["memory"]["peak_phase"] in ("forward_end", "backward", "optimizer_step")
    assert d["flops"]["step"] > 0
    assert d["time"]["step_seconds"] > 0


def test_infer_json_has_kv_cache(cli):
    code, out, _ = cli("estimate", "LLAMA-3.1-8B", "--mode", "infer", "--batch", "1", "--seq", "8192", "--json")
    assert code == 0 and json.loads(out)["memory"]["kv_cache"] == 1 << 30


def test_catalog_listings(cli):
    code, out, _ = cli("gpus", "--json")
    gpus = json.loads(out)
    assert code == 0 and len(gpus) >= 15 and all(isinstance(g["memory"], int) for g in gpus)
    code, out, _ = cli("models", "--json")
    models = json.loads(out)
    assert code == 0 and len(models) >= 20 and {"llama-3.1-8b", "gpt-3-175b", "bert-large"} <= {m["name"] for m in models}


def test_the_gpu_table_shows_the_low_precision_peaks_a_chip_has():
    """docs/low-precision.md: the catalog has fp8 / fp4 peaks; the table showed bf16 and fp32 only. B200's datasheet
    dense peaks: 4.5 PFLOP/s fp8, 9 PFLOP/s fp4 (NVIDIA DGX B200 datasheet, halved from its sparse figures); an A100
    has neither tensor core (a dash, not its bf16 rate)."""
    from typer.testing import CliRunner

    from trainfit.cli.app import app

    out = CliRunner().invoke(app, ["gpus"], env={"COLUMNS": "200"}).output
    rows = {line.split()[1]: line for line in out.splitlines() if line.startswith("│")}
    assert "4,500 / 9,000" in rows["B200"] and "— / —" in rows["A100-80GB"] and "1,979 / —" in rows["H100-80GB"]
    # fp32 beside tf32 (A100 datasheet: 19.5 / 156 TFLOP/s dense); V100 has no TF32 tensor cores (Volta: a dash, where
    # the column showed its fp32 15.7 alone, as if it were the tf32 rate)
    assert "19.5 / 156.0" in rows["A100-80GB"] and "15.7 / —" in rows["V100-32GB"]

@pytest.mark.parametrize("args,needle", [
    (["estimate", "llama-3.1-8bb"], "did you mean"),
    (["estimate", "llama-3.1-8b", "--gpu", "H100-8GB"], "did you mean"),
    (["estimate", "llama-3.1-8b", "--batch", "0"], "--batch"),
    (["estimate", "llama-3.1-8b", "--seq", "-5"], "--seq"),
    (["estimate", "llama-3.1-8b", "--tp", "3"], "--tp 3"),
    (["estimate", "llama-3.1-8b", "--stack", "megatron", "--pp", "5"], "--pp 5"),
    (["estimate", "llama-3.1-8b", "--zero", "2"], "--dp"),
    (["estimate", "llama-3.1-8b", "--precision", "fp64"], "--precision"),
    (["estimate", "llama-3.1-8b", "--batch", "many"], "--batch"),
    (["estimate", "llama-3.1-8b", "--engine", "magic"], "--engine"),
    (["estimate", "/nonexistent/config.json"], "config"),
])
def test_bad_input_is_one_line_and_exit_2(cli, args, needle):
    code, out, err = cli(*args)
    assert code == 2
    assert len(err.strip().splitlines()) == 1, err
    assert needle.lower() in err.lower()
    assert "Traceback" not in err


def test_malformed_config(tmp_path, cli):
    p = tmp_path / "config.json"
    p.write_text("{ not json")
    code, _, err = cli("estimate", str(p))
    assert code == 2 and len(err.strip().splitlines()) == 1


def test_config_path_gives_same_answer_as_catalog(tmp_path, cli):
    from trainfit.models.resolve import catalog_entry  # noqa: F401  (the catalog file is an HF config.json)
    import importlib.resources as r
    cfg = json.loads(r.files("trainfit.models.catalog").joinpath("llama-3.1-8b.json").read_text())
    cfg.pop("_trainfit", None)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    _, a, _ = cli("estimate", str(tmp_path), "--json")
    _, b, _ = cli("estimate", "llama-3.1-8b", "--json")
    assert json.loads(a)["memory"]["peak"] == json.loads(b)["memory"]["peak"]


def test_startup_does_not_import_torch():
    code = ("import sys, trainfit.cli, trainfit.api, trainfit.engines, trainfit.analytic.engine, trainfit.plan.verify, "
            "trainfit.report.html; sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0




def test_traces_leave_stderr_empty():
    """Nothing the user did not ask for reaches stderr on a trace (one fresh process, as a user's: kineto and
    transformers read their levels once per process):
    - the trace engine's CPU kernel probes open torch profiler sessions, and torch 2.13's libkineto prints a "USDT:
      ... profiler_start/stop" pair for each (hundreds in an RL trace) unless KINETO_LOG_LEVEL is above its levels,
      which the CLI sets when the user set none;
    - transformers warns about the configs trainfit builds (GPT-2's loss_type=None) and peft reads a property
      transformers deprecates (is_gradient_checkpointing): not the user's to act on.
    A warning Python's filters show once per place still shows once, so three traces in one process cover each."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("TRANSFORMERS_VERBOSITY", "KINETO_LOG_LEVEL")}
    runs = [['estimate', 'tiny-llama', '--engine', 'trace', '--device', 'cpu'],
            ['estimate', 'tiny-llama', '--engine', 'trace', '--device', 'cpu', '--lora-rank', '8', '--seq', '16'],
            ['estimate', 'tiny-gpt2', '--engine', 'trace', '--device', 'cpu', '--seq', '16']]
    code = ("import sys\nfrom trainfit.cli import main\n"
            f"for args in {runs!r}:\n"
            "    try:\n        main(args)\n"
            "    except SystemExit as e:\n"
            "        if e.code not in (0, None):\n            sys.exit(f'{args}: exit {e.code}')\n")
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "USDT" not in run.stderr and "profiler_start" not in run.stderr, run.stderr[:500]
    assert run.stderr == "", run.stderr[-2000:]
    assert run.stdout.count("— trace engine —") == len(runs), run.stdout[-2000:]  # each trace printed its report
