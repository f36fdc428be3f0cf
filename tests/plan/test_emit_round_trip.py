"""`trainfit plan --emit X`: the config written is the setup the plan estimated. Each config is read back with its
stack's own parser (DeepSpeed's DeepSpeedConfig, accelerate's load_config_from_file: trainfit.readers) and the plan
printed on stderr is held to what that file runs."""
from __future__ import annotations

import json
import re

import pytest

from trainfit.api import load_gpu, load_spec
from trainfit.engines import analytic
from trainfit.readers import read

GiB = 2**30


def _plan_line(err: str) -> tuple[str, float, float]:
    """(stack, tokens/s, peak GiB) of the `plan: ...` line --emit prints on stderr."""
    line = next(x for x in err.splitlines() if x.startswith("plan:"))
    m = re.search(r"stack (\S+?)(?: --[^:]*)?: ([\d,]+) tokens/s, peak ([\d.]+) GiB", line)
    return m.group(1), float(m.group(2).replace(",", "")), float(m.group(3))


@pytest.mark.parametrize("engine,ext,runs", [("deepspeed", ".json", "deepspeed"), ("accelerate", ".yaml", "hf")])
def test_emitted_config_runs_the_stack_the_plan_estimated(cli, tmp_path, engine, ext, runs):
    """A DeepSpeed JSON runs DeepSpeed's ZeRO engine (the deepspeed stack), an accelerate FSDP YAML the HF
    Trainer / accelerate step (the hf stack). Before: --emit deepspeed emitted the hf stack's plan (llama-3.1-8b on
    8 H100s: ZeRO-3 micro-batch 3, 'stack hf: 74,871 tokens/s, peak 61.2 GiB') as a DeepSpeed config whose own run
    the deepspeed stack estimates at 62.6 GiB and 75,943 tokens/s; and the re-search for a plan DeepSpeed holds
    searched the hf stack (--stack deepspeed --seq 131072: 'stack hf --ulysses 8: 20,647 tokens/s', where the
    deepspeed stack's Ulysses plan runs 12,421)."""
    other = {"deepspeed": "hf", "accelerate": "deepspeed"}[engine]  # a plan of the stack the file does not run
    code, out, err = cli("plan", "llama-3.1-8b", "--gpu", "H100-80GB", "--gpus", "8", "--stack", other,
                         "--emit", engine)
    assert code == 0, err
    stack, tps, peak = _plan_line(err)
    assert stack == runs
    path = tmp_path / f"job{ext}"
    path.write_text(out)
    r = read(path)  # DeepSpeedConfig / load_config_from_file parse it
    assert r.values["stack"] == runs
    assert f"cannot run on {engine} (the plan models the {other} stack's step" in " ".join(err.split())
    if engine == "deepspeed":  # (the file holds the whole batch: the plan's estimate is the file's run's)
        spec = load_spec("llama-3.1-8b")
        from trainfit.cli.check import request_of

        req, _ = request_of([r], "llama-3.1-8b", "H100-80GB", None)
        e = analytic(spec, req.setup(spec), load_gpu("H100-80GB"))
        assert e.memory.peak / GiB == pytest.approx(peak, abs=0.05)
        assert e.time.tokens_per_second == pytest.approx(tps, abs=1)


def test_deepspeed_ulysses_plan_is_the_deepspeed_stacks(cli):
    code, out, err = cli("plan", "llama-3.1-8b", "--gpu", "H100-80GB", "--gpus", "8", "--seq", "131072", "--stack",
                         "deepspeed", "--emit", "deepspeed")
    assert code == 0, err
    assert _plan_line(err)[0] == "deepspeed" and json.loads(out)["sequence_parallel_size"] > 1


@pytest.mark.parametrize("zero", [2, 3])
def test_torchtitan_context_parallel_job_shards_as_planned(tmp_path, zero):
    """torchtitan applies FSDP over dp_shard × cp whenever cp > 1, dp_shard 1 included (0.2.2
    distributed/parallel_dims.py:333-335 fsdp_enabled; models/llama3/infra/parallelize.py:125), resharding after the
    forward by fsdp_reshard_after_forward (:319-327). Before: a plan of dp 1 × cp 8 ZeRO-3 (llama-3.1-8b, --seq
    131072 on 8 H100s) was read back by `trainfit check` as ZeRO-0 and refused ('--cp 8 with --zero 0'); and its
    ZeRO-2 form left fsdp_reshard_after_forward out, so torchtitan ran "default" (resharded: ZeRO-3)."""
    titan = pytest.importorskip("torchtitan")  # noqa: F841
    from torchtitan.config import ConfigManager
    from torchtitan.distributed.parallel_dims import ParallelDims

    from trainfit.cli.check import request_of
    from trainfit.plan import emit
    from trainfit.setup import Request

    spec = load_spec("llama-3.1-8b")
    s = Request(model="llama-3.1-8b", stack="torchtitan", precision="amp-bf16", seq=131072, dp=1, cp=8, zero=zero,
                recompute="op").setup(spec)
    path = tmp_path / "job.toml"
    path.write_text(emit.emit("torchtitan", s, spec, 8))
    cfg = ConfigManager().parse_args(["--job.config_file", str(path)])
    p = cfg.parallelism
    dims = ParallelDims(dp_replicate=p.data_parallel_replicate_degree, dp_shard=p.data_parallel_shard_degree,
                        cp=p.context_parallel_degree, tp=p.tensor_parallel_degree, pp=p.pipeline_parallel_degree,
                        ep=p.expert_parallel_degree, etp=p.expert_tensor_parallel_degree, world_size=8)
    assert dims.fsdp_enabled
    resharded = {"always": True, "never": False, "default": not dims.pp_enabled}[p.fsdp_reshard_after_forward]
    assert (3 if resharded else 2) == zero
    req, _ = request_of([read(path)], None, "H100-80GB", None)
    got = req.setup(spec)
    assert (got.dp, got.cp, got.zero) == (1, 8, zero)


