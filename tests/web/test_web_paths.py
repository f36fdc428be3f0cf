"""The web app reads no file named by a request (issue 35): every field that names a model or a GPU (the model, the
gpu, and the settings trainfit.setup marks `names_model`) resolves from the catalogs under models.resolve's
catalog_only rule. A path is refused with one line naming the field, the same whether the path exists or not (no
existence or file-type oracle), and the server never opens, stats or lists it."""
from __future__ import annotations

import builtins
import json
import os
import shutil
import sys
import threading
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from trainfit import api  # noqa: E402
from trainfit.errors import GPUFileError, TrainfitError, UnknownGPUError, UnknownModelError  # noqa: E402
from trainfit.hardware import load_gpu_file, resolve_gpu  # noqa: E402
from trainfit.models import resolve  # noqa: E402
from trainfit.models.resolve import CATALOG_DIR  # noqa: E402
from trainfit.references import catalog_only_rule, shown  # noqa: E402
from trainfit.setup import SETTINGS, Request  # noqa: E402
from trainfit.web.app import catalog_only, create_app  # noqa: E402

MODEL_SETTINGS = [s for s in SETTINGS if s.meta.names_model]
FIELDS = ["model", "gpu", *(s.name for s in MODEL_SETTINGS)]
GPU = "H100-80GB"


def _base(field: str) -> dict:
    """A request in which `field` applies (its setting's first mode; rl with ppo, which takes a critic and a reward
    model)."""
    if field in ("model", "gpu"):
        return {"model": "llama-3.1-8b", "gpu": GPU}
    mode = next(s for s in MODEL_SETTINGS if s.name == field).meta.modes[0]
    return {"model": "llama-3.1-8b", "gpu": GPU, "mode": mode, **({"rl_algo": "ppo"} if mode == "rl" else {})}


ENDPOINTS = ["GET /api/estimate", "POST /api/estimate", "POST /api/view", "GET /api/timeline.svg"]


def _ask(client, endpoint: str, params: dict):
    method, url = endpoint.split()
    return client.get(url, params=params) if method == "GET" else client.post(url, json=params)


@pytest.fixture(scope="module")
def client():
    return TestClient(create_app())


@pytest.fixture
def disk(tmp_path, monkeypatch):
    """Paths, in pairs (one there, one not, the same length), and a record of every file-system access (open, stat,
    lstat, access, listdir, scandir: patched, and Python's audit events) to one of them."""
    model_dir = tmp_path / "m"
    model_dir.mkdir()
    shutil.copy(CATALOG_DIR / "llama-3.2-1b.json", model_dir / "config.json")
    (tmp_path / "gpu.json").write_text(json.dumps({"memory": 2**36}))
    deep = tmp_path / ("d" * 150) / ("e" * 150)  # a path of 300+ characters that exists
    deep.mkdir(parents=True)
    shutil.copy(CATALOG_DIR / "llama-3.2-1b.json", deep / "config.json")
    monkeypatch.chdir(tmp_path)
    there = [str(model_dir / "config.json"), str(model_dir), "m/config.json", "m", "gpu.json", str(deep),
             "/etc/passwd", "/proc/self/environ"]
    gone = [str(tmp_path / "n" / "config.json"), str(tmp_path / "n"), "n/config.json", "n", "gpx.json",
            str(tmp_path / ("f" * 150) / ("e" * 150)), "/etc/passwX", "/proc/self/environX"]
    assert all(os.path.exists(p) for p in there) and not any(os.path.exists(p) for p in gone)
    pairs = list(zip(there, gone)) + [("~/x", "~/y"), ("a" * 300, "b" * 300), ("x\x00y", "x\x00z")]

    watched = {os.path.abspath(os.path.expanduser(p)) for pair in pairs for p in pair if "\x00" not in p}
    touched: list[tuple[str, str]] = []

    def note(event: str, path) -> None:
        try:
            p = os.fsdecode(os.fspath(path))
        except TypeError:
            return  # a file descriptor
        if "\x00" in p or os.path.abspath(p) in watched or p.startswith(str(tmp_path)):
            touched.append((event, p))

    def spy(event: str, real):
        def wrapper(path, *args, **kwargs):
            note(event, path)
            return real(path, *args, **kwargs)
        return wrapper

    for name in ("stat", "lstat", "access", "listdir", "scandir"):
        monkeypatch.setattr(os, name, spy(f"os.{name}", getattr(os, name)))
    monkeypatch.setattr(builtins, "open", spy("open", builtins.open))
    _AUDIT.append(note)
    yield pairs, touched
    _AUDIT.remove(note)


_AUDIT: list = []


def _audit(event: str, args: tuple) -> None:  # audit hooks cannot be removed: one for the module, active in `disk`
    if _AUDIT and event in ("open", "os.listdir", "os.scandir") and args:
        for note in list(_AUDIT):
            note(f"audit {event}", args[0])


sys.addaudithook(_audit)


