"""Every field that names a model or a GPU file, on the command line (issue 35): the CLI reads local files (that is
its purpose) through the same resolver as the web app, and a name the file system cannot take (too long, a NUL,
an undecodable byte, an unknown ~user) is one line and exit code 2, never an OSError's traceback. `--emit` gives
vLLM/SGLang a model argument that works from any directory."""
from __future__ import annotations

import json
import os
import shlex
import shutil

import pytest

from trainfit.models.resolve import CATALOG_DIR, load_model
from trainfit.setup import SETTINGS

MODEL_FLAGS = {s.flag: s for s in SETTINGS if s.meta.names_model}
# the command line in which each field applies (its setting's first mode; rl with ppo, which takes both models)
WHERE = {"model": "estimate {} --gpu H100-80GB", "--gpu": "estimate llama-3.2-1b --gpu {}",
         **{flag: f"estimate llama-3.1-8b --gpu H100-80GB --mode {s.meta.modes[0]}"
            + (" --rl-algo ppo" if s.meta.modes[0] == "rl" else "") + f" {flag} {{}}"
            for flag, s in MODEL_FLAGS.items()}}
BAD_NAMES = {"300 characters": "a" * 300, "a 300-character path": "/tmp/" + "b" * 295, "a NUL": "x\x00y",
             "an undecodable byte": "\udcff\udcfe", "an unknown user's home": "~nosuchuser/config.json"}


def argv(field: str, value: str) -> list[str]:
    return [value if a == "{}" else a for a in shlex.split(WHERE[field])]


def test_the_model_flags_come_from_the_settings():
    assert set(MODEL_FLAGS) == {"--draft-model", "--critic-model", "--reward-model"}


@pytest.mark.parametrize("what", BAD_NAMES)
@pytest.mark.parametrize("field", WHERE)
def test_a_name_the_file_system_cannot_take_is_one_error_line(cli, field, what):
    code, out, err = cli(*argv(field, BAD_NAMES[what]))
    assert code == 2, (code, out[-300:], err[-600:])
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    assert len(lines[0]) < 300, lines[0]  # the name is quoted shortened, not 300 characters of it
    # names the field (a GPU by what it is not: a catalog GPU)
    assert lines[0].startswith(f"error: {field} ") or field == "--gpu" and ("unknown GPU" in lines[0]
                                                                            or "GPU file" in lines[0]), lines[0]
    if "300" in what:
        assert "name too long" in lines[0]


@pytest.fixture
def model_dir(tmp_path, monkeypatch):
    """tmp_path/work/my model/config.json (a catalog config copied: Llama-3.2-1B), run from tmp_path/work."""
    work = tmp_path / "work"
    folder = work / "my model"
    folder.mkdir(parents=True)
    shutil.copy(CATALOG_DIR / "llama-3.2-1b.json", folder / "config.json")
    monkeypatch.chdir(work)
    return folder


def _model_arg(argv_: list[str], server: str) -> str:
    return argv_[2] if server == "vllm" else argv_[argv_.index("--model-path") + 1]


@pytest.mark.parametrize("server", ["vllm", "sglang"])
@pytest.mark.parametrize("ref", ["./my model/config.json", "my model", "my model/"])
def test_emit_gives_the_local_models_folder_from_any_directory(cli, model_dir, tmp_path, monkeypatch, server,
                                                               ref):
    code, out, err = cli("estimate", ref, "--mode", "serve", "--server", server, "--gpu", "H100-80GB",
                     "--draft-model", ref, "--emit", server)
    assert code == 0, err
    emitted = shlex.split(out)  # quoted for the shell: the space survives
    model = _model_arg(emitted, server)
    draft = (json.loads(emitted[emitted.index("--speculative-config") + 1])["model"] if server == "vllm"
             else emitted[emitted.index("--speculative-draft-model-path") + 1])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    for arg in (model, draft):  # what vLLM's --model / SGLang's --model-path reads: <folder>/config.json
        assert os.path.isabs(arg) and os.path.samefile(os.path.join(arg, "config.json"), model_dir / "config.json")
        assert load_model(arg).config == load_model(str(model_dir / "config.json")).config


@pytest.mark.parametrize("server", ["vllm", "sglang"])
def test_emit_gives_a_catalog_models_hub_id(cli, server):
    code, out, err = cli("estimate", "llama-3.2-1b", "--mode", "serve", "--server", server, "--gpu",
                     "H100-80GB", "--emit", server)
    assert code == 0, err
    assert _model_arg(shlex.split(out), server) == "meta-llama/Llama-3.2-1B"  # the catalog file's hf_id


def test_emit_refuses_a_config_file_not_named_config_json(cli, model_dir):
    os.rename(model_dir / "config.json", model_dir / "tiny.json")
    code, out, err = cli("estimate", "my model/tiny.json", "--mode", "serve", "--gpu", "H100-80GB",
                     "--emit", "vllm")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "not named config.json" in err, err


# as AutoAWQ / GPTQModel write them into the quantised checkpoint's config.json (the engine reads quant_method:
# vLLM ModelConfig._verify_quantization, SGLang's model config the same)
AWQ = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"}
GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True}


@pytest.mark.parametrize("server", ["vllm", "sglang"])
@pytest.mark.parametrize("quant", ["awq", "gptq"])
def test_emit_refuses_a_16_bit_checkpoint_under_awq_or_gptq(cli, server, quant):
    """--emit printed `--model meta-llama/Llama-3.2-1B --quantization awq`, which vLLM cannot load: it reads the
    checkpoint's quantization_config (model_executor/model_loader/weight_utils.py get_quant_config: 'Cannot find
    the config file for awq'). fp8 quantises the 16-bit weights at load and is still emitted."""
    code, out, err = cli("estimate", "llama-3.2-1b", "--mode", "serve", "--server", server, "--gpu", "H100-80GB",
                         "--quant", quant, "--emit", server)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, (code, out, err)
    assert f"--emit {server} --quant {quant}" in err and "config.json or folder as MODEL" in err, err
    code, out, err = cli("estimate", "llama-3.2-1b", "--mode", "serve", "--server", server, "--gpu", "H100-80GB",
                         "--quant", "fp8", "--emit", server)
    assert code == 0 and "--quantization fp8" in out, err


