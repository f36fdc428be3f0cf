"""A vision-language model (Qwen2.5-VL) in the trace engine against a real CPU step of the same model: peaks within
0.5 % (DESIGN.md §5), in training and in inference (prefill with the images + one decode step); the image inputs'
shapes and the estimate's components against hand derivations."""
from __future__ import annotations

import pytest
import torch
from trace_configs import tiny_spec  # tests/trace is on sys.path (rootdir-less import)

from trainfit.measure import measure
from trainfit.setup import Setup
from trainfit.step.build import vlm_batch
from trainfit.trace import trace_spec
from trainfit.trace.kernel_scratch import cpu_isa

# (precision, recompute, optimizer, grad_accum, seq): 2 images of 112 pixels per sample
CASES = [("amp-bf16", "none", "adamw", 1, 64), ("bf16", "full", "sgd", 2, 32)]


def _setup(**kw) -> Setup:
    return Setup(batch=2, device="cpu", images=2, image_size=112, **kw)


@pytest.mark.slow
@pytest.mark.parametrize("precision,recompute,optimizer,grad_accum,seq", CASES, ids=["-".join(map(str, c)) for c in CASES])
def test_vlm_trace_peak_equals_real_peak(precision, recompute, optimizer, grad_accum, seq):
    spec = tiny_spec("qwen2_5_vl")
    setup = _setup(seq=seq, precision=precision, optimizer=optimizer, recompute=recompute, grad_accum=grad_accum)
    traced = trace_spec(spec, setup)
    real = measure(spec, setup, steps=0)
    assert abs(traced.memory.peak - real.peak) <= 0.005 * real.peak, (traced.memory.peak, real.peak, cpu_isa())
    assert traced.params == real.params
    assert traced.memory.weights + traced.memory.at_peak.get("buffers", 0) == real.weights


@pytest.mark.slow
def test_vlm_inference_trace_peak_equals_real_peak():
    spec = tiny_spec("qwen2_5_vl")
    setup = _setup(mode="infer", precision="bf16", seq=64)
    traced = trace_spec(spec, setup)
    real = measure(spec, setup, steps=0)
    assert abs(traced.memory.peak - real.peak) <= 0.005 * real.peak, (traced.memory.peak, real.peak, cpu_isa())
    assert traced.memory.peak_phase == real.peak_phase == "prefill"


def test_vlm_batch_shapes_follow_the_image_size():
    # Hand derivation, Qwen2.5-VL (patch 14, temporal patch 2, merge 2x2): a 112-pixel image is (112 / 14)^2 = 64
    # patches of 3 x 2 x 14 x 14 = 1176 values for the tower and (112 / 28)^2 = 16 tokens in the language model's
    # sequence; 2 samples x 2 images: 256 patch rows, 4 grid rows (1, 8, 8); each sample 32 + 2 x 16 = 64 ids, 32 of
    # them the image placeholder, whose labels are -100.
    spec = tiny_spec("qwen2_5_vl")
    b = vlm_batch(spec, _setup(seq=32), labels=True)
    assert b["input_ids"].shape == (2, 64) and b["pixel_values"].shape == (256, 1176)
    assert b["image_grid_thw"].tolist() == [[1, 8, 8]] * 4
    assert ((b["input_ids"] == 999).sum(dim=1) == 32).all() and ((b["labels"] == -100).sum(dim=1) == 32).all()
    # 4 images of 64 patches, each split into 2 x 2 windows of 16 patches (window 56 px = 2 merged tokens a side)
    assert b["image_cu_seqlens"].tolist() == [0, 64, 128, 192, 256]
    assert b["image_cu_window_seqlens"].tolist() == list(range(0, 257, 16))


def test_vlm_components_split_weights_and_activations():
    spec = tiny_spec("qwen2_5_vl")
    setup = _setup(seq=32, precision="fp32")
    est = trace_spec(spec, setup)
    parts = est.detail.records["components"]
    from trainfit.step import build_model

    with torch.device("meta"):
        model = build_model(spec, setup)
    tower = sum(p.numel() for p in model.model.visual.parameters())  # the transformers tower, counted by torch
    assert parts["vision_tower"]["params"] == tower
    assert parts["language_model"]["params"] == est.params - tower
    assert parts["vision_tower"]["weights"] == 4 * tower  # fp32
    assert parts["vision_tower"]["activations"] + parts["language_model"]["activations"] == est.memory.activations
    assert parts["vision_tower"]["activations"] > 0
    assert parts["language_model"]["tokens_per_sample"] == 32 + 2 * 16
    assert parts["vision_tower"]["patches_per_sample"] == 2 * 64
