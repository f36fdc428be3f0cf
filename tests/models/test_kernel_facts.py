"""The kernel facts ModelSpec carries (dropouts, soft-capping, rotary share, MTP modules, the MoE router's options, the
classifier heads' dropout and bias, architectures) are resolved from a catalog config.json to the values transformers
itself takes from the same file: its config class (transformers.AutoConfig.for_model), or the head module it builds.
Both with the key as the checkpoint states it and with the key removed (the config class's default)."""
from __future__ import annotations

import json
from importlib import resources

import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from trainfit.models.hf_config import spec_from_config  # noqa: E402


def catalog(name: str) -> dict:
    text = resources.files("trainfit.models").joinpath(f"catalog/{name}.json").read_text()
    return {k: v for k, v in json.loads(text).items() if k != "_trainfit"}


def both(name: str, **changes):
    """(trainfit's spec, transformers' config) of the catalog config `name`; a change of None removes the key."""
    c = catalog(name)
    for k, v in changes.items():
        c.pop(k, None) if v is None else c.__setitem__(k, v)
    return spec_from_config(dict(c), name), hf_config(c)


def hf_config(c: dict):
    """transformers' config class for `c`, built from it."""
    return transformers.CONFIG_MAPPING[c["model_type"]](**{k: v for k, v in c.items() if k != "model_type"})


# (catalog model, the config attributes of its (embedding, attention, residual) dropouts; None: the family has none)
DROPOUT_ATTRS = [
    ("gpt2", ("embd_pdrop", "attn_pdrop", "resid_pdrop")),
    ("opt-125m", (None, "attention_dropout", "dropout")),
    ("bert-base", ("hidden_dropout_prob", "attention_probs_dropout_prob", "hidden_dropout_prob")),
    ("pythia-160m", (None, "attention_dropout", "hidden_dropout")),
    ("phi-3-mini", ("embd_pdrop", "attention_dropout", "resid_pdrop")),
    ("llama-3.1-8b", (None, "attention_dropout", None)),
]


@pytest.mark.parametrize("name,attrs", DROPOUT_ATTRS, ids=[n for n, _ in DROPOUT_ATTRS])
@pytest.mark.parametrize("stated", [True, False], ids=["stated", "default"])
def test_dropouts(name, attrs, stated):
    removed = {} if stated else {a: None for a in attrs if a}
    spec, hf = both(name, **removed)
    assert spec.dropouts == tuple(0.0 if a is None else float(getattr(hf, a)) for a in attrs)


@pytest.mark.parametrize("name", ["gemma-2-2b", "tiny-gemma2"])  # stated; absent (Gemma2Config's defaults)
def test_softcaps(name):
    spec, hf = both(name)
    assert (spec.attn_softcap, spec.final_softcap) == (hf.attn_logit_softcapping, hf.final_logit_softcapping) != (0, 0)
    spec, hf = both(name, attn_logit_softcapping=None)  # removed: the default again
    assert spec.attn_softcap == hf.attn_logit_softcapping == 50.0
    off = {**catalog(name), "attn_logit_softcapping": None, "final_logit_softcapping": None}
    hf = hf_config(off)
    spec = spec_from_config(off, name)
    assert hf.attn_logit_softcapping is hf.final_logit_softcapping is None
    assert spec.attn_softcap == spec.final_softcap == 0.0
    assert both("llama-3.1-8b")[0].final_softcap == 0.0


@pytest.mark.parametrize("name", ["pythia-160m", "phi-3-mini", "llama-3.1-8b"])
def test_rotary_fraction(name):
    spec, hf = both(name)
    assert spec.rotary_fraction == hf.rope_parameters.get("partial_rotary_factor", 1.0)


@pytest.mark.parametrize("name", ["deepseek-v3", "deepseek-v2-lite"])
def test_mtp_layers(name):
    # not a DeepseekV3Config field: transformers keeps the config.json key as an attribute (and builds no module)
    spec, hf = both(name)
    assert spec.mtp_layers == getattr(hf, "num_nextn_predict_layers", 0) == (1 if name == "deepseek-v3" else 0)


@pytest.mark.parametrize("name", ["qwen1.5-moe-a2.7b", "qwen3-30b-a3b", "deepseek-v3"])
@pytest.mark.parametrize("stated", [True, False], ids=["stated", "default"])
def test_router_norm_topk(name, stated):
    spec, hf = both(name, **({} if stated else {"norm_topk_prob": None}))
    assert spec.moe.norm_topk == hf.norm_topk_prob


def test_router_facts_transformers_does_not_configure():
    # MixtralTopKRouter always renormalises; DeepseekV2TopkRouter never does, whatever its config says
    assert both("mixtral-8x7b")[0].moe.norm_topk is True
    assert both("deepseek-v2-lite", norm_topk_prob=True)[0].moe.norm_topk is False


@pytest.mark.parametrize("stated", [True, False], ids=["stated", "default"])
def test_topk_method(stated):
    change = {"topk_method": "group_limited_greedy" if stated else None}
    spec, hf = both("deepseek-v2-lite", **change)
    assert spec.moe.topk_method == hf.topk_method == ("group_limited_greedy" if stated else "greedy")


def test_architectures_and_draft_vocab():
    spec, hf = both("llama-3.1-8b", draft_vocab_size=32000)
    assert spec.architectures == tuple(hf.architectures) == ("LlamaForCausalLM",)
    assert spec.draft_vocab == hf.draft_vocab_size == 32000
    assert both("llama-3.1-8b")[0].draft_vocab == 0


# the classifier heads transformers builds: (catalog model, head class, config change)
HEADS = [
    ("tiny-bert", "AutoModelForSequenceClassification", {}),
    ("tiny-bert", "AutoModelForTokenClassification", {"classifier_dropout": 0.3}),
    ("tiny-neox", "AutoModelForTokenClassification", {}),
    ("tiny-gpt2", "AutoModelForTokenClassification", {}),
    ("tiny-llama", "AutoModelForTokenClassification", {"token_classification_bias": False}),
    ("tiny-qwen2", "AutoModelForTokenClassification", {"classifier_dropout": 0.25}),
]


@pytest.mark.parametrize("name,cls,changes", HEADS, ids=[f"{n}-{c[12:]}-{bool(ch)}" for n, c, ch in HEADS])
def test_classifier_head_facts(name, cls, changes):
    c = {**catalog(name), **changes}
    spec = spec_from_config(c, name)
    with torch.device("meta"):
        model = getattr(transformers, cls).from_config(hf_config(c))
    assert spec.classifier_dropout == model.dropout.p
    out = getattr(model, "classifier", None) or model.score
    if cls.endswith("TokenClassification") and spec.family not in ("bert", "roberta"):
        assert spec.token_cls_bias == (out.bias is not None)
