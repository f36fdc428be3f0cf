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


def test_interleaving_depths_go_down_to_one_layer_a_chunk():
    """Megatron-Bridge's Qwen3-30B-A3B H100 recipe runs 48 layers on pp 2 with 24 virtual stages of one layer each
    (performance-summary-archive.md, 25.11 DGX-H100 row: PP 2 VP 24; bench/targets/time_runs.py): the search tries
    every depth that splits each stage's layers evenly (pipeline.check), that one included."""
    from trainfit.api import load_spec
    from trainfit.plan.space import Layout, Where, variants

    spec = load_spec("qwen3-30b-a3b")
    got = {v.vpp for v in variants(spec, Layout(8, 1, 2), Where(4096, 8), {"vpp"})}
    assert got == {v for v in range(1, 25) if 24 % v == 0} and 24 in got
    # Llama 3.1 405B's 126 layers with the embedding and the loss counted as layers (--pp-split embedding-loss):
    # 128 = 16 stages of 8, one layer a chunk at vpp 8 (Meta's layout, Llama 3 §3.3.2); 126 does not split evenly
    split = {(v.pp_split, v.vpp) for v in variants(load_spec("llama-3.1-405b"), Layout(8, 8, 16), Where(8192, 8),
                                                    {"pp_split", "vpp"})}
    assert ("embedding-loss", 8) in split and ("even", 8) not in split  # 126 + 2 = 16 x 8; 126 / 16 is not whole


def test_plans_megatron_warns_against_carry_its_warning_where_it_fires():
    """Megatron-LM warns against Megatron-FSDP (ZeRO 2/3) beside tensor or context parallelism below compute
    capability 10 (core_v0.16.1 megatron/training/arguments.py:927-940: get_device_arch_version() < 10): each plan
    with that layout on H100s carries the warning (terminal and JSON), none on B200s, where the check does not run,
    and none without TP/CP or with the distributed optimizer (ZeRO 1)."""
    warned = 0
    for gpu, fires in (("H100-80GB", True), ("B200", False)):
        r = CliRunner().invoke(app, ["plan", "llama-3.1-8b", "--stack", "megatron", "--gpus", "8", "--gpu", gpu,
                                     "--seq", "4096", "--top", "20", "--json"])
        assert r.exit_code == 0, r.output
        for c in json.loads(r.stdout)["candidates"]:
            s = c["setup"]
            flagged = any("Megatron-FSDP" in w for w in c.get("warnings", []))
            assert flagged == (fires and s["zero"] >= 2 and (s["tp"] > 1 or s["cp"] > 1)), s
            warned += flagged
    assert warned  # the H100 search ranks such a layout among its top 20
    text = CliRunner().invoke(app, ["plan", "llama-3.1-8b", "--stack", "megatron", "--gpus", "8", "--gpu",
                                    "H100-80GB", "--seq", "4096", "--top", "20"]).stdout
    assert "warning: Megatron-LM warns against Megatron-FSDP" in text


def test_estimate_prints_megatron_warning_under_every_engine_choice():
    """A MoE model under tensor parallelism without --sequence-parallel draws Megatron's own warning
    (model_parallel_config.py:440-445): the single-engine report and --engine all's side-by-side (which prints only
    the notes that begin "warning:") both show it, and a layout Megatron does not warn of shows none."""
    base = ["estimate", "qwen3-30b-a3b", "--stack", "megatron", "--dp", "4", "--ep", "4", "--etp", "1", "--seq", "1024",
            "--gpu", "H100-80GB"]
    for engine in ("analytic", "all"):
        warned = CliRunner().invoke(app, base + ["--tp", "2", "--engine", engine])
        assert warned.exit_code == 0, warned.output
        text = " ".join(warned.stdout.split())  # (the notes wrap at the terminal's width)
        assert "warning: Megatron warns that expert and tensor parallelism need --sequence-parallel" in text
        quiet = CliRunner().invoke(app, base + ["--tp", "2", "--sequence-parallel", "--engine", engine])
        assert quiet.exit_code == 0, quiet.output
        assert "Megatron warns" not in quiet.stdout


def test_emitted_plan_carries_its_warning_on_stderr():
    """--emit megatron prints the config alone on stdout and the plan's own warnings on stderr: the fastest plan of
    llama-3.1-8b on 8 H100s is Megatron-FSDP beside TP, which Megatron-LM warns against below compute capability 10
    (arguments.py:927-940); its JSON plan carries the same warning."""
    argv = ["plan", "llama-3.1-8b", "--stack", "megatron", "--gpus", "8", "--gpu", "H100-80GB", "--seq", "2048"]
    r = CliRunner().invoke(app, argv + ["--emit", "megatron"])
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith("torchrun ") and "warning" not in r.stdout
    best = json.loads(CliRunner().invoke(app, argv + ["--json"]).stdout)["candidates"][0]
    assert best["warnings"] and all(f"warning: {w}" in r.stderr for w in best["warnings"])
