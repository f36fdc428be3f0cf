"""--liger (Liger's RMSNorm, SwiGLU and RoPE beside its fused loss) in the analytic engine: the saved bytes per layer
by hand from Liger's autograd functions (liger-kernel 0.8.5: ops/rms_norm.py:674-676 saves X and an fp32 RSTD per
row, ops/swiglu.py:272 saves the gate and up outputs, ops/rope.py:289 only cos and sin), and the refusals."""
from __future__ import annotations

import pytest

from trainfit import api
from trainfit.analytic.activations import layer_activations
from trainfit.errors import SetupError
from trainfit.setup import Request, Setup


def _layer(precision: str, **kw):
    spec = api.load_spec("tiny-llama")  # hidden 256, MLP 688
    setup = Request(model="tiny-llama", batch=1, seq=64, precision=precision, **kw).setup(spec)
    return spec, setup, layer_activations(spec, setup)


@pytest.mark.parametrize("precision,r", [("bf16", 2), ("amp-bf16", 4)])
def test_saved_bytes_per_layer(precision, r):
    spec, _, hf = _layer(precision)
    _, setup, lg = _layer(precision, liger=True)
    h, i, a = spec.hidden, spec.intermediate, 2
    # HF's LlamaRMSNorm (modeling_llama.py:61-66): the fp32 input (a copy under bf16, the input itself in fp32),
    # rsqrt (fp32 per row) and the normalised tensor in the input's dtype the weight multiplies; two per layer
    assert hf.terms["norms"] == 2 * (4 * h + 4 + r * h)
    # Liger: the input in its dtype (the residual stream's: fp32 under autocast) and RSTD, fp32 per row
    assert lg.terms["norms"] == 2 * (r * h + 4)
    # HF's SwiGLU: gate (silu's input), silu(gate) and up (the product's), the product (down_proj's input);
    # Liger: gate and up (LigerSiLUMulFunction), the product (down_proj's input)
    assert hf.terms["mlp"] == 4 * a * i and lg.terms["mlp"] == 3 * a * i
    # RoPE saves nothing per token either way (cos and sin only): the attention's saved set is unchanged
    assert lg.terms["attention"] == hf.terms["attention"]
    assert lg.per_token == hf.per_token - 8 * h - a * i
    assert setup.loss == "fused-linear"  # --liger's loss: Liger's fused linear cross-entropy


def test_tiled_mlp_keeps_the_hf_mlp():
    # ArcticTraining passes swiglu=False under tiled_mlp_compute (liger_factory.py:42): TiledMLP over HF's MLP
    spec, _, lg = _layer("bf16", liger=True, tiled_mlp=4)
    _, _, hf = _layer("bf16", tiled_mlp=4)
    assert lg.terms["mlp"] == hf.terms["mlp"] and lg.terms["norms"] == 2 * (2 * spec.hidden + 4)


def test_an_explicit_loss_is_kept():
    assert Setup(liger=True, loss="tiled").loss == "tiled"


@pytest.mark.parametrize("model,kw,words", [
    ("tiny-llama", dict(stack="torchtitan"), "--liger patches an HF model"),
    ("tiny-llama", dict(stack="megatron"), "--liger patches an HF model"),
    ("tiny-llama", dict(mode="infer"), "--liger applies to train only"),
    ("gpt2", {}, "no kernels"),  # not in MODEL_TYPE_TO_APPLY_LIGER_FN
    ("mixtral-8x7b", {}, "modelled for dense"),  # patched by Liger, with kernels not modelled here
])
def test_refusals(model, kw, words):
    with pytest.raises(SetupError, match=words):
        api.analytic(Request(model=model, liger=True, **kw))


def test_trace_refuses():
    from trainfit.engines import trace

    spec = api.load_spec("tiny-llama")
    with pytest.raises(SetupError, match="--liger"):
        trace(spec, Setup(liger=True, device="cpu", batch=1, seq=8))


def test_layer_kernels_are_ligers():
    # the step-time op list of one layer: Liger's norm, SwiGLU and RoPE replace HF's eager chains, one kernel each way
    from trainfit.analytic.ops.layer import layer_forward
    from trainfit.analytic.ops.shape import shape_of
    from trainfit.analytic.precision import state_bytes

    spec = api.load_spec("tiny-llama")
    setup = Request(model="tiny-llama", batch=1, seq=64, precision="bf16", liger=True).setup(spec)
    sh = shape_of(spec, setup, state_bytes(setup), "bf16")
    ops = {op.name: op for op in layer_forward(spec, sh)}
    T, h, i, q = 64, spec.hidden, spec.intermediate, spec.q_dim
    assert not any(n.startswith("act.silu") or n == "act_mul" or ".rope_" in n or n.endswith(".pow") for n in ops)
    norm = ops["attn_norm"]  # reads x (bf16) and the weight, writes y (bf16) and one fp32 rstd per row
    assert (norm.reads, norm.writes) == (2 * T * h + 2 * h, 2 * T * h + 4 * T)
    sw = ops["act.liger_swiglu"]  # reads gate and up, writes the product; backward reads dc, a, b and writes da, db
    assert (sw.reads, sw.writes) == (2 * 2 * T * i, 2 * T * i)
    assert [(b.reads, b.writes) for b in sw.bwd_ops] == [(3 * 2 * T * i, 2 * 2 * T * i)]
    assert (ops["q.liger_rope"].reads, ops["q.liger_rope"].kernels) == (2 * T * q, 1)  # in place, q and k in one
