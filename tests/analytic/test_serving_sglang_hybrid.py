"""--mode serve --server sglang for hybrid models (analytic/serving_sglang_hybrid.py): the Mamba state pool of Qwen3-Next
and Nemotron-H, the full + SWA pools of gpt-oss. Truth: hand derivations from SGLang 0.5.23's source (the wheel's
sglang/srt/...), step by step with file:line, from the bytes the weights leave in the static fraction
(pre x mem_fraction_static − weights: tested in test_serving_sglang.py)."""
from __future__ import annotations

import pytest

from trainfit.analytic import serving_sglang as sg
from trainfit.hardware import get_gpu
from trainfit.models.resolve import load_model
from trainfit.setup import Setup


def _sgl(**kw) -> Setup:
    return Setup(mode="serve", server="sglang", **{"precision": "bf16", **kw})


def _running(tokens: int, context: int, state_slots: int | None) -> int:
    """kv_cache_configurator.py:3119-3150 resolve_max_num_reqs: min(max(min(tokens / context x 512, 4096), 2048),
    tokens // 2), capped at max_mamba_cache_size // (3 + 2) (3 slots per request, :227; the extra_buffer strategy's 2
    tracking slots, allocation_sizing.py:11-19, which "auto" picks under the overlap scheduler: overrides.py:477-486)."""
    running = min(max(min(int(tokens / context * 512), 4096), 2048), tokens // 2)
    return running if state_slots is None else min(running, state_slots // 5)


@pytest.mark.parametrize("name,gpu,tp,state_layers,conv,ssm,attention,kv_heads,head_dim", [
    # Qwen3-Next-80B-A3B on 2 H200s: 36 GDN layers, conv (2 x 16 x 128 + 32 x 128) / 2 channels x 3 taps,
    # SSM 32 / 2 value heads x 128 x 128 (configs/qwen3_next.py:288-313); 12 attention layers, 2 kv heads / 2 x 256
    ("qwen3-next-80b-a3b", "H200", 2, 36, (2 * 16 * 128 + 32 * 128) // 2 * 3, 32 // 2 * 128 * 128, 12, 1, 256),
    # Nemotron-H-8B on one H100: 24 Mamba-2 blocks, conv (128 x 64 + 2 x 8 x 128) x 3, SSM 128 x 64 x 128
    # (configs/nemotron_h.py:425-439); 4 attention blocks, 8 kv heads x 128
    ("nemotron-h-8b", "H100-80GB", 1, 24, (128 * 64 + 2 * 8 * 128) * 3, 128 * 64 * 128, 4, 8, 128),
])
def test_mamba_state_pool_by_hand(name, gpu, tp, state_layers, conv, ssm, attention, kv_heads, head_dim):
    spec = load_model(name)
    sv = sg.serve_memory(spec, _sgl(tp=tp), get_gpu(gpu))
    rest = sv.requested - sv.weights  # pre x mem_fraction_static − weights (_profile_available_bytes)
    # per request (configs/mamba_utils.py:114-126): conv in bf16 (environ.py:1628), SSM in fp32 (mamba_utils.py:71)
    per_req = state_layers * (conv * 2 + ssm * 4)
    # _handle_max_mamba_cache (kv_cache_configurator.py:3345-3389): budget = rest x 0.9 / 1.9, K = (budget − per) //
    # per; the pool keeps K + 1 slots (:3405-3411)
    slots = int((rest * 0.9 / 1.9 - per_req) // per_req)
    rest -= (slots + 1) * per_req
    # the token pool holds the attention layers only (pool_configurator.py:229-239): kv heads x (k + v) x bf16
    cell = kv_heads * 2 * head_dim * 2 * attention
    tokens = int(rest // cell)  # page 1 (pool_configurator.py:637-647)
    assert (sv.state_bytes, sv.state_slots, sv.kv_bytes_per_token) == (per_req, slots, cell)
    assert sv.kv_tokens == tokens
    assert sv.max_running_requests == _running(tokens, sv.knobs.context_length, slots)


def test_gpt_oss_full_and_swa_pools_by_hand():
    """gpt-oss-120b on 4 H100s (bf16 weights): GptOssForCausalLM is a hybrid-SWA architecture
    (configs/model_config.py:88-90, 2651-2697): 18 full + 18 sliding layers (layer_types), 2 kv heads per rank x
    (64 + 64) x 2 B per layer and token. HybridSWAPoolConfigurator (pool_configurator.py:786-803, 859-893):
    cell = per_token x 18 + 0.8 x per_token x 18; full tokens = rest // cell; SWA tokens = int(full x 0.8)."""
    sv = sg.serve_memory(load_model("gpt-oss-120b"), _sgl(tp=4), get_gpu("H100-80GB"))
    rest = sv.requested - sv.weights
    per_token = 2 * (64 + 64) * 2
    cell = per_token * 18 + 0.8 * per_token * 18
    full = int(rest // cell)
    assert (sv.kv_tokens, sv.swa_tokens) == (full, int(full * 0.8))
    assert sv.kv_pool == (full + int(full * 0.8)) * 18 * per_token
    assert sv.max_running_requests == _running(full, 131072, None)


def test_gemma3_keeps_every_layer_in_one_pool():
    """Gemma 3 is not a hybrid-SWA architecture in SGLang 0.5.23 (is_hybrid_swa_model lists neither Gemma 2 nor 3):
    every layer's tokens in one pool, 62 layers x 16 kv heads x (128 + 128) x 2 B per token."""
    sv = sg.serve_memory(load_model("gemma-3-27b-text"), _sgl(), get_gpu("H100-80GB"))
    assert sv.kv_bytes_per_token == 62 * 16 * 256 * 2 and sv.swa_tokens == 0
