"""BART's and Whisper's op list (analytic/ops/encdec_absolute.py) against the kernels the trace engine dispatches
(trace/kernel_shapes.py), under CUDA semantics, as test_encdec_ops_vs_trace.py checks T5's. The models are the
families matrix's shrunk configs (test_vs_trace_families.py shrink: hidden 128, 4 heads, ffn 3072 (BART) and 2048
(Whisper), vocabulary 1000; Whisper with as many encoder positions as --seq, its conv front-end over twice as many
log-mel frames):

  * generate()'s prefill (both stacks, the caches' cats, lm_head over every target position, BART's final_logits_bias)
    and one decode step (the self-attention over the cache, the cross-attention's q over the cached encoder k and v):
    GEMM and attention calls exactly, Whisper's two convolutions as their implicit GEMMs (each the trace's one
    convolution kernel, whose operands' bytes the GEMM's shape gives), the memory-bound bytes and the kernel count
    within TOLERANCE;
  * one training block per stack (a trace with one more block less the trace without it), forward and backward:
    GEMM and attention shapes exactly, casts' bytes and kernels exactly, the other memory-bound bytes within
    TOLERANCE. BART's decoder self-attention runs SDPA with its materialised bool mask, which aten turns into an
    additive one and CUDA runs through the memory-efficient kernel (the CPU's math path under dropout otherwise):
    the trace's CUDA semantics convert the mask as attention.cpp convert_boolean_attn_mask does and run that kernel
    (trace/cuda_masked_sdpa.py).

Measured (bf16 / amp-bf16, 2 x 48 encoder + 24 target tokens, 6 decoder blocks): prefill BART -0.12 / -0.06 % of the
trace's memory-bound bytes, 210 / 406 kernels of 212 / 408; decode -1.75 / -3.03 %, 155 of 155 / 186 of 186; Whisper
prefill -0.12 / -0.06 %, 248 / 435 of 250 / 437; decode -2.01 / -3.39 %, 134 / 165 of 134 / 165; fp32 BART -0.18 % /
-1.81 %, Whisper -0.19 % / -2.04 % (under: the LayerNorms' weight and bias reads, which ops/norm.py's fused_norm does
not count, weigh most at one token per sequence). A training block's other memory-bound bytes (casts equal), forward /
backward, bf16, amp-bf16, fp32: BART encoder -0.01 / +0.14, -0.06 / +0.07, -0.04 / -0.05 %; decoder -0.06 / +0.23,
-0.17 / +0.08, -0.10 / -0.12 %; Whisper encoder -0.02 / +0.17, -0.14 / +0.04, -0.08 / -0.09 %; decoder -0.11 / +0.21,
-0.30 / -0.01, -0.19 / -0.22 %. A whole training step (2 + 2 blocks), forward / backward: BART bf16 -0.03 / +2.97 %,
121 / 180 kernels of the trace's 123 / 170, amp-bf16 -0.04 / +1.31 %, 209 / 278 of 211 / 269; Whisper bf16 -0.08 /
+1.63 %, 113 / 176 of 115 / 169, amp-bf16 -0.06 / +0.67 %, 201 / 274 of 203 / 267.
"""
from __future__ import annotations

from collections import Counter

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from test_encdec_ops_vs_trace import (TOLERANCE, _shapes, _traced_shapes, assert_block_matches)  # noqa: E402
from test_vs_trace_families import CONFIGS, shrink  # noqa: E402

from trainfit.analytic.encoder_decoder_time import forward_lists, prefill_decode_lists, shapes  # noqa: E402
from trainfit.analytic.ops import Op, backward  # noqa: E402
from trainfit.analytic.ops import encdec_absolute as ab  # noqa: E402
from trainfit.analytic.ops import encoder_decoder as ed  # noqa: E402
from trainfit.analytic.precision import state_bytes  # noqa: E402
from trainfit.models.hf_config import spec_from_config  # noqa: E402
from trainfit.setup import Setup  # noqa: E402
from trainfit.trace.kernel_shapes import step_kernels  # noqa: E402

SEQ, TARGET = 48, 24


