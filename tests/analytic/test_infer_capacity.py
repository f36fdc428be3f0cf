"""Inference's "largest batch" and "longest context" are the fit verdict's own boundary: an estimate at the reported
value fits and one step past it does not (the verdict, fit_rule.py, judges each), and the context stops at the
model's max_position_embeddings (from its HF config.json, written below from the model card, not read from
trainfit)."""
import pytest

import trainfit


def _fits(model: str, gpu: str, **kw) -> bool:
    return trainfit.estimate(model, mode="infer", gpu=gpu, **kw).fit.fits


@pytest.mark.parametrize("model, gpu, kw", [
    ("llama-3.1-8b", "L4", {"batch": 16, "seq": 8192, "precision": "bf16"}),  # the README's L4 example
    ("llama-3.1-8b", "L4", {}),
    ("qwen2.5-7b", "A100-40GB", {"seq": 4096}),
])
def test_largest_batch_and_longest_context_are_the_verdicts_boundary(model, gpu, kw):
    t = trainfit.estimate(model, mode="infer", gpu=gpu, **kw).time
    seq = t.max_seq
    assert t.max_batch >= 1 and seq >= 1
    at = {k: v for k, v in kw.items() if k != "batch"}
    assert _fits(model, gpu, **at, batch=t.max_batch) and not _fits(model, gpu, **at, batch=t.max_batch + 1)
    at = {k: v for k, v in kw.items() if k != "seq"}
    assert _fits(model, gpu, **at, seq=seq) and not _fits(model, gpu, **at, seq=seq + 1)


# max_position_embeddings: meta-llama/Llama-3.1-8B config.json 131072 (rotary), openai-community/gpt2 n_positions 1024
# (learned); a causal decode step writes position --seq, so the longest prompt is one less
@pytest.mark.parametrize("model, positions", [("llama-3.1-8b", 131072), ("gpt2-small", 1024)])
def test_longest_context_stops_at_the_models_positions(model, positions):
    t = trainfit.estimate(model, mode="infer", gpu="H200").time  # memory allows more than the positions
    assert t.max_seq == positions - 1
