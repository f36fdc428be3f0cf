"""A vision-language model's estimate split into its vision tower and its language model (issue 38: the estimate
shows them separately). Plain arithmetic over an estimate (no torch).

- parameters: the tower's exactly (analytic/params.py ParamCounts.vision), the language model's the rest;
- weights: the weight bytes shared in proportion to the parameters (one dtype for every parameter in each
  precision; NB: the CUDA allocator's 512-byte rounding per tensor is shared the same way, off by < 512 B per tensor);
- activations (training): the trace's activations at forward end attributed by the module that made them
  (Analysis.activations_by_module): the tower's are those made under `model.visual` (the patch embedding, the blocks,
  the merger; Gemma 3: `model.vision_tower` and `model.multi_modal_projector`), the language model's the rest (embedding, the image tokens' scatter, layers, head, loss). With an
  extrapolated trace the by-module figures are the shortest trace's, whose tower is the full tower: the language
  model's are the whole's minus the tower's.
- tokens: the tower's patches and the language model's tokens per sample.
"""
from __future__ import annotations

from dataclasses import replace

# the tower's modules: Qwen2_5_VLModel.visual, Qwen3VLModel.visual (with its mergers); Gemma3Model.vision_tower and
# its multi_modal_projector (modeling_gemma3.py); MllamaModel.vision_model and its multi_modal_projector
# (modeling_mllama.py :1283-1289)
TOWER_MODULES = ("model.visual", "model.vision_tower", "model.multi_modal_projector", "model.vision_model")


def in_tower(module: str) -> bool:
    """Whether a module (its dotted name in the model) belongs to the vision tower."""
    return any(module == m or module.startswith(m + ".") for m in TOWER_MODULES)


def components(spec, est) -> dict | None:
    """{"vision_tower": {...}, "language_model": {...}} for a VLM estimate (None for other models)."""
    if getattr(spec, "vision", None) is None:
        return None
    from .analytic.params import count_params
    from .vlm_setup import lm_tokens

    counts = count_params(spec)
    s, m = est.setup, est.memory
    tower_params = counts.vision
    tower_weights = round(m.weights * tower_params / counts.total) if counts.total else 0
    images = s.images or 0
    out = {"vision_tower": {"params": tower_params, "weights": tower_weights,
                            "patches_per_sample": images * spec.vision.patches(s.image_size),
                            "images_per_sample": images, "image_size": s.image_size},
           "language_model": {"params": counts.total - tower_params, "weights": m.weights - tower_weights,
                              "tokens_per_sample": lm_tokens(spec, s.seq, images, s.image_size),
                              "image_tokens_per_sample": images * spec.vision.tokens(s.image_size)}}
    by_module = est.detail.records.get("activations_by_module")
    if s.mode == "train" and by_module:
        tower = sum(b for mod, b in by_module.items() if in_tower(mod))
        out["vision_tower"]["activations"] = tower
        out["language_model"]["activations"] = m.activations - tower
    return out


def with_components(spec, est):
    """`est` with its components in detail.records["components"] (a VLM), else `est` itself."""
    parts = components(spec, est)
    return est if parts is None else replace(est, detail=est.detail.with_records(components=parts))
