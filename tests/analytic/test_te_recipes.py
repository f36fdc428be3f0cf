"""--stack megatron --low-precision: Transformer Engine's memory terms and casts against hand derivations from TE
v2.9's code (te_recipes.py cites each line), on Llama-3.1-8B (h 4096, 32 heads of 128, 8 KV heads, SwiGLU 14336,
32 layers) at TP 1."""
from __future__ import annotations

import pytest

from trainfit.analytic.engine import estimate
from trainfit.analytic.ops import layer_forward
from trainfit.analytic.ops.shape import shape_of
from trainfit.analytic.precision import state_bytes
from trainfit.models.resolve import load_model
from trainfit.setup import Setup

H, Q, KV, I, L = 4096, 4096, 1024, 14336, 32
# one layer's TE linear weights: linear_qkv [h, q + 2kv], linear_proj [q, h], linear_fc1 [h, 2i], linear_fc2 [i, h]
LINEAR = H * (Q + 2 * KV) + Q * H + 2 * H * I + I * H
SEQ = 4096
BASE = dict(stack="megatron", precision="bf16-master", dp=8, zero=1, seq=SEQ, batch=1, grad_accum=4)


@pytest.fixture(scope="module")
def spec():
    return load_model("llama-3.1-8b")


def _est(spec, **kw):
    """The memory (no GPU: nothing timed; the memory terms do not depend on it)."""
    return estimate(spec, Setup(**BASE, **kw))


def test_weight_copies_per_recipe(spec):
    """Extra resident weight bytes: sm90 keeps the fp8 data and its transpose (quantizer.cpp:126,137), 1 byte each;
    MXFP8 rowwise + columnwise, each 1 byte + an e8m0 per 32; --fp8-param-gather drops the 2-byte bf16 parameter;
    delayed adds (history 1 + scale) fp32 for 3 + 2 tensors of each of 4 GEMMs."""
    none = _est(spec).memory
    assert _est(spec, low_precision="tensorwise").memory.weights - none.weights == L * LINEAR * 2
    assert _est(spec, low_precision="delayed").memory.weights - none.weights == L * LINEAR * 2 + L * 4 * 5 * 2 * 4
    gathered = _est(spec, low_precision="tensorwise", fp8_all_gather=True).memory.weights
    assert gathered - none.weights == L * LINEAR * (2 - 2)
    assert _est(spec, low_precision="mxfp8").memory.weights - none.weights == pytest.approx(
        L * LINEAR * 2 * (1 + 1 / 32), abs=1)


def test_bf16_layers_keep_no_copies(spec):
    none = _est(spec).memory.weights
    w = _est(spec, low_precision="tensorwise", bf16_first_layers=1, bf16_last_layers=2).memory.weights
    assert w - none == (L - 3) * LINEAR * 2


def test_saved_linear_inputs_quantised(spec):
    """Per token and layer: ln_out of linear_qkv and linear_fc1 1 byte instead of 2 (layernorm_linear.py:404-414),
    linear_fc2's input 1 byte instead of 2, and linear_proj's fp8 input beside flash's bf16 output (+1 byte per q
    element); under selective recompute that copy replaces the output (-1)."""
    none = _est(spec).memory.activations
    fp8 = _est(spec, low_precision="tensorwise").memory.activations
    assert fp8 - none == pytest.approx(L * SEQ * (-2 * H + Q - I), abs=L)
    none_s = _est(spec, recompute="selective").memory.activations
    fp8_s = _est(spec, low_precision="tensorwise", recompute="selective").memory.activations
    assert fp8_s - none_s == pytest.approx(L * SEQ * (-2 * H - Q - I), abs=L)


