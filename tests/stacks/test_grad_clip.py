"""Gradient clipping before the optimizer step (stacks/*.toml [grad_clip], --max-grad-norm), checked against
independent sources:
  * the installed transformers, torchtitan, megatron-core and deepspeed's own defaults (TrainingArguments.
    max_grad_norm, training.max_norm, OptimizerConfig.clip_grad, GRADIENT_CLIPPING_DEFAULT), and their own config
    classes reading what --emit writes;
  * the gradients the real CPU step hands optimizer.step(), read by a step pre-hook and compared with torch's own
    vector norm of the unclipped step's gradients;
  * the clip's bytes and kernels counted by hand (each gradient read for the norm, read and written for the scale;
    Megatron's multi_tensor_apply launches, DeepSpeed's per-tensor fp64 casts and norms) at the catalog bandwidth.
Megatron's and DeepSpeed's real CPU steps check the temporaries and the gradients read (test_megatron_cpu.py,
test_deepspeed.py)."""
from __future__ import annotations

import copy
import math

import pytest
import torch

from trainfit.analytic.parallel.collectives import Links
from trainfit.analytic.roofline import kernels_for
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
    st_on, st_off = on.detail.step_time, off.detail.step_time
    added = st_on.optimizer - st_off.optimizer
    assert expected < added < expected * 1.002, (added, expected)
    assert st_on.kernels - st_off.kernels == launches
    assert on.memory.peak == off.memory.peak  # a few scalars: no memory term


def test_cli_refuses_a_negative_max_grad_norm(cli):
    code, out, err = cli("estimate", "tiny-llama", "--max-grad-norm", "-1")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--max-grad-norm" in err
    code, out, err = cli("estimate", "tiny-llama", "--mode", "infer", "--max-grad-norm", "0")
    assert code == 2 and "train/rl only" in err


def test_megatron_and_deepspeed_clip_by_their_own_defaults():
    """Megatron-Core's OptimizerConfig.clip_grad and DeepSpeed's GRADIENT_CLIPPING_DEFAULT are both 1.0 (HF Trainer's
    DeepSpeed integration fills gradient_clipping from max_grad_norm, 1.0 as well); --max-grad-norm replaces them."""
    pytest.importorskip("megatron.core")
    constants = pytest.importorskip("deepspeed.runtime.constants")
    from megatron.core.optimizer import OptimizerConfig

    assert Setup(stack="megatron", precision="bf16-master").grad_clip_norm == OptimizerConfig().clip_grad == 1.0
    assert Setup(stack="deepspeed", precision="bf16-master").grad_clip_norm == constants.GRADIENT_CLIPPING_DEFAULT
    assert Setup(stack="megatron", precision="bf16-master", max_grad_norm=0).grad_clip_norm == 0.0
    assert Setup(stack="deepspeed", precision="bf16-master", max_grad_norm=0.5).grad_clip_norm == 0.5


@pytest.mark.parametrize("norm", [None, 0.0, 0.5])
def test_emitted_configs_carry_the_clip_as_the_stacks_read_it(norm):
    """--emit deepspeed's gradient_clipping, parsed by DeepSpeed's own DeepSpeedConfig; --emit megatron's --clip-grad,
    given to Megatron-Core's OptimizerConfig (Megatron-LM's flag for OptimizerConfig.clip_grad)."""
    pytest.importorskip("megatron.core")
    cfgmod = pytest.importorskip("deepspeed.runtime.config")
    import shlex

    from megatron.core.optimizer import OptimizerConfig

    from trainfit.models.resolve import load_model
    from trainfit.plan.emit import emit
    from trainfit.plan.emit_deepspeed import deepspeed as emit_deepspeed

    expected = 1.0 if norm is None else norm
    ds = Setup(stack="deepspeed", precision="bf16-master", zero=2, dp=2, max_grad_norm=norm)
    cfg = {k: v for k, v in emit_deepspeed(ds).items() if k != "train_batch_size"}  # one process: world size 1
    assert cfgmod.DeepSpeedConfig(cfg).gradient_clipping == expected
    mg = Setup(stack="megatron", precision="bf16-master", tp=2, max_grad_norm=norm)
    toks = shlex.split(emit("megatron", mg, load_model("tiny-llama"), 8).replace("\\\n", " "))
    assert OptimizerConfig(clip_grad=float(toks[toks.index("--clip-grad") + 1])).clip_grad == expected


