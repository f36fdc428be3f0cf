"""Vision models built by transformers for the trace and measure engines (models/vision.py says why not
torchvision or timm): ResNetForImageClassification, ConvNextForImageClassification, ViTForImageClassification with
random weights, and an example batch of images and labels."""
from __future__ import annotations

import copy

import torch

from ..setup import Setup
from ..spec import VisionSpec


def build(spec: VisionSpec, setup: Setup, dtype: torch.dtype = torch.float32, device: str = "cpu"):
    """(model, example batch) for `setup`: random weights; images of --image-size (a ViT's config takes the image
    size: its position table has (size / patch)^2 + 1 rows), int64 labels; channels-last when asked."""
    import transformers

    transformers.logging.set_verbosity_error()
    size = setup.image_size or spec.image_size
    kwargs = {k: copy.deepcopy(v) for k, v in spec.config.items() if k not in ("model_type", "_trainfit")}  # (build.py)
    kwargs["image_size"] = size
    if spec.family == "vit":
        kwargs["attn_implementation"] = "sdpa"
    cfg = transformers.AutoConfig.for_model(spec.family, **kwargs)
    torch.manual_seed(0)
    model = transformers.AutoModelForImageClassification.from_config(cfg).to(device=device, dtype=dtype)
    pixels = torch.randn(setup.batch, spec.channels, size, size, dtype=dtype, device=device)
    if setup.channels_last:
        model = model.to(memory_format=torch.channels_last)
        pixels = pixels.contiguous(memory_format=torch.channels_last)
    labels = torch.randint(0, spec.num_labels, (setup.batch,), device=device)
    return model, {"pixel_values": pixels, "labels": labels}
