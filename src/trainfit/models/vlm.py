"""Vision-language models from an HF config.json (no torch): the image encoder's VisionTowerSpec, read from the
config's `vision_config` with the transformers 5.24 defaults, beside the language model's ModelSpec fields.

Qwen2.5-VL (model_type qwen2_5_vl): Qwen2_5_VLVisionConfig (models/qwen2_5_vl/configuration_qwen2_5_vl.py:44-61)
defaults depth 32, hidden_size 3584, intermediate_size 3420, num_heads 16, in_channels 3, patch_size 14,
spatial_merge_size 2, temporal_patch_size 2, window_size 112, out_hidden_size 3584, fullatt_block_indexes
(7, 15, 23, 31); the published checkpoints state every one of them. The language model's keys sit at the top level
of the published config.json (Qwen2_5_VLConfig.__post_init__ moves them into text_config) or in `text_config`.
"""
from __future__ import annotations

from ..errors import ConfigError
from ..spec import VisionTowerSpec

VLM_TYPES = ("qwen2_5_vl",)

# Qwen2_5_VLVisionConfig's defaults (configuration_qwen2_5_vl.py:44-61)
_QWEN2_5_VL_VISION = dict(depth=32, hidden_size=3584, intermediate_size=3420, num_heads=16, in_channels=3,
                          patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=112,
                          out_hidden_size=3584, fullatt_block_indexes=(7, 15, 23, 31))
# Qwen2_5_VLConfig.image_token_id (configuration_qwen2_5_vl.py:142)
_QWEN2_5_VL_IMAGE_TOKEN = 151655


def text_config(config: dict) -> dict:
    """The language model's keys: the top level (the published flat config.json) under `text_config` (transformers'
    nested form, which wins), without the vision tower's."""
    nested = config.get("text_config")
    flat = {k: v for k, v in config.items() if k not in ("vision_config", "text_config")}
    return {**flat, **nested} if isinstance(nested, dict) else flat


def _positive(v, name: str, key: str) -> int:
    if isinstance(v, (list, tuple)) and len(v) == 2 and v[0] == v[1]:
        v = v[0]  # patch sizes may be given as a square pair
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ConfigError(f"{name}: vision_config '{key}' must be a positive integer, got {v!r}")
    return v


def tower_spec(config: dict, name: str, model_type: str) -> VisionTowerSpec:
    """The VisionTowerSpec of a VLM config (one-line ConfigError when malformed)."""
    vc = config.get("vision_config") or {}
    if not isinstance(vc, dict):
        raise ConfigError(f"{name}: 'vision_config' must be a JSON object, got {type(vc).__name__}")
    get = {k: vc.get(k, d) if vc.get(k) is not None else d for k, d in _QWEN2_5_VL_VISION.items()}
    ints = {k: _positive(v, name, k) for k, v in get.items() if k != "fullatt_block_indexes"}
    full = get["fullatt_block_indexes"]
    if not isinstance(full, (list, tuple)) or not all(isinstance(i, int) and 0 <= i for i in full):
        raise ConfigError(f"{name}: vision_config 'fullatt_block_indexes' must be a list of block indexes, got {full!r}")
    if ints["hidden_size"] % ints["num_heads"]:
        raise ConfigError(f"{name}: vision_config hidden_size {ints['hidden_size']} is not divisible by num_heads "
                          f"{ints['num_heads']}")
    token = config.get("image_token_id", _QWEN2_5_VL_IMAGE_TOKEN)
    return VisionTowerSpec(family=model_type, depth=ints["depth"], hidden=ints["hidden_size"], heads=ints["num_heads"],
                           intermediate=ints["intermediate_size"], out_hidden=ints["out_hidden_size"],
                           patch=ints["patch_size"], temporal_patch=ints["temporal_patch_size"],
                           merge=ints["spatial_merge_size"], window=ints["window_size"],
                           full_attention_blocks=tuple(full), in_channels=ints["in_channels"],
                           image_token_id=int(token))


def tower_params(t: VisionTowerSpec) -> int:
    """The tower's parameters (modeling_qwen2_5_vl.py): the patch embedding Conv3d without bias (:114,
    in_channels * temporal_patch * patch^2 * hidden); per block two RMSNorms (hidden each, :344-345), qkv (hidden ->
    3 hidden, bias) and proj (hidden -> hidden, bias) (:264-265), the gated MLP with biases (:90-92); the merger's
    RMSNorm (hidden, :189), Linear (hidden * merge^2 -> same, bias) and Linear (hidden * merge^2 -> out_hidden, bias)
    (:190-194). The rotary embedding holds buffers only."""
    h, i, m = t.hidden, t.intermediate, t.hidden * t.merge ** 2
    embed = t.in_channels * t.temporal_patch * t.patch ** 2 * h
    block = 2 * h + (h * 3 * h + 3 * h) + (h * h + h) + 2 * (h * i + i) + (i * h + h)
    merger = h + (m * m + m) + (m * t.out_hidden + t.out_hidden)
    return embed + t.depth * block + merger
