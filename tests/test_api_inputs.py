"""The Python API's bad inputs: a trainfit error with one line (SetupError), never a raw TypeError/AttributeError
from deep inside, and no keyword silently ignored."""
from __future__ import annotations

import pytest

import trainfit
from trainfit.errors import SetupError


@pytest.mark.parametrize("kw,words", [
    (dict(batch=None), "--batch needs a value, not None"),
    (dict(recompute=None), "--recompute needs a value, not None"),
    (dict(mode=None), "--mode needs a value, not None"),
    (dict(gpu=123), "--gpu must be text, got 123"),
    (dict(bogus_kw=1), "'bogus_kw' is no setting"),
    (dict(batchsize=2), "did you mean 'batch'?"),
])
def test_estimate_keywords(kw, words):
    with pytest.raises(SetupError, match=words.replace("?", r"\?").replace("(", r"\(")):
        trainfit.estimate("tiny-llama", **kw)


def test_optional_settings_take_none():
    """None is the default of the settings the model or the stack decides (precision, seq) and of the optional ones."""
    e = trainfit.estimate("tiny-llama", precision=None, seq=None, gpu=None)
    assert e.setup.seq == 2048 and e.setup.precision == "amp-bf16"


def test_trace_module_and_measure_step_refuse_what_they_do_not_read():
    torch = pytest.importorskip("torch")
    for kw in (dict(gpu="H100-80GB"), dict(lora_rank=8), dict(seq=64)):
        with pytest.raises(SetupError, match="trace_module\\(\\) does not read"):
            trainfit.trace_module(torch.nn.Linear(16, 16), torch.zeros(8, 16), **kw)
    with pytest.raises(SetupError, match="measure_step\\(\\) does not read 'tp'"):
        trainfit.measure_step("tiny-llama", device="cpu", tp=2)
    for bad in ("2", 1.5, -1):
        with pytest.raises(SetupError, match="steps must be an integer >= 0"):
            trainfit.measure_step("tiny-llama", device="cpu", steps=bad)


def test_compare_takes_a_model_name_or_a_request():
    by_name = trainfit.compare("tiny-llama", batch=2)
    by_request = trainfit.compare(trainfit.Request(model="tiny-llama", batch=2))
    assert {k: v.memory.peak for k, v in by_name.items()} == {k: v.memory.peak for k, v in by_request.items()}
    with pytest.raises(SetupError, match="compare\\(\\) takes a Request"):
        trainfit.compare(None)


def test_estimate_names_a_module_or_a_dict_it_was_given(tmp_path):
    """estimate(model) takes a name or a path: an nn.Module, a config dict or a number was refused with 'choose a
    model', as if none had been given. Each is named, with what to do instead, and that works: trace_module on the
    module, the dict written to a config.json and its path (a pathlib.Path too: the same estimate as its text)."""
    import json

    torch = pytest.importorskip("torch")
    net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU())
    with pytest.raises(SetupError, match=r"^model: an nn.Module \(Sequential\) is traced by trainfit.trace_module"):
        trainfit.estimate(net)
    # fp32 weight and bias, each in the CUDA caching allocator's 512-byte blocks
    assert trainfit.trace_module(net, torch.zeros(2, 64), precision="fp32").memory.weights == 64 * 64 * 4 + 512

    config = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000,
              "max_position_embeddings": 512}
    with pytest.raises(SetupError, match=r"^model: a dict is not read as a config.json; .*json.dump the dict"):
        trainfit.estimate(config)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert trainfit.estimate(path, seq=128).memory.peak == trainfit.estimate(str(path), seq=128).memory.peak > 0

    with pytest.raises(SetupError, match=r"^model: 3 \(int\) is not a model; give a catalog name"):
        trainfit.estimate(3)
