"""`--stack torchtitan` in the analytic engine against independent sources: hand counts of the tensors torchtitan's
code keeps (its per-op SAC save list, FSDP2's per-group bf16 all-gathers, torch.rms_norm's saved tensors) and the
published torchtitan run of shared/calibration.md C2 as a bound.

The small model is torchtitan's Llama3 block at test size: dim 256, 8 heads / 2 KV heads (head_dim 32), FFN 768,
vocabulary 1000, 2 layers, untied, no biases.
"""
from __future__ import annotations

from dataclasses import replace

import pytest

from trainfit.analytic.engine import estimate
from trainfit.models.hf_config import spec_from_config
from trainfit.models.resolve import load_model
from trainfit.setup import Setup

H, HEADS, KV_HEADS, FFN, VOCAB, LAYERS = 256, 8, 2, 768, 1000, 2
HEAD_DIM = H // HEADS
Q, KV = H, KV_HEADS * HEAD_DIM
BATCH, SEQ = 2, 64
T = BATCH * SEQ
BF16, FP32 = 2, 4
GIB = 2**30


@pytest.fixture(scope="module")
def small():
    return spec_from_config({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": H, "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS, "num_hidden_layers": LAYERS, "intermediate_size": FFN,
        "vocab_size": VOCAB, "max_position_embeddings": 1024, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
        "hidden_act": "silu"}, "small-llama")


def tt(**kw) -> Setup:
    return Setup(stack="torchtitan", batch=BATCH, seq=SEQ, **kw)


# -- per-op SAC ------------------------------------------------------------------------------------------------
# torchtitan/models/llama3/model/model.py: Attention.forward runs wq, wk, wv, then wo; FeedForward.forward
# w2(silu(w1(x)) * w3(x)): w1, w3, w2. Seven bias-free nn.Linear on a 3-D input, each one aten.mm.
BLOCK_MMS = [("wq", Q), ("wk", KV), ("wv", KV), ("wo", H), ("w1", FFN), ("w3", FFN), ("w2", H)]
# torchtitan/distributed/activation_checkpoint.py:110-116: the mm count starts at 1 in each block; an even count is
# recomputed, so the 1st, 3rd, 5th and 7th are saved: wq, wv, w1, w2 (by hand, from the list above)
SAVED_MMS = ["wq", "wv", "w1", "w2"]


def hand_op_sac_stored(residual_bytes: int) -> int:
    """One block's stored bytes under torchtitan's op SAC, counted tensor by tensor."""
    per_token = residual_bytes * H  # the block's input, held by the checkpoint
    per_token += sum(BF16 * out for name, out in BLOCK_MMS if name in SAVED_MMS)  # saved mm outputs (bf16)
    per_token += BF16 * Q + FP32 * HEADS  # the flash SDPA's outputs: attention output and its fp32 logsumexp
    return per_token * T


def test_op_sac_stores_every_second_matmul_and_the_attention_output(small):
    # FSDP2 mixed precision (dp 2, ZeRO-3): bf16 residual stream
    e = estimate(small, tt(recompute="op", dp=2, zero=3))
    assert e.detail.records["activation_per_layer"] == hand_op_sac_stored(BF16) == (512 + 2688 + 544) * T
    # without FSDP torchtitan runs torch.autocast: the residual stream (the block input) stays fp32
    e1 = estimate(small, tt(recompute="op"))
    assert e1.detail.records["activation_per_layer"] == hand_op_sac_stored(FP32)


def test_selective_means_op_for_torchtitan(small):
    assert Setup(stack="torchtitan", recompute="selective").recompute == "op"
    a = estimate(small, tt(recompute="selective", dp=2, zero=3)).memory
    b = estimate(small, tt(recompute="op", dp=2, zero=3)).memory
    assert a == b


def test_op_sac_recomputes_the_unsaved_matmuls(small):
    # in backward each block re-runs wk, wo and w3 (the stored outputs are replayed; elementwise ops cost no FLOPs
    # in trainfit's count): 2 FLOPs per multiply-add
    e = estimate(small, tt(recompute="op", dp=2, zero=3))
    recomputed = sum(2 * out * (FFN if name == "w2" else Q if name == "wo" else H)
                     for name, out in BLOCK_MMS if name not in SAVED_MMS)
    assert recomputed == 2 * (H * KV + Q * H + H * FFN)
    assert e.flops.recompute == LAYERS * T * recomputed


