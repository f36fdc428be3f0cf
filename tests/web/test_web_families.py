"""Every mode and every model family through the web app (FastAPI TestClient): /api/view answers the engine's
numbers (200) or the library's own one-line refusal (400), never a 500; the would-fit advice of each mode fits
when applied; the timeline draws for one small model of each family. The families are /api/models' own."""
from __future__ import annotations

import importlib.util
import shlex

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from fastapi.testclient import TestClient  # noqa: E402

from trainfit import api  # noqa: E402
from trainfit.errors import TrainfitError  # noqa: E402
from trainfit.setup import BY_NAME  # noqa: E402
from trainfit.web.app import _models, create_app  # noqa: E402

MODES = BY_NAME["mode"].meta.choices
GPU = "H100-80GB"


def smallest_of_each_family() -> dict[str, str]:
    """{family: its smallest model}, from what /api/models serves."""
    best: dict[str, dict] = {}
    for m in _models():
        if m["family"] not in best or m["params"] < best[m["family"]]["params"]:
            best[m["family"]] = m
    return {f: m["name"] for f, m in sorted(best.items())}


SMALLEST = smallest_of_each_family()


@pytest.fixture(scope="module")
def client():
    return TestClient(create_app(), raise_server_exceptions=False)


def test_the_families_are_the_catalogs(client):
    families = {m["family"] for m in client.get("/api/models").json()}
    assert families == set(SMALLEST)
    assert {"llama", "qwen2", "gemma", "mixtral", "deepseek_v3", "bert", "gpt2", "resnet", "vit"} <= families


def library_answer(req: api.Request):
    """The analytic estimate, or the one-line refusal the library itself gives (the CLI's `error:` line)."""
    try:
        return api.analytic(req)
    except TrainfitError as e:
        return str(e)


@pytest.mark.parametrize("family", list(SMALLEST))
@pytest.mark.parametrize("mode", MODES)
def test_view_answers_every_mode_and_family(client, mode, family):
    model = SMALLEST[family]
    r = client.post("/api/view", json={"model": model, "mode": mode, "gpu": GPU})
    expected = library_answer(api.Request(model=model, mode=mode, gpu=GPU))
    if isinstance(expected, str):  # refused: the same line, as a 400
        assert r.status_code == 400, r.text
        assert r.json() == {"error": expected.strip()} and "\n" not in expected.strip()
        return
    assert r.status_code == 200, r.text
    s = r.json()["summary"]
    assert s["peak"] == expected.memory.peak and s["fits"] is expected.time.fits
    assert s["time_text"] and "None" not in s["time_text"] and "nan" not in s["time_text"]


def test_every_mode_is_answered_for_a_token_model(client):
    """Not every combination may be refused: each mode draws for a catalog LLM."""
    for mode in MODES:
        r = client.post("/api/view", json={"model": "qwen2.5-0.5b", "mode": mode, "gpu": GPU})
        assert r.status_code == 200, (mode, r.text)


def applied(flags: str) -> dict:
    """A suggestion's CLI flags as Request fields: '--tp 2 --sequence-parallel' -> {'tp': 2, ...: True}."""
    words, out = shlex.split(flags), {}
    for i, w in enumerate(words):
        if w.startswith("--"):
            s = BY_NAME[w[2:].replace("-", "_")]
            out[s.name] = True if s.base_type is bool else s.base_type(words[i + 1])
    return out


@pytest.mark.parametrize("body", [
    {"model": "llama-3.1-8b", "gpu": "L4"},
    {"model": "llama-3.1-8b", "gpu": "L4", "mode": "serve"},  # judged on the device total (no fit rule): was a 500
    {"model": "llama-3.1-8b", "gpu": "L4", "mode": "rl"},
    {"model": "bert-large", "gpu": "L4", "mode": "infer", "batch": 4096, "seq": 512},  # an encoder: no decode
], ids=lambda b: b.get("mode", "train"))
def test_would_fit_advice_of_each_mode_fits_when_applied(client, body):
    v = client.post("/api/view", json=body).json()
    assert v["summary"]["fits"] is False and v["would_fit"], v
    for line in v["would_fit"]:
        flags = line.split(" (")[0]
        fixed = api.analytic(api.Request(**{**body, **applied(flags)}))
        assert fixed.time.fits, line


def test_a_vision_model_gets_no_transformer_advice(client):
    """The advice searches a transformer's knobs (api.fit_advice): none for an image model, as in the CLI."""
    v = client.post("/api/view", json={"model": "vit-l-16", "gpu": "L4", "batch": 1024}).json()
    assert v["summary"]["fits"] is False and v["would_fit"] == []


TINY = 50e6  # NB: a family whose smallest catalog model is larger (gemma-7b, mistral-7b, the MoEs, qwen3-0.6b,
# roberta-base) takes 3-15 s to trace, so its timeline runs with `-m heavy` (the trace engine's per-family
# checks are tests/trace's; what is the web's own is the SVG answer for each kind of model)
# The default run draws one timeline per kind of model: a dense decoder (llama), MoE (mixtral), a hybrid Mamba stack
# (nemotron_h), an encoder (bert), an encoder-decoder (t5), audio (whisper), a vision transformer (vit) and a
# convolution net (resnet). The other small families' timelines (gpt2, gpt_neox, opt, phi3, qwen2, gemma2,
# gemma3_text, gpt_oss, deepseek_v2/v3, llama4_text, qwen3_next, convnext: 3-30 s each) are in the heavy tier; their
# layers are traced by the default run's tests/analytic/test_vs_trace_families.py.
TIMELINE_KINDS = {"llama", "mixtral", "nemotron_h", "bert", "t5", "whisper", "vit", "resnet"}


def _timeline_case(family: str):
    params = {m["name"]: m["params"] for m in _models()}
    heavy = params[SMALLEST[family]] > TINY or family not in TIMELINE_KINDS
    return pytest.param(family, marks=[pytest.mark.heavy] if heavy else [])


@pytest.mark.skipif(importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None,
                    reason="the trace engine needs torch and transformers")
@pytest.mark.parametrize("family", [_timeline_case(f) for f in SMALLEST])
def test_timeline_of_each_family(client, family):
    """The trace engine's timeline as an SVG (a vision model's answered a 500 before: VisionSpec has no layers)."""
    model = SMALLEST[family]
    r = client.get("/api/timeline.svg", params={"model": model, "gpu": GPU})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("image/svg+xml")
    assert f"{model} — training step, memory timeline (trace engine)" in r.text  # its title, for this model


def test_timeline_refusals_are_one_line(client):
    for params in ({"model": "tiny-vit", "mode": "infer"}, {"model": "tiny-llama", "mode": "serve"}):
        r = client.get("/api/timeline.svg", params=params)
        assert r.status_code == 400 and "\n" not in r.json()["error"], r.text