@pytest.mark.parametrize("dp,zero", [(8, 0), (1, 0), (8, 3)])
def test_accelerate_config_and_its_trainer_settings_give_the_plan(tmp_path, dp, zero):
    """accelerate's config holds no micro-batch, accumulation or (without FSDP) checkpointing: the emitted header names
    them as TrainingArguments. Those settings, written as the TrainingArguments file they name and read with the YAML
    (accelerate's load_config_from_file, transformers' TrainingArguments: trainfit.readers), give back the plan's
    setup. Before: a DDP plan with full recompute (dp 8, ZeRO-0: distributed_type MULTI_GPU) left
    gradient_checkpointing out of the header (it was said at dp 1 only), so the run kept every activation."""
    from accelerate.commands.config.config_args import load_config_from_file

    from trainfit.cli.check import request_of
    from trainfit.plan import emit
    from trainfit.setup import Request

    spec = load_spec("llama-3.1-8b")
    s = Request(model="llama-3.1-8b", stack="hf", precision="amp-bf16", batch=3, grad_accum=2, dp=dp, zero=zero,
                recompute="full").setup(spec)
    text = emit.emit("accelerate", s, spec, 8)
    path = tmp_path / "accelerate.yaml"
    path.write_text(text)
    cfg = load_config_from_file(str(path))
    assert bool(cfg.fsdp_config) == (zero == 3)  # only FSDP's block has a checkpointing key
    said = next(x for x in text.splitlines() if x.startswith("# set these"))
    args = {"output_dir": "out", "bf16": True,
            **{k: json.loads(v.lower()) for k, v in re.findall(r"(\w+)=(\w+)", said)}}
    targs = tmp_path / "train_args.json"
    targs.write_text(json.dumps(args))
    req, _ = request_of([read(path), read(targs)], "llama-3.1-8b", "H100-80GB", None)
    got = req.setup(spec)
    for f in ("batch", "grad_accum", "dp", "zero", "recompute", "precision", "stack"):
        assert getattr(got, f) == getattr(s, f), f


@pytest.mark.parametrize("args, says", [
    (("--gpus", "8", "--emit", "vllm"), "--emit vllm prints a serving command: add --mode serve"),
    (("--gpus", "8", "--emit", "sglang"), "--emit sglang prints a serving command: add --mode serve"),
    (("--gpus", "8", "--emit", "nope"), "--emit 'nope' is not one of: deepspeed, accelerate"),
    (("--mode", "serve", "--concurrency", "8", "--emit", "deepspeed"), "plan --mode serve emits a serving command"),
    (("--mode", "serve", "--concurrency", "8", "--emit", "nope"), "plan --mode serve emits a serving command"),
])
def test_emit_values_of_the_other_mode_are_said_in_one_line(cli, args, says):
    """Before: --emit vllm under --mode train was 'not one of: deepspeed, ...' (no word of --mode serve), and
    --mode serve --emit deepspeed was '--server vllm emits vllm', as if the server were wrong."""
    code, out, err = cli("plan", "llama-3.1-8b", "--gpu", "H100-80GB", *args)
    assert code == 2 and not out and len(err.strip().splitlines()) == 1 and says in err, err


@pytest.mark.parametrize("optimizer", ["adamw", "adam", "lion", "sgd", "momentum"])
def test_an_offloaded_deepspeed_config_has_the_optimizer_deepspeed_builds_on_the_host(tmp_path, optimizer):
    """ZeRO-Offload refuses a client optimizer (deepspeed 0.19.8 runtime/engine.py:2342-2346: the HF Trainer's own
    AdamW, where the config has no "optimizer" block) and builds its CPU optimizer from the block (:2385-2386,
    :2505-2508): the emitted config had none, so DeepSpeed refused it under the HF Trainer. Now the block names the
    plan's optimizer with "auto" hyper-parameters, which the HF Trainer's own DeepSpeed integration fills from its
    TrainingArguments (none left "auto"), and check reads the plan's --optimizer back from it. Without offload the
    config keeps no block (the client optimizer: the deepspeed stack's step)."""
    from transformers import TrainingArguments
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    from trainfit.plan.emit_deepspeed import deepspeed
    from trainfit.setup import Setup

    s = Setup(stack="deepspeed", dp=8, zero=3, precision="bf16-master", recompute="full", optimizer=optimizer,
              offload="optimizer", batch=2)
    cfg = deepspeed(s)
    assert "optimizer" not in deepspeed(s.with_(offload="none"))
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(cfg))
    assert read(path).values["optimizer"] == optimizer  # DeepSpeedConfig parses it; the type read back
    hf = HfTrainerDeepSpeedConfig(json.loads(json.dumps(cfg)))
    hf.trainer_config_process(TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=2,
                                                 gradient_accumulation_steps=1, bf16=False))
    assert "auto" not in json.dumps(hf.config["optimizer"])
