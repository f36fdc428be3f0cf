"""The web app's JSON API (FastAPI TestClient): the same object as `trainfit estimate --json`, and bad inputs
answered with 400/422 and {"error": "<one line>"}, never a 500."""
from __future__ import annotations

import importlib.util
import json

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from fastapi.testclient import TestClient  # noqa: E402

from trainfit import api  # noqa: E402
from trainfit.report.json_out import dumps  # noqa: E402
from trainfit.web.app import create_app  # noqa: E402


@pytest.fixture(scope="module")
def client():
    return TestClient(create_app(), raise_server_exceptions=False)


def same_as_cli(req: api.Request) -> dict:
    # what `trainfit estimate --json` prints: the estimate with its advice where it does not fit (api.estimate_dict;
    # the CLI's own output is compared in test_estimate_is_the_cli_json_with_its_advice)
    return json.loads(dumps(api.estimate_dict(req, api.analytic(req))))


@pytest.mark.parametrize("params", [
    {"model": "llama-3.1-8b"},
    {"model": "llama-3.1-8b", "batch": 4, "seq": 4096, "gpu": "H100-80GB", "recompute": "full", "attention": "eager"},
    {"model": "llama-3.1-70b", "dp": 8, "tp": 8, "pp": 2, "grad_accum": 8, "zero": 1, "gpu": "H100-80GB",
     "stack": "megatron"},
    {"model": "mistral-7b", "mode": "infer", "batch": 16, "seq": 8192, "precision": "int8", "gpu": "L4"},
    {"model": "qwen2.5-7b", "optimizer": "sgd", "precision": "bf16-master", "device": "cpu", "mfu": 0.3,
     "tokens": 1e12, "price": 2.5, "gpu": "A100-80GB", "sequence_parallel": "false"},
    {"model": "llama-3.1-8b", "mode": "serve", "server": "sglang", "draft_model": "llama-3.2-1b", "gpu": "H100-80GB"},
    {"model": "qwen2.5-1.5b", "mode": "rl", "batch": 2, "rollout": "vllm", "beta": 0.04, "gpu": "H100-80GB"},
    {"model": "convnext-tiny", "batch": 32, "gpu": "A100-80GB"},
])
def test_estimate_is_exactly_the_cli_json(client, params):
    r = client.get("/api/estimate", params=params)
    assert r.status_code == 200, r.text
    kw = {k: (False if v == "false" else v) for k, v in params.items()}
    assert r.json() == same_as_cli(api.Request(**kw))


def test_a_number_past_the_float_range_is_null_as_in_the_cli_json(client):
    """--price 1e308 with --tokens 15T: the cost overflows to inf, which `trainfit estimate --json` writes as null
    (report/json_out.py); the routes answered 500 (starlette's JSONResponse refuses inf). Now the CLI's object."""
    params = {"model": "llama-3.1-8b", "gpu": "H100-80GB", "tokens": 1.5e13, "price": 1e308}
    ref = same_as_cli(api.Request(**params))
    assert ref["time"]["cost_usd"] is None and ref["time"]["gpu_hours"] > 0
    r = client.get("/api/estimate", params=params)
    assert r.status_code == 200, r.text
    assert r.json() == ref
    for route in ("/api/estimate", "/api/view"):
        r = client.post(route, json=params)
        assert r.status_code == 200, r.text
        assert r.json().get("estimate", r.json())["time"]["cost_usd"] is None


@pytest.mark.parametrize("mfu", [None, 0.4])
def test_the_page_shows_the_tokens_budget(client, mfu):
    """tokens and price are knobs on the page, but the view drew nothing of the budget they set (the CLI's rows
    "train on ... tokens" and "budget (GPU boards)"): a setting silently ignored. The timing line carries them."""
    from trainfit.report.terminal import budget_line
    from trainfit.units import fmt_seconds

    params = {"model": "llama-3.1-8b", "gpu": "H100-80GB", "tokens": 1.5e13, "price": 2,
              **({"mfu": mfu} if mfu else {})}
    t = api.analytic(api.Request(**params)).time
    r = client.post("/api/view", json=params)
    assert r.status_code == 200, r.text
    text = r.json()["summary"]["time_text"]
    assert f"train on 15.00 T tokens: {fmt_seconds(t.train_seconds)}" in text and budget_line(t) in text
    assert "$" in budget_line(t) and "GPU-h" in budget_line(t)