def small(family: str, **cfg):
    """The matrix's shrunk config (Whisper's encoder positions --seq), with `cfg` set."""
    c = {**shrink(CONFIGS[family]), **cfg}
    if family == "whisper":
        c["max_source_positions"] = SEQ
    return spec_from_config(c, f"small-{family}")


def _setup(precision: str, mode: str = "train") -> Setup:
    return Setup(batch=2, seq=SEQ, target_seq=TARGET, precision=precision, device="cuda", mode=mode)


# --- Whisper's convolutions ---------------------------------------------------------------------------------------
def _conv_bytes(op: Op, nbytes: int) -> float:
    """The bytes of the convolution an implicit-GEMM op stands for: its input (in_channels x the input frames:
    k / CONV_K channels over m x stride frames), weight (n x k), bias (n) and output (m x n)."""
    stride = ab.CONV2_STRIDE if op.name == "conv2" else 1
    return (op.m * stride * op.k / ab.CONV_K + op.n * op.k + op.n + op.m * op.n) * nbytes


def _check_convs(ops: list[Op], kernels, nbytes: int) -> None:
    convs = [o for o in ops if o.name in ("conv1", "conv2")]
    traced = sorted(k.nbytes for k in kernels if k.op == "convolution")
    assert sorted(_conv_bytes(o, nbytes) for o in convs) == traced


def _aten_ops(op: Op) -> int:
    """The aten ops the trace sees for an op list's op: its kernels, but one native_layer_norm_backward for the
    LayerNorm backward's two CUDA kernels (norm.fused_norm) and one sum for a bias gradient's reduction and its
    semaphores' memset (op.column_sum_launches)."""
    if op.kind != "memory":
        return 1
    if op.name.endswith("norm.backward") or op.name.endswith(".bias_grad"):
        return min(op.kernels, 1)
    return op.kernels


def _assert_memory_and_launches(phase: str, ops: list[Op], kernels) -> tuple[float, int, int]:
    """The memory-bound bytes and the kernel count within TOLERANCE, the gathers (embedding, index) and the
    convolutions aside; returns (the bytes' ratio - 1, the op list's kernels, the trace's)."""
    mem = sum(k.nbytes for k in kernels if k.kind == "memory" and k.op not in ("embedding", "index", "convolution"))
    other = sum(o.nbytes for o in ops if o.kind == "memory" and o.name not in ("embed", "embed_positions"))
    assert abs(other / mem - 1) <= TOLERANCE, f"{phase}: memory-bound bytes trace {mem}, op list {other:.0f}"
    launched = sum(_aten_ops(o) for o in ops)
    assert abs(launched / len(kernels) - 1) <= TOLERANCE, f"{phase}: kernels trace {len(kernels)}, op list {launched}"
    return other / mem - 1, launched, len(kernels)


@pytest.mark.slow
@pytest.mark.parametrize("family,precision,decoder_layers", [("whisper", "amp-bf16", 1)] + [
    pytest.param(*c, marks=pytest.mark.heavy) for c in (
        ("bart", "amp-bf16", 1), ("bart", "bf16", 6), ("bart", "amp-bf16", 6), ("bart", "fp32", 6),
        ("whisper", "bf16", 6), ("whisper", "amp-bf16", 6), ("whisper", "fp32", 6))])
def test_generate_prefill_and_decode_match_the_op_list(family, precision, decoder_layers):
    """generate()'s prefill and one decode step as the trace engine runs them (step/infer.py inference_step)."""
    from trainfit.trace.kernel_shapes import inference_kernels

    spec = small(family, decoder_layers=decoder_layers)
    setup = _setup(precision, mode="infer")
    traced_kernels = inference_kernels(spec, setup)
    prefill, decode = prefill_decode_lists(spec, setup)
    act = state_bytes(setup).act
    for phase, ops in (("prefill", prefill), ("decode", decode)):
        kernels = [k for k in traced_kernels if k.phase == phase]
        traced = _traced_shapes(traced_kernels, phase)
        listed = Counter({(phase, *k[1:]): c for k, c in _shapes(
            [o for o in ops if o.name not in ("conv1", "conv2")], "forward").items()})
        assert traced == listed, f"{phase}: trace only {dict(traced - listed)}, op list only {dict(listed - traced)}"
        _check_convs(ops, kernels, act)
        _assert_memory_and_launches(phase, ops, kernels)


