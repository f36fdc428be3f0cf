"""The allocation recorder on real CPU tensors against c10's own allocation records (the profiler)."""
from __future__ import annotations

import warnings

import pytest
import torch

from trainfit.measure.cpu_peak import cpu_peak
from trainfit.trace.analysis import analyse
from trainfit.trace.recorder import AllocationRecorder

PHASES = {"forward": "forward_end", "backward": "backward"}


def _ops(phase):
    phase("forward")
    a = torch.empty(10)
    b = torch.randn(100)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.cat([b, b], out=a)  # the out= kernel resizes a: new block, copy, old block freed
    c = b.to(torch.bfloat16) + a[:100]  # mixed dtypes: the CPU kernel copies c's input to fp32 internally
    v = a.view(20, 10).t()  # a view: no allocation
    del b
    phase("backward")
    d = c * c  # (a Python scalar operand would add an invisible 8-byte wrapped-number tensor)
    del a, c, v
    return d


def test_recorder_peak_equals_allocator_peak():
    real, _ = cpu_peak(_ops, baseline=0)
    rec = AllocationRecorder()
    with rec:
        d = _ops(rec.set_phase)
    an = analyse(rec, 0, PHASES)
    assert an.peak == real.peak
    assert an.phases["forward_end"] == real.phase_peaks["forward"]
    assert an.phases["backward"] == real.phase_peaks["backward"]
    assert rec.total == d.untyped_storage().nbytes() == 4 * 100  # only d is left


def _tied(amp: bool, vocab: int = 1000, hidden: int = 64):
    """A tied embedding: the LM head's and the embedding's gradients meet in autograd's input buffer of the
    weight. With amp the head's partial is the fresh fp32 output of the bf16 cast's backward, which the buffer
    alone holds: torch/csrc/autograd/input_buffer.cpp `accumulate` adds the embedding's partial into it in place.
    In fp32 the head's partial is a view (of the matmul's transposed gradient): added out of place."""
    def run(phase):
        phase("forward")
        w = torch.randn(vocab, hidden, requires_grad=True)
        h = torch.nn.functional.embedding(torch.randint(0, vocab, (4,)), w)
        wc = w.to(torch.bfloat16) if amp else w
        loss = torch.nn.functional.linear(h.to(wc.dtype), wc).float().sum()
        phase("backward")
        loss.backward()
        return w
    return run


@pytest.mark.parametrize("amp", [False, True], ids=["fp32-view-partial-summed-out-of-place", "amp-summed-in-place"])
def test_recorder_counts_autograd_gradient_sums_like_the_engine(amp):
    # The recorder is a dispatch mode, under which every tensor is "subclass-like" and the engine always sums out of
    # place (ATen/TensorSubclassLikeUtils.h); the real run (c10's allocation records, no mode) sums in place where
    # the engine can. Before the recorder folded such sums, its amp backward peak read one vocab x hidden fp32 block
    # (256,000 B) over the real one: at llama-3.2-1b's tied 128256 x 2048 weight a 1 GB block, and the replay of the
    # allocator needed a 1 GB segment that the real step never made.
    real, _ = cpu_peak(_tied(amp), baseline=0)
    rec = AllocationRecorder()
    with rec:
        w = _tied(amp)(rec.set_phase)
    an = analyse(rec, 0, PHASES)
    assert an.phases["backward"] == real.phase_peaks["backward"]
    assert an.peak == real.peak
    block = w.untyped_storage().nbytes()
    assert sum(r.death is None and r.nbytes == block for r in rec.records) == 2  # the weight and its gradient
