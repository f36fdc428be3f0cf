"""T5's op list (analytic/ops/encoder_decoder.py) against the kernels the trace engine dispatches
(trace/kernel_shapes.py) for tiny-t5 (2 encoder + 3 decoder blocks, 4 heads of d_kv 16, gated gelu_new) and t5-small
(T5 v1.0), under CUDA semantics, as tests/analytic/test_ops_vs_trace.py checks the decoder-only families:

  * one block = a trace with one more block less the trace without it, per stack (the encoder's third block; the
    decoder's third: `num_decoder_layers`), forward and backward: GEMM and attention shapes exactly, casts' bytes and
    kernels exactly, the other memory-bound bytes within TOLERANCE;
  * the whole training step's GEMMs and attention calls (both stacks' first blocks with the relative bias, the
    cross-attention over the encoder's tokens, lm_head) exactly, its memory-bound bytes and kernel count within
    TOLERANCE;
  * generate()'s prefill and decode step (self-attention over the cache, cross-attention over the cached encoder k
    and v): GEMM and attention calls exactly, memory-bound bytes and kernel counts within TOLERANCE.

Under CUDA semantics the trace sends an SDPA call with a float mask (T5's relative bias) where CUDA's dispatcher
sends it, the memory-efficient kernel (a float mask rules out flash; trace/cuda_masked_sdpa.py), under CUDA
autocast's cast of the mask; the CPU's implementation with dropout is torch's math path (fp32 batched GEMMs, s x s
passes). Measured through the CPU's math path instead (bf16, 2 x 48 encoder + 24 decoder tokens), the
trace's encoder block moved about +110 % (forward) and +25 % (backward) more memory-bound bytes than the op list: its
attention's fp32 upcasts and s x s passes.
Measured with CUDA's kernel (the op list's memory-bound bytes against the trace's, casts equal;
`test_block_kernels_match_the_op_list` asserts them within TOLERANCE), encoder forward / backward, decoder forward /
backward: tiny-t5 bf16 +2.2 / +3.3, +3.7 / +3.8 %; amp-bf16 +1.4 / -0.1, +2.4 / -0.1 %; fp32 +2.6 / -0.1, +4.4 /
-0.1 %; t5-small (T5 v1.0: relu, 8 heads of 64) bf16 +3.8 / +5.3, +5.7 / +5.4 %; amp-bf16 +3.1 / -0.0, +4.6 / -0.0 %;
fp32 +4.7 / -0.0, +7.2 / -0.0 % (over: the op list's generic elementwise kernels and its whole-row reads of
broadcast operands, as test_ops_vs_trace.py's TOLERANCE says).
"""
from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from test_ops_vs_trace import CASTS, TOLERANCE, _ops_keys, _trace_key  # noqa: E402

from trainfit.analytic.encoder_decoder_time import (dropout_rate, prefill_decode_lists, shapes,  # noqa: E402
                                                   training_parts)
from trainfit.analytic.ops import Op, backward  # noqa: E402
from trainfit.analytic.ops import encoder_decoder as ed  # noqa: E402
from trainfit.analytic.precision import state_bytes  # noqa: E402
from trainfit.models.resolve import load_model  # noqa: E402
from trainfit.setup import Setup  # noqa: E402
from trainfit.trace.extrapolate import with_layers  # noqa: E402
from trainfit.trace.kernel_shapes import step_kernels  # noqa: E402

PHASES = ("forward", "backward")
# the op list's casts: autocast's (test_ops_vs_trace.CASTS) and T5's own (the mask's, the FF's `.to(wo dtype)`, the
# norm's gradient cast)
ED_CASTS = CASTS + ("_cast", "to_wo_dtype")


def _setup(precision: str, mode: str = "train") -> Setup:
    return Setup(batch=2, seq=48, target_seq=24, precision=precision, device="cuda", mode=mode)


def _decoder_blocks(spec, n: int):
    cfg = dict(spec.config, num_decoder_layers=n)
    return dataclasses.replace(spec, config=cfg, encdec=dataclasses.replace(spec.encdec, decoder_layers=n))


def _keys(phase: str, op: Op) -> list[tuple]:
    if op.kind == "attention":  # (batch·heads, s_q, s_kv, head width), as trace/kernel_shapes.py keys it
        return [(phase, "attention", *(int(round(x)) for x in (op.batch, op.m, op.n, op.k)))]
    return _ops_keys(phase, op)


def _shapes(ops: list[Op], phase: str) -> Counter:
    return Counter(k for op in ops for k in _keys(phase, op))


