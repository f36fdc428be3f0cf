"""`trainfit check` on launch configs as people write them for the installed stacks (transformers 5.24,
accelerate 1.15, torchtitan 0.2.2): each read as the stack reads it, by hand from the stack's own source."""
from __future__ import annotations

import pytest

from trainfit.api import load_spec
from trainfit.cli.check import request_of
from trainfit.readers import read
from trainfit.errors import SetupError
from trainfit.setup import Request

MODEL = "llama-3.1-8b"


def _setup(paths, dp=None, model=MODEL):
    readings = [read(p, dp) for p in paths]
    req, _ = request_of(readings, model, None, dp)
    return req.setup(load_spec(req.model)), readings


@pytest.mark.parametrize("fsdp,want", [
    # transformers 5.24 training_args.py:2890-2937: the legacy string moved into fsdp_config (FSDP2 by default,
    # reshard_after_forward True for full_shard, False for shard_grad_op; offload: cpu_offload)
    ('fsdp: "full_shard auto_wrap"\n', (3, 2, "none", "none")),
    ('fsdp: "full_shard offload auto_wrap"\n', (3, 2, "none", "params")),
    ('fsdp: [shard_grad_op]\n', (2, 2, "none", "none")),
    # fsdp: true with fsdp_config (:2775-2880): FSDP1's strategy names, FSDP's own activation checkpointing
    ("fsdp: true\nfsdp_config:\n  version: 1\n  reshard_after_forward: full_shard\n", (3, 1, "none", "none")),
    ("fsdp: true\nfsdp_config:\n  activation_checkpointing: true\n", (3, 2, "full", "none")),
])
def test_trainer_arguments_fsdp_reads_as_transformers_builds_it(tmp_path, fsdp, want):
    """TrainingArguments' `fsdp` (a bool in transformers 5.24 once parsed) crashed check with a TypeError
    ('bool' object is not iterable); it is read from the FSDP plugin arguments TrainingArguments builds."""
    path = tmp_path / "args.yaml"
    path.write_text("output_dir: out\nper_device_train_batch_size: 2\nbf16: true\n" + fsdp)
    s, _ = _setup([path], dp=8)
    assert (s.stack, s.dp, s.zero, s.fsdp_version, s.recompute, s.offload) == ("hf", 8, *want)


def test_trainer_arguments_fsdp_checkpointing_beside_gradient_checkpointing_is_refused(tmp_path, cli):
    """The HF Trainer refuses FSDP's own activation checkpointing with gradient_checkpointing (trainer.py:878-884)."""
    path = tmp_path / "args.yaml"
    path.write_text("output_dir: out\nper_device_train_batch_size: 2\ngradient_checkpointing: true\nfsdp: true\n"
                    "fsdp_config:\n  activation_checkpointing: true\n")
    code, _, err = cli("check", str(path), "--model", MODEL, "--dp", "8")
    assert code == 2 and "can't both be set to True" in err and "Traceback" not in err


@pytest.mark.parametrize("keys, tf32", [
    ("tf32: true\n", True),  # training_args.py:1677-1680: enable_tf32(True)
    ("torch_compile: true\n", True),  # :1664-1672: compiled, tf32 unset, neither bf16 nor fp16: TF32 on
    ("torch_compile: true\ntf32: false\n", False),
    ("", False),
])
def test_trainer_arguments_tf32_is_read_where_the_trainer_turns_it_on(tmp_path, keys, tf32):
    """An fp32 TrainingArguments with tf32: true runs its matmuls on TF32 tensor cores (transformers 5.24.0
    training_args.py:1664-1680); check listed tf32 as not modelled and estimated fp32 matmuls at the GPU's fp32
    rate, though --tf32 models it (its help names TrainingArguments tf32=True)."""
    path = tmp_path / "args.yaml"
    path.write_text("output_dir: out\nper_device_train_batch_size: 2\n" + keys)
    s, (r,) = _setup([path])
    assert (s.precision, s.tf32) == ("fp32", tf32)
    assert not any(x.startswith("tf32") for x in r.not_modelled), r.not_modelled


@pytest.mark.parametrize("optim", ["adamw_torch", "adamw_torch_fused", "sgd"])
def test_trainer_arguments_optim_kernel_is_the_one_the_trainer_builds(tmp_path, optim):
    """optim adamw_torch builds torch's AdamW without fused=True (transformers trainer_optimizer.py:201-207), which
    runs foreach on CUDA (torch/optim/adam.py:935-939); check read it as the stack's default, fused (that is
    adamw_torch_fused's), so the foreach step's temporaries were missing. sgd alike (sgd.py:277-284)."""
    from transformers import Trainer, TrainingArguments

    _, kwargs = Trainer.get_optimizer_cls_and_kwargs(TrainingArguments(output_dir=str(tmp_path), optim=optim,
                                                                       report_to="none"))
    want = "fused" if kwargs.get("fused") else "foreach"  # torch's own default where fused is not asked for
    path = tmp_path / "args.yaml"
    path.write_text(f"output_dir: out\nper_device_train_batch_size: 2\nbf16: true\noptim: {optim}\n")
    s, _ = _setup([path])
    assert s.optimizer_kernel == want


def test_trainer_arguments_with_use_liger_kernel_read_as_trainer_arguments(tmp_path):
    """use_liger_kernel is a TrainingArguments field (transformers 5.24 training_args.py:957): such a file was read
    as TRL's SFTConfig, with TRL's defaults (gradient checkpointing on, max_length 1024, its chunked LM head) the
    HF Trainer does not run. Read as TrainingArguments: no recompute, Liger's kernels (trainer.py:1494-1495)."""
    path = tmp_path / "args.yaml"
    path.write_text("output_dir: out\nper_device_train_batch_size: 4\ngradient_accumulation_steps: 2\nbf16: true\n"
                    "use_liger_kernel: true\nliger_kernel_config: {rope: false}\n")
    s, (r,) = _setup([path], dp=2)
    assert "TrainingArguments" in r.source
    default_seq = Request(model=MODEL).setup(load_spec(MODEL)).seq  # (no max_length: trainfit's default, not TRL's)
    assert (s.stack, s.batch, s.grad_accum, s.recompute, s.liger, s.loss, s.seq) == (
        "hf", 4, 2, "none", True, "fused-linear", default_seq)
    assert any(x.startswith("liger_kernel_config") for x in r.not_modelled) and not r.unknown


TITAN_TOML = """[model]
name = "llama3"
flavor = "8B"
[training]
local_batch_size = 2
seq_len = 4096
gc_freq = 50
[parallelism]
data_parallel_shard_degree = -1
tensor_parallel_degree = 1
disable_loss_parallel = true
"""


@pytest.mark.parametrize("absolute", [True, False])
def test_torchtitan_command_lines_config_file_keys_are_accounted_for(tmp_path, absolute):
    """`torchrun … -m torchtitan.train --job.config_file job.toml --…`: the TOML's keys (under the command line's,
    torchtitan 0.2.2 config/manager.py) are listed as the TOML alone lists them; they were dropped unlisted. A
    relative path is where the run starts: here, else beside the script."""
    (tmp_path / "job.toml").write_text(TITAN_TOML)
    sh = tmp_path / "run.sh"
    name = tmp_path / "job.toml" if absolute else "job.toml"
    sh.write_text(f"torchrun --nproc_per_node=8 -m torchtitan.train --job.config_file {name} "
                  "--parallelism.tensor_parallel_degree 2\n")
    s, (r,) = _setup([sh], model=None)
    assert (s.tp, s.dp, s.batch, s.seq) == (2, 4, 2, 4096)
    notes = " ".join(r.not_modelled)
    assert "parallelism.disable_loss_parallel = True" in notes and "training.gc_freq = 50" in notes


