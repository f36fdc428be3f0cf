"""DeepSpeed's zero_optimization.overlap_comm (--overlap-comm at ZeRO-1/2; ZeRO-3's default): without it the
gradient reduction runs on the backward's own stream (DeepSpeed 0.19.8 stage_1_and_2.py:1590-1614) and the step
waits for it; with it the reduction stream runs it beside the backward and a second reduce bucket is allocated
(:3273-3278). Checked against DeepSpeed's own default bucket size and the byte counts of the collectives."""
from __future__ import annotations

import json

import pytest

import trainfit
from trainfit.errors import SetupError

RUN = dict(gpu="H100-80GB", stack="deepspeed", dp=8, zero=2, batch=4, seq=4096, grad_accum=4)


def _estimate(**kw):
    return trainfit.estimate("llama-3.1-8b", **{**RUN, **kw})


def test_the_second_bucket_is_deepspeeds_default_reduce_bucket_in_bf16():
    """DeepSpeed's own default reduce_bucket_size (its pydantic config, read from the installed package) × 2 bytes
    (bf16 gradients: grad_accum_dtype defaults to the model's, engine.py:1806-1807) is the reserved difference."""
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    bucket = DeepSpeedZeroConfig().reduce_bucket_size
    off, on = _estimate().memory, _estimate(overlap_comm=True).memory
    assert on.peak - off.peak == pytest.approx(bucket * 2, rel=1e-6)


def test_the_hidden_reduction_is_what_the_step_saves():
    """ZeRO-2 reduce-scatters every micro-batch's bf16 gradients (m of them) and all-gathers the bf16 parameters once:
    the same bytes each, so the reductions are m/(m+1) of the collectives' total. Without overlap_comm the step waits
    for all of them; with it they hide behind the backward but for what overlapping costs (the first bucket, the
    HBM traffic they add: overlap.py)."""
    off = _estimate().detail.step_time
    on = _estimate(overlap_comm=True).detail.step_time
    m = RUN["grad_accum"]
    reductions = off.dp_comm_total * m / (m + 1)
    assert 0.67 * reductions < off.step_seconds - on.step_seconds <= 1.01 * reductions


def test_zero_3_overlaps_by_default_and_refuses_the_flag():
    with pytest.raises(SetupError, match="--overlap-comm .* needs --zero 1 or 2"):
        _estimate(zero=3, overlap_comm=True)


def test_a_zero_2_config_with_overlap_comm_is_read_and_a_zero_3_one_without_is_named(tmp_path):
    from trainfit.readers import read

    cfg = {"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": True},
           "zero_optimization": {"stage": 2, "overlap_comm": True}}
    f = tmp_path / "ds2.json"
    f.write_text(json.dumps(cfg))
    r = read(f)
    assert r.values["overlap_comm"] is True and not any("overlap_comm" in x for x in r.not_modelled)
    cfg["zero_optimization"] = {"stage": 3, "overlap_comm": False}
    f.write_text(json.dumps(cfg))
    r = read(f)
    assert "overlap_comm" not in r.values
    assert any("overlap_comm" in x and "more time" in x for x in r.not_modelled)
