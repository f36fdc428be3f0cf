"""MLA's KV cache in the analytic inference model against the trace of transformers' own generate: the trace records
the tensors DynamicCache holds (DeepseekV2/V3 cache the latent c^KV and the shared RoPE key, modeling_deepseek_v3.py
`past_key_values.update(kv_nope, k_rot)`), so equality checks both the per-token width and the cache dtype."""
from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from trainfit.analytic.inference import infer_memory, values_keep_their_dtype  # noqa: E402
from trainfit.models.resolve import load_model  # noqa: E402
from trainfit.setup import Setup  # noqa: E402
from trainfit.trace import trace_spec  # noqa: E402


@pytest.mark.parametrize("name", ["tiny-deepseek", "tiny-deepseek-v2"])
@pytest.mark.parametrize("precision", ["bf16", "amp-bf16"])
def test_mla_kv_cache_equals_the_trace(name, precision):
    spec = load_model(name)
    setup = Setup(mode="infer", batch=2, seq=64, precision=precision, device="cpu")
    traced = trace_spec(spec, setup, flops=False).memory
    assert traced.peak_phase == "prefill"
    # 3 layers x (kv_lora_rank 32 + qk_rope_head_dim 8) x 128 tokens x 2 bytes (bf16; amp: fp32, rotary promotes
    # -- but V2's complex rotary keeps k^R in bf16, which the cache keeps as its own dtype from transformers 5.24)
    rope = 2 if precision == "bf16" or (name == "tiny-deepseek-v2" and values_keep_their_dtype()) else 4
    expected = 3 * 2 * 64 * (32 * (2 if precision == "bf16" else 4) + 8 * rope)
    assert traced.at_peak["kv_cache"] == infer_memory(spec, setup).kv_cache == expected
