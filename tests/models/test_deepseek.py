"""DeepSeek-V3/R1 and V2-Lite: parameter counts, active parameters, MTP and the MLA KV cache, each against a hand
derivation from the published config.json and the numbers DeepSeek published (exactness against transformers'
numel() on the meta device is in test_params_exact.py, which covers every catalog file).

Published figures used:
- DeepSeek-V3 README_WEIGHTS.md (github.com/deepseek-ai/DeepSeek-V3): main model 671B, 36.6B activated including
  0.9B for the output head; MTP module 11.5B unique parameters (embedding and head shared).
- DeepSeek-V2-Lite model card / DeepSeek-V2 paper (arXiv:2405.04434) appendix B: 15.7B total, 2.4B activated.
- DeepSeek-V2 paper §2.1.3 and Table 1: MLA caches (d_c + d_h^R)·l elements per token, with d_c = 4·d_h and
  d_h^R = d_h/2, "equal to GQA with only 2.25 groups".
"""
from __future__ import annotations

import pytest

from trainfit.analytic.inference import kv_bytes_per_token, kv_values_per_token_layer
from trainfit.analytic.params import count_params, mtp_params
from trainfit.errors import SetupError
from trainfit.models.hf_config import spec_from_config
from trainfit.models.resolve import load_model
from trainfit.setup import Setup

# DeepSeek-V3 config.json values, written out here so that the derivations below do not read the catalog
H, L, HEADS, VOCAB = 7168, 61, 128, 129280
Q_LORA, KV_LORA, NOPE, ROPE, V = 1536, 512, 128, 64, 128
DENSE_I, MOE_I, E, K, SHARED, DENSE_LAYERS = 18432, 2048, 256, 8, 1, 3


def _v3_attention() -> int:
    # q_a_proj + q_a_layernorm + q_b_proj; kv_a_proj_with_mqa + kv_a_layernorm + kv_b_proj; o_proj (no biases)
    return (H * Q_LORA + Q_LORA + Q_LORA * HEADS * (NOPE + ROPE)
            + H * (KV_LORA + ROPE) + KV_LORA + KV_LORA * HEADS * (NOPE + V)
            + HEADS * V * H)


def test_v3_total_and_active_by_hand():
    expert = 3 * H * MOE_I  # gate, up, down
    moe_layers = L - DENSE_LAYERS
    per_layer = _v3_attention() + 2 * H  # + input and post-attention RMSNorms
    embed = head = VOCAB * H
    total = (embed + L * per_layer + DENSE_LAYERS * 3 * H * DENSE_I
             + moe_layers * ((E + SHARED) * expert + E * H) + H + head)
    active = total - moe_layers * (E - K) * expert
    c = count_params(load_model("deepseek-v3"))
    assert (c.total, c.active) == (total, active) == (671_026_404_352, 37_552_282_624)
    # published: 671B; "36.6B activated (including 0.9B for the output head)", i.e. without the input embedding
    assert abs(c.total / 671e9 - 1) < 0.001
    assert abs((c.active - c.embedding) / 36.6e9 - 1) < 0.002


def test_r1_is_v3():
    assert count_params(load_model("deepseek-r1")).total == count_params(load_model("deepseek-v3")).total


def test_v3_mtp_module_by_hand():
    # one MTP module: enorm, hnorm, eh_proj (2h -> h), one MoE decoder layer, shared_head.norm
    layer = _v3_attention() + 2 * H + (E + SHARED) * 3 * H * MOE_I + E * H
    assert mtp_params(load_model("deepseek-v3")) == 2 * H + 2 * H * H + layer + H == 11_610_067_968
    assert abs(mtp_params(load_model("deepseek-v3")) / 11.5e9 - 1) < 0.01  # README_WEIGHTS: 11.5B unique
    # NB: main model + MTP + the checkpoint's copies of the embedding and head = 684.49B; the hub shows "685B" (its
    # FP8 weight_scale_inv tensors make up the rest; not checked here)