def test_casts_and_gemms_of_a_layer(spec):
    """linear_fc2's forward under current scaling: the input's amax (reads T·i bf16) and cast (writes rowwise +
    columnwise, 2·T·i bytes), the weight's amax and cast spread over the 4 micro-batches; the GEMM at the fp8 peak."""
    s = Setup(**BASE, low_precision="tensorwise")
    sh = shape_of(spec, s, state_bytes(s), "bf16")
    ops = {o.name: o for o in layer_forward(spec, sh)}
    fc2 = [o for o in ops.values() if o.kind == "gemm" and o.k == I][0]
    assert fc2.dtype == "fp8"
    x = ops[f"{fc2.name}.x.cast"]
    assert (x.reads, x.writes) == (SEQ * I * 2, 2 * SEQ * I)
    assert ops[f"{fc2.name}.x.amax"].reads == SEQ * I * 2
    # TE v2.9 launches per current-scaling quantise: zero the amax and reduce into it (common/recipe/
    # current_scaling.cu:75, :97-107), the scale from it (:258), the cast (csrc/quantizer.cpp:533): 4
    assert ops[f"{fc2.name}.x.amax"].kernels + ops[f"{fc2.name}.x.scale"].kernels + x.kernels == 4
    w = ops[f"{fc2.name}.w.cast"]
    assert (w.reads, w.writes) == (I * H * 2 / 4, 2 * I * H / 4)
    d = Setup(**BASE, low_precision="delayed")
    names = [o.name for o in layer_forward(spec, shape_of(spec, d, state_bytes(d), "bf16"))]
    assert f"{fc2.name}.x.cast" in names and f"{fc2.name}.x.amax" not in names  # the amax inside the cast


def test_mxfp8_cast_runs_at_transformer_engines_measured_b200_rate(spec):
    """A 16k-token micro-batch's linear_qkv input (16,384 x 4,096 bf16, the element count of the source's 8,192 x
    8,192) quantised to MXFP8 rowwise and columnwise on a B200: timed as TE's own kernel ran there, 52.34 us
    (ROCm/TransformerEngine PR #598, CAST_ONLY, B200 column, bf16 'both'), not at the streaming rate (37 us); the
    weight's cast too (the same kernel); a GPU without the measurement streams it."""
    from trainfit.analytic.compute_time import time_ops
    from trainfit.hardware import get_gpu

    s = Setup(**{**BASE, "seq": 8192, "batch": 2}, low_precision="mxfp8")
    ops = {o.name: o for o in layer_forward(spec, shape_of(spec, s, state_bytes(s), "bf16"))}
    qkv = [o for o in ops.values() if o.kind == "gemm" and o.k == H][0]
    x, w = ops[f"{qkv.name}.x.cast"], ops[f"{qkv.name}.w.cast"]
    assert x.reads + x.writes == pytest.approx(8192 * 8192 * (2 + 2 * (1 + 1 / 32)))
    b200 = get_gpu("B200")
    launch = 3e-6  # kernels.toml [generation.blackwell] launch_seconds, timed beside the kernel
    assert time_ops(b200, [x]).seconds - launch == pytest.approx(52.34e-6, rel=0.01)
    assert x.access == w.access
    h100 = get_gpu("H100-80GB")  # no MXFP8 quantize rate measured on Hopper: the streaming one
    assert time_ops(h100, [x]).seconds == pytest.approx(time_ops(h100, [x._replace(access="vector")]).seconds)


def test_every_layer_in_bf16_is_the_bf16_step(spec):
    """--bf16-first/last-layers covering all 32 layers leaves nothing to the recipe: memory and the layers' time equal
    the step without --low-precision (Megatron runs those layers outside fp8_autocast: fp8_utils.get_fp8_context)."""
    from trainfit.analytic.step_time import layout_step_time
    from trainfit.hardware import get_gpu

    gpu = get_gpu("H100-80GB")
    none = Setup(**BASE)
    all16 = Setup(**BASE, low_precision="tensorwise", bf16_first_layers=16, bf16_last_layers=16)
    assert estimate(spec, all16).memory.peak == estimate(spec, none).memory.peak
    assert layout_step_time(spec, all16, gpu).compute == pytest.approx(layout_step_time(spec, none, gpu).compute,
                                                                        rel=1e-12)


def test_nvfp4_weight_bytes(spec):
    """NVFP4: e2m1 (half a byte) and an e4m3 scale per 16 elements, rowwise and columnwise (arXiv:2509.25149 §2)."""
    none = _est(spec).memory.weights
    assert _est(spec, low_precision="nvfp4").memory.weights - none == pytest.approx(L * LINEAR * 2 * (0.5 + 1 / 16),
                                                                                   abs=1)


def test_trace_and_measure_refuse_in_one_line(spec):
    """Transformer Engine neither builds nor imports without CUDA (stacks/megatron.toml [engines] source): the
    engines that run the stack's step refuse it, saying so."""
    from trainfit import engines
    from trainfit.errors import SetupError

    s = Setup(**BASE, low_precision="tensorwise")
    for run in (engines.trace, engines.measure):
        with pytest.raises(SetupError, match="Transformer Engine's CUDA layers") as e:
            run(spec, s)
        assert "\n" not in str(e.value)


