"""The Setup of a vision model: the batch is images, the image size is a setting, and the settings of token models
(sequence length, attention kernels, LoRA, tensor/pipeline/context/expert parallelism, serving) are refused with
one line (SetupError: the CLI exits 2)."""
from __future__ import annotations

from .errors import SetupError
from .spec import VisionSpec

# the settings a vision step reads; every other one must keep its default
APPLY = ("batch", "grad_accum", "precision", "optimizer", "optimizer_impl", "max_grad_norm", "tf32", "device", "mode",
         "image_size", "channels_last", "stack", "recompute")
# the families transformers can checkpoint: supports_gradient_checkpointing on the PreTrainedModel and the repeated
# block a GradientCheckpointingLayer (transformers 5.24 models/vit/modeling_vit.py:257,310); the ResNet and ConvNeXt
# PreTrainedModels keep the default False (modeling_utils.py:1138), so activation_checkpointing_enable raises
# "does not support activation checkpointing" (modeling_utils.py:3154-3155)
CHECKPOINTS = {"vit": "ViTLayer"}
WHY = {
    "compile": "trainfit models inductor's saved set for Llama-style blocks only (analytic/compile_effects.py); "
               "its choice for convolutions, BatchNorm and ViT blocks is not derived",
    "seq": "its sequence is set by the image ({why})",
    "lora_rank": "trainfit's LoRA adapts a transformer's projections",
    "attention": "it has no attention kernel to choose",
}


def vision_values(spec: VisionSpec, values: dict, req=None) -> dict:
    """`values` (the request's Setup values, precision resolved) checked and completed for `spec`."""
    from .setup import BY_NAME, trains_any

    if values["mode"] != "train":
        raise SetupError(f"--mode {values['mode']}: for vision models ({spec.name}) trainfit models the training step; "
                         "drop --mode")
    if values["stack"] not in trains_any():  # (stacks/*.toml [model]: any transformers model)
        raise SetupError(f"--stack {values['stack']}: {spec.name} is built by transformers and trained by the HF "
                         f"eager step (--stack {' or '.join(trains_any())})")
    why_seq = ("ViT: (image / patch)^2 + 1 tokens, from --image-size" if spec.family == "vit"
               else "a CNN has no sequence; set --image-size")
    for name, value in values.items():
        if name in APPLY or name == "head" and value is None:
            continue
        s = BY_NAME[name]
        default = s.request_default if name == "seq" else s.default
        if value != default:
            why = WHY.get(name, f"{spec.name} is a {spec.family} image classifier: one rank's HF eager step")
            raise SetupError(f"{s.flag} does not apply to {spec.name}: {why.format(why=why_seq)}")
    check_recompute(spec, values["recompute"])
    size = values["image_size"] or spec.image_size
    check_image(spec, size)
    # seq: ViT's tokens per image; 1 for a CNN (so tokens/s reads as images/s)
    return {**values, "image_size": size, "seq": spec.tokens(size) if spec.family == "vit" else 1}


def check_image(spec: VisionSpec, size: int) -> None:
    """An image size the model takes: a multiple of a ViT's patch; at least 32 pixels for a CNN (5 stride-2 steps)."""
    if spec.family == "vit" and size % spec.patch:
        raise SetupError(f"--image-size {size} is not a multiple of {spec.name}'s patch size {spec.patch}")
    if spec.is_cnn and size < 32:
        raise SetupError(f"--image-size {size}: {spec.name} downsamples by 32; use --image-size 32 or more")


def check_recompute(spec: VisionSpec, recompute: str) -> None:
    """--recompute full checkpoints every block transformers checkpoints (activation_checkpointing_enable: each
    GradientCheckpointingLayer, non-reentrant torch.utils.checkpoint); the other policies are not a transformers
    vision model's."""
    if recompute == "none":
        return
    if spec.family not in CHECKPOINTS:
        raise SetupError(f"--recompute {recompute} does not apply to {spec.name}: transformers' {spec.family} model "
                         "does not support activation checkpointing (no supports_gradient_checkpointing); drop "
                         "--recompute")
    if recompute != "full":
        raise SetupError(f"--recompute {recompute}: for {spec.name} transformers checkpoints every "
                         f"{CHECKPOINTS[spec.family]}; use --recompute full or none")