def test_torchtitan_config_file_not_found_is_one_line_and_exit_2(tmp_path, cli):
    """A --job.config_file found neither here nor beside the script: one line, exit 2 (was a FileNotFoundError
    traceback from torchtitan's ConfigManager, exit 1)."""
    sh = tmp_path / "run.sh"
    sh.write_text("torchrun --nproc_per_node=8 -m torchtitan.train "
                  "--job.config_file=./torchtitan/models/llama3/train_configs/llama3_8b.toml\n")
    code, _, err = cli("check", str(sh))
    assert code == 2 and err.startswith("error:") and "--job.config_file" in err and "Traceback" not in err


@pytest.mark.parametrize("name, flavor, words", [("flux", "flux-dev", "--stack hf or megatron"),
                                                 ("llama4", "17bx16e_irope", "(17bx16e, 17bx128e: SDPA"),
                                                 ("llama4", "17bx128e_irope", "model/model.py:277-284"),
                                                 ("gpt_oss", "debugmodel", "gpt_oss 120b, 20b")])
def test_a_torchtitan_model_trainfit_does_not_build_is_named(tmp_path, cli, name, flavor, words):
    """torchtitan 0.2.2's registry holds flux (models/__init__.py), which trainfit does not model on --stack
    torchtitan, llama4's iRoPE flavors (which fail at their first forward in 0.2.2: test_torchtitan_moe.py
    test_torchtitans_llama4_irope_flavors_fail_at_their_first_forward) and gpt_oss's debugmodel (a shape no catalog
    model has): the file's model is named with why and what to use instead, in one line, exit 2 (before: "names no
    model: pass --model", and with --model the stack's refusal of the architecture)."""
    pytest.importorskip("torchtitan")
    job = tmp_path / "job.toml"
    job.write_text(f'[model]\nname = "{name}"\nflavor = "{flavor}"\n[parallelism]\ndata_parallel_shard_degree = 8\n')
    code, _, err = cli("check", str(job), "--gpu", "H100-80GB")
    assert code == 2 and err.count("\n") == 1 and f"model.name '{name}'" in err and words in err


def test_a_torchtitan_llama4_job_reads_as_its_catalog_model(tmp_path):
    """torchtitan's llama4 17bx16e flavor is Llama 4 Scout's shape (stacks/torchtitan.toml [moe_models.llama4]):
    the job reads as llama-4-scout with its expert parallelism."""
    pytest.importorskip("torchtitan")
    job = tmp_path / "job.toml"
    job.write_text('[model]\nname = "llama4"\nflavor = "17bx16e"\n[training]\nlocal_batch_size = 1\nseq_len = 8192\n'
                   '[parallelism]\ndata_parallel_shard_degree = 8\nexpert_parallel_degree = 8\n')
    s, (r,) = _setup([job], model=None)
    assert r.model == "llama-4-scout" and (s.stack, s.dp, s.ep, s.zero, s.seq) == ("torchtitan", 8, 8, 3, 8192)


def test_a_torchtitan_gpt_oss_job_reads_as_its_catalog_model(tmp_path):
    """torchtitan's gpt_oss 20b flavor is gpt-oss-20b's shape (models/gpt_oss/__init__.py:47-61, stacks/torchtitan.toml
    [moe_models.gpt_oss]): a bf16 job reads as gpt-oss-20b with its expert parallelism."""
    pytest.importorskip("torchtitan")
    job = tmp_path / "job.toml"
    job.write_text('[model]\nname = "gpt_oss"\nflavor = "20b"\n[training]\nlocal_batch_size = 1\nseq_len = 4096\n'
                   'dtype = "bfloat16"\n[parallelism]\ndata_parallel_shard_degree = 8\nexpert_parallel_degree = 8\n')
    s, (r,) = _setup([job], model=None)
    assert r.model == "gpt-oss-20b" and (s.stack, s.dp, s.ep, s.precision) == ("torchtitan", 8, 8, "bf16")


def test_a_torchtitan_gpt_oss_job_in_fp32_master_weights_is_refused_in_one_line(tmp_path, cli):
    """torchtitan's gpt_oss casts its blocks to bf16 whatever training.dtype (models/gpt_oss/model/model.py:339-342):
    the default training.dtype float32 (bf16 blocks beside fp32 embeddings) is not modelled, said in one line with
    what to use instead, exit 2."""
    pytest.importorskip("torchtitan")
    job = tmp_path / "job.toml"
    job.write_text('[model]\nname = "gpt_oss"\nflavor = "20b"\n[parallelism]\ndata_parallel_shard_degree = 8\n')
    code, _, err = cli("check", str(job), "--gpu", "H100-80GB")
    assert code == 2 and err.count("\n") == 1 and "--precision bf16" in err and "model.py:339-342" in err


# accelerate config's own FSDP1 shape (`accelerate config` with FSDP, no fsdp_version) and the FSDP2 one
ACCELERATE = """compute_environment: LOCAL_MACHINE
distributed_type: FSDP
fsdp_config:
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_sharding_strategy: FULL_SHARD
  fsdp_state_dict_type: SHARDED_STATE_DICT
{version}mixed_precision: bf16
num_machines: 1
num_processes: 8
"""


@pytest.mark.parametrize("version,want", [("", 1), ("  fsdp_version: 1\n", 1), ("  fsdp_version: 2\n", 2)])
def test_accelerate_fsdp_version_is_read_fsdp1_unless_given(tmp_path, version, want):
    """accelerate launches FSDP1 unless the config says fsdp_version 2 (commands/launch.py:517-522, its default "1");
    fsdp_version was listed as having no effect and every config estimated as FSDP2 (trainfit's own default)."""
    path = tmp_path / "accelerate.yaml"
    path.write_text(ACCELERATE.format(version=version))
    s, (r,) = _setup([path])
    assert (s.stack, s.dp, s.zero, s.fsdp_version) == ("hf", 8, 3, want)
    assert "fsdp_config.fsdp_version" not in r.no_effect


def test_accelerate_parallelism_config_is_listed_as_run_under_fsdp2(tmp_path):
    """`accelerate launch` runs a non-empty parallelism_config under FSDP2 (commands/launch.py:1298 turns
    use_parallelism_config on from the file; utils/launch.py:369-392 hands its sizes to the run): it was listed as
    'read only with its distributed_type', as if this FSDP run ignored its tp 2."""
    from accelerate.commands.config.config_args import load_config_from_file

    path = tmp_path / "accelerate.yaml"
    path.write_text(ACCELERATE.format(version="  fsdp_version: 2\n") + "parallelism_config:\n"
                    "  parallelism_config_dp_shard_size: 4\n  parallelism_config_tp_size: 2\n")
    assert load_config_from_file(str(path)).parallelism_config != {}  # what launch.py:1298 tests
    _, (r,) = _setup([path])
    (line,) = [x for x in r.not_modelled if x.startswith("parallelism_config")]
    assert "read only with its distributed_type" not in line and "N-d parallelism" in line, line


@pytest.mark.parametrize("strategy, machines, listed", [
    ("HYBRID_SHARD", 2, True), ("4", 2, True), ("HYBRID_SHARD", 1, False), ("FULL_SHARD", 2, False)])
def test_accelerate_hybrid_shard_over_machines_is_listed(tmp_path, strategy, machines, listed):
    """FSDP1's HYBRID_SHARD shards within a node and replicates across nodes (torch/distributed/fsdp/
    _init_utils.py:201-213): over 2 machines it was read as ZeRO-3 over all 16 ranks without a word (half the
    shard memory of the run)."""
    from torch.distributed.fsdp import ShardingStrategy

    assert ShardingStrategy.HYBRID_SHARD.value == 4  # (accelerate's number for it, utils/constants.py)
    path = tmp_path / "accelerate.yaml"
    path.write_text(ACCELERATE.format(version="").replace("FULL_SHARD", strategy)
                    .replace("num_machines: 1", f"num_machines: {machines}").replace("8", str(8 * machines)))
    s, (r,) = _setup([path])
    assert s.zero == 3 and any("HSDP" in x for x in r.not_modelled) == listed, r.not_modelled


