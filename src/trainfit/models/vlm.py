"""Vision-language models from an HF config.json (no torch): the image encoder's VisionTowerSpec, read from the
config's `vision_config` with the transformers 5.24 defaults, beside the language model's ModelSpec fields.

Qwen2.5-VL (model_type qwen2_5_vl): Qwen2_5_VLVisionConfig (models/qwen2_5_vl/configuration_qwen2_5_vl.py:44-61)
defaults depth 32, hidden_size 3584, intermediate_size 3420, num_heads 16, in_channels 3, patch_size 14,
spatial_merge_size 2, temporal_patch_size 2, window_size 112, out_hidden_size 3584, fullatt_block_indexes
(7, 15, 23, 31); the published checkpoints state every one of them. The language model's keys sit at the top level
of the published config.json (Qwen2_5_VLConfig.__post_init__ moves them into text_config) or in `text_config`.
Gemma 3 (model_type gemma3): SiglipVisionConfig's defaults (models/siglip/configuration_siglip.py:93-103) and
Gemma3Config's mm_tokens_per_image; the language model (gemma3_text) under `text_config`.
Qwen3-VL (model_type qwen3_vl): Qwen3VLVisionConfig's defaults (models/qwen3_vl/configuration_qwen3_vl.py:44-55);
its published config.json nests the language model (a Qwen3 decoder) under `text_config`.
"""
from __future__ import annotations

from ..errors import ConfigError
from ..spec import VisionTowerSpec

VLM_TYPES = ("qwen2_5_vl", "qwen3_vl", "gemma3")
# the VLMs whose language model sits in text_config alone, and the model_type its builder reads it as
NESTED = {"qwen3_vl": "qwen3_vl", "gemma3": "gemma3_text"}

# Qwen2_5_VLVisionConfig's defaults (configuration_qwen2_5_vl.py:44-61)
_QWEN2_5_VL_VISION = dict(depth=32, hidden_size=3584, intermediate_size=3420, num_heads=16, in_channels=3,
                          patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=112,
                          out_hidden_size=3584, fullatt_block_indexes=(7, 15, 23, 31))
# Qwen3VLVisionConfig's defaults (models/qwen3_vl/configuration_qwen3_vl.py:44-55)
_QWEN3_VL_VISION = dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, in_channels=3,
                        patch_size=16, spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=3584,
                        num_position_embeddings=2304, deepstack_visual_indexes=(8, 16, 24))
# SiglipVisionConfig's defaults (models/siglip/configuration_siglip.py:93-103) under their Qwen-style names
_SIGLIP_VISION = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                      num_channels=3, image_size=224, patch_size=16)
_DEFAULTS = {"qwen2_5_vl": _QWEN2_5_VL_VISION, "qwen3_vl": _QWEN3_VL_VISION, "gemma3": _SIGLIP_VISION}
# the tower's layer kinds per family (modeling_qwen3_vl.py :80-85 Qwen3VLVisionMLP, :100 Conv3d bias=True, :331-332
# LayerNorm; modeling_qwen2_5_vl.py :85-92, :114, :344-345)
_KINDS = {"qwen2_5_vl": dict(norm="rmsnorm", gated_mlp=True, patch_bias=False),
          "qwen3_vl": dict(norm="layernorm", gated_mlp=False, patch_bias=True),
          # modeling_siglip.py SiglipEncoderLayer (LayerNorms, fc1/fc2 with biases), SiglipVisionEmbeddings (Conv2d
          # with a bias, a position row per patch)
          "gemma3": dict(norm="layernorm", gated_mlp=False, patch_bias=True, fixed_size=True, projector="pool")}
# Gemma3Config (configuration_gemma3.py:207-212): mm_tokens_per_image 256, image_token_index 262144
_GEMMA3_TOKENS, _GEMMA3_IMAGE_TOKEN = 256, 262_144
# the image placeholder id (configuration_qwen2_5_vl.py:142, configuration_qwen3_vl.py:136): 151655 in both
_IMAGE_TOKEN = 151655
_INDEX_LISTS = ("fullatt_block_indexes", "deepstack_visual_indexes")


def text_config(config: dict) -> dict:
    """The language model's keys. Qwen2.5-VL: the top level (the published flat config.json; Qwen2_5_VLConfig.
    __post_init__ moves those keys into text_config) under `text_config` (transformers' nested form, which wins).
    Qwen3-VL: `text_config` alone (Qwen3VLConfig moves nothing: top-level text keys are ignored), with the top
    level's tie_word_embeddings (the lm_head tying reads the outer config's)."""
    nested = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    if config.get("model_type") in NESTED:
        tie = {"tie_word_embeddings": config["tie_word_embeddings"]} if "tie_word_embeddings" in config else {}
        return {**nested, **tie, "model_type": NESTED[config["model_type"]]}
    flat = {k: v for k, v in config.items() if k not in ("vision_config", "text_config")}
    return {**flat, **nested}


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
    if model_type == "gemma3":
        return _siglip_tower(config, vc, name)
    defaults = _DEFAULTS[model_type]
    get = {k: vc.get(k, d) if vc.get(k) is not None else d for k, d in defaults.items()}
    ints = {k: _positive(v, name, k) for k, v in get.items() if k not in _INDEX_LISTS}
    lists = {k: _indexes(get[k], name, k) for k in _INDEX_LISTS if k in get}
    if ints["hidden_size"] % ints["num_heads"]:
        raise ConfigError(f"{name}: vision_config hidden_size {ints['hidden_size']} is not divisible by num_heads "
                          f"{ints['num_heads']}")
    token = config.get("image_token_id", _IMAGE_TOKEN)
    return VisionTowerSpec(family=model_type, depth=ints["depth"], hidden=ints["hidden_size"], heads=ints["num_heads"],
                           intermediate=ints["intermediate_size"], out_hidden=ints["out_hidden_size"],
                           patch=ints["patch_size"], temporal_patch=ints["temporal_patch_size"],
                           merge=ints["spatial_merge_size"], window=ints.get("window_size", 0),
                           full_attention_blocks=lists.get("fullatt_block_indexes", ()),
                           in_channels=ints["in_channels"], image_token_id=int(token),
                           position_embeddings=ints.get("num_position_embeddings", 0),
                           deepstack_blocks=lists.get("deepstack_visual_indexes", ()), **_KINDS[model_type])


