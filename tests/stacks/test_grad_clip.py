"""Gradient clipping before the optimizer step (stacks/*.toml [grad_clip], --max-grad-norm), checked against
independent sources:
  * the installed transformers and torchtitan's own defaults (TrainingArguments.max_grad_norm, training.max_norm);
  * the gradients the real CPU step hands optimizer.step(), read by a step pre-hook and compared with torch's own
    vector norm of the unclipped step's gradients;
  * the clip's bytes counted by hand (each gradient read for the norm, read and written for the scale) at the H200's
    catalog bandwidth.
"""
from __future__ import annotations

import copy
import math

import pytest
import torch

from trainfit.setup import Setup

pytest.importorskip("transformers")


def test_the_defaults_are_the_stacks_own():
    import dataclasses

    from transformers import TrainingArguments

    hf = next(f.default for f in dataclasses.fields(TrainingArguments) if f.name == "max_grad_norm")
    assert Setup().grad_clip_norm == hf == 1.0
    assert Setup(mode="rl").grad_clip_norm == 1.0  # GRPOTrainer runs the Trainer's loop
    assert Setup(max_grad_norm=0).grad_clip_norm == 0.0 and Setup(max_grad_norm=0.5).grad_clip_norm == 0.5
    assert Setup(optimizer_in_backward=True).grad_clip_norm == 0.0  # torchtune: no clipping in backward
    assert Setup(mode="infer").grad_clip_norm == 0.0
    assert Setup(stack="megatron", precision="bf16-master").grad_clip_norm == 0.0  # not modelled
    try:
        from torchtitan.config.job_config import Training
    except Exception:  # pragma: no cover - torchtitan is optional
        return
    assert Setup(stack="torchtitan").grad_clip_norm == Training().max_norm == 1.0


def _norm(grads) -> float:
    """The gradients' total L2 norm, summed in float64 (an fp32 norm over millions of elements is off by ~1e-4)."""
    return math.sqrt(sum(g.double().pow(2).sum().item() for g in grads))


def _grads_at_step(model, setup, batches):
    """Run trainfit's hf step on a copy of `model`; return (the gradients optimizer.step() saw, the parameters
    after it)."""
    from trainfit.step import make_optimizer, stack_step

    model = copy.deepcopy(model)
    optimizer = make_optimizer(model, setup)
    seen = []
    optimizer.register_step_pre_hook(
        lambda opt, args, kwargs: seen.append([p.grad.detach().clone() for p in model.parameters()]))
    stack_step(setup).run_step(model, optimizer, batches, setup)
    (grads,) = seen  # one optimizer step for two micro-batches
    return grads, [p.detach().clone() for p in model.parameters()]


def test_the_hf_step_clips_the_accumulated_gradients_once_before_the_optimizer_step():
    """tiny-llama, two micro-batches, plain SGD (p -= lr * g): with max_grad_norm far below the gradients' norm,
    optimizer.step() sees the accumulated gradients scaled to that norm (not each micro-batch's: their sum would
    then be neither that long nor parallel to the unclipped gradients), and the parameters move by lr times them."""
    from trainfit.models.resolve import load_model
    from trainfit.step.build import build_model, make_batches
    from trainfit.step.standard import LR

    spec = load_model("tiny-llama")
    base = Setup(batch=1, seq=16, grad_accum=2, precision="fp32", optimizer="sgd", optimizer_impl="for-loop",
                 device="cpu", max_grad_norm=0)
    torch.manual_seed(0)
    model = build_model(spec, base)
    batches = make_batches(spec, base)
    before = [p.detach().clone() for p in model.parameters()]

    free, _ = _grads_at_step(model, base, batches)
    norm = _norm(free)
    max_norm = 1e-3
    assert norm > 100 * max_norm
    clipped, after = _grads_at_step(model, base.with_(max_grad_norm=max_norm), batches)
    assert _norm(clipped) == pytest.approx(max_norm, rel=1e-5)
    for c, g in zip(clipped, free):
        torch.testing.assert_close(c, g * (max_norm / norm), rtol=1e-4, atol=1e-12)
    for a, b, c in zip(after, before, clipped):
        torch.testing.assert_close(a, b - LR * c)
    # the default (the Trainer's 1.0) clips too: the norm here is above 1
    assert norm > 1.0
    default, _ = _grads_at_step(model, base.with_(max_grad_norm=None), batches)
    assert _norm(default) == pytest.approx(1.0, rel=1e-5)


