"""Vision-language models (Qwen2.5-VL, Qwen3-VL, Gemma 3, Llama 3.2 Vision) in the trace engine against a real CPU step of the same model: peaks within
0.5 % (DESIGN.md §5), in training and in inference (prefill with the images + one decode step); the image inputs'
shapes and the estimate's components against hand derivations."""
from __future__ import annotations

import pytest
import torch
from trace_configs import tiny_spec  # tests/trace is on sys.path (rootdir-less import)

from trainfit.components import in_tower
from trainfit.measure import measure
from trainfit.setup import Setup
from trainfit.step.build import vlm_batch
from trainfit.trace import trace_spec
from trainfit.trace.kernel_scratch import cpu_isa

# (family, precision, recompute, optimizer, grad_accum, seq): 2 images per sample, 4 x 4 merged tokens each
# (the default run keeps one training setup a family but Qwen3-VL, Qwen2.5-VL's path with a resampled position table
# checked below; recompute with accumulation is in the heavy tier)
CASES = [("qwen2_5_vl", "amp-bf16", "none", "adamw", 1, 64),
         pytest.param("qwen2_5_vl", "bf16", "full", "sgd", 2, 32, marks=pytest.mark.heavy),
         pytest.param("qwen3_vl", "amp-bf16", "none", "adamw", 1, 64, marks=pytest.mark.heavy),  # Qwen2.5-VL's path
         pytest.param("qwen3_vl", "bf16", "full", "sgd", 2, 32, marks=pytest.mark.heavy),
         ("gemma3", "amp-bf16", "none", "adamw", 1, 64),
         pytest.param("gemma3", "bf16", "full", "sgd", 2, 32, marks=pytest.mark.heavy),
         ("mllama", "amp-bf16", "none", "adamw", 1, 64),
         pytest.param("mllama", "bf16", "full", "sgd", 2, 32, marks=pytest.mark.heavy)]
# 4 x 4 language-model tokens an image: 112 px for Qwen2.5-VL (patch 14 x merge 2), 128 px for Qwen3-VL (16 x 2);
# the tiny Gemma 3's tower takes 56 px only (4 x 4 patches pooled 2 x 2: 4 tokens); the tiny Mllama's tiles are 56 px
# (one tile a 56-pixel image, padded to 4; one <|image|> token)
IMAGE = {"qwen2_5_vl": 112, "qwen3_vl": 128, "gemma3": 56, "mllama": 56}
# the families of the per-family checks below; Mllama's in the heavy tier (its training case stays in the default run)
FAMILIES = [*sorted(f for f in IMAGE if f != "mllama"), pytest.param("mllama", marks=pytest.mark.heavy)]


def _setup(family: str = "qwen2_5_vl", **kw) -> Setup:
    return Setup(batch=2, device="cpu", images=2, image_size=IMAGE[family], **kw)


@pytest.mark.slow
@pytest.mark.parametrize("family,precision,recompute,optimizer,grad_accum,seq", CASES,
                         ids=["-".join(map(str, getattr(c, "values", c))) for c in CASES])
def test_vlm_trace_peak_equals_real_peak(family, precision, recompute, optimizer, grad_accum, seq):
    spec = tiny_spec(family)
    setup = _setup(family, seq=seq, precision=precision, optimizer=optimizer, recompute=recompute,
                   grad_accum=grad_accum)
    traced = trace_spec(spec, setup)
    real = measure(spec, setup, steps=0)
    assert abs(traced.memory.peak - real.peak) <= 0.005 * real.peak, (traced.memory.peak, real.peak, cpu_isa())
    assert traced.params == real.params
    assert traced.memory.weights + traced.memory.at_peak.get("buffers", 0) == real.weights


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_vlm_inference_trace_peak_equals_real_peak(family):
    spec = tiny_spec(family)
    setup = _setup(family, mode="infer", precision="bf16", seq=64)
    traced = trace_spec(spec, setup)
    real = measure(spec, setup, steps=0)
    assert abs(traced.memory.peak - real.peak) <= 0.005 * real.peak, (traced.memory.peak, real.peak, cpu_isa())
    assert traced.memory.peak_phase == real.peak_phase == "prefill"
    # the prefill fills a KV cache and a decode step follows (a model whose forward takes use_cache through
    # **kwargs, Qwen3-VL, included)
    assert traced.detail.records["decode_flops"] > 0


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


