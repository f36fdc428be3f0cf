"""--loss fused-linear (Liger's fused linear cross-entropy) in the analytic engine, by hand from Liger's algorithm
(linkedin/Liger-Kernel ops/fused_linear_cross_entropy.py): chunks of next_pow2(ceil(BT / ceil(V / H))) tokens, the
input and weight gradients made in forward and saved, no whole logits."""
from __future__ import annotations

import pytest

from trainfit import api
from trainfit.analytic.loss import head_and_loss
from trainfit.analytic.precision import state_bytes
from trainfit.errors import SetupError
from trainfit.setup import Request, Setup


def _head(**kw):
    req = Request(model="llama-3.2-1b", batch=2, seq=1024, precision="bf16", **kw)
    spec = api.load_spec(req.model)
    setup = req.setup(spec)
    return spec, head_and_loss(spec, setup, state_bytes(setup), 2 * 1024)


def test_fused_linear_saves_gradients_not_logits():
    spec, full = _head()
    _, fused = _head(loss="fused-linear")
    T, H, V = 2048, spec.hidden, spec.vocab  # llama-3.2-1b: H 2048, V 128256
    # full loss (bf16 weights): the LM head's bf16 input and the fp32 log-softmax (T × V) are saved
    # fused: the bf16 input gradient (T × H), the bf16 weight gradient (V × H) and the fp32 per-token loss
    delta = full.saved - fused.saved
    assert delta == (2 * T * H + 4 * T * V) - (2 * T * H + 2 * V * H + 4 * T)
    # chunk: ceil(V / H) = 63 -> ceil(2048 / 63) = 33 -> next power of two 64 tokens; its bf16 logits and input grad
    chunk = 64
    padded = 8 * (T + 2)  # the labels padded by one position per sequence before the shift (int64), as for HF's loss
    assert fused.forward_transient == 2 * chunk * V + 2 * chunk * H + padded
    assert fused.backward_transient == 0


def test_fused_linear_with_lora_makes_no_head_weight_gradient():
    spec, fused = _head(loss="fused-linear")
    _, lora = _head(loss="fused-linear", lora_rank=8)
    assert fused.saved - lora.saved == 2 * spec.vocab * spec.hidden  # the frozen LM head's bf16 gradient


def test_fused_linear_lowers_the_peak_of_a_large_vocabulary_fine_tune():
    base = dict(model="llama-3.1-8b", gpu="RTX-4090", seq=2048, precision="bf16", lora_rank=16, recompute="full")
    full, fused = (api.analytic(Request(**base, **kw)) for kw in ({}, dict(loss="fused-linear")))
    # at least the whole fp32 log-softmax (2048 × 128256 × 4 B = 1 GiB) less the saved gradients' growth
    assert full.memory.peak - fused.memory.peak > 0.5 * 2**30


@pytest.mark.parametrize("kw,words", [(dict(loss="fused-linear", stack="torchtitan"), "--stack hf"),
                                      (dict(loss="fused-linear", head="seq-cls"), "causal-lm")])
def test_refusals(kw, words):
    with pytest.raises(SetupError, match=words):
        Setup(**kw)


def test_trace_and_measure_refuse_in_one_line():
    from trainfit.engines import measure, trace

    spec = api.load_spec("tiny-llama")
    for engine in (trace, measure):
        with pytest.raises(SetupError, match="--engine analytic"):
            engine(spec, Setup(loss="fused-linear", device="cpu", batch=1, seq=8))


def test_chunk_rows_match_ligers_own_example():
    # ops/fused_linear_cross_entropy.py:62-63: "BT = 4096*4, V = 32000, H = 4096 ==> inc_factor = 8, chunk_size = 2048"
    from trainfit.analytic.liger_ops import chunk_rows
    assert chunk_rows(4096 * 4, 32000, 4096) == 2048
    assert chunk_rows(100, 32000, 4096) == 16  # ceil(100 / 8) = 13 -> 16


def test_fused_linear_step_runs_the_head_gemms_in_forward():
    # Liger's forward: per chunk the logits GEMM, the in-place cross-entropy kernel (two reads and one write of the
    # chunk's logits), the input-gradient GEMM and the weight-gradient GEMM; its backward only scales the two
    # gradients. Hand count for llama-3.2-1b, 2 × 1024 tokens, bf16: chunk 64 rows (test above), 32 chunks.
    from trainfit.analytic.liger_ops import fused_linear_loss
    from trainfit.analytic.ops import shape_of
    req = Request(model="llama-3.2-1b", batch=2, seq=1024, precision="bf16", loss="fused-linear")
    spec = api.load_spec(req.model)
    setup = req.setup(spec)
    sh = shape_of(spec, setup, state_bytes(setup), "bf16")
    fwd, bwd = fused_linear_loss(spec, sh, trains_head=True)
    T, H, V = 2048, spec.hidden, spec.vocab
    gemms = [o for o in fwd if o.kind == "gemm"]
    assert len(gemms) == 3 * 32
    assert sum(o.flops for o in gemms) == 3 * 2 * T * V * H  # the head's forward, dgrad and wgrad FLOPs
    ce = [o for o in fwd if o.name == "flce.cross_entropy"]
    assert sum(o.reads + o.writes for o in ce) == 3 * 2 * T * V + 8 * T + 4 * T  # bf16 logits ×3, labels, loss
    assert not [o for o in bwd if o.kind == "gemm"]
    assert sum(o.reads + o.writes for o in bwd) == 2 * (2 * T * H + 2 * V * H)  # scale dX and dW in place
    _, lora_bwd = fused_linear_loss(spec, sh, trains_head=False)
    assert len(lora_bwd) == 1  # a frozen head: no weight gradient to make or scale


def test_reserved_caches_one_chunk_of_logits_not_the_whole():
    # what reserved keeps beside the peak for the loss (engine.transient_blocks): the full loss's fp32 logits are
    # T × V × 4 bytes; Liger's chunks are freed each one before the next, so the cached block is one chunk's bf16
    # logits: Llama-3.1-8B, 65,000 tokens: ceil(128256 / 4096) = 32 -> ceil(65000 / 32) = 2032 -> 2048 rows
    from trainfit.analytic.engine import transient_blocks
    from trainfit.analytic.memory import train_memory

    req = Request(model="llama-3.1-8b", batch=1, seq=65_000, precision="bf16", recompute="full", loss="fused-linear",
                  gpu="H200")
    spec = api.load_spec(req.model)
    setup = req.setup(spec)
    blocks = transient_blocks(spec, setup, train_memory(spec, setup))
    # beside it one layer's bf16 MLP intermediate (65,000 × 14,336), and no tied embedding
    assert sorted(blocks) == [0, 2048 * spec.vocab * 2, 65_000 * spec.intermediate * 2]
