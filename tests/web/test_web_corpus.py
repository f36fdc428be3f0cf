"""The generated bad-input corpus of the web API (issue 35): every setting as a query parameter and as a JSON body
field, fed malformed, negative, zero, NaN, infinite, overflowing, overlong and NUL-carrying values, and values of the
wrong JSON type (list, object, bool); every setting in a mode it does not apply to; paths for every file-like field
(the server reads no file a request names). Generated from trainfit.setup.SETTINGS.

Accepted outcome: 400 or 422 with the body {"error": "<one line>"}: never a 500, never a hang (a SIGALRM guard), never
a 200 for a value the CLI refuses. The hand-written cases are in test_web_bad_inputs.py.
"""
from __future__ import annotations

import signal

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from fastapi.testclient import TestClient  # noqa: E402

from trainfit.setup import MODES, SETTINGS  # noqa: E402
from trainfit.web.app import create_app  # noqa: E402

GUARD_S = 10


@pytest.fixture(scope="module")
def client():
    return TestClient(create_app(), raise_server_exceptions=False)


def guarded(call):
    def alarm(signum, frame):
        raise TimeoutError(f"no answer within {GUARD_S} s")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(GUARD_S)
    try:
        return call()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def assert_one_line_error(r, *names: str) -> str:
    assert r.status_code in (400, 422), f"{r.status_code}: {r.text[:400]}"
    body = r.json()
    assert isinstance(body, dict) and list(body) == ["error"], body
    msg = body["error"]
    assert isinstance(msg, str) and msg.strip() and "\n" not in msg and "Traceback" not in msg, msg
    if names:
        assert any(n.lower() in msg.lower() for n in names), f"none of {names} in {msg[:300]!r}"
    return msg


# What a setting needs around it before its value is read (its mode; a GPU for serving and the run settings).
def context(s) -> dict:
    if s.meta.modes == ("serve",):
        return {"mode": "serve", "gpu": "H100-80GB"}
    if s.meta.modes == ("rl",):
        return {"mode": "rl", **({"rl_algo": "ppo"} if s.name == "critic_model" else {})}
    if "train" not in s.meta.modes:
        return {"mode": "infer"}
    if s.name in ("mfu", "tokens", "gpu_memory", "reserve"):
        return {"gpu": "T4"}
    if s.name == "price":
        return {"gpu": "T4", "tokens": "1e9"}
    return {}


def bad_texts(s) -> list[str]:
    """Text values (query parameters, or strings in a body) the setting must refuse."""
    m, t = s.meta, s.base_type
    common = ["abc", "1,2", "é", "x" * 10_000, "1\x00", "\x00"]
    if t is bool:
        return ["maybe", "2", "x" * 10_000, "\x00"]
    if t is int:
        above = [str(int(m.maximum) + 1)] if m.maximum is not None else []  # (one past the setting's own bound)
        out = common + ["0x10", "1.5", "-1", "nan", "inf", "-inf", "1e400", *above, str(10**30), "9" * 5_000]
        return out + (["0"] if m.choices is None and (m.minimum or 0) >= 1 else [])
    if t is float:
        out = common + ["-1", "nan", "inf", "-inf", "1e400", "-1e400", "9" * 5_000]
        out += ["0", "1e-400"] if m.above is not None else []
        return out + ([str(10**30)] if m.maximum is not None else [])
    if m.choices is not None:
        return common + ["1", str(m.choices[0]).upper() + "X"]
    return ["x" * 10_000, "\x00", "a\x00b"]


MODEL_FIELDS = ("draft_model", "critic_model", "reward_model")


def _names(s) -> tuple[str, ...]:
    return (s.flag, s.name, *(("model",) if s.name in MODEL_FIELDS else ()))


# (parameters, the setting): the full battery as query parameters of GET /api/estimate
GET_CASES = [pytest.param({"model": "tiny-llama", **context(s), s.name: v}, s.name,
                          id=f"{s.name}={v[:10]!r}{'...' if len(v) > 10 else ''}")
             for s in SETTINGS for v in bad_texts(s)]


