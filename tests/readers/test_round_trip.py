"""`trainfit check`: every writer's file (plan/emit_*.py) read back by its stack's reader gives the same Setup on
the fields the writer writes; torchtitan's own 8B job config read as torchtitan runs it (a hand derivation); bad
input is one line and exit 2."""
from __future__ import annotations

import pytest

from trainfit import serving_versions
from trainfit.api import load_spec, run_engines
from trainfit.cli.app import main
from trainfit.cli.check import request_of
from trainfit.plan import emit
from trainfit.readers import read
from trainfit.setup import Request

MODEL = "llama-3.1-8b"
TITAN = ("stack", "batch", "seq", "grad_accum", "dp", "tp", "pp", "cp", "zero", "recompute", "precision", "optimizer",
         "optimizer_kernel", "grad_clip_norm", "compile", "compile_loss", "offload", "sequence_parallel",
         "tp_comm_overlap")
MEGATRON = ("stack", "batch", "seq", "grad_accum", "dp", "tp", "pp", "cp", "vpp", "pp_split", "zero", "recompute",
            "precision", "sequence_parallel", "tp_comm_overlap", "offload_layers", "loss_fusion", "grad_clip_norm",
            "overlap_param_gather")
LOW = ("low_precision", "mx_scale", "fp8_all_gather", "bf16_first_layers", "bf16_last_layers")
MOE = ("ep", "etp", "moe_dispatcher", "moe_dispatcher_sms", "overlap_moe_comm")
DEEPSPEED = ("stack", "batch", "grad_accum", "dp", "zero", "precision", "grad_clip_norm", "offload", "recompute",
             "overlap_comm")
ACCELERATE = ("stack", "dp", "zero", "recompute", "precision", "offload")

CASES = [
    ("torchtitan", ".toml", TITAN, dict(stack="torchtitan", precision="amp-bf16", batch=2, seq=4096, grad_accum=2,
                                        dp=8, zero=3, tp=2, recompute="full", sequence_parallel=True, compile=True,
                                        tp_comm_overlap=True)),
    ("torchtitan", ".toml", TITAN, dict(stack="torchtitan", precision="bf16", batch=1, seq=2048, grad_accum=4, dp=4,
                                        pp=2, zero=3, recompute="layer:2", compile=True)),
    ("torchtitan", ".toml", TITAN, dict(stack="torchtitan", precision="fp32", batch=4, seq=1024, dp=4, zero=2,
                                        recompute="op")),
    ("torchrun", ".sh", TITAN, dict(stack="torchtitan", precision="amp-bf16", batch=2, seq=4096, grad_accum=3, dp=16,
                                    zero=3, tp=2, cp=2, recompute="full", compile_loss=True, sequence_parallel=True)),
    ("torchrun", ".sh", TITAN, dict(stack="torchtitan", precision="amp-bf16", batch=1, seq=2048, dp=2, zero=0,
                                    recompute="none")),
    ("torchtitan", ".toml", TITAN + LOW, dict(stack="torchtitan", dp=8, zero=3, recompute="full",
                                              low_precision="tensorwise", fp8_all_gather=True, bf16_first_layers=1,
                                              bf16_last_layers=2)),
    ("torchtitan", ".toml", TITAN + LOW, dict(stack="torchtitan", dp=4, zero=3, low_precision="mxfp8")),
    ("torchtitan", ".toml", TITAN + LOW, dict(stack="torchtitan", dp=4, zero=3, low_precision="mxfp8",
                                              mx_scale="rceil")),
    ("megatron", ".sh", MEGATRON, dict(stack="megatron", precision="bf16-master", batch=1, seq=4096, grad_accum=4,
                                       dp=4, zero=1, tp=2, pp=2, recompute="full", sequence_parallel=True,
                                       tp_comm_overlap=True, overlap_param_gather=True)),
    ("megatron", ".sh", MEGATRON, dict(stack="megatron", precision="bf16-master", batch=2, seq=2048, grad_accum=2,
                                       dp=8, zero=3, recompute="selective", loss_fusion="native")),
    ("megatron", ".sh", MEGATRON, dict(stack="megatron", precision="bf16-master", batch=1, seq=8192, grad_accum=8,
                                       dp=2, pp=4, vpp=2, pp_split="embedding-loss", recompute="uniform:2")),
    ("megatron", ".sh", MEGATRON + LOW, dict(stack="megatron", precision="bf16-master", batch=2, seq=8192,
                                             grad_accum=2, dp=8, zero=3, offload_layers=16, loss_fusion="te",
                                             low_precision="tensorwise", fp8_all_gather=True)),
    ("megatron", ".sh", MEGATRON + MOE + LOW, dict(model="mixtral-8x7b", stack="megatron", precision="bf16-master",
                                                   dp=8, ep=4, tp=2, pp=2, zero=1, grad_accum=4, recompute="full",
                                                   sequence_parallel=True, moe_dispatcher="alltoall",
                                                   low_precision="blockwise", fp8_all_gather=True)),
    ("megatron", ".sh", MEGATRON + MOE, dict(model="qwen3-30b-a3b", stack="megatron", precision="bf16-master", dp=16,
                                             ep=16, zero=1, grad_accum=8, recompute="selective",
                                             moe_dispatcher="hybridep", moe_dispatcher_sms=32, overlap_moe_comm=True)),
    ("deepspeed", ".json", DEEPSPEED, dict(stack="deepspeed", precision="bf16-master", batch=2, grad_accum=4, dp=8,
                                           zero=3, recompute="full")),
    ("deepspeed", ".json", DEEPSPEED, dict(stack="deepspeed", precision="fp32", batch=1, dp=4, zero=1)),
    ("deepspeed", ".json", DEEPSPEED, dict(stack="deepspeed", precision="bf16-master", batch=2, dp=8, zero=2,
                                           overlap_comm=True)),
    ("deepspeed", ".json", DEEPSPEED, dict(stack="deepspeed", precision="fp16-master", batch=4, grad_accum=2, dp=2,
                                           zero=2, offload="optimizer")),
    ("deepspeed", ".json", DEEPSPEED + ("ep",), dict(model="mixtral-8x7b", stack="deepspeed", precision="bf16-master",
                                                   batch=1, dp=8, ep=4, zero=3)),
    ("accelerate", ".yaml", ACCELERATE, dict(stack="hf", precision="amp-bf16", dp=8, zero=3, recompute="full")),
    ("accelerate", ".yaml", ACCELERATE, dict(stack="hf", precision="amp-fp16", dp=4, zero=2)),
    ("accelerate", ".yaml", ACCELERATE, dict(stack="hf", precision="fp32", dp=4, zero=0)),
    ("accelerate", ".yaml", ACCELERATE, dict(stack="hf", precision="amp-bf16", dp=1, zero=0)),
]
SLOW = {"torchtitan", "torchrun", "deepspeed"}  # the stacks' parsers import torch-heavy packages