@pytest.mark.parametrize("option, want", [("op", "op"), ("2", "layer:2"), ("1", "layer:1"), ("0", "layer:1"),
                                           ("x", "torchtitan refuses it"), ("-1", "torchtitan refuses it")])
def test_torchtitan_selective_ac_option_as_torchtitan_applies_it(tmp_path, cli, option, want):
    """torchtitan's layer SAC wraps a layer when `not ac_freq or count % ac_freq == 0` (distributed/
    activation_checkpoint.py:39-40): "0" checkpoints every layer, as "1" does (check refused 'layer:0'); an option
    neither 'op' nor digits is its ValueError (:177-183; "x" was a traceback, int('x'))."""
    from torchtitan.config import ActivationCheckpoint
    from torchtitan.distributed import activation_checkpoint as ac

    import torch.nn as nn

    path = tmp_path / "job.toml"
    path.write_text(f'[model]\nname = "llama3"\nflavor = "8B"\n[activation_checkpoint]\nmode = "selective"\n'
                    f'selective_ac_option = "{option}"\n')
    if want.startswith("torchtitan"):
        with pytest.raises(ValueError, match="Invalid selective AC option"):  # torchtitan's own refusal
            ac._apply_ac_to_transformer_block(nn.Linear(2, 2), ActivationCheckpoint(mode="selective",
                                                                                    selective_ac_option=option))
        code, _, err = cli("check", str(path))
        assert code == 2 and want in err and len(err.strip().splitlines()) == 1, err
        return
    s, _ = _setup([path], model=None)
    assert s.recompute == want


@pytest.mark.parametrize("block", [
    {"zero_stage": 3, "offload_optimizer_device": "cpu", "gradient_accumulation_steps": 4, "gradient_clipping": 1.0},
    {"zero_stage": 2, "offload_optimizer_device": "none", "offload_param_device": "none",
     "gradient_accumulation_steps": 2},
    {"zero_stage": 3, "offload_optimizer_device": "cpu", "offload_param_device": "cpu"},
    {},  # DeepSpeedPlugin's defaults: ZeRO-2
])
def test_accelerate_deepspeed_settings_inline_read_as_accelerate_builds_them(tmp_path, block):
    """`accelerate config`'s DeepSpeed answers live inline (deepspeed_config: zero_stage, offload_*_device, ...),
    with no DeepSpeed JSON: check refused them ('pass its DeepSpeed config JSON (deepspeed_config_file)', a file
    the user does not have). They read as the DeepSpeed config accelerate's DeepSpeedPlugin builds from them
    (utils/dataclasses.py:1131-1218, set_mixed_precision :1301-1325), read by the DeepSpeed reader."""
    import json

    import yaml
    from accelerate.utils import DeepSpeedPlugin

    plugin = DeepSpeedPlugin(**block)
    plugin.set_mixed_precision("bf16")
    built = {k: v for k, v in plugin.deepspeed_config.items() if k != "steps_per_print"}
    built.update(train_micro_batch_size_per_gpu=1, train_batch_size=1 * 8 * plugin.gradient_accumulation_steps
                 if isinstance(plugin.gradient_accumulation_steps, int) else "auto")
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps(built))
    acc = tmp_path / "accelerate.yaml"
    acc.write_text(yaml.safe_dump({"compute_environment": "LOCAL_MACHINE", "distributed_type": "DEEPSPEED",
                                   "deepspeed_config": block, "mixed_precision": "bf16", "num_machines": 1,
                                   "num_processes": 8}))
    got, _ = _setup([acc])
    want, _ = _setup([ds], dp=8)
    keys = ("stack", "dp", "zero", "offload", "precision", "grad_accum", "max_grad_norm")
    assert {k: getattr(got, k) for k in keys} == {k: getattr(want, k) for k in keys}


def test_what_no_file_holds_is_said_with_the_value_estimated(tmp_path, cli):
    """TrainingArguments has no sequence length (the dataset's: no field of it names one) and an accelerate config
    no micro-batch either: check estimated them at trainfit's defaults without a word. Each is noted with the value
    the estimate took; a torchtitan job, which holds both, gets neither note."""
    import dataclasses
    import json

    from transformers import TrainingArguments

    assert not {"max_length", "max_seq_length", "seq_len", "block_size"} & {
        f.name for f in dataclasses.fields(TrainingArguments)}
    args = tmp_path / "args.yaml"
    args.write_text("output_dir: out\nper_device_train_batch_size: 2\nbf16: true\n")
    code, out, err = cli("check", str(args), "--model", MODEL, "--json")
    assert code == 0, err
    d = json.loads(out)
    notes = [x for x in d["check"]["not_modelled"] if "none of the files holds it" in x]
    assert notes == [f"sequence length: none of the files holds it (the training script's or dataset's): estimated "
                     f"at --seq {d['setup']['seq']}, trainfit's default: give --seq"], notes
    job = tmp_path / "job.toml"
    job.write_text(TITAN.format(g=-1, pp=""))
    code, out, err = cli("check", str(job), "--json")
    assert code == 0 and not any("none of the files" in x for x in json.loads(out)["check"]["not_modelled"]), err


MEGATRON = ("torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 32 --hidden-size 4096 --num-attention-heads 32 "
            "--seq-length 4096 --micro-batch-size 1 --global-batch-size 64 --bf16 --use-distributed-optimizer ")


@pytest.mark.parametrize("flags,want", [
    # Megatron-LM validate_args: --recompute-activations sets recompute_granularity 'selective', over any given one
    ("--recompute-activations", "selective"),
    ("--recompute-activations --recompute-granularity full", "selective"),
    ("--recompute-granularity full --recompute-method uniform --recompute-num-layers 1", "full"),
    ("--recompute-granularity full --recompute-method block --recompute-num-layers 4", "block:4"),
])
def test_megatron_recompute_flags_read_as_megatron_sets_them(tmp_path, flags, want):
    """--recompute-activations was listed as unknown and the step taken without recompute."""
    sh = tmp_path / "pretrain.sh"
    sh.write_text(MEGATRON + flags + "\n")
    s, _ = _setup([sh])
    assert s.recompute == want


