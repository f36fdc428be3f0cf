"""--low-precision nvfp4 on --stack torchtitan --stack-release 2026-08 (analytic/nvfp4.py, ops/nvfp4_casts.py,
stacks/torchtitan.toml [releases."2026-08"]) against independent sources:
  * torchao's own NVFP4 autograd Function (nvfp4_linear.py nvfp4_mm_triton) run on meta tensors with its kernels'
    registered fake implementations (its Triton kernels need an sm100 GPU; on CPU torchao leaves them unregistered,
    so the heavy test registers them): the bytes it saves for backward and the aten op its GEMMs dispatch to;
  * hand derivations: the GEMM time ratio vs bf16 on B200, one projection's quantise bytes, the op-SAC saved set;
  * torchtitan b5bcd76c6's own refusals (sm100 only, dims multiples of 128) and the release overlay.
"""
import subprocess
import sys

import pytest

from trainfit.analytic.engine import estimate
from trainfit.analytic.ops import Shape, gemm
from trainfit.analytic.ops import torchao_casts
from trainfit.analytic.roofline import kernels_for
from trainfit.analytic.step_time import layout_step_time
from trainfit.errors import SetupError
from trainfit.hardware import get_gpu
from trainfit.low_precision import RECIPES
from trainfit.models.resolve import load_model
from trainfit.setup import Setup
from trainfit.spec import ModelSpec
from trainfit.stacks import get_stack

RELEASE = "2026-08"
T, K, N = 8192, 4096, 4096  # wq of Llama-3.1-8B at seq 8192: x [T, K], w [N, K], dy [T, N]


@pytest.fixture(scope="module")
def llama8b():
    return load_model("llama-3.1-8b")


def c6(**kw) -> Setup:
    """The C6-style job: Llama-3.1-8B, FSDP 8, local batch 1, seq 8192, compile, op SAC."""
    return Setup(**{**dict(batch=1, seq=8192, stack="torchtitan", recompute="op", dp=8, zero=3, compile=True), **kw})


def nvfp4(**kw) -> Setup:
    return c6(stack_release=RELEASE, low_precision="nvfp4", **kw)


# -- the release and the refusals ------------------------------------------------------------------------------------
def test_pinned_torchtitan_refuses_nvfp4_naming_the_release_that_runs_it():
    with pytest.raises(SetupError) as e:
        c6(low_precision="nvfp4")
    msg = str(e.value)
    assert f"--stack-release {RELEASE}" in msg and "\n" not in msg
    release = get_stack("torchtitan", RELEASE)
    assert "nvfp4" in release.fact("low_precision", "recipes")
    assert release.facts["low_precision"]["dims_multiple"] == {"nvfp4": 128}  # nvfp4.py:37-39 _NVFP4_BLOCK
    assert "nvfp4" not in get_stack("torchtitan").fact("low_precision", "recipes")


@pytest.mark.parametrize("gpu, words", [("H100-80GB", "fp4 tensor cores"), ("MI355X", "NVIDIA")])
def test_nvfp4_needs_an_nvidia_sm100_gpu(llama8b, gpu, words):
    """torchtitan nvfp4.py:291-292 (SM100 or later); an AMD GPU's fp4 peak is not NVFP4's kernels."""
    with pytest.raises(SetupError) as e:
        estimate(llama8b, nvfp4(), get_gpu(gpu))
    assert words in str(e.value) and "\n" not in str(e.value)


