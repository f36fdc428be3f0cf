"""Llama 3.2 Vision (transformers model_type "mllama", MllamaForConditionalGeneration) from an HF config.json (no
torch): the language model's fields, the vision tower's VisionTowerSpec and their parameters.

transformers 5.24 models/mllama/configuration_mllama.py: MllamaVisionConfig's defaults (:61-75, the 11B's tower:
hidden 1280, 32 local + 8 global layers, 16 heads, MLP 5120, patch 14, 4 tiles, intermediate_layers_indices
[3, 7, 15, 23, 30], the eight supported aspect ratios) and MllamaTextConfig's (:124-141: the 11B's language model,
hidden 4096, 40 layers of which cross_attention_layers [3, 8, ..., 38], 32 heads, 8 KV heads, MLP 14336, vocab
128256). The published config.json nests both (text_config, vision_config); image_token_index 128256.

Why a module of its own: Mllama is not a tower whose tokens join the language model's sequence (models/vlm.py) but
a tiled tower read through gated cross-attention layers in the language model; its parameter terms (the tile
position tables, the cross-attention layers' q/k norms and gates, the embedding's 8 extra rows) are its own.
"""
from __future__ import annotations

from ..errors import ConfigError
from ..spec import ModelSpec, VisionTowerSpec

MODEL_TYPE = "mllama"
# MllamaTextConfig's defaults (configuration_mllama.py:124-141) that set shapes
TEXT_DEFAULTS = dict(vocab_size=128256, hidden_size=4096, hidden_act="silu", num_hidden_layers=40,
                     num_attention_heads=32, num_key_value_heads=8, intermediate_size=14336,
                     max_position_embeddings=131072, tie_word_embeddings=False,
                     cross_attention_layers=[3, 8, 13, 18, 23, 28, 33, 38])
# MllamaVisionConfig's defaults (configuration_mllama.py:61-75, __post_init__ :77-81)
_VISION_INTS = dict(hidden_size=1280, num_hidden_layers=32, num_global_layers=8, attention_heads=16,
                    num_channels=3, intermediate_size=5120, image_size=448, patch_size=14, max_num_tiles=4)
_INTERMEDIATE = (3, 7, 15, 23, 30)
_ASPECT_RATIOS = ((1, 1), (1, 2), (1, 3), (1, 4), (2, 1), (2, 2), (3, 1), (4, 1))
_IMAGE_TOKEN = 128256  # MllamaConfig.image_token_index (configuration_mllama.py:183)
EXTRA_ROWS = 8  # MllamaTextModel.embed_tokens = Embedding(vocab_size + 8, hidden) (modeling_mllama.py:1030)


def text_config(config: dict) -> dict:
    """The language model's keys: text_config over MllamaTextConfig's defaults (model_type mllama_text_model)."""
    nested = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    return {**TEXT_DEFAULTS, **{k: v for k, v in nested.items() if v is not None}}


def cross_layers(text: dict, layers: int, name: str) -> tuple[int, ...]:
    """cross_attention_layers, checked: distinct layer indexes below num_hidden_layers."""
    v = text.get("cross_attention_layers")
    if (not isinstance(v, (list, tuple)) or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < layers
                                                     for i in v) or len(set(v)) != len(v)):
        raise ConfigError(f"{name}: text_config 'cross_attention_layers' must list distinct layer indexes below "
                          f"num_hidden_layers {layers}, got {v!r}")
    return tuple(sorted(v))


