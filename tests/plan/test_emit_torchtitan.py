"""`trainfit plan --emit torchtitan`: a torchtitan job-config TOML that torchtitan itself accepts. Checked against
torchtitan 0.2.2's own code: its model registry (the flavors' shapes), its ConfigManager (train.py:744-745 parses
`--job.config_file` with it: the emitted file must parse and give back the plan's layout), and its trainer (two
real steps on CPU with gloo, marked slow). Skipped where torchtitan is not installed (the `torchtitan` extra)."""
from __future__ import annotations

import json
import math
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainfit.api import load_spec
from trainfit.errors import SetupError
from trainfit.hardware import get_gpu
from trainfit.plan import emit, emit_torchtitan
from trainfit.plan.search import PlanQuery, search
from trainfit.setup import Setup
from trainfit.stacks import get_stack

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def titan():
    pytest.importorskip("torchtitan")
    from torchtitan.config import ConfigManager

    return ConfigManager


def parse(ConfigManager, args: list[str]):
    return ConfigManager().parse_args(args)


def layout_of(cfg) -> dict:
    """The plan a parsed torchtitan JobConfig runs, read back by torchtitan's own semantics (not the emitter's):
    train.py:196-215 (accumulation = global / (local × dp)), pipeline_parallel.py:186-194 (micro-batches under
    PP), parallelize.py:125-151 and 319-327 (FSDP / DDP, reshard policy), activation_checkpoint.py:159-191."""
    p, t, ac = cfg.parallelism, cfg.training, cfg.activation_checkpoint
    dp = p.data_parallel_replicate_degree * p.data_parallel_shard_degree
    if p.pipeline_parallel_degree > 1:
        batch = p.pipeline_parallel_microbatch_size
        accum = t.local_batch_size // batch
        assert t.global_batch_size == t.local_batch_size * dp  # no torchtitan-level accumulation beside 1F1B
    else:
        batch = t.local_batch_size
        accum = t.global_batch_size // (t.local_batch_size * dp)
    if p.data_parallel_shard_degree > 1:
        resharded = p.fsdp_reshard_after_forward == "always" or (
            p.fsdp_reshard_after_forward == "default" and p.pipeline_parallel_degree == 1)
        zero = 3 if resharded else 2
    else:
        zero = 0
    if ac.mode in ("none", "full"):
        recompute = ac.mode
    else:
        recompute = "op" if ac.selective_ac_option == "op" else f"layer:{ac.selective_ac_option}"
    precision = {("float32", "bfloat16"): "amp-bf16", ("bfloat16", "bfloat16"): "bf16",
                 ("float32", "float32"): "fp32"}[(t.dtype, t.mixed_precision_param)]
    return dict(batch=batch, seq=t.seq_len, grad_accum=accum, dp=dp, tp=p.tensor_parallel_degree,
                pp=p.pipeline_parallel_degree, zero=zero, recompute=recompute, precision=precision,
                optimizer=cfg.optimizer.name.lower(), optimizer_impl=cfg.optimizer.implementation)


def expected(s) -> dict:
    return dict(batch=s.batch, seq=s.seq, grad_accum=s.grad_accum, dp=s.dp, tp=s.tp, pp=s.pp, zero=s.zero,
                recompute=s.recompute, precision=s.precision, optimizer=s.optimizer, optimizer_impl=s.optimizer_kernel)


# -- the model registry ---------------------------------------------------------------------------------------
def test_flavor_shapes_are_torchtitans_registry(titan):
    """stacks/torchtitan.toml [models] against torchtitan's llama3_args, and the FFN width formula against the
    width torchtitan's own FeedForward builds."""
    import torch
    from torchtitan.models.llama3 import llama3_args
    from torchtitan.models.llama3.model.model import FeedForward

    flavors = get_stack("torchtitan").models()["llama3"]
    for flavor, shape in flavors.items():
        a = llama3_args[flavor]
        assert (a.dim, a.n_layers, a.n_heads, a.n_kv_heads or a.n_heads, a.vocab_size, a.multiple_of,
                a.ffn_dim_multiplier) == (shape["dim"], shape["n_layers"], shape["n_heads"],
                                          shape.get("n_kv_heads", shape["n_heads"]), shape["vocab_size"],
                                          shape["multiple_of"], shape.get("ffn_dim_multiplier")), flavor
        assert a.attn_type == "sdpa"
        with torch.device("meta"):
            ff = FeedForward(a.dim, 4 * a.dim, a.multiple_of, a.ffn_dim_multiplier)
        assert emit_torchtitan.torchtitan_ffn(shape) == ff.w1.out_features, flavor


