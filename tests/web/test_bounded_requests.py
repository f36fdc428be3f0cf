"""The web server bounds each request's work (issue 35): past `create_app(time_limit=...)` the answer is a 503 and the
work stops; a client that disconnects stops its work too (trainfit/cancel.py)."""
import socket
import threading
import time

import pytest

pytest.importorskip("fastapi")
from starlette.testclient import TestClient  # noqa: E402

from trainfit import cancel  # noqa: E402
from trainfit.web import app as web  # noqa: E402


class Spinner:
    """Work that would run for ever, checking cancel.check() as the engines' loops do; `steps` is its progress."""

    def __init__(self):
        self.steps, self.stopped = 0, threading.Event()

    def __call__(self, *_):
        try:
            while True:
                cancel.check()
                self.steps += 1
                time.sleep(0.001)
        except cancel.Stopped:
            self.stopped.set()
            raise


def test_past_the_time_limit_a_503_and_the_work_stops(monkeypatch):
    spin = Spinner()
    monkeypatch.setattr(web, "view_with_advice", spin)
    client = TestClient(web.create_app(time_limit=0.5))
    t0 = time.perf_counter()
    r = client.post("/api/view", json={"model": "llama-3.1-8b"})
    took = time.perf_counter() - t0
    assert r.status_code == 503 and 0.5 <= took < 1.5, (r.status_code, took)
    assert r.json()["error"].startswith("stopped after 0.5 s (the time limit of `trainfit serve --time-limit`)")
    assert spin.stopped.wait(1.0)  # the worker thread left its loop
    steps = spin.steps
    time.sleep(0.2)
    assert spin.steps == steps  # no CPU spent after the answer


def test_fit_advice_stops_at_the_limit():
    """The engines' own loops check: fit advice for a setup that does not fit stops at an expired limit."""
    from trainfit import api
    from trainfit.studies.fit_advice import suggestions

    spec, setup = api.resolve(api.Request("llama-3.1-8b", gpu="H100-80GB"))
    work = cancel.Work(0.0)
    with cancel.running(work), pytest.raises(cancel.Stopped, match="stopped after 0 s"):
        suggestions(spec, setup, api.load_gpu("H100-80GB"))


def test_a_disconnected_client_stops_its_work(monkeypatch):
    uvicorn = pytest.importorskip("uvicorn")
    spin = Spinner()
    monkeypatch.setattr(web, "view_with_advice", spin)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(web.create_app(time_limit=60), host="127.0.0.1", port=port,
                                           log_level="error", timeout_graceful_shutdown=web.SHUTDOWN_GRACE))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        body = b'{"model": "llama-3.1-8b"}'
        with socket.create_connection(("127.0.0.1", port)) as c:
            c.sendall(b"POST /api/view HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            while spin.steps == 0:  # the work has started
                time.sleep(0.01)
        assert spin.stopped.wait(2.0)  # the client went away: the work stopped well before its 60 s
    finally:
        server.should_exit = True
        thread.join(5)
    assert not thread.is_alive()


def test_a_trace_stops_at_the_limit_and_the_process_lives():
    """The trace engine's matrix products check (trace/recorder.py CANCEL_POINTS): a 70B timeline trace, which runs
    for tens of seconds here, stops within a second of its limit, raising Stopped in its own thread; raising from
    every dispatched op had aborted the whole process."""
    pytest.importorskip("torch")
    from trainfit import api

    api.trace(api.Request("tiny-llama"))  # imports are not interruptible: pay them before the clock starts
    req = api.Request("llama-3.1-70b", batch=8, seq=8192)
    work, out = cancel.Work(1.0), {}

    def body():
        t0 = time.monotonic()
        try:
            cancel.run(work, api.trace, req, extrapolate=True)
        except cancel.Stopped as e:
            out["stopped"] = (str(e), time.monotonic() - t0)

    t = threading.Thread(target=body)
    t.start()
    t.join(30)
    assert not t.is_alive() and "stopped" in out, out
    why, took = out["stopped"]
    assert why.startswith("stopped after 1 s") and took < 3.0, out


def test_stopping_the_server_answers_the_running_requests(monkeypatch):
    """Ctrl-C (trainfit serve's handle_exit -> stop_all): a running request is answered 503 at once and its work
    stops, before uvicorn's grace period would cancel it with a 500 and a traceback in the log."""
    spin = Spinner()
    monkeypatch.setattr(web, "view_with_advice", spin)
    app = web.create_app(time_limit=60)
    client = TestClient(app)

    def ctrl_c():
        while spin.steps == 0:  # the request is computing
            time.sleep(0.01)
        web.stop_all(app)

    threading.Thread(target=ctrl_c, daemon=True).start()
    t0 = time.perf_counter()
    r = client.post("/api/view", json={"model": "llama-3.1-8b"})
    assert r.status_code == 503 and r.json()["error"] == "stopped: the server is stopping", r.text
    assert time.perf_counter() - t0 < 2.0 and spin.stopped.wait(1.0)


def test_a_long_hybrid_pattern_is_linear_work():
    """A pasted Nemotron-H config.json whose hybrid_override_pattern lists 100,000 blocks: each layer's backward
    moment summed the gradients of every layer after it (analytic/phases.py _mixed_layer_moments: n**2 / 2
    additions, 5e9 here), so the request ran past the limit (a 503) and its thread went on for minutes after; now one
    pass (about a second)."""
    client = TestClient(web.create_app(time_limit=10), raise_server_exceptions=False)
    config = {"model_type": "nemotron_h", "hybrid_override_pattern": "M" * 100_000}
    r = client.post("/api/estimate", json={"config": config})  # (no --gpu: no fit advice to try)
    assert r.status_code == 200, r.text
    assert r.json()["memory"]["peak"] > 0


# the catalog model and layer-count key of each kind of per-layer walk a pasted config once reached (hf_config's
# counts, phases.Pattern's runs, a tower's blocks): tests/cli/test_bounded_depth.py tries every model_type's
DEEP = [("tiny-t5", ("num_layers",)), ("whisper-tiny", ("decoder_layers",)),
        ("tiny-qwen3-next", ("num_hidden_layers",)), ("tiny-llama4", ("num_hidden_layers",)),
        ("qwen1.5-moe-a2.7b", ("num_hidden_layers",)),
        ("llama-3.2-11b-vision", ("text_config", "num_hidden_layers")), ("qwen3-vl-2b", ("vision_config", "depth"))]


@pytest.mark.parametrize("depth", (10**9, 2**40))
@pytest.mark.parametrize("model, key", DEEP, ids=[m for m, _ in DEEP])
def test_a_pasted_config_of_a_huge_depth_answers_or_is_a_400(model, key, depth):
    """A layer count of 10**9 or 2**40 answers (200) or is refused in one line (400), within the time limit: not a 503
    (the limit), nor a 500 (a MemoryError)."""
    import json
    from importlib import resources

    config = json.loads((resources.files("trainfit.models.catalog") / f"{model}.json").read_text())
    (config[key[0]] if len(key) > 1 else config)[key[-1]] = depth
    client = TestClient(web.create_app(time_limit=20), raise_server_exceptions=False)
    r = client.post("/api/estimate", json={"config": config, "gpu": "H100-80GB"})
    assert r.status_code in (200, 400), r.text[:500]
    if r.status_code == 400:
        assert "\n" not in r.json()["error"], r.text