def test_every_gemm_dim_must_be_a_multiple_of_128(llama8b):
    """nvfp4_linear.py:94-98 (M, K, N % 128, else ValueError): tokens 8000 and an MLP width of 704 are refused;
    Llama-3.1-8B at TP 8 (512, 128 and 1792 local columns) is not."""
    with pytest.raises(SetupError, match="tokens per rank"):
        estimate(llama8b, Setup(batch=1, seq=8000, stack="torchtitan", stack_release=RELEASE, low_precision="nvfp4"))
    tiny = ModelSpec(name="titan-tiny", family="llama", causal=True, hidden=256, layers=2, heads=4, kv_heads=2,
                     head_dim=64, intermediate=704, vocab=1024, max_positions=256, gated_mlp=True, activation="silu",
                     norm="rmsnorm", norm_bias=False)
    with pytest.raises(SetupError, match="MLP width / tp = 704"):
        estimate(tiny, Setup(batch=1, seq=256, stack="torchtitan", stack_release=RELEASE, low_precision="nvfp4"))
    estimate(llama8b, Setup(batch=1, seq=8192, stack="torchtitan", stack_release=RELEASE, low_precision="nvfp4",
                            tp=8), get_gpu("B200"))


def test_the_refusal_names_only_a_flag_that_fixes_it(llama8b):
    """The advice follows the dims refused: tokens -> --batch/--seq, a width over TP that tp 1 would run -> --tp; a
    width of the model itself (hidden 320) is no flag's to change (before: 'change --batch/--seq/--tp' for each)."""
    with pytest.raises(SetupError) as e:
        estimate(llama8b, Setup(batch=1, seq=8000, stack="torchtitan", stack_release=RELEASE, low_precision="nvfp4"))
    assert str(e.value).endswith("tokens per rank (batch × seq / cp) = 8000; change --batch/--seq, or keep the "
                                 "layers bf16")
    with pytest.raises(SetupError) as e:
        estimate(llama8b, Setup(batch=1, seq=8192, stack="torchtitan", stack_release=RELEASE, low_precision="nvfp4",
                                tp=16))
    assert str(e.value).endswith("k/v projection / tp = 64; change --tp, or keep the layers bf16")
    odd = ModelSpec(name="odd", family="llama", causal=True, hidden=320, layers=2, heads=5, kv_heads=5,
                    head_dim=64, intermediate=768, vocab=1024, max_positions=256, gated_mlp=True, activation="silu",
                    norm="rmsnorm", norm_bias=False)
    with pytest.raises(SetupError) as e:
        estimate(odd, Setup(batch=1, seq=256, stack="torchtitan", stack_release=RELEASE, low_precision="nvfp4"))
    msg = str(e.value)
    assert "hidden = 320" in msg and msg.endswith("no flag changes odd's own widths: use another --low-precision")
    assert "--tp" not in msg and "--batch" not in msg


# -- memory: op SAC stores no NVFP4 GEMM output (hand derivation) ----------------------------------------------------
def test_op_sac_keeps_no_projection_output_of_an_nvfp4_layer(llama8b):
    """Op SAC stores the outputs of the save list's ops; in a bf16 layer the 1st, 3rd and 5th aten.mm (q, v, gate:
    q_dim + kv_dim + intermediate bf16 values per token), in an NVFP4 layer none (its GEMMs are aten._scaled_mm_v2,
    not on the list: the heavy test below sees the op). With the last 5 layers bf16, 27 layers keep
    27 · 8192 · 2 · (4096 + 1024 + 14336) bytes fewer."""
    gpu = get_gpu("B200")
    bf16, fp4 = estimate(llama8b, c6(), gpu).memory, estimate(llama8b, nvfp4(bf16_last_layers=5), gpu).memory
    assert bf16.peak - fp4.peak == 27 * T * 2 * (4096 + 1024 + 14336)