def _traced_shapes(kernels, phase: str) -> Counter:
    return Counter(k for k in map(_trace_key, kernels) if k[0] == phase and k[1] not in ("cast", "memory"))


def _block_lists(spec, setup, stack: str) -> dict[str, list[Op]]:
    """One later block of `stack` (not the first: no relative bias), forward and backward; the backward with the
    block's gradient sums and its share of the bias's (encoder_decoder_backward_extra: one add into the shared
    bias's gradient, one sum of the efficient kernel's batch-sized bias gradient)."""
    enc, dec = shapes(spec, setup, state_bytes(setup))
    p = dropout_rate(spec, True)
    if stack == "encoder":
        fwd, sums = ed.encoder_block(spec, enc, p), ed.block_grad_sums(spec, enc, False)
    else:
        fwd, sums = ed.decoder_block(spec, dec, enc.seq, p), ed.block_grad_sums(spec, dec, True, enc.tokens)
    both = ed.encoder_decoder_backward_extra(spec, enc, dec)
    per_block = [o for o in both if o.name in ("bias.grad_sum", "bias.grad_batch_sum")]
    # the bias's two sums over this stack's blocks (blocks - 1 adds, one batch sum per block): one block's share
    share = [o._replace(reads=o.reads / o.kernels, writes=o.writes / o.kernels, kernels=1)
             for o in per_block[(0 if stack == "encoder" else 2):(2 if stack == "encoder" else 4)]]
    return {"forward": fwd, "backward": backward(fwd) + sums + share}


@pytest.mark.slow
@pytest.mark.parametrize("stack,model,precision", [("encoder", "tiny-t5", "bf16")] + [
    pytest.param(*c, marks=pytest.mark.heavy) for c in [("decoder", "tiny-t5", "bf16")] + [
        (stack, m, p) for stack in ("encoder", "decoder")
        for m, p in (("tiny-t5", "amp-bf16"), ("tiny-t5", "fp32"), ("t5-small", "bf16"), ("t5-small", "amp-bf16"))]])
def test_block_kernels_match_the_op_list(stack, model, precision):
    """(the default run checks an encoder block; the decoder's blocks are in the whole step's totals there,
    test_training_step_kernels_match_the_op_list, and block by block in the heavy tier)"""
    spec = load_model(model)
    setup = _setup(precision)
    more, fewer = ((with_layers(spec, 3), with_layers(spec, 2)) if stack == "encoder"
                   else (_decoder_blocks(spec, 3), _decoder_blocks(spec, 2)))
    assert_block_matches(more, fewer, setup, _block_lists(spec, setup, stack), stack)


def assert_block_matches(more, fewer, setup, lists: dict, stack: str) -> None:
    """One block's kernels (the trace of `more` less that of `fewer`, a block fewer) against its op `lists` per
    phase: GEMM and attention shapes exactly, casts' bytes and launches exactly, the other bytes within TOLERANCE."""
    traced = Counter(map(_trace_key, step_kernels(more, setup)))
    traced.subtract(Counter(map(_trace_key, step_kernels(fewer, setup))))
    assert all(c >= 0 for c in traced.values()), "a trace with a block fewer launched kernels the other did not"
    traced = +traced
    for phase in PHASES:
        gemms = Counter({k: c for k, c in traced.items() if k[0] == phase and k[1] not in ("cast", "memory")})
        listed = _shapes(lists[phase], phase)
        assert gemms == listed, (f"{stack} {phase}: trace only {dict(gemms - listed)}, "
                                 f"op list only {dict(listed - gemms)}")
        memory = [o for o in lists[phase] if o.kind == "memory"]
        casts = [o for o in memory if any(c in o.name for c in ED_CASTS)]
        cast = (sum(k[2] * c for k, c in traced.items() if k[:2] == (phase, "cast")),
                sum(c for k, c in traced.items() if k[:2] == (phase, "cast")))
        assert cast == (sum(o.nbytes for o in casts), sum(o.kernels for o in casts)), f"{stack} {phase}: casts"
        other = sum(o.nbytes for o in memory) - cast[0]
        mem = sum(k[2] * c for k, c in traced.items() if k[:2] == (phase, "memory"))
        assert abs(other / mem - 1) <= TOLERANCE, f"{stack} {phase}: other bytes trace {mem}, op list {other:.0f}"


