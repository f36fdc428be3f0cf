"""--offload params on --stack hf / torchtitan: FSDP2's CPUOffloadPolicy (torch 2.13 distributed/fsdp/_fully_shard;
torchtitan 0.2.2 training.enable_cpu_offload, accelerate's fsdp_offload_params under fsdp_version 2), and FSDP1's
CPUOffload(offload_params=True) under --fsdp-version 1, by hand from torch's code (this CPU-only torch cannot pin
memory, so no real or traced FSDP1 offload step runs here: analytic/parallel/fsdp1.py)."""
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

    with pytest.raises(SetupError, match="pinned host memory"):
        engines.trace(load_model("tiny-llama"), _setup("hf", offload="params", dp=2))


# FSDP1 (--fsdp-version 1): the 8-layer variant of tests/stacks/test_fsdp_policy.py's model (hidden 128, GQA 4/2, FFN
# 512, vocab 1000), whose many layers put the backward's high point at its end, where the gradient shards are
LAYER = 2 * 128 * 128 + 2 * 128 * 64 + 3 * 128 * 512 + 2 * 128  # q, o; k, v; gate, up, down; two norms
ROOT = 2 * 1000 * 128 + 128  # embedding, lm_head, final norm
P8 = 8 * LAYER + ROOT


def _fsdp(version=1, **kw):
    from trainfit.models.hf_config import spec_from_config

    spec = spec_from_config({"model_type": "llama", "hidden_size": 128, "intermediate_size": 512,
                             "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 2,
                             "vocab_size": 1000, "max_position_embeddings": 256, "tie_word_embeddings": False},
                            "hf-fsdp1-8")
    return train_memory(spec, _setup("hf", dp=2, seq=8, precision="amp-bf16", fsdp_version=version, **kw))


def test_fsdp1_cpu_offload_by_hand():
    """FSDP1's CPUOffload(offload_params=True), hand count from torch 2.13 fsdp/ (P = 8 layers + root, dp 2; FSDP1
    without offload is checked against the trace in tests/stacks/test_fsdp_policy.py):
      * host: each unit's fp32 shard pinned (_flat_param.py:1257-1261) and its pinned fp32 `_cpu_grad` (:1262-1266),
        AdamW's two fp32 moments beside them: 16 P / 2;
      * device: the fp32 shards (4 P / 2) and the moments (8 P / 2) leave it, the reduced fp32 gradient shards do not:
        each stays as `_saved_grad_shard` (_runtime_utils.py:918-927) to the backward's end, so the forward's end and
        the backward's high point (at its end here: the gradient shards built up) are the no-offload ones less 12 P / 2;
      * the optimizer step: nothing left on the device (_flat_param.py:1717-1720 frees the shards; states on the host).
    FSDP2's offload frees each shard at once: its backward high point is lower by at least the shards left then."""
    on, off = _fsdp(), _fsdp(offload="params")
    assert off.host_memory == 16 * P8 // 2
    assert on.weights == 4 * P8 // 2 and on.optimizer == 8 * P8 // 2  # the no-offload layout the delta is taken from
    for phase in ("forward_end", "backward"):
        assert on.phases[phase] - off.phases[phase] == 12 * P8 // 2, phase
    assert off.phases["optimizer_step"] == 0
    assert off.gradients == 4 * P8 // 2 and off.weights == off.optimizer == 0
    fsdp2 = _fsdp(2, offload="params")
    assert fsdp2.host_memory == off.host_memory and fsdp2.gradients == 0
    assert off.phases["backward"] - fsdp2.phases["backward"] > 4 * LAYER // 2


def test_fsdp1_cpu_offload_refuses_accumulation():
    """accelerate accumulates under no_sync (accelerator.py:1284-1297): FSDP1's unsharded gradients on the device,
    and torch's CPU offload does not accumulate outside it (_flat_param.py:1642-1646): refused, not mis-modelled."""
    with pytest.raises(SetupError, match="--grad-accum 1, or --fsdp-version 2"):
        _fsdp(offload="params", grad_accum=2)
