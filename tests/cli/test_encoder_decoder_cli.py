"""Encoder-decoder models (T5 / Flan-T5) on the command line: --target-seq sets the decoder's tokens, the trace engine
runs the real T5ForConditionalGeneration, and what is not modelled is refused in one line with exit 2."""
from __future__ import annotations

import pytest

from trainfit.cli import main


def _refused(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    out = capsys.readouterr()
    assert exit_.value.code == 2 and out.out == ""
    lines = out.err.strip().splitlines()
    assert len(lines) == 1, out.err
    return lines[0]


@pytest.mark.parametrize("argv,needle", [
    # a one-sequence model has no decoder length
    (["estimate", "llama-3.2-1b", "--target-seq", "64"], "--target-seq"),
    (["estimate", "bert-base", "--seq", "128", "--target-seq", "64", "--mode", "infer"], "--target-seq"),
    # serving and RL of an encoder-decoder model are not modelled
    (["estimate", "flan-t5-large", "--mode", "serve", "--gpu", "H100-80GB"], "--mode serve"),
    (["estimate", "tiny-t5", "--target-seq", "0", "--engine", "trace"], "--target-seq"),
    (["estimate", "t5-small", "--mode", "rl", "--gpu", "H100-80GB"], "--mode rl"),
    # transformers' T5 classifiers are not modelled; the seq2seq head is the encoder-decoder families' own
    (["estimate", "t5-small", "--head", "seq-cls", "--engine", "trace"], "LM head only"),
    (["estimate", "llama-3.2-1b", "--head", "seq2seq-lm"], "--head seq2seq-lm"),
    # BART's decoder has 1,024 learned positions (the decode step writes one more in inference)
    (["estimate", "bart-base", "--seq", "512", "--target-seq", "1025", "--engine", "trace"], "learned positions"),
    (["estimate", "bart-base", "--mode", "infer", "--target-seq", "1024", "--engine", "trace"], "learned positions"),
    # Whisper's encoder reads exactly 30 s of audio (1,500 positions); its decoder has 448 positions
    (["estimate", "whisper-tiny", "--seq", "1024", "--engine", "trace"], "--seq 1500"),
    (["estimate", "whisper-tiny", "--target-seq", "449", "--engine", "trace"], "448 learned positions"),
])
def test_bad_encoder_decoder_combinations_exit_2_in_one_line(argv, needle, capsys):
    assert needle in _refused(argv, capsys)


def test_trace_estimate_of_a_t5_shows_the_decoder_length(capsys):
    main(["estimate", "tiny-t5", "--seq", "64", "--target-seq", "16", "--engine", "trace", "--device", "cpu"])
    out = capsys.readouterr().out
    assert "seq2seq-lm head" in out and "seq 64 · target 16" in out


def test_qlora_t5_keeps_its_fp32_modules_unquantised():
    # transformers' bitsandbytes quantizer leaves a model's _keep_in_fp32_modules unconverted (quantizers/base.py
    # get_modules_to_not_convert): T5's `wo`, whose forward casts its input to wo's weight dtype (modeling_t5.py
    # T5DenseGatedActDense.forward); every other Linear of the blocks is 4-bit
    pytest.importorskip("bitsandbytes")
    from trainfit.models.resolve import load_model
    from trainfit.setup import Setup
    from trainfit.step import build_model

    setup = Setup(batch=1, seq=16, target_seq=8, precision="bf16", quant="nf4", lora_rank=4, device="cpu")
    model = build_model(load_model("tiny-t5"), setup)
    # (peft wraps each with its adapter class for the base layer's kind: lora.Linear or lora.bnb.Linear4bit)
    kinds = {name.rsplit(".", 1)[-1]: type(m).__name__ for name, m in model.named_modules()
             if name.endswith((".wo", ".wi_0", ".q"))}
    assert kinds["wo"] == "Linear" and kinds["wi_0"] == kinds["q"] == "Linear4bit", kinds


def test_fp16_t5_keeps_wo_in_fp32():
    # from_pretrained in fp16 keeps _keep_in_fp32_modules in fp32 (transformers modeling_utils.py _get_dtype_plan):
    # T5's wo, d_ff x d_model per block (tiny-t5: 128 x 64, 2 encoder + 3 decoder blocks); the rest fp16
    from trainfit.models.resolve import load_model
    from trainfit.setup import Setup
    from trainfit.step import build_model

    model = build_model(load_model("tiny-t5"), Setup(batch=1, seq=16, target_seq=8, precision="fp16", mode="infer",
                                                     device="cpu"))
    fp32 = sum(p.numel() for p in model.parameters() if p.dtype.itemsize == 4)
    assert fp32 == (2 + 3) * 128 * 64


def test_t5_inference_is_timed_on_a_gpu(capsys):
    # the op list lists T5's kernels (analytic/ops/encoder_decoder.py): --gpu times generate()'s prefill and a decode
    # step kernel by kernel; fp16 and quantised weights (wo kept in fp32 by transformers) are refused in one line
    import json

    main(["estimate", "flan-t5-base", "--mode", "infer", "--seq", "512", "--target-seq", "64", "--gpu", "H100-80GB",
          "--json"])
    out = json.loads(capsys.readouterr().out)
    assert out["time"]["prefill_seconds"] > 0 and out["time"]["decode_tokens_per_second"] > 0
    assert 0 < out["detail"]["decode"]["kernels"] < out["detail"]["prefill"]["kernels"]
    for precision in ("fp16", "int4"):
        assert "_keep_in_fp32_modules" in _refused(["estimate", "flan-t5-base", "--mode", "infer", "--precision",
                                                    precision, "--gpu", "H100-80GB"], capsys)


def test_analytic_training_estimate_of_a_t5_answers(capsys):
    # the analytic engine models T5's training memory (analytic/encoder_decoder_training.py): an estimate without --gpu
    main(["estimate", "t5-base", "--mode", "train", "--seq", "512", "--target-seq", "128", "--recompute", "full"])
    out = capsys.readouterr().out
    assert "analytic engine" in out and "seq2seq-lm head" in out and "peak" in out


def test_analytic_training_estimate_of_a_bart_answers(capsys):
    # BART's and Whisper's training memory too (analytic/encdec_absolute_training.py): an estimate without --gpu
    main(["estimate", "bart-base", "--mode", "train", "--seq", "512", "--target-seq", "128"])
    out = capsys.readouterr().out
    assert "analytic engine" in out and "seq2seq-lm head" in out and "peak" in out