@pytest.mark.parametrize("flags,says", [
    ("--recompute-granularity full", "transformer_config.py:1166-1178"),
    ("--recompute-granularity full --recompute-method uniform", "transformer_config.py:1166-1178"),
    ("--recompute-granularity selective --recompute-num-layers 2", "transformer_config.py:1179-1185"),
    ("--fp16", "transformer_config.py:915-918"),  # beside MEGATRON's --bf16 (before: read as bf16, --fp16 dropped)
])
def test_megatron_recompute_combinations_transformer_config_rejects_are_refused(tmp_path, cli, flags, says):
    """megatron-core 0.16.1 TransformerConfig raises on these (transformer_config.py:1161-1185); check took full
    recompute over one uniform layer, and selective, as if Megatron ran them."""
    sh = tmp_path / "pretrain.sh"
    sh.write_text(MEGATRON + flags + "\n")
    code, _, err = cli("check", str(sh), "--model", MODEL)
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("flags, want", [
    ("--fp8-recipe tensorwise", "none"),  # (before: read as --low-precision tensorwise)
    ("--fp8-format hybrid --fp8-recipe tensorwise", "tensorwise"),
    ("--fp8-format hybrid", "delayed"),  # the recipe's default
])
def test_megatron_fp8_runs_only_with_a_format(tmp_path, flags, want):
    """TransformerConfig.fp8 is --fp8-format (None by default, transformer_config.py:429-431): get_fp8_context turns
    FP8 on from it alone (fp8_utils.py:612, need_fp8_context = config.fp8); the recipe's own default is delayed."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    argv = flags.split()
    kw = {"fp8": argv[argv.index("--fp8-format") + 1] if "--fp8-format" in argv else None}
    if "--fp8-recipe" in argv:
        kw["fp8_recipe"] = argv[argv.index("--fp8-recipe") + 1]
    config = TransformerConfig(num_layers=2, hidden_size=64, num_attention_heads=4, **kw)
    fp8_on = bool(config.fp8)
    sh = tmp_path / "pretrain.sh"
    sh.write_text(MEGATRON + flags + "\n")
    s, (r,) = _setup([sh])
    assert s.low_precision == want and (want != "none") == fp8_on
    assert (want == "none") == ("--fp8-recipe" in r.no_effect), r.no_effect


@pytest.mark.parametrize("launch, dp, noted", [("srun python", None, True), ("srun python", 8, False),
                                              ("torchrun --nproc_per_node 8", None, False)])
def test_megatron_without_the_world_size_says_so(tmp_path, launch, dp, noted):
    """Megatron's data-parallel size is world / (tp × pp × cp) (parallel_state.py); a line launched by srun names no
    world size, and check read dp 1 without a word: --global-batch-size 64 became 64 accumulated micro-batches on
    one rank (the step time 8x an 8-rank run's)."""
    sh = tmp_path / "pretrain.sh"
    sh.write_text(MEGATRON.replace("torchrun --nproc_per_node 8", launch).replace(" --use-distributed-optimizer", "")
                  + "\n")
    s, (r,) = _setup([sh], dp=dp)
    assert (s.dp, s.grad_accum) == ((1, 64) if noted else (8, 8))
    assert any(x.startswith("data-parallel size") for x in r.not_modelled) == noted, r.not_modelled


def test_a_deepspeed_optimizer_block_is_read_or_listed_as_changing_memory(tmp_path):
    """DeepSpeed builds the optimizer its block names (runtime/engine.py _configure_basic_optimizer): Lion keeps one
    state where AdamW keeps two, so the block moves the optimizer states (it was listed under 'no effect'). A type
    trainfit builds is read as its --optimizer (Lion: engine.py:2505-2508); one it does not (Lamb: FusedLamb,
    :2501-2503) is listed as changing the optimizer states."""
    def reading(kind: str):
        path = tmp_path / f"{kind}.json"
        path.write_text('{"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "zero_optimization": '
                        '{"stage": 2, "allgather_partitions": true}, "bf16": {"enabled": true}, "optimizer": {"type": '
                        f'"{kind}", "params": {{"lr": 1e-4}}}}, "zero_allow_untested_optimizer": true}}')
        return read(path, 8)

    r = reading("Lion")
    assert r.values["optimizer"] == "lion" and not any(n.startswith("optimizer = ") for n in r.not_modelled)
    r = reading("Lamb")
    assert "optimizer" not in r.no_effect and "optimizer" not in r.values
    assert any(n.startswith("optimizer = ") and "optimizer states" in n for n in r.not_modelled)
    # DeepSpeedZeroConfig's allgather_partitions (a real key: not unknown); the untested-optimizer switch: no effect
    assert not r.unknown and "zero_allow_untested_optimizer" in r.no_effect


@pytest.mark.parametrize("blocks, want", [
    ('"offload_param": {"device": "cpu"}', "none"),  # the optimizer states stay on the GPU: listed, not offloaded
    ('"offload_optimizer": {"device": "cpu"}', "optimizer"),
    ('"offload_param": {"device": "cpu"}, "offload_optimizer": {"device": "cpu"}', "params"),
])
def test_deepspeed_offload_param_alone_keeps_the_optimizer_states_on_the_gpu(tmp_path, blocks, want):
    """DeepSpeed's ZeRO-3 offloads parameters and optimizer states by two switches (runtime/zero/stage3.py:824-831);
    trainfit's --offload params is the pair (ZeRO-Infinity). offload_param alone was read as --offload params: the
    optimizer states (fp32 master, m, v) counted in host memory while DeepSpeed keeps them on the GPU."""
    import json

    from deepspeed.runtime.config import DeepSpeedConfig

    text = ('{"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "bf16": {"enabled": true}, '
            '"zero_optimization": {"stage": 3, ' + blocks + '}}')
    path = tmp_path / "ds.json"
    path.write_text(text)
    z = DeepSpeedConfig(json.loads(text)).zero_config  # DeepSpeed's own reading of the two switches
    on_host = [b for b in (z.offload_optimizer, z.offload_param)
               if b is not None and str(getattr(b.device, "value", b.device)) == "cpu"]
    s, (r,) = _setup([path], dp=8)
    assert s.offload == want
    assert (want == "none") == (len(on_host) == 1 and z.offload_optimizer is None)
    listed = [x for x in r.not_modelled if x.startswith("zero_optimization.offload_param")]
    assert bool(listed) == (want == "none"), r.not_modelled


@pytest.mark.parametrize("checkpointing, want", [("false", "none"), ("true", "full")])
def test_deepspeed_activation_checkpointing_block_under_the_hf_trainer(tmp_path, checkpointing, want):
    """A ds_config.json with DeepSpeed's activation_checkpointing block (a common template) read with
    TrainingArguments of gradient_checkpointing: false was refused ('sets recompute = none, ... sets full: make them
    agree'), though the run is valid and checkpoints nothing: DeepSpeed's engine never applies the block and
    transformers never calls deepspeed.checkpointing (neither names it), so gradient_checkpointing decides."""
    import pathlib

    import deepspeed.runtime.engine as engine
    import transformers

    assert "activation_checkpointing_config" not in pathlib.Path(engine.__file__).read_text()
    here = pathlib.Path(transformers.__file__).parent  # (its DeepSpeed integration, the Trainer, the models' base)
    files = [*here.glob("integrations/*.py"), *here.glob("trainer*.py"), here / "modeling_utils.py"]
    assert not any("deepspeed.checkpointing" in f.read_text(errors="replace") for f in files)
    ds = tmp_path / "ds.json"
    ds.write_text('{"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", '
                  '"bf16": {"enabled": "auto"}, "zero_optimization": {"stage": 3}, '
                  '"activation_checkpointing": {"partition_activations": true}}')
    args = tmp_path / "args.yaml"
    args.write_text(f"output_dir: out\nper_device_train_batch_size: 2\nbf16: true\n"
                    f"gradient_checkpointing: {checkpointing}\ndeepspeed: {ds}\n")
    s, (_, r) = _setup([args, ds], dp=8)
    assert (s.stack, s.zero, s.recompute) == ("deepspeed", 3, want)
    assert "activation_checkpointing" in r.no_effect and not r.not_modelled, r.not_modelled


TITAN = ('[model]\nname = "llama3"\nflavor = "8B"\n[training]\nlocal_batch_size = 8\nseq_len = 2048\n'
         'global_batch_size = {g}\n[parallelism]\ndata_parallel_shard_degree = 4\n{pp}')


@pytest.mark.parametrize("g, pp, want", [
    # by hand, as torchtitan's train.py:196-215 computes it: accumulation = global / (local 8 × dp 4)
    (64, "", (8, 2, None)),
    # with PP each local batch is one 1F1B schedule of local / micro = 4 micro-batches, run 128 / 32 = 4 times
    # (train_step's loop, train.py:561): listed (before: dropped without a word, the step time 4x short)
    (128, "pipeline_parallel_degree = 2\npipeline_parallel_microbatch_size = 2\n", (2, 4, "time: 4 local batches")),
    (32, "pipeline_parallel_degree = 2\npipeline_parallel_microbatch_size = 2\n", (2, 4, None)),
])
def test_torchtitan_global_batch_accumulates_as_train_py_does(tmp_path, g, pp, want):
    path = tmp_path / "job.toml"
    path.write_text(TITAN.format(g=g, pp=pp))
    s, (r,) = _setup([path], model=None)
    listed = [x for x in r.not_modelled if x.startswith("training.global_batch_size")]
    assert (s.batch, s.grad_accum) == want[:2]
    assert (want[2] in listed[0]) if want[2] else not listed, r.not_modelled


@pytest.mark.parametrize("g, pp, why", [
    (100, "", "train.py:201-209"), (16, "", "train.py:201-209"),
    # a local batch of 8 in pipeline micro-batches of 3 (before: read as 2 micro-batches)
    (-1, "pipeline_parallel_degree = 2\npipeline_parallel_microbatch_size = 3\n", "pipeline_parallel.py:189-193"),
])
def test_torchtitan_global_batch_torchtitan_refuses_is_refused(tmp_path, cli, g, pp, why):
    """train.py:201-209 asserts global_batch_size % (local × dp) == 0: 100 and 16 against 8 × 4 (before: read as
    accumulation 3 and 1, a run torchtitan does not start); distributed/pipeline_parallel.py:189-193 raises when the
    local batch is not a whole number of pipeline micro-batches."""
    path = tmp_path / "job.toml"
    path.write_text(TITAN.format(g=g, pp=pp))
    code, _, err = cli("check", str(path))
    assert code == 2 and "torchtitan refuses it (" in err and why + ")" in err, err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("text, says", [
    # (a TypeError traceback: dict(5), 'x' > 1)
    ('{"train_micro_batch_size_per_gpu": 1, "zero_optimization": 5}', "zero_optimization is 5, not an object"),
    ('{"train_micro_batch_size_per_gpu": 1, "sequence_parallel_size": "x"}', "sequence_parallel_size is 'x'"),
    # (read with the batch dropped without a word: the estimate at micro-batch 1)
    ('{"train_micro_batch_size_per_gpu": 2.0, "gradient_accumulation_steps": 1}', "is 2.0, not a positive whole"),
    ('{"train_micro_batch_size_per_gpu": 1e400, "gradient_accumulation_steps": 1}', "is inf, not a positive whole"),
])
def test_deepspeed_values_of_the_wrong_type_are_one_line(tmp_path, cli, text, says):
    """DeepSpeed builds DeepSpeedZeroConfig(**zero_optimization) and hands the micro-batch to torch's DataLoader,
    which takes a positive int only (torch.utils.data.DataLoader's BatchSampler)."""
    from torch.utils.data import BatchSampler

    with pytest.raises(ValueError):
        BatchSampler(range(4), batch_size=2.0, drop_last=False)
    path = tmp_path / "ds.json"
    path.write_text(text)
    code, out, err = cli("check", str(path), "--model", MODEL)
    assert code == 2 and out == "" and says in err and len(err.strip().splitlines()) == 1, err


MEGATRON_MOE = ("torchrun --nproc_per_node 8 --nnodes 2 pretrain_gpt.py --num-layers 48 --hidden-size 2048 "
                "--num-attention-heads 32 --seq-length 4096 --micro-batch-size 1 --global-batch-size 64 --bf16 "
                "--use-distributed-optimizer --num-experts 128 --moe-router-topk 8 --moe-ffn-hidden-size 768 "
                "--moe-grouped-gemm --moe-token-dispatcher-type alltoall --overlap-grad-reduce --swiglu "
                "--disable-bias-linear --untie-embeddings-and-output-weights --group-query-attention "
                "--num-query-groups 4 --kv-channels 128 ")


@pytest.mark.parametrize("flags,listed", [("", None), ("--moe-token-dispatcher-type alltoall ", "time"),
                                          ("--moe-token-dispatcher-type alltoall --expert-tensor-parallel-size 1 ",
                                           "no effect")])
def test_megatron_moe_at_expert_parallel_1_is_read(tmp_path, cli, flags, listed):
    """A Megatron MoE run without --expert-model-parallel-size (EP 1: megatron-core 0.16.1 model_parallel_config.py:72
    default 1) is legal, whatever the dispatcher (TransformerConfig builds it). check refused it in one line naming a
    flag the command never gave: the reader set --moe-dispatcher to Megatron-LM's default allgather, which trainfit
    refuses at --ep 1. Now the dispatcher is read at EP > 1 only; one given at EP 1 is listed."""
    from megatron.core.transformer import TransformerConfig

    TransformerConfig(num_layers=2, hidden_size=64, num_attention_heads=4, num_moe_experts=8,
                      moe_token_dispatcher_type="alltoall", expert_model_parallel_size=1, tensor_model_parallel_size=2,
                      sequence_parallel=True, add_bias_linear=False)
    sh = tmp_path / "pretrain.sh"
    sh.write_text(MEGATRON_MOE.replace("--moe-token-dispatcher-type alltoall ", "") + "--tensor-model-parallel-size 2 "
                  "--sequence-parallel " + flags + "\n")
    s, readings = _setup([sh], model="qwen3-30b-a3b")
    assert (s.ep, s.moe_dispatcher) == (1, None)
    r = readings[0]
    assert "--moe-token-dispatcher-type" not in r.unknown
    if listed == "no effect":
        assert "--moe-token-dispatcher-type" in r.no_effect
    elif listed:
        assert any("--moe-token-dispatcher-type" in x for x in r.not_modelled), r.not_modelled
    code, _, err = cli("check", str(sh), "--model", "qwen3-30b-a3b")
    assert code == 0, err


@pytest.mark.parametrize("ep,factor,want", [("8", "1.25", 1.25), ("8", "-1", None), ("1", "1.25", None)])
def test_megatron_expert_capacity_factor_is_read(tmp_path, ep, factor, want):
    """--moe-expert-capacity-factor is a Megatron-LM flag (megatron-core 0.16.1 TransformerConfig.
    moe_expert_capacity_factor, transformer_config.py:690, through Megatron-LM core_v0.16.1 arguments.py:1621) and
    trainfit's --moe-capacity-factor. check listed it as unknown and estimated the dropless step (plan's Qwen3-30B-A3B
    command on 16 H100s, ep 16, with factor 1.0 added: 4.73 s where 3.48 s). A negative factor is TransformerConfig's
    None (:1106-1107: dropless); at --ep 1 it is listed (trainfit caps the busiest EP rank's load only)."""
    from megatron.core.transformer import TransformerConfig

    sh = tmp_path / "pretrain.sh"
    sh.write_text(MEGATRON_MOE + f"--expert-model-parallel-size {ep} --moe-expert-capacity-factor {factor}\n")
    s, readings = _setup([sh], model="qwen3-30b-a3b")
    assert s.moe_capacity_factor == want
    assert "--moe-expert-capacity-factor" not in readings[0].unknown
    if factor.startswith("-"):
        tc = TransformerConfig(num_layers=2, hidden_size=64, num_attention_heads=4, num_moe_experts=8,
                               moe_expert_capacity_factor=float(factor))
        assert tc.moe_expert_capacity_factor is None
        assert "--moe-expert-capacity-factor" in readings[0].no_effect


@pytest.mark.parametrize("flags,want", [("", "adamw"), ("--optimizer adam", "adamw"), ("--optimizer sgd", "momentum"),
                                        ("--optimizer sgd --sgd-momentum 0.95", "momentum"),
                                        ("--optimizer sgd --sgd-momentum 0", "sgd")])
def test_megatron_optimizer_is_read(tmp_path, flags, want):
    """--optimizer sgd was listed as unknown and estimated as Adam (two fp32 states per parameter, where torch's SGD
    keeps one momentum buffer, or none at momentum 0). megatron-core builds SGD with momentum sgd_momentum, 0.9 by
    default (optimizer/__init__.py:401-407): trainfit's momentum, and sgd at momentum 0."""
    from megatron.core.optimizer import OptimizerConfig

    assert OptimizerConfig(optimizer="sgd").sgd_momentum > 0  # (the default momentum: one state per parameter)
    sh = tmp_path / "pretrain.sh"
    sh.write_text(MEGATRON + flags + "\n")
    s, readings = _setup([sh])
    assert s.optimizer == want
    assert not {"--optimizer", "--sgd-momentum"} & set(readings[0].unknown)


def test_megatron_optimizer_it_does_not_build_is_refused(tmp_path):
    sh = tmp_path / "pretrain.sh"
    sh.write_text(MEGATRON + "--optimizer lamb\n")
    with pytest.raises(SetupError, match="adam or sgd"):
        _setup([sh])


# vLLM 0.33's `vllm serve ... --config FILE`, by hand from vllm/utils/argparse_utils.py (the wheel's): the file's keys
# pulled in before the command line's flags (_pull_args_from_config :516-604), each as load_config_file writes it
# (:606-673), then its underscores read as dashes (:374-394)
VLLM_YAML = """model: meta-llama/Llama-3.1-8B
tensor_parallel_size: 2
max-model-len: 8k
enforce-eager: true
enable-prefix-caching: false
disable-log-stats: false
served-model-name: [a, b]
speculative-config:
  model: meta-llama/Llama-3.2-1B
  num_speculative_tokens: 4
"""


def test_vllm_config_file_is_read_under_the_command_line(tmp_path):
    """`vllm serve --config serve.yaml -tp 4`: --config was listed as unknown and none of the file's keys read (here:
    tp 1, the model's own length, no draft, CUDA graphs on). By hand: tensor_parallel_size 2 is --tensor-parallel-size,
    and -tp 4 after it wins; 8k is 8,000 (human_readable_int); true is the bare flag; false --no-enable-prefix-caching
    (an EngineArgs bool field: BooleanOptionalAction, engine/arg_utils.py:384-386) and nothing for the store_true
    --disable-log-stats (:1921); a list its items; a mapping JSON (--speculative-config); model: --model."""
    (tmp_path / "serve.yaml").write_text(VLLM_YAML)
    sh = tmp_path / "serve.sh"
    sh.write_text("vllm serve --config serve.yaml -tp 4\n")
    r = read(sh)
    assert r.model == "meta-llama/Llama-3.1-8B"
    assert {k: r.values.get(k) for k in ("tp", "max_model_len", "enforce_eager", "draft_model")} == {
        "tp": 4, "max_model_len": 8000, "enforce_eager": True, "draft_model": "meta-llama/Llama-3.2-1B"}
    assert any(x.startswith("--no-enable-prefix-caching") for x in r.not_modelled), r.not_modelled
    assert "--served-model-name" in r.no_effect and "--disable-log-stats" not in r.no_effect and not r.unknown


def test_vllm_config_file_model_is_under_the_command_lines(tmp_path):
    """The command line's model wins over the file's (argparse_utils.py:324-354 moves --model to the positional,
    cli/serve.py:55-57 takes the positional)."""
    (tmp_path / "serve.yaml").write_text(VLLM_YAML)
    for line in ("vllm serve Qwen/Qwen3-8B --config serve.yaml",
                 "vllm serve --config serve.yaml --model Qwen/Qwen3-8B"):
        sh = tmp_path / "serve.sh"
        sh.write_text(line + "\n")
        r = read(sh)
        assert (r.model, r.values["tp"]) == ("Qwen/Qwen3-8B", 2), line


def test_vllm_config_written_with_an_equals_sign_is_listed(tmp_path):
    """vLLM pulls a file in only for the word --config (argparse_utils.py:371): `--config=serve.yaml` is argparse's,
    and nothing reads it; listed, not read (the file's tp 2 is not taken)."""
    (tmp_path / "serve.yaml").write_text(VLLM_YAML)
    sh = tmp_path / "serve.sh"
    sh.write_text("vllm serve m --config=serve.yaml\n")
    r = read(sh)
    assert "tp" not in r.values and any(x.startswith("--config = 'serve.yaml': not modelled") for x in r.not_modelled)


@pytest.mark.parametrize("line, yaml, says", [
    ("vllm serve --config serve.yaml", "tensor-parallel-size: 2\n", "no model"),  # (:577-583)
    ("vllm serve m --config missing.yaml", None, "no such file here or beside the script"),
    ("vllm serve m --config serve.yaml", "- tensor-parallel-size\n", "a YAML mapping"),
    ("vllm serve m --config serve.yaml", "max-model-len: [1\n", "not valid YAML"),
    ("vllm serve m --config serve.yaml --config serve.yaml", "max-model-len: 8k\n", "given twice"),  # (:551)
])
def test_vllm_config_file_bad_input_is_one_line_and_exit_2(tmp_path, cli, line, yaml, says):
    if yaml is not None:
        (tmp_path / "serve.yaml").write_text(yaml)
    sh = tmp_path / "serve.sh"
    sh.write_text(line + "\n")
    code, _, err = cli("check", str(sh), "--model", MODEL, "--gpu", "H100-80GB")
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


# an SGLang --config file as SGLang's docs write one: its own flag names, dashes
SGLANG_YAML = """model-path: meta-llama/Llama-3.1-8B
tp-size: 2
context-length: 8192
mem-fraction-static: 0.8
max-running-requests: 64
disable-cuda-graph: true
port: 30000
"""


@pytest.mark.parametrize("text, line", [
    (VLLM_YAML, "vllm serve --config serve.yaml"),
    (SGLANG_YAML, "python -m sglang.launch_server --config serve.yaml"),
])
def test_serving_config_yaml_by_itself_reads_as_its_engines_command(tmp_path, text, line):
    """`check serve.yaml` of a bare vLLM or SGLang --config file was read as TrainingArguments ('serve.yaml names no
    model: pass --model', or a training estimate). Told apart by keys only one engine's parser takes (vLLM's
    max-model-len, tensor_parallel_size read as a dash; SGLang's model-path, tp-size, context-length), it reads as
    the engine's command line with that --config does."""
    (tmp_path / "serve.yaml").write_text(text)
    sh = tmp_path / "serve.sh"
    sh.write_text(line + "\n")
    r, want = read(tmp_path / "serve.yaml"), read(sh)
    assert (r.model, r.values, r.not_modelled, r.no_effect, r.unknown) == \
        (want.model, want.values, want.not_modelled, want.no_effect, want.unknown)
    assert r.values["mode"] == "serve" and r.values["tp"] == 2 and r.model == "meta-llama/Llama-3.1-8B"


def test_serving_config_yaml_without_a_model_takes_model(tmp_path, cli):
    """vLLM needs the model on its command line or in the file (argparse_utils.py:574-583): the file alone leaves it
    to --model, as `vllm serve MODEL --config FILE` gives it."""
    path = tmp_path / "serve.yaml"
    path.write_text("tensor-parallel-size: 2\nmax-model-len: 8192\ngpu-memory-utilization: 0.85\n")
    code, _, err = cli("check", str(path))
    assert code == 2 and "names no model: pass --model" in err, err
    code, out, err = cli("check", str(path), "--model", MODEL, "--gpu", "H100-80GB")
    assert code == 0 and "--server vllm --tp 2 --max-model-len 8192 --gpu-memory-utilization 0.85" in out, err


@pytest.mark.parametrize("name, text, says", [
    ("serve.yaml", "model: m\nmax-model-len: 8192\ncontext-length: 8192\n",
     "both vLLM's flags (max-model-len) and SGLang's (context-length)"),
    ("serve.yaml", "model: m\ntensor-parallel-size: 2\nkv-cache-dtype: fp8\n",
     "`vllm serve --config serve.yaml` or `python -m sglang.launch_server --config serve.yaml`"),
    ("serve.json", '{"model": "m", "max_model_len": 8192}', "vLLM reads a .yaml or .yml one only"),
])
def test_serving_config_of_no_one_engine_is_one_line_and_exit_2(tmp_path, cli, name, text, says):
    path = tmp_path / name
    path.write_text(text)
    code, _, err = cli("check", str(path), "--gpu", "H100-80GB")
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


@pytest.mark.parametrize("line", [
    "sglang serve --model-path meta-llama/Llama-3.1-8B",
    "sglang serve meta-llama/Llama-3.1-8B",  # (0.5.23 cli/serve.py:62-66: the first argument, not a flag)
    "sglang serve --model-type llm meta-llama/Llama-3.1-8B",  # (:30-59: taken out first)
    "/opt/venv/bin/sglang serve --model-type=auto meta-llama/Llama-3.1-8B",
])
def test_sglang_serve_reads_as_launch_server(tmp_path, line):
    """`sglang serve` (SGLang's console script since 0.5.5; 0.5.23 cli/main.py) runs prepare_server_args on the flags
    left after its --model-type (cli/serve.py:97-106), as `python -m sglang.launch_server` does on its own
    (launch_server.py:81): the same reading. It was refused ('not a config trainfit reads')."""
    flags = " --tp 2 --context-length 8192 --mem-fraction-static 0.8 --disable-cuda-graph"
    serve, launch = tmp_path / "serve.sh", tmp_path / "launch.sh"
    serve.write_text(line + flags + "\n")
    launch.write_text("python -m sglang.launch_server --model-path meta-llama/Llama-3.1-8B" + flags + "\n")
    r, want = read(serve), read(launch)
    assert (r.model, r.values, r.unknown, r.not_modelled) == (want.model, want.values, [], [])


def test_sglang_serve_of_another_backend_is_refused(tmp_path, cli):
    """--model-type diffusion runs SGLang's diffusion server (0.5.23 cli/serve.py:121-157), which trainfit does not
    estimate."""
    sh = tmp_path / "serve.sh"
    sh.write_text("sglang serve --model-type diffusion black-forest-labs/FLUX.1-dev\n")
    code, _, err = cli("check", str(sh), "--model", MODEL, "--gpu", "H100-80GB")
    assert code == 2 and "--model-type 'diffusion'" in err and len(err.strip().splitlines()) == 1, err


# Megatron-LM core_v0.16.1 without --use-distributed-optimizer and the model's shape flags (--model names the model)
MEGATRON_DDP = ("torchrun --nproc_per_node 8 pretrain_gpt.py --seq-length 4096 --micro-batch-size 1 "
                "--global-batch-size 64 --bf16 ")


def test_megatron_torch_fsdp2_is_refused_naming_what_trainfit_models(tmp_path, cli):
    """--use-torch-fsdp2 (Megatron-LM core_v0.16.1 arguments.py:2335) wraps the model in torch's fully_shard
    (training.py:1277-1289); check listed it as unknown and estimated DDP (--zero 0: every rank's whole gradients and
    optimizer states, 59.83 GiB of states for llama-3.1-8b at dp 8). trainfit's Megatron stack models Megatron-FSDP,
    whose fp32 main-grad buffer torch's FSDP2 wrapper does not keep: it has no mixed-precision policy, so the gradients
    are reduced in the weights' dtype (megatron-core's TorchFullyShardedDataParallel, read below). The line carries
    what Megatron-LM requires beside the flag (arguments.py:605-621)."""
    import inspect

    from megatron.core.distributed import TorchFullyShardedDataParallel

    wrapper = inspect.getsource(TorchFullyShardedDataParallel.__init__)
    assert "fully_shard(" in wrapper and "mp_policy" not in wrapper and "MixedPrecision" not in wrapper
    sh = tmp_path / "pretrain.sh"
    sh.write_text(MEGATRON_DDP + "--use-torch-fsdp2 --no-gradient-accumulation-fusion "
                  "--untie-embeddings-and-output-weights --ckpt-format torch_dist\n")
    code, _, err = cli("check", str(sh), "--model", MODEL)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "--use-torch-fsdp2" in err and "--use-megatron-fsdp" in err, err


def test_megatron_torch_fsdp2_option_alone_has_no_effect(tmp_path):
    """--torch-fsdp2-no-reshard-after-forward is read by the torch FSDP2 wrapper only (training.py:1287-1289)."""
    sh = tmp_path / "pretrain.sh"
    sh.write_text(MEGATRON + "--torch-fsdp2-no-reshard-after-forward\n")
    s, (r,) = _setup([sh])
    assert s.zero == 1 and "--torch-fsdp2-no-reshard-after-forward" in r.no_effect and not r.unknown


def _optimizer_config_takes(flags: str) -> bool:
    """Whether megatron-core 0.16.1's OptimizerConfig takes what Megatron-LM builds from `flags` (training.py:1410-1427
    copies the args of its fields; arguments.py:645-653 maps the dtype names): its checks are assertions
    (optimizer_config.py:375-426); past them it looks for Transformer Engine's FusedAdam, not installed here."""
    import torch

    from megatron.core.optimizer import OptimizerConfig

    argv = flags.split()
    kw = {"use_precision_aware_optimizer": "--use-precision-aware-optimizer" in argv,
          "use_distributed_optimizer": "--use-distributed-optimizer" in argv}
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.uint8}
    for flag in ("--main-grads-dtype", "--main-params-dtype", "--exp-avg-dtype", "--exp-avg-sq-dtype", "--optimizer"):
        if flag in argv:
            v = argv[argv.index(flag) + 1]
            kw[flag[2:].replace("-", "_")] = dtypes.get(v, v)
    try:
        OptimizerConfig(**kw)
    except AssertionError:
        return False
    except (TypeError, RuntimeError):  # (is_te_min_version without TE; no FusedAdam: past the checks)
        return True
    return True


