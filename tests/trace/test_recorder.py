"""The allocation recorder on real CPU tensors against c10's own allocation records (the profiler)."""
from __future__ import annotations

import warnings

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
