"""`trainfit plan --mode serve` (plan/serve.py): the cheapest GPUs and TP that serve N sequences under vLLM.
Truths by hand: weights that cannot fit one GPU, heads that TP must divide, a decode bound by memory bandwidth."""
from __future__ import annotations

import json

import pytest

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


def _sglang_base(**kw):
    return Setup(mode="serve", server="sglang", precision="bf16", **kw)


def test_sglang_plan_picks_the_cheapest_of_a_hand_enumeration():
    """Llama-3.1-8B, 10 sequences of its 131,072 tokens, H100-80GB ($3/h; 81,559 MiB), SGLang's defaults.
    By hand, per TP degree (free at start = 81,559 MiB − 400 MiB context − NCCL (24 channels on NVSwitch H100s:
    12 MiB each at tp 2, 24 MiB from tp 4; tests/test_overheads.py) − SGLang's custom all-reduce 36 MiB: 324 MiB at
    tp 2, 612 MiB from tp 4;
    fraction from memory_hook.py as in test_serving_sglang; weights ≈ 8.03e9 × 2 B / tp; cell = 8/tp heads × 256
    × 32 layers × 2 B):
      tp 1: (79.26 GiB × 0.830 − 14.99 GiB) / 128 KiB = 416k tokens = 3.17 sequences -> 3 each, 4 replicas, 4 GPUs
      tp 2: (78.94 GiB × 0.828 − 7.51 GiB) / 64 KiB  = 948k tokens = 7.23 -> 7 each, 2 replicas, 4 GPUs
      tp 4: (78.66 GiB × 0.819 − 3.77 GiB) / 32 KiB  = 1.99M tokens = 15.2 -> 1 replica, 4 GPUs
      tp 8: (78.66 GiB × 0.812 − 1.90 GiB) / 16 KiB  = 4.06M tokens = 31.0 -> 1 replica, 8 GPUs
    $12/h for tp 1, 2 and 4, ranked by time per token: each GPU reads its weights and its share of the KV of the
    sequences it decodes (10, 5, 3 at 65,536 tokens each) — tp 4: 3.77 GiB + 10 × 65,536 × 32 KiB = 23.8 GiB;
    tp 2: 7.51 + 5 × 65,536 × 64 KiB = 27.5 GiB; tp 1: 14.99 + 3 × 65,536 × 128 KiB = 39.0 GiB; tp 8 last
    ($24/h)."""
    gib = 2**30
    hand = {}
    for tp, pre, fraction, weights in ((1, 79.26, 0.830, 14.99), (2, 78.94, 0.828, 7.51), (4, 78.66, 0.819, 3.77),
                                       (8, 78.66, 0.812, 1.90)):
        cell = 8 // tp * 256 * 32 * 2
        per_replica = int((pre * fraction - weights) * gib / cell / 131072)
        replicas = -(-10 // per_replica)
        hand[tp] = (replicas, tp * replicas, weights * gib + -(-10 // replicas) * 65536 * cell)
    expected = sorted(hand, key=lambda tp: (hand[tp][1], hand[tp][2]))
    plans, why = serve_plans(load_model("llama-3.1-8b"), [get_gpu("H100-80GB")], 10, _sglang_base(), None, top=10)
    assert not why
    assert [(p.tp, p.replicas, p.gpus) for p in plans] == [(tp, *hand[tp][:2]) for tp in expected]
    assert [p.tp for p in plans] == [4, 2, 1, 8]
    assert plans[0].price_per_hour == 4 * 3.0


@pytest.mark.parametrize("server", ["sglang", "sglang==0.5.23"])
def test_sglang_plan_emits_sglangs_command(capsys, server):
    main(["plan", "llama-3.1-70b", "--mode", "serve", "--server", server, "--concurrency", "16",
          "--max-model-len", "8192", "--gpu", "H100-80GB", "--emit", "sglang"])
    captured = capsys.readouterr()
    argv = captured.out.split()
    assert argv[:3] == ["python", "-m", "sglang.launch_server"]
    # SGLang 0.5.23's own flags (arg_groups/fields/parallel.py tp_size, model.py context_length, schedule.py
    # mem_fraction_static: each field with dashes); the full list is checked in tests/analytic/test_serving_sglang.py
    assert {"--tp-size", "--context-length", "--mem-fraction-static", "--cuda-graph-max-bs-decode"} <= set(argv)
    # 70.6e9 × 2 B = 141 GB: over tp 2's 0.828 × 78.7 GiB = 65 GiB per GPU, so tp 4 is the smallest
    assert argv[argv.index("--tp-size") + 1] == "4" and argv[argv.index("--context-length") + 1] == "8192"
    assert "tp 4 on H100-80GB" in captured.err


def test_sglang_plan_refusals_exit_2(capsys):
    import pytest

    for argv in (["plan", "llama-3.1-8b", "--mode", "serve", "--server", "sglang", "--concurrency", "4", "--gpu",
                  "H100-80GB", "--emit", "vllm"],
                 ["plan", "llama-3.1-8b", "--server", "sglang", "--gpu", "H100-80GB"],
                 ["plan", "llama-3.1-8b", "--mode", "serve", "--server", "tgi", "--concurrency", "4", "--gpu",
                  "H100-80GB"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2 and len(err.splitlines()) == 1, err


def test_tp_is_a_search_constraint_before_the_top(cli):
    """--tp 8 --top 3 lists tp-8 plans: the degree is fixed before the ranking, not filtered out of the three cheapest
    (which, on one H100 type, are tp 1, 2 and 4 here); a degree that does not divide the heads is one line, exit 2."""
    spec, gpus, base = load_model("llama-3.1-8b"), [get_gpu("H100-80GB")], _base(max_model_len=8192)
    cheapest, _ = serve_plans(spec, gpus, 32, base, None, top=3)
    assert cheapest and all(p.tp != 8 for p in cheapest)
    fixed, why = serve_plans(spec, gpus, 32, base, None, top=3, tp=8)
    assert fixed and all(p.tp == 8 for p in fixed) and not why
    code, out, err = cli("plan", "llama-3.1-8b", "--mode", "serve", "--concurrency", "32", "--max-model-len", "8192",
                         "--gpu", "H100-80GB", "--tp", "8", "--top", "3", "--json")
    assert code == 0, err
    assert [p["tp"] for p in json.loads(out)["plans"]] == [8]
    code, out, err = cli("plan", "llama-3.1-8b", "--mode", "serve", "--concurrency", "32", "--gpu", "H100-80GB",
                         "--tp", "3")
    assert code == 2 and err.strip().splitlines() == [
        "error: --tp 3 does not divide the 32 attention heads of llama-3.1-8b; use a divisor of 32"]


@pytest.mark.parametrize("server,title", [("sglang==0.4.4", "(SGLang 0.4.4)"), ("vllm==0.11.0", "(vLLM 0.11.0)"),
                                          ("sglang", "(SGLang 0.5.23)")])
def test_the_plans_title_names_the_engine_and_release_modelled(capsys, server, title):
    """A versioned SGLang value was titled "(vLLM)": the title compared the value with "sglang" literally."""
    main(["plan", "llama-3.1-8b", "--mode", "serve", "--server", server, "--concurrency", "16",
          "--max-model-len", "4096", "--gpu", "H100-80GB"])
    assert title in capsys.readouterr().out


@pytest.mark.parametrize("how", [["--concurrency", "16", "--max-model-len", "8192"],
                                 ["--request-rate", "1", "--prompt-len", "2048", "--completion-len", "512"]])
def test_a_quantised_checkpoint_is_planned_as_it_loads(capsys, how):
    """DeepSeek-V3's config.json stores FP8 weights (quantization_config: e4m3 in 128 x 128 blocks, the DeepSeek-V3
    repo's README_WEIGHTS.md), which vLLM loads as stored: plan --mode serve sizes them so, as `estimate --mode serve`
    does (setup/request.py). In bf16 its 671B parameters (1.34 TB) fit on no 8 x 141 GB node; in FP8 (671 GB) they do.
    Before: every layout judged at bf16, nothing served."""
    main(["plan", "deepseek-v3", "--mode", "serve", "--gpu", "H200", *how, "--json"])
    out = json.loads(capsys.readouterr().out)
    assert out["plans"] and all(p["tp"] == 8 for p in out["plans"])
    spec = load_model("deepseek-v3")
    assert spec.checkpoint_quant == "fp8" and 671e9 * 2 > 8 * 141e9 > 671e9 * 1


def test_the_estimate_says_the_quantisation_is_the_checkpoints(capsys):
    """`estimate deepseek-v3 --mode serve`: --quant fp8 comes from its config.json, and the title says so; a --quant
    the user gives on a 16-bit checkpoint is not called the checkpoint's."""
    main(["estimate", "deepseek-v3", "--mode", "serve", "--gpu", "H200", "--tp", "8", "--json"])
    ds = json.loads(capsys.readouterr().out)
    main(["estimate", "llama-3.1-8b", "--mode", "serve", "--gpu", "H100-80GB", "--quant", "fp8", "--json"])
    llama = json.loads(capsys.readouterr().out)
    assert (ds["setup"]["quant"], ds["detail"]["serving"]["quant_as_stored"]) == ("fp8", True)
    assert (llama["setup"]["quant"], llama["detail"]["serving"]["quant_as_stored"]) == ("fp8", False)