def test_v2_lite_published():
    c = count_params(load_model("deepseek-v2-lite"))
    assert abs(c.total / 15.7e9 - 1) < 0.001
    # 2.4B activated, without the input embedding as for V3: 2.45B here ("2.4B" is the rounded figure)
    assert abs((c.active - c.embedding) / 2.4e9 - 1) < 0.025
    assert mtp_params(load_model("deepseek-v2-lite")) == 0  # V2 has no MTP


def test_mla_kv_cache_per_token_matches_the_paper():
    spec = load_model("deepseek-v3")
    d_h = NOPE  # the paper's per-head width d_h = 128
    d_c, d_r = 4 * d_h, d_h // 2  # DeepSeek-V2 §2.1.4 / Table 1
    assert kv_values_per_token_layer(spec) == d_c + d_r == 2 * 2.25 * d_h == 576  # "GQA with 2.25 groups"
    # bf16 cache: 61 layers × 576 × 2 bytes = 70,272 bytes per token (vs 2 × 128 heads × 192 × 61 × 2 = 5.99 MB
    # had the decompressed per-head k and v been cached)
    bf16 = Setup(mode="infer", precision="bf16", batch=1, seq=1024)
    assert kv_bytes_per_token(spec, bf16) == L * 576 * 2 == 70_272
    # the latent is one "head": every TP rank keeps all of it (vLLM's MLA backends), pipeline stages split layers
    assert kv_bytes_per_token(spec, bf16.with_(tp=8)) == 70_272
    lite = load_model("deepseek-v2-lite")
    assert kv_bytes_per_token(lite, bf16) == 27 * (512 + 64) * 2


def test_mla_config_quirks():
    base = {"model_type": "deepseek_v2", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "vocab_size": 100, "max_position_embeddings": 64, "num_experts_per_tok": 2,
            "n_routed_experts": 4, "moe_intermediate_size": 16, "first_k_dense_replace": 1}
    assert spec_from_config(dict(base, q_lora_rank=None), "a").mla.q_lora_rank == 0  # null: plain q_proj
    assert spec_from_config(base, "b").mla.q_lora_rank == 1536  # absent: DeepseekV2Config's default
    assert spec_from_config(dict(base, first_k_dense_replace=2), "c").moe is None  # every layer dense
    assert spec_from_config(base, "d").moe.sparse_layers == 1


def test_analytic_training_of_mla_is_refused_under_eager_attention_only():
    """MLA's eager attention (matmul + softmax on q/k wider than v) is not measured: one-line refusal; sdpa answers."""
    from trainfit.analytic.engine import estimate
    spec = load_model("tiny-deepseek")
    with pytest.raises(SetupError, match="MLA.*eager"):
        estimate(spec, Setup(batch=1, seq=32, precision="fp32", device="cpu", attention="eager"))
    assert estimate(spec, Setup(batch=1, seq=32, precision="fp32", device="cpu")).memory.peak > 0


def test_the_estimates_parameters_hold_the_mtp_layers_the_ranks_hold():
    """On --stack megatron DeepSeek-V3 trains its num_nextn_predict_layers MTP module (analytic/mtp.py), which one
    rank holding the whole model counts: 'parameters per GPU' read 682.64 G against 'parameters' 671.03 G (the HF
    model's, without it). The estimate's parameters are the model's plus the hand-counted module above (--mtp-layers
    0: the model's alone), so one rank holds them all."""
    from trainfit.engines import analytic
    from trainfit.setup import Setup

    spec = load_model("deepseek-v3")
    e = analytic(spec, Setup(stack="megatron", seq=1024, precision="bf16-master"))
    assert e.params == count_params(spec).total + 11_610_067_968 == e.params_per_rank
    assert any("multi-token-prediction" in n for n in e.notes)
    assert analytic(spec, Setup(stack="megatron", seq=1024, precision="bf16-master", mtp_layers=0)).params == \
        count_params(spec).total