def test_pasted_config_matches_the_same_file(client, tmp_path):
    cfg = json.loads((api.__file__ and __import__("pathlib").Path(api.__file__).parent / "models" / "catalog" /
                      "llama-3.2-1b.json").read_text())
    cfg.pop("_trainfit")
    path = tmp_path / "my-model" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(cfg))
    ref = same_as_cli(api.Request(model=str(path), batch=2, gpu="A10G"))
    for config in (cfg, json.dumps(cfg)):  # an object or the pasted text
        r = client.post("/api/estimate", json={"config": config, "batch": 2, "gpu": "A10G"})
        assert r.status_code == 200, r.text
        got = r.json()
        for key in ("memory", "flops", "time", "params", "setup"):
            assert got[key] == ref[key]


def test_view_is_what_the_page_draws(client):
    r = client.post("/api/view", json={"model": "llama-3.1-8b", "batch": "8", "gpu": "H100-80GB", "precision": ""})
    assert r.status_code == 200, r.text
    v = r.json()
    # the estimate itself (the view carries the advice as the page's lines: would_fit beside it)
    assert v["estimate"] == json.loads(dumps(api.analytic(api.Request("llama-3.1-8b", batch=8, gpu="H100-80GB"))
                                             .to_dict()))
    assert v["summary"]["peak"] == v["estimate"]["memory"]["peak"]
    assert v["summary"]["fits"] is False and v["capacity"] == api.load_gpu("H100-80GB").memory
    assert [b["total"] for b in v["bars"]] == list(v["estimate"]["memory"]["phases"].values())
    assert all(sum(p["bytes"] for p in b["parts"]) == b["total"] for b in v["bars"])


def test_page_and_catalogs(client):
    r = client.get("/")
    assert r.status_code == 200 and 'id="batch"' in r.text and 'id="peak"' in r.text
    assert "https://" not in r.text and "<script src" not in r.text  # works offline
    models = client.get("/api/models").json()
    assert any(m["name"] == "llama-3.1-8b" for m in models)
    assert any(g["name"] == "H100-80GB" for g in client.get("/api/gpus").json())


BAD_GET = [
    ({"model": "no-such-model"}, 400, "unknown model"),
    ({}, 400, "choose a model"),
    ({"model": "llama-3.1-8b", "batch": 0}, 400, "--batch must be a positive integer"),
    ({"model": "llama-3.1-8b", "batch": -3}, 400, "--batch"),
    ({"model": "llama-3.1-8b", "seq": 0}, 400, "--seq"),
    ({"model": "llama-3.1-8b", "tp": 3}, 400, "does not divide the 32 attention heads"),
    ({"model": "llama-3.1-8b", "stack": "megatron", "pp": 5}, 400, "--pp 5 does not divide"),
    ({"model": "llama-3.1-8b", "zero": 3}, 400, "needs --dp > 1"),
    ({"model": "llama-3.1-8b", "zero": 7, "dp": 2}, 400, "--zero"),
    ({"model": "llama-3.1-8b", "gpu": "H900"}, 400, "unknown GPU"),
    ({"model": "llama-3.1-8b", "precision": "fp7"}, 400, "--precision"),
    ({"model": "llama-3.1-8b", "optimizer": "sgdx"}, 400, "--optimizer"),
    ({"model": "llama-3.1-8b", "mode": "serve"}, 400, "--mode"),
    ({"model": "llama-3.1-8b", "mfu": 3}, 400, "--mfu"),
    ({"model": "llama-3.1-8b", "tokens": -1}, 400, "--tokens"),
    ({"model": "llama-3.1-8b", "price": 2}, 400, "--price needs --gpu"),
    ({"model": "/etc/passwd"}, 400, "the web app takes catalog names"),
    ({"model": "../config.json"}, 400, "the web app takes catalog names"),
    ({"model": "llama-3.1-8b", "batch": "eight"}, 422, "batch"),
    ({"model": "llama-3.1-8b", "seq": "1.5"}, 422, "seq"),
    ({"model": "llama-3.1-8b", "sequence_parallel": "maybe"}, 422, "sequence_parallel"),
]


@pytest.mark.parametrize("params,status,words", BAD_GET)
def test_bad_inputs_get_one_line_errors(client, params, status, words):
    r = client.get("/api/estimate", params=params)
    assert r.status_code == status, r.text
    body = r.json()
    assert list(body) == ["error"] and words in body["error"] and "\n" not in body["error"]


BAD_POST = [
    ({"config": "{not json"}, "not valid JSON"),
    ({"config": "[1, 2]"}, "must hold a JSON object"),
    ({"config": "   "}, "choose a model"),
    ({"config": {"model_type": "llama"}}, "hidden_size"),
    ({"config": {"model_type": "nonsense", "hidden_size": 8}}, "model_type"),
    ({"config": {"model_type": "llama", "hidden_size": "big", "num_hidden_layers": 2, "num_attention_heads": 2,
                 "vocab_size": 10, "intermediate_size": 8}}, "hidden_size"),
    ({"config": {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 3,
                 "vocab_size": 10, "intermediate_size": 8}}, "not divisible"),
    ({"config": {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                 "num_key_value_heads": 4, "vocab_size": 10, "intermediate_size": 8,
                 "max_position_embeddings": 128}, "tp": 8}, "--tp 8"),
    ({"config": {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": -2, "num_attention_heads": 4,
                 "vocab_size": 10, "intermediate_size": 8}}, "num_hidden_layers"),
]


