"""Model references -> ModelSpec: catalog, config.json paths, the offline HF cache, and the errors."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from trainfit.analytic.params import count_params
from trainfit.errors import ConfigError, TrainfitError, UnknownModelError
from trainfit.models.hf_config import SUPPORTED_MODEL_TYPES, spec_from_config
from trainfit.models.resolve import CATALOG_DIR, catalog_entry, list_models, load_model

TINY_LLAMA = {
    "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 100, "max_position_embeddings": 128,
    "tie_word_embeddings": False,
}


@pytest.fixture(autouse=True)
def _empty_hf_cache(tmp_path, monkeypatch):
    """Point every HF cache variable at an empty folder so the user's real cache never leaks in."""
    empty = tmp_path / "empty-hf-cache"
    empty.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(empty))
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


# ---- catalog ------------------------------------------------------------------------------------


@pytest.mark.parametrize("ref", ["llama-3.1-8b", "LLaMA-3.1-8B", "  llama-3.1-8b ", "llama3.1-8b"])
def test_catalog_lookup_is_case_insensitive_and_knows_aliases(ref):
    spec = load_model(ref)
    assert spec.name == "llama-3.1-8b"
    assert (spec.hidden, spec.layers, spec.kv_heads, spec.vocab) == (4096, 32, 8, 128256)
    assert "catalog" in spec.source


def test_aliases():
    assert load_model("gpt2-small").name == "gpt2"
    assert load_model("GPT2-Small").name == "gpt2"
    assert load_model("bert-base-uncased").name == "bert-base"
    assert load_model("mistral-7b-v0.1").name == "mistral-7b"


def test_every_catalog_model_loads_and_names_are_lowercase_hyphenated():
    names = [p.stem for p in CATALOG_DIR.glob("*.json")]
    for n in names:
        meta = catalog_entry(n)
        assert meta["name"] == n == n.lower() and " " not in n and "_" not in n
        assert meta["source"]
        assert load_model(n).name == n


def test_catalog_entry_metadata():
    meta = catalog_entry("Mixtral")
    assert meta["name"] == "mixtral-8x7b"
    assert meta["hf_id"] == "mistralai/Mixtral-8x7B-v0.1"
    assert meta["params_published"] == 46_700_000_000
    with pytest.raises(UnknownModelError):
        catalog_entry("no-such-model")


def test_list_models_ordered_by_family_then_size():
    models = list_models()
    assert len(models) >= 24
    assert len({m.name for m in models}) == len(models)
    from trainfit.api import catalog_models  # the listing users see: by family, then size

    rows = catalog_models()
    keys = [(m["family"], m["params"]) for m in rows]
    assert keys == sorted(keys) and {m["name"] for m in rows} == {m.name for m in models}
    assert all(m["params"] == count_params(s).total for m, s in zip(sorted(rows, key=lambda r: r["name"]),
                                                                   sorted(models, key=lambda s: s.name)))


def test_unknown_name_says_did_you_mean_and_trainfit_models():
    with pytest.raises(UnknownModelError) as e:
        load_model("llama-3.1-8")
    msg = str(e.value)
    assert "llama-3.1-8b" in msg and "did you mean" in msg.lower() and "trainfit models" in msg
    assert "\n" not in msg
    assert isinstance(e.value, TrainfitError)


def test_unknown_name_without_close_match():
    with pytest.raises(UnknownModelError, match="trainfit models"):
        load_model("zzzzzz")


def test_hub_id_of_a_catalog_model_resolves_offline_from_the_catalog():
    assert load_model("meta-llama/Llama-3.1-8B").name == "llama-3.1-8b"


# ---- local config.json ----------------------------------------------------------------------------


def test_config_json_path_and_folder(tmp_path):
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(TINY_LLAMA))
    by_file = load_model(str(folder / "config.json"))
    by_folder = load_model(str(folder))
    assert by_file == by_folder
    assert by_file.name == "my-model" and by_file.source == str(folder / "config.json")
    assert (by_file.hidden, by_file.kv_heads, by_file.head_dim) == (64, 2, 16)
    other = tmp_path / "tiny.json"
    other.write_text(json.dumps(TINY_LLAMA))
    assert load_model(str(other)).name == "tiny"


def test_folder_without_config_json(tmp_path):
    with pytest.raises(ConfigError, match="no config.json"):
        load_model(str(tmp_path))


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_model(str(tmp_path / "nope" / "config.json"))


def test_malformed_json_is_a_config_error(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text('{"model_type": "llama", "hidden_size": 64,,}')
    with pytest.raises(ConfigError) as e:
        load_model(str(bad))
    assert "not valid JSON" in str(e.value) and "line 1" in str(e.value) and "\n" not in str(e.value)
    bad.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="JSON object"):
        load_model(str(bad))


def test_unsupported_model_type_lists_supported(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(dict(TINY_LLAMA, model_type="xlnet")))
    with pytest.raises(ConfigError) as e:
        load_model(str(p))
    msg = str(e.value)
    assert "'xlnet' is not supported" in msg and "llama" in msg and "\n" not in msg


# ---- the HF cache ----------------------------------------------------------------------------------


def _fake_cache(root, hub_id, config, rev="0123abcd", ref_main=True):
    repo = root / ("models--" + hub_id.replace("/", "--"))
    snap = repo / "snapshots" / rev
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps(config))
    if ref_main:
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(rev)
    return snap / "config.json"


