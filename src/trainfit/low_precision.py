"""The low-precision training recipes (--low-precision): the number format and the scaling each one uses (no torch).

A recipe runs the projections' GEMMs in an 8- or 4-bit format, each operand quantised with scales of one
granularity. Which library runs a recipe, what it keeps beside the high-precision weights and what it saves for the
backward are the stack's facts (stacks/<stack>.toml [low_precision], with the library's file:line); this table holds
only what the formats themselves fix. Sources:
  * tensorwise / delayed: one fp32 scale per tensor, e4m3 elements (Micikevicius et al. 2022, "FP8 Formats for Deep
    Learning", arXiv:2209.05433 §3). tensorwise takes the scale from the tensor's current amax (torchao's dynamic
    scaling; Transformer Engine's Float8CurrentScaling, Megatron `--fp8-recipe tensorwise`); delayed from an amax
    history of earlier steps (Transformer Engine's DelayedScaling, Megatron `--fp8-recipe delayed`).
  * rowwise / rowwise_with_gw_hp: one fp32 scale per row of each operand along the GEMM's reduction dim (torchao
    float8 `Float8LinearRecipeName.ROWWISE`, `ROWWISE_WITH_GW_HP`: the weight-gradient GEMM kept in bf16).
  * blockwise: 1x128 tiles of activations and gradients and 128x128 blocks of weights, one fp32 scale each
    (DeepSeek-V3 technical report, arXiv:2412.19437 §3.3.2; Transformer Engine Float8BlockScaling).
  * mxfp8: OCP Microscaling Formats (MX) v1.0 §5: 32 elements share one 8-bit power-of-two (E8M0) scale, e4m3
    elements; GEMMs on block-scaled tensor cores (sm100).
  * nvfp4: 16 e2m1 elements (4 bits) share one e4m3 scale, plus one fp32 scale per tensor (NVIDIA, "Pretraining
    Large Language Models with NVFP4", arXiv:2509.25149 §2); GEMMs on sm100's fp4 tensor cores.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Recipe:
    name: str
    element_bytes: float  # bytes of one quantised element (e4m3: 1, e2m1: 0.5)
    scale: str  # "tensor" | "row" | "block"
    block: int  # elements along the reduction dim sharing one scale ("block"; 0 otherwise)
    scale_bytes: int  # bytes of one scale (fp32 4, e8m0 / e4m3 1)
    peak: str  # the gpus.json peak_flops key its GEMMs run at (a GPU without it lacks those tensor cores)
    summary: str

    @property
    def per_element(self) -> float:
        """Bytes of one quantised element with its share of a block's scale (MXFP8: an e8m0 per 32, NVFP4: an e4m3
        per 16, blockwise: an fp32 per 128 of a row); per-tensor and per-row scales are a tensor's or a row's, not an
        element's (quantised_bytes). NB: NVFP4's per-tensor fp32 amax is left out, and blockwise's 128x128 weight
        blocks are counted per 128: over-counts the weights' scales by < 3 %."""
        return self.element_bytes + (self.scale_bytes / self.block if self.scale == "block" else 0.0)

    def quantised_bytes(self, elements: float, rows: int = 1) -> float:
        """Bytes of `elements` quantised by this recipe: the elements plus their scales (`rows`: rows of the tensor
        along the non-reduction dim, for row scaling). NB: a 2-D block's (128x128) scales are counted per 128
        elements of a row — an over-count of the weights' scales by 128x, a few KiB per layer."""
        if self.scale == "tensor":
            return elements * self.element_bytes + self.scale_bytes
        if self.scale == "row":
            return elements * self.element_bytes + rows * self.scale_bytes
        return elements * self.per_element


RECIPES: dict[str, Recipe] = {r.name: r for r in (
    Recipe("tensorwise", 1.0, "tensor", 0, 4, "fp8", "fp8 e4m3, one dynamic fp32 scale per tensor"),
    Recipe("delayed", 1.0, "tensor", 0, 4, "fp8", "fp8, one fp32 scale per tensor from an amax history"),
    Recipe("rowwise", 1.0, "row", 0, 4, "fp8", "fp8 e4m3, one fp32 scale per row"),
    Recipe("rowwise_with_gw_hp", 1.0, "row", 0, 4, "fp8",
           "fp8 rowwise forward and input-gradient GEMMs; the weight-gradient GEMM in bf16"),
    Recipe("blockwise", 1.0, "block", 128, 4, "fp8", "fp8, fp32 scales per 1x128 tile / 128x128 weight block"),
    Recipe("mxfp8", 1.0, "block", 32, 1, "mxfp8", "MXFP8: e4m3, one e8m0 scale per 32 elements (sm100)"),
    Recipe("nvfp4", 0.5, "block", 16, 1, "fp4", "NVFP4: e2m1, one e4m3 scale per 16 elements (sm100)"),
)}
NONE = "none"
CHOICES = (NONE, *RECIPES)
# How an MX recipe rounds each 32-element block's e8m0 scale (torchao ScaleCalculationMode, prototype/mx_formats/
# config.py at v0.16.0 :50-80): FLOOR (the OCP MX spec's, torchao's mxfp8_cublas) or RCEIL (cuBLAS's, the
# mxfp8_cublas_rceil recipe, :222-233). The same bytes; the cast kernels differ in speed (ops/torchao_casts.py).
MX_SCALES = ("floor", "rceil")


def recipe(setup) -> Recipe | None:
    """The Setup's --low-precision recipe, None when off (a light planner config without the field: off)."""
    return RECIPES.get(getattr(setup, "low_precision", NONE))
