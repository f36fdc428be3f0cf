"""The op list's per-kind cost functions (analytic/ops/) cover every variant a stack or a catalog model can ask for:
a stack's facts file naming a norm or rotary implementation with no cost function, or a model whose activation or
layer blocks have none, fails here instead of raising KeyError in an estimate (or, before the registries, silently
taking another kind's kernels)."""
from __future__ import annotations

import pytest

from trainfit import stacks
from trainfit.analytic.ops import Shape, layer_forward, recipe
from trainfit.analytic.ops.activation import ACTIVATIONS, activation, one_kernel
from trainfit.analytic.ops.layer import HYBRID_BLOCKS, MLPS
from trainfit.analytic.ops.norm import NORMS, norm_ops
from trainfit.analytic.ops.rotary import ROTARY
from trainfit.analytic.unmodelled import unmodelled_features
from trainfit.api import catalog_models
from trainfit.errors import SetupError
from trainfit.models.resolve import load_model

CATALOG = sorted({m["family"]: m["name"] for m in catalog_models()}.values())


@pytest.mark.parametrize("name", stacks.names())
def test_every_stack_norm_and_rotary_has_a_cost_function(name):
    stack = stacks.get_stack(name)
    assert stack.fact("norm") in NORMS
    assert stack.fact("rotary") in ROTARY


@pytest.mark.parametrize("model", CATALOG)
def test_every_catalog_family_composes_a_layer(model):
    spec = load_model(model)
    if unmodelled_features(spec):  # refused by the analytic engine (analytic/unmodelled.py): in one line
        with pytest.raises(SetupError, match="analytic engine does not model"):
            layer_forward(spec, Shape(batch=1, seq=64))
        return
    if spec.hybrid is not None:  # Nemotron-H: one mixer per block, each kind's projections counted by hand
        hand = {"mamba": ["in_proj", "out_proj"], "attention": ["q", "k", "v", "o"], "mlp": ["fc1", "fc2"]}
        for block in HYBRID_BLOCKS:
            ops = layer_forward(spec, Shape(batch=1, seq=64), block=block)
            gemms = [o.name for o in ops if o.kind == "gemm"]
            assert [g for g in gemms if not g.startswith("scan.")] == hand[block]
            # the scan's five einsums (C·Bᵀ, M·x, the chunk states, the recurrence, C·states)
            assert len(gemms) - len(hand[block]) == (5 if block == "mamba" else 0)
            assert sum(o.kind == "attention" for o in ops) == (block == "attention")
        return
    for moe in ((False, True) if spec.moe is not None else (False,)):
        rc = recipe(spec, moe)
        assert rc.mlp in MLPS and rc.norm in ("pre", "post") and rc.qkv in ("separate", "fused", "mla")
        ops = layer_forward(spec, Shape(batch=1, seq=64), moe)
        gemms = [o.name for o in ops if o.kind == "gemm"]
        # a hand count of each block's projections (the recipe's choice, not the same formula restated)
        qkv = {"separate": ["q", "k", "v"], "fused": ["qkv"], "mla": []}[rc.qkv]
        mlp = {"gated": ["gate", "up", "down"], "gated-fused": ["gate_up", "down"], "plain": ["fc1", "fc2"],
               "moe": ["router", "experts_in", "experts_out"]}[rc.mlp]
        if rc.mlp == "moe" and spec.moe.experts_every_token:  # Llama 4: two bmm over every expert, a shared MLP
            mlp = ["router", "all_experts_in", "all_experts_out", "shared_gate", "shared_up", "shared_down"]
        assert set(qkv + ["o"] + mlp) <= set(gemms)
        assert sum(o.kind == "attention" for o in ops) == 1


def test_norm_kinds_differ_in_kernels():
    """LayerNorm and torch.rms_norm are one kernel each way; HF's RMSNorm is its eager sequence (to fp32, pow, mean,
    rsqrt, mul, to dtype, weight: 7 ops, rsqrt 2 launches) — counted from modeling_llama.py:61-66 by hand."""
    spec = load_model("llama-3.2-1b")
    fused = norm_ops(spec, "n", 8, Shape(1, 8, norm="torch-rms-norm"), "g")
    eager = norm_ops(spec, "n", 8, Shape(1, 8, norm="hf-rmsnorm-fp32"), "g")
    assert [o.kernels for o in fused] == [1]
    assert sum(o.kernels for o in eager) == 8 and len(eager) == 7


def test_activation_variants():
    """gelu_new is HF's 8-kernel composite (activations.py:65-66), SiLU one kernel; a fused stack runs one."""
    gpt2 = load_model("gpt2")
    assert ACTIVATIONS.get(gpt2.activation) is not None
    assert len(activation(gpt2, "a", 16, Shape(1, 16), "g")) == 8
    assert len(activation(gpt2, "a", 16, Shape(1, 16, fused_elementwise=True), "g")) == 1
    llama = load_model("llama-3.2-1b")
    assert ACTIVATIONS.get(llama.activation, one_kernel) is one_kernel