@pytest.mark.parametrize("server", ["vllm", "sglang"])
def test_emit_takes_a_local_checkpoint_quantised_so(cli, model_dir, server):
    """A local config.json whose quantization_config.quant_method is the --quant is emitted as its folder, with
    --quantization; one quantised otherwise is refused, naming its method."""
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps(dict(config, quantization_config=AWQ)))
    code, out, err = cli("estimate", "my model", "--mode", "serve", "--server", server, "--gpu", "H100-80GB",
                         "--quant", "awq", "--emit", server)
    assert code == 0, err
    emitted = shlex.split(out)
    assert os.path.samefile(_model_arg(emitted, server), model_dir)
    assert emitted[emitted.index("--quantization") + 1] == "awq"
    (model_dir / "config.json").write_text(json.dumps(dict(config, quantization_config=GPTQ)))
    code, out, err = cli("estimate", "my model", "--mode", "serve", "--server", server, "--gpu", "H100-80GB",
                         "--quant", "awq", "--emit", server)
    assert code == 2 and "has quant_method 'gptq'" in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("server", ["vllm", "sglang"])
def test_check_refuses_a_serving_command_the_engine_cannot_load(cli, model_dir, server):
    """check read `vllm serve <16-bit checkpoint> --quantization awq` and answered for it (fits, its throughput),
    though the engine does not start (weight_utils.get_quant_config: 'Cannot find the config file for awq'), the
    command --emit refuses to write. An AWQ checkpoint's own config.json is read."""
    line = {"vllm": "vllm serve './my model' --quantization awq\n",
            "sglang": "python -m sglang.launch_server --model-path './my model' --quantization awq\n"}[server]
    (model_dir.parent / "serve.sh").write_text(line)
    code, out, err = cli("check", "serve.sh", "--gpu", "H100-80GB")
    assert code == 2 and out == "" and "has none (16-bit weights)" in err and len(err.strip().splitlines()) == 1, err
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps(dict(config, quantization_config=AWQ)))
    code, out, err = cli("check", "serve.sh", "--gpu", "H100-80GB")
    assert code == 0 and "--quant awq" in out, err


@pytest.mark.parametrize("server", ["vllm", "sglang"])
def test_check_reads_the_checkpoints_own_quantisation(cli, model_dir, server):
    """`vllm serve <AWQ checkpoint>` without --quantization runs AWQ: the engine takes the config.json's
    quantization_config (vLLM ModelConfig._verify_quantization). check estimated it at 16-bit weights, without a
    word; it is read as --quant awq (noted), and answers as `trainfit estimate MODEL --quant awq` does."""
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps(dict(config, quantization_config=AWQ)))
    line = {"vllm": "vllm serve './my model'\n",
            "sglang": "python -m sglang.launch_server --model-path './my model'\n"}[server]
    (model_dir.parent / "serve.sh").write_text(line)
    code, out, err = cli("check", "serve.sh", "--gpu", "H100-80GB", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["check"]["settings"]["quant"] == "awq"
    assert any("quant_method 'awq'" in x for x in d["check"]["not_modelled"]), d["check"]["not_modelled"]
    code, est, err = cli("estimate", "my model", "--mode", "serve", "--server", server, "--quant", "awq",
                         "--gpu", "H100-80GB", "--json")
    assert code == 0, err
    assert d["memory"]["weights"] == json.loads(est)["memory"]["weights"] < config_weights(cli, server)


def config_weights(cli, server) -> int:
    """The 16-bit weights of the checkpoint model_dir copies (the catalog's Llama-3.2-1B)."""
    code, out, err = cli("estimate", "llama-3.2-1b", "--mode", "serve", "--server", server, "--gpu", "H100-80GB",
                         "--json")
    assert code == 0, err
    return json.loads(out)["memory"]["weights"]


@pytest.mark.parametrize("quant_config,loaded", [(AWQ, "awq"), (GPTQ, "gptq"), ({"quant_method": "fp8"}, "fp8"),
                                                  ({"quant_method": "compressed-tensors"}, None)])
def test_estimate_serves_a_quantised_checkpoint_as_stored(cli, model_dir, quant_config, loaded):
    """`trainfit estimate <AWQ checkpoint> --mode serve` sized 16-bit weights, where the engine loads the checkpoint's
    own format without --quantization (vLLM ModelConfig._verify_quantization reads its quantization_config; SGLang
    alike): the estimate is now `estimate MODEL --quant <its quant_method>`'s; a format trainfit does not model
    (compressed-tensors) stays at the 16-bit weights."""
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps(dict(config, quantization_config=quant_config)))
    code, out, err = cli("estimate", "my model", "--mode", "serve", "--gpu", "H100-80GB", "--json")
    assert code == 0, err
    weights = json.loads(out)["memory"]["weights"]
    if loaded is None:
        assert weights == config_weights(cli, "vllm")
        return
    code, est, err = cli("estimate", "llama-3.2-1b", "--mode", "serve", "--quant", loaded, "--gpu", "H100-80GB",
                         "--json")
    assert code == 0, err
    assert weights == json.loads(est)["memory"]["weights"] < config_weights(cli, "vllm")
