"""MLA attention and DeepSeek's MoE block: the analytic saved bytes (analytic/mla.py, moe.py) against what a real CPU
step saves for backward, counted with torch.autograd.graph.saved_tensors_hooks on the transformers modules of
tiny-deepseek (V3: q_lora, sigmoid group-limited router) and tiny-deepseek-v2 (plain q_proj, softmax router).

Counted as the allocator sees them: each saved tensor's storage once (views of one output count once), parameters
left out (they are weights, not activations), those of graph branches the output does not reach (freed in the
forward) and the RoPE position tables too (computed once per step by the model,
shared by every layer: mla.py NB). The input is made by an op (not a leaf) so that autocast casts it per call, as
inside the model (autocast caches casts of leaves only, aten/src/ATen/autocast_mode.cpp cached_cast).
"""
from __future__ import annotations

import json
import weakref
from importlib import resources

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from trainfit.analytic import mla  # noqa: E402
from trainfit.analytic.activations import resolved_kernel  # noqa: E402
from trainfit.analytic.moe import moe_block  # noqa: E402
from trainfit.models.hf_config import spec_from_config  # noqa: E402
from trainfit.setup import Setup  # noqa: E402

B, S = 2, 64


def _model(name: str):
    from transformers import DeepseekV2Config, DeepseekV2ForCausalLM, DeepseekV3Config, DeepseekV3ForCausalLM
    cfg = json.loads(resources.files("trainfit.models.catalog").joinpath(f"{name}.json").read_text())
    spec = spec_from_config(cfg, name)
    kw = {k: v for k, v in cfg.items() if k not in ("_trainfit", "model_type")}
    v3 = cfg["model_type"] == "deepseek_v3"
    config = (DeepseekV3Config if v3 else DeepseekV2Config)(**kw)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return spec, (DeepseekV3ForCausalLM if v3 else DeepseekV2ForCausalLM)(config), v3


def _saved(model, fn, amp: bool, skip: tuple = ()) -> int:
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    params |= {t.untyped_storage().data_ptr() for t in skip}
    seen: list = []

    def pack(t):
        seen.append((weakref.ref(t), t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            out = fn()  # noqa: F841 (holds the graph, as the loss does until backward)
        # only what the output's graph still holds: a branch whose result is used as integers only (the router's
        # group selection) is freed in the forward, its saved tensors with it
        alive = {ptr: n for ref, ptr, n in seen if ref() is not None and ptr not in params}
    return sum(alive.values())


CASES = [(name, p) for name in ("tiny-deepseek", "tiny-deepseek-v2") for p in ("fp32", "amp-bf16")]


@pytest.mark.parametrize("name,precision", CASES)
def test_mla_attention_saved_bytes_match_a_real_cpu_step(name, precision):
    spec, model, v3 = _model(name)
    amp = precision == "amp-bf16"
    setup = Setup(batch=B, seq=S, precision=precision, device="cpu")
    assert resolved_kernel(spec, setup) == "math"  # q/k head 24 wide, v 16: no CPU flash kernel
    leaf = torch.randn(B, S, spec.hidden, requires_grad=True)
    x = leaf * 1.0  # not a leaf: autocast casts it for each linear
    pe = model.model.rotary_emb(x, torch.arange(S)[None])
    tables = tuple(pe) if v3 else (pe,)
    attn = model.model.layers[1].self_attn
    measured = _saved(model, lambda: attn(x, position_embeddings=pe if not v3 else tuple(pe), attention_mask=None),
                      amp, skip=tables)
    a = 2 if amp else 4
    core, per_key = mla.math_saved(spec, a)
    # the input: kept once by both down-projections in fp32, cast per call under autocast
    inputs = (mla.input_calls(spec) if amp else 1) * a * spec.hidden
    per_token = inputs + mla.projections_saved(spec, a) + core + per_key * S
    fixed = a * mla.linear_params(spec) if amp else 0  # autocast's cached weight casts
    assert measured == per_token * B * S + fixed


@pytest.mark.parametrize("name,precision", CASES)
def test_deepseek_moe_saved_bytes_match_a_real_cpu_step(name, precision):
    spec, model, _ = _model(name)
    amp = precision == "amp-bf16"
    setup = Setup(batch=B, seq=S, precision=precision, device="cpu")
    leaf = torch.randn(B, S, spec.hidden, requires_grad=True)
    x = leaf * 1.0
    block = model.model.layers[1].mlp
    measured = _saved(model, lambda: block(x), amp)
    terms, fixed = moe_block(spec, setup)
    assert measured == (terms["linear_inputs"] + terms["mlp"]) * B * S + fixed


def test_the_hand_count_of_one_v3_mla_layer_in_fp32():
    """tiny-deepseek (h 64, 4 heads, q_lora 48, kv_lora 32, nope 16, rope 8, v 16) per token in fp32, from the
    module code: input 64·4; q_a_layernorm: input 48·4 + rsqrt 4 + normalised 48·4, q_b_proj's input 48·4;
    kv_a_layernorm: the (32 + 8)-wide kv_a output 40·4 + rsqrt 4 + normalised 32·4, kv_b_proj's input 32·4;
    math SDPA: scaled q and k 4·24·4 each, v 4·16·4; o_proj's input 4·16·4; probabilities 4 heads·4 per key."""
    spec, _, _ = _model("tiny-deepseek")
    core, per_key = mla.math_saved(spec, 4)
    hand = 256 + (192 + 4 + 192 + 192) + (160 + 4 + 128 + 128) + (384 + 384 + 256) + 256
    assert 64 * 4 + mla.projections_saved(spec, 4) + core == hand
    assert per_key == 16
