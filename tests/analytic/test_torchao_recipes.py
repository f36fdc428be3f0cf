"""torchao's recipes on --stack torchtitan (analytic/torchao_recipes.py) against independent sources:
  * real CPU runs of torchao's own linears (Float8Linear with each float8 recipe, real fp8 GEMMs on CPU; MXFP8Linear
    emulated): what autograd saves for the backward;
  * hand derivations: the GEMM time under each recipe (the FLOP share at the recipe's peak), one projection's
    quantise bytes from torchao's cast kernels;
  * torchtitan's own refusals (components/quantization/float8.py, mx.py) and calibration C5 / C6's direction.
"""
import dataclasses

import pytest

from trainfit.analytic import torchao_recipes
from trainfit.analytic.engine import estimate
from trainfit.analytic.ops import Shape, gemm
from trainfit.analytic.ops import torchao_casts
from trainfit.analytic.roofline import kernels_for
from trainfit.analytic.step_time import layout_step_time
from trainfit.errors import SetupError
from trainfit.hardware import get_gpu
from trainfit.models.resolve import load_model
from trainfit.setup import Setup
from trainfit.spec import ModelSpec


@pytest.fixture(scope="module")
def llama8b():
    return load_model("llama-3.1-8b")


def b200_mx():
    """B200 with its block-scaled peaks (NVIDIA HGX B200 datasheet, dense: MXFP8 = FP8 4.5 PFLOP/s, FP4 9 PFLOP/s),
    given here until data/gpus.json lists them."""
    g = get_gpu("B200")
    return dataclasses.replace(g, peak_flops={**g.peak_flops, "mxfp8": 4.5e15, "fp4": 9e15})


def c5(**kw) -> Setup:
    """Calibration C5/C6's job: Llama-3-8B, FSDP 8, local batch 1, seq 8192, compile, op SAC."""
    return Setup(batch=1, seq=8192, stack="torchtitan", recompute="op", dp=8, zero=3, compile=True, **kw)


# -- what autograd saves: real torchao linears on CPU ---------------------------------------------------------------
def _torchao_linear(recipe: str, k: int, n: int):
    import torch

    if recipe == "mxfp8":
        from torchao.prototype.moe_training.mxfp8_linear import MXFP8Linear
        from torchao.quantization.quantize_.common.kernel_preference import KernelPreference

        return MXFP8Linear(k, n, bias=False, kernel_preference=KernelPreference.EMULATED).to(torch.bfloat16)
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    m = torch.nn.Sequential(torch.nn.Linear(k, n, bias=False)).to(torch.bfloat16)
    convert_to_float8_training(m, config=Float8LinearConfig.from_recipe_name(recipe))
    return m


