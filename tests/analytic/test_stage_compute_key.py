"""The op lists' time memo (compute_time.cached_stage_compute) keys on the spec and the setup themselves: a model
fact the lists read (here GPT-2's dropouts, which add the dropout kernels) is a spec field, so two specs that differ
in it never share an entry. Fast (no torch)."""
from __future__ import annotations

from dataclasses import replace

from trainfit.analytic import compute_time
from trainfit.analytic.params import count_params
from trainfit.analytic.precision import state_bytes
from trainfit.api import load_spec
from trainfit.hardware import get_gpu
from trainfit.setup import Setup


def test_the_spec_identity_covers_its_kernel_facts():
    spec = load_spec("gpt2")
    quiet = replace(spec, dropouts=(0.0, 0.0, 0.0))
    assert spec.dropouts == (0.1, 0.1, 0.1)  # GPT2Config's defaults (configuration_gpt2.py:84-86)
    assert quiet != spec and replace(quiet) == quiet and hash(replace(quiet)) == hash(quiet)
    s, gpu = Setup(seq=1024, batch=4), get_gpu("H100-80GB")
    st, pc, layers = state_bytes(s), count_params(spec), (spec.layers,) * 3
    compute_time._CACHE.clear()
    a = compute_time.cached_stage_compute(spec, s, gpu, st, pc, layers)
    b = compute_time.cached_stage_compute(quiet, s, gpu, st, pc, layers)
    assert b.total.kernels < a.total.kernels  # no dropout kernels: not the first entry read back
    assert b == compute_time.stage_compute(quiet, s, gpu, st, pc, layers)