@pytest.mark.parametrize("body,words", BAD_POST)
def test_bad_pasted_configs_get_400(client, body, words):
    for route in ("/api/estimate", "/api/view"):
        r = client.post(route, json=body)
        assert r.status_code == 400, r.text
        assert list(r.json()) == ["error"] and words in r.json()["error"]


def test_malformed_request_bodies_are_422(client):
    r = client.post("/api/view", content=b"{oops", headers={"Content-Type": "application/json"})
    assert r.status_code == 422 and "error" in r.json()
    r = client.post("/api/view", json={"model": "llama-3.1-8b", "batch": [1, 2]})
    assert r.status_code == 422 and "batch" in r.json()["error"]


def test_timeline_endpoint_validates_before_tracing(client):
    r = client.get("/api/timeline.svg", params={"model": "llama-3.1-8b", "batch": 0})
    assert r.status_code == 400 and "--batch" in r.json()["error"]
    r = client.get("/api/timeline.svg", params={"model": "llama-3.1-8b", "tp": 2})
    assert r.status_code == 400 and "error" in r.json()  # the trace engine runs one unsharded rank


def test_host_memory_nothing_reads_is_named_or_refused_like_the_cli(client):
    """The estimates and the view carry `trainfit estimate`'s note where --host-memory judges nothing (api.
    HOST_MEMORY_UNREAD, api.host_memory_noted), the same object as the CLI's JSON; an offloading step reads it (no
    note); the timeline (the trace engine: no host memory judged) refuses it with a 400, before any trace."""
    from trainfit.api import HOST_MEMORY_UNREAD

    params = {"model": "gpt2", "gpu": "H100-80GB", "host_memory": 512}
    cli_json = json.loads(dumps(api.run_engines(api.Request(**params), "analytic")[0].to_dict()))
    assert HOST_MEMORY_UNREAD in cli_json["notes"]
    assert client.get("/api/estimate", params=params).json() == cli_json
    assert client.post("/api/estimate", json=params).json() == cli_json
    assert HOST_MEMORY_UNREAD in client.post("/api/view", json=params).json()["notes"]
    off = client.get("/api/estimate", params={**params, "offload": "optimizer"}).json()
    assert off["fit"]["host_required"] and HOST_MEMORY_UNREAD not in off["notes"]
    r = client.get("/api/timeline.svg", params=params)
    assert r.status_code == 400 and r.json()["error"].startswith("--host-memory is read by the analytic engine")
    assert r.json()["error"].endswith("drop host_memory")


def test_view_says_what_would_fit_like_the_cli(client):
    from trainfit.studies.fit_advice import fit_advice

    v = client.post("/api/view", json={"model": "llama-3.1-8b", "gpu": "H100-80GB"}).json()
    e = api.analytic(api.Request("llama-3.1-8b", gpu="H100-80GB"))
    assert not e.time.fits
    assert v["would_fit"] == fit_advice(api.load_spec("llama-3.1-8b"), e.setup, api.load_gpu("H100-80GB"))
    assert "would_fit" not in client.post("/api/view", json={"model": "llama-3.2-1b", "gpu": "H100-80GB"}).json()


@pytest.mark.skipif(importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None,
                    reason="the trace engine needs torch and transformers")
def test_timeline_at_a_models_default_sequence(client):
    """tiny-gpt2 has 512 learned positions: the timeline traces at its default sequence (api.trace resolves it as
    `trainfit estimate --engine trace` does), not at 2048."""
    r = client.get("/api/timeline.svg", params={"model": "tiny-gpt2", "batch": 1})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("image/svg+xml") and "<svg" in r.text


def test_estimate_is_the_cli_json_with_its_advice(client, cli):
    """Where the step does not fit, `trainfit estimate --json` adds what would (would_fit: the advice, checked by the
    analytic engine); /api/estimate (GET and POST) is that same object (api.estimate_dict), not the bare estimate."""
    code, out, _ = cli("estimate", "llama-3.2-1b", "--gpu", "T4", "--batch", "8", "--seq", "2048", "--json")
    cli_json = json.loads(out)
    assert code == 0 and not cli_json["time"]["fits"] and cli_json["would_fit"]
    params = {"model": "llama-3.2-1b", "gpu": "T4", "batch": 8, "seq": 2048}
    assert client.get("/api/estimate", params=params).json() == cli_json
    assert client.post("/api/estimate", json=params).json() == cli_json