@pytest.mark.slow
@pytest.mark.parametrize("model", ["tiny-t5", pytest.param("t5-small", marks=pytest.mark.heavy)])
def test_training_step_kernels_match_the_op_list(model):
    """A whole amp-bf16 step, forward and backward: every GEMM and attention call (both stacks, their first blocks
    too, lm_head) exactly; the memory-bound bytes (the relative bias's bucketing, the embeddings, final norms, the
    head's casts and loss, the backward's gradient sums, beside the blocks; the gathers aside, as in
    test_generate_prefill_and_decode_gemms_match_the_op_list) and the kernel count within TOLERANCE. Measured:
    tiny-t5 +0.7 % / +1.5 % of the bytes (forward / backward), 348 and 484 kernels of the trace's 343 and 481; t5-small
    (T5 v1.0: relu, the decoder output rescaled before the tied head, 6 + 6 blocks) +0.5 % / +0.7 %, 590 of 578 and
    847 of 847."""
    spec = load_model(model)
    setup = _setup("amp-bf16")
    enc, dec = shapes(spec, setup, state_bytes(setup))
    parts, counts, extra = training_parts(spec, enc, dec)
    fwd = [o for part, ops in parts.items() for o in counts[part] * ops]
    bwd = [o for part, ops in parts.items() for o in counts[part] * (backward(ops) + extra[part])]
    kernels = step_kernels(spec, setup)
    for phase, ops in (("forward", fwd), ("backward", bwd)):
        traced, listed = _traced_shapes(kernels, phase), _shapes(ops, phase)
        assert traced == listed, f"{phase}: trace only {dict(traced - listed)}, op list only {dict(listed - traced)}"
        _assert_memory_and_launches(phase, ops, [k for k in kernels if k.phase == phase])


def _assert_memory_and_launches(phase: str, ops: list[Op], kernels) -> None:
    """The memory-bound bytes and the kernel count within TOLERANCE, the gathers aside (kernel_shapes counts a whole
    table as an embedding's operand, where the kernel reads the gathered rows)."""
    mem = sum(k.nbytes for k in kernels if k.kind == "memory" and k.op != "embedding")
    other = sum(o.nbytes for o in ops if o.kind == "memory" and o.name not in ("embed", "bias.embedding"))
    assert abs(other / mem - 1) <= TOLERANCE, f"{phase}: memory-bound bytes trace {mem}, op list {other:.0f}"
    launched = sum(o.kernels if o.kind == "memory" else 1 for o in ops)
    assert abs(launched / len(kernels) - 1) <= TOLERANCE, f"{phase}: kernels trace {len(kernels)}, op list {launched}"


@pytest.mark.slow
def test_generate_prefill_and_decode_gemms_match_the_op_list():
    """generate()'s prefill (the encoder, the decoder over --target-seq tokens filling both caches, lm_head over every
    target position) and one decode step (one token per sequence: q, k, v of it, the self-attention over the cache
    and the new token, the cross-attention's q over the cached encoder k and v), as the trace engine runs them
    (step/infer.py inference_step), amp-bf16 on CUDA: the GEMM and attention calls exactly, the memory-bound bytes and
    the kernel count within TOLERANCE (measured: prefill -1.4 % of the bytes, 372 kernels of the trace's 381; decode
    -0.1 %, 195 of 189)."""
    from trainfit.trace.kernel_shapes import inference_kernels

    spec = load_model("tiny-t5")
    setup = _setup("amp-bf16", mode="infer")
    kernels = inference_kernels(spec, setup)
    prefill, decode = prefill_decode_lists(spec, setup)
    for phase, ops in (("prefill", prefill), ("decode", decode)):
        traced = _traced_shapes(kernels, phase)
        listed = Counter({(phase, *k[1:]): c for k, c in _shapes(ops, "forward").items()})
        assert traced == listed, f"{phase}: trace only {dict(traced - listed)}, op list only {dict(listed - traced)}"
        _assert_memory_and_launches(phase, ops, [k for k in kernels if k.phase == phase])


@pytest.mark.parametrize("model", ["flan-t5-base", "t5-small", "mt5-small"])
def test_prefill_op_list_flops_are_the_closed_form_ones(model):
    """The prefill's op list (its GEMMs and attention calls) does the FLOPs of encoder_decoder.prefill_flops (a closed
    form checked against the trace's FlopCounterMode in test_encoder_decoder_analytic.py), at an input and a target
    of different lengths: both stacks, the cross-attention's k and v over the encoder's tokens, lm_head over every
    target position."""
    from trainfit.analytic.encoder_decoder import prefill_flops

    spec = load_model(model)
    setup = Setup(batch=3, seq=200, target_seq=50, precision="bf16", device="cuda", mode="infer")
    prefill, _ = prefill_decode_lists(spec, setup)
    assert sum(o.flops for o in prefill) == prefill_flops(spec, setup)
