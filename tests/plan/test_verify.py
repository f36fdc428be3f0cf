"""`trainfit plan --verify`: the top plans' peaks checked by the trace engine through trainfit.engines, as
`trainfit estimate --engine trace` runs it: a ZeRO plan (dp > 1) is traced as one rank of the sharded step on a
fake process group, a tp/pp plan is skipped with the engine's own one-line reason."""
from __future__ import annotations

import importlib.util
import json

import pytest

from trainfit import api
from trainfit.plan.search import PlanQuery, search
from trainfit.plan.verify import verify

HAS_TORCH = importlib.util.find_spec("torch") is not None and importlib.util.find_spec("transformers") is not None
SMALL = ("--gpu", "T4", "--gpus", "2", "--seq", "64", "--global-batch-tokens", "256", "--precision", "amp-bf16",
         "--top", "1")


@pytest.mark.skipif(not HAS_TORCH, reason="the trace engine needs torch and transformers")
def test_a_zero3_plan_is_traced_one_sharded_rank(cli):
    code, out, err = cli("plan", "tiny-llama", *SMALL, "--dp", "2", "--zero", "3", "--verify", "--json")
    assert code == 0, err
    (c,) = json.loads(out)["candidates"]
    assert (c["setup"]["dp"], c["setup"]["zero"]) == (2, 3)
    v = c["verify"]
    assert "skipped" not in v, v
    # the trace of rank 0 of the FSDP2 step (trace/distributed.py) and the analytic ZeRO-3 peak: DESIGN.md §5's 1 %
    assert v["trace_peak"] > 0 and abs(v["gap"]) < 0.01, v


@pytest.mark.skipif(not HAS_TORCH, reason="the trace engine needs torch and transformers")
def test_a_tensor_parallel_plan_gets_the_engines_reason():
    spec = api.token_model("tiny-llama", "plan")
    r = search(spec, api.load_gpu("T4"), PlanQuery(gpus=2, seq=64, global_batch_tokens=256, precisions=("amp-bf16",),
                                                   tp=2, top=1))
    (v,), note = verify(spec, r.candidates)
    assert note is None and r.candidates[0].setup.tp == 2
    assert v == {"skipped": "trace engine: the trace engine runs one process and does not split layers: --tp/--pp "
                            "are analytic only (use --engine analytic); --dp/--zero are traced one rank at a time"}


def test_without_the_trace_engine_one_note(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "transformers" else real(name, *a))
    assert verify(api.token_model("tiny-llama", "plan"), []) == (
        [], "--verify skipped: the trace engine needs torch and transformers (transformers is missing): "
            "pip install 'trainfit[torch]'")
