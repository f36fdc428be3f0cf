"""The bench index and runner (bench/index.py, bench/__main__.py) and the figures writer (bench/figures.py)."""
import ast
import json

import pytest

from bench import __main__ as runner, figures, index

HELPERS = {"time_runs", "device", "accelerate_anchor", "deepspeed_anchor", "llm_analysis_anchor",
           "ulysses_cpu", "fsdp_qlora_c9", "alst_c10", "snapshots"}  # no main(argv): probes and rows other modules import


def test_every_runnable_module_is_in_the_index_once():
    names = [e.name for e in index.entries()]
    assert len(names) == len(set(names))
    for kind in index.KINDS:
        for path in (index.HERE / kind).glob("*.py"):
            has_main = any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in ast.parse(path.read_text()).body)
            if path.stem != "__init__" and path.stem not in HELPERS:
                assert has_main and path.stem in names, path


def test_unknown_name_exits_2(capsys):
    assert runner.main(["run", "no_such_benchmark"]) == 2
    assert "no_such_benchmark" in capsys.readouterr().err


def test_arguments_after_the_name_reach_the_module(capsys):
    assert runner.main(["run", "vision_time_published", "--help"]) == 0
    assert "usage" in capsys.readouterr().out


def test_positional_arguments_after_the_name_reach_the_module(monkeypatch):
    seen = []
    monkeypatch.setattr(runner, "run_one", lambda e, quick, args: seen.append((e.name, args)) or 0)
    assert runner.main(["run", "kernels_replay", "bench/results/gpu/x.json", "--rows"]) == 0
    assert seen == [("kernels_replay", ["bench/results/gpu/x.json", "--rows"])]
    seen.clear()
    assert runner.main(["run", "speed", "plan_speed"]) == 0
    assert seen == [("speed", []), ("plan_speed", [])]


def test_record_writes_the_schema(tmp_path, monkeypatch):
    monkeypatch.setattr(figures, "results_dir", lambda: tmp_path)
    path = figures.record("x", "a title", None, "1 of 1", {"n": 1}, "speed", quick=True)
    data = json.loads(path.read_text())
    assert data["command"] == "python -m bench run --quick x" and data["area"] == "speed" and data["machine"]
    with pytest.raises(ValueError):
        figures.record("x", "t", None, "f" * 121, {}, "speed")


@pytest.mark.parametrize("name, short", [
    ("AMD EPYC", "AMD EPYC"),
    ("AMD EPYC 9654 96-Core Processor", "AMD EPYC 9654"),
    ("Intel(R) Xeon(R) Platinum 8480+ CPU @ 2.00GHz", "Intel Xeon Platinum 8480+"),
    ("Intel(R) Core(TM) i9-13900K", "Intel Core i9-13900K"),
    ("", "CPU"),
])
def test_the_cpu_model_is_shortened(name, short):
    assert figures.cpu_model(name) == short


def test_the_machine_line_names_model_isa_and_cores():
    from trainfit.analytic.onednn import effective_isa

    model, isa, cores = figures.cpu_machine().split(", ")
    assert model and isa in ("AMX", "AVX512-BF16", "AVX-512", "AVX2-VNNI-2", "AVX2", "no AVX2") and \
        cores.endswith(" cores")
    assert (isa == "AMX") is (effective_isa() or "").startswith("avx512_core_amx")  # (oneDNN's, capped or not)


def test_pct_signs_only_what_does_not_round_to_zero():
    assert figures.pct(-0.235) == "−23.5 %" and figures.pct(0.0123, digits=2) == "+1.23 %"
    assert figures.pct(-0.00001, digits=2) == "0.00 %" and figures.pct(-0.5, signed=False) == "50.0 %"
