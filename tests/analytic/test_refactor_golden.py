"""Golden numbers of the analytic engine's memory, recorded from the code before the memory.py split.

A refactor guard: `python tests/analytic/test_refactor_golden.py --record` writes refactor_golden.json from the
current code; the test asserts every memory field is unchanged.
"""
import json
import sys
from pathlib import Path

import pytest

from trainfit.analytic.engine import estimate
from trainfit.models.resolve import load_model
from trainfit.setup import Setup

GOLDEN = Path(__file__).with_name("refactor_golden.json")

CASES = [
    # (model, setup kwargs)
    ("llama-3.1-8b", dict(batch=1, seq=2048)),
    ("llama-3.1-8b", dict(batch=2, seq=4096, recompute="full")),
    ("llama-3.1-8b", dict(batch=1, seq=4096, recompute="selective", attention="eager")),
    ("llama-3.1-8b", dict(batch=1, seq=2048, dp=8, zero=1)),
    ("llama-3.1-8b", dict(batch=1, seq=2048, dp=8, zero=2)),
    ("llama-3.1-8b", dict(batch=1, seq=2048, dp=8, zero=3)),
    ("llama-3.1-8b", dict(batch=1, seq=2048, dp=8, zero=3, device="cpu")),
    ("llama-3.1-8b", dict(batch=1, seq=2048, dp=4, zero=2, device="cpu", precision="bf16")),
    ("llama-3.1-8b", dict(batch=1, seq=2048, dp=4, zero=0, grad_accum=4)),
    ("llama-3.1-70b", dict(batch=1, seq=4096, tp=8)),
    ("llama-3.1-70b", dict(batch=1, seq=4096, tp=8, sequence_parallel=True, recompute="selective")),
    ("llama-3.1-70b", dict(batch=1, seq=4096, tp=8, pp=4, grad_accum=8, precision="bf16-master")),
    ("llama-3.1-70b", dict(batch=1, seq=4096, tp=4, pp=8, grad_accum=12, dp=4, zero=1, recompute="full")),
    ("llama-3.1-405b", dict(batch=1, seq=8192, tp=8, pp=9, grad_accum=18, sequence_parallel=True, precision="bf16-master", recompute="full")),
    ("llama-2-7b", dict(batch=4, seq=1024, precision="fp32", optimizer="sgd")),
    ("llama-2-7b", dict(batch=4, seq=1024, precision="amp-fp16", optimizer="adafactor")),
    ("llama-2-7b", dict(batch=4, seq=1024, precision="bf16", optimizer="lion", device="cpu")),
    ("llama-2-7b", dict(batch=4, seq=1024, precision="bf16", optimizer="adamw-8bit")),
    ("llama-2-7b", dict(batch=4, seq=1024, precision="amp-bf16", optimizer="momentum", tp=2, dp=2, zero=3)),
    ("gpt2", dict(batch=8, seq=1024, device="cpu")),
    ("gpt2", dict(batch=8, seq=1024, precision="fp32", attention="eager")),
    ("gpt2-xl", dict(batch=2, seq=1024, recompute="full", precision="bf16")),
    ("gpt-3-175b", dict(batch=1, seq=2048, tp=8, pp=8, grad_accum=16, sequence_parallel=True, recompute="selective")),
    ("bert-base", dict(batch=16, seq=512, device="cpu", precision="fp32")),
    ("bert-large", dict(batch=8, seq=512, precision="amp-bf16", recompute="full")),
    ("roberta-base", dict(batch=16, seq=512, precision="bf16")),
    ("gemma-2-9b", dict(batch=1, seq=4096)),
    ("gemma-2-2b", dict(batch=2, seq=2048, precision="bf16", recompute="full", device="cpu")),
    ("gemma-7b", dict(batch=1, seq=4096, dp=8, zero=3)),
    ("mixtral-8x7b", dict(batch=1, seq=4096, tp=8, dp=4, zero=1)),
    ("mixtral-8x7b", dict(batch=1, seq=4096, tp=2, pp=4, grad_accum=8, recompute="full")),
    ("qwen1.5-moe-a2.7b", dict(batch=2, seq=2048)),
    ("qwen3-30b-a3b", dict(batch=1, seq=4096, dp=8, zero=2, precision="bf16-master")),
    ("qwen3-8b", dict(batch=2, seq=2048, recompute="selective", device="cpu")),
    ("qwen2.5-7b", dict(batch=1, seq=8192, tp=4, sequence_parallel=True)),
    ("mistral-7b", dict(batch=1, seq=4096, precision="amp-fp16", attention="sdpa")),
    ("phi-3-mini", dict(batch=2, seq=4096, recompute="full", dp=2, zero=3, device="cpu")),
    ("pythia-1b", dict(batch=8, seq=2048, precision="fp32", optimizer="adam")),
    ("opt-350m", dict(batch=8, seq=2048, device="cpu")),
    ("opt-1.3b", dict(batch=4, seq=2048, recompute="full", precision="bf16-master", dp=2, zero=2)),
    # inference
    ("llama-3.1-8b", dict(batch=4, seq=4096, mode="infer", precision="bf16")),
    ("llama-3.1-70b", dict(batch=8, seq=8192, mode="infer", precision="int4", tp=4)),
    ("gpt2", dict(batch=4, seq=1000, mode="infer", precision="amp-bf16", attention="eager")),
    ("bert-base", dict(batch=4, seq=512, mode="infer", precision="fp32")),
    ("mixtral-8x7b", dict(batch=2, seq=4096, mode="infer", precision="fp16", tp=2, pp=2)),
]


def _key(name, kw):
    return name + " " + json.dumps(kw, sort_keys=True)


def _fields(name, kw):
    m = estimate(load_model(name), Setup(**kw)).memory
    return {"weights": m.weights, "gradients": m.gradients, "optimizer_states": m.optimizer_states,
            "master_weights": m.master_weights, "activations": m.activations, "temporaries": m.temporaries,
            "kv_cache": m.kv_cache, "peak": m.peak, "peak_phase": m.peak_phase, "phases": m.phases,
            "at_peak": m.at_peak}


@pytest.mark.parametrize("name,kw", CASES, ids=[_key(n, k) for n, k in CASES])
def test_memory_unchanged_by_the_refactor(name, kw):
    golden = json.loads(GOLDEN.read_text())
    assert _fields(name, kw) == golden[_key(name, kw)]


if __name__ == "__main__" and "--record" in sys.argv:
    GOLDEN.write_text(json.dumps({_key(n, k): _fields(n, k) for n, k in CASES}, indent=1, sort_keys=True))
