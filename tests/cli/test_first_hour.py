"""What a new user hits in the first hour (issue 10), as they would hit it: through the CLI."""
import json

import pytest

from trainfit import api




def test_compare_at_its_default_batch(cli):
    code, out, err = cli("compare", "llama-3.2-1b", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert list(d) == ["train (batch 1)", "infer (batch 1)"]  # no third row that would repeat the second
    assert d["infer (batch 1)"]["memory"]["peak"] < d["train (batch 1)"]["memory"]["peak"]
    code, out, _ = cli("compare", "llama-3.2-1b", "--batch", "4")
    assert code == 0 and "at batch 1 it needs" in out


@pytest.mark.parametrize("model,positions", [("gpt2", 1024), ("bert-base", 512), ("roberta-base", 514),
                                             ("opt-125m", 2048)])
def test_default_seq_adapts_to_learned_positions(cli, model, positions):
    code, out, err = cli("estimate", model, "--json")
    assert code == 0, err
    seq = json.loads(out)["setup"]["seq"]
    spec = api.load_spec(model)
    assert seq <= 2048 and seq <= spec.max_positions
    # hand check of the limit: a causal model's decode writes position `seq`, so inference needs seq + 1 positions
    code, out, _ = cli("estimate", model, "--mode", "infer", "--json")
    assert code == 0 and json.loads(out)["setup"]["seq"] + (1 if spec.causal else 0) <= spec.max_positions
    code, _, err = cli("estimate", model, "--seq", str(spec.max_positions + 1))
    assert code == 2 and "learned positions" in err and len(err.strip().splitlines()) == 1


def test_estimate_and_plan_give_the_same_step_time(cli):
    """The layout the planner picks, timed by `estimate --gpu`: one step-time model, one number."""
    code, out, err = cli("plan", "llama-3.1-8b", "--gpu", "H100-80GB", "--gpus", "8", "--seq", "4096",
                         "--global-batch-tokens", "1M", "--json")
    assert code == 0, err
    best = json.loads(out)["candidates"][0]
    s = best["setup"]
    args = ["estimate", "llama-3.1-8b", "--gpu", "H100-80GB", "--json"]
    for k in ("batch", "seq", "grad_accum", "precision", "recompute", "dp", "tp", "pp", "zero"):
        args += [f"--{k.replace('_', '-')}", str(s[k])]
    if s["sequence_parallel"]:
        args.append("--sequence-parallel")
    code, out, err = cli(*args)
    assert code == 0, err
    est = json.loads(out)
    assert est["time"]["step_seconds"] == pytest.approx(best["time"]["step_seconds"], rel=1e-9)
    assert est["memory"]["peak"] == best["memory"]["peak"]


def test_mfu_overrides_the_step_time_model(cli):
    base = ["estimate", "llama-3.1-8b", "--gpu", "H100-80GB", "--json"]
    _, out, _ = cli(*base, "--mfu", "0.5")
    flat = json.loads(out)
    # hand derivation: step = hardware FLOPs / (dense bf16 peak × MFU); H100 SXM bf16 dense = 989.4 TFLOP/s
    from trainfit.hardware import get_gpu

    peak = get_gpu("H100-80GB").flops_for("bf16")
    assert flat["time"]["step_seconds"] == pytest.approx(flat["flops"]["step"] / (peak * 0.5), rel=1e-9)


def test_what_would_fit_is_checked_by_the_engine(cli):
    code, out, _ = cli("estimate", "llama-3.1-8b", "--gpu", "H100-80GB", "--batch", "4", "--seq", "4096",
                       "--json")
    advice = json.loads(out)["would_fit"]
    assert advice
    assert [a["slowdown"] for a in advice] == sorted(a["slowdown"] for a in advice)  # fastest first
    for a in advice:  # each suggestion, applied, fits
        flags = a["flags"].split()
        code, out, err = cli("estimate", "llama-3.1-8b", "--gpu", "H100-80GB", "--batch", "4", "--seq", "4096",
                             *flags, "--json")
        assert code == 0, err
        assert json.loads(out)["time"]["fits"], a
    code, out, _ = cli("estimate", "llama-3.1-8b", "--gpu", "H100-80GB", "--batch", "4", "--seq", "4096")
    assert "what would, fastest first" in out


def test_selective_recompute_is_refused_where_it_equals_none(cli):
    code, _, err = cli("estimate", "llama-3.1-8b", "--recompute", "selective")
    assert code == 2 and "--attention eager" in err
    code, out, _ = cli("estimate", "llama-3.1-8b", "--recompute", "selective", "--attention", "eager", "--json")
    sel = json.loads(out)["memory"]["activations"]
    _, out, _ = cli("estimate", "llama-3.1-8b", "--attention", "eager", "--json")
    assert sel < json.loads(out)["memory"]["activations"]  # with eager scores stored, selective does save memory


@pytest.mark.parametrize("flag", [["--optimizer", "sgd"], ["--recompute", "full"], ["--grad-accum", "2"],
                                  ["--tokens", "1T"], ["--zero", "1", "--dp", "2"]])
def test_training_flags_are_refused_for_inference(cli, flag):
    code, _, err = cli("estimate", "llama-3.1-8b", "--mode", "infer", *flag)
    assert code == 2 and ("applies to train" in err or "apply to train" in err) and flag[0] in err and len(err.strip().splitlines()) == 1


def test_models_readable_at_80_columns(cli, monkeypatch):
    """At 80 columns every column stays whole: rich crops a no-wrap table's lines at the width without an ellipsis,
    which had cut the vocab column to 'voca' / '50'."""
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = cli("models")
    assert code == 0
    assert max(len(line) for line in out.splitlines()) <= 80 and "…" not in out
    assert out.splitlines()[1].split() == ["name", "family", "params", "layers", "hidden", "heads", "vocab"]
    lines = {line.split()[0]: line.split() for line in out.splitlines() if line.strip()}
    for m in api.catalog_models():
        # every name in full, with its vocabulary (thousands) as the catalog has it in the last column
        vocab = m["vocab"]
        assert lines[m["name"]][-1] == (f"{vocab / 1000:.0f}k" if vocab >= 10_000 else str(vocab or "-"))


def test_catalog_tables_keep_every_header_when_piped(monkeypatch):
    """Piped (no terminal, no COLUMNS), the tables print at the reports' width (report/console.py PIPED_WIDTH), not
    rich's 80 columns, at which `trainfit gpus` wrapped its headers to 'memo…' and `trainfit models` cut its vocab
    column and hid the hub ids."""
    from typer.testing import CliRunner

    from trainfit.cli.app import app

    monkeypatch.delenv("COLUMNS", raising=False)
    gpus = CliRunner().invoke(app, ["gpus"]).output
    header = next(line for line in gpus.splitlines() if "name" in line)
    for col in ("memory (CUDA)", "nvidia-smi", "bandwidth", "bf16 / fp16 TFLOP/s", "fp32/tf32 TFLOP/s",
                "fp8 / fp4 TFLOP/s"):
        assert col in header
    models = CliRunner().invoke(app, ["models"]).output
    assert "hub id" in models and " meta-llama/Llama-3.1-8B" in models and "…" not in models


def test_longest_context_that_fits_honours_learned_positions(cli):
    """GPT-2 has 1024 learned positions and decode writes position `seq`: on a 80 GB GPU memory allows far more,
    so the longest context is 1023 (it was 65,535 when only memory bounded it). A rotary model stops at its
    max_position_embeddings too (vLLM's default max_model_len; it was 244,022 for llama-3.1-8b here)."""
    code, out, err = cli("estimate", "gpt2", "--mode", "infer", "--gpu", "H100-80GB", "--json")
    assert code == 0, err
    assert json.loads(out)["time"]["max_seq"] == 1023
    _, out, _ = cli("estimate", "bert-base", "--mode", "infer", "--gpu", "H100-80GB", "--json")
    assert json.loads(out)["time"]["max_seq"] == 512  # an encoder has no decode step
    _, out, _ = cli("estimate", "llama-3.2-1b", "--mode", "infer", "--gpu", "H100-80GB", "--json")
    assert json.loads(out)["time"]["max_seq"] == 131072 - 1  # meta-llama/Llama-3.2-1B config.json: 131072
