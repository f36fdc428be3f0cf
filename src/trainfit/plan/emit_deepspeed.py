"""DeepSpeed config JSON of a plan (deepspeed.ai/docs/config-json): what DeepSpeed's ZeRO engine runs of it."""
from __future__ import annotations

import json

from ..setup import Setup
from ..spec import ModelSpec

# the stack whose step the config runs (stacks/deepspeed.toml: DeepSpeed's ZeRO engine wrapping the HF model)
STACK = "deepspeed"
PRECISIONS = ("bf16-master", "fp16-master", "fp32")  # DeepSpeed's bf16/fp16 modes: 16-bit weights, fp32 masters


def supports(s: Setup) -> str | None:
    """None when DeepSpeed's config can run plan `s`, else why not (one line)."""
    if s.tp > 1 or s.pp > 1:
        return "DeepSpeed's JSON config has no tensor/pipeline layout (that needs Megatron-DeepSpeed code)"
    if s.precision not in PRECISIONS:
        return f"DeepSpeed's bf16/fp16 modes keep 16-bit weights with fp32 masters, not {s.precision}"
    if s.recompute == "selective":
        return "DeepSpeed checkpoints whole layers (full recompute) only"
    if s.tiled_mlp is not None or s.loss != "full" or s.offload_activations:
        # ArcticTraining's trainer options (tiled_mlp_compute, model.type liger, the tiled loss,
        # activation_checkpoint_cpu_offload), not keys of DeepSpeed's config
        return "the tiled MLP and loss, Liger and the checkpoint offload are ArcticTraining's trainer options, not DeepSpeed config keys"
    return None


def deepspeed(s: Setup) -> dict:
    """DeepSpeed config JSON (trainfit.stacks.deepspeed_config, shared with the measure engine's DeepSpeed step)."""
    from ..stacks.deepspeed_config import ds_config

    return ds_config(s)


def write(s: Setup, spec: ModelSpec, gpus_per_node: int, tokens: float | None = None) -> str:
    return json.dumps(deepspeed(s), indent=2) + "\n"