def _case(c):
    engine, ext, fields, values = c
    marks = [pytest.mark.heavy] if engine in SLOW and values is not _FIRST.get(engine) else []
    return pytest.param(*c, marks=marks, id=f"{engine}-{values.get('zero')}-{values.get('precision')}")


_FIRST = {}
for _c in CASES:
    _FIRST.setdefault(_c[0], _c[3])


@pytest.mark.parametrize("engine,ext,fields,values", [_case(c) for c in CASES])
def test_emit_then_check_gives_the_same_setup(tmp_path, engine, ext, fields, values):
    values = dict(values)
    model = values.pop("model", MODEL)
    spec = load_spec(model)
    setup = Request(model=model, **values).setup(spec)
    path = tmp_path / f"job{ext}"
    path.write_text(emit.emit(engine, setup, spec, 8))
    readings = [read(path)]
    req, _ = request_of(readings, None if readings[0].model else model, None, None)
    assert load_spec(req.model).name == model
    for check in readings[0].checks:  # the file's model flags are the model's
        check(spec)
    got = req.setup(spec)
    assert {f: getattr(got, f) for f in fields} == {f: getattr(setup, f) for f in fields}
    assert not readings[0].unknown  # every key the writer writes is known


@pytest.mark.parametrize("server,values", [
    ("vllm", dict(tp=2, kv_dtype="fp8", max_model_len=32768, max_num_seqs=128)),
    ("vllm", dict(precision="fp16", enforce_eager=True, gpu_memory_utilization=0.85, block_size=32)),
    ("vllm", dict(kv_cache_memory=20_000_000_000)),
    ("sglang", dict(tp=2, max_model_len=16384, mem_fraction_static=0.8)),
    ("sglang", dict(kv_dtype="fp8", enforce_eager=True)),
])
def test_serving_command_then_check_gives_the_same_engine(tmp_path, server, values):
    """The command the estimate prints, read back, sizes the engine the same (its resolved knobs and peak)."""
    from trainfit.plan.emit_sglang import sglang_command
    from trainfit.plan.emit_vllm import vllm_command

    req = Request(model=MODEL, mode="serve", server=server, gpu="H100-80GB", **values)
    first = run_engines(req, "analytic")[0]
    path = tmp_path / "serve.sh"
    path.write_text((sglang_command if server == "sglang" else vllm_command)(MODEL, first.setup, first.detail.serving))
    back, _ = request_of([read(path)], None, "H100-80GB", None)
    again = run_engines(back, "analytic")[0]
    assert load_spec(back.model).name == MODEL
    assert again.detail.serving.knobs == first.detail.serving.knobs
    assert again.detail.serving.max_model_len == first.detail.serving.max_model_len
    assert again.memory.peak == first.memory.peak
    for f in ("precision", "tp", "pp", "kv_dtype", "enforce_eager", "server", "mode", "kv_cache_memory"):
        assert getattr(again.setup, f) == getattr(first.setup, f), f