def test_the_torchtitan_step_clips_to_max_grad_norm():
    pytest.importorskip("torchtitan")
    from trainfit.models.hf_config import spec_from_config
    from trainfit.step import stack_step

    spec = spec_from_config({"model_type": "llama", "hidden_size": 64, "intermediate_size": 172,
                             "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                             "vocab_size": 512, "max_position_embeddings": 64}, "tt-clip")
    setup = Setup(stack="torchtitan", batch=1, seq=32, precision="fp32", device="cpu", max_grad_norm=1e-3)
    step = stack_step(setup)
    model, optimizer, batches = step.prepare(spec, setup)
    seen = []
    optimizer.register_step_pre_hook(
        lambda opt, args, kwargs: seen.append(_norm(p.grad for p in model.parameters() if p.grad is not None)))
    step.run_step(model, optimizer, batches, setup)
    assert seen == [pytest.approx(1e-3, rel=1e-5)]


def test_the_analytic_optimizer_time_adds_the_clip_passes():
    """llama-3.2-1b, amp-bf16 on an H200: fp32 gradients, 4 bytes each, read once by the norm and read and written
    once by the scale, at the catalog's HBM bandwidth times the fractions its multi_tensor_apply kernels reach
    (kernels.toml hbm_fraction, access mta32); each pass launches a kernel per 320 chunks of 65,536 elements, 3 µs
    each, and the total norm and the coefficient take 8 small kernels (foreach_norm's zeroed partials and cleanup,
    stack, vector_norm, + eps, reciprocal, mul, clamp: compute_time.CLIP_SCALAR_KERNELS). The last launch of each
    pass holds too few chunks to stream and takes analytic/multi_tensor.py's latency floor instead: a few µs over
    the 4.7 ms (within 0.2 %)."""
    from trainfit.analytic.engine import estimate
    from trainfit.analytic.roofline import kernels_for
    from trainfit.hardware import get_gpu
    from trainfit.models.resolve import load_model

    spec, gpu = load_model("llama-3.2-1b"), get_gpu("H200")
    kn = kernels_for(gpu)
    on = estimate(spec, Setup(batch=2, seq=1024, precision="amp-bf16"), gpu=gpu)
    off = estimate(spec, Setup(batch=2, seq=1024, precision="amp-bf16", max_grad_norm=0), gpu=gpu)
    params = on.params
    assert params == 1_235_814_400
    tensors = 16 * (4 + 3 + 2) + 3  # per layer 4 attention and 3 MLP projections, 2 norms; embedding, norm, head
    bandwidth = gpu.memory_bandwidth * kn.hbm_fraction * kn.access["mta32"]
    launches = 2 * math.ceil((params / 65536 + tensors / 2) / 320) + 8
    assert launches == 128
    expected = 3 * 4 * params / bandwidth + launches * kn.launch_seconds
    st_on, st_off = on.detail["step_time"], off.detail["step_time"]
    added = st_on["optimizer"] - st_off["optimizer"]
    assert expected < added < expected * 1.002, (added, expected)
    assert st_on["kernels"] - st_off["kernels"] == launches
    assert on.memory.peak == off.memory.peak  # a few scalars: no memory term


def test_cli_refuses_a_negative_max_grad_norm(cli):
    code, out, err = cli("estimate", "tiny-llama", "--max-grad-norm", "-1")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--max-grad-norm" in err
    code, out, err = cli("estimate", "tiny-llama", "--mode", "infer", "--max-grad-norm", "0")
    assert code == 2 and "train/rl only" in err
