"""torchao's low-bit AdamW states (analytic/torchao_optim.py) against torchao's own state tensors.

Truth: the optimizer torchao builds (torchao.optim.AdamW8bit / AdamW4bit / AdamWFp8 at the block size the HF Trainer
passes, through trainfit's step), its states made by its own constructor (_new_buffer, the call its step makes,
adam.py:123-128) for every parameter of the transformers model on the meta device, and, on a tiny model, by a real
compiled CPU step (heavy tier). Bytes are the subclasses' inner tensors (codes,
block scales, qmap) or the plain tensor of a parameter under 4,096 elements.
"""
from __future__ import annotations

import warnings

import pytest
import torch

from trainfit.analytic.optimizer import state_bytes_unsharded
from trainfit.analytic.params import count_params
from trainfit.analytic.precision import state_bytes
from trainfit.models.resolve import load_model
from trainfit.setup import TORCHAO_OPTIMIZERS, Setup

pytest.importorskip("torchao")


def _model(spec, precision: str, device: str):
    import copy

    from transformers import AutoConfig, AutoModelForCausalLM

    # a deep copy: transformers writes into the config's nested dicts, and spec.config is the catalog's own
    config = AutoConfig.for_model(**{k: copy.deepcopy(v) for k, v in spec.config.items()
                                      if k != "transformers_version"})
    with torch.device(device), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_config(config)
    return model.to(torch.bfloat16 if precision == "bf16" else torch.float32)  # amp: fp32 weights


def _bytes(t: torch.Tensor) -> int:
    if hasattr(t, "__tensor_flatten__"):  # torchao's OptimState8bit / 4bit / Fp8: codes, scale (, qmap)
        names, _ = t.__tensor_flatten__()
        return sum(_bytes(getattr(t, n)) for n in names)
    return t.numel() * t.element_size()


def _analytic(spec, setup: Setup) -> float:
    pc = count_params(spec)
    return state_bytes_unsharded(spec, pc.total, pc, state_bytes(setup), setup)


@pytest.mark.parametrize("name", ["llama-3.1-8b", "tiny-llama", "gpt2"])
@pytest.mark.parametrize("optimizer", TORCHAO_OPTIMIZERS)
@pytest.mark.parametrize("precision", ["amp-bf16", "bf16"])
def test_state_bytes_equal_torchaos_states(name, optimizer, precision):
    """Every parameter's two states as torchao makes them (meta tensors: sizes without data)."""
    from trainfit.step.standard import make_optimizer

    spec = load_model(name)
    setup = Setup(precision=precision, optimizer=optimizer)
    model = _model(spec, precision, "meta")
    opt = make_optimizer(model, setup)
    real = sum(_bytes(opt._new_buffer(p, signed)) for p in model.parameters() for signed in (True, False))
    # NB (gpt2): the enumeration takes the fused c_attn as three tensors (two more pairs of 8-bit qmaps, 4 KiB a
    # layer) and leaves the position table out (no qmap there): +47 KiB of 254 MB
    assert _analytic(spec, setup) == pytest.approx(real, rel=1e-5 if name != "gpt2" else 2e-4)


