"""`trainfit plan --mode serve --request-rate` (plan/serve.py serve_rate_plans): replicas = ceil(rate / what one
replica completes within the targets), each replica at its share of the rate."""
from __future__ import annotations

import json
import math

import pytest

from trainfit.analytic.params import count_params
from trainfit.cli import main
from trainfit.hardware import get_gpu
from trainfit.models.resolve import load_model
from trainfit.plan.serve import _load, serve_rate_plans, server_model
from trainfit.setup import Setup

GPU = get_gpu("H100-80GB")
BASE = Setup(mode="serve", precision="bf16", prompt_len=256, completion_len=64, max_model_len=320)


@pytest.fixture(scope="module")
def engine():
    spec = load_model("qwen2.5-0.5b")
    sv = server_model(BASE).serve_memory(spec, BASE, GPU)
    # vLLM 0.33's max_num_seqs on a GPU of 70 GiB or more (engine/arg_utils.py:2970-3006: 1024) binds, not the KV
    held = min(sv.max_sequences, sv.kv_tokens // 320)

    def rate(c):  # requests/s one engine completes at c in flight: running / a request's life
        st = _load(spec, BASE, GPU, count_params(spec), sv, c)
        return st.running / (st.life_steps * st.tpot), st
    return spec, held, rate


def test_replicas_follow_rate_over_one_replicas_throughput(engine):
    spec, held, rate = engine
    assert held == 1024
    full, _ = rate(held)  # no target: a replica runs at what it holds at once
    for k, rps in ((1, 0.99 * full), (2, 1.5 * full), (3, 2.5 * full), (5, 4.2 * full)):
        plans, _ = serve_rate_plans(spec, [GPU], rps, BASE, None, None, tp=1)
        p = plans[0]
        assert p.replicas == k == math.ceil(rps / full)
        # its share at the fewest requests in flight that complete it
        share = rps / k
        assert rate(p.in_flight)[0] >= share > (rate(p.in_flight - 1)[0] if p.in_flight > 1 else 0)


def test_a_tpot_target_lowers_what_a_replica_takes(engine):
    """TPOT grows with the requests in flight, so a target caps them per replica: each replica runs at most the
    largest count that meets it, and the plan takes as many replicas as the rate over what one completes there.
    (At 1,024 in flight this 0.5B model's steps are the API server's, whose time grows with the tokens streamed: a
    replica completes about as many requests/s at fewer in flight, so the count may stay 2.)"""
    spec, held, rate = engine
    full, st = rate(held)
    target = 0.6 * st.tpot
    most = max(c for c in range(1, held + 1) if rate(c)[1].tpot <= target)  # every count, one by one
    plans, _ = serve_rate_plans(spec, [GPU], 2 * full, BASE, None, target, tp=1)
    p = plans[0]
    assert p.tpot_seconds <= target and p.in_flight <= most < held
    assert p.replicas == math.ceil(2 * full / rate(most)[0]) >= 2
    ttft = rate(1)[1].ttft
    plans, why = serve_rate_plans(spec, [GPU], full, BASE, 0.5 * ttft, None, tp=1)
    assert not plans and why[0].startswith("H100-80GB: TTFT")


def test_cli_json_emit_and_refusals(capsys):
    args = ["plan", "qwen2.5-0.5b", "--mode", "serve", "--request-rate", "40", "--prompt-len", "256",
            "--completion-len", "64", "--gpu", "H100-80GB", "--tp", "1"]
    main(args + ["--json"])
    out = json.loads(capsys.readouterr().out)
    assert out["request_rate"] == 40 and out["plans"][0]["replicas"] >= 1
    main(args + ["--emit", "vllm"])
    cmd = capsys.readouterr().out
    assert "vllm serve" in cmd and "--max-model-len 320" in cmd
    for extra, words in ((["--concurrency", "8"], "give one of them"),):
        with pytest.raises(SystemExit) as e:
            main(args + extra)
        assert e.value.code == 2 and words in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["plan", "qwen2.5-0.5b", "--mode", "serve", "--concurrency", "8", "--ttft-ms", "100", "--gpu", "H100-80GB"])
    assert e.value.code == 2 and "--request-rate" in capsys.readouterr().err


def test_cli_lengths_default_to_512_each(capsys):
    """--prompt-len and --completion-len are optional (512 each, as --help says): a rate alone plans, its engine
    command sized for 512 + 512 tokens; a non-positive length given is still refused."""
    args = ["plan", "qwen2.5-0.5b", "--mode", "serve", "--request-rate", "40", "--gpu", "H100-80GB", "--tp", "1"]
    main(args + ["--emit", "vllm"])
    assert "--max-model-len 1024" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        main(args + ["--prompt-len", "0"])
    assert e.value.code == 2 and "--prompt-len must be a positive integer" in capsys.readouterr().err


def test_estimate_names_the_replicas_a_rate_needs():
    from trainfit.api import Request, analytic

    e = analytic(Request(model="qwen2.5-0.5b", mode="serve", gpu="H100-80GB", concurrency=64, request_rate=100,
                         ttft_ms=50))
    load = e.detail.serving.load
    per = load["output_tokens_per_second"] / 512  # requests/s: each request's 512 output tokens (the default)
    note = next(n for n in e.notes if "--request-rate" in n)
    assert f"needs {math.ceil(100 / per)} replica(s)" in note
    assert ("within" if load["ttft_seconds"] * 1e3 <= 50 else "over") + " --ttft-ms 50" in note


@pytest.mark.parametrize("max_model_len, words", [
    ("300", "--max-model-len 300 is shorter than one request"),  # 256 + 64 = 320 tokens
    ("0", "--max-model-len must be a positive integer"),  # (was taken as no value: the default, one request)
])
def test_a_model_length_shorter_than_a_request_is_refused(capsys, max_model_len, words):
    """The server refuses a request longer than --max-model-len: the estimate of that engine serves none of them
    (0 tokens/s), so no number of its replicas serves a rate of them (the plan had sized one, and --emit printed
    `vllm serve ... --max-model-len 300` for 320-token requests)."""
    from trainfit.api import Request, analytic

    e = analytic(Request(model="qwen2.5-0.5b", mode="serve", gpu="H100-80GB", prompt_len=256, completion_len=64,
                         max_model_len=300))
    assert e.detail.serving.load == {} and e.time.tokens_per_second == 0
    assert any("the server refuses it" in n for n in e.notes)
    for out in ([], ["--json"], ["--emit", "vllm"]):
        with pytest.raises(SystemExit) as ex:
            main(["plan", "qwen2.5-0.5b", "--mode", "serve", "--request-rate", "40", "--prompt-len", "256",
                  "--completion-len", "64", "--max-model-len", max_model_len, "--gpu", "H100-80GB", *out])
        captured = capsys.readouterr()
        assert ex.value.code == 2 and words in captured.err and "vllm serve" not in captured.out
