"""--mode serve --server vllm for the families whose cache is not one K/V page per token per layer: linear-attention
and Mamba hybrids (Qwen3-Next, Nemotron-H), sliding-window (Gemma 3, gpt-oss) and chunked local attention (Llama 4).

Truth: hand derivations from vLLM 0.33.0's allocator code (the wheel's vllm/...), step by step with file:line. The
available bytes are the profile-run model's (tested in test_serving.py); from them on, every number is derived here:
the block size, the page, the layer groups, the blocks, the blocks a request holds, the "GPU KV cache size: N tokens"
and "Maximum concurrency" lines (v1/core/kv_cache_utils.py:1061-1147).

Published start-up logs, for validation only (never a gate): vllm-project/vllm#26646 (Qwen3-Next, an Oct 2025 vLLM,
GPU, TP and dtypes not given) logs "GPU KV cache size: 90,048 tokens / Maximum concurrency for 215,040 tokens per
request: 1.66x" — an older version whose token count is not concurrency × max_model_len, so not comparable here; no
Nemotron-H log line with its setup was found."""
from __future__ import annotations

import math

import pytest

from trainfit.analytic.params import count_params
from trainfit.analytic.serving import serve_memory, weights_per_gpu
from trainfit.analytic.serving_state import hybrid_block_size, state_blocks_per_request
from trainfit.errors import SetupError
from trainfit.hardware import get_gpu
from trainfit.models.resolve import load_model
from trainfit.setup import Setup


def _serve(**kw) -> Setup:
    return Setup(mode="serve", **{"precision": "bf16", **kw})


