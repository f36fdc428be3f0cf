"""--recompute-modules (Megatron's selective recompute modules, analytic/megatron_recompute.py): the saved bytes of a
layer against megatron-core's own layer run on CPU, the refusals, and what the time model re-runs."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from trainfit.analytic.megatron_activations import layer_terms
from trainfit.analytic.megatron_recompute import ep_rerun_share, modules, rerun_ops
from trainfit.errors import SetupError
from trainfit.models.hf_config import spec_from_config
from trainfit.models.resolve import load_model
from trainfit.setup import Setup

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def _cpu_layer(modules_list: str | None):
    from bench.targets.megatron_cpu import hf_config
    from megatron_layer_saved import BATCH, FFN, HEADS, HIDDEN, SEQ  # (tests/stacks: the script beside this file)

    spec = spec_from_config(hf_config({"hidden": HIDDEN, "heads": HEADS, "layers": 1, "ffn": FFN, "vocab": 512,
                                       "positions": SEQ}), "megatron-cpu-layer")
    kw = dict(stack="megatron", device="cpu", attention="eager", precision="fp32", batch=BATCH, seq=SEQ)
    if modules_list:
        kw.update(recompute="selective", recompute_modules=modules_list)
    s = Setup(**kw)
    return layer_terms(spec, s).per_rank(s, BATCH * SEQ, SEQ)


@pytest.mark.heavy  # one megatron-core process, ~15 s on two cores
def test_saved_bytes_match_megatron_core_layer():
    """megatron-core's local-spec layer, its saved storages counted in its forward (tests/stacks/
    megatron_layer_saved.py), under no recompute, layernorm, mlp, core_attn and layernorm+mlp: the analytic layer's
    bytes to the byte (core_attn: within the 4-byte scalar the checkpoint keeps)."""
    pytest.importorskip("megatron.core")
    cases = ["", "layernorm", "mlp", "core_attn", "layernorm,mlp"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "src"), ROOT]))
    out = subprocess.run([sys.executable, os.path.join(HERE, "megatron_layer_saved.py"), *cases], env=env,
                         capture_output=True, text=True, timeout=300, check=True).stdout
    measured = json.loads(out.strip().splitlines()[-1])
    sys.path.insert(0, HERE)
    try:
        for case in cases:
            assert _cpu_layer(case or None) == pytest.approx(measured[case], abs=16), case
    finally:
        sys.path.remove(HERE)
    # the layernorm module drops both norms' outputs (h fp32 each) and statistics (mean, rstd) per token
    assert measured[""] - measured["layernorm"] == 2 * (4 * 256 + 2 * 4) * 2 * 128


def test_default_is_core_attn_and_only_under_selective():
    mg = dict(stack="megatron", precision="bf16-master")
    assert modules(Setup(**mg, recompute="selective")) == {"core_attn"}  # transformer_config.py:1193
    assert modules(Setup(**mg)) == frozenset()
    with pytest.raises(SetupError, match="--recompute selective"):
        Setup(**mg, recompute="full", recompute_modules="moe")
    with pytest.raises(SetupError, match="Megatron-Core"):
        Setup(stack="torchtitan", recompute="selective", recompute_modules="moe")
    with pytest.raises(SetupError, match="not a Megatron recompute module"):
        Setup(**mg, recompute="selective", recompute_modules="moe,attention")


def test_model_refusals():
    from trainfit.analytic.stacks.megatron import MODEL

    dense = load_model("llama-3.1-8b")
    for mods, why in (("moe_act", "no MoE layers"), ("mla_up_proj", "multi-latent"), ("layernorm", "fuses")):
        with pytest.raises(SetupError, match=why):
            MODEL.check_model(dense, Setup(stack="megatron", precision="bf16-master", recompute="selective", recompute_modules=mods))
    with pytest.raises(SetupError, match="shared expert"):
        MODEL.check_model(load_model("qwen3-235b-a22b"),
                          Setup(stack="megatron", precision="bf16-master", recompute="selective",
                                recompute_modules="shared_experts"))


def test_moe_modules_saved_and_rerun():
    """Qwen3-235B-A22B (128 experts, top 8, expert width 1536, h 4096) under TE, bf16, TP 1: moe_act drops the
    experts' activation outputs, 8 × 1536 × 2 bytes per token; layernorm the pre-MLP norm's output and fp32 rstd
    (the input norm is fused into linear_qkv: gpt_layer_specs.py:291); moe every expert tensor and the router's."""
    spec = load_model("qwen3-235b-a22b")
    base = dict(stack="megatron", precision="bf16-master", seq=4096, dp=8, ep=8)
    none = layer_terms(spec, Setup(**base), moe=True)
    act = layer_terms(spec, Setup(**base, recompute="selective", recompute_modules="moe_act"), moe=True)
    norm = layer_terms(spec, Setup(**base, recompute="selective", recompute_modules="layernorm"), moe=True)
    moe = layer_terms(spec, Setup(**base, recompute="selective", recompute_modules="moe"), moe=True)
    total = lambda t: sum(t.replicated.values()) + sum(t.split.values())  # noqa: E731
    assert total(none) - total(act) == 8 * 1536 * 2
    assert total(none) - total(norm) == 4096 * 2 + 4
    # kept under moe: the attention half and the MoE layer's input (the pre-MLP norm's output, in linear_inputs)
    assert "expert_tokens" not in moe.split and "router" not in moe.replicated
    s = Setup(**base, recompute="selective", recompute_modules="moe")
    assert ep_rerun_share(s) == 0.5
    from trainfit.analytic.compute_time import compute_dtype
    from trainfit.analytic.ops import layer_forward, shape_of
    from trainfit.analytic.precision import state_bytes

    fwd = layer_forward(spec, shape_of(spec, s, state_bytes(s), compute_dtype(s)), moe=True)
    names = [o.name for o in rerun_ops(spec, s, fwd)]
    # (Megatron's own MoE block: ops/megatron_moe.py, the combine's last kernel the unpermute)
    assert names[0] == "router" and "experts_in" in names and "unpermute" in names and "mlp_residual" not in names
    s2 = Setup(**base, recompute="selective", recompute_modules="layernorm,moe_act")
    # moe_act re-runs TEGroupedMLP's activation, one fused kernel (experts.py:729-733 checkpoint of bias_act_func)
    assert {o.name for o in rerun_ops(spec, s2, fwd)} == {"mlp_norm", "experts_act"}


def test_moe_rerun_flops_by_hand():
    """Qwen3-235B-A22B under the moe module re-runs per token the router (128 x 4096) and 8 SwiGLU experts
    (3 x 4096 x 1536 each), 2 FLOPs per weight, in every layer (all 94 are MoE, no shared expert)."""
    from trainfit.analytic.megatron_recompute import rerun_matmul_per_token

    spec = load_model("qwen3-235b-a22b")
    s = Setup(stack="megatron", precision="bf16-master", dp=8, ep=8, recompute="selective", recompute_modules="moe")
    assert rerun_matmul_per_token(spec, s) == pytest.approx(2 * (128 * 4096 + 8 * 3 * 4096 * 1536), rel=1e-9)
    s = Setup(stack="megatron", precision="bf16-master", dp=8, ep=8, recompute="selective",
              recompute_modules="layernorm,moe_act")
    assert rerun_matmul_per_token(spec, s) == 0.0