@pytest.mark.parametrize("params,name", GET_CASES)
def test_bad_query_value(client, params, name):
    s = next(x for x in SETTINGS if x.name == name)
    assert_one_line_error(guarded(lambda: client.get("/api/estimate", params=params)), *_names(s))


WRONG_TYPES = {"list": [1], "object": {"a": 1}, "bool": True, "nan-text": "nan", "huge": 10**30, "negative": -1,
               "overlong": "x" * 10_000}


def _body_cases():
    for s in SETTINGS:
        for kind, v in WRONG_TYPES.items():
            if kind == "bool" and s.base_type is bool:
                continue  # a switch's own type
            if kind in ("huge", "negative") and s.base_type is not int and s.base_type is not float:
                continue  # (a number where text is expected: see the list/object cases)
            if kind == "negative" and (s.meta.minimum is None or s.meta.minimum < 0) and s.meta.above is None:
                continue
            if kind == "huge" and s.base_type is float and s.meta.maximum is None:
                continue  # a finite float without a bound is a value (a price, a budget)
            yield pytest.param({"model": "tiny-llama", **context(s), s.name: v}, s.name, id=f"{s.name}-{kind}")


BODY_CASES = list(_body_cases())


@pytest.mark.parametrize("body,name", BODY_CASES)
def test_bad_body_field(client, body, name):
    s = next(x for x in SETTINGS if x.name == name)
    r = guarded(lambda: client.post("/api/estimate", json=body))
    assert_one_line_error(r, *_names(s))


# every setting in a mode it does not apply to, through the web (the CLI's refusal: the same Request)
def _example(s):
    if s.base_type is bool:
        return "true"
    if s.meta.example and s.meta.example != str(s.default):
        return s.meta.example
    if s.meta.choices:
        return str(next(c for c in s.meta.choices if c != s.default))
    return str(s.default * 2)


INAPPLICABLE = [pytest.param(s.name, mode, id=f"{s.name}-in-{mode}") for s in SETTINGS for mode in MODES
                if mode not in s.meta.modes]


@pytest.mark.parametrize("name,mode", INAPPLICABLE)
def test_setting_outside_its_modes(client, name, mode):
    s = next(x for x in SETTINGS if x.name == name)
    params = {"model": "llama-3.1-8b", "mode": mode, "gpu": "H100-80GB", s.name: _example(s)}
    assert_one_line_error(guarded(lambda: client.get("/api/estimate", params=params)), s.flag)


# the file-like fields: the server opens no file a request names
PATHS = ["/dev/zero", "/dev/urandom", "/proc/self/environ", "/etc/passwd", "/", "../config.json", "~/.bashrc",
         "C:\\config.json", "/tmp/" + "m" * 300 + ".json", "./config.json"]
FILE_FIELDS = {"model": {}, "gpu": {"model": "tiny-llama"},
               "draft_model": {"model": "llama-3.1-8b", "mode": "serve", "gpu": "H100-80GB"},
               "critic_model": {"model": "qwen2.5-0.5b", "mode": "rl", "rl_algo": "ppo"},
               "reward_model": {"model": "qwen2.5-0.5b", "mode": "rl"}}
FILE_CASES = [pytest.param(field, path, id=f"{field}-{path[:16]}") for field in FILE_FIELDS for path in PATHS]


@pytest.mark.parametrize("field,path", FILE_CASES)
@pytest.mark.parametrize("method", ["get", "post"])
def test_file_like_field_names_no_file(client, method, field, path):
    """Refused as a name the web app does not take (a catalog name), without opening it."""
    params = {**FILE_FIELDS[field], field: path}
    if method == "get":
        r = guarded(lambda: client.get("/api/estimate", params=params))
    else:
        r = guarded(lambda: client.post("/api/estimate", json=params))
    assert "catalog" in assert_one_line_error(r)


def test_corpus_size():
    """At least the issue's 159 requests (generated: it grows with the settings)."""
    n = len(GET_CASES) + len(BODY_CASES) + len(INAPPLICABLE) + 2 * len(FILE_CASES)
    assert n >= 159, n
