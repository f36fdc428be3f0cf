"""--mode rl's generate and score phases timed op by op (analytic/rl.py generate_seconds, score_seconds): no flat
utilisation; --mfu names the training step only."""
import pytest

from trainfit.api import Request, analytic

# qwen2.5-7b's config.json (Qwen/Qwen2.5-7B): 28 layers, 4 key-value heads of 128; 7,615,616,512 parameters
# (tests/analytic/test_rl.py derives them)
PARAMS, LAYERS, KV_HEADS, HEAD_DIM = 7_615_616_512, 28, 4, 128
H100_BANDWIDTH = 3.35e12  # H100 SXM5 80GB HBM3, NVIDIA's datasheet: 3.35 TB/s


def test_vllm_rollout_decode_streams_the_weights_and_the_cache():
    # 8 completions of 1024 + 4096 tokens in one llm.generate call: 4095 decode steps of the whole batch, each
    # reading the bf16 weights once and every sequence's K and V at the mean context 1024 + 2048 (bf16). By hand,
    # at the datasheet's bandwidth: (15.23 GB + 8 × 3072 × 57,344 B) / 3.35 TB/s = 4.97 ms a step, 20.3 s in all;
    # the model reads at the streaming bandwidth HBM reaches (below the datasheet's) and adds the prefill, the
    # sampler and the step's small kernels: within 15 % above
    e = analytic(Request(model="qwen2.5-7b", mode="rl", group_size=8, prompt_len=1024, completion_len=4096,
                         gpu="H100-80GB", rollout="vllm", grad_accum=8, recompute="full"))
    kv_token = LAYERS * 2 * KV_HEADS * HEAD_DIM * 2
    hand = 4095 * (PARAMS * 2 + 8 * (1024 + 2048) * kv_token) / H100_BANDWIDTH
    assert 1.0 < e.detail.rl.phase_seconds["generate"] / hand < 1.15


def test_mfu_names_the_training_step_only():
    base = dict(model="qwen2.5-0.5b", mode="rl", group_size=4, batch=2, prompt_len=64, completion_len=32,
                gpu="H100-80GB", rollout="vllm")
    op, flat = analytic(Request(**base)), analytic(Request(mfu=0.25, **base))
    a, b = op.detail.rl.phase_seconds, flat.detail.rl.phase_seconds
    assert a["generate"] == b["generate"] and a["score"] == b["score"] > 0
    # the step's FLOPs (forward + backward, no recompute) at a quarter of the H100's 989 dense bf16 TFLOP/s:
    # 6 × parameters × tokens by hand (qwen2.5-0.5b: 494,032,768 parameters; 8 sequences of 96 tokens), within the
    # short sequences' attention share (and the loss's head-only chunked log-prob pass, the tied head counted once)
    hand = 6 * 494_032_768 * 8 * 96 / (0.25 * 989e12)
    assert b["train"] == pytest.approx(hand, rel=0.05) and b["train"] != a["train"]


def test_hf_rollout_small_batch_is_host_bound():
    # transformers' generate is eager: at 2 completions of a 0.5B model every decode step is its kernels' issue
    # from the host, not the GPU's work; the same steps in vLLM's CUDA graphs replay without it
    base = dict(model="qwen2.5-0.5b", mode="rl", group_size=2, batch=1, prompt_len=64, completion_len=64,
                gpu="H100-80GB", precision="bf16")
    hf, v = analytic(Request(**base)), analytic(Request(rollout="vllm", **base))
    assert hf.detail.rl.phase_seconds["generate"] > 5 * v.detail.rl.phase_seconds["generate"]
