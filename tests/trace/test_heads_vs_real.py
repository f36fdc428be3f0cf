"""Task heads in the trace engine: the traced peak of each head's training step against the real CPU step (truth:
trainfit.measure, c10's allocation records), within 0.5% (DESIGN.md §5), and the vocabulary logits a classifier
drops, traced at bert-base size against a hand derivation."""
from __future__ import annotations

import warnings

import pytest
from trace_configs import tiny_spec  # tests/trace is on sys.path (rootdir-less import)

from trainfit.measure import measure
from trainfit.models.hf_config import spec_from_config
from trainfit.models.resolve import load_model
from trainfit.setup import Setup
from trainfit.trace import trace_spec

warnings.filterwarnings("ignore", message=".*gradient_checkpointing_enable.*")

# (family, head, precision, num_labels); each head keeps a default case, the rest are in the heavy tier
CASES = [
    pytest.param("bert", "masked-lm", "fp32", 2, marks=pytest.mark.heavy),
    pytest.param("bert", "seq-cls", "fp32", 2, marks=pytest.mark.heavy),
    pytest.param("bert", "token-cls", "fp32", 2, marks=pytest.mark.heavy),
    ("bert", "masked-lm", "amp-bf16", 2),
    pytest.param("bert", "seq-cls", "amp-bf16", 5, marks=pytest.mark.heavy),
    pytest.param("bert", "token-cls", "amp-bf16", 9, marks=pytest.mark.heavy),
    ("bert", "seq-cls", "bf16", 1),  # regression: MSELoss on float labels
    ("llama", "seq-cls", "amp-bf16", 3),  # scores every position, gathers the last non-padding one
    pytest.param("llama", "token-cls", "bf16", 2, marks=pytest.mark.heavy),
]


def _spec(family: str, head: str, labels: int):
    spec = tiny_spec(family)
    return spec_from_config(dict(spec.config, num_labels=labels), spec.name, head=head)


@pytest.mark.slow
@pytest.mark.parametrize("family,head,precision,labels", CASES,
                         ids=["-".join(map(str, getattr(c, "values", c))) for c in CASES])
def test_trace_peak_of_each_head_equals_the_real_peak(family, head, precision, labels):
    spec = _spec(family, head, labels)
    setup = Setup(batch=2, seq=64, precision=precision, optimizer="adamw", device="cpu", head=head)
    traced = trace_spec(spec, setup)
    real = measure(spec, setup, steps=0)
    assert abs(traced.memory.peak - real.peak) <= 0.005 * real.peak, (traced.memory.peak, real.peak)
    assert traced.params == real.params


def test_build_and_batches_follow_the_head():
    torch = pytest.importorskip("torch")
    from trainfit.step import build_model, make_batches

    expect = {"masked-lm": ("BertForMaskedLM", (2, 16), torch.long),
              "seq-cls": ("BertForSequenceClassification", (2,), torch.long),
              "token-cls": ("BertForTokenClassification", (2, 16), torch.long)}
    for head, (cls, shape, dtype) in expect.items():
        spec = _spec("bert", head, 4)
        setup = Setup(batch=2, seq=16, precision="fp32", device="cpu", head=head, grad_accum=2)
        model, batches = build_model(spec, setup), make_batches(spec, setup)
        assert type(model).__name__ == cls and len(batches) == 2
        labels = batches[0]["labels"]
        assert tuple(labels.shape) == shape and labels.dtype == dtype
        if head != "masked-lm":
            assert int(labels.max()) < 4 and model.config.num_labels == 4
        loss = model(**batches[0]).loss
        assert torch.isfinite(loss)
    # regression (num_labels 1): float labels in the parameters' dtype
    setup = Setup(batch=2, seq=16, precision="bf16", device="cpu", head="seq-cls")
    assert make_batches(_spec("bert", "seq-cls", 1), setup)[0]["labels"].dtype == torch.bfloat16
    # a decoder's sequence classifier needs a pad token for batch > 1: set when the config has none
    llama = _spec("llama", "seq-cls", 2)
    assert llama.config.get("pad_token_id") is None
    setup = Setup(batch=2, seq=16, precision="fp32", device="cpu", head="seq-cls")
    model = build_model(llama, setup)
    assert type(model).__name__ == "LlamaForSequenceClassification" and model.config.pad_token_id is not None
    assert torch.isfinite(model(**make_batches(llama, setup)[0]).loss)


@pytest.mark.slow
def test_bert_base_classifier_drops_the_vocab_logits_in_the_trace():
    """bert-base at seq 512 (batch 4, amp-bf16, cuda semantics): the traced masked-LM peak less the traced sequence
    classifier's is the vocabulary bytes of the loss (hand derivation in tests/analytic/test_heads.py: 12·T·V for the
    fp32 log-softmax output and the two fp32 gradients at the loss's backward, 2·V·h for the decoder weight's bf16
    autocast copy) within 2%. Two of bert-base's twelve layers: the heads differ after the last layer, so the
    difference does not depend on depth (785,820,672 B at 2 layers and at 12; 12 take ~2x as long to trace)."""
    import dataclasses

    spec = dataclasses.replace(load_model("bert-base"), layers=2)
    peaks = {}
    for head in ("masked-lm", "seq-cls"):
        peaks[head] = trace_spec(spec, Setup(batch=4, seq=512, head=head), flops=False).memory.peak
    tokens, v, h = 4 * 512, 30522, 768
    assert peaks["masked-lm"] - peaks["seq-cls"] == pytest.approx(12 * tokens * v + 2 * v * h, rel=0.02)
