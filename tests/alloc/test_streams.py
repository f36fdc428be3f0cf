"""Which CUDA stream the trace files each storage under (trace/streams.py), checked against FSDP2's code read by
hand (torch 2.13, torch/distributed/fsdp/_fully_shard/) and a tiny model's parameter counts."""
from types import SimpleNamespace

import torch
import transformers.models.llama.modeling_llama  # noqa: F401  (imported once for the suite, not in the test's time)

from trainfit.alloc.replay import replay
from trainfit.models.hf_config import spec_from_config
from trainfit.setup import Setup
from trainfit.trace.distributed import trace_rank  # torch.distributed + FSDP2 imports, shared with the suite
from trainfit.trace.recorder import AllocationRecorder, cuda_rounded
from trainfit.trace.streams import numbered_streams


def test_births_are_tagged_with_the_current_numbered_stream():
    # torch.cpu.stream(s) makes s current until it exits (torch/cpu/__init__.py StreamContext); streams made
    # while numbered_streams is on are 1, 2, ... in creation order, the default stream 0.
    rec = AllocationRecorder()
    saved = torch.cpu.Stream
    with rec, numbered_streams(rec):
        _, second = torch.cpu.Stream(), torch.cpu.Stream()
        x = torch.empty(4)
        with torch.cpu.stream(second):
            y = torch.empty(4)
        z = torch.empty(4)
    assert [r.stream for r in rec.records] == [0, 2, 0]
    assert torch.cpu.Stream is saved and rec.stream_of is None
    del x, y, z


# hidden 64, 2 layers, 4 heads of 16, 2 KV heads (k/v width 32), FFN 172, vocab 512, untied head
TINY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 172, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 256,
        "tie_word_embeddings": False}
LAYER = 64 * 64 * 2 + 64 * 32 * 2 + 3 * 64 * 172 + 2 * 64  # q, o; k, v; gate, up, down; 2 RMSNorms = 45,440
ROOT = 512 * 64 * 2 + 64  # embedding, lm_head, final norm = 65,600


def _trace(zero):
    spec = spec_from_config(TINY, "tiny-streams")
    # --stack hf at amp-bf16: fp32 parameter shards under accelerate's MixedPrecisionPolicy(param_dtype=bf16,
    # reduce_dtype=bf16) (trainfit.step.strategy)
    _, rec, _ = trace_rank(spec, Setup(stack="hf", batch=2, seq=32, device="cuda", dp=2, zero=zero))
    return rec


def test_fsdp2_side_stream_buffers_and_their_replay():
    rec = _trace(zero=3)
    step = [r for r in rec.records if r.birth >= rec.step_start]
    by = {s: sorted(r.nbytes for r in step if r.stream == s) for s in {r.stream for r in step}}
    # Streams 1-4: lazy_init's all_gather_copy_in, all_gather, reduce_scatter, all_reduce (_fsdp_param_group.py
    # :84-102). Stream 1, per all-gather: the fp32 shard cast to param_dtype bf16 (the foreach-copy input,
    # _fsdp_collectives.py:419-423: 2 B x n / 2 ranks) and the all-gather output, world x that shard
    # (:351-353: 2 B x n), gathered in forward and again in backward (reshard_after_forward=True). Stream 2 holds
    # nothing: NCCL works in the given buffers. Stream 3: each group's reduce-scatter output in reduce_dtype bf16
    # (:612-616: 2 B x n / 2) and its cast to the fp32 shard of gradients (:696, _to_dtype_if_needed on the
    # post-reduce stream, the reduce-scatter stream without HSDP: 4 B x n / 2). Groups: 2 layers and the root.
    groups = [LAYER, LAYER, ROOT]
    assert set(by) == {0, 1, 3}
    assert by[1] == sorted(cuda_rounded(b * n) for n in groups * 2 for b in (2, 1))
    assert by[3] == sorted(cuda_rounded(b * n // 2) for n in groups for b in (2, 4))
    one = [SimpleNamespace(nbytes=r.nbytes, birth=r.birth, death=r.death) for r in rec.records]
    streams, single = replay(rec.records, rec.step_start, end=rec.stop), replay(one, rec.step_start, end=rec.stop)
    assert streams.reserved >= single.reserved
    assert streams.allocated == single.allocated == rec.peak  # streams move blocks, not bytes


def test_ddp_and_zero_redundancy_optimizer_stay_on_the_compute_stream():
    # DDP's buckets and ZeroRedundancyOptimizer's state are allocated on the current stream (trace/streams.py)
    assert {r.stream for r in _trace(zero=1).records} == {0}