def test_layer_n_checkpoints_every_nth_block(small):
    none, full = (estimate(small, tt(recompute=r)) for r in ("none", "full"))
    layer1, layer2, layer9 = (estimate(small, tt(recompute=r)) for r in ("layer:1", "layer:2", "layer:9"))
    assert layer1.memory == full.memory  # every block's count is a multiple of 1
    assert layer9.memory == none.memory  # no block of 2 reaches count 9
    # layer:2 on 2 blocks: the second block (count 2) is checkpointed whole, the first saves everything
    per_none, per_full = none.detail.records["activation_per_layer"], full.detail.records["activation_per_layer"]
    assert layer2.memory.activations - none.memory.activations == per_full - per_none
    assert layer2.flops.recompute == full.flops.recompute / 2


# -- norms -----------------------------------------------------------------------------------------------------
def test_norm_saved_bytes_follow_the_stack_norm_fact(small):
    # hf: LlamaRMSNorm keeps the fp32 input, rsqrt (one fp32 per token) and the normalised tensor (here fp32: the
    # residual stream is fp32 under autocast); torchtitan: aten._fused_rms_norm keeps the input and rstd
    # (derivatives.yaml `_fused_rms_norm`: input, result1). Two norms per block.
    hf = estimate(small, Setup(batch=BATCH, seq=SEQ)).detail.records["activation_terms_per_token"]["norms"]
    titan = estimate(small, tt()).detail.records["activation_terms_per_token"]["norms"]
    titan_fsdp = estimate(small, tt(dp=2, zero=3)).detail.records["activation_terms_per_token"]["norms"]
    assert hf == 2 * (FP32 * H + FP32 + FP32 * H)
    assert titan == 2 * (FP32 * H + FP32)
    assert titan_fsdp == 2 * (BF16 * H + FP32)  # FSDP2: bf16 residual stream


# -- FSDP2 mixed precision -------------------------------------------------------------------------------------
def block_params() -> int:
    return H * (Q + 2 * KV) + Q * H + 3 * H * FFN + 2 * H  # wq wk wv, wo, w1 w2 w3, two norm weights


def test_fsdp2_keeps_fp32_shards_and_no_autocast_casts(small):
    n = VOCAB * H * 2 + LAYERS * block_params() + H  # embedding, output, blocks, final norm
    e = estimate(small, tt(dp=2, zero=3))
    m = e.memory
    assert e.params == n
    # sharded fp32 parameters, fp32 gradients and AdamW's two fp32 states (ZeRO-3: 16Ψ/dp)
    assert (m.weights, m.gradients, m.optimizer_states) == (FP32 * n / 2, FP32 * n / 2, 2 * FP32 * n / 2)
    assert e.detail.records["autocast_weight_copies_per_layer"] == 0  # compute runs on the gathered bf16 copies
    assert estimate(small, tt()).detail.records["autocast_weight_copies_per_layer"] > 0  # one GPU: torch.autocast


def test_fsdp2_gathers_groups_in_bf16(small):
    # at the loss only [norm, output] is unsharded (reshard_after_forward=False for that group; the blocks and the
    # embedding were resharded, the root's post-forward freed the last all-gather output): 2 bytes × its params
    e = estimate(small, tt(dp=2, zero=3))
    m = e.memory
    head_group = H + VOCAB * H
    resident = m.weights + m.optimizer_states
    assert m.phases["forward_end"] - resident - m.activations - e.detail.records["logits_buffers"] == BF16 * head_group
    # in the last block's backward: that block's bf16 parameters and the next one's prefetched all-gather output
    # (2 bytes × the largest group's params × 2 groups alive), beside [norm, output]'s fp32 reduce-scatter input
    assert e.detail.records["zero3_gathered_params"] == BF16 * block_params() * 2 + FP32 * head_group