@pytest.mark.parametrize("flags", [
    "--exp-avg-dtype bf16", "--main-grads-dtype bf16", "--use-distributed-optimizer --main-params-dtype fp16",
    "--use-precision-aware-optimizer", "--use-distributed-optimizer --use-precision-aware-optimizer --optimizer sgd",
    "--use-distributed-optimizer --use-precision-aware-optimizer",
    "--use-distributed-optimizer --use-precision-aware-optimizer --exp-avg-dtype fp8 --exp-avg-sq-dtype bf16 "
    "--main-params-dtype fp16 --main-grads-dtype bf16",
])
def test_megatron_precision_aware_optimizer_as_megatron_core_takes_it(tmp_path, flags):
    """--use-precision-aware-optimizer and its dtypes were listed as unknown and the optimizer estimated in fp32
    whatever they said. Now a line megatron-core's OptimizerConfig refuses is refused, and one it takes is estimated
    with the flag listed as less memory (TE's FusedAdam keeps the states in the given dtypes)."""
    takes = _optimizer_config_takes(flags)
    sh = tmp_path / "pretrain.sh"
    sh.write_text(MEGATRON_DDP + flags + "\n")
    if not takes:
        with pytest.raises(SetupError, match="Megatron refuses it"):
            _setup([sh])
        return
    _, (r,) = _setup([sh])
    assert any(x.startswith("--use-precision-aware-optimizer = True: not modelled (less memory") for x in
               r.not_modelled), r.not_modelled
    assert not r.unknown


