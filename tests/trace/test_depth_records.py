"""The full depth's allocation records written down from a 5-period trace (trace/depth_records.py) replay through the
caching allocator exactly as the full-depth trace's own records do: the same reserved, to the byte, in every step
structure the extrapolation handles (the reference here is an independent full-depth trace, not the formula)."""
from __future__ import annotations

import warnings

import pytest

from trainfit.models.hf_config import spec_from_config
from trainfit.setup import Setup
from trainfit.trace.engine import trace_spec
from trainfit.trace.extrapolate import trace_extrapolated

warnings.filterwarnings("ignore", message=".*gradient_checkpointing_enable.*")


def _spec(family: str, layers: int = 12):
    # wide enough that the step's requests fill every allocator pool: the MLP intermediate (2 x 256 x 1536 bf16,
    # 1.5 MiB) packs into 20 MiB segments, the fp32 logits (2 x 256 x 32,000 x 4 B, 62.5 MiB) get their own
    cfg = {"model_type": family, "hidden_size": 512, "num_hidden_layers": layers, "num_attention_heads": 8,
           "num_key_value_heads": 4, "intermediate_size": 1536, "vocab_size": 32000, "max_position_embeddings": 1024}
    if family == "gemma2":  # period 2: sliding-window and global layers alternate
        cfg.update(head_dim=64, sliding_window=128)
    return spec_from_config(cfg, name=f"mid-{family}")


CASES = [
    ("llama", {}),
    ("llama", {"recompute": "full"}),
    ("llama", {"grad_accum": 2, "optimizer_impl": "foreach"}),  # two backward passes; one temporary per parameter
    pytest.param("qwen2", {"precision": "bf16", "optimizer_impl": "for-loop"}, marks=pytest.mark.heavy),  # ~2.5 s
    pytest.param("gemma2", {}, marks=pytest.mark.heavy),  # ~8 s
]


@pytest.mark.parametrize("family,kw", CASES, ids=["llama", "llama-recompute", "llama-accum2-foreach",
                                                   "qwen2-bf16-for-loop", "gemma2"])
def test_full_depth_records_replay_as_the_full_trace(family, kw):
    setup = Setup(device="cuda", batch=2, seq=256, **{"precision": "amp-bf16", **kw})
    full = trace_spec(_spec(family), setup, flops=False, extrapolate=False)
    extra = trace_extrapolated(_spec(family), setup, flops=False, min_periods=1)
    assert extra.detail.records["reserved_from"] == "full-depth records"
    assert extra.memory.peak == full.memory.peak
    assert extra.memory.reserved == full.memory.reserved
    assert full.memory.reserved > full.memory.peak  # the cache beyond the peak is there to get right


def test_off_cuda_there_is_no_reserved_to_write():
    setup = Setup(device="cpu", batch=2, seq=64, precision="amp-bf16")
    extra = trace_extrapolated(_spec("llama", 8), setup, flops=False, min_periods=1)
    assert extra.memory.reserved is None and "reserved_from" not in extra.detail.records