def _capacity(sv, bytes_per_block: int, per_request: int, max_model_len: int):
    """kv_cache_planning.py:681 num_blocks = available // bytes_per_block; kv_cache_utils.py:1061-1097 concurrency =
    num_blocks / the blocks one request holds over every group; :1120-1127 tokens = int(concurrency × max_model_len)."""
    blocks = int(sv.available_kv // bytes_per_block)
    concurrency = blocks / per_request
    return blocks, int(concurrency * max_model_len), concurrency


def test_qwen3_next_h200_tp2_by_hand():
    """Qwen3-Next-80B-A3B on 2 H200s (bf16, `vllm serve` defaults: prefix caching on, 8,192 batched tokens, the
    model's 262,144 positions)."""
    spec, gpu, setup = load_model("qwen3-next-80b-a3b"), get_gpu("H200"), _serve(tp=2)
    sv = serve_memory(spec, setup, gpu)
    L = 262144
    assert sv.knobs.max_model_len == L
    # layers: full_attention_interval 4 -> 12 of 48 attention (FullAttentionSpec), 36 Gated DeltaNet (MambaSpec)
    # page1 (platforms/interface.py:1032-1042 FullAttentionSpec block_size 1): 2 (k, v) x 2 kv heads / tp 2 x 256 x 2 B
    page1 = 2 * (2 // 2) * 256 * 2
    # state page (mamba_utils.py:272-294): conv (2 x 16 x 128 + 32 x 128) / tp 2 channels x (kernel 4 - 1) in bf16;
    # recurrent 32 value heads / tp 2 x 128 x 128 in bf16 (_mamba_state_dtype :98-111: "auto" -> the conv's dtype)
    conv = (2 * 16 * 128 + 32 * 128) // 2 * (4 - 1) * 2
    recurrent = 32 // 2 * 128 * 128 * 2
    assert (conv, recurrent) == (24576, 524288)
    # alignment (interface.py:1067-1095): max(16, --block-size 16), lcm with FlashInfer's GDN checkpoint alignment 64
    # (Hopper: qwen_gdn_linear_attn.py:248-249, :689-702; gdn_attn.py:34) under prefix caching's "align" mode
    align = math.lcm(16, 64)
    block = align * math.ceil((conv + recurrent) / (align * page1))  # interface.py:1096-1112
    assert block == 576 and sv.knobs.block_size == block
    # groups (kv_cache_planning.py:521-536): smallest bucket 12, 36 >= 1.5 x 12 -> size 12: 1 full + 3 state groups;
    # bytes per block (:574-605): 12 pages of block x page1 (the state page padded up to it: interface.py:1117-1131)
    bytes_per_block = 12 * block * page1
    # per request: the full group ceil(L / block); each state group 2 + 1 prefill-checkpoint blocks ("align":
    # kv_cache_interface.py:1135-1141; qwen_gdn_linear_attn.py:739-750)
    per_request = math.ceil(L / block) + 3 * (2 + 1)
    assert per_request == 456 + 9 == sv.blocks_per_request
    blocks, tokens, concurrency = _capacity(sv, bytes_per_block, per_request, L)
    assert (sv.kv_blocks, sv.kv_tokens) == (blocks, tokens)
    assert sv.max_concurrent_sequences == pytest.approx(concurrency)
    assert sv.kv_pool == blocks * bytes_per_block
    assert sv.state_bytes == 36 * (conv + recurrent)
    assert 4e6 < sv.kv_tokens < 6e6  # the pool holds millions of tokens: only 12 of 48 layers grow with them


def test_qwen3_next_without_prefix_caching_by_hand():
    """--no-enable-prefix-caching ("none" mode, MambaModelConfig model_executor/models/config.py:777-785): no
    checkpoint alignment, so block = 16 x ceil(548,864 / (16 x 1,024)) = 544, and one state block per group
    (kv_cache_interface.py:1141)."""
    spec, gpu, setup = load_model("qwen3-next-80b-a3b"), get_gpu("H200"), _serve(tp=2)
    assert hybrid_block_size(spec, setup, gpu, "bf16", "bf16", prefix_caching=False) == 16 * math.ceil(548864 / 16384)
    assert state_blocks_per_request(spec, gpu, prefix_caching=False) == 1
    # on an A100 (Triton/FLA prefill, no checkpoints) prefix caching keeps alignment 16 and 2 state blocks
    assert hybrid_block_size(spec, setup, get_gpu("A100-80GB"), "bf16", "bf16") == 544
    assert state_blocks_per_request(spec, get_gpu("A100-80GB")) == 2


@pytest.mark.parametrize("name,L,inner,mamba,attention,per_request", [
    # Nemotron-H-8B: pattern of 24 Mamba-2 (M), 4 attention (*), 24 MLP (-) blocks; 128 heads x 64; 8,192 positions
    ("nemotron-h-8b", 8192, 128 * 64, 24, 4, 8 + 6 * 3),
    # Nemotron-Nano-9B-v2: 27 M, 4 *, 25 -; 128 heads x 80; 131,072 positions: ceil(27 / 4) = 7 state groups (padded)
    ("nemotron-nano-9b-v2", 131072, 128 * 80, 27, 4, 100 + 7 * 3),
])
def test_nemotron_h_h100_by_hand(name, L, inner, mamba, attention, per_request):
    """Nemotron-H on one H100 (bf16, defaults: prefix caching on)."""
    spec = load_model(name)
    sv = serve_memory(spec, _serve(), get_gpu("H100-80GB"))
    assert sv.knobs.max_model_len == L
    page1 = 2 * 8 * 128 * 2  # k and v: 8 kv heads x 128 x bf16
    # state page (mamba_utils.py:186-212): conv (inner + 2 x 8 groups x 128 state) channels x (4 - 1) in bf16; SSM
    # 128 heads x head_dim x 128 in fp32 (NemotronHForCausalLMConfig, model_executor/models/config.py:812-835)
    state = (inner + 2 * 8 * 128) * 3 * 2 + inner * 128 * 4
    # alignment 16: MambaMixer2 declares no prefill-checkpoint alignment (abstract.py:65-70, :98-113)
    block = 16 * math.ceil(state / (16 * page1))
    assert sv.knobs.block_size == block
    # groups: 4 attention blocks (the smallest bucket) -> size 4, ceil(mamba / 4) state groups; the MLP blocks hold
    # nothing; per request ceil(L / block) + 3 per state group (align: 2 + MambaMixer2's checkpoint block,
    # mamba_mixer2.py:1108-1118)
    assert per_request == math.ceil(L / block) + math.ceil(mamba / attention) * 3 == sv.blocks_per_request
    blocks, tokens, concurrency = _capacity(sv, attention * block * page1, per_request, L)
    assert (sv.kv_blocks, sv.kv_tokens) == (blocks, tokens)
    assert sv.max_concurrent_sequences == pytest.approx(concurrency)
    assert sv.state_bytes == mamba * state


def test_gemma3_27b_five_local_per_global_by_hand():
    """Gemma-3-27B on one H100: 62 layers, layer i sliding unless (i + 1) % 6 == 0 -> 52 sliding (window 1,024), 10
    full; 16 kv heads x 128. Groups of 10: 1 full + ceil(52 / 10) = 6 sliding (8 padding layers); a block is 16
    tokens of 10 layers' k and v. A 131,072-token request holds 8,192 full blocks + 6 x (ceil(min(1023 + 2 x 8192,
    131072) / 16) + 1) (SlidingWindowSpec.max_admission_blocks_per_request, kv_cache_interface.py:918-944; two batches
    in flight, config/vllm.py:590-609)."""
    sv = serve_memory(load_model("gemma-3-27b-text"), _serve(), get_gpu("H100-80GB"))
    L, page = 131072, 16 * 2 * 16 * 128 * 2
    per_request = L // 16 + 6 * (math.ceil((1023 + 2 * 8192) / 16) + 1)
    assert per_request == 8192 + 6 * 1089 == sv.blocks_per_request
    blocks, tokens, concurrency = _capacity(sv, 10 * page, per_request, L)
    assert (sv.kv_blocks, sv.kv_tokens) == (blocks, tokens)
    assert sv.max_concurrent_sequences == pytest.approx(concurrency)


def test_gpt_oss_120b_sinks_hold_no_cache_by_hand():
    """gpt-oss-120b on 4 H100s (bf16 weights): 18 sliding (window 128) + 18 full layers, 8 kv heads / 4 x 64; its
    attention sinks are a per-head parameter (gpt_oss.py:131), no cache. Two groups of 18; a block 16 tokens of 18
    layers; a request 8,192 full blocks + ceil((127 + 2 x 8192) / 16) + 1 = 1,033 sliding blocks."""
    sv = serve_memory(load_model("gpt-oss-120b"), _serve(tp=4), get_gpu("H100-80GB"))
    L, page = 131072, 16 * 2 * (8 // 4) * 64 * 2
    per_request = L // 16 + math.ceil((127 + 2 * 8192) / 16) + 1
    assert per_request == 9225 == sv.blocks_per_request
    blocks, tokens, _ = _capacity(sv, 18 * page, per_request, L)
    assert (sv.kv_blocks, sv.kv_tokens) == (blocks, tokens)


def test_llama4_chunked_local_attention_by_hand():
    """Llama-4-Scout on 4 H200s: 36 RoPE layers of chunked local attention (chunk 8,192: ChunkedLocalAttention,
    llama4.py:251-263) + 12 NoPE full layers, 8 kv heads / 4 x 128. Groups of 12: 1 full + 3 chunked; a request of
    262,144 tokens holds 16,384 full blocks + 3 x ceil(min(8192 + 2 x 8192, 262144) / 16) chunked blocks
    (ChunkedLocalAttentionSpec.max_admission_blocks_per_request, kv_cache_interface.py:864-881: no + 1)."""
    sv = serve_memory(load_model("llama-4-scout"), _serve(tp=4), get_gpu("H200"))
    L, page = 262144, 16 * 2 * (8 // 4) * 128 * 2
    per_request = L // 16 + 3 * math.ceil((8192 + 2 * 8192) / 16)
    assert per_request == 16384 + 3 * 1536 == sv.blocks_per_request
    blocks, tokens, _ = _capacity(sv, 12 * page, per_request, L)
    assert (sv.kv_blocks, sv.kv_tokens) == (blocks, tokens)


@pytest.mark.parametrize("name", ["nemotron-h-8b", "qwen3-next-80b-a3b"])
def test_hybrid_weights_at_tp1_are_every_parameter(name):
    """At TP 1 every parameter is on the GPU once: the weights are the parameter count (tests/models: transformers'
    numel) x 2 B, plus the rotary cos/sin cache (262,144 positions x 64 rotary dims x 2 B for Qwen3-Next, whose
    partial_rotary_factor is 0.25 of 256; Nemotron-H has no positions); both vocabularies are multiples of 64."""
    spec = load_model(name)
    rope = 262144 * 64 * 2 if spec.positions == "rotary" else 0
    assert weights_per_gpu(spec, _serve(), count_params(spec)) == 2 * count_params(spec).total + rope


def test_serve_mode_sizes_hybrids():
    """--mode serve answers for a Mamba-2 hybrid (and so does --mode infer with --gpu: the scan's kernels are in the
    op list, analytic/ops/mamba2.py); a pipeline split of its pools is refused in one line."""
    from trainfit.analytic.engine import estimate

    spec, gpu = load_model("nemotron-h-8b"), get_gpu("H100-80GB")
    est = estimate(spec, _serve(), gpu)
    assert est.detail.serving.kv_tokens > 0 and est.time.fits
    assert estimate(spec, Setup(mode="infer", precision="bf16", batch=1, seq=128), gpu).time.decode_tokens_per_second > 0
    with pytest.raises(SetupError, match="pipeline"):
        serve_memory(spec, _serve(pp=2), gpu)
