"""The Setup of a vision-language model (a ModelSpec with a VisionTowerSpec): --images per sample and --image-size
set the image tokens; --seq stays the text tokens. Models without a vision tower refuse both in one line."""
from __future__ import annotations

from .errors import SetupError
from .spec import ModelSpec

DEFAULT_IMAGES = 1  # images per sample when --images is not given
IMAGE_MODES = ("train", "infer")  # the modes whose step runs the vision tower


def vlm_values(spec: ModelSpec, values: dict) -> dict:
    """`values` with the images and image size of `spec` resolved (checked); unchanged for a text model, which
    refuses --images and --image-size (SetupError, one line)."""
    if spec.vision is None:
        for name, flag in (("images", "--images"), ("image_size", "--image-size")):
            if values.get(name) is not None:
                raise SetupError(f"{flag} applies to vision models (resnet, convnext, vit) and vision-language models "
                                 f"({spec.name} ({spec.family}) has no vision tower)")
        return values
    if values.get("mode") not in IMAGE_MODES:  # serving and RL: the language model's (the flags are refused there)
        return values
    images = DEFAULT_IMAGES if values.get("images") is None else values["images"]
    size = values.get("image_size") or spec.vision.image_size
    check_image(spec, size)
    return {**values, "images": images, "image_size": size}


def check_image(spec: ModelSpec, size: int) -> None:
    """A square image the tower takes whole: a multiple of patch x merge pixels (Qwen2VLImageProcessor smart_resize
    rounds every side to that factor)."""
    if spec.vision.max_tiles:  # Mllama: the processor resizes any image into its tiles (models/mllama.py)
        return
    tile = spec.vision.tile
    if spec.vision.fixed_size and size != spec.vision.image_size:
        raise SetupError(f"--image-size {size}: {spec.name}'s vision tower takes {spec.vision.image_size}-pixel images "
                         f"only (a position row per {spec.vision.patch}-pixel patch; the processor resizes to it)")
    if size % tile:
        lo, hi = max(tile, size // tile * tile), (size // tile + 1) * tile
        raise SetupError(f"--image-size {size}: {spec.name} takes images in multiples of {tile} pixels (patch "
                         f"{spec.vision.patch} x merge {spec.vision.merge}); use {lo} or {hi}")


def lm_tokens(spec: ModelSpec, seq: int, images: int, image_size: int) -> int:
    """The language model's sequence per sample: the text tokens + images x tokens per image."""
    return seq + (images * spec.vision.tokens(image_size) if spec.vision is not None else 0)


def lm_seq(spec: ModelSpec, setup) -> int:
    """The language model's tokens per sample in `setup` (--seq for a text model)."""
    return lm_tokens(spec, setup.seq, setup.images or 0, setup.image_size or 0)