def test_hub_id_resolves_from_hf_hub_cache(tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    path = _fake_cache(cache, "acme/tiny-llama", TINY_LLAMA)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    spec = load_model("acme/tiny-llama")
    assert spec.name == "tiny-llama" and spec.hidden == 64
    assert "acme/tiny-llama" in spec.source and str(path) in spec.source


def test_hub_id_resolves_from_hf_home(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_CACHE")
    _fake_cache(tmp_path / "hf-home" / "hub", "acme/tiny-llama", TINY_LLAMA, ref_main=False)
    assert load_model("acme/tiny-llama").hidden == 64


def test_cache_prefers_refs_main(tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    _fake_cache(cache, "acme/m", dict(TINY_LLAMA, hidden_size=128), rev="main-rev")
    other = cache / "models--acme--m" / "snapshots" / "old-rev"
    other.mkdir()
    (other / "config.json").write_text(json.dumps(TINY_LLAMA))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    assert load_model("acme/m").hidden == 128


def test_cached_config_beats_the_catalog(tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    _fake_cache(cache, "meta-llama/Llama-3.1-8B", TINY_LLAMA)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    assert load_model("meta-llama/Llama-3.1-8B").hidden == 64


def test_hub_id_not_cached_says_offline_and_how_to_pass_a_config():
    with pytest.raises((UnknownModelError, ConfigError)) as e:
        load_model("acme/not-downloaded")
    msg = str(e.value)
    assert "offline" in msg and "config.json" in msg and "\n" not in msg


def test_cached_malformed_config(tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    path = _fake_cache(cache, "acme/broken", TINY_LLAMA)
    path.write_text("{not json")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_model("acme/broken")


# ---- malformed configs ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change, words",
    [
        ({"hidden_size": None}, "hidden_size"),
        ({"hidden_size": 0}, "must be >= 1"),
        ({"num_hidden_layers": -2}, "num_hidden_layers"),
        ({"vocab_size": "many"}, "must be an integer"),
        ({"hidden_size": 66}, "not divisible"),
        ({"num_key_value_heads": 3}, "multiple of num_key_value_heads"),
        ({"tie_word_embeddings": "yes"}, "true or false"),
        ({"model_type": None}, "no 'model_type'"),
        ({"model_type": "xlnet"}, "not supported"),
    ],
)
def test_malformed_config_raises_one_line_config_error(change, words):
    cfg = {k: v for k, v in {**TINY_LLAMA, **change}.items() if v is not None}
    with pytest.raises(ConfigError) as e:
        spec_from_config(cfg, "bad")
    assert words in str(e.value) and "\n" not in str(e.value)


def test_moe_top_k_larger_than_experts():
    cfg = dict(TINY_LLAMA, model_type="mixtral", num_local_experts=2, num_experts_per_tok=4)
    with pytest.raises(ConfigError, match="num_experts_per_tok"):
        spec_from_config(cfg, "bad")


def test_explicit_head_dim_need_not_divide_hidden():
    spec = spec_from_config(dict(TINY_LLAMA, hidden_size=66, head_dim=16), "ok")
    assert spec.head_dim == 16 and spec.q_dim == 64


def test_supported_model_types():
    for mt in ["gpt2", "gpt_neox", "llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3", "opt",
               "bert", "roberta", "mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3"]:
        assert mt in SUPPORTED_MODEL_TYPES


# ---- import hygiene ------------------------------------------------------------------------------


def test_resolve_and_params_do_not_import_torch():
    code = (
        "import sys\n"
        "import trainfit.models.resolve, trainfit.analytic.params, trainfit.models.hf_config\n"
        "trainfit.models.resolve.load_model('llama-3.1-8b')\n"
        "trainfit.models.resolve.list_models()\n"
        "bad = [m for m in ('torch', 'transformers', 'huggingface_hub', 'numpy') if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_building_a_model_leaves_the_catalog_as_its_file():
    """transformers writes into a config's nested dicts (a llama3 rope_scaling gains rope_theta); the catalog's
    config, shared by every later estimate in the process, must stay as its file says."""
    pytest.importorskip("transformers")
    import json

    from trainfit import api
    from trainfit.models.resolve import CATALOG_DIR, load_model
    from trainfit.step.build import hf_config

    spec, setup = api.resolve(api.Request("llama-3.2-1b", seq=64))
    hf_config(spec, setup)
    on_disk = json.loads((CATALOG_DIR / "llama-3.2-1b.json").read_text())
    assert load_model("llama-3.2-1b").config["rope_scaling"] == on_disk["rope_scaling"]


@pytest.mark.parametrize("scaling,words", [
    ("junk", "'rope_scaling' must be an object"),
    ({"rope_type": "linear", "factor": "x"}, "'factor' of the rotary embedding must be a number, got 'x'"),
])
def test_a_malformed_rope_scaling_is_named(scaling, words):
    """transformers' own error for these is a bare ValueError ('dictionary update sequence ...')."""
    from trainfit.errors import ConfigError
    from trainfit.models.hf_config import spec_from_config

    cfg = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4,
           "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 2000, "max_position_embeddings": 512,
           "rope_scaling": scaling}
    with pytest.raises(ConfigError, match=words):
        spec_from_config(cfg, "t")
