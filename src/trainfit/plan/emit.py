"""Launch configs for the distributed engines users actually run: DeepSpeed JSON, an accelerate FSDP config YAML,
a torchrun + FSDP2 (torchtitan) command line. Each engine supports only part of the search space; `supports`
says which, and the command picks the best plan that the engine can run.

Keys follow the engines' documentation: DeepSpeed config JSON (deepspeed.ai/docs/config-json), accelerate's
FSDP guide and its FSDP1 → FSDP2 migration table (fsdp_version, fsdp_reshard_after_forward replacing
fsdp_sharding_strategy), torchtitan's JobConfig (torchtitan/config/job_config.py: --parallelism.*,
--training.*, --activation_checkpoint.mode).
"""
from __future__ import annotations

import json

from ..errors import SetupError
from ..setup import Setup
from ..spec import ModelSpec

ENGINES = ("deepspeed", "accelerate", "torchrun")

# HF decoder-layer classes for accelerate's TRANSFORMER_BASED_WRAP, by config model_type
LAYER_CLASS = {"llama": "LlamaDecoderLayer", "mistral": "MistralDecoderLayer", "mixtral": "MixtralDecoderLayer",
               "gemma": "GemmaDecoderLayer", "gemma2": "Gemma2DecoderLayer", "phi3": "Phi3DecoderLayer",
               "qwen2": "Qwen2DecoderLayer", "qwen3": "Qwen3DecoderLayer", "gpt2": "GPT2Block",
               "opt": "OPTDecoderLayer", "gpt_neox": "GPTNeoXLayer", "bert": "BertLayer", "roberta": "RobertaLayer"}


def supports(engine: str, s: Setup) -> str | None:
    """None when `engine` can run setup `s`, else why not (one line)."""
    if engine == "deepspeed":
        if s.tp > 1 or s.pp > 1:
            return "DeepSpeed's JSON config has no tensor/pipeline layout (that needs Megatron-DeepSpeed code)"
        if s.precision not in ("bf16-master", "amp-fp16", "fp32"):
            return f"DeepSpeed's bf16/fp16 modes keep 16-bit weights with fp32 masters, not {s.precision}"
        if s.recompute == "selective":
            return "DeepSpeed checkpoints whole layers (full recompute) only"
        return None
    if engine == "accelerate":
        if s.tp > 1 or s.pp > 1:
            return "accelerate's FSDP config is data-parallel only"
        if s.zero == 1:
            return "FSDP has no optimizer-only sharding (ZeRO-1)"
        if s.precision not in ("amp-bf16", "amp-fp16", "fp32"):
            return f"accelerate mixed precision keeps fp32 sharded weights (amp), not {s.precision}"
        if s.recompute == "selective":
            return "fsdp_activation_checkpointing wraps whole layers (full recompute) only"
        return None
    if engine == "torchrun":
        if s.zero == 1 and s.dp > 1:
            return "FSDP2 shards gradients with the optimizer state (no ZeRO-1)"
        if s.zero == 0 and s.dp > 1 and (s.tp > 1 or s.pp > 1):
            return "torchtitan's DDP does not combine with tensor/pipeline parallelism (use FSDP)"
        if s.precision not in ("amp-bf16", "fp32"):
            return f"torchtitan's FSDP2 mixed precision keeps fp32 sharded weights (amp-bf16), not {s.precision}"
        return None
    raise SetupError(f"--emit {engine!r} is not one of: {', '.join(ENGINES)}")


def precisions_for(engine: str) -> tuple[str, ...]:
    return {"deepspeed": ("bf16-master", "amp-fp16", "fp32"), "accelerate": ("amp-bf16", "amp-fp16", "fp32"),
            "torchrun": ("amp-bf16", "fp32")}[engine]


def deepspeed(s: Setup) -> dict:
    """DeepSpeed config JSON. train_batch_size = micro × accumulation × dp (DeepSpeed checks this identity)."""
    cfg = {
        "train_batch_size": s.batch * s.grad_accum * s.dp,
        "train_micro_batch_size_per_gpu": s.batch,
        "gradient_accumulation_steps": s.grad_accum,
        "gradient_clipping": 1.0,
        "bf16": {"enabled": s.precision == "bf16-master"},
        "fp16": {"enabled": s.precision == "amp-fp16"},
        "zero_optimization": {"stage": s.zero, "overlap_comm": True, "contiguous_gradients": True},
        "steps_per_print": 10,
        "wall_clock_breakdown": False,
    }
    if s.zero == 3:
        cfg["zero_optimization"].update({"stage3_gather_16bit_weights_on_model_save": True})
    if s.recompute == "full":
        # DeepSpeed's own checkpointing API settings; a HF model must also call model.gradient_checkpointing_enable()
        cfg["activation_checkpointing"] = {"partition_activations": False, "contiguous_memory_optimization": False,
                                           "cpu_checkpointing": False}
    return cfg