def test_catalog_llamas_match_torchtitan_flavors():
    """trainfit's catalog (from the HF configs) and torchtitan's registry are independent sources that agree."""
    assert emit_torchtitan.torchtitan_flavor(load_spec("llama-3.1-8b"))[:2] == ("llama3", "8B")
    assert emit_torchtitan.torchtitan_flavor(load_spec("llama-3.1-70b"))[:2] == ("llama3", "70B")
    assert emit_torchtitan.torchtitan_flavor(load_spec("llama-3.1-405b"))[:2] == ("llama3", "405B")
    for other in ("llama-3.2-1b", "mistral-7b", "qwen2.5-7b", "gpt2"):  # tied, windowed, biased, not a llama
        assert emit_torchtitan.torchtitan_flavor(load_spec(other)) is None, other
    with pytest.raises(SetupError, match="registry"):
        emit_torchtitan.torchtitan_flavor_or_error(load_spec("llama-3.2-1b"))


# -- ConfigManager ----------------------------------------------------------------------------------------------
PLANS = [  # (model, GPU, count, query keywords): FSDP, DDP, TP + FSDP, TP + PP, op, layer:N, full, bf16, fp32
    ("llama-3.1-8b", "H100-80GB", 8, dict(seq=8192, recomputes=("op",))),
    ("llama-3.1-8b", "H200", 8, dict(seq=2048, zeros=(0,), recomputes=("layer:2",), precisions=("bf16", "fp32"))),
    ("llama-3.1-8b", "H100-80GB", 16, dict(seq=8192, tp=2, zeros=(2,), precisions=("bf16",))),
    ("llama-3.1-70b", "H100-80GB", 64, dict(seq=8192, tp=8, pp=2, global_batch_tokens=2**21)),
    ("llama-3.1-405b", "H100-96GB", 512, dict(seq=8192, tp=8, pp=2, global_batch_tokens=2**22, recomputes=("full",))),
]


@pytest.mark.parametrize("model, gpu, gpus, kw", PLANS, ids=[f"{m}-{g}x{n}" + "-".join(f"-{v}" for v in k.values())
                                                            for m, g, n, k in PLANS])
def test_emitted_toml_parses_with_torchtitans_config_manager(titan, tmp_path, model, gpu, gpus, kw):
    spec = load_spec(model)
    r = search(spec, get_gpu(gpu), PlanQuery(gpus=gpus, stacks=("torchtitan",), top=3, **kw))
    assert r.candidates, r.diagnosis and r.diagnosis.message
    for c in r.candidates:
        path = tmp_path / "job.toml"
        path.write_text(emit.emit("torchtitan", c.setup, spec, 8, tokens=1e9))
        cfg = parse(titan, ["--job.config_file", str(path)])
        assert layout_of(cfg) == expected(c.setup)
        assert cfg.training.steps == math.ceil(1e9 / c.setup.tokens_per_step)
        assert (cfg.model.name, cfg.model.flavor) == emit_torchtitan.torchtitan_flavor(spec)[:2]
        assert cfg.compile.enable is False and cfg.training.mixed_precision_reduce == "float32"
        # the torchrun line carries the same keys as CLI overrides: ConfigManager parses them to the same config
        line = emit.emit("torchrun", c.setup, spec, 8, tokens=1e9)
        args = shlex.split(line.replace("\\\n", " "))
        args = args[args.index("torchtitan.train") + 1:]
        assert layout_of(parse(titan, args)) == expected(c.setup)


