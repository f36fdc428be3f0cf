"""DeepSpeed config JSON of a plan (deepspeed.ai/docs/config-json): what DeepSpeed's ZeRO engine runs of it."""
from __future__ import annotations

import json

from ..setup import Setup
from ..spec import ModelSpec
from ..stacks.deepspeed_config import OPTIMIZER_TYPES

# the stack whose step the config runs (stacks/deepspeed.toml: DeepSpeed's ZeRO engine wrapping the HF model)
STACK = "deepspeed"
PRECISIONS = ("bf16-master", "fp16-master", "fp32")  # DeepSpeed's bf16/fp16 modes: 16-bit weights, fp32 masters


def supports(s: Setup) -> str | None:
    """None when DeepSpeed's config can run plan `s`, else why not (one line)."""
    if s.tp > 1 or s.pp > 1:
        return "DeepSpeed's JSON config has no tensor/pipeline layout (that needs Megatron-DeepSpeed code)"
    if s.offload_state != "none" and s.optimizer not in OPTIMIZER_TYPES:
        return f"ZeRO-Offload's optimizer is built from the config: {s.optimizer} is none DeepSpeed builds there"
    if s.precision not in PRECISIONS:
        return f"DeepSpeed's bf16/fp16 modes keep 16-bit weights with fp32 masters, not {s.precision}"
    if s.recompute == "selective":
        return "DeepSpeed checkpoints whole layers (full recompute) only"
    if s.tiled_mlp is not None or s.loss != "full" or s.offload_activations:
        # ArcticTraining's trainer options (tiled_mlp_compute, model.type liger, the tiled loss,
        # activation_checkpoint_cpu_offload), not keys of DeepSpeed's config
        return "the tiled MLP and loss, Liger and the checkpoint offload are ArcticTraining's trainer options, not DeepSpeed config keys"
    return None


# ZeRO-Offload's optimizer, built by DeepSpeed from the config's "optimizer" block (deepspeed 0.19.8 runtime/engine.py
# _configure_basic_optimizer): adam / adamw as DeepSpeedCPUAdam (:2385-2386; "Adam" runs AdamW's decoupled decay
# unless adam_w_mode is false, :2487-2490), lion as DeepSpeedCPULion (:2505-2508), another name torch.optim's class of
# that name (:2548). A client optimizer (the HF Trainer's own AdamW, where the block is absent) is refused under
# offload (:2342-2346, zero_force_ds_cpu_optimizer true by default). The analytic engine prices DeepSpeed's CPU
# optimizer (parallel/deepspeed_offload.py). Its hyper-parameters are "auto": the HF Trainer fills them from its
# TrainingArguments (transformers 5.24 integrations/deepspeed.py:163-170); they are the user's, not trainfit's.
# The hyper-parameters each type takes that the HF Trainer fills (its fill_match keys), by optimizer type
# (stacks/deepspeed_config.py OPTIMIZER_TYPES)
AUTO_PARAMS = {"Adam": ("lr", "betas", "eps", "weight_decay"), "AdamW": ("lr", "betas", "eps", "weight_decay"),
               "Lion": ("lr", "betas", "weight_decay"), "SGD": ("lr", "weight_decay")}
MOMENTUM = 0.9  # trainfit's --optimizer momentum (SGD with momentum: a state per parameter)


def deepspeed(s: Setup) -> dict:
    """DeepSpeed config JSON (trainfit.stacks.deepspeed_config, shared with the measure engine's DeepSpeed step), with
    the optimizer block ZeRO-Offload needs (AUTO_PARAMS)."""
    from ..stacks.deepspeed_config import ds_config

    cfg = ds_config(s)
    if s.offload_state in ("optimizer", "params"):
        name = OPTIMIZER_TYPES[s.optimizer]
        params = {k: "auto" for k in AUTO_PARAMS[name]} | ({"momentum": MOMENTUM} if s.optimizer == "momentum" else {})
        cfg["optimizer"] = {"type": name, "params": params}
    return cfg


def caveats(s: Setup) -> list[str]:
    """What the user must know to run the config as planned (printed beside it)."""
    if "optimizer" not in deepspeed(s):
        return []
    return ["the optimizer block (ZeRO-Offload runs DeepSpeed's own optimizer on the host) leaves its learning rate, "
            "betas, eps and weight decay \"auto\": the HF Trainer fills them (--deepspeed ds.json); with "
            "deepspeed.initialize alone, write your values in"]


def write(s: Setup, spec: ModelSpec, gpus_per_node: int, tokens: float | None = None) -> str:
    return json.dumps(deepspeed(s), indent=2) + "\n"
