"""The planner: layout constraints, batch consistency, agreement with the analytic engine, a hand-checkable optimum,
'nothing fits', launch configs, bad inputs. Fast (no torch)."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from trainfit.analytic.engine import estimate
from trainfit.analytic.layout import validate_layout
from trainfit.analytic.memory import train_memory
from trainfit.api import load_spec
from trainfit.errors import SetupError, TrainfitError
from trainfit.hardware import get_gpu
from trainfit.plan import emit
from trainfit.plan.fit import PeakOracle
from trainfit.units import fmt_seconds
from trainfit.analytic.params import count_params
from trainfit.analytic.fit_rule import capacity
from trainfit.plan.search import PlanQuery, search
from trainfit.plan.space import Layout, batch_splits, layouts, tp_allowed
from trainfit.setup import Setup


@pytest.fixture(scope="module")
def l8b():
    return load_spec("llama-3.1-8b")


def test_layouts_respect_the_model_shape(l8b):
    spec = l8b  # 32 heads, 8 kv heads, MLP 14336 = 2^11·7, 32 layers
    for lay in layouts(spec, 64, 8):
        assert lay.dp * lay.tp * lay.pp == 64
        assert spec.heads % lay.tp == 0 and spec.intermediate % lay.tp == 0 and lay.tp <= 8
        assert spec.layers % lay.pp == 0
        validate_layout(spec, Setup(dp=lay.dp, tp=lay.tp, pp=lay.pp, grad_accum=max(lay.pp, 1), stack="megatron",
                                    precision="bf16-master"))
    assert not tp_allowed(spec, 16, 8)  # beyond a node
    assert not tp_allowed(replace(spec, heads=24, kv_heads=8), 16, 16)  # 16 does not divide 24 heads
    assert {lay.pp for lay in layouts(load_spec("llama-3.1-405b"), 16384, 8)} == {1, 2}  # 126 layers


def test_global_batch_is_respected():
    lay = Layout(dp=8, tp=1, pp=2)
    gseqs = 4e6 / 8192  # 488.3 sequences
    for b, accum in batch_splits(lay, gseqs, 64, 0.05):
        assert accum >= lay.pp
        assert abs(b * accum * lay.dp - gseqs) <= 0.05 * gseqs
    r = search(load_spec("llama-3.1-8b"), get_gpu("H100-80GB"), PlanQuery(gpus=16, seq=4096, global_batch_tokens=2**21))
    for c in r.candidates:
        assert abs(c.setup.tokens_per_step - 2**21) <= 0.05 * 2**21


def test_peak_is_convex_nondecreasing_in_micro_batch(l8b):
    """The property fit.PeakOracle relies on (secant bound + binary search)."""
    pc = count_params(l8b)
    for s in (Setup(seq=4096, dp=4, tp=2, zero=3, sequence_parallel=True),
              Setup(seq=4096, pp=4, grad_accum=8, recompute="full", precision="bf16-master", stack="megatron"),
              Setup(seq=2048, attention="eager")):
        mems = [train_memory(l8b, s.with_(batch=b), pc) for b in range(1, 12)]
        peaks = [m.peak for m in mems]
        d = [b - a for a, b in zip(peaks, peaks[1:])]
        # the peak may sit flat on the optimizer step (batch-independent) before activations overtake it
        assert all(x >= 0 for x in d)
        fwd = [m.phases["forward_end"] for m in mems]
        assert all(b > a for a, b in zip(fwd, fwd[1:]))
        assert all(y - x >= -2 for x, y in zip(d, d[1:]))  # non-decreasing slopes (int rounding aside)


def test_largest_batch_matches_brute_force(l8b):
    o = PeakOracle(l8b, count_params(l8b))
    base = Setup(seq=4096, dp=8, zero=1, precision="bf16-master")
    cap = 200 * 2**30  # batch 1 needs ~72 GiB (DDP bucket copy under ZeRO-1), each sequence ~27 GiB more
    fitting = [b for b in range(1, 200) if o.peak(base.with_(batch=b)) <= cap]
    assert len(fitting) > 2
    brute = max(fitting)
    assert PeakOracle(l8b, count_params(l8b)).largest_batch(base, cap, 199) == brute


def test_candidates_peak_equals_trainfit_estimate(l8b):
    """The JSON contract: `trainfit estimate MODEL` with a candidate's setup gives the same peak, and the candidate fits
    by the fit rule (analytic/fit_rule.py) with its capacity."""
    gpu = get_gpu("A100-80GB")
    r = search(l8b, gpu, PlanQuery(gpus=16, seq=4096, global_batch_tokens=1e6, top=5))
    assert r.candidates
    for c in r.candidates:
        assert estimate(l8b, c.setup).memory.peak == c.peak <= c.capacity == capacity(gpu, c.setup)
        assert c.headroom == estimate(l8b, c.setup, gpu).time.headroom >= 0


def test_estimate_cli_gives_the_same_peak(l8b):
    from typer.testing import CliRunner

    from trainfit.cli import app
    from trainfit.cli.plan import plan
    from trainfit.report.plan import plan_dict

    r = search(l8b, get_gpu("H100-80GB"), PlanQuery(gpus=8, seq=4096, global_batch_tokens=5e5, top=2))
    s = plan_dict(r)["candidates"][0]["setup"]
    args = ["estimate", "llama-3.1-8b", "--json"]
    for k in ("batch", "seq", "grad_accum", "precision", "optimizer", "recompute", "dp", "tp", "pp", "zero"):
        args += [f"--{k.replace('_', '-')}", str(s[k])]
    if s["sequence_parallel"]:
        args.append("--sequence-parallel")
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["memory"]["peak"] == plan_dict(r)["candidates"][0]["memory"]["peak"]


def test_hand_checkable_optimum(l8b):
    """8 H100s in one node, 8B model, 1M-token batches: everything fits without recompute and a pipeline only adds a
    bubble, so the winner has pp = 1 and no recompute. Between TP 1 and TP 2 it is close: pure DP 8 needs ZeRO-2 to
    fit without recompute (bf16-master under ZeRO-1 keeps 4 B/param of bf16 weights and gradients whole beside its
    1/8 of 12 B/param: too little room for a micro-batch's activations), so its gradients are reduce-scattered and FSDP2 copies its parameters in and out at each of the 32
    micro-batches, about as much as TP 2's four all-reduces per layer over NVLink; larger TP only adds all-reduces."""
    r = search(l8b, get_gpu("H100-80GB"), PlanQuery(gpus=8, seq=4096, global_batch_tokens=2**20, top=20))
    best = r.candidates[0].setup
    assert (best.pp, best.tp * best.dp) == (1, 8) and best.tp <= 2
    assert best.recompute == "none"
    dp8 = [c for c in r.candidates if c.setup.dp == 8]
    assert dp8 and dp8[0].setup.zero >= 2 and dp8[0].time.step_seconds == pytest.approx(
        r.candidates[0].time.step_seconds, rel=0.05)
    tm = r.candidates[0].time
    parts = tm.compute + tm.recompute + tm.tp_comm + tm.pp_comm + tm.bubble + tm.dp_comm + tm.optimizer + tm.straggler
    assert parts == pytest.approx(tm.step_seconds)


def test_search_is_fast_for_405b_on_16k_gpus():
    r = search(load_spec("llama-3.1-405b"), get_gpu("H100-80GB"),
               PlanQuery(gpus=16384, seq=8192, global_batch_tokens=16 * 2**20))
    assert r.candidates and r.stats["seconds"] < 2


def test_nothing_fits_says_why_and_what_would():
    r = search(load_spec("mistral-7b"), get_gpu("RTX-4090"), PlanQuery(gpus=1, seq=2048))
    assert not r.candidates and r.diagnosis.reason == "memory"
    assert r.diagnosis.min_gpus and r.diagnosis.min_gpus > 1
    assert "leanest plan" in r.diagnosis.message and r.diagnosis.suggestions
    q2 = PlanQuery(gpus=64, seq=4096, global_batch_tokens=8192, knobs=())
    r2 = search(load_spec("llama-3.1-8b"), get_gpu("H100-80GB"), q2)
    assert r2.diagnosis.reason == "batch"
    # two sequences on 64 GPUs: DeepSpeed-Ulysses (hf through its DeepSpeed integration) splits each over 32 of them
    r3 = search(load_spec("llama-3.1-8b"), get_gpu("H100-80GB"), replace(q2, knobs=("ulysses",)))
    s = r3.candidates[0].setup
    assert s.dp == 64 and s.ulysses == 32 and s.tokens_per_step == 8192


@pytest.mark.parametrize("kwargs", [dict(gpus=0), dict(gpus=8, precisions=("fp8",)), dict(gpus=8, zeros=(4,)),
                                    dict(gpus=8, tp=3), dict(gpus=8, reserve=-1.0), dict(gpus=8, seq=4096,
                                    global_batch_tokens=100), dict(gpus=8, recomputes=("some",))])
def test_bad_inputs_raise_one_line_errors(kwargs):
    with pytest.raises(TrainfitError) as e:
        PlanQuery(**kwargs)
    assert "\n" not in str(e.value)


def test_cli_command_and_emits(tmp_path):
    import typer
    from typer.testing import CliRunner

    from trainfit.cli.plan import plan

    app = typer.Typer()
    app.command()(plan)
    app.command("noop")(lambda: None)  # keep `plan` a sub-command
    run = CliRunner().invoke
    out = run(app, ["plan", "llama-3.1-8b", "--gpu", "A100-80GB", "--gpus", "8", "--seq", "4096",
                    "--global-batch-tokens", "1M", "--json"])
    assert out.exit_code == 0, out.output
    d = json.loads(out.output)
    c = d["candidates"][0]
    assert {"batch", "seq", "grad_accum", "precision", "optimizer", "recompute", "dp", "tp", "pp", "zero"} <= set(c["setup"])
    assert {"peak"} <= set(c["memory"]) and {"step_seconds", "tokens_per_second"} <= set(c["time"])
    ds = run(app, ["plan", "llama-3.1-8b", "--gpu", "A100-40GB", "--gpus", "8", "--seq", "4096",
                   "--global-batch-tokens", "1M", "--emit", "deepspeed"])
    assert ds.exit_code == 0, ds.output
    cfg = json.loads(ds.stdout)
    assert cfg["train_batch_size"] == cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"] * 8
    assert cfg["zero_optimization"]["stage"] in (0, 1, 2, 3)
    # the hf plans cannot run on Megatron-LM: its own step is searched and emitted
    mg = run(app, ["plan", "llama-3.1-8b", "--gpu", "A100-40GB", "--gpus", "8", "--emit", "megatron"])
    assert mg.exit_code == 0 and "pretrain_gpt.py" in mg.stdout, mg.output
    bad = run(app, ["plan", "llama-3.1-8b", "--gpu", "A100-40GB", "--gpus", "8", "--emit", "nope"])
    assert bad.exit_code != 0 and isinstance(bad.exception, SetupError)


def test_emit_says_the_budget_and_the_verify_it_ran(cli):
    """--emit prints the config on stdout and the plan on stderr: with --tokens (and --price) the plan's line carries
    the budget the table would show (time, GPU-hours, cost), and --verify's trace of the emitted plan is printed, not
    run and dropped; the config itself is the same."""
    # (accelerate's config runs the hf stack's autocast step, the table's plan at --precision amp-bf16: --verify
    # traces it)
    args = ("plan", "gpt2", "--gpu", "L4", "--gpus", "1", "--seq", "1024", "--top", "1", "--precision", "amp-bf16",
            "--emit", "accelerate")
    code, plain, err = cli(*args)
    assert code == 0 and "tokens in" not in err and "verify" not in err
    code, out, err = cli(*args, "--tokens", "1B", "--price", "2")
    assert code == 0 and out == plain
    line = next(x for x in err.splitlines() if x.startswith("plan:"))
    tps = float(line.split(" tokens/s")[0].rsplit(": ", 1)[1].replace(",", ""))
    days = line.split("1.00 G tokens in ")[1].split(",")[0]
    assert days == fmt_seconds(1e9 / tps)  # the budget's time: the tokens at the plan's rate
    hours = float(line.split(" GPU-h")[0].rsplit(", ", 1)[1].replace(",", ""))
    assert hours == pytest.approx(1e9 / tps / 3600, abs=0.5) and f"${2 * 1e9 / tps / 3600:,.0f}" in line
    code, out, err = cli(*args, "--verify")
    assert code == 0 and out == plain
    assert next(x for x in err.splitlines() if x.startswith("verify: ")).startswith("verify: trace peak ")


# accelerate's documented config-file keys (accelerate docs: usage_guides/fsdp and "FSDP1 vs FSDP2")
ACCELERATE_TOP = {"compute_environment", "debug", "distributed_type", "downcast_bf16", "fsdp_config", "machine_rank",
                  "main_training_function", "mixed_precision", "num_machines", "num_processes", "rdzv_backend",
                  "same_network", "use_cpu", "tpu_env", "tpu_use_cluster", "tpu_use_sudo", "gpu_ids"}
ACCELERATE_FSDP = {"fsdp_version", "fsdp_auto_wrap_policy", "fsdp_transformer_layer_cls_to_wrap",
                   "fsdp_reshard_after_forward", "fsdp_activation_checkpointing", "fsdp_offload_params",
                   "fsdp_cpu_ram_efficient_loading", "fsdp_state_dict_type", "fsdp_sharding_strategy",
                   "fsdp_backward_prefetch", "fsdp_forward_prefetch", "fsdp_sync_module_states", "fsdp_use_orig_params",
                   "fsdp_min_num_params"}


def test_accelerate_yaml_keys(l8b):
    yaml = pytest.importorskip("yaml")
    s = Setup(batch=2, seq=4096, grad_accum=8, dp=8, zero=3, recompute="full", precision="amp-bf16")
    text = emit.emit("accelerate", s, l8b, 8)
    cfg = yaml.safe_load(text)
    assert set(cfg) <= ACCELERATE_TOP and set(cfg["fsdp_config"]) <= ACCELERATE_FSDP
    assert cfg["distributed_type"] == "FSDP" and cfg["fsdp_config"]["fsdp_reshard_after_forward"] is True
    assert cfg["num_processes"] == 8 and cfg["mixed_precision"] == "bf16" and cfg["downcast_bf16"] == "no"
    with pytest.raises(SetupError):
        emit.emit("accelerate", s.with_(tp=2, dp=4, sequence_parallel=True), l8b, 8)


def test_torchrun_command(l8b):
    s = Setup(batch=1, seq=8192, grad_accum=16, dp=4, tp=8, pp=2, zero=3, precision="amp-bf16", sequence_parallel=True,
              stack="torchtitan")
    cmd = emit.emit("torchrun", s, l8b, 8)
    assert "--nnodes=8" in cmd and "--parallelism.tensor_parallel_degree 8" in cmd
    assert "--parallelism.pipeline_parallel_degree 2" in cmd and "--training.global_batch_size 64" in cmd


def test_fixed_tp_and_pp_constrain_the_search_before_the_top(l8b, cli):
    """--tp/--pp are search constraints: only such plans are ranked, so --top 1 shows the best of them; a --tp the
    model's heads or a node cannot take, or a --pp its layers cannot, is one line, exit 2 (not an empty table)."""
    gpu = get_gpu("H100-80GB")
    r = search(l8b, gpu, PlanQuery(gpus=16, seq=4096, global_batch_tokens=2**20, tp=4, pp=2, top=1,
                                   stacks=("torchtitan",)))
    assert [(c.setup.tp, c.setup.pp) for c in r.candidates] == [(4, 2)]
    for args, words in ((("--gpus", "24", "--tp", "3"), "--tp 3 does not divide the 32 attention heads"),
                        (("--gpus", "16", "--tp", "16"), "--tp 16: tensor parallelism stays inside a node"),
                        (("--gpus", "10", "--pp", "5", "--stack", "torchtitan"), "--pp 5 does not divide the 32 layers"),
                        (("--gpus", "40", "--pp", "40", "--stack", "megatron"), "--pp 40 exceeds the 32 layers"),
                        # the planned stack (hf, the default) trains with no pipeline: stacks/hf.toml [model_parallel]
                        (("--gpus", "16", "--pp", "2"), "--stack hf runs no pipeline split")):
        code, out, err = cli("plan", "llama-3.1-8b", "--gpu", "H100-80GB", *args)
        assert code == 2 and len(err.strip().splitlines()) == 1 and words in err, err


def test_a_stack_that_runs_no_fixed_split_says_so_beside_the_others_plans(l8b):
    """--pp 2 planned on hf and torchtitan: torchtitan's plans are ranked, and the result says in a note why hf has
    none (stacks/hf.toml [model_parallel]: the HF Trainer runs no pipeline), instead of dropping it silently."""
    r = search(l8b, get_gpu("H100-80GB"), PlanQuery(gpus=16, seq=4096, global_batch_tokens=2**20, pp=2, top=3,
                                                    stacks=("hf", "torchtitan")))
    assert r.candidates and {c.setup.stack for c in r.candidates} == {"torchtitan"}
    assert [n for n in r.notes if n.startswith("--stack hf runs no pipeline split")]


def test_reserve_is_the_only_margin(cli):
    """The plan keeps free what `--reserve` says (GiB, the estimate's run setting) and nothing else; --margin is
    refused in one line pointing at --reserve."""
    spec, gpu = load_spec("llama-3.2-1b"), get_gpu("RTX-4090")
    q = PlanQuery(gpus=1, seq=4352, precisions=("bf16",), recomputes=("none",))
    best = search(spec, gpu, q).candidates[0]
    assert best.setup.batch == 1 and 0 < best.headroom < 2**30  # fits with under 1 GiB to spare, as estimate says
    assert best.headroom == estimate(spec, best.setup, gpu).time.headroom
    # keeping 1 GiB free leaves no plain plan (the memory knobs, plan/knobs.py, are another search)
    assert not search(spec, gpu, replace(q, reserve=1.0, knobs=())).candidates
    code, out, err = cli("plan", "llama-3.2-1b", "--gpu", "RTX-4090", "--margin", "0.05")
    assert code == 2 and "--reserve" in err and len(err.strip().splitlines()) == 1


def test_a_fixed_tp_is_checked_at_the_querys_seq(cli):
    """gpt2 has 1024 learned positions (its config.json n_positions), so --seq 1024 fits it whatever --tp; the
    fixed-axis check judged --tp 1 at the default --seq 2048 and refused ('--seq 2048 needs 2048'), which also broke
    --emit deepspeed's re-search of gpt2 (it fixes tp 1)."""
    code, _, err = cli("plan", "gpt2", "--gpu", "L4", "--gpus", "1", "--seq", "1024", "--tp", "1", "--top", "1")
    assert code == 0, err
