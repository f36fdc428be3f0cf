"""An accelerate config YAML (FSDP2) of a plan: accelerate's FSDP guide and its FSDP1 -> FSDP2 migration table
(fsdp_version, fsdp_reshard_after_forward replacing fsdp_sharding_strategy)."""
from __future__ import annotations

import json

from ..setup import Setup
from ..spec import ModelSpec

# the stack whose step the config runs (stacks/hf.toml: HF Trainer / accelerate, FSDP2)
STACK = "hf"
PRECISIONS = ("amp-bf16", "amp-fp16", "fp32")
# HF decoder-layer classes for accelerate's TRANSFORMER_BASED_WRAP, by config model_type
LAYER_CLASS = {"llama": "LlamaDecoderLayer", "mistral": "MistralDecoderLayer", "mixtral": "MixtralDecoderLayer",
               "gemma": "GemmaDecoderLayer", "gemma2": "Gemma2DecoderLayer", "gemma3_text": "Gemma3DecoderLayer",
               "phi3": "Phi3DecoderLayer",
               "qwen2": "Qwen2DecoderLayer", "qwen3": "Qwen3DecoderLayer", "gpt2": "GPT2Block",
               "opt": "OPTDecoderLayer", "gpt_neox": "GPTNeoXLayer", "bert": "BertLayer", "roberta": "RobertaLayer"}


def supports(s: Setup) -> str | None:
    """None when accelerate's FSDP config can run plan `s`, else why not (one line)."""
    if s.tp > 1 or s.pp > 1:
        return "accelerate's FSDP config is data-parallel only"
    if s.zero == 1:
        return "FSDP has no optimizer-only sharding (ZeRO-1)"
    if s.precision not in ("amp-bf16", "amp-fp16", "fp32"):
        return f"accelerate mixed precision keeps fp32 sharded weights (amp), not {s.precision}"
    if s.recompute == "selective":
        return "fsdp_activation_checkpointing wraps whole layers (full recompute) only"
    if s.ulysses > 1:
        return "accelerate runs Ulysses through its DeepSpeed integration (sp_backend deepspeed), not an FSDP config"
    if s.liger or s.tiled_mlp is not None or s.loss != "full" or s.offload_activations:
        return "Liger, the tiled MLP and loss and activation offload are trainer options, not accelerate FSDP config keys"
    if s.offload_state == "optimizer":
        return "torchao's CPUOffloadOptimizer is built in the training script, not by accelerate's FSDP config"
    return None


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
            "fsdp_offload_params": s.offload_state == "params",  # CPUOffloadPolicy (stacks/hf.toml [cpu_offload])
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
            # (under FSDP fsdp_activation_checkpointing holds it; a DDP or one-GPU config has no key for it)
            + (", gradient_checkpointing=True" if s.recompute == "full" and "fsdp_config" not in cfg else "") + "\n")
    return head + _yaml(cfg) + "\n"


def write(s: Setup, spec: ModelSpec, gpus_per_node: int, tokens: float | None = None) -> str:
    return accelerate(s, spec, gpus_per_node)