def test_cli_max_grad_norm_applies_to_megatron_and_deepspeed(cli):
    """Accepted (exit 0) for both stacks, 0 included; the refusals that still apply stay one line, exit 2."""
    import json

    for stack in ("megatron", "deepspeed"):
        for norm in ("0", "0.5"):
            code, out, err = cli("estimate", "tiny-llama", "--stack", stack, "--max-grad-norm", norm, "--gpu", "H100",
                                 "--json")
            assert code == 0, err
            assert json.loads(out)["memory"]["peak"] > 0
    code, out, err = cli("estimate", "tiny-llama", "--stack", "megatron", "--mode", "infer", "--max-grad-norm", "1")
    assert code == 2 and len(err.strip().splitlines()) == 1


def _step_time(model: str, gpu: str, **kw):
    from trainfit.analytic.step_time import layout_step_time
    from trainfit.hardware import get_gpu
    from trainfit.models.resolve import load_model

    return layout_step_time(load_model(model), Setup(**kw), get_gpu(gpu))


def _hand_seconds(gpu_name: str, passes, kernels: float) -> float:
    """Bytes at the catalog bandwidth times each access class's fraction (kernels.toml), plus 3 µs per launch."""
    from trainfit.hardware import get_gpu

    gpu = get_gpu(gpu_name)
    kn = kernels_for(gpu)
    bw = gpu.memory_bandwidth * kn.hbm_fraction
    return sum(b / (bw * kn.access.get(a, 1.0)) for b, a in passes) + kernels * kn.launch_seconds


def test_megatron_clip_time_by_hand():
    """llama-3.1-8b, TP 4 x DP 2, the distributed optimizer, bf16 with fp32 main grads, H100. Each rank's optimizer
    holds a shard of its TP rank's parameters (half of them): multi_tensor_l2norm reads the shard's fp32 main grads
    once (4 B each), multi_tensor_scale reads and writes them (8 B), both multi_tensor_apply kernels (access mta32),
    one launch per 320 chunks of 65,536 elements (a tensor's last chunk counted as half: 195 tensors, Megatron's
    fused linear_qkv and linear_fc1 making 6 a layer); then 6 scalar
    launches (2 zero fills, l2norm's cleanup, the square, the all-reduce, the scale's zero fill). The square of the
    norm, 4 bytes, is all-reduced over all 8 ranks (the distributed optimizer's grad-stats group), ring model at the
    NVLink rate: 2·7/8·4 B / bandwidth."""
    from trainfit.analytic.params import count_params
    from trainfit.analytic.step_time import stage_params
    from trainfit.hardware import get_gpu
    from trainfit.models.resolve import load_model

    kw = dict(stack="megatron", precision="bf16-master", tp=4, dp=2, zero=1, batch=1, seq=4096)
    spec, gpu = load_model("llama-3.1-8b"), get_gpu("H100")
    shard = stage_params(spec, count_params(spec), 4, 1) / 2
    tensors = 32 * 6 + 3
    launches = math.ceil((shard / 65536 + tensors / 2) / 320)
    assert launches == 49
    # a few bytes: NCCL's latency is all of it (parallel/collectives.py, tuning.cc; tests/analytic/test_collectives.py
    # derives it by hand); the bytes' ring term beside it
    links = Links.of(gpu)
    allreduce = links.allreduce(8, 8, 4)
    assert allreduce > 1e5 * 2 * 7 / 8 * 4 / links.intra  # the latency, not the ring's bytes
    on, off = _step_time("llama-3.1-8b", "H100", **kw), _step_time("llama-3.1-8b", "H100", max_grad_norm=0, **kw)
    assert on.grad_clip == pytest.approx(
        _hand_seconds("H100", [(4 * shard, "mta32"), (8 * shard, "mta32")], 2 * launches + 6) + allreduce, rel=1e-9)
    # --max-grad-norm 0: the ChainedOptimizer still takes (and all-reduces) the norm; the scale pass goes
    assert off.grad_clip == pytest.approx(_hand_seconds("H100", [(4 * shard, "mta32")], launches + 5) + allreduce,
                                          rel=1e-9)
    assert on.optimizer - off.optimizer == pytest.approx(on.grad_clip - off.grad_clip, rel=1e-9)
    assert on.kernels - off.kernels == launches + 1