# --- training blocks ----------------------------------------------------------------------------------------------
def _block_lists(spec, setup, stack: str) -> dict[str, list[Op]]:
    """One block of `stack`, forward and backward (with the block's gradient sums, ed.block_grad_sums)."""
    enc, dec = shapes(spec, setup, state_bytes(setup))
    parts = forward_lists(spec, enc, dec, spec.dropouts[2], loss=True)
    fwd = parts[stack]
    sums = ed.block_grad_sums(spec, enc, False) if stack == "encoder" else ed.block_grad_sums(spec, dec, True,
                                                                                                enc.tokens)
    return {"forward": fwd, "backward": backward(fwd) + sums}


@pytest.mark.slow
@pytest.mark.parametrize("family,stack,precision", [("bart", "decoder", "bf16")] + [
    pytest.param(*c, marks=pytest.mark.heavy) for c in [
        (f, s, p) for f in ("bart", "whisper") for s in ("encoder", "decoder") for p in ("bf16", "amp-bf16", "fp32")
        if (f, s, p) != ("bart", "decoder", "bf16")]])
def test_block_kernels_match_the_op_list(family, stack, precision):
    """A training block's kernels (dropout on: BART's 0.1s)."""
    keys = ("encoder_layers", "num_hidden_layers") if stack == "encoder" else ("decoder_layers",)
    more, fewer = small(family, **dict.fromkeys(keys, 3)), small(family, **dict.fromkeys(keys, 2))
    setup = _setup(precision)
    assert_block_matches(more, fewer, setup, _block_lists(more, setup, stack), stack)


@pytest.mark.slow
@pytest.mark.heavy
@pytest.mark.parametrize("family,precision", [("bart", "amp-bf16"), ("bart", "bf16"), ("whisper", "amp-bf16"),
                                              ("whisper", "bf16")])
def test_training_step_kernels_match_the_op_list(family, precision):
    """A whole training step, forward and backward (2 encoder + 2 decoder blocks): every GEMM and attention call
    exactly (Whisper's convolutions as in test_generate_prefill_and_decode_match_the_op_list, their backward the
    trace's convolution_backward kernels aside), the memory-bound bytes (the front-ends, the head and its loss, the
    embeddings' gradients, the gradient sums) and the kernel count within TOLERANCE."""
    from trainfit.analytic.encoder_decoder_time import stage_lists

    spec = small(family, decoder_layers=2)
    setup = _setup(precision)
    fwd, bwd = stage_lists(spec, setup)
    kernels = step_kernels(spec, setup)
    for phase, ops in (("forward", fwd), ("backward", bwd)):
        convs = [o for o in ops if o.name.startswith(("conv1", "conv2")) and o.kind == "gemm"]
        traced = _traced_shapes(kernels, phase)
        listed = _shapes([o for o in ops if o not in convs], phase)
        assert traced == listed, f"{phase}: trace only {dict(traced - listed)}, op list only {dict(listed - traced)}"
        ks = [k for k in kernels if k.phase == phase and not k.op.startswith("convolution")]
        _assert_memory_and_launches(phase, [o for o in ops if o not in convs], ks)


@pytest.mark.parametrize("model,seq", [("bart-base", 200), ("whisper-tiny", 1500)])
def test_prefill_op_list_flops_are_the_closed_form_ones(model, seq):
    """The prefill's op list (its GEMMs, Whisper's convolutions and the attention calls) does the FLOPs of
    encoder_decoder.prefill_flops (checked against the trace's FlopCounterMode in test_encoder_decoder_analytic.py)
    at an input and a target of different lengths: Whisper's is_causal self-attention over the (t + 1) / 2 keys its
    kernel visits, BART's, whose mask is a tensor, over every key."""
    from trainfit.analytic.encoder_decoder import prefill_flops
    from trainfit.models.resolve import load_model

    spec = load_model(model)
    setup = Setup(batch=3, seq=seq, target_seq=50, precision="bf16", device="cuda", mode="infer")
    prefill, _ = prefill_decode_lists(spec, setup)
    assert sum(o.flops for o in prefill) == prefill_flops(spec, setup)
