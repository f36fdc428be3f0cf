"""`trainfit plan --mode serve` (plan/serve.py): the cheapest GPUs and TP that serve N sequences under vLLM.
Truths by hand: weights that cannot fit one GPU, heads that TP must divide, a decode bound by memory bandwidth."""
from __future__ import annotations

import json

from trainfit.cli import main
from trainfit.hardware import get_gpu
from trainfit.models.resolve import load_model
from trainfit.plan.serve import serve_plans, tp_degrees
from trainfit.setup import Setup


def _base(**kw):
    return Setup(mode="serve", precision="bf16", **kw)


def test_tp_must_divide_the_heads():
    assert tp_degrees(load_model("gpt2"), get_gpu("H100-80GB")) == [1, 2, 4]  # 12 heads
    assert tp_degrees(load_model("llama-3.1-8b"), get_gpu("A10")) == [1, 2, 4]  # 4 GPUs per node


def test_70b_needs_more_than_one_80gb_gpu():
    """70.6e9 parameters x 2 B = 141 GB of weights: no single 80 GB GPU holds them."""
    plans, _ = serve_plans(load_model("llama-3.1-70b"), [get_gpu("H100-80GB")], 16, _base(max_model_len=8192), None)
    assert plans and all(p.tp >= 2 for p in plans)
    best = plans[0]
    assert best.replicas * best.sequences_per_replica >= 16


def test_a_latency_target_rules_out_slow_memory():
    """On L4s (300 GB/s) 70B at tp 8 reads 17.6 GB of weights per GPU per token: over 70 ms at 80 % of the
    bandwidth, so a 50 ms target leaves them out (with the reason), while H100s (3.35 TB/s) meet it."""
    plans, why = serve_plans(load_model("llama-3.1-70b"), [get_gpu("L4"), get_gpu("H100-80GB")], 8,
                             _base(max_model_len=4096), 0.050)
    assert plans and {p.gpu for p in plans} == {"H100-80GB"}
    assert any(line.startswith("L4:") and "ms per token" in line for line in why)


def test_cheapest_first_and_json(capsys):
    main(["plan", "llama-3.1-8b", "--mode", "serve", "--concurrency", "32", "--max-model-len", "8192",
          "--gpu", "H100-80GB,L4", "--json"])
    out = json.loads(capsys.readouterr().out)
    prices = [p["price_per_hour"] for p in out["plans"]]
    assert prices == sorted(prices) and out["plans"]
    assert all(p["gpus"] == p["tp"] * p["replicas"] for p in out["plans"])
