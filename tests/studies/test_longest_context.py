"""`trainfit fit --longest-context` (studies/longest_context.py): the length it answers fits the GPU by a direct
estimate and one token more does not, for the setup as given and for each technique; the JSON lists them longest
first after the setup as given."""
from __future__ import annotations

import json

import pytest

from trainfit import api
from trainfit.cli.app import main
from trainfit.engines import analytic
from trainfit.models.resolve import load_model
from trainfit.setup import Setup
from trainfit.studies.longest_context import longest_context

QLORA = dict(lora_rank=32, quant="nf4", precision="bf16", recompute="full", attention="flash2")


def _fits(spec, setup, gpu) -> bool:
    return analytic(spec, setup, gpu).fit.fits


def test_found_length_fits_and_one_more_token_does_not():
    spec, gpu = load_model("llama-3.1-8b"), api.load_gpu("A100-80GB", memory=24)
    found = longest_context(spec, Setup(**QLORA), gpu)
    assert found[0].flags == "" and found[0].seq > 0
    for x in found:
        assert _fits(spec, x.setup, gpu), x.flags
        assert not _fits(spec, x.setup.with_(seq=x.seq + 1), gpu), x.flags
    assert [x.seq for x in found[1:]] == sorted((x.seq for x in found[1:]), reverse=True)
    assert all(x.seq > found[0].seq for x in found[1:])
    # --liger: Liger's fused linear cross-entropy never holds the whole logits (and its RMSNorm/SwiGLU save less), so
    # the 128k-vocabulary loss stops dominating: a longer context than as given (checked by direct estimates above)
    liger = next(x for x in found if x.flags == "--liger")
    assert liger.setup.liger and liger.seq > found[0].seq


@pytest.mark.heavy  # ~1.5 s: three Ulysses degrees' bisections
def test_ulysses_lengthens_the_context_with_more_gpus():
    # DeepSpeed-Ulysses splits each sequence over n data-parallel ranks (dp × n GPUs): every per-token activation and
    # the logits per rank shrink by n, so the longest context grows with n; each length fits by a direct estimate
    spec, gpu = load_model("llama-3.2-1b"), api.load_gpu("H100-80GB")
    setup = Setup(stack="deepspeed", precision="bf16-master", recompute="full", zero=3, dp=2)
    found = longest_context(spec, setup, gpu)
    uly = sorted((x for x in found if "--ulysses" in x.flags), key=lambda x: x.setup.ulysses)
    assert [x.setup.ulysses for x in uly] == [2, 4, 8] and [x.gpus for x in uly] == [4, 8, 16]
    assert found[0].seq < uly[0].seq < uly[1].seq < uly[2].seq
    for x in uly:
        assert _fits(spec, x.setup, gpu) and not _fits(spec, x.setup.with_(seq=x.seq + x.setup.ulysses), gpu), x.flags


def test_nothing_fits_answers_zero_and_how_far_the_shortest_length_is():
    """The none-fits row says what one token's step needs against the capacity (its JSON had required 0, capacity
    0 and step 0.0 there: read as measured zeros); no step time."""
    spec, gpu = load_model("llama-3.1-8b"), api.load_gpu("A100-80GB", memory=4)
    row = longest_context(spec, Setup(**QLORA), gpu)[0]
    assert row.seq == 0 and row.step_seconds is None and row.judged_seq == 1
    e = analytic(spec, Setup(**QLORA).with_(seq=1), gpu)
    assert (row.required, row.capacity) == (e.fit.required, e.fit.capacity) and row.required > row.capacity


def test_cli_json_names_the_technique_that_extends_it_most(capsys):
    main(["fit", "llama-3.1-8b", "--gpu", "A100-80GB", "--gpu-memory", "24", "--lora-rank", "32", "--quant", "nf4",
          "--precision", "bf16", "--recompute", "full", "--longest-context", "--json"])
    rows = json.loads(capsys.readouterr().out)["longest_context"]
    assert rows[0]["flags"] == "" and len(rows) > 1 and rows[1]["seq"] == max(r["seq"] for r in rows)
    assert f"--seq {rows[1]['seq']}" in rows[1]["command"]


def test_context_parallel_lengths_are_multiples_of_the_split():
    # Megatron's context parallelism takes sequences in multiples of 2·cp (shorter granules are refused, not out of
    # memory): the answer is the longest such multiple that fits, the next one does not
    from trainfit.studies.fit_advice import _Judge
    from trainfit.studies.longest_context import longest_seq

    spec, gpu = load_model("llama-3.2-1b"), api.load_gpu("H100-80GB")
    setup = Setup(stack="megatron", precision="bf16-master", recompute="full")
    q = longest_seq(_Judge(spec, setup, gpu, 0.0), cp=2)
    assert q % 4 == 0 and q > 0
    assert _fits(spec, setup.with_(seq=q, cp=2), gpu) and not _fits(spec, setup.with_(seq=q + 4, cp=2), gpu)
