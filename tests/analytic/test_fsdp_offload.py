"""--offload params on --stack hf / torchtitan: FSDP2's CPUOffloadPolicy (torch 2.13 distributed/fsdp/_fully_shard;
torchtitan 0.2.2 training.enable_cpu_offload, accelerate's fsdp_offload_params under fsdp_version 2)."""
from __future__ import annotations

import pytest

from trainfit.analytic.memory import train_memory
from trainfit.analytic.params import count_params
from trainfit.errors import SetupError
from trainfit.models.resolve import load_model
from trainfit.setup import Setup


def _setup(stack, **kw) -> Setup:
    return Setup(**{"stack": stack, "optimizer": "adamw", "batch": 1, "seq": 512, "dp": 8, "zero": 3, **kw})


@pytest.mark.parametrize("stack", ["hf", "torchtitan"])
def test_every_shard_state_on_the_host(stack):
    """CPUOffloadPolicy: the fp32 parameter shard (4Ψ/dp, pinned: _fsdp_param.py:312-315), its fp32 gradient shard
    (4Ψ/dp, the D2H copy's output: _fsdp_collectives.py:733-738) and AdamW's two fp32 moments made on the CPU
    (8Ψ/dp) = 16Ψ/dp on the host; nothing resident on the device, and the peak lower by at least the weights and
    the moments the device held without offload."""
    spec = load_model("llama-3.1-8b")
    psi = count_params(spec).total
    on = train_memory(spec, _setup(stack, precision="amp-bf16"))
    off = train_memory(spec, _setup(stack, precision="amp-bf16", offload="params"))
    assert off.host_memory == pytest.approx(16 * psi / 8, rel=1e-6)
    assert off.weights == off.gradients == off.optimizer == off.master == 0
    assert on.peak - off.peak >= on.weights + on.optimizer


def test_cpu_step_by_hand():
    """torch's CPU AdamW: fused (aten._fused_adamw_ on CPU) streams 7 fp32 tensors per element; the single-tensor
    path (no foreach kernels on CPU) 20 accesses (optim/adam.py:419-546). 1e9 elements at 100e9 B/s: 0.28 s / 0.8 s."""
    from trainfit.analytic.parallel.fsdp_offload import cpu_step_seconds

    assert cpu_step_seconds(_setup("hf", offload="params", optimizer_impl="fused"), 1e9, 100e9) == pytest.approx(0.28)
    assert cpu_step_seconds(_setup("hf", offload="params", optimizer_impl="for-loop"), 1e9, 100e9) == pytest.approx(0.8)


def test_offload_params_needs_zero_3_and_the_analytic_engine():
    with pytest.raises(SetupError, match="FSDP2 CPU offload.*--zero 3"):
        _setup("hf", zero=2, offload="params")
    from trainfit import engines

    with pytest.raises(SetupError, match="CPUOffloadPolicy"):
        engines.trace(load_model("tiny-llama"), _setup("hf", offload="params", dp=2))