def test_megatron_precision_aware_optimizer_says_what_it_keeps(tmp_path, cli):
    """By hand from megatron-core 0.16.1: the states in the given dtypes (optimizer/__init__.py:365-370: exp_avg in
    fp8, 1 byte, exp_avg_sq in bf16, 2), the master weights as the bf16 weights' int16 remainders
    (distrib_optimizer.py:800-802, store_param_remainders on by default with TE >= 2.1: optimizer_config.py:192,
    :383-384), the 16-bit gradients stepped as they are (distrib_optimizer.py:2411-2417). --main-grads-dtype bf16
    under --bf16 leaves accumulate_allreduce_grads_in_fp32 off (Megatron-LM arguments.py:716-724), as
    --grad-reduce-in-bf16 does (:719-721): the same gradient buffer."""
    sh = tmp_path / "pretrain.sh"
    sh.write_text(MEGATRON_DDP + "--use-distributed-optimizer --use-precision-aware-optimizer --exp-avg-dtype fp8 "
                  "--exp-avg-sq-dtype bf16 --main-grads-dtype bf16\n")
    s, (r,) = _setup([sh])
    said = next(x for x in r.not_modelled if x.startswith("--use-precision-aware-optimizer"))
    assert "fp8 and bf16 (3 bytes; trainfit counts 8)" in said and "(2 bytes with TE >= 2.1; trainfit counts 4)" in said
    reduce = tmp_path / "reduce.sh"
    reduce.write_text(MEGATRON_DDP + "--use-distributed-optimizer --grad-reduce-in-bf16\n")
    assert s.grad_reduce_in_bf16 and s == _setup([reduce])[0]
    code, out, err = cli("check", str(sh), "--model", MODEL)
    assert code == 0 and "--use-precision-aware-optimizer" in out, err


