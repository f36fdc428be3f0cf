"""A corpus of bad requests to the web API: every one answered 400 or 422 with the body {"error": "<one line>"},
never a 500 and never a silently wrong answer (a 200). The web knobs are generated from, and validated by, the
one definition of the settings (trainfit/setup/settings.py).
"""
from __future__ import annotations

import json
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from fastapi.testclient import TestClient  # noqa: E402

from trainfit.web.app import create_app  # noqa: E402

TINY = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4,
        "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 2000, "max_position_embeddings": 512}
TINY_TEXT = json.dumps(TINY)


def cfg(**changes) -> dict:
    return {k: v for k, v in {**TINY, **changes}.items() if v is not None}




@pytest.fixture(scope="module")
def client():
    return TestClient(create_app(), raise_server_exceptions=False)


def _id(v) -> str:
    text = "&".join(f"{k}={str(x)[:24]}" for k, x in v.items()) if isinstance(v, dict) else repr(v)[:48]
    return text.replace("\n", " ")[:72] or "(empty)"


def assert_one_line_error(r, words: str | None = None) -> None:
    assert r.status_code in (400, 422), f"{r.status_code}: {r.text[:500]}"
    body = r.json()
    assert isinstance(body, dict) and list(body) == ["error"], body
    msg = body["error"]
    assert isinstance(msg, str) and msg.strip() and "\n" not in msg and "Traceback" not in msg, msg
    if words is not None:
        assert words.lower() in msg.lower(), msg


M = {"model": "llama-3.1-8b"}

BAD_GET = [
    # a parameter that is no knob: refused, never run at the default it would leave (a misspelt one named)
    ({**M, "bacth": 4}, "did you mean batch"),
    ({**M, "seq_len": 4096}, "unknown parameter"),
    # a pasted config.json as a query parameter: where it goes instead (not "did you mean config")
    ({"config": ""}, "JSON body of POST /api/estimate"),
    ({**M, "config": "/etc/passwd"}, "JSON body of POST /api/estimate"),
    # models
    ({"model": "no-such-model"}, "unknown model"),
    ({}, "choose a model"),
    ({"model": ""}, "choose a model"),
    ({"model": "   "}, "choose a model"),
    ({"model": "/etc/passwd"}, "catalog names"),
    ({"model": "../config.json"}, "catalog names"),
    ({"model": "~/config.json"}, "catalog names"),
    ({"model": "C:\\models\\config.json"}, "catalog names"),
    ({"model": "nobody/not-cached"}, "unknown model"),
    # sizes
    ({**M, "batch": 0}, "--batch"),
    ({**M, "batch": -1}, "--batch"),
    ({**M, "batch": "eight"}, "batch"),
    ({**M, "batch": "1.5"}, "batch"),
    pytest.param({**M, "batch": "9" * 400}, "--batch", id="batch=9x400"),
    ({**M, "seq": 0}, "--seq"),
    ({**M, "seq": -5}, "--seq"),
    ({**M, "seq": "4k"}, "seq"),
    ({**M, "grad_accum": 0}, "--grad-accum"),
    ({**M, "dp": 0}, "--dp"),
    ({**M, "tp": 0}, "--tp"),
    ({**M, "pp": 0}, "--pp"),
    # layouts
    ({**M, "tp": 3}, "--tp 3"),
    ({**M, "stack": "megatron", "pp": 5}, "--pp 5"),
    ({**M, "stack": "torchtitan", "pp": 2}, "--grad-accum"),
    ({**M, "pp": 2, "grad_accum": 2}, "--stack hf runs no pipeline split"),
    ({**M, "zero": 2}, "--dp"),
    ({**M, "zero": 7, "dp": 2}, "--zero"),
    ({**M, "sequence_parallel": "true"}, "--tp"),
    ({**M, "sequence_parallel": "maybe"}, "sequence_parallel"),
    ({"model": "gpt2", "seq": 2048}, "learned positions"),
    ({"model": "bert-base", "seq": 1024}, "learned positions"),
    ({"model": "opt-125m", "mode": "infer", "seq": 2048}, "learned positions"),
    # choices
    ({**M, "precision": "fp64"}, "--precision"),
    ({**M, "precision": "int4"}, "--precision"),
    ({**M, "mode": "infer", "precision": "bf16-master"}, "--precision"),
    ({**M, "optimizer": "sgdx"}, "--optimizer"),
    ({**M, "recompute": "sometimes"}, "--recompute"),
    ({**M, "attention": "magic"}, "--attention"),
    ({**M, "device": "tpu"}, "--device"),
    ({**M, "mode": "serve"}, "--mode"),
    ({**M, "mode": "infer", "kv_dtype": "int4"}, "--kv-dtype"),
    ({**M, "gpu": "H900"}, "unknown GPU"),
    ({**M, "gpu": "TPUv5"}, "unknown GPU"),
    # numbers
    ({**M, "gpu": "H100-80GB", "mfu": 0}, "--mfu"),
    ({**M, "gpu": "H100-80GB", "mfu": 3}, "--mfu"),
    ({**M, "gpu": "H100-80GB", "mfu": "nan"}, "--mfu"),
    ({**M, "gpu": "H100-80GB", "mfu": "inf"}, "--mfu"),
    ({**M, "gpu": "H100-80GB", "mfu": "forty"}, "mfu"),
    ({**M, "gpu": "H100-80GB", "tokens": -1}, "--tokens"),
    ({**M, "gpu": "H100-80GB", "tokens": 0}, "--tokens"),
    ({**M, "gpu": "H100-80GB", "tokens": "15X"}, "tokens"),
    ({**M, "gpu": "H100-80GB", "price": "cheap"}, "price"),
    ({**M, "price": 2}, "--price needs --gpu"),
]