def _yaml(obj, indent: int = 0) -> str:
    """A small YAML writer for nested dicts of str/int/float/bool (accelerate's config is that simple)."""
    out = []
    pad = "  " * indent
    for k, v in obj.items():
        if isinstance(v, dict):
            out.append(f"{pad}{k}:")
            out.append(_yaml(v, indent + 1))
        elif isinstance(v, bool):
            out.append(f"{pad}{k}: {'true' if v else 'false'}")
        elif isinstance(v, (int, float)):
            out.append(f"{pad}{k}: {v}")
        else:
            out.append(f"{pad}{k}: {json.dumps(str(v)) if _needs_quotes(str(v)) else v}")
    return "\n".join(out)


def _needs_quotes(v: str) -> bool:
    return v == "" or v.lower() in ("no", "yes", "true", "false", "on", "off", "null") or any(c in v for c in ":#{}[],&*!|>'\"%@`")


def accelerate(s: Setup, spec: ModelSpec, gpus_per_node: int) -> str:
    """accelerate config file (FSDP2); `accelerate launch --config_file plan.yaml train.py`."""
    world = s.world_size
    nodes = max(1, -(-world // gpus_per_node))
    mp = {"amp-bf16": "bf16", "amp-fp16": "fp16"}.get(s.precision, "no")
    cfg: dict = {"compute_environment": "LOCAL_MACHINE", "debug": False}
    if s.zero == 0 and s.dp > 1:
        cfg["distributed_type"] = "MULTI_GPU"
    elif s.dp > 1:
        cfg["distributed_type"] = "FSDP"
        cfg["fsdp_config"] = {
            "fsdp_version": 2,
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_transformer_layer_cls_to_wrap": LAYER_CLASS.get(spec.family, "DecoderLayer"),
            "fsdp_reshard_after_forward": s.zero == 3,  # true = FULL_SHARD (ZeRO-3), false = SHARD_GRAD_OP (ZeRO-2)
            "fsdp_activation_checkpointing": s.recompute == "full",
            "fsdp_offload_params": False,
            "fsdp_cpu_ram_efficient_loading": True,
            "fsdp_state_dict_type": "SHARDED_STATE_DICT",
        }
    else:
        cfg["distributed_type"] = "NO"
    cfg.update({"downcast_bf16": "no", "machine_rank": 0, "main_training_function": "main", "mixed_precision": mp,
                "num_machines": nodes, "num_processes": world, "rdzv_backend": "static", "same_network": True,
                "use_cpu": False})
    head = (f"# trainfit plan for {spec.name}: micro-batch {s.batch}, gradient accumulation {s.grad_accum}, dp {s.dp}\n"
            f"# set these in your script / TrainingArguments: per_device_train_batch_size={s.batch}, "
            f"gradient_accumulation_steps={s.grad_accum}"
            + (", gradient_checkpointing=True" if s.recompute == "full" and s.dp == 1 else "") + "\n")
    return head + _yaml(cfg) + "\n"


def torchrun(s: Setup, spec: ModelSpec, gpus_per_node: int) -> str:
    """torchrun + torchtitan (FSDP2, TP, PP) command line."""
    world = s.world_size
    nproc = min(world, gpus_per_node)
    nodes = max(1, -(-world // gpus_per_node))
    ac = {"none": "none", "full": "full", "selective": "selective"}[s.recompute]
    args = [
        f"torchrun --nnodes={nodes} --nproc_per_node={nproc}"
        + (" --rdzv_backend=c10d --rdzv_endpoint=$MASTER_ADDR:29500" if nodes > 1 else "")
        + " -m torchtitan.train",
        "--job.config_file <your model's train_config.toml>",
        f"--training.seq_len {s.seq}",
        f"--training.local_batch_size {s.batch * (s.grad_accum if s.pp > 1 else 1)}",
        f"--training.global_batch_size {s.batch * s.grad_accum * s.dp}",
        f"--parallelism.data_parallel_shard_degree {s.dp if s.zero >= 2 else 1}",
        f"--parallelism.data_parallel_replicate_degree {s.dp if s.zero == 0 else 1}",
        f"--parallelism.fsdp_reshard_after_forward {'always' if s.zero == 3 else 'never'}",
        f"--parallelism.tensor_parallel_degree {s.tp}",
        f"--parallelism.pipeline_parallel_degree {s.pp}",
    ]
    if s.pp > 1:
        args.append(f"--parallelism.pipeline_parallel_microbatch_size {s.batch}")
    args.append(f"--activation_checkpoint.mode {ac}")
    if s.recompute == "selective":
        args.append("--activation_checkpoint.selective_ac_option op")
    return " \\\n  ".join(args) + "\n"


def emit(engine: str, s: Setup, spec: ModelSpec, gpus_per_node: int) -> str:
    why = supports(engine, s)
    if why:
        raise SetupError(f"--emit {engine}: this plan cannot run there ({why})")
    if engine == "deepspeed":
        return json.dumps(deepspeed(s), indent=2) + "\n"
    if engine == "accelerate":
        return accelerate(s, spec, gpus_per_node)
    return torchrun(s, spec, gpus_per_node)
