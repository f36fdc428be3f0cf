"""The planner's Megatron and DeepSpeed searches: Meta's published Llama 3 405B layout is found and fits."""
from __future__ import annotations

import json

from typer.testing import CliRunner

from trainfit.cli import app


def test_405b_megatron_plan_lists_metas_layout():
    # Dubey et al. 2024 (Llama 3) Table 4 / §3.3.2: 16,384 H100s, TP 8, CP 1, PP 16, DP 128, seq 8192, 16M tokens,
    # the first and last stages one layer short (embedding-loss)
    r = CliRunner().invoke(app, ["plan", "llama-3.1-405b", "--stack", "megatron", "--gpus", "16384", "--gpu",
                                 "H100-80GB", "--global-batch-tokens", "16M", "--seq", "8192", "--top", "100", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    meta = [c for c in out["candidates"] if (c["setup"]["tp"], c["setup"]["pp"], c["setup"]["cp"], c["setup"]["dp"])
            == (8, 16, 1, 128) and c["setup"]["pp_split"] == "embedding-loss"]
    assert meta
    assert any(c["memory"]["fits"] and c["memory"]["peak"] <= c["memory"]["capacity"] for c in meta)
    # (its search time is a target of bench/targets/plan_speed.py, not a test: a loaded machine is not a defect)


def test_deepspeed_plans_are_data_parallel():
    r = CliRunner().invoke(app, ["plan", "llama-3.1-8b", "--stack", "deepspeed", "--gpus", "8", "--gpu", "H100-80GB",
                                 "--seq", "4096", "--json"])
    assert r.exit_code == 0, r.output
    cands = json.loads(r.stdout)["candidates"]
    assert cands and all(c["setup"]["tp"] == 1 and c["setup"]["pp"] == 1 for c in cands)