BAD_GET_SETTINGS = [
    pytest.param({**M, "gpu": "H100-80GB", "tokens": "nan"}, "--tokens"),
    pytest.param({**M, "gpu": "H100-80GB", "tokens": "inf"}, "--tokens"),
    pytest.param({**M, "gpu": "H100-80GB", "price": "nan"}, "--price"),
    pytest.param({**M, "gpu": "H100-80GB", "price": "-2"}, "--price"),
    pytest.param({**M, "gpu": "H100-80GB", "price": "inf"}, "--price"),
    pytest.param({**M, "mode": "infer", "optimizer": "sgd"}, "optimizer"),
    pytest.param({**M, "mode": "infer", "recompute": "full"}, "recompute"),
    pytest.param({**M, "kv_dtype": "fp8"}, "kv"),
    pytest.param({**M, "tokens": "1e12"}, "gpu"),
]


@pytest.mark.parametrize("params,words", BAD_GET + BAD_GET_SETTINGS, ids=_id)
def test_bad_estimate_query(client, params, words):
    assert_one_line_error(client.get("/api/estimate", params=params), words)


BAD_BODIES = [
    ({"model": "gpt2", "config": TINY}, "not both"),  # (one would be dropped unsaid)
    ({"model": "llama-3.1-8b", "seqlen": 4096}, "did you mean seq"),
    # pasted config.json: text
    ({"config": "{not json"}, "not valid JSON"),
    ({"config": "[1, 2]"}, "JSON object"),
    ({"config": "NaN"}, None),
    ({"config": "   "}, "choose a model"),
    ({"config": "\x00\x01\x02binary"}, None),
    ({"config": TINY_TEXT.replace("256", "NaN", 1)}, "nan"),
    ({"config": TINY_TEXT.replace("688", "Infinity", 1)}, "inf"),
    ({"config": TINY_TEXT.replace("2000", "1e400", 1)}, "finite"),
    ({"config": TINY_TEXT[:-10]}, "not valid JSON"),
    # pasted config.json: object
    ({"config": {"model_type": "llama"}}, "hidden_size"),
    ({"config": {}}, None),
    ({"config": {"model_type": "nonsense", "hidden_size": 8}}, "model_type"),
    ({"config": {"model_type": "llava", "text_config": TINY}}, "multimodal"),
    ({"config": cfg(model_type=None)}, "model_type"),
    ({"config": cfg(hidden_size="big")}, "hidden_size"),
    ({"config": cfg(hidden_size=-256)}, "hidden_size"),
    ({"config": cfg(hidden_size=256.5)}, "hidden_size"),
    ({"config": cfg(hidden_size=True)}, "hidden_size"),
    ({"config": cfg(hidden_size=[256])}, "hidden_size"),
    ({"config": cfg(hidden_size=10**30)}, "hidden_size"),
    ({"config": cfg(num_attention_heads=3, num_key_value_heads=3)}, "not divisible"),
    ({"config": cfg(num_key_value_heads=3)}, "num_key_value_heads"),
    ({"config": cfg(vocab_size=0)}, "vocab_size"),
    ({"config": cfg(num_hidden_layers=-2)}, "num_hidden_layers"),
    ({"config": cfg(tie_word_embeddings="yes")}, "tie_word_embeddings"),
    # a quantization_config that is no object: was "cannot be estimated: AttributeError: 'str' object has no
    # attribute 'get'" (hf_config.quant_method read it as a dict)
    ({"config": cfg(quantization_config="fp8")}, "'quantization_config' must be a JSON object"),
    ({"config": cfg(quantization_config=[{"quant_method": "fp8"}])}, "'quantization_config' must be a JSON object"),
    ({"config": cfg(model_type="mixtral", num_local_experts=2, num_experts_per_tok=4)}, "num_experts_per_tok"),
    ({"config": cfg(), "tp": 16}, "--tp 16"),
    ({"config": cfg(), "zero": 1}, "--dp"),
    ({"config": cfg(), "gpu": "H900"}, "unknown GPU"),
    ({"config": json.loads(json.dumps({"model_type": "gpt2", "n_embd": 64, "n_head": 4, "n_layer": 2,
                                        "vocab_size": 50, "n_positions": 64})), "seq": 128}, "learned positions"),
    # knobs in the body
    ({"model": "llama-3.1-8b", "batch": [1, 2]}, "batch"),
    ({"model": "llama-3.1-8b", "batch": {"a": 1}}, "batch"),
    ({"model": "llama-3.1-8b", "batch": 0}, "--batch"),
    ({"model": "llama-3.1-8b", "seq": "long"}, "seq"),
    ({"model": "llama-3.1-8b", "mfu": 5}, "--mfu"),
    ({"model": "llama-3.1-8b", "precision": "fp7"}, "--precision"),
    ({"model": "no-such-model"}, "unknown model"),
    ({"model": "/etc/passwd"}, "catalog names"),
    ({"config": 42}, "config"),
    ({"config": [TINY]}, "config"),
]


