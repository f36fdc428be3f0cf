"""What the GPU holds, on the web (issue 13): the JSON API returns the allocated peak, reserved, the overheads and
the device total; the page shows them with the reports' one sentence; its verdict reads the fit rule (required
within the capacity).
Expected bytes are derived here from data/overheads.toml's entries and the model's shapes, not from trainfit's
functions."""
from __future__ import annotations

import html
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from fastapi.testclient import TestClient  # noqa: E402

from trainfit.analytic.fit_rule import segment_slack  # noqa: E402
from trainfit.analytic.memory import train_memory  # noqa: E402
from trainfit.api import resolve  # noqa: E402
from trainfit.data import load_toml  # noqa: E402
from trainfit.setup import Request  # noqa: E402
from trainfit.web.app import create_app  # noqa: E402

SRC = Path(__file__).resolve().parents[2] / "src" / "trainfit"
TOML = load_toml("overheads.toml")
GiB = 2**30
A100 = 85_100_068_864  # A100-80GB as CUDA reports it (deviceQuery, driver 555; nvidia-smi's 81920 MiB less 763 MiB)


@pytest.fixture(scope="module")
def client():
    return TestClient(create_app(), raise_server_exceptions=False)


def a100_context() -> int:
    """The CUDA context overheads.toml gives an A100: it is in no generation's `gpus` list, so the default entry."""
    ctx = TOML["cuda_context"]
    assert not any("A100-80GB" in e.get("gpus", ()) for e in ctx.values())
    return ctx["default"]["bytes"]


