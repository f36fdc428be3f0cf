"""Issue 4, Done-when: `trainfit.measure` on CPU agrees with PyTorch's profiler memory timeline of the same step
within 1%.

The timeline is an independent reconstruction: `torch.profiler`'s memory profiler
(`torch.profiler._memory_profiler.MemoryProfile`, exported by `prof.export_memory_timeline(path.json)`) rebuilds
each tensor's life from the op tree's data flow (tensor identities, versions, sizes from the recorded shapes,
tensors used by the step but allocated before it as PREEXISTING), and coalesces it into per-category sizes per
microsecond. `trainfit.measure` instead adds c10's running allocation counter to a baseline it computes from the
model's, optimizer's and batches' storages — a different code path over different fields.

Both sides run the same standard step from the same seed in steady state (the timeline's step is a fresh
`prepare()` with `torch.manual_seed(0)`, as `measure` does), so their allocations are identical.
"""
from __future__ import annotations

import gc
import json
import warnings

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from trainfit.measure import measure  # noqa: E402
from trainfit.measure.infer import inference_step, prepare_inference  # noqa: E402
from trainfit.models.resolve import load_model  # noqa: E402
from trainfit.setup import Setup  # noqa: E402
from trainfit.step.standard import prepare, run_step  # noqa: E402

TOLERANCE = 0.01


def timeline_peak(run, tmp_path) -> tuple[int, int]:
    """(peak, start) of the total over categories in the profiler's exported memory timeline (CPU)."""
    from torch.profiler import ProfilerActivity, profile

    gc.collect()
    gc.disable()
    try:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                     with_stack=True) as prof:
            run()
    finally:
        gc.enable()
    path = tmp_path / "timeline.json"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # export_memory_timeline is deprecated, not gone
        prof.export_memory_timeline(str(path), device="cpu")
    times, sizes = json.loads(path.read_text())
    totals = [sum(s) for s in sizes]
    assert len(times) == len(totals) > 10
    return max(totals), totals[0]


@pytest.mark.parametrize("name,kw", [
    ("tiny-llama", dict(precision="fp32", optimizer="adamw")),
    pytest.param("tiny-gpt2", dict(precision="amp-bf16", optimizer="adamw", recompute="full", grad_accum=2),
                 marks=pytest.mark.heavy),  # ~20 s under the profiler's timeline
])
def test_training_step_agrees_with_profiler_timeline(name, kw, tmp_path):
    spec = load_model(name)
    setup = Setup(batch=2, seq=64, device="cpu", **kw)
    ours = measure(spec, setup, steps=0)

    torch.manual_seed(0)  # as measure() does
    model, optimizer, batches = prepare(spec, setup)
    peak, start = timeline_peak(lambda: run_step(model, optimizer, batches, setup), tmp_path)
    assert abs(peak - ours.peak) <= TOLERANCE * ours.peak, (peak, ours.peak)
    # the tensors alive before the step (the timeline's PREEXISTING) are our baseline
    assert abs(start - ours.baseline) <= TOLERANCE * ours.baseline, (start, ours.baseline)


@pytest.mark.heavy  # ~5 s: the training step's profiler check stays in the default run
def test_inference_agrees_with_profiler_timeline(tmp_path):
    spec = load_model("tiny-llama")
    setup = Setup(batch=2, seq=128, precision="bf16", device="cpu", mode="infer")
    ours = measure(spec, setup, steps=0)

    torch.manual_seed(0)
    model, ids, _ = prepare_inference(spec, setup)  # (no image inputs: a text model)
    inference_step(model, ids, setup)  # warm-up, as measure_inference does
    peak, _ = timeline_peak(lambda: inference_step(model, ids, setup), tmp_path)
    assert abs(peak - ours.peak) <= TOLERANCE * ours.peak, (peak, ours.peak)