def _siglip_tower(config: dict, vc: dict, name: str) -> VisionTowerSpec:
    """Gemma 3's SigLIP tower and projector (modeling_gemma3.py :635-668): (image / patch)^2 patches pooled
    kernel x kernel into mm_tokens_per_image tokens, kernel = (image / patch) / sqrt(tokens)."""
    get = {k: vc.get(k) if vc.get(k) is not None else d for k, d in _SIGLIP_VISION.items()}
    ints = {k: _positive(v, name, k) for k, v in get.items()}
    side = ints["image_size"] // ints["patch_size"]
    tokens = _positive(config.get("mm_tokens_per_image", _GEMMA3_TOKENS), name, "mm_tokens_per_image")
    per_side = int(round(tokens ** 0.5))
    if per_side * per_side != tokens or side % per_side:
        raise ConfigError(f"{name}: mm_tokens_per_image {tokens} does not pool the {side} x {side} patch grid evenly")
    text = config.get("text_config") or {}
    out = _positive(text.get("hidden_size", 2304), name, "text_config.hidden_size")  # Gemma3TextConfig default
    return VisionTowerSpec(family="gemma3", depth=ints["num_hidden_layers"], hidden=ints["hidden_size"],
                           heads=ints["num_attention_heads"], intermediate=ints["intermediate_size"], out_hidden=out,
                           patch=ints["patch_size"], temporal_patch=1, merge=side // per_side, window=0,
                           full_attention_blocks=(), in_channels=ints["num_channels"],
                           image_token_id=int(config.get("image_token_index", _GEMMA3_IMAGE_TOKEN)),
                           image_size=ints["image_size"], position_embeddings=side * side, **_KINDS["gemma3"])


def _indexes(v, name: str, key: str) -> tuple[int, ...]:
    if not isinstance(v, (list, tuple)) or not all(isinstance(i, int) and 0 <= i for i in v):
        raise ConfigError(f"{name}: vision_config '{key}' must be a list of block indexes, got {v!r}")
    return tuple(v)


def tower_params(t: VisionTowerSpec) -> int:
    """The tower's parameters. Qwen2.5-VL (modeling_qwen2_5_vl.py): the patch embedding Conv3d without bias (:114,
    in_channels * temporal_patch * patch^2 * hidden); per block two RMSNorms (hidden each, :344-345), qkv (hidden ->
    3 hidden, bias) and proj (hidden -> hidden, bias) (:264-265), the gated MLP with biases (:90-92); the merger's
    RMSNorm (hidden, :189), Linear (hidden * merge^2 -> same, bias) and Linear (hidden * merge^2 -> out_hidden, bias)
    (:190-194). Qwen3-VL (modeling_qwen3_vl.py): the Conv3d with a bias (:100), the position table (rows x hidden,
    :638), LayerNorms (weight + bias, :331-332; the merger's :324), the plain MLP (:83-84), and one more merger per
    deepstack block whose LayerNorm spans hidden * merge^2 (use_postshuffle_norm, :654-661). The rotary embeddings
    hold buffers only."""
    if t.projector == "cross":  # Mllama's tiled tower and projector (models/mllama.py)
        from .mllama import tower_params as mllama_tower_params
        return mllama_tower_params(t)
    h, i, m = t.hidden, t.intermediate, t.hidden * t.merge ** 2
    norm = 2 if t.norm == "layernorm" else 1
    if t.projector == "pool":  # Gemma 3: q, k, v, out with biases (modeling_siglip.py SiglipAttention), the final
        # LayerNorm (post_layernorm), the projector's RMSNorm (h) and projection (h x out_hidden)
        block = 2 * norm * h + 4 * (h * h + h) + (h * i + i) + (i * h + h)
        embed = t.patch_values * h + h + t.position_embeddings * h
        return embed + t.depth * block + norm * h + h + h * t.out_hidden
    embed = t.patch_values * h + (h if t.patch_bias else 0)
    mlp = (2 if t.gated_mlp else 1) * (h * i + i) + (i * h + h)
    block = 2 * norm * h + (h * 3 * h + 3 * h) + (h * h + h) + mlp
    merger_linears = (m * m + m) + (m * t.out_hidden + t.out_hidden)
    merger = norm * h + merger_linears
    deepstack = len(t.deepstack_blocks) * (norm * m + merger_linears)
    return embed + t.position_embeddings * h + t.depth * block + merger + deepstack