@pytest.mark.slow
@pytest.mark.heavy  # torchao's import alone takes ~5 s on 2 cores; the four runs then ~0.5 s
@pytest.mark.parametrize("recipe", [r for r in torchao_recipes.MODELLED if r != "nvfp4"])  # (its codes: test_nvfp4.py)
def test_every_recipe_saves_the_bf16_input_and_the_weight_itself(recipe):
    """torchao saves (input_hp, weight_hp) for every recipe (float8_linear.py:45; mx_mm): per token the linear's
    bf16 input (2·k bytes) and no new weight bytes (the saved weight shares the parameter's storage) — what the
    analytic engine assumes in bf16, so its saved activations are the same with and without the recipe."""
    import torch

    pytest.importorskip("torchao")
    k, n, t = 64, 128, 32
    m = _torchao_linear(recipe, k, n)
    params = {p.untyped_storage().data_ptr() for p in m.parameters()}
    new = []

    def pack(x):
        if x.untyped_storage().data_ptr() not in params:
            new.append(x.untyped_storage().nbytes())
        return x

    x = torch.randn(t, k, dtype=torch.bfloat16, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        y = m(x)
    y.float().sum().backward()  # (the backward runs: the saved set is complete)
    assert sum(new) == 2 * k * t

    spec = ModelSpec(name="titan-tiny", family="llama", causal=True, hidden=256, layers=2, heads=4, kv_heads=2,
                     head_dim=64, intermediate=704, vocab=1024, max_positions=64, gated_mlp=True, activation="silu",
                     norm="rmsnorm", norm_bias=False)
    kw = dict(batch=2, seq=64, stack="torchtitan", precision="bf16", device="cpu")
    base = estimate(spec, Setup(**kw)).memory.phases["forward_end"]
    assert estimate(spec, Setup(low_precision=recipe, **kw)).memory.phases["forward_end"] == base


# -- time: the GEMMs at the recipe's peak (hand derivation) ---------------------------------------------------------
PROJ = 32 * 2 * 218_103_808  # the 32 layers' projection weights, 2 FLOPs per weight per token (one GEMM pass)
RERUN = 32 * 2 * (4096 * 1024 + 4096 * 4096 + 4096 * 14336)  # op SAC re-runs wk, wo, w3 (every second mm)
HEAD = 2 * 128256 * 4096


@pytest.mark.parametrize("recipe, kw, passes, kept", [
    ("rowwise", {}, 3, 1.0),  # forward, dgrad, wgrad all fp8
    ("rowwise_with_gw_hp", {}, 2, 1.0),  # wgrad in bf16 (float8/config.py:364-368)
    ("rowwise", {"bf16_first_layers": 1, "bf16_last_layers": 3}, 3, 28 / 32),  # 4 of 32 layers filtered
])
def test_float8_recipes_run_their_low_precision_gemms_at_the_fp8_peak(llama8b, recipe, kw, passes, kept):
    """GEMM time = f/r + 1 - f of bf16's (all of these GEMMs are compute-bound with the same tiles in both dtypes),
    f = the FLOP share in fp8: `passes` of the three GEMM passes over the converted layers' projections, plus the
    op-SAC re-run (forward: fp8), of all GEMM FLOPs (three passes of projections, re-run and LM head); r = H100's
    fp8 / bf16 dense peaks (1978.9 / 989.4 TFLOP/s, data/gpus.json) times their measured fractions (kernels.toml)."""
    gpu = get_gpu("H100")
    kn = kernels_for(gpu)
    r = (1978.9 * kn.matmul("fp8")) / (989.4 * kn.matmul("bf16"))
    f = kept * (passes * PROJ + RERUN) / (3 * PROJ + RERUN + 3 * HEAD)
    a = layout_step_time(llama8b, c5(), gpu)
    b = layout_step_time(llama8b, c5(low_precision=recipe, **kw), gpu)
    assert b.compute_terms["gemm"] / a.compute_terms["gemm"] == pytest.approx(f / r + 1 - f, rel=2e-3)
    assert b.compute_terms["attention"] == pytest.approx(a.compute_terms["attention"], rel=1e-12)


def test_mxfp8_gemms_run_at_the_mxfp8_peak_with_fp8s_fraction(llama8b):
    """B200: the MX GEMMs at the MXFP8 peak (4.5 PFLOP/s) times the catalog's MXFP8 GEMM fraction (kernels.toml;
    fp8's where a GPU has none: roofline.Kernels.matmul), bf16 at 2.25 PFLOP/s times its own."""
    gpu = b200_mx()
    kn = kernels_for(gpu)
    r = (4.5e15 * kn.matmul("mxfp8")) / (gpu.peak_flops["bf16"] * kn.matmul("bf16"))
    f = (3 * PROJ + RERUN) / (3 * PROJ + RERUN + 3 * HEAD)
    a, b = layout_step_time(llama8b, c5(), gpu), layout_step_time(llama8b, c5(low_precision="mxfp8"), gpu)
    assert b.compute_terms["gemm"] / a.compute_terms["gemm"] == pytest.approx(f / r + 1 - f, rel=2e-3)


# -- the quantise kernels of one projection (hand derivation from torchao's casts) ---------------------------------
def _cast_bytes(recipe: str, compiled: bool) -> float:
    sh = Shape(batch=1, seq=8192, compile=compiled, float8=True, lp=recipe)
    g = gemm("q", 8192, 4096, 4096, sh, "", fp8=True)
    casts, g = torchao_casts.quantise(g, sh)
    return sum(o.nbytes for o in casts + torchao_casts.backward_extra([g], sh))


T, K, N = 8192, 4096, 4096  # wq of Llama-3.1-8B at seq 8192: x [T, K], w [K, N], dy [T, N]


def _amax_cast(elements: float, scales: float) -> float:
    """torch.amax over the bf16 operand (read 2e, write the fp32 scales), then the scaled cast (read 2e and the
    scales, write e fp8 bytes and the scales)."""
    return 2 * elements + scales + 2 * elements + scales + elements + scales


def test_rowwise_casts_of_one_projection():
    """rowwise (float8_linear.py:56-83, 113-195): forward x per token (T scales) and w per output column (N);
    backward dy per token (T), w per input row (K), dy per column (N) and x per column (K), each amax + cast; eager,
    the dgrad weight and both wgrad operands are then copied to the layout _scaled_mm reads
    (float8_ops.py:342-345): read + write of their fp8 bytes (+ scales)."""
    e = {"x": T * K, "w": K * N, "dy": T * N}
    casts = (_amax_cast(e["x"], 4 * T) + _amax_cast(e["w"], 4 * N) + _amax_cast(e["dy"], 4 * T)
             + _amax_cast(e["w"], 4 * K) + _amax_cast(e["dy"], 4 * N) + _amax_cast(e["x"], 4 * K))
    copies = 2 * ((e["w"] + 4 * K) + (e["dy"] + 4 * N) + (e["x"] + 4 * K))
    # the backward GEMMs run without fast accumulation, so torchao multiplies their bf16 outputs (dgrad's T x K,
    # wgrad's K x N) by the outer product of the row scales (float8/config.py:215-217, float8_ops.py:53-57, :84-85):
    # compiled one fused kernel, read + write 2 bytes each; eager the fp32 outer product first (write 4), then the
    # in-place multiply (read 2 + 4, write 2)
    outputs = T * K + K * N
    assert _cast_bytes("rowwise", compiled=True) == pytest.approx(casts + 4 * outputs)
    assert _cast_bytes("rowwise", compiled=False) == pytest.approx(casts + copies + 12 * outputs)


def test_gw_hp_casts_only_for_the_forward_and_dgrad():
    """rowwise_with_gw_hp (float8/config.py:353-378): forward as rowwise; dgrad: dy per token and the weight
    tensorwise (one fp32 scale); wgrad: no casts, and its GEMM runs bf16."""
    e = {"x": T * K, "w": K * N, "dy": T * N}
    want = _amax_cast(e["x"], 4 * T) + _amax_cast(e["w"], 4 * N) + _amax_cast(e["dy"], 4 * T) + _amax_cast(e["w"], 4)
    assert _cast_bytes("rowwise_with_gw_hp", compiled=True) == pytest.approx(want)
    sh = Shape(batch=1, seq=8192, float8=True, lp="rowwise_with_gw_hp")
    from trainfit.analytic.ops import backward

    bwd = torchao_casts.backward_gemms(backward([gemm("q", T, N, K, sh, "", fp8=True)]), sh)
    assert [(o.name, o.dtype) for o in bwd] == [("q.dgrad", "fp8"), ("q.wgrad", "bf16")]


def test_mxfp8_casts_are_one_pass_each():
    """MXFP8 (mx_linear.py:67-183): six casts (x, w along dim0; dy along dim0; w, dy, x along dim1), each one kernel
    reading the bf16 operand and writing e fp8 bytes and one e8m0 byte per 32 elements."""
    e = (T * K, K * N, T * N, K * N, T * N, T * K)
    assert _cast_bytes("mxfp8", compiled=True) == pytest.approx(sum(3 * x + x / 32 for x in e))


@pytest.mark.parametrize("scale, dim0_us", [("floor", 125.92), ("rceil", 220.10)])
def test_mx_cast_kernels_per_scale_rounding_run_at_torchaos_measured_times(scale, dim0_us):
    """torchao's cast benchmark (kernels.toml MXCAST; benchmarks/mx_formats/cast_bench.py) on a B200: a 16384 x 16384
    bf16 tensor cast to mxfp8 along dim0 (to_mx + torch.compile) takes 125.92 us with FLOOR scales and 220.10 us
    with RCEIL's (inductor keeps its clamp); along dim1 (the CUDA kernel) 150.56 / 142.34 us. The op list's casts
    of one projection, sized as that benchmark's tensor, take those times: torchao's bytes (2 read, 1 + 1/32
    written per element) at the kernels' rates, less the launch (3 us, outside cast_bench's kernel timing)."""
    from trainfit.analytic.roofline import memory_seconds
    from trainfit.stacks import get_stack

    kinds = get_stack("torchtitan").fact("low_precision", "mx_cast_kernels")[scale]
    sh = Shape(batch=1, seq=16384, compile=True, float8=True, lp="mxfp8", mx_casts=tuple(kinds))
    g = gemm("q", 16384, 16384, 16384, sh, "", fp8=True)
    fwd, g = torchao_casts.quantise(g, sh)
    bwd = torchao_casts.backward_extra([g], sh)
    b200 = get_gpu("B200")
    launch = kernels_for(b200).launch_seconds
    us = {o.name: (memory_seconds(b200, o.nbytes, o.kernels, o.access) - launch) * 1e6 for o in fwd + bwd}
    dim1_us = {"floor": 150.56, "rceil": 142.34}[scale]
    assert us["q.cast_x"] == pytest.approx(dim0_us, rel=0.01)  # x [T, K] along dim0: the benchmark's own shape
    assert us["q.cast_dy"] == pytest.approx(dim0_us, rel=0.01)
    assert us["q.cast_xT"] == pytest.approx(dim1_us, rel=0.01)


def test_mx_scale_is_a_torchtitan_mxfp8_setting(llama8b):
    """--mx-scale rceil is torchao's mxfp8_cublas_rceil: refused without --low-precision mxfp8 and on stacks that do
    not run torchao's MX recipes (Megatron's MXFP8 is Transformer Engine's); on the C6 job it is slower than floor by
    its dim0 casts and nothing else costs memory."""
    for kw in (dict(low_precision="tensorwise"),
               dict(stack="megatron", precision="bf16-master", low_precision="mxfp8", zero=1)):
        with pytest.raises(SetupError) as e:
            Setup(**{**dict(batch=1, seq=8192, stack="torchtitan", dp=8, zero=3, mx_scale="rceil"), **kw})
        assert "--mx-scale" in str(e.value) and "\n" not in str(e.value)
    gpu = b200_mx()
    floor, rceil = c5(low_precision="mxfp8"), c5(low_precision="mxfp8", mx_scale="rceil")
    assert layout_step_time(llama8b, rceil, gpu).step_seconds > layout_step_time(llama8b, floor, gpu).step_seconds
    assert estimate(llama8b, rceil, gpu).memory.peak == estimate(llama8b, floor, gpu).memory.peak


# -- refusals (torchtitan 0.2.2's own) and the notes ----------------------------------------------------------------
@pytest.mark.parametrize("kw, words", [
    (dict(low_precision="nvfp4"), "NVFP4"),
    (dict(low_precision="rowwise", fp8_all_gather=True), "--fp8-all-gather"),  # float8.py:65-69
    (dict(low_precision="mxfp8", tp=2, dp=4, compile=True), "--tp"),  # mx.py:46-52
])
def test_what_torchtitan_refuses_is_refused_in_one_line(kw, words):
    base = {**dict(batch=1, seq=8192, stack="torchtitan", dp=8, zero=3), **kw}
    with pytest.raises(SetupError) as e:
        Setup(**base)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_mxfp8_needs_sm100(llama8b):
    with pytest.raises(SetupError) as e:
        estimate(llama8b, c5(low_precision="mxfp8"), get_gpu("H100"))
    assert "mxfp8 tensor cores" in str(e.value)


def test_c5_c6_direction_and_notes(llama8b):
    """C5 (H100, tensorwise + fp8 all-gather: 6150 -> 7689.5 tokens/s, 47.65 -> 47.77 GiB reserved) and C6 (B200,
    mxfp8: 8307.5 -> 9969.0, 33.71 -> 33.88 GiB): faster, and memory within the quantised copies' NB (the peak does
    not fall: nothing saved is dropped)."""
    h, b = get_gpu("H100-96GB"), b200_mx()
    for gpu, kw in ((h, dict(low_precision="tensorwise", fp8_all_gather=True)), (b, dict(low_precision="mxfp8"))):
        base, lp = estimate(llama8b, c5(), gpu), estimate(llama8b, c5(**kw), gpu)
        assert lp.time.tokens_per_second > base.time.tokens_per_second
        assert lp.memory.peak == pytest.approx(base.memory.peak, rel=0.01)
    notes = " ".join(estimate(llama8b, c5(low_precision="mxfp8"), b).notes)
    assert "MXLinear" in notes and "NB" in notes


def test_backward_transient_is_the_gate_projections_quantised_operands(llama8b):
    """Llama-3.1-8B at 8192 tokens, rowwise: the largest linear's quantised operands are the gate (or up)
    projection's (k = 4096 in, n = 14336 out): dgrad's dy (T·n fp8 + T fp32 row scales) and weight (k·n + k scales),
    wgrad's dyᵀ (T·n + n scales) and xᵀ (T·k + k scales). Compiled, the larger pair (dgrad's); eager, torchao's
    backward holds all four until it returns."""
    tk, k, n = 8192, 4096, 14336
    dgrad = tk * n + 4 * tk + k * n + 4 * k
    wgrad = tk * n + 4 * n + tk * k + 4 * k
    kw = dict(batch=1, seq=8192, stack="torchtitan", recompute="op", dp=8, zero=3, low_precision="rowwise")
    assert torchao_recipes.backward_transient(llama8b, Setup(compile=True, **kw)) == dgrad
    assert torchao_recipes.backward_transient(llama8b, Setup(**kw)) == dgrad + wgrad
    assert torchao_recipes.backward_transient(llama8b, Setup(**{**kw, "low_precision": "tensorwise"})) == 0


def test_bf16_layers_save_as_bf16_when_compiled(llama8b):
    """Compiled without recompute, rowwise's layers save tensorwise's set (5400 B/token on the CPU block, the matmul
    inputs' casts recomputed) and a --bf16-*-layers layer bf16's: over the model, the layers' mean."""
    from trainfit.analytic import compile_effects
    from trainfit.analytic.precision import state_bytes

    kw = dict(batch=1, seq=8192, stack="torchtitan", dp=8, zero=3, compile=True)
    s_bf16, s_rw = Setup(**kw), Setup(low_precision="rowwise", **kw)
    s_mix = Setup(low_precision="rowwise", bf16_first_layers=2, bf16_last_layers=6, **kw)
    total = {s: sum(compile_effects.block_terms(llama8b, s, state_bytes(s)).values()) for s in (s_bf16, s_rw, s_mix)}
    assert total[s_mix] == pytest.approx((24 * total[s_rw] + 8 * total[s_bf16]) / 32)
    assert total[s_rw] < total[s_bf16]