def test_megatron_precision_aware_dtype_megatron_does_not_take_is_one_line(tmp_path, cli):
    """Megatron-LM's choices (arguments.py:2848: fp32, fp16, bf16, fp8 for --exp-avg-dtype)."""
    sh = tmp_path / "pretrain.sh"
    sh.write_text(MEGATRON_DDP + "--use-distributed-optimizer --use-precision-aware-optimizer --exp-avg-dtype int8\n")
    code, _, err = cli("check", str(sh), "--model", MODEL)
    assert code == 2 and "invalid choice: 'int8'" in err and len(err.strip().splitlines()) == 1, err


def test_megatron_architecture_flags_are_said_as_the_models_own(tmp_path, cli):
    """The flags that describe the model's own architecture (--normalization, --qk-layernorm, MLA's and the router's:
    Megatron-LM arguments.py:2723-2740, transformer_config.py:622-634), which the estimate takes from --model, were
    listed as 'not modelled (the model's norm (from the model))': said apart now, and neither unknown nor not
    modelled. `plan --emit megatron` writes them for its model."""
    from trainfit.readers import read

    sh = tmp_path / "pretrain.sh"
    sh.write_text(MEGATRON + "--normalization RMSNorm --qk-layernorm --position-embedding-type rope --swiglu "
                  "--untie-embeddings-and-output-weights --disable-bias-linear\n")  # (llama-2-7b's shape and switches)
    r = read(sh)
    assert r.of_model == ["--normalization", "--qk-layernorm", "--position-embedding-type"]
    assert not r.unknown and not any("normalization" in x or "layernorm" in x for x in r.not_modelled)
    code, out, err = cli("check", str(sh), "--model", "llama-2-7b")
    assert code == 0, err
    assert "  · the model's architecture (the estimate builds llama-2-7b's own): --normalization, --qk-layernorm" in out


