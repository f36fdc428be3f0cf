"""Vision-language models on the command line: the images settings are refused in one line (exit 2) where they do
not apply, an image size the tower cannot take is refused naming the sizes it can, and the analytic engine refuses
a tower it has no terms for (Qwen3-VL) naming --engine trace; Qwen2.5-VL and Gemma 3 are timed with --gpu."""
from __future__ import annotations

import pytest

from trainfit.cli import main


@pytest.mark.parametrize("argv,needle", [
    (["estimate", "llama-3.1-8b", "--images", "2"], "--images applies to vision models (resnet, convnext, vit) and vision-language"),
    (["estimate", "llama-3.1-8b", "--image-size", "448"], "has no vision tower"),
    (["estimate", "resnet-50", "--images", "2"], "--images does not apply to resnet-50"),
    (["estimate", "qwen2.5-vl-7b", "--images", "2", "--image-size", "450", "--engine", "trace"],
     "multiples of 28 pixels (patch 14 x merge 2); use 448 or 476"),
    (["estimate", "qwen2.5-vl-7b", "--mode", "serve", "--images", "2"], "--images applies to train/infer only"),
    (["estimate", "gemma-3-4b", "--image-size", "448", "--engine", "trace"], "takes 896-pixel images only"),
])
def test_bad_vlm_combination_exits_2_in_one_line(argv, needle, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    out = capsys.readouterr()
    assert exit_.value.code == 2 and out.out == ""
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], lines


@pytest.mark.parametrize("model,mode,needle", [("qwen2.5-vl-7b", "train", "step time"),
                                               ("gemma-3-4b", "infer", "prefill time")])
def test_a_vlm_with_images_is_timed(model, mode, needle, capsys):
    """The op list has the towers' kernels (analytic/ops/vision_tower.py): --gpu times the step or the prefill."""
    main(["estimate", model, "--images", "1", "--gpu", "H100-80GB", "--mode", mode])
    out = capsys.readouterr()
    assert "does not model" not in out.err and needle in out.out