@pytest.mark.parametrize("server, changed", [
    ("sglang", {"--chunked-prefill-size": "4096", "--page-size": "16", "--cuda-graph-max-bs-decode": "64"}),
    ("vllm", {}),
])
def test_emitted_command_checks_back_with_nothing_not_modelled(tmp_path, capsys, server, changed):
    """`plan --emit X` then `check` of that command: every flag the command carries is what the estimate assumed,
    so none is listed as not modelled (SGLang's chunk, page and decode-graph sizes are listed as the estimate's);
    another value of those flags is still listed as not modelled. Before: --chunked-prefill-size 8192, --page-size 1
    and --cuda-graph-max-bs-decode 512, trainfit's own, were listed as not modelled."""
    import json
    import shlex

    main(["plan", MODEL, "--mode", "serve", "--gpu", "H100-80GB", "--concurrency", "64", "--server", server,
          "--emit", server])
    command = capsys.readouterr().out.strip().splitlines()[-1]
    path = tmp_path / "serve.sh"
    path.write_text(command + "\n")
    main(["check", str(path), "--gpu", "H100-80GB", "--json"])
    said = json.loads(capsys.readouterr().out)["check"]
    assert said["not_modelled"] == [] and said["unknown"] == [], said
    argv = shlex.split(command)
    emitted = {f: argv[argv.index(f) + 1] for f in changed}  # the plan's own values, as it wrote them
    assert said["as_modelled"] == [f"{f} {v}" for f, v in emitted.items()], said
    if not changed:
        return
    for f, v in changed.items():  # another value than the estimate's: not modelled, never silently taken
        argv[argv.index(f) + 1] = v
    path.write_text(shlex.join(argv) + "\n")
    main(["check", str(path), "--gpu", "H100-80GB", "--json"])
    said = json.loads(capsys.readouterr().out)["check"]
    assert said["as_modelled"] == []
    assert [x.split(":")[0] for x in said["not_modelled"]] == [f"{f} = {int(v)}" for f, v in changed.items()], said


@pytest.mark.parametrize("text, want", [
    # vLLM's short aliases (engine/arg_utils.py: "--tensor-parallel-size", "-tp"; "-pp"; "-dp") and its
    # human-readable --max-model-len (lowercase decimal, uppercase binary: argparse_utils.py human_readable_int)
    ("vllm serve m -tp 2 -pp 2 --max-model-len 32k -dp 2", dict(tp=2, pp=2, max_model_len=32000)),
    ("vllm serve m --tensor-parallel-size 4 --max-model-len 32K", dict(tp=4, max_model_len=32768)),
    # --max-num-batched-tokens is one too (engine/arg_utils.py _compute_kwargs; before: refused, "invalid int value")
    ("vllm serve m --max-num-batched-tokens 8k --max-model-len 4K", dict(max_num_batched_tokens=8000,
                                                                       max_model_len=4096)),
    # SGLang's ServerArgs spellings, and --tp by launch_server's argparse prefix matching
    ("python -m sglang.launch_server --model-path m --tp 2 --dp 2", dict(tp=2)),
    ("python -m sglang.launch_server --model-path m --tensor-parallel-size 4 --pp-size 2", dict(tp=4, pp=2)),
])
def test_serving_commands_as_people_write_them(tmp_path, text, want):
    path = tmp_path / "serve.sh"
    path.write_text(text + "\n")
    r = read(path)
    for k, v in want.items():
        assert r.values[k] == v, (k, r.values)
    assert not r.unknown  # (before: the short flags dropped without a word, --tp / --tensor-parallel-size unknown)


@pytest.mark.parametrize("flags, listed", [
    ("--disable-decode-cuda-graph", "--disable-decode-cuda-graph = True: not modelled (less memory"),
    ("--disable-prefill-cuda-graph", "--disable-prefill-cuda-graph = True: not modelled (less memory"),
])
def test_sglang_one_kind_of_graphs_off_is_listed_not_dropped(tmp_path, flags, listed):
    """One of SGLang's two graph switches alone is not --enforce-eager (both are): it is listed as not modelled.
    Before: parsed and then dropped without a word."""
    path = tmp_path / "serve.sh"
    path.write_text(f"python -m sglang.launch_server --model-path m {flags}\n")
    r = read(path)
    assert "enforce_eager" not in r.values and any(x.startswith(listed) for x in r.not_modelled), r.not_modelled


def test_sglang_speculative_flags_without_an_algorithm_are_listed_not_dropped(tmp_path):
    """SGLang runs no draft without --speculative-algorithm (0.5.23 arg_groups/speculative_hook.py): the draft path and
    the step counts are listed as without effect. Before: parsed and then dropped without a word."""
    path = tmp_path / "serve.sh"
    path.write_text("python -m sglang.launch_server --model-path m --speculative-draft-model-path d "
                    "--speculative-num-steps 3\n")
    r = read(path)
    assert "draft_model" not in r.values
    assert set(r.no_effect) >= {"--speculative-draft-model-path", "--speculative-num-steps"}, r.no_effect