@pytest.mark.parametrize("compiled", [False, True])
def test_without_recompute_an_nvfp4_layer_saves_codes_not_bf16_inputs(llama8b, compiled):
    """No recompute: each NVFP4 linear saves its input's and its weight's codes, 9/16 byte per element
    (nvfp4_linear.py:141-149; the heavy test below counts them on torchao's own Function), where bf16 saved the two
    norm outputs and the SiLU·mul product (2 bytes each) and a view of the weight. Per token of a layer: codes of
    wq, wk, wv, w1, w3's input (h each), wo's (h), w2's (intermediate) less 2·(2h + intermediate); per layer the
    projection weights' codes. 27 NVFP4 layers at the end of the forward, where every layer's saved set is live."""
    h, i = 4096, 14336
    per_token = 9 / 16 * (6 * h + i) - 2 * (2 * h + i)
    weights = 9 / 16 * (2 * h * (h + 1024) + 3 * h * i)
    gpu, kw = get_gpu("B200"), dict(recompute="none", compile=compiled)
    bf16 = estimate(llama8b, c6(**kw), gpu).memory.phases["forward_end"]
    fp4 = estimate(llama8b, nvfp4(bf16_last_layers=5, **kw), gpu).memory.phases["forward_end"]
    assert fp4 - bf16 == pytest.approx(27 * (per_token * T + weights), abs=1)


# -- time: the GEMMs at the fp4 peak (hand derivation) ---------------------------------------------------------------
PROJ = 2 * 218_103_808  # one layer's projection weights, 2 FLOPs per weight per token (one GEMM pass)
RERUN = 2 * (4096 * 1024 + 4096 * 4096 + 4096 * 14336)  # op SAC re-runs wk, wo, w3 of a bf16 layer
HEAD = 2 * 128256 * 4096


def test_nvfp4_gemm_time_vs_bf16(llama8b):
    """B200, GEMM time of the step relative to bf16's: an NVFP4 layer runs its three passes and the op-SAC re-run
    of all seven projections (none stored) at the fp4 peak (9 PFLOP/s, data/gpus.json, times its measured fraction,
    kernels.toml); a bf16 layer three passes and the re-run of every second mm at 2.25 PFLOP/s times bf16's; the
    LM head bf16. 27 NVFP4 layers and 5 bf16 ones. NB: within 0.5 %, not exact: each GEMM's launch and its last
    wave (roofline.py) do not shrink with the peak, and at 3.1x bf16's rate they weigh more than under fp8."""
    gpu = get_gpu("B200")
    kn = kernels_for(gpu)
    r = (9e15 * kn.matmul("fp4")) / (2.25e15 * kn.matmul("bf16"))
    bf16 = 32 * (3 * PROJ + RERUN) + 3 * HEAD
    fp4 = 27 * 4 * PROJ / r + 5 * (3 * PROJ + RERUN) + 3 * HEAD
    a = layout_step_time(llama8b, c6(), gpu)
    b = layout_step_time(llama8b, nvfp4(bf16_last_layers=5), gpu)
    assert b.compute_terms["gemm"] / a.compute_terms["gemm"] == pytest.approx(fp4 / bf16, rel=5e-3)
    assert b.compute_terms["attention"] == pytest.approx(a.compute_terms["attention"], rel=1e-12)


def test_one_projections_quantise_bytes():
    """torchao's kernels around one NVFP4 GEMM (nvfp4_linear.py:103-123, 179-192): per operand (x, w forward; dy
    backward) an amax pass reading the bf16 operand (two fp32 scalars out) and one pass reading it again and
    writing its row and column NVFP4 copies, 9/16 byte per element each (e2m1 + one e4m3 scale per 16)."""
    sh = Shape(batch=1, seq=T, compile=True, float8=True, lp="nvfp4")
    g = gemm("q", T, N, K, sh, "", fp8=True)
    casts, g = torchao_casts.quantise(g, sh)
    assert g.dtype == "fp4"
    bwd = torchao_casts.backward_extra([g], sh)

    def operand(e, amaxes=2):  # (the weight's amax is one torch max: nvfp4_linear.py:45)
        return (2 * e + 4 * amaxes) + (2 * e + 2 * e * 9 / 16)

    assert sum(o.nbytes for o in casts) == operand(T * K) + operand(N * K, 1)
    assert sum(o.nbytes for o in bwd) == operand(T * N)