def nccl_communicator(ranks: int) -> int:
    """overheads.toml [nccl] for A100s (12 NVLinks, sm_80), by hand: 12 x 20 GB/s = 240 = 6 ring channels at 40 GB/s,
    doubled twice = 24 channels; P2P read (sm_80 NVLink): a receiver holds ncclRecvMem + LL + LL128, a sender
    ncclSendMem + SIMPLE, each rounded up to 2 MiB; a middle rank (ranks > 2) has 2 of each, no NVLS (sm_80)."""
    n = TOML["nccl"]
    assert n["gpus"]["A100-80GB"] == {"nvlinks": 12, "sm": 80}
    up = lambda b: -(-b // n["ipc_align_bytes"]) * n["ipc_align_bytes"]  # noqa: E731
    per_pair = up(n["recv_mem_bytes"] + n["ll_bytes"] + n["ll128_bytes"]) + up(n["send_mem_bytes"] + n["simple_bytes"])
    return 24 * (1 if ranks == 2 else 2) * per_pair


@pytest.mark.parametrize("dp", [1, 4])
def test_api_returns_allocated_reserved_and_device_total(client, dp):
    params = {"model": "llama-3.2-1b", "gpu": "A100-80GB"} | ({"dp": dp, "zero": 1} if dp > 1 else {})
    r = client.get("/api/estimate", params=params)
    assert r.status_code == 200, r.text
    d = r.json()
    m = d["memory"]
    assert d["setup"]["batch"] == 1 and d["setup"]["seq"] == 2048  # the defaults the numbers below assume
    # reserved = allocated peak + two cuBLAS workspaces (sm_80: 4096 KiB x 2 + 16 KiB x 8, CublasHandlePool.cpp; one
    # for the forward's thread, one for autograd's device thread) + one cached block of the loss's fp32 logits freed
    # before the peak (1 x 2048 tokens x vocab 128,256 x 4 B)
    workspace = 2 * (4096 * 1024 * 2 + 16 * 1024 * 8)
    assert workspace == 2 * TOML["cublas_workspace"]["other_bytes"] and "A100-80GB" not in TOML["cublas_workspace"]["sm90_gpus"]
    assert m["reserved"] >= m["peak"]
    # + at dp 1 the gradients' own segments free at the peak (analytic/grad_segments.py; tests/test_settings.py
    # GRAD_SEGMENTS by hand: 832 MiB); ZeRO-1 shards the states and steps flat buffers: none
    # never below what the fit requires (the required line below; overheads.device_memory)
    cached = m["peak"] + 1 * 2048 * 128_256 * 4 + (832 * 2**20 if dp == 1 else 0)
    assert m["reserved"] == max(cached, m["required"]) + workspace
    # device total = reserved + the CUDA context + one NCCL communicator per process group of > 1 rank (dp here)
    want = {"cuda_context": a100_context()} | ({"nccl_dp": nccl_communicator(dp)} if dp > 1 else {})
    assert m["overheads"] == want
    assert m["device_total"] == m["reserved"] + sum(want.values())
    # the fit rule (analytic/fit_rule.py): headroom = capacity - required, capacity = GPU memory - the cuBLAS
    # workspaces - the overheads (--reserve 0); required = the peak + the loss's logits block (pinned) + the
    # states' segment slack; the gradients' free segments and the other cached blocks are released at the OOM retry
    assert d["fit"]["capacity"] == A100 - workspace - sum(want.values())
    spec, setup = resolve(Request(**params))
    slack = segment_slack(spec, setup, train_memory(spec, setup))
    assert m["required"] == m["peak"] + 1 * 2048 * 128_256 * 4 + slack
    assert d["time"]["headroom"] == d["fit"]["capacity"] - m["required"] and d["time"]["fits"] is True


def test_page_verdict_reads_the_fit_rule(client):
    """A GPU cut between what the step needs (required + the fixed overheads) and the device total: the job fits,
    since a run near capacity gets its cached free segments back at the OOM retry; one cut between the allocated
    peak and the need does not."""
    base = {"model": "llama-3.2-1b", "gpu": "A100-80GB"}
    d = client.get("/api/estimate", params=base).json()
    m = d["memory"]
    fixed = A100 - d["fit"]["capacity"]
    need = m["required"] + fixed
    assert m["peak"] + fixed < need < m["device_total"]
    between = (need + m["device_total"]) / 2 / GiB  # GiB, as --gpu-memory takes it
    v = client.post("/api/view", json=base | {"gpu_memory": between}).json()
    s = v["summary"]
    assert s["fits"] is True and s["device_total"] == m["device_total"] and "required" in s["judged_text"]
    assert s["headroom"] == int(between * GiB) - need
    short = client.post("/api/view", json=base | {"gpu_memory": (m["peak"] + fixed + need) / 2 / GiB}).json()
    assert short["summary"]["fits"] is False
    held = {r["key"]: r["bytes"] for r in v["held"]["rows"]}
    assert held == {"peak": m["peak"], "required": m["required"], "reserved": m["reserved"],
                    "overhead:cuda_context": a100_context(), "device_total": m["device_total"]}
    assert "what nvidia-smi shows" in v["held"]["sentence"]


def test_page_has_the_held_rows_and_the_reports_sentence(client):
    page = client.get("/").text
    for element in ('id="held-peak"', 'id="required"', 'id="reserved"', 'id="overheads"', 'id="device-total"', 'id="held-note"'):
        assert element in page
    assert "reserved (caching allocator)" in page and "device total (nvidia-smi)" in page
    assert html.escape("reserved is what PyTorch's caching allocator holds") in page


def test_the_sentence_has_one_definition():
    """The web page, the HTML report and the timeline take the sentence from report/held.py, not a copy."""
    phrase = "reserved is what PyTorch's caching allocator"
    hits = [p.relative_to(SRC).as_posix() for p in SRC.rglob("*.py") if phrase in p.read_text()]
    assert hits == ["report/held.py"]


def test_bad_gpu_memory_is_still_a_4xx(client):
    for bad in ({"gpu_memory": -1}, {"gpu_memory": "lots"}, {"gpu_memory": 40}):  # the last: no --gpu to cap
        body = {"model": "llama-3.2-1b"} | bad | ({} if bad == {"gpu_memory": 40} else {"gpu": "A100-80GB"})
        r = client.post("/api/view", json=body)
        assert r.status_code in (400, 422) and "gpu_memory" in r.json()["error"].replace("-", "_"), r.text
