"""--stack torchtitan: the analytic engine (formulas reading stacks/torchtitan.toml) against the trace of torchtitan's
own step (its Transformer, apply_ac, apply_fsdp and loss on fake tensors), which matches real CPU steps to the byte
(test_torchtitan_engines.py). Target: within 2 % for every policy, one rank and FSDP2, CUDA and CPU semantics."""
from __future__ import annotations

import pytest

from trainfit.models.hf_config import spec_from_config
from trainfit.setup import Setup

pytest.importorskip("torchtitan", reason="--stack torchtitan's trace needs torchtitan (pip install 'trainfit[torchtitan]')")

SPEC = spec_from_config({"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 128,
                         "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
                         "intermediate_size": 512, "vocab_size": 1000, "max_position_embeddings": 4096,
                         "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": False,
                         "hidden_act": "silu"}, "tt-tiny")


CASES = [(p, lay, "cuda") for p in ("none", "full", "op", "layer:2") for lay in ({}, {"dp": 2, "zero": 3})]
CASES += [("op", {}, "cpu"), ("layer:2", {"dp": 2, "zero": 3}, "cpu")]  # (all of them: bench/targets/stacks_vs_trace.py)


@pytest.mark.parametrize("policy, layout, device", CASES)
def test_analytic_within_2_percent_of_torchtitans_traced_step(policy, layout, device):
    from trainfit import engines

    setup = Setup(stack="torchtitan", recompute=policy, batch=2, seq=128, device=device, **layout)
    traced = engines.trace(SPEC, setup, extrapolate=False, flops=False).memory.peak
    predicted = engines.analytic(SPEC, setup).memory.peak
    assert predicted == pytest.approx(traced, rel=0.02)