@pytest.mark.parametrize("route", ["/api/estimate", "/api/view"])
@pytest.mark.parametrize("body,words", BAD_BODIES, ids=_id)
def test_bad_post_body(client, route, body, words):
    assert_one_line_error(client.post(route, json=body), words)


RAW_BODIES = [
    (b"{oops", "not valid JSON at character 1"),
    (b'{"model": ', "not valid JSON at character 10"),
    (b"", None),
    (b"[1, 2, 3]", None),
    (b'"just text"', None),
    (b'{"config": {"model_type": "llama", "hidden_size": NaN, "num_hidden_layers": 2}}', "nan"),
    (('{"config": ' + TINY_TEXT.replace("{", '{"rope_theta": Infinity, ', 1) + "}").encode(), "inf"),
    (b"\xff\xfe\x00{\x00}", None),
]


@pytest.mark.parametrize("route", ["/api/estimate", "/api/view"])
@pytest.mark.parametrize("raw,words", RAW_BODIES, ids=_id)
def test_malformed_request_body(client, route, raw, words):
    r = client.post(route, content=raw, headers={"Content-Type": "application/json"})
    assert_one_line_error(r, words)


@pytest.mark.parametrize("raw", [
    pytest.param(json.dumps({"config": "[" * 100_000 + "]" * 100_000}).encode(), id="pasted-text-nested-too-deep"),
    pytest.param(b'{"config": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", id="body-nested-too-deep"),
])
def test_nested_too_deep(client, raw):
    r = client.post("/api/estimate", content=raw, headers={"Content-Type": "application/json"})
    assert_one_line_error(r)


@pytest.mark.parametrize("layout", ["Et*99999999999|L", "Et*" + "9" * 5000 + "|L", "(t|)*1000000000"],
                         ids=["t*1e11", "t*(5000 digits)", "(t|)*1e9"])
def test_a_layout_unrolling_past_any_model_is_refused_at_once(client, layout):
    """--pp-split's Megatron layout repeats unroll up to pp_layout.MAX_UNROLLED characters: a repeat count of 10**11
    was a 500 (MemoryError), one of 5000 digits a 500 (int's digit limit), and (t|)*10**9 held the server for minutes
    building gigabytes of text (past its --time-limit: the unrolling holds the GIL)."""
    t0 = time.perf_counter()
    r = client.get("/api/estimate", params={**M, "stack": "megatron", "pp": 2, "grad_accum": 2, "pp_split": layout})
    assert_one_line_error(r, "unrolls to more than 1,048,576 characters")
    assert time.perf_counter() - t0 < 10


BAD_TIMELINE = [
    ({"model": "llama-3.1-8b", "zzz": 1}, "unknown parameter"),
    ({"model": "llama-3.1-8b", "batch": 0}, "--batch"),
    ({"model": "llama-3.1-8b", "tp": 2}, "--tp"),
    ({"model": "llama-3.1-8b", "pp": 2, "grad_accum": 2}, "--pp"),  # the trace runs one process: pipelines are analytic only
    ({"model": "no-such-model"}, "unknown model"),
    ({}, "choose a model"),
    ({"model": "/etc/passwd"}, "catalog names"),
    ({"model": "gpt2", "seq": 2048}, "learned positions"),  # the default seq adapts; a longer one is refused
    ({"model": "tiny-bert", "seq": 1024}, "learned positions"),
    ({"model": "tiny-gpt2", "mode": "infer", "seq": 512}, "learned positions"),
    ({"model": "roberta-base", "seq": 1024}, "learned positions"),
    ({"model": "tiny-llama", "mode": "infer", "precision": "int4"}, "int4"),
    ({"model": "tiny-llama", "precision": "fp64"}, "--precision"),
    ({"model": "tiny-llama", "seq": "long"}, "seq"),
]


@pytest.mark.parametrize("params,words", BAD_TIMELINE, ids=_id)
def test_bad_timeline_query(client, params, words):
    assert_one_line_error(client.get("/api/timeline.svg", params=params), words)


@pytest.mark.parametrize("route", ["/api/estimate", "/api/timeline.svg"])
def test_repeated_query_key(client, route):
    """batch=4&batch=8: one line naming the key, not the last value silently taken."""
    r = client.get(route, params=[("model", "llama-3.1-8b"), ("batch", "4"), ("batch", "8")])
    assert_one_line_error(r, "batch: given more than once")


def test_corpus_size():
    n = (len(BAD_GET) + len(BAD_GET_SETTINGS) + 2 * len(BAD_BODIES) + 2 * len(RAW_BODIES) + 2 + len(BAD_TIMELINE))
    assert n >= 60
