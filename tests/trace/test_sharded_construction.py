"""Where an FSDP2 rank's device memory starts (trace/distributed.py `wrapped_at`, trace/engine.py replay_args).

The trace builds the unsharded model and then shards it; a real job loads it on the CPU or the meta device and
fully_shard moves one unit at a time to the GPU (torch 2.13 _fsdp_init.py:369-401), so the allocator replay starts
from the sharded model. Independent truth: the shards FSDP2 makes, derived by hand from the config (dim-0 chunks of
ceil(rows / world) rows, every rank's padded to the first one's: _fsdp_param.py:298-307), and the unsharded
model's bytes, which a ZeRO-3 rank never holds at once."""
from __future__ import annotations

import math

import transformers.models.llama.modeling_llama  # noqa: F401  (imported once for the suite, not in the test's time)

from trainfit.alloc.replay import least_capacity, replay
from trainfit.models.hf_config import spec_from_config
from trainfit.setup import Setup
from trainfit.trace.distributed import trace_rank
from trainfit.trace.engine import replay_args
from trainfit.trace.recorder import cuda_rounded


def _llama(hidden, ffn, layers, heads, kv_heads, vocab):
    return {"model_type": "llama", "hidden_size": hidden, "intermediate_size": ffn, "num_hidden_layers": layers,
            "num_attention_heads": heads, "num_key_value_heads": kv_heads, "vocab_size": vocab,
            "max_position_embeddings": 256, "tie_word_embeddings": False}


def _shapes(c):
    """Every weight's shape (rows, cols), Llama without biases: per layer q, k, v, o, gate, up, down, 2 RMSNorms;
    then the embedding, the final norm and the untied LM head."""
    h, f, kv = c["hidden_size"], c["intermediate_size"], c["hidden_size"] // c["num_attention_heads"] * \
        c["num_key_value_heads"]
    layer = [(h, h), (kv, h), (kv, h), (h, h), (f, h), (f, h), (h, f), (h,), (h,)]
    return layer * c["num_hidden_layers"] + [(c["vocab_size"], h), (h,), (c["vocab_size"], h)]


def _fp32_bytes(shape, world=1):
    rows, rest = shape[0], math.prod(shape[1:])
    return 4 * math.ceil(rows / world) * rest


def test_the_replay_starts_from_the_sharded_model():
    c = _llama(64, 172, 2, 4, 2, 512)
    # --stack hf at amp-bf16: fp32 parameters (accelerate upcasts them, trainfit.step.strategy), 2 ranks
    setup = Setup(stack="hf", batch=2, seq=32, device="cuda", dp=2, zero=3)
    _, rec, _ = trace_rank(spec_from_config(c, "tiny-construction"), setup)
    step = replay_args(rec, setup)
    before = sorted(r.nbytes for r in step["records"] if r.birth < rec.wrapped_at and r.nbytes)
    # on the device when the wrapped model exists: each parameter's shard, and the rotary embedding's two buffers
    # (inv_freq, original_inv_freq: head_dim / 2 = 8 fp32 each)
    shards = [cuda_rounded(_fp32_bytes(s, world=2)) for s in _shapes(c)]
    assert before == sorted(shards + [cuda_rounded(8 * 4)] * 2)
    # the unsharded parameters the trace built first are in the recorder, not in the replay
    left_out = sorted(r.nbytes for r in rec.records if r.death is not None and r.death < rec.wrapped_at
                      and r.nbytes > cuda_rounded(8 * 4))
    assert left_out == sorted(b for b in (cuda_rounded(_fp32_bytes(s)) for s in _shapes(c)) if b > 512)


def test_a_zero3_rank_needs_less_than_the_unsharded_model():
    # 16 layers, a small vocabulary: the parameters are 171 MiB in fp32, a ZeRO-3 rank of 8 holds an eighth of them
    # and their optimizer state, plus two gathered layers in bf16
    c = _llama(512, 1376, 16, 8, 2, 512)
    setup = Setup(stack="hf", batch=1, seq=32, device="cuda", dp=8, zero=3)
    _, rec, _ = trace_rank(spec_from_config(c, "deep-construction"), setup)
    unsharded = sum(_fp32_bytes(s) for s in _shapes(c))
    assert unsharded == 4 * 44_843_520
    step = replay_args(rec, setup)
    free = replay(**step)
    required = least_capacity(unconstrained=free, **step)
    # replayed from the unsharded model, the least capacity was above it (184 MiB)
    assert rec.peak <= free.allocated <= required < unsharded