def test_fsdp2_zero2_keeps_every_group_unsharded_to_its_backward(small):
    # --zero 2 = torchtitan's reshard policy "never": at the loss every group's bf16 copy is live
    e = estimate(small, tt(dp=2, zero=2))
    m = e.memory
    n = e.params
    resident = m.weights + m.optimizer_states
    assert m.weights == FP32 * n / 2  # FSDP shards the parameters for --zero 2 too
    assert m.phases["forward_end"] - resident - m.activations - e.detail.records["logits_buffers"] == BF16 * n


def test_torchtitan_labels_are_given_shifted(small):
    # torchtitan's data loader yields label = x[1:] (hf_datasets/text_datasets.py:129-131): no shifted copy and
    # no padded labels (HF's ForCausalLMLoss makes both), and its loss runs after the model returns; one GPU
    # (autocast in both stacks), the head's bytes compared term by term
    from trainfit.analytic.loss import head_and_loss
    from trainfit.analytic.precision import state_bytes

    hf, titan = Setup(batch=BATCH, seq=SEQ), tt()
    a, b = head_and_loss(small, hf, state_bytes(hf), T), head_and_loss(small, titan, state_bytes(titan), T)
    assert a.labels == b.labels == 8 * T  # the batch's int64 labels
    norm_gap = FP32 * H * T  # HF's final norm also keeps its fp32 normalised tensor
    assert a.saved - b.saved == 8 * T + norm_gap  # HF's shifted copy of the labels
    # HF's forward holds the fp32 final hidden states and the padded labels at the loss; torchtitan returns first
    assert a.forward_transient - b.forward_transient == FP32 * H * T + 8 * (T + BATCH)


# -- the published run (shared/calibration.md C2) ---------------------------------------------------------------
def test_llama3_8b_fsdp8_op_sac_is_below_the_published_max_reserved():
    # torchtitan benchmarks/llama3_h100_202412_torchtitan.md: Llama-3.1-8B, FSDP 8, batch 2 × 8192, per-op SAC:
    # max_reserved 82.4 GiB. Allocated (trainfit's peak) is at most reserved.
    spec = load_model("llama-3.1-8b")
    e = estimate(spec, Setup(stack="torchtitan", recompute="op", dp=8, zero=3, batch=2, seq=8192))
    m = e.memory
    assert m.peak <= 82.4 * GIB
    # and at least what a hand count says must be live at the loss: 16 bytes per parameter over 8 ranks, 32 blocks'
    # stored tensors (bf16 input, wq/wv/w1/w2 outputs, SDPA output, fp32 logsumexp) and the saved fp32 log-softmax
    tokens, h, q, kv, ffn, heads, vocab = 2 * 8192, 4096, 4096, 1024, 14336, 32, 128256
    stored = (BF16 * (h + q + kv + ffn + h) + BF16 * q + FP32 * heads) * tokens
    floor = 16 * e.params / 8 + 32 * stored + FP32 * vocab * tokens
    assert e.detail.records["activation_per_layer"] == stored
    assert floor < m.peak


def test_torchtitan_fp32_attention_takes_the_math_path(small):
    # torchtitan allows the cuDNN, flash and math SDPA backends only (models/attention.py:173-178); fp32 runs neither
    # cuDNN nor flash, so the math path keeps the s×s probabilities (fp32, one per head, query and key). HF's SDPA
    # runs the memory-efficient kernel for fp32 (no s×s tensor) -- unless k/v have fewer heads: transformers passes
    # enable_gqa=True, which that kernel does not take (sdp_utils.cpp), so GQA fp32 takes the math path too
    # (measured on an H200: llama-3.2-1b fp32 kept its s×s probabilities)
    titan = estimate(small, tt(precision="fp32")).detail.records["attention_scores_per_layer"]
    hf = estimate(small, Setup(batch=BATCH, seq=SEQ, precision="fp32")).detail.records["attention_scores_per_layer"]
    mha = replace(small, kv_heads=HEADS)
    hf_mha = estimate(mha, Setup(batch=BATCH, seq=SEQ, precision="fp32")).detail.records["attention_scores_per_layer"]
    assert KV_HEADS < HEADS and hf == titan == FP32 * HEADS * T * SEQ
    assert hf_mha == 0
