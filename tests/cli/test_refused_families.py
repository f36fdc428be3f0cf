"""A family or setting the analytic engine does not model (analytic/unmodelled.py, a family module's own refusal) is
refused by every command that needs its formulas with the same one line and exit 2, never a traceback or a
misleading "nothing fits"."""
from __future__ import annotations

import pytest

from trainfit.cli import main


@pytest.mark.parametrize("argv", [
    ["estimate", "tiny-deepseek", "--attention", "eager"],  # (MLA under eager attention: activations.check_trainable)
])
def test_refusal_is_one_line(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    out = capsys.readouterr()
    assert exit_.value.code == 2 and out.out == ""
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and "the analytic engine does not model" in lines[0] and "--engine trace" in lines[0]


def test_nemotron_h_inference_is_not_refused(capsys):
    """Nemotron-H's inference memory is modelled (analytic/hybrid_inference.py): no refusal without --gpu."""
    main(["estimate", "nemotron-nano-9b-v2", "--mode", "infer", "--seq", "4096"])
    out = capsys.readouterr()
    assert "does not model" not in out.err and "prefill" in out.out


@pytest.mark.parametrize("server", ["vllm", "sglang"])
def test_serving_a_vision_language_model_is_refused(server, capsys):
    """Serving sizes the engine's own profile run, not the analytic terms (analytic/serving.py), so the vision tower's
    refusal must come from serving itself: a VLM's encoder cache and images in the profile run are not modelled."""
    with pytest.raises(SystemExit) as exit_:
        main(["estimate", "qwen2.5-vl-7b", "--mode", "serve", "--gpu", "H100-80GB", "--server", server])
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(lines) == 1 and "vision tower" in lines[0]


def test_qwen3_next_is_timed(capsys):
    """Qwen3-Next's op list lists its Gated DeltaNet layers' kernels (analytic/ops/gated_deltanet.py): estimate --gpu
    times the step instead of refusing it."""
    main(["estimate", "qwen3-next-80b-a3b", "--gpu", "H100-80GB"])
    out = capsys.readouterr()
    assert "does not model" not in out.err and "step time" in out.out


def test_nemotron_h_is_timed(capsys):
    """Nemotron-H's op list lists its Mamba-2 blocks' kernels (analytic/ops/mamba2.py): estimate --gpu times the
    step, and the prefill and decode of --mode infer, instead of refusing them."""
    main(["estimate", "nemotron-h-8b", "--gpu", "H100-80GB"])
    out = capsys.readouterr()
    assert "does not model" not in out.err and "step time" in out.out and "MFU" in out.out
    main(["estimate", "nemotron-h-8b", "--gpu", "H100-80GB", "--mode", "infer"])
    out = capsys.readouterr()
    assert "does not model" not in out.err and "prefill time" in out.out and "decode tokens/s" in out.out


def test_llama_3_2_vision_is_timed(capsys):
    """Llama 3.2 Vision's op list lists its tiled tower's and cross-attention layers' kernels (analytic/ops/
    mllama_tower.py): estimate --gpu times the step instead of refusing it."""
    main(["estimate", "llama-3.2-11b-vision", "--images", "1", "--gpu", "H100-80GB"])
    out = capsys.readouterr()
    assert "does not model" not in out.err and "step time" in out.out


@pytest.mark.parametrize("argv", [
    ["sweep", "mixtral-8x7b", "--vary", "batch", "1:2", "--lora-rank", "16"],
    ["compare", "mixtral-8x7b", "--lora-rank", "16"],
    ["fit", "mixtral-8x7b", "--gpu", "H100-80GB", "--lora-rank", "16"],
])
def test_a_refusal_under_a_command_without_engine_names_estimates(argv, cli):
    """sweep, compare and fit passed on the analytic engine's 'use --engine trace or measure', an option none of them
    has ('No such option: --engine'): they name `trainfit estimate --engine trace`; estimate's line is unchanged."""
    code, out, err = cli("estimate", "mixtral-8x7b", "--lora-rank", "16")
    assert code == 2 and "use --engine trace or measure" in err
    reason = err.strip().split(": use ")[0]
    code, out, err = cli(argv[0], "--help")
    assert code == 0 and "--engine" not in out
    code, out, err = cli(*argv)
    assert code == 2 and len(err.strip().splitlines()) == 1 and reason.removeprefix("error: ") in err
    assert "use `trainfit estimate --engine trace` or measure" in err and " --engine trace or" not in err.replace(
        "`trainfit estimate --engine trace`", "")