def test_the_model_settings_are_marked_in_their_definition():
    # the fields that name a model, found from SETTINGS: the draft of speculative decoding, PPO's critic, the reward
    assert {s.name for s in MODEL_SETTINGS} == {"draft_model", "critic_model", "reward_model"}


@pytest.mark.parametrize("endpoint", ENDPOINTS)
@pytest.mark.parametrize("field", FIELDS)
def test_a_path_is_refused_alike_whether_it_exists_or_not_and_never_touched(client, disk, field, endpoint):
    pairs, touched = disk
    what = "GPU" if field == "gpu" else "model"
    for there, gone in pairs:
        bodies = []
        for p in (there, gone):
            r = _ask(client, endpoint, {**_base(field), field: p})
            assert r.status_code == 400, (p, r.text)
            error = r.json()["error"]
            assert error.startswith(f"{field} {shown(p)}: unknown {what}; the web app takes catalog"), error
            assert "\n" not in error
            bodies.append(r.text.replace(json.dumps(shown(p), ensure_ascii=False)[1:-1], "<P>"))
        assert bodies[0] == bodies[1], (there, gone)  # no oracle: existence and file type change nothing
    assert touched == [], touched


def test_a_pasted_config_with_a_draft_path_is_refused_untouched(client, disk):
    pairs, touched = disk
    cfg = json.loads((CATALOG_DIR / "llama-3.2-1b.json").read_text())
    for p, _ in pairs:
        r = client.post("/api/view", json={"config": cfg, "gpu": GPU, "mode": "serve", "draft_model": p})
        assert r.status_code == 400 and r.json()["error"].startswith(f"draft_model {shown(p)}: unknown model")
    assert touched == []


@pytest.mark.parametrize("field", [s.name for s in MODEL_SETTINGS])
def test_catalog_names_and_hub_ids_still_resolve(client, field):
    """The rule refuses paths, not models: each field's example (a catalog name) and the catalog's hub id for it."""
    example = next(s for s in MODEL_SETTINGS if s.name == field).meta.example
    hub_id = resolve.catalog_entry(example)["hf_id"]
    for ref in (example, hub_id):
        r = client.post("/api/estimate", json={**_base(field), field: ref})
        assert r.status_code == 200, r.text
        assert r.json()["setup"][field] == ref


def test_a_hub_id_the_catalog_knows_is_its_catalog_model(client):
    by_id = client.get("/api/estimate", params={"model": "meta-llama/Llama-3.1-8B", "gpu": GPU}).json()
    assert by_id["model"] == "llama-3.1-8b"
    # the published total (Meta's model card: 8.03B), within the catalog's 2%
    assert by_id["params"] == pytest.approx(8.03e9, rel=0.02)


def test_the_rule_holds_in_the_endpoints_thread_and_nowhere_else(client, monkeypatch):
    """FastAPI runs a sync endpoint in a worker thread: the rule is entered there, in the endpoint's own execution,
    and never leaks into the caller's thread (the CLI in the same process keeps reading files)."""
    seen = []
    real = api.analytic

    def spy(req, *a, **k):
        seen.append((threading.get_ident(), catalog_only_rule()))
        return real(req, *a, **k)

    monkeypatch.setattr(api, "analytic", spy)
    assert client.get("/api/estimate", params={"model": "llama-3.2-1b", "gpu": GPU}).status_code == 200
    assert client.post("/api/view", json={"model": "llama-3.2-1b", "gpu": GPU}).status_code == 200
    assert len(seen) == 2
    for thread, rule in seen:
        assert thread != threading.get_ident() and rule is not None and "/api/models" in rule.models
    assert catalog_only_rule() is None


def test_the_engines_own_loads_obey_the_rule():
    """The rule lives where references are read, not in the web's form handling: a Request built directly (as a
    future endpoint might) still reads nothing, down to the engines' loads of the draft, critic and reward model."""
    cases = [dict(mode="serve", draft_model="/etc/passwd"), dict(mode="rl", rl_algo="ppo", critic_model="/etc/passwd"),
             dict(mode="rl", reward_model="/etc/passwd")]
    with catalog_only():
        for kw in cases:
            field = next(k for k in kw if k.endswith("_model"))
            with pytest.raises(UnknownModelError, match=f"^{field} '/etc/passwd': unknown model; the web app"):
                api.analytic(Request(model="llama-3.1-8b", gpu=GPU, **kw))
        with pytest.raises(UnknownGPUError, match="^gpu '/etc/passwd': unknown GPU; the web app"):
            resolve_gpu("/etc/passwd")
        with pytest.raises(UnknownGPUError, match="^gpu '/etc/passwd': unknown GPU"):
            load_gpu_file("/etc/passwd")  # the file reader itself refuses
        assert resolve.find_cached_config("meta-llama/Llama-3.1-8B") is None
    # outside the rule the same references are read (the CLI's purpose), each failing on its content
    with pytest.raises(TrainfitError, match="not valid JSON"):
        api.analytic(Request(model="llama-3.1-8b", gpu=GPU, **cases[0]))
    with pytest.raises(GPUFileError):
        load_gpu_file("/etc/passwd.json")