def test_check_takes_the_sequence_length_no_file_holds(tmp_path, cli):
    """A DeepSpeed JSON (like TrainingArguments and accelerate configs) holds no sequence length: check estimated at
    trainfit's default and said so, with no way to give it. --seq sets it, the 'as trainfit' line carries it, and the
    estimate is `trainfit estimate`'s at those flags; a --seq the files contradict (Megatron's --seq-length) is one
    line, exit 2."""
    import json
    import shlex

    ds = tmp_path / "ds.json"
    ds.write_text('{"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "train_batch_size": 8, '
                  '"bf16": {"enabled": true}, "zero_optimization": {"stage": 3}}')
    code, out, err = cli("check", str(ds), "--model", "llama-3.2-1b", "--seq", "4096")
    assert code == 0, err
    line = next(x for x in out.splitlines() if x.startswith("as trainfit: "))
    flags = shlex.split(line.removeprefix("as trainfit: "))
    assert flags[flags.index("--seq") + 1] == "4096" and "sequence length: none of the files" not in out
    code, got, _ = cli("check", str(ds), "--model", "llama-3.2-1b", "--seq", "4096", "--json")
    code2, want, _ = cli("estimate", "llama-3.2-1b", *flags, "--json")
    assert code == code2 == 0
    assert json.loads(got)["memory"]["peak"] == json.loads(want)["memory"]["peak"]
    sh = tmp_path / "pretrain.sh"
    sh.write_text(MEGATRON + "\n")
    code, _, err = cli("check", str(sh), "--model", "llama-2-7b", "--seq", "1024")
    assert code == 2 and "--seq 1024: the files say sequences of 4096 tokens" in err


@pytest.mark.parametrize("flags, want", [
    ("--bf16", "no_effect"),  # Megatron's own default under --bf16 (core_v0.16.1 arguments.py:722-723)
    ("--bf16 --grad-reduce-in-bf16", "no_effect"),  # turned off (:720-721): the bf16 buffer stays (grad_reduce_in_bf16)
    ("--fp16", "more memory: an fp32 gradient buffer"),  # under --fp16 its default is off (:2194)
    ("--bf16 --use-precision-aware-optimizer --main-grads-dtype bf16", "refused"),  # :716-718 asserts
])
def test_megatron_accumulate_allreduce_grads_in_fp32_as_megatron_sets_it(tmp_path, flags, want):
    """--accumulate-allreduce-grads-in-fp32 was listed as unknown. By hand from Megatron-LM core_v0.16.1
    arguments.py:711-724: the flag is --bf16's default, --grad-reduce-in-bf16 overrides it, --main-grads-dtype bf16
    beside it is refused; under --fp16 it makes the gradient buffer fp32."""
    from trainfit.errors import SetupError
    from trainfit.readers import read

    sh = tmp_path / "pretrain.sh"
    sh.write_text(MEGATRON.replace("--bf16 ", "") + flags + " --accumulate-allreduce-grads-in-fp32\n")
    if want == "refused":
        with pytest.raises(SetupError, match="arguments.py:716-718"):
            read(sh)
        return
    r = read(sh)
    assert "--accumulate-allreduce-grads-in-fp32" not in r.unknown
    if want == "no_effect":
        assert "--accumulate-allreduce-grads-in-fp32" in r.no_effect
        assert r.values.get("grad_reduce_in_bf16", False) == ("--grad-reduce-in-bf16" in flags)
    else:
        assert any(x.startswith("--accumulate-allreduce-grads-in-fp32") and want in x for x in r.not_modelled)


def test_sglang_config_file_reads_as_its_flags(tmp_path, cli):
    """SGLang's --config FILE was listed as unknown and its keys ignored. By hand from SGLang 0.5.23
    utils/server_args_config_parser.py ConfigArgumentMerger: the file's keys as flags first (:98-106), so the command
    line's win (tp 4 over the file's 2); a store_true flag's true is the bare flag (--disable-cuda-graph: trainfit's
    --enforce-eager), another boolean `--key false` (:185-200); its suffix in any case (:155-162): the same reading as
    the flags written out. A .json file and --config twice are one line, exit 2."""
    (tmp_path / "serve.YAML").write_text("tp-size: 2\ncontext-length: 8192\nmem-fraction-static: 0.8\n"
                                         "disable-cuda-graph: true\nenable-metrics: false\n")
    sh, flat = tmp_path / "serve.sh", tmp_path / "flat.sh"
    sh.write_text("python -m sglang.launch_server --model-path meta-llama/Llama-3.1-8B --config "
                  f"{tmp_path / 'serve.YAML'} --tp-size 4\n")
    flat.write_text("python -m sglang.launch_server --tp-size 2 --context-length 8192 --mem-fraction-static 0.8 "
                    "--disable-cuda-graph --model-path meta-llama/Llama-3.1-8B --tp-size 4\n")
    r, want = read(sh), read(flat)
    assert r.values == want.values and r.values["tp"] == 4 and r.values["enforce_eager"] is True
    assert "--config" not in " ".join(r.unknown) and r.model == want.model
    (tmp_path / "serve.json").write_text("{}")
    for bad, says in ((f"--config {tmp_path / 'serve.json'}", "reads a .yaml or .yml config file only"),
                      (f"--config {tmp_path / 'serve.YAML'} --config {tmp_path / 'serve.YAML'}", "given twice")):
        sh.write_text(f"python -m sglang.launch_server --model-path meta-llama/Llama-3.1-8B {bad}\n")
        code, _, err = cli("check", str(sh), "--model", MODEL, "--gpu", "H100-80GB")
        assert code == 2 and says in err and len(err.strip().splitlines()) == 1, err
