"""--doc-len (sequence packing, analytic/packing.py) on --stack hf: the attention core per document, everything
else per token, and the settings' refusals."""
from __future__ import annotations

import pytest

from trainfit.analytic.memory import train_memory
from trainfit.analytic.step_time import layout_step_time
from trainfit.errors import SetupError
from trainfit.hardware import get_gpu
from trainfit.models.resolve import load_model
from trainfit.setup import Setup


def _setup(**kw) -> Setup:
    return Setup(**{**dict(batch=1, seq=8192, stack="hf", attention="flash2", recompute="full", dp=8, zero=3), **kw})


def test_a_packed_row_times_its_attention_as_its_documents():
    """FlashAttention's varlen kernel walks each document's own key blocks: a row of eight 1024-token documents
    runs the attention of a micro-batch of eight 1024-token sequences; the GEMMs and the per-token ops are the
    row's; the memory is the row's (the varlen kernel saves what flash saves, per token)."""
    spec, gpu = load_model("llama-3.1-8b"), get_gpu("h100-sxm")
    packed = layout_step_time(spec, _setup(doc_len=1024), gpu).compute_terms
    docs = layout_step_time(spec, _setup(batch=8, seq=1024), gpu).compute_terms
    row = layout_step_time(spec, _setup(), gpu).compute_terms
    assert packed["attention"] == pytest.approx(docs["attention"], rel=1e-9)
    assert packed["attention"] < row["attention"] / 4  # 8 · 1024² against 8192² pairs
    assert packed["gemm"] == pytest.approx(row["gemm"], rel=1e-12)
    assert train_memory(spec, _setup(doc_len=1024)).peak == train_memory(spec, _setup()).peak


def test_doc_len_of_the_whole_sequence_is_no_packing():
    spec, gpu = load_model("llama-3.1-8b"), get_gpu("h100-sxm")
    assert layout_step_time(spec, _setup(doc_len=8192), gpu) == layout_step_time(spec, _setup(), gpu)


@pytest.mark.parametrize("kw, words", [
    (dict(stack="torchtitan", attention="auto", doc_len=512), "--stack hf only"),
    (dict(attention="flash", doc_len=512), "packed-sequence mask"),
    (dict(doc_len=9000), "longer than --seq"),
])
def test_packing_refusals_say_what_to_do(kw, words):
    with pytest.raises(SetupError, match=words) as e:
        _setup(**kw)
    assert "\n" not in str(e.value)


def test_one_process_engines_refuse_doc_len():
    from trainfit import engines

    spec = load_model("tiny-llama")
    s = Setup(batch=1, seq=128, stack="hf", attention="flash2", doc_len=32)  # (flash2: CUDA only)
    for run in (engines.trace, engines.measure):
        with pytest.raises(SetupError, match="--doc-len"):
            run(spec, s)