def test_sequence_parallel_gathers_quantised_inputs():
    """TP 8 with SP, full recompute: per layer 4 + 2 all-reduce equivalents (forward, re-run forward, backward); the
    forward and re-run all-gathers (2 + 2 halves) move 1 byte instead of 2 under fp8 (linear.py:176-205):
    6 - 4 · 0.5 · 0.5 = 5 of 6."""
    from trainfit.analytic.step_time import layout_step_time
    from trainfit.hardware import get_gpu

    spec70, gpu = load_model("llama-3.1-70b"), get_gpu("H100-80GB")
    kw = dict(stack="megatron", precision="bf16-master", dp=4, tp=8, zero=1, seq=8192, batch=1, grad_accum=16,
              sequence_parallel=True, recompute="full")
    bf16 = layout_step_time(spec70, Setup(**kw), gpu).tp_comm
    assert layout_step_time(spec70, Setup(**kw, low_precision="tensorwise"), gpu).tp_comm == pytest.approx(
        bf16 * 5 / 6, rel=1e-9)


@pytest.mark.parametrize("lp, release", [("mxfp8", {}), ("nvfp4", {"stack_release": "2026-08"})])
def test_torchao_terms_stay_off_where_transformer_engine_runs_the_recipe(spec, lp, release):
    """A recipe both libraries name: on --stack megatron Transformer Engine runs it, so torchao's backward operand
    copies and its note (torchao_recipes.py) are not the estimate's; on --stack torchtitan they are."""
    from trainfit.analytic import torchao_recipes

    te = Setup(**BASE, low_precision=lp)
    assert torchao_recipes.running(te) == ""
    assert torchao_recipes.backward_transient(spec, te) == 0
    notes = " ".join(estimate(spec, te).notes)
    assert "Transformer Engine" in notes and "torchao" not in notes
    ao = Setup(stack="torchtitan", precision="amp-bf16", dp=8, zero=3, seq=SEQ, batch=1, low_precision=lp, **release)
    assert torchao_recipes.running(ao) == lp
    assert torchao_recipes.backward_transient(spec, ao) > 0
    assert "torchao" in " ".join(estimate(spec, ao).notes)


@pytest.mark.parametrize("lp", ["rowwise", "rowwise_with_gw_hp"])
def test_torchao_only_recipes_are_refused_by_name(lp):
    """torchao's rowwise recipes are no Transformer Engine recipe: one SetupError naming the stack that runs them
    (before: a LookupError from the missing [low_precision] why of stacks/megatron.toml)."""
    from trainfit.errors import SetupError

    with pytest.raises(SetupError, match=f"--low-precision {lp} is not run by --stack megatron.*--stack torchtitan"):
        Setup(**BASE, low_precision=lp)


def test_settings_the_model_cannot_take_are_refused(spec):
    """--etp on a dense model (as --ep) and more bf16 layers than the model has (before: accepted without a word,
    the estimate equal to the step without the flag)."""
    from trainfit.analytic.layout import validate_layout
    from trainfit.errors import SetupError

    with pytest.raises(SetupError, match="--etp 2 .* is dense"):
        validate_layout(spec, Setup(**BASE, etp=2))
    with pytest.raises(SetupError, match="keep 40 layers in bf16, more than the 32"):
        validate_layout(spec, Setup(**BASE, low_precision="tensorwise", bf16_first_layers=20, bf16_last_layers=20))
    validate_layout(spec, Setup(**BASE, low_precision="tensorwise", bf16_first_layers=16, bf16_last_layers=16))


def test_nvfp4_is_refused_on_an_amd_gpu(spec):
    """MI355X lists an fp4 peak (MXFP4's), not NVFP4's format: refused in one line naming the GPUs that run it (before:
    accepted and timed at the fp4 peak)."""
    from trainfit.analytic.float8 import check_gpu
    from trainfit.errors import SetupError
    from trainfit.hardware import get_gpu

    with pytest.raises(SetupError, match="needs NVIDIA fp4 tensor cores, which MI355X has not.*B200"):
        check_gpu(Setup(**BASE, low_precision="nvfp4"), get_gpu("MI355X"))
    check_gpu(Setup(**BASE, low_precision="nvfp4"), get_gpu("B200"))