def test_an_sglang_flag_abbreviated_is_named_with_its_whole_name(tmp_path):
    """SGLang's launch_server parser takes a flag's unique prefix for it (argparse's allow_abbrev default): --mem-frac
    0.8 runs as --mem-fraction-static 0.8 there. trainfit, which does not list every SGLang flag, cannot know the
    prefix is unique: it reads nothing from it and names the flag to write. A prefix of two flags it knows is named
    as it is."""
    path = tmp_path / "serve.sh"
    path.write_text("python -m sglang.launch_server --model-path m --mem-frac 0.8 --speculative-num 3 --tp 2\n")
    r = read(path)
    assert "mem_fraction_static" not in r.values and r.values["tp"] == 2
    assert r.unknown == ["--mem-frac (the engine reads a unique prefix as its flag: write --mem-fraction-static for "
                         "trainfit to read it)", "--speculative-num"], r.unknown


def test_an_unknown_short_flag_is_named(tmp_path):
    path = tmp_path / "serve.sh"
    path.write_text("vllm serve m -x 3\n")
    assert read(path).unknown == ["-x"]


@pytest.mark.heavy
def test_torchtitans_own_8b_job_reads_as_torchtitan_runs_it():
    """torchtitan v0.2.2's llama3_8b.toml (a preset for 64 A100s) by hand: model llama3 8B = Llama-3.1-8B; local
    batch 1 × seq 8192; shard degree -1 = the 64 ranks (--dp 64), "default" reshard without PP = ZeRO-3
    (parallelize.py:319-327); training.dtype float32 with mixed_precision_param bfloat16 (the defaults,
    job_config.py:275-282) = amp-bf16; selective AC "op" = per-op SAC; AdamW fused (job_config.py:151); global
    batch -1 = no accumulation; 1000 steps × 64 × 8192 tokens."""
    from pathlib import Path

    r = read(Path(__file__).parent / "data" / "llama3_8b.toml", dp=64)
    req, _ = request_of([r], None, "A100-80GB", None)
    s = req.setup(load_spec(req.model))
    assert req.model == "llama-3.1-8b"
    assert (s.batch, s.seq, s.dp, s.zero, s.precision, s.recompute, s.optimizer, s.optimizer_kernel, s.grad_accum,
            s.tp, s.pp, s.stack) == (1, 8192, 64, 3, "amp-bf16", "op", "adamw", "fused", 1, 1, 1, "torchtitan")
    assert req.tokens == 1000 * 64 * 8192
    assert any(x.startswith("[profiling]") for x in r.not_modelled)  # enable_profiling = true: more time
    assert "checkpoint.interval" in r.no_effect  # checkpoint.enable = false
    assert "quantize.linear.float8.filter_fqns" in r.no_effect  # its converter is commented out
    assert s.low_precision == "none"
    assert not r.unknown