def tower_spec(config: dict, name: str, text_hidden: int, layers: int) -> VisionTowerSpec:
    """The VisionTowerSpec of an Mllama config (one-line ConfigError when malformed)."""
    vc = config.get("vision_config") or {}
    if not isinstance(vc, dict):
        raise ConfigError(f"{name}: 'vision_config' must be a JSON object, got {type(vc).__name__}")
    ints = {}
    for k, d in _VISION_INTS.items():
        v = vc.get(k) if vc.get(k) is not None else d
        if isinstance(v, (list, tuple)) and len(v) == 2 and v[0] == v[1]:
            v = v[0]  # image and patch sizes may be given as a square pair
        if isinstance(v, bool) or not isinstance(v, int) or v < (0 if k == "num_global_layers" else 1):
            raise ConfigError(f"{name}: vision_config '{k}' must be a positive integer, got {v!r}")
        ints[k] = v
    h, depth = ints["hidden_size"], ints["num_hidden_layers"]
    inter = vc.get("intermediate_layers_indices") or _INTERMEDIATE
    if not isinstance(inter, (list, tuple)) or not all(isinstance(i, int) and -depth <= i < depth for i in inter):
        raise ConfigError(f"{name}: vision_config 'intermediate_layers_indices' must list layer indexes below "
                          f"num_hidden_layers {depth}, got {inter!r}")
    ratios = vc.get("supported_aspect_ratios") or _ASPECT_RATIOS
    if not isinstance(ratios, (list, tuple)) or not all(
            isinstance(r, (list, tuple)) and len(r) == 2 and all(isinstance(x, int) and x > 0 for x in r)
            for r in ratios):
        raise ConfigError(f"{name}: vision_config 'supported_aspect_ratios' must list [rows, columns] pairs, got "
                          f"{ratios!r}")
    # the projector reads the last hidden state and the intermediate ones concatenated (MllamaVisionModel.forward
    # :998-1011): vision_output_dim must be their width (the model fails otherwise)
    out_dim = vc.get("vision_output_dim", 7680)
    if out_dim != h * (1 + len(inter)):
        raise ConfigError(f"{name}: vision_config 'vision_output_dim' {out_dim!r} is not hidden_size x (1 + "
                          f"{len(inter)} intermediate layers) = {h * (1 + len(inter))}")
    if h % ints["attention_heads"]:
        raise ConfigError(f"{name}: vision_config hidden_size {h} is not divisible by attention_heads "
                          f"{ints['attention_heads']}")
    if ints["image_size"] < ints["patch_size"]:
        raise ConfigError(f"{name}: vision_config image_size {ints['image_size']} is below patch_size "
                          f"{ints['patch_size']}")
    token = config.get("image_token_index", config.get("image_token_id", _IMAGE_TOKEN))
    return VisionTowerSpec(
        family=MODEL_TYPE, depth=depth, hidden=h, heads=ints["attention_heads"],
        intermediate=ints["intermediate_size"], out_hidden=text_hidden, patch=ints["patch_size"], temporal_patch=1,
        merge=1, window=0, full_attention_blocks=(), in_channels=ints["num_channels"], image_token_id=int(token),
        image_size=ints["image_size"], norm="layernorm", gated_mlp=False, patch_bias=False, projector="cross",
        global_layers=ints["num_global_layers"], max_tiles=ints["max_num_tiles"],
        intermediate_layers=tuple(i % depth for i in inter), aspect_ratios=tuple(tuple(r) for r in ratios),
        cross_layers=cross_layers(text_config(config), layers, name))


def tower_params(t: VisionTowerSpec) -> int:
    """MllamaVisionModel and the multi_modal_projector (modeling_mllama.py): the patch Conv2d without bias (:837-844,
    channels x patch^2 x hidden), the class embedding (hidden, :846); the gated position embedding (:143-161: a gate,
    a (tile tokens, hidden) table and a tile table of (aspect ratios + 1) rows of max_tiles x tile tokens x hidden);
    the pre- and post-tile embeddings (:120-131: (aspect ratios + 1) rows of max_tiles x hidden, a gate each);
    layernorm_pre and layernorm_post (:853-854); per encoder layer (:289-306) q, k, v, o without bias, fc1 and fc2
    with biases (:181-187), two LayerNorms, and in the global layers gate_attn and gate_ffn; the projector Linear
    (hidden x (1 + intermediate layers) -> text hidden, bias, :1285-1289)."""
    h, i, rows = t.hidden, t.intermediate, len(t.aspect_ratios) + 1
    layer = 4 * h * h + (h * i + i) + (i * h + h) + 2 * 2 * h
    embed = t.patch_values * h + h + (1 + t.tile_tokens * h + rows * t.max_tiles * t.tile_tokens * h)
    tiles = 2 * (rows * t.max_tiles * h + 1)
    out_dim = h * (1 + len(t.intermediate_layers))
    return (embed + tiles + 2 * 2 * h + t.depth * layer + t.global_layers * (layer + 2)
            + out_dim * t.out_hidden + t.out_hidden)


def extra_embedding_rows(spec: ModelSpec) -> int:
    """MllamaTextModel.embed_tokens holds vocab_size + 8 rows (modeling_mllama.py:1030); 0 for other models."""
    return EXTRA_ROWS if spec.vision is not None and spec.vision.cross_layers else 0


def cross_layer_extras(spec: ModelSpec) -> int:
    """What each Mllama cross-attention layer (MllamaCrossAttentionDecoderLayer :672-685, whose q, k, v, o, MLP and
    two RMSNorms have a self-attention layer's shapes: k and v read the projected vision tokens, already of the text
    width) holds beyond a Llama layer: q_norm and k_norm over head_dim (:424-425) and the two tanh gates (:681,
    :685); 0 for other models."""
    t = spec.vision
    if t is None or not t.cross_layers:
        return 0
    return len(t.cross_layers) * (2 * spec.head_dim + 2)
