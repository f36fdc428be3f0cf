"""Every catalog model gets an answer, never a traceback (a family the analytic engine does not model yet: its
one-line refusal): its default training estimate on an 80 GB GPU and, when it
does not fit, the what-would-fit search (which visits layouts the default does not: ZeRO-3 ranks, TP, and their
averaged MoE shapes — a fractional tokens-per-expert GEMM once divided by zero)."""
from __future__ import annotations

import pytest

from trainfit import api
from trainfit.analytic.unmodelled import unmodelled_features
from trainfit.errors import SetupError
from trainfit.models.resolve import catalog_names
from trainfit.setup import Request
from trainfit.studies.fit_advice import suggestions


@pytest.mark.parametrize("name", catalog_names())
def test_estimate_and_advice_answer(name):
    req = Request(model=name, gpu="H100-80GB")
    spec = api.load_spec(name)
    # a family the analytic engine refuses, or whose training it refuses (an encoder-decoder's, until its training
    # memory is modelled: encoder_decoder.check_trainable): one line pointing to the trace engine
    if unmodelled_features(spec) or _training_refused(spec, req.setup(spec)):
        with pytest.raises(SetupError, match="use --engine trace"):
            api.analytic(req)
        return
    e = api.analytic(req)
    assert e.time is not None and e.time.step_seconds > 0
    for x in suggestions(spec, req.setup(spec), api.gpu_of(req)):
        assert x.required <= x.capacity and x.step_seconds > 0


def _training_refused(spec, setup) -> bool:
    from trainfit.analytic.encoder_decoder import check_trainable

    try:
        check_trainable(spec, setup)
    except SetupError:
        return True
    return False
