"""One micro-batch of Llama 3.2 Vision (mllama) with images, as MllamaProcessor makes it (transformers 5.24
models/mllama/processing_mllama.py, image_processing_mllama.py) and MllamaModel.forward reads it (modeling_mllama.py
:1295-1390)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ..setup import Setup
    from ..spec import ModelSpec


def tile_layout(spec: "ModelSpec", image_size: int) -> tuple[int, int]:
    """(aspect ratio id, tiles) of a square image of `image_size` pixels: the processor's canvas
    (image_processing_pil_mllama.py :279-345 get_optimal_tiled_canvas, transformers' own function in its numpy
    processor, which needs no torchvision: the smallest
    arrangement of tiles that holds the image upscaled, else the largest downscale; a square image takes 1 tile up to
    the tile size, else 2 x 2) and its id, the arrangement's index in supported_aspect_ratios + 1 (:135-173
    convert_aspect_ratios_to_ids_np; 0 is padding)."""
    from transformers.models.mllama.image_processing_pil_mllama import get_optimal_tiled_canvas

    t = spec.vision
    canvas = get_optimal_tiled_canvas(image_size, image_size, t.max_tiles, t.image_size)
    arrangement = (int(canvas[0]) // t.image_size, int(canvas[1]) // t.image_size)
    return t.aspect_ratios.index(arrangement) + 1, arrangement[0] * arrangement[1]


def tiled_batch(spec: "ModelSpec", setup: "Setup", device="cpu", labels: bool = False) -> dict:
    """- input_ids (batch, images + seq): the <|image|> tokens first (processing_mllama.py :123-160
      build_string_from_input puts them before the text), then --seq random text ids (never the image id);
    - pixel_values (batch, images, max_tiles, channels, tile, tile) fp32: every image padded to max_tiles tiles
      (image_processing_pil_mllama.py :83-132 pack_images), whatever its size;
    - aspect_ratio_ids (batch, images) and aspect_ratio_mask (batch, images, max_tiles): the image's arrangement
      (tile_layout) and its real tiles (build_aspect_ratio_mask_np :51-80);
    - cross_attention_mask (batch, L, images, max_tiles): the processor's (processing_mllama.py :27-120: consecutive
      image tokens all attend from their place to the sequence's end, over the image's real tiles);
    - labels (training): input_ids with the image tokens at -100.
    The ids and masks are made from Python values (constants under the trace's fake mode, as step/build.py
    vlm_batch's)."""
    from .build import _real_tensors

    t, n = spec.vision, setup.images
    ratio_id, tiles = tile_layout(spec, setup.image_size)
    length = n + setup.seq
    with _real_tensors():
        ids = torch.randint(0, spec.vocab, (setup.batch, length), dtype=torch.long)
        ids = ids.masked_fill(ids == t.image_token_id, 0)
        ids[:, :n] = t.image_token_id
        cross = torch.zeros(setup.batch, length, n, t.max_tiles, dtype=torch.long)
        for j in range(n):
            cross[:, j:, j, :tiles] = 1
        ratio_mask = torch.zeros(setup.batch, n, t.max_tiles, dtype=torch.long)
        ratio_mask[:, :, :tiles] = 1
        values = {"input_ids": ids, "cross_attention_mask": cross, "aspect_ratio_mask": ratio_mask,
                  "aspect_ratio_ids": torch.full((setup.batch, n), ratio_id, dtype=torch.long)}
        values = {k: (v.tolist(), v.dtype) for k, v in values.items()}
    batch = {k: torch.tensor(v, dtype=dt, device=device) for k, (v, dt) in values.items()}
    batch["pixel_values"] = torch.randn(setup.batch, n, t.max_tiles, t.in_channels, t.image_size, t.image_size,
                                        dtype=torch.float32, device=device)
    if labels:
        lab = batch["input_ids"].clone()
        lab[:, :n] = -100
        batch["labels"] = lab
    return batch
