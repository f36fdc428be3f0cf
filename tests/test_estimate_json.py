"""Estimate.to_dict(): the one --json writer. One estimate of each mode round-trips through the JSON text with the
documented keys; Estimate.detail's typed fields come out flat beside the engine's records, as the detail dict did."""
from __future__ import annotations

import dataclasses
import json

import pytest

from trainfit import api
from trainfit.estimate import Detail, RLStep, Serving, StepTime
from trainfit.report.json_out import dumps

TOP = {"engine", "model", "mode", "params", "params_per_rank", "setup", "memory", "flops", "notes", "detail"}
CASES = {  # mode -> (request, the keys it adds at the top, the typed Detail fields it sets)
    "train": (dict(model="llama-3.2-1b", optimizer="paged-adamw", batch=8, lora_rank=16, gpu="L4"),
              {"stack", "time", "fit"},
              {"params_active", "params_trainable", "head", "host_memory", "paged_optimizer_states", "step_time"}),
    "infer": (dict(model="llama-3.1-8b", mode="infer", batch=4, seq=4096, precision="bf16", gpu="L4"),
              {"time", "fit"}, {"params_active", "kv_bytes_per_token", "prefill", "decode"}),
    "serve": (dict(model="llama-3.1-8b", mode="serve", server="sglang", draft_model="llama-3.2-1b",
                   gpu="H100-80GB"), {"serving", "time"}, {"params_active", "serving"}),
    "rl": (dict(model="qwen2.5-1.5b", mode="rl", batch=2, rollout="vllm", beta=0.04, gpu="H100-80GB"),
           {"rl", "time", "fit"}, {"params_active", "rl"}),
    "vision": (dict(model="convnext-tiny", batch=32, gpu="A100-80GB"), {"stack", "time", "fit"},
               {"image_size", "num_labels", "step_time"}),
}


def _json(e) -> dict:
    return json.loads(dumps(e.to_dict()))


def _names(cls, *but) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)} - set(but)


@pytest.mark.parametrize("case", CASES)
def test_each_mode_round_trips_with_the_documented_keys(case):
    req, extra, typed = CASES[case]
    e = api.analytic(api.Request(**req))
    d = _json(e)
    assert set(d) == TOP | extra
    assert d["mode"] == e.setup.mode and d["memory"]["host_memory"] == (e.detail.host_memory or 0)
    assert set(d["detail"]) == typed | set(e.detail.records)
    for name in typed:  # each typed field as it was set, nested dataclasses as objects
        v = getattr(e.detail, name)
        assert d["detail"][name] == json.loads(dumps(v.as_dict() if hasattr(v, "as_dict") else v))
    if "step_time" in typed:
        assert set(d["detail"]["step_time"]) == _names(StepTime)
    if case == "serve":
        sv = e.detail.serving
        assert d["serving"] == d["detail"]["serving"]
        assert set(d["serving"]) == _names(Serving, "knobs") | set(sv.knobs)
        assert {"mem_fraction_static", "context_length", "speculative_algorithm", "draft_model"} <= set(sv.knobs)
    if case == "rl":
        assert d["rl"] == d["detail"]["rl"]
        assert set(d["rl"]) == _names(RLStep, "rollout_records") | set(e.detail.rl.rollout_records)
        assert set(d["rl"]["serving"]) == _names(Serving, "knobs") | set(e.detail.rl.serving.knobs)
        assert d["rl"]["kv_tokens_needed"] == 16 * 1024


def test_a_trace_estimate_round_trips_its_records():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    e = api.trace(api.Request(model="tiny-llama", batch=2, seq=64))
    d = _json(e)
    assert set(d) == TOP | {"stack"} and d["engine"] == "trace"
    assert set(d["detail"]) == set(e.detail.records)
    assert {"timeline", "top_tensors", "activations_by_module", "baseline", "trace_seconds"} <= set(d["detail"])


def test_the_detail_type_serialises_what_is_set():
    assert Detail().as_dict() == {}
    d = Detail(params_active=7, host_memory=0, records={"stage": 0})
    assert d.as_dict() == {"params_active": 7, "host_memory": 0, "stage": 0}
    assert d.with_records(rank=1).records == {"stage": 0, "rank": 1} and d.records == {"stage": 0}
    with pytest.raises(ValueError, match="host_memory"):
        Detail(records={"host_memory": 1})