def test_deepspeed_zero2_clip_time_by_hand():
    """llama-2-7b, ZeRO-2 over 8 ranks, bf16 with fp32 masters, H100. DeepSpeedZeroOptimizer takes the norm of the
    rank's gradient partition (1/8 of the parameters) piece by piece: each bf16 piece cast to fp64 (read 2 B, write
    8 B; access upcast) and its vector norm (read 8 B; access reduce), 2 kernels per piece, (291 + 7) / 8 pieces on
    the mean rank (291 tensors, the partitions' ends split 7 of them); 20 scalar kernels (stack, pow, sum, float,
    the all-reduce, pow, the inf/nan mask's 5, combine_grad_norm_groups' 9); the fp64 norm's 8 bytes all-reduced over
    the 8 data-parallel ranks. The clip multiplies the fp32 gradient partition in place (read and write 4 B) after 6
    scalar kernels; without gradient_clipping (bf16: loss scale 1) that multiply is skipped, the norm is not."""
    from trainfit.analytic.params import count_params
    from trainfit.hardware import get_gpu
    from trainfit.models.resolve import load_model

    kw = dict(stack="deepspeed", precision="bf16-master", zero=2, dp=8, batch=1, seq=4096)
    spec, gpu = load_model("llama-2-7b"), get_gpu("H100")
    part = count_params(spec).total / 8
    pieces = (291 + 7) / 8
    # a few bytes: NCCL's latency is all of it (parallel/collectives.py, tuning.cc; tests/analytic/test_collectives.py
    # derives it by hand); the bytes' ring term beside it
    links = Links.of(gpu)
    allreduce = links.allreduce(8, 8, 8)
    assert allreduce > 1e5 * 2 * 7 / 8 * 8 / links.intra  # the latency, not the ring's bytes
    norm = [(10 * part, "upcast"), (8 * part, "reduce")]
    on, off = _step_time("llama-2-7b", "H100", **kw), _step_time("llama-2-7b", "H100", max_grad_norm=0, **kw)
    assert on.grad_clip == pytest.approx(
        _hand_seconds("H100", norm + [(8 * part, "vector")], 2 * pieces + 20 + 1 + 6) + allreduce, rel=1e-9)
    assert off.grad_clip == pytest.approx(_hand_seconds("H100", norm, 2 * pieces + 20) + allreduce, rel=1e-9)


def test_what_max_grad_norm_zero_leaves_per_stack():
    """0 turns clipping off as each stack does: nothing left under HF (clip_grad_norm_ is not called); the norm left
    under Megatron (the ChainedOptimizer logs it) and DeepSpeed's ZeRO-1/2 (compute_grad_norm); ZeRO-3 and the 16-bit
    stage-0 optimizers still multiply by the (loss) scale, so only the clip coefficient's scalar kernels go (ZeRO-3's
    6: / loss scale, + 1e-6, / clip, clamp, * loss scale, reciprocal)."""
    from trainfit.hardware import get_gpu

    launch = kernels_for(get_gpu("H100")).launch_seconds
    base = dict(precision="bf16-master", batch=1, seq=1024)
    hf = _step_time("llama-3.2-1b", "H100", max_grad_norm=0, precision="amp-bf16", batch=1, seq=1024)
    assert hf.grad_clip == 0.0
    for stack, zero, dp, left in (("megatron", 1, 2, True), ("deepspeed", 2, 2, True), ("deepspeed", 3, 2, True),
                                  ("deepspeed", 0, 2, True)):
        on = _step_time("llama-3.2-1b", "H100", stack=stack, zero=zero, dp=dp, **base)
        off = _step_time("llama-3.2-1b", "H100", stack=stack, zero=zero, dp=dp, max_grad_norm=0, **base)
        assert 0 < off.grad_clip <= on.grad_clip, (stack, zero)
        scalars = {("deepspeed", 0): 0, ("deepspeed", 3): 6}.get((stack, zero))
        if scalars is None:  # the scale pass goes
            assert on.grad_clip - off.grad_clip > 10 * launch, (stack, zero)
        else:
            assert on.grad_clip - off.grad_clip == pytest.approx(scalars * launch, abs=1e-12), (stack, zero)