def test_cli_emits_the_plan_it_names(titan, tmp_path, cli):
    """`trainfit plan ... --stack torchtitan --emit torchtitan`: stdout is the TOML, stderr names the plan; the
    parsed file is that plan, and the plan's JSON (same query) has it first."""
    args = ["plan", "llama-3.1-8b", "--gpu", "H100-80GB", "--gpus", "8", "--seq", "8192", "--stack", "torchtitan",
            "--global-batch-tokens", "1M", "--tokens", "2B"]
    code, out, err = cli(*args, "--emit", "torchtitan")
    assert code == 0, err
    path = tmp_path / "job.toml"
    path.write_text(out)
    cfg = parse(titan, ["--job.config_file", str(path)])
    code, js, _ = cli(*args, "--json")
    first = json.loads(js)["candidates"][0]["setup"]
    got = layout_of(cfg)
    for k in ("batch", "seq", "grad_accum", "dp", "tp", "pp", "zero", "recompute", "precision", "optimizer"):
        assert got[k] == first[k], k
    assert first["stack"] == "torchtitan" and f"ZeRO-{first['zero']}" in err and "stack torchtitan" in err
    for line in out.splitlines():  # every key cites where torchtitan defines it
        if "=" in line and not line.startswith(("#", "[")):
            assert "# config/job_config.py:" in line, line


def test_emit_refusals_are_one_line(cli):
    code, _, err = cli("plan", "llama-3.2-1b", "--gpu", "H100-80GB", "--gpus", "8", "--emit", "torchtitan")
    assert code == 2 and "registry" in err and len(err.strip().splitlines()) == 1
    code, _, err = cli("plan", "llama-3.1-8b", "--gpu", "H100-80GB", "--gpus", "8", "--emit", "nemo")
    assert code == 2 and "torchtitan" in err and len(err.strip().splitlines()) == 1


def test_hf_plans_are_not_emitted_as_torchtitan_jobs():
    s = search(load_spec("llama-3.1-8b"), get_gpu("H100-80GB"), PlanQuery(gpus=8, seq=4096)).candidates[0].setup
    assert s.stack == "hf" and "plan with --stack torchtitan" in emit.supports("torchtitan", s)
    # nor as a torchrun line: it runs torchtitan's step too, whose memory and time the hf plan does not model
    assert s.recompute in ("none", "full") and "plan with --stack torchtitan" in emit.supports("torchrun", s)


def test_cli_torchrun_emits_a_torchtitan_plan(cli):
    code, out, err = cli("plan", "llama-3.1-8b", "--gpu", "H100-80GB", "--gpus", "8", "--emit", "torchrun")
    assert code == 0 and out.startswith("torchrun ") and "stack torchtitan:" in err, err
    assert "cannot run on torchrun (the plan models the hf stack's step" in " ".join(err.split())


# -- torchtitan's trainer ---------------------------------------------------------------------------------------
DEBUG_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
               "intermediate_size": 768, "num_hidden_layers": 6, "num_attention_heads": 16, "num_key_value_heads": 16,
               "vocab_size": 2048, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
               "tie_word_embeddings": False, "hidden_act": "silu", "attention_bias": False, "mlp_bias": False}