@pytest.mark.parametrize("name,text,needle", [
    ("missing.toml", None, "no such file"),
    ("ds.json", '{"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}',
     "whole number of ranks"),
    ("ds2.json", '{"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4', "not valid JSON"),
    ("notes.txt", "hello", "not a config trainfit reads"),
    ("acc.yaml", "distributed_type: FSDP\nmixed_precision: fp8\nnum_processes: 2\n", "fp8"),
    ("serve.sh", "vllm serve meta-llama/Llama-3.1-8B --kv-cache-dtype fp8_e5m2\n", "--kv-cache-dtype"),
    # vLLM's EngineArgs.speculative_config is a dict (engine/arg_utils.py): valid JSON that is not an object (was a
    # traceback: AttributeError, 'list' object has no attribute 'get')
    ("spec.sh", "vllm serve meta-llama/Llama-3.1-8B --speculative-config '[1, 2]'\n", "not a JSON object"),
    # a value the setting refuses names the file's flag, not trainfit's alone (was "--draft-model must be text, got
    # 3", "--max-model-len must be a positive integer", "--tp must be ...")
    ("spec2.sh", "vllm serve meta-llama/Llama-3.1-8B --speculative-config '{\"model\": 3}'\n",
     "spec2.sh: --speculative-config model 3 (read as --draft-model): --draft-model must be text"),
    ("ctx.sh", "python -m sglang.launch_server --model-path meta-llama/Llama-3.1-8B --context-length 0\n",
     "ctx.sh: --context-length 0 (read as --max-model-len): "),
    ("tp.sh", "vllm serve meta-llama/Llama-3.1-8B -tp 0\n", "tp.sh: --tensor-parallel-size 0 (read as --tp): "),
    ("job.toml", "[training]\nlocal_batch = 3\n", "Invalid field names"),
    ("run.sh", "torchrun --nproc_per_node 8 -m torchtitan.train --training.local_batch_size x\n",
     "invalid literal for int()"),
    ("mega.sh", "torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers $NUM_LAYERS\n", "shell variables"),
    # Megatron-LM core_v0.16.1 arguments.py:600-601 refuses the gather's overlap without the reduce's
    ("mega2.sh", "torchrun --nproc_per_node 8 pretrain_gpt.py --use-distributed-optimizer --overlap-param-gather\n",
     "--overlap-grad-reduce"),
    # transformers 5.24.0 training_args.py:1784-1785 (before: read as amp-bf16)
    ("args.json", '{"output_dir": "out", "per_device_train_batch_size": 2, "bf16": true, "fp16": true}',
     "At most one of fp16 and bf16 can be True"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, name, text, needle):
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    with pytest.raises(SystemExit) as e:
        main(["check", str(path), "--model", MODEL])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and needle in err and "\n" not in err


@pytest.mark.parametrize("server", ["vllm", "sglang"])
def test_a_kv_cache_dtype_refusal_lists_what_the_reader_takes(tmp_path, server):
    """The refusal of an unmodelled --kv-cache-dtype names every value the reader takes: each one it lists reads
    back. Before, vLLM's said "auto, fp8, bfloat16" and the reader took float16 and fp8_e4m3 too (and float32, which
    vLLM's CacheDType has no place for: config/cache.py at vllm-project/vllm 002f10e0, and the estimate then refused
    it)."""
    import re

    from trainfit.errors import SetupError

    line = {"vllm": "vllm serve m --kv-cache-dtype {}\n", "sglang": "python -m sglang.launch_server --model-path m "
            "--kv-cache-dtype {}\n"}[server]
    path = tmp_path / "serve.sh"
    path.write_text(line.format("fp8_e5m2"))
    with pytest.raises(SetupError) as e:
        read(path)
    listed = re.search(r"trainfit models (.*)$", str(e.value)).group(1).split(", ")
    for dtype in listed:
        path.write_text(line.format(dtype))
        read(path)  # every listed value is read
    candidates = ("float16", "float32", "bfloat16", "fp8", "fp8_e4m3", "bf16", "half", "int8", "fp8_e5m2")
    for dtype in candidates:  # and every value the reader takes is listed
        path.write_text(line.format(dtype))
        try:
            read(path)
        except SetupError:
            continue
        assert dtype in listed, (dtype, listed)
    if server == "vllm":  # vLLM 0.33's CacheDType: float16, bfloat16, fp8, fp8_e4m3 (and ones trainfit does not model)
        assert sorted(listed) == sorted(["auto", "float16", "bfloat16", "fp8", "fp8_e4m3"])


def test_trainer_arguments_fill_deepspeeds_auto_values(tmp_path):
    """The HF Trainer's way: a ds_config.json of "auto" values beside TrainingArguments (transformers
    integrations/deepspeed.py trainer_config_process fills train_micro_batch_size_per_gpu from
    per_device_train_batch_size, gradient_accumulation_steps, gradient_clipping from max_grad_norm); DeepSpeed's
    bf16 block and ZeRO stage decide precision and sharding, TRL's max_length the sequence."""
    ds = tmp_path / "ds.json"
    ds.write_text('{"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", '
                  '"gradient_clipping": "auto", "bf16": {"enabled": true}, '
                  '"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}, "allgather_bucket_size": 1}}')
    args = tmp_path / "args.yaml"
    args.write_text("output_dir: out\nper_device_train_batch_size: 4\ngradient_accumulation_steps: 8\nbf16: true\n"
                    "gradient_checkpointing: true\nmax_grad_norm: 0.5\nlearning_rate: 2.0e-5\nmax_length: 4096\n"
                    f"deepspeed: {ds}\noptim: adamw_torch_fused\nfoo_bar: 3\n")
    readings = [read(ds), read(args)]
    req, _ = request_of(readings, MODEL, None, 8)
    s = req.setup(load_spec(MODEL))
    assert (s.stack, s.zero, s.precision, s.offload, s.batch, s.grad_accum, s.recompute, s.grad_clip_norm, s.seq,
            s.optimizer_kernel, s.dp) == ("deepspeed", 2, "bf16-master", "optimizer", 4, 8, "full", 0.5, 4096,
                                          "fused", 8)
    assert any(x.startswith("zero_optimization.allgather_bucket_size = 1") for x in readings[0].not_modelled)
    assert readings[1].unknown == ["foo_bar"] and "learning_rate" in readings[1].no_effect


@pytest.mark.parametrize("ds_key,args_key,precision", [("bf16", "bf16", "bf16-master"),
                                                       ("fp16", "fp16", "fp16-master"), ("bf16", "fp16", "fp32")])
def test_trainer_arguments_fill_deepspeeds_auto_precision(tmp_path, ds_key, args_key, precision):
    """DeepSpeed's "bf16"/"fp16": {"enabled": "auto"} takes the TrainingArguments' bf16/fp16 (transformers 5.24.0
    integrations/deepspeed.py:183-184 fill_match), DeepSpeed then runs master weights in fp32 (before: fp32 whatever
    the TrainingArguments said, and their deepspeed file named as not passed though it was)."""
    ds = tmp_path / "ds.json"
    ds.write_text('{"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", '
                  f'"train_batch_size": "auto", "{ds_key}": {{"enabled": "auto"}}, '
                  '"zero_optimization": {"stage": 2}}')
    args = tmp_path / "args.json"
    args.write_text(f'{{"output_dir": "out", "per_device_train_batch_size": 2, "{args_key}": true, '
                    f'"deepspeed": "{ds}"}}')
    readings = [read(ds), read(args)]
    req, notes = request_of(readings, MODEL, None, 8)
    assert (req.precision, req.stack, req.batch, req.zero) == (precision, "deepspeed", 2, 2)
    said = [x for r in readings for x in r.not_modelled] + notes
    assert not [x for x in said if "'auto'" in x or "pass it to check too" in x], said


@pytest.mark.parametrize("ds_json,args_json,needle", [
    ('"bf16": {"enabled": false}', '"bf16": true', "bf16.enabled False vs bf16 True"),
    ('"train_micro_batch_size_per_gpu": 4', '"per_device_train_batch_size": 8',
     "train_micro_batch_size_per_gpu 4 vs per_device_train_batch_size 8"),
    ('"gradient_accumulation_steps": 2, "gradient_clipping": 0.5', '"gradient_accumulation_steps": 4',
     "gradient_accumulation_steps 2 vs gradient_accumulation_steps 4, gradient_clipping 0.5 vs max_grad_norm 1.0"),
])
def test_deepspeed_values_contradicting_trainer_arguments_are_refused(tmp_path, capsys, ds_json, args_json, needle):
    """A DeepSpeed value other than "auto" that differs from the TrainingArguments': the HF Trainer refuses to start
    (transformers 5.24.0 integrations/deepspeed.py:130-132 fill_match, :258-263 its ValueError): one line naming
    each key with both values, exit 2 (before: one of them taken silently, or a message naming neither key)."""
    ds, args = tmp_path / "ds.json", tmp_path / "args.json"
    ds.write_text(f'{{"train_micro_batch_size_per_gpu": "auto", {ds_json}, "zero_optimization": {{"stage": 2}}}}')
    args.write_text(f'{{"output_dir": "out", {args_json}, "deepspeed": "{ds}"}}')
    with pytest.raises(SystemExit) as e:
        main(["check", str(ds), str(args), "--model", MODEL, "--dp", "2"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and needle in err and '"auto"' in err and "\n" not in err, err


def test_deepspeed_values_equal_to_trainer_arguments_are_taken(tmp_path):
    """Explicit DeepSpeed values equal to the TrainingArguments' pass the HF Trainer's check; "auto" ones are still
    filled from them (fp16.enabled here)."""
    ds, args = tmp_path / "ds.json", tmp_path / "args.json"
    ds.write_text('{"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, "gradient_clipping": 1, '
                  '"bf16": {"enabled": false}, "fp16": {"enabled": "auto"}, "zero_optimization": {"stage": 1}}')
    args.write_text(f'{{"output_dir": "out", "per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, '
                    f'"fp16": true, "deepspeed": "{ds}"}}')
    req, _ = request_of([read(ds), read(args)], MODEL, None, 2)
    assert (req.batch, req.grad_accum, req.max_grad_norm, req.precision, req.zero) == (4, 2, 1.0, "fp16-master", 1)


def test_deepspeeds_auto_precision_without_trainer_arguments_is_named(tmp_path):
    """Nothing fills bf16.enabled "auto": read as off (fp32), and said so."""
    ds = tmp_path / "ds.json"
    ds.write_text('{"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": "auto"}, '
                  '"zero_optimization": {"stage": 1}}')
    r = read(ds)
    req, _ = request_of([r], MODEL, None, 8)
    assert req.precision == "fp32"
    assert any(x.startswith("bf16.enabled = 'auto'") and "none were read with it" in x for x in r.not_modelled)


@pytest.mark.parametrize("name,text", [
    ("job.toml", '[model]\nname = "llama3"\nflavor = "8B"\n\n[parallelism]\ndata_parallel_shard_degree = 4\n'),
    ("serve.sh", "vllm serve meta-llama/Llama-3.1-8B --tensor-parallel-size 2\n"),
])
def test_a_model_other_than_the_files_is_refused(tmp_path, capsys, name, text):
    """--model another model than the file names: one line and exit 2, as a conflicting --dp (before: --model
    silently replaced it); the same model named otherwise (a hub id, an alias of torchtitan's flavor) is taken."""
    path = tmp_path / name
    path.write_text(text)
    r = read(path)
    assert request_of([r], "llama3.1-8b", "H100-80GB", None)[0].model == "llama3.1-8b"
    with pytest.raises(SystemExit) as e:
        main(["check", str(path), "--model", "qwen3-30b-a3b", "--gpu", "H100-80GB"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --model qwen3-30b-a3b: the files say") and "\n" not in err


def test_a_training_config_with_a_serving_command_is_refused_as_such(tmp_path, capsys):
    """A torchtitan job and a `vllm serve` line of the same model: two jobs, not different models."""
    job, serve = tmp_path / "job.toml", tmp_path / "serve.sh"
    job.write_text('[model]\nname = "llama3"\nflavor = "8B"\n\n[parallelism]\ndata_parallel_shard_degree = 4\n')
    serve.write_text("vllm serve meta-llama/Llama-3.1-8B --tensor-parallel-size 2\n")
    with pytest.raises(SystemExit) as e:
        main(["check", str(job), str(serve), "--gpu", "H100-80GB"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "is a training config and" in err and "check them separately" in err and "\n" not in err


def test_megatrons_own_llama3_8b_fp8_example_by_hand():
    """Megatron-LM's example (tests/readers/data: its variables expanded) read as Megatron-LM runs it: 8 ranks at tp
    = cp = pp = 1 → dp 8 (world / (tp × pp × cp)); accumulation = 128 / (1 × 8) = 16; the distributed optimizer =
    ZeRO-1; --bf16 with fp32 main params = bf16-master; fp8 hybrid with no --fp8-recipe = TransformerConfig's default
    "delayed" (megatron-core 0.16.1 transformer_config.py:436-438); --fp8-param-gather; --sequence-parallel at tp 1 is
    turned off (arguments.py:907-913); --cross-entropy-loss-fusion with no --cross-entropy-fusion-impl = the config's
    default "native" (model_parallel_config.py:246); 1,953,125,000 samples × 8192 tokens; the model flags are
    Llama-3.1-8B's."""
    from pathlib import Path

    r = read(Path(__file__).parent / "data" / "train_llama3_8b_h100_fp8.sh")
    req, _ = request_of([r], MODEL, "H100-80GB", None)
    spec = load_spec(MODEL)
    for c in r.checks:
        c(spec)
    s = req.setup(spec)
    assert (s.stack, s.dp, s.tp, s.pp, s.cp, s.batch, s.grad_accum, s.seq, s.zero, s.precision, s.low_precision,
            s.fp8_all_gather, s.sequence_parallel, s.grad_reduce_in_bf16, s.recompute, s.grad_clip_norm) == (
        "megatron", 8, 1, 1, 1, 1, 16, 8192, 1, "bf16-master", "delayed", True, False, True, "none", 1.0)
    assert req.tokens == 1953125000 * 8192
    assert s.loss_fusion == "native"
    assert not r.unknown
    # --overlap-grad-reduce is what trainfit models (parallel/zero.py dp_comm); --overlap-param-gather a setting
    assert s.overlap_param_gather and not any("overlap" in x for x in r.not_modelled)
    with pytest.raises(Exception, match="--num-layers 32"):
        for c in r.checks:
            c(load_spec("llama-3.2-1b"))


@pytest.mark.heavy
def test_an_mx_recipe_trainfit_does_not_model_is_named_not_dropped(tmp_path):
    """quantize.linear.mx.recipe_name: torchao's mxfp8_cublas / mxfp8_cublas_rceil read as --low-precision mxfp8
    with their --mx-scale (test_round_trip_per_writer); its emulated and MXFP4 recipes (MXLinearRecipeName, v0.16.0
    config.py:42-47) are named as not modelled, and no recipe is set."""
    from pathlib import Path

    text = (Path(__file__).parent / "data" / "llama3_8b.toml").read_text()
    text = text.replace('# converters = ["float8"]', 'converters = ["quantize.linear.mx"]')
    f = tmp_path / "job.toml"
    f.write_text(text + '\n[quantize.linear.mx]\nrecipe_name = "mxfp4_cutlass"\n')
    r = read(f, dp=64)
    assert "low_precision" not in r.values
    assert any(x.startswith("quantize.linear.mx.recipe_name = 'mxfp4_cutlass': not modelled") for x in r.not_modelled)


def test_check_json_of_a_deepspeed_config_is_json_alone(tmp_path):
    """Importing deepspeed logs 'Setting accelerator to CPU' to stdout (its logger's handler): `check --json` must
    print the JSON object alone there (a fresh process: the import happens inside the command)."""
    import json
    import subprocess
    import sys

    path = tmp_path / "ds.json"
    path.write_text('{"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2}, "bf16": {"enabled": true}}')
    out = subprocess.run([sys.executable, "-m", "trainfit.cli", "check", str(path), "--model", "tiny-llama", "--dp", "2",
                          "--json"], capture_output=True, text=True, check=True).stdout
    assert json.loads(out)["setup"]["zero"] == 2


@pytest.mark.parametrize("text, same_as", [
    # vLLM's FlexibleArgumentParser.parse_args (vllm/utils/argparse_utils.py) turns a flag's underscores into dashes
    # before argparse: `vllm serve m --max_model_len 8192` runs at 8192 (before: listed as unknown, estimated at the
    # model's whole length)
    ("vllm serve m --max_model_len 8192 --gpu_memory_utilization=0.8 --tensor_parallel_size 2",
     "vllm serve m --max-model-len 8192 --gpu-memory-utilization 0.8 --tensor-parallel-size 2"),
    # and merges a JSON flag's dotted keys into its object (--speculative-config.model M: before, unknown)
    ("vllm serve m --speculative-config.model d --speculative_config.num_speculative_tokens 4",
     "vllm serve m --speculative-config '{\"model\": \"d\", \"num_speculative_tokens\": 4}'"),
])
def test_vllm_flags_spelt_as_its_flexible_parser_takes_them(tmp_path, text, same_as):
    (tmp_path / "a.sh").write_text(text + "\n")
    (tmp_path / "b.sh").write_text(same_as + "\n")
    got, want = read(tmp_path / "a.sh"), read(tmp_path / "b.sh")
    assert not got.unknown, got.unknown
    assert (got.values, got.not_modelled) == (want.values, want.not_modelled)


@pytest.mark.parametrize("value", ["auto", "AUTO", "-1"])
def test_vllm_max_model_len_auto_is_listed_not_refused(tmp_path, value):
    """vLLM takes --max-model-len auto / -1 (human_readable_int_or_auto, engine/arg_utils.py) and auto-fits the
    length to the KV cache (v1/core/kv_cache_utils.py _auto_fit_max_model_len); check refused the command as 'a
    flag's value does not parse (... invalid integer 'auto' ...)'. It is listed, the estimate at the model's length."""
    path = tmp_path / "serve.sh"
    path.write_text(f"vllm serve m --max-model-len {value} -tp 2\n")
    r = read(path)
    assert "max_model_len" not in r.values and r.values["tp"] == 2
    assert any(x.startswith("--max-model-len = 'auto': not modelled") for x in r.not_modelled), r.not_modelled


@pytest.mark.parametrize("name, text, has", [
    ("serve.sh", "vllm serve llama-3.1-8b --enforce-eager --max-num-seqs 64\n", "--enforce-eager"),
    ("args.yaml", "output_dir: o\nper_device_train_batch_size: 2\ntf32: true\n", "--tf32"),
])
def test_the_as_trainfit_line_is_a_command_estimate_runs(tmp_path, cli, name, text, has):
    """check printed switches as '--enforce-eager True', '--tf32 True', which `trainfit estimate` refuses ('Got
    unexpected extra argument(s) (True)'): a switch is printed alone when on. Run as printed, estimate answers as
    check does."""
    import json
    import shlex

    path = tmp_path / name
    path.write_text(text)
    extra = ["--model", "llama-3.2-1b"] if name.endswith(".yaml") else []
    code, out, err = cli("check", str(path), *extra, "--gpu", "H100-80GB")
    assert code == 0, err
    line = next(x for x in out.splitlines() if x.startswith("as trainfit: "))
    argv = shlex.split(line.removeprefix("as trainfit: "))
    assert has in argv and "True" not in argv, line
    model = extra[1] if extra else "llama-3.1-8b"
    code, est, err = cli("estimate", model, *argv, "--gpu", "H100-80GB", "--json")
    assert code == 0, err
    code, out, _ = cli("check", str(path), *extra, "--gpu", "H100-80GB", "--json")
    assert json.loads(out)["memory"] == json.loads(est)["memory"]


@pytest.mark.parametrize("version", serving_versions.versions("vllm"))
def test_the_vllm_command_written_for_a_release_has_only_that_releases_flags(version):
    """--emit vllm for each listed release writes only options of that release's own serve parser (its option
    strings, dumped from it: data/serve_flags.json), here with every optional flag the writer has: a KV dtype, the
    quantisation, eager mode and a draft model (0.8.5 has --speculative-config too: its engine/arg_utils.py)."""
    import shlex

    from trainfit.plan.emit_vllm import vllm_command

    release = serving_versions.parse(f"vllm=={version}")
    req = Request(model=MODEL, mode="serve", server=f"vllm=={version}", gpu="H100-80GB", tp=2, kv_dtype="fp8",
                  enforce_eager=True, quant="fp8", draft_model="llama-3.2-1b")
    first = run_engines(req, "analytic")[0]
    argv = shlex.split(vllm_command(MODEL, first.setup, first.detail.serving))
    flags = [a for a in argv if a.startswith("--")]
    assert len(flags) >= 12 and all(serving_versions.has_flag(release, f) for f in flags), flags
