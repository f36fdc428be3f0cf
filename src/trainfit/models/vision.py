"""Image classifiers from an HF config.json -> VisionSpec (no torch), and the vision catalog
(models/catalog/vision/*.json, HF config.json copies with a "_trainfit" object as the text catalog's).

Library decision: the models are built (trace and measure engines) through transformers, which defines them
(ResNetForImageClassification, ConvNextForImageClassification, ViTForImageClassification), not torchvision or
timm: the PyPI torchvision wheel is a CUDA build whose _C.so links libtorch_cuda.so, so with the CPU torch trainfit
installs `import torchvision` raises "operator torchvision::nms does not exist", and timm imports torchvision.
transformers' ResNet-50 has torchvision's architecture (v1.5: stride on the 3x3) and its 25,557,032 parameters.

The keys read are the transformers 5.24 configuration classes' (configuration_resnet.py:55-62,
configuration_convnext.py:47-57, configuration_vit.py:50-65), with their defaults.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from ..errors import ConfigError
from ..spec import VisionSpec
from .hf_config import loads_config

VISION_TYPES = ("convnext", "resnet", "vit")
VISION_DIR = Path(__file__).resolve().parent / "catalog" / "vision"
# transformers' PretrainedConfig default when a config names neither num_labels nor id2label
DEFAULT_LABELS = 2


def _int(config: dict, name: str, key: str, default: int) -> int:
    v = config.get(key, default)
    if isinstance(v, (list, tuple)) and len(v) == 2 and v[0] == v[1]:
        v = v[0]  # image_size / patch_size may be given as a square pair
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ConfigError(f"{name}: '{key}' must be a positive integer, got {v!r}")
    return v


def _ints(config: dict, name: str, key: str, default: tuple) -> tuple[int, ...]:
    v = config.get(key, default)
    if not isinstance(v, (list, tuple)) or not v or not all(isinstance(x, int) and x >= 1 for x in v):
        raise ConfigError(f"{name}: '{key}' must be a list of positive integers, got {v!r}")
    return tuple(v)


def num_labels(config: dict) -> int:
    """num_labels, else len(id2label), else transformers' default 2 (configuration_utils.py)."""
    if isinstance(config.get("num_labels"), int):
        return config["num_labels"]
    if isinstance(config.get("id2label"), dict) and config["id2label"]:
        return len(config["id2label"])
    return DEFAULT_LABELS


def vision_spec(config: dict, name: str, source: str = "") -> VisionSpec:
    """The VisionSpec of a resnet, convnext or vit config.json (one-line ConfigError when malformed)."""
    mt = config.get("model_type")
    common = dict(name=name, family=mt, channels=_int(config, name, "num_channels", 3),
                  num_labels=num_labels(config), source=source, config=config,
                  activation=str(config.get("hidden_act", "relu" if mt == "resnet" else "gelu")))
    if mt == "resnet":
        widths = _ints(config, name, "hidden_sizes", (256, 512, 1024, 2048))
        depths = _ints(config, name, "depths", (3, 4, 6, 3))
        layer = config.get("layer_type", "bottleneck")
        if layer not in ("basic", "bottleneck"):
            raise ConfigError(f"{name}: layer_type {layer!r} is not basic or bottleneck")
        if len(widths) != len(depths):
            raise ConfigError(f"{name}: hidden_sizes and depths differ in length ({len(widths)} vs {len(depths)})")
        if common["activation"] != "relu":
            raise ConfigError(f"{name}: hidden_act {common['activation']!r}: trainfit models ResNets with relu")
        return VisionSpec(**common, image_size=_int(config, name, "image_size", 224), widths=widths, depths=depths,
                          stem=_int(config, name, "embedding_size", 64), layer_type=layer,
                          downsample_in_first_stage=bool(config.get("downsample_in_first_stage", False)),
                          downsample_in_bottleneck=bool(config.get("downsample_in_bottleneck", False)))
    if mt == "convnext":
        widths = _ints(config, name, "hidden_sizes", (96, 192, 384, 768))
        depths = _ints(config, name, "depths", (3, 3, 9, 3))
        if len(widths) != len(depths):
            raise ConfigError(f"{name}: hidden_sizes and depths differ in length ({len(widths)} vs {len(depths)})")
        return VisionSpec(**common, image_size=_int(config, name, "image_size", 224), widths=widths, depths=depths,
                          patch=_int(config, name, "patch_size", 4),
                          layer_scale=float(config.get("layer_scale_init_value", 1e-6)) > 0)
    if mt == "vit":
        hidden = _int(config, name, "hidden_size", 768)
        heads = _int(config, name, "num_attention_heads", 12)
        if hidden % heads:
            raise ConfigError(f"{name}: hidden_size {hidden} is not divisible by num_attention_heads {heads}")
        size, patch = _int(config, name, "image_size", 224), _int(config, name, "patch_size", 16)
        if size % patch:
            raise ConfigError(f"{name}: image_size {size} is not a multiple of patch_size {patch}")
        return VisionSpec(**common, image_size=size, widths=(hidden,),
                          depths=(_int(config, name, "num_hidden_layers", 12),), patch=patch, heads=heads,
                          intermediate=_int(config, name, "intermediate_size", 3072),
                          qkv_bias=bool(config.get("qkv_bias", True)))
    raise ConfigError(f"{name}: model_type {mt!r} is not a vision model ({', '.join(VISION_TYPES)})")


@lru_cache(maxsize=1)
def _vision_catalog() -> tuple[dict[str, dict], dict[str, str]]:
    entries: dict[str, dict] = {}
    keys: dict[str, str] = {}
    for path in sorted(VISION_DIR.glob("*.json")):
        data = loads_config(path.read_bytes(), f"catalog file {path}")
        meta = data.get("_trainfit")
        if not isinstance(meta, dict) or not isinstance(meta.get("name"), str):
            raise ConfigError(f"catalog file {path} has no '_trainfit.name'")
        name = meta["name"].lower()
        entries[name] = data
        for key in [name, *(a.lower() for a in meta.get("aliases", [])), *([meta["hf_id"].lower()]
                                                                          if meta.get("hf_id") else [])]:
            keys[key] = name
    return entries, keys


def vision_names() -> list[str]:
    return sorted(_vision_catalog()[0])


def vision_lookup(ref: str) -> str | None:
    """The vision catalog name of a name, alias or hub id (case-insensitive), else None."""
    return _vision_catalog()[1].get(ref.strip().lower())


def vision_entry(name: str) -> dict:
    return dict(_vision_catalog()[0][name]["_trainfit"])


def vision_catalog_spec(name: str) -> VisionSpec:
    data = _vision_catalog()[0][name]
    meta = data["_trainfit"]
    return vision_spec(data, meta["name"], source=f"trainfit catalog ({meta.get('hf_id') or 'hand-written'})")


def list_vision_models() -> list[VisionSpec]:
    return [vision_catalog_spec(n) for n in vision_names()]