def _assets(root: Path) -> tuple[Path, Path]:
    """A word-level tokenizer (tokenizers' own format, as HuggingFaceTokenizer reads it) and a c4-shaped dataset."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok, data = root / "tok", root / "data"
    tok.mkdir()
    data.mkdir()
    words = ["<unk>", "<s>", "</s>"] + [f"w{i}" for i in range(200)]
    t = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    t.save(str(tok / "tokenizer.json"))
    (tok / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))
    with open(data / "train.json", "w") as f:
        for j in range(64):
            f.write(json.dumps({"text": " ".join(f"w{(i * 7 + j) % 200}" for i in range(300))}) + "\n")
    return tok, data


@pytest.mark.heavy  # torchtitan's own trainer, two steps (15 s on 2 cores): the heavy tier keeps the suite < 10 min
def test_torchtitans_trainer_runs_the_emitted_job_for_two_steps(titan, tmp_path, cli):
    """The whole path on CPU: a config.json of torchtitan's debugmodel shape → `trainfit plan --stack torchtitan
    --emit torchtitan --tokens` (2 steps' worth) → torchrun of torchtitan's own trainer on 2 gloo ranks with that
    file; only the tokenizer/dataset paths and the CPU optimizer kernel are overridden on the command line. The
    run trains exactly 2 steps with the plan's layout (FSDP over 2 ranks, per-layer checkpointing)."""
    pytest.importorskip("tokenizers")
    pytest.importorskip("datasets")
    model = tmp_path / "debug" / "config.json"
    model.parent.mkdir()
    model.write_text(json.dumps(DEBUG_LLAMA))
    tok, data = _assets(tmp_path)
    # fp32: CPU bf16 matmuls make the same run minutes long; dp 2 with ZeRO-3: torchtitan's FSDP2 path
    code, out, err = cli("plan", str(model), "--gpu", "H100-80GB", "--gpus", "2", "--dp", "2", "--zero", "3",
                         "--seq", "128", "--precision", "fp32", "--recompute", "op,layer:2", "--stack", "torchtitan",
                         "--global-batch-tokens", "512", "--tokens", "1024", "--emit", "torchtitan")
    assert code == 0, err
    job = tmp_path / "job.toml"
    job.write_text(out)
    cfg = parse(titan, ["--job.config_file", str(job)])
    assert cfg.model.flavor == "debugmodel" and cfg.training.steps == 2
    assert (cfg.parallelism.data_parallel_shard_degree, cfg.activation_checkpoint.mode) == (2, "selective")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])),
           "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(HERE / "torchtitan_cpu_launch.py"), "--job.config_file", str(job),
           "--model.hf_assets_path", str(tok), "--training.dataset", "c4_test", "--training.dataset_path", str(data),
           "--job.dump_folder", str(tmp_path / "out"), "--optimizer.implementation", "for-loop",
           "--metrics.log_freq", "1"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path,
                            start_new_session=True)  # its own process group: a hang is killed whole, ranks included
    try:
        log, _ = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        log, _ = proc.communicate()
        pytest.fail("torchtitan's trainer did not finish in 300 s: " + log[-3000:])
    assert proc.returncode == 0, log[-3000:]
    assert "Applied FSDP to the model" in log and "Applied selective activation checkpointing" in log
    assert "local batch size 2, global batch size 4, gradient accumulation steps 1, sequence length 128, total steps 2" in log
    assert "step:  2" in log and "step:  3" not in log and "Training completed" in log
    print(f"torchtitan trainer, 2 steps on 2 CPU ranks: {time.perf_counter() - t0:.1f} s")


@pytest.mark.parametrize("kw, converter", [
    (dict(low_precision="tensorwise", fp8_all_gather=True), "quantize.linear.float8"),
    (dict(low_precision="rowwise_with_gw_hp", bf16_first_layers=1, bf16_last_layers=2), "quantize.linear.float8"),
    (dict(low_precision="mxfp8"), "quantize.linear.mx"),
])
def test_low_precision_recipes_reach_torchtitans_converters(titan, tmp_path, kw, converter):
    """--low-precision as torchtitan 0.2.2 reads it back (ConfigManager, from the TOML and from the torchrun line):
    the converter, the recipe (tensorwise: the recipe-less config, the one that takes the fp8 all-gather,
    components/quantization/float8.py:65-99), and filter_fqns keeping the LM head and the --bf16-*-layers out
    (utils.py:24-25 substring match: "layers.1." is not in "layers.11.")."""
    spec = load_spec("llama-3.1-8b")
    s = Setup(batch=1, seq=8192, stack="torchtitan", recompute="op", dp=8, zero=3, compile=True, **kw)
    path = tmp_path / "job.toml"
    path.write_text(emit.emit("torchtitan", s, spec, 8, tokens=1e9))
    line = emit.emit("torchrun", s, spec, 8, tokens=1e9)
    args = shlex.split(line.replace("\\\n", " "))
    for cfg in (parse(titan, ["--job.config_file", str(path)]), parse(titan, args[args.index("torchtitan.train") + 1:])):
        assert cfg.model.converters == [converter] and cfg.compile.enable is True
        if converter == "quantize.linear.mx":
            q = cfg.quantize.linear.mx
            assert q.recipe_name == "mxfp8_cublas"
        else:
            q = cfg.quantize.linear.float8
            lp = kw["low_precision"]
            assert q.recipe_name == (None if lp == "tensorwise" else lp)
            assert q.enable_fsdp_float8_all_gather is kw.get("fp8_all_gather", False)
        kept = [f"layers.{i}." for i in range(kw.get("bf16_first_layers", 0))]
        kept += [f"layers.{32 - kw.get('bf16_last_layers', 0) + i}." for i in range(kw.get("bf16_last_layers", 0))]
        assert q.filter_fqns == ["output", *kept]
        filtered = [f"layers.{i}.attention.wq" for i in range(32) if any(f in f"layers.{i}.attention.wq"
                                                                         for f in q.filter_fqns)]
        assert len(filtered) == kw.get("bf16_first_layers", 0) + kw.get("bf16_last_layers", 0)


def test_compile_loss_reaches_torchtitans_compile_components(titan, tmp_path):
    """--compile-loss as torchtitan 0.2.2 reads it back (the TOML and the torchrun line): compile enabled with the
    loss as its only component, so the blocks run eager (models/llama3/infra/parallelize.py:107-109) and the loss is
    compiled (components/loss.py:33-35)."""
    spec = load_spec("llama-3.1-8b")
    s = Setup(batch=1, seq=8192, stack="torchtitan", recompute="op", dp=8, zero=3, compile_loss=True)
    path = tmp_path / "job.toml"
    path.write_text(emit.emit("torchtitan", s, spec, 8, tokens=1e9))
    line = emit.emit("torchrun", s, spec, 8, tokens=1e9)
    args = shlex.split(line.replace("\\\n", " "))
    for cfg in (parse(titan, ["--job.config_file", str(path)]), parse(titan, args[args.index("torchtitan.train") + 1:])):
        assert cfg.compile.enable is True and list(cfg.compile.components) == ["loss"]


def test_context_parallel_reaches_torchtitans_parallel_dims(titan, tmp_path):
    """--cp as torchtitan 0.2.2 reads it back (the TOML and the torchrun line): context_parallel_degree, FSDP over
    dp_shard with the cp ranks folded in by ParallelDims (distributed/parallel_dims.py:137 fsdp = dp_shard * cp), the
    world the torchrun line launches, and seq_len divisible by tp × 2 × cp (seq_len_divisor, :365-372)."""
    from torchtitan.distributed.parallel_dims import ParallelDims

    spec = load_spec("llama-3.1-8b")
    s = Setup(batch=1, seq=65536, stack="torchtitan", recompute="full", dp=2, cp=4, tp=2, zero=3)
    path = tmp_path / "job.toml"
    path.write_text(emit.emit("torchtitan", s, spec, 8, tokens=1e9))
    line = emit.emit("torchrun", s, spec, 8, tokens=1e9)
    args = shlex.split(line.replace("\\\n", " "))
    assert "--nnodes=2" in args and "--nproc_per_node=8" in args  # 2 × 4 × 2 = 16 ranks
    for cfg in (parse(titan, ["--job.config_file", str(path)]), parse(titan, args[args.index("torchtitan.train") + 1:])):
        p = cfg.parallelism
        assert p.context_parallel_degree == 4 and p.data_parallel_shard_degree == 2
        dims = ParallelDims(dp_replicate=p.data_parallel_replicate_degree, dp_shard=p.data_parallel_shard_degree,
                            cp=p.context_parallel_degree, tp=p.tensor_parallel_degree,
                            pp=p.pipeline_parallel_degree, ep=1, etp=1, world_size=16)
        assert dims.fsdp_enabled and dims.dp_shard * dims.cp == 8  # the FSDP group trainfit shards states over
        assert cfg.training.seq_len % dims.seq_len_divisor == 0
        assert layout_of(cfg) == expected(s)
    with pytest.raises(SetupError, match="divisible by tp × 2 × cp"):
        Setup(batch=1, seq=65536 + 8, stack="torchtitan", dp=2, cp=4, tp=2, zero=3)
