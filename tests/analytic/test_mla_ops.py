"""Step time of MLA: the op list counts MLA's GEMMs (down/up projections, o_proj over heads·v) and its attention
with a q/k head width unlike v's — hand-counted FLOPs for one layer of tiny-deepseek."""
from __future__ import annotations

from trainfit.analytic.ops import Shape, layer_forward
from trainfit.models.resolve import load_model


def test_one_tiny_deepseek_layer_forward_flops_by_hand():
    # tiny-deepseek.json: h 64, 4 heads, q_lora 48, kv_lora 32, qk_nope 16, qk_rope 8, v 16, dense MLP 128 wide
    spec = load_model("tiny-deepseek")
    T = 32  # batch 1 x 32 tokens
    macs_per_token = (64 * 48          # q_a_proj: h -> q_lora
                      + 48 * 4 * 24    # q_b_proj: q_lora -> heads x (nope + rope)
                      + 64 * (32 + 8)  # kv_a_proj_with_mqa: h -> kv_lora + rope
                      + 32 * 4 * 32    # kv_b_proj: kv_lora -> heads x (nope + v)
                      + 4 * 16 * 64    # o_proj: heads x v -> h
                      + 3 * 64 * 128)  # gate, up, down of the dense MLP (layer 0 < first_k_dense_replace)
    # causal attention: query i sees i + 1 keys, 16.5 on average; q.k^T contracts 24 (nope + rope), p.v 16 (v),
    # 2 FLOPs per multiply-add, 4 heads
    attention = 4 * T * 16.5 * 2 * (24 + 16)
    ops = layer_forward(spec, Shape(batch=1, seq=T, dtype="fp32", act=4, residual=4, weight=4, grad=4), moe=False)
    gemm = sum(o.flops for o in ops if o.kind == "gemm")
    attn = sum(o.flops for o in ops if o.kind == "attention")
    assert gemm == 2 * T * macs_per_token
    assert attn == attention
    names = [o.name for o in ops if o.kind == "gemm"]
    assert names == ["q_a", "q_b", "kv_a", "kv_b", "o", "gate", "up", "down"]


def test_v2_lite_style_plain_q_proj_and_tensor_parallel_up_projections():
    """No q_lora_rank: q_proj h -> heads x 24; under TP 2 the up-projections and o_proj split, kv_a stays whole."""
    spec = load_model("tiny-deepseek-v2")
    ops = {o.name: o for o in layer_forward(spec, Shape(batch=1, seq=8, tp=2), moe=False) if o.kind == "gemm"}
    assert (ops["q"].n, ops["q"].k) == (4 * 24 / 2, 64)
    assert (ops["kv_a"].n, ops["kv_a"].k) == (32 + 8, 64)
    assert (ops["kv_b"].n, ops["kv_b"].k) == (4 * 32 / 2, 32)
    assert (ops["o"].n, ops["o"].k) == (64, 4 * 16 / 2)


def test_model_flops_count_mla_attention_with_its_two_head_widths():
    """flops.py's attention core per token for tiny-deepseek at 32 tokens: 3 layers x 4 heads x 16.5 keys x
    2 x (24 + 16) — the same hand count as the op list's."""
    from trainfit.analytic.flops import attention_flops_per_token
    assert attention_flops_per_token(load_model("tiny-deepseek"), 32) == 3 * 4 * 16.5 * 2 * (24 + 16)