@pytest.mark.heavy
@pytest.mark.parametrize("optimizer", TORCHAO_OPTIMIZERS)
def test_a_real_cpu_step_makes_those_states(optimizer):
    """tiny-llama (norm vectors of 256 elements: plain fp32 states; every matrix quantised): one real step, compiled
    as torchao runs it (inductor's C++ kernels: tens of seconds per optimizer on two cores)."""
    from trainfit.step.standard import make_optimizer

    spec = load_model("tiny-llama")
    setup = Setup(precision="amp-bf16", optimizer=optimizer)
    torch.manual_seed(0)
    model = _model(spec, "amp-bf16", "cpu")
    opt = make_optimizer(model, setup)
    ids = torch.randint(0, spec.vocab, (1, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    real = sum(_bytes(s[k]) for s in opt.state.values() for k in ("exp_avg", "exp_avg_sq"))
    assert _analytic(spec, setup) == pytest.approx(real, rel=1e-9)
    small = [p for p in model.parameters() if p.numel() < 4096]
    assert small and all(type(opt.state[p]["exp_avg"]) is torch.Tensor for p in small)


@pytest.mark.heavy
@pytest.mark.parametrize("optimizer", TORCHAO_OPTIMIZERS)
@pytest.mark.parametrize("precision,dtype", [("amp-bf16", torch.float32), ("bf16", torch.bfloat16)])
def test_the_compiled_steps_temporaries(optimizer, precision, dtype):
    """One 512 x 1024 parameter's compiled step (the second: compiled and its states made by the first), its peak
    above the step's start from PyTorch's allocation records (measure/cpu_peak.py) = step_temporaries."""
    from trainfit.analytic.torchao_optim import step_temporaries
    from trainfit.measure.cpu_peak import cpu_peak
    from trainfit.step.standard import make_optimizer

    setup = Setup(optimizer=optimizer, precision=precision)
    p = torch.nn.Parameter(torch.randn(512, 1024, dtype=dtype))
    opt = make_optimizer([p], setup)
    p.grad = torch.randn_like(p)
    opt.step()
    p.grad = torch.randn_like(p)
    peak, _ = cpu_peak(lambda phase: opt.step(), 0)
    assert peak.peak - peak.baseline == step_temporaries(setup, p.numel())


@pytest.mark.parametrize("name", ["llama-3.2-1b", "qwen2.5-0.5b"])
@pytest.mark.parametrize("precision", ["amp-bf16", "bf16"])
def test_cpu_offload_optimizer_bytes(name, precision):
    """torchao's CPUOffloadOptimizer (cpu_offload.py:90-114), counted by hand over the transformers model's own
    parameters: each of 4,096 elements or more gets a pinned host copy and gradient of its dtype and a torch AdamW
    over the copy (two states of that dtype) on the host; the smaller ones keep an AdamW on the GPU."""
    from trainfit.analytic.engine import estimate

    spec = load_model(name)
    est = estimate(spec, Setup(precision=precision, offload="optimizer", seq=512))
    params = list(_model(spec, precision, "meta").parameters())
    host = sum(4 * p.numel() * p.element_size() for p in params if p.numel() >= 4096)
    device = sum(2 * p.numel() * p.element_size() for p in params if p.numel() < 4096)
    assert est.detail.host_memory == pytest.approx(host, rel=1e-3)
    assert est.memory.optimizer_states == pytest.approx(device, rel=1e-3)


def test_cpu_offload_runs_on_one_gpu_and_not_in_the_fake_engines():
    from trainfit.engines import check_stack
    from trainfit.errors import SetupError

    for bad in (dict(dp=2), dict(dp=2, zero=1), dict(precision="bf16-master"), dict(optimizer="adamw-torchao-8bit"),
                dict(device="cpu")):
        with pytest.raises(SetupError, match="--offload optimizer"):
            Setup(offload="optimizer", **bad)
    with pytest.raises(SetupError, match="CUDA or XPU"):
        check_stack(Setup(offload="optimizer"), "measure")
    with pytest.raises(SetupError, match="fake tensors"):
        check_stack(Setup(optimizer="adamw-torchao-4bit"), "trace")
    with pytest.raises(SetupError, match="--zero"):  # ZeRO-Offload still needs ZeRO on the deepspeed stack
        Setup(stack="deepspeed", offload="optimizer")


def test_cpu_offload_step_waits_at_least_for_the_parameters_to_come_back():
    """The offloaded parameters return over PCIe after the CPU step: the step's host-copies term is at least their
    bytes at the host link's line rate (kernels.toml host_link), and the GPU's own optimizer work shrinks."""
    from trainfit.analytic.engine import estimate
    from trainfit.analytic.roofline import kernels_for
    from trainfit.hardware import get_gpu

    spec, gpu = load_model("llama-3.2-1b"), get_gpu("H100-80GB")
    off = estimate(spec, Setup(offload="optimizer", seq=512), gpu=gpu).detail.step_time
    plain = estimate(spec, Setup(seq=512), gpu=gpu).detail.step_time
    params = count_params(spec).total
    assert off.host_copies >= params * 4 / kernels_for(gpu).host_link
    assert off.optimizer < plain.optimizer


def test_the_measure_engine_counts_the_quantised_states_inner_tensors():
    """torchao's states are storage-less wrappers: the measure engine counts the tensors they hold."""
    from torchao.optim.subclass_4bit import OptimState4bit

    from trainfit.measure.cpu_peak import storage_bytes

    state = OptimState4bit.zeros((256, 512), signed=True, block_size=128)
    assert storage_bytes([state]) == 256 * 512 // 2 + 4 * 256 * 512 // 128 + 4 * 16


@pytest.mark.heavy
@pytest.mark.parametrize("optimizer", TORCHAO_OPTIMIZERS)
@pytest.mark.parametrize("precision", ["amp-bf16", "bf16"])
def test_analytic_peak_equals_a_real_cpu_step(optimizer, precision):
    """tiny-llama, batch 2 x 64, the measure engine's real CPU steps (torchao compiled): the analytic peak within
    0.05 % (measured 2026-11-29: -0.01 % to +0.01 % for all six, native ISA and ONEDNN_MAX_CPU_ISA=AVX2 alike; the
    optimizer states differ by the 4-byte step counters torchao keeps per parameter)."""
    from trainfit import engines

    spec = load_model("tiny-llama")
    setup = Setup(device="cpu", optimizer=optimizer, precision=precision, batch=2, seq=64)
    measured = engines.measure(spec, setup, steps=2, warmup=1)
    analytic = engines.analytic(spec, setup)
    assert analytic.memory.peak == pytest.approx(measured.memory.peak, rel=5e-4)
    assert analytic.memory.peak_phase == measured.memory.peak_phase