# -- torchao's own autograd Function on meta tensors -----------------------------------------------------------------
_META_RUN = r"""
import importlib, json, torch, torch.utils._triton as tu
from torch.utils._python_dispatch import TorchDispatchMode
import torchao.prototype.moe_training  # (its other kernels keep has_triton's own answer)
tu.has_triton = lambda: True  # register nvfp4_training's custom ops and their fake kernels (sm100 Triton)
P = "torchao.prototype.moe_training.nvfp4_training."
for name in ("hadamard_amax_triton", "hadamard_quantize_row_col_triton", "quantize_2d_triton", "nvfp4_linear"):
    importlib.reload(importlib.import_module(P + name))
nl = importlib.import_module(P + "nvfp4_linear")
T, K, N = 256, 512, 384
ops, saved = [], []
class Ops(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        flat = out if isinstance(out, (tuple, list)) else (out,)
        ops.append((str(func), sum(t.numel() * t.element_size() for t in flat if isinstance(t, torch.Tensor))))
        return out
x = torch.empty(T, K, dtype=torch.bfloat16, device="meta", requires_grad=True)
w = torch.empty(N, K, dtype=torch.bfloat16, device="meta", requires_grad=True)
seed = torch.empty(1, dtype=torch.int64, device="meta")
with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel() * t.element_size()) or t, lambda t: t):
    with Ops():
        y = nl.nvfp4_mm_triton.apply(x, w, None, seed, (1,) * 16)
print(json.dumps({"saved": sum(saved), "ops": ops, "T": T, "K": K, "N": N}))
"""


@pytest.mark.heavy  # a fresh process importing torchao (~6 s on 2 cores)
def test_torchaos_nvfp4_linear_saves_nvfp4_codes_and_runs_scaled_mm_v2():
    """What nvfp4_mm_triton saves (the input's column codes and the weight's transposed codes, each 9/16 byte per
    element, plus two fp32 amaxes and the int64 seed), that its GEMM is aten._scaled_mm_v2 — on neither torchtitan
    0.2.2's op-SAC save list nor torch's compute-intensive ops (which torchtitan b5bcd76c6 saves) — and that its
    quantise kernels write the bytes ops/nvfp4_casts.py counts."""
    import json

    from torch._functorch.partitioners import get_default_op_list
    from torchtitan.models.llama3.infra.parallelize import _op_sac_save_list

    from trainfit.analytic.ops.nvfp4_casts import forward_casts

    run = subprocess.run([sys.executable, "-c", _META_RUN], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    t, k, n = got["T"], got["K"], got["N"]
    q = RECIPES["nvfp4"].quantised_bytes
    assert got["saved"] == q(t * k) + q(n * k) + 2 * 4 + 8
    names = [name for name, _ in got["ops"]]
    assert "aten._scaled_mm_v2.default" in names and "aten.mm.default" not in names
    import torch

    assert not hasattr(torch.ops.aten, "_scaled_mm_v2") or \
        torch.ops.aten._scaled_mm_v2.default not in _op_sac_save_list
    assert "aten._scaled_mm_v2" not in {str(op) for op in get_default_op_list().compute_intensive_ops}
    # the quantise kernels' outputs: the amaxes (the weight's by aten.max), the row + column copies per cast
    written = sum(b for name, b in got["ops"] if name.startswith("torchao.") or name == "aten.max.default")
    sh = Shape(batch=1, seq=t, compile=True, float8=True, lp="nvfp4")
    mine = forward_casts(gemm("p", t, n, k, sh, "", fp8=True)._replace(dtype="fp4"), sh)
    assert written == sum(o.writes for o in mine)


def test_emit_torchtitan_refuses_nvfp4_in_one_line():
    """torchtitan b5bcd76c6 builds jobs from Python config functions (models/llama3/config_registry.py:229-249),
    not 0.2.2's job-config TOML the emitter writes."""
    from trainfit.plan.emit_torchtitan import supports

    why = supports(nvfp4(bf16_last_layers=5))
    assert why and "config_registry.py" in why and "\n" not in why
    assert supports(c6(low_precision="mxfp8")) is None