def test_qwen3_vl_batch_resamples_the_position_table():
    # Hand derivation, Qwen3-VL (patch 16, temporal patch 2, merge 2x2, an 8 x 8 position table): a 128-pixel image is
    # (128 / 16)^2 = 64 patches of 3 x 2 x 16 x 16 = 1536 values, 16 language-model tokens; each patch reads 2 x 2
    # bilinear taps of the table; no windows (every block attends over the whole image).
    spec = tiny_spec("qwen3_vl")
    b = vlm_batch(spec, _setup("qwen3_vl", seq=32), labels=True)
    assert b["input_ids"].shape == (2, 64) and b["pixel_values"].shape == (256, 1536)
    assert b["image_interp_indices"].shape == b["image_interp_weights"].shape == (256, 4)
    assert "image_window_index" not in b and b["image_cu_seqlens"].tolist() == [0, 64, 128, 192, 256]
    assert b["position_ids"].shape == (3, 2, 64)


@pytest.mark.parametrize("family", FAMILIES)
def test_vlm_components_split_weights_and_activations(family):
    spec = tiny_spec(family)
    setup = _setup(family, seq=32, precision="fp32")
    est = trace_spec(spec, setup)
    parts = est.detail.records["components"]
    from trainfit.step import build_model

    with torch.device("meta"):
        model = build_model(spec, setup)
    # the transformers tower (and Gemma 3's projector), counted by torch
    tower = sum(p.numel() for name, p in model.named_parameters() if in_tower(name.rsplit(".", 1)[0]))
    assert parts["vision_tower"]["params"] == tower > 0
    assert parts["language_model"]["params"] == est.params - tower
    assert parts["vision_tower"]["weights"] == 4 * tower  # fp32
    assert parts["vision_tower"]["activations"] + parts["language_model"]["activations"] == est.memory.activations
    assert parts["vision_tower"]["activations"] > 0
    # per image, from IMAGE's hand derivation; Mllama: 4 tiles x (4 x 4 patches + the class token), one token
    tokens, patches = {"gemma3": (4, 16), "mllama": (1, 4 * 17)}.get(family, (16, 64))
    assert parts["language_model"]["tokens_per_sample"] == 32 + 2 * tokens
    assert parts["vision_tower"]["patches_per_sample"] == 2 * patches


def test_mllama_batch_tiles_follow_the_processor():
    # Hand derivation, the tiny Mllama (56-pixel tiles, max_num_tiles 4): a 56-pixel image is one tile (aspect ratio
    # [1, 1], id 1), a 57-pixel one 2 x 2 tiles ([2, 2]: index 5 of the supported ratios, id 6); pixel_values keep 4
    # tiles either way (the processor pads); 2 <|image|> tokens lead 32 text tokens, the first image's tiles are
    # attended from position 0 on, the second's from position 1 on, labels -100 on the image tokens.
    spec = tiny_spec("mllama")
    for size, ratio, tiles in ((56, 1, 1), (57, 6, 4)):
        b = vlm_batch(spec, Setup(batch=2, device="cpu", images=2, image_size=size, seq=32), labels=True)
        assert b["pixel_values"].shape == (2, 2, 4, 3, 56, 56) and b["input_ids"].shape == (2, 34)
        assert b["aspect_ratio_ids"].tolist() == [[ratio] * 2] * 2
        assert b["aspect_ratio_mask"][0, 0].tolist() == [1] * tiles + [0] * (4 - tiles)
        assert b["cross_attention_mask"].shape == (2, 34, 2, 4)
        assert b["cross_attention_mask"][0, :, 0, 0].sum() == 34 and b["cross_attention_mask"][0, :, 1, 0].sum() == 33
        assert (b["input_ids"][:, :2] == 1000).all() and (b["labels"][:, :2] == -100).all()
        assert (b["input_ids"][:, 2:] != 1000).all()
