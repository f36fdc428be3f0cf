"""Reserved is never below required (overheads.device_memory): a run the caching allocator does not limit caches at
least what a limited run cannot release (fit_rule.required: the allocated peak, the pinned freed block, the live
parameters' segment slack). The analytic reserved leaves the segment slack out, and read below required on 48 of 440
catalog setups (bert-base seq-cls at batch 32 x 512: 7.66 against 7.67 GiB). The H200 runs this moves
(bench/results/figures/cuda_truth_replay.json) read closer: analytic reserved median |error| 2.75 % -> 2.42 %."""
import pytest

from trainfit.analytic.engine import estimate
from trainfit.hardware import get_gpu
from trainfit.models.resolve import load_model
from trainfit.overheads import allocator_held
from trainfit.setup import Setup

CASES = [("bert-base", dict(head="seq-cls", batch=32, seq=512)),  # training, a small step
         ("gpt2-large", dict(batch=4, seq=512, precision="bf16")),  # training, pure bf16
         ("qwen2.5-0.5b", dict(batch=8, seq=2048)),
         ("gemma-3-1b", dict(batch=2, seq=1024, mode="infer")),  # inference
         ("flan-t5-large", dict(batch=1, seq=512))]  # an encoder-decoder


@pytest.mark.parametrize("model,kw", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("gpu", [None, "H100-80GB"])
def test_reserved_holds_what_the_fit_requires(model, kw, gpu):
    setup = Setup(device="cuda", **kw)
    g = get_gpu(gpu) if gpu else None
    m = estimate(load_model(model), setup, gpu=g).memory
    held = sum(allocator_held(g, setup).values())  # the cuBLAS workspace, in reserved, not in required
    assert m.reserved - held >= m.required > m.peak
