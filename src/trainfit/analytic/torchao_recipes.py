"""torchao's low-precision linears as torchtitan 0.2.2 applies them, per recipe (--low-precision tensorwise |
rowwise | rowwise_with_gw_hp | mxfp8 on --stack torchtitan): which of a projection's three GEMMs run low precision,
the quantise kernels around them, what autograd saves, and the layers kept in bf16. float8.py keeps tensorwise's
own effects (its compiled saved set, the fp8 FSDP all-gather, the flat --efficiency speedup); this module adds the
other recipes without changing tensorwise's numbers (tensorwise's casts stay ops/gemm.py's).

Sources (torchtitan 0.2.2 wheel; torchao v0.16.0 for MX, the release torchtitan 0.2.2's MXLinear import matches —
torchao 0.18 moved MXLinear to prototype/moe_training/mxfp8_linear.py; torchao 0.18 float8/ for the float8 recipes,
unchanged in what is cited here):
  * torchtitan components/quantization/float8.py:65-84: quantize.linear.float8.recipe_name builds torchao's
    Float8LinearConfig.from_recipe_name and asserts that enable_fsdp_float8_all_gather is off (only the default,
    recipe-less tensorwise config gathers in fp8: :87-99); components/quantization/mx.py:42-52,61: MXLinear needs
    sm100 and refuses TP > 1 with compile; job_config.py:731-790: the keys (float8 filter_fqns default [], mx
    filter_fqns default ["output"], mx recipe_name default "mxfp8_cublas"); components/quantization/utils.py:10-27:
    a linear is converted when both dims are multiples of 16 and no filter_fqns entry is a substring of its name.
  * torchao float8/config.py:331-378 from_recipe_name: rowwise — input, weight and grad_output cast AXISWISE (one
    fp32 scale per row along the GEMM's reduction dim) in all three GEMMs; rowwise_with_gw_hp — forward axiswise,
    dgrad: grad_output axiswise and the weight TENSORWISE, wgrad: scaling DISABLED (bf16 GEMM of the saved input and
    the gradient).
  * torchao float8/float8_linear.py:45 saves (input_hp, weight_hp_t) for every recipe and re-casts in backward
    (:107-195): dgrad reads grad_output cast along dim -1 and the weight along dim -1; wgrad reads grad_output and
    the input cast along dim 0 (per column). float8/float8_ops.py:342-345 preprocess_addmm: an A operand not
    row-major and a B operand row-major are copied (.contiguous()) before _scaled_mm — in eager the dgrad weight and
    both wgrad operands; compiled, inductor writes the cast in the layout the GEMM reads.
  * torchao v0.16.0 prototype/mx_formats/mx_linear.py:53 mx_mm saves (input_hp, weight_hp); :67-83 forward casts
    input and weight along dim0 (MXTensor.to_mx, 32-element blocks, one e8m0 scale each); :107-183 backward casts
    grad_output along dim0 and weight, grad_output and input along dim1 (_to_mxfp8_dim1_kernel_wrapper: one triton /
    CUDA kernel reading the bf16 tensor and writing the transposed fp8 data and its scales). config.py:212-221
    mxfp8_cublas: dim0 cast by torch ops (to_mx: mx_tensor.py amax over each block, then the scaled cast), which
    inductor fuses into one pass when compiled.
  * nvfp4: torchtitan 0.2.2 has no NVFP4 training path (quantize.linear.mx's recipes are torchao
    MXLinearRecipeName's mxfp8_* and mxfp4_*: v0.16.0 config.py:42-47): refused by stacks/torchtitan.toml, unless
    --stack-release 2026-08 (torchtitan b5bcd76c6's NVFP4LinearConverter over torchao 0.18's NVFP4Linear): all three
    GEMMs in NVFP4; what it saves, its op-SAC behaviour and its 128-multiple dims in analytic/nvfp4.py, its quantise
    kernels in ops/nvfp4_casts.py.

Memory: the saved tensors are the high-precision input and the weight (a view of the parameter) for every recipe,
as in bf16 (measured on CPU: tests/analytic/test_torchao_recipes.py); under op SAC the policy's; compiled without
recompute, COMPILED_RECAST below. Each linear's quantised operand copies in its backward are a transient beside the
layer's backward high point (backward_transient; tensorwise keeps float8.py's numbers, which leave them out).
"""
from __future__ import annotations

from dataclasses import replace

from ..low_precision import RECIPES, Recipe
from .ops.op import Shape
from .ops.torchao_casts import LOW_GEMMS  # (the op-level half: quantise kernels and GEMM dtypes)
from .te_recipes import runs_te

# the torchao recipes this module models (stacks/torchtitan.toml [low_precision] recipes lists those torchtitan runs)
MODELLED = ("tensorwise", "rowwise", "rowwise_with_gw_hp", "mxfp8", "nvfp4")
# torchtitan's quantize.linear.mx.recipe_name values modelled: torchao's MXLinearRecipeName (v0.16.0 prototype/
# mx_formats/config.py:42-47) -> --low-precision mxfp8's --mx-scale (readers/torchtitan.py, plan/emit_torchtitan.py)
MX_RECIPES = {"mxfp8_cublas": "floor", "mxfp8_cublas_rceil": "rceil"}


def running(setup) -> str:
    """--low-precision where torchao runs it (a MODELLED recipe on a stack whose library is not Transformer
    Engine's: te_recipes.runs_te, whose recipes te_recipes.py and ops/te_casts.py model), else ""."""
    lp = getattr(setup, "low_precision", "none")
    return lp if lp in MODELLED and not runs_te(setup) else ""


def low_gemm_share(name: str) -> float:
    """Of a converted projection's FLOPs (forward, dgrad, wgrad: 2 per weight per token each, flops.py), the share
    in the recipe's format."""
    return sum(LOW_GEMMS.get(name, (True,) * 3)) / 3


def bf16_layers(setup, layers: int) -> int:
    """--bf16-first-layers / --bf16-last-layers: the layers whose linears torchtitan's filter_fqns ("layers.<i>.")
    leaves unconverted (components/quantization/utils.py:24-25), at most all of them."""
    return min(layers, getattr(setup, "bf16_first_layers", 0) + getattr(setup, "bf16_last_layers", 0))


def converted_share(spec, setup) -> float:
    """Of the layers, the share whose linears the recipe converts (the rest: --bf16-first/last-layers)."""
    return 1 - bf16_layers(setup, spec.layers) / spec.layers


def filter_fqns(setup, layers: int) -> list[str]:
    """torchtitan's filter_fqns for `setup`: the stack's filter ("output": the LM head, as trainfit models it) plus
    each block kept in bf16 as "layers.<i>." (a substring match: components/quantization/utils.py:24-25)."""
    fqns = [f for f in str(setup.stack_facts.fact("low_precision", "filter")).split(",") if f]
    first = range(min(setup.bf16_first_layers, layers))
    last = range(max(layers - setup.bf16_last_layers, 0), layers)
    return fqns + [f"layers.{i}." for i in sorted(set(first) | set(last))]


# Compiled with no recompute, the recipes whose backward re-casts each matmul input from the bf16 tensor through a
# fusible transpose + cast, so that the partitioner recomputes the input (a norm output, the SiLU·mul product)
# instead of saving it (compile_effects.block_terms). Measured on CPU (torch 2.13 inductor, torchtitan's block at
# dim 256, tests/analytic/test_compile_float8.py's harness): tensorwise and rowwise save 5400 B per token, bf16 and
# rowwise_with_gw_hp 7832 (its wgrad reads the bf16 input itself, so it is saved). NB: mxfp8 unmeasured (its dim1
# casts are one opaque triton / CUDA kernel reading the materialised input): taken as bf16's set.
COMPILED_RECAST = ("tensorwise", "rowwise")


def compiled_recast_share(spec, setup) -> float:
    """Of the layers, the share whose compiled saved set is COMPILED_RECAST's (0 off or for the other recipes; the
    --bf16-*-layers save as bf16)."""
    if getattr(setup, "low_precision", "none") not in COMPILED_RECAST:
        return 0.0
    return converted_share(spec, setup)


def layer_shapes(spec, setup, sh: Shape) -> list[tuple[float, Shape]]:
    """(share of the layers, Shape) for the converted and the bf16 layers (NB: per pipeline stage the shares are
    the model's, averaged: exact at pp 1)."""
    n = bf16_layers(setup, spec.layers) if sh.float8 else 0
    if not n:
        return [(1.0, sh)]
    q = n / spec.layers
    return [(w, s) for w, s in ((1 - q, sh), (q, replace(sh, float8=False, lp=""))) if w > 0]


def quantised_copies(r: Recipe, tokens: float, k: float, n: float, compiled: bool) -> float:
    """Bytes of the quantised operands one converted linear (k inputs, n outputs, `tokens` rows) holds at once in
    its backward: dgrad's dy and weight, wgrad's dy and x, each in the recipe's format with its scales
    (Recipe.quantised_bytes; rowwise_with_gw_hp: the dgrad pair only). Eager, torchao's backward keeps them in
    locals until it returns (float8_linear.py:94-205, mx_mm.backward), so both pairs are live at the wgrad GEMM;
    compiled, inductor frees each after its last use: the larger pair."""
    low = LOW_GEMMS.get(r.name, (True,) * 3)
    if r.name == "nvfp4":
        # one kernel writes dy's rowwise (dgrad) and columnwise (wgrad) codes, both live through both GEMMs
        # (nvfp4_linear.py:182-229); x's columnwise codes and the weight's are saved tensors, counted there
        return 2 * r.quantised_bytes(tokens * n)
    dgrad = (r.quantised_bytes(tokens * n, int(tokens)) + r.quantised_bytes(k * n, int(k))) if low[1] else 0.0
    wgrad = (r.quantised_bytes(tokens * n, int(n)) + r.quantised_bytes(tokens * k, int(k))) if low[2] else 0.0
    return max(dgrad, wgrad) if compiled else dgrad + wgrad


def backward_transient(spec, setup) -> float:
    """The quantised copies of the largest converted linear (quantised_copies), beside a layer's backward high point
    (memory.py, as quant.dequant_transient). NB: over-reads where the layer's high point is not inside a converted
    linear's backward (by at most this). Not for tensorwise, whose numbers float8.py keeps (its NB: under-read)."""
    lp = running(setup)
    if lp in ("", "tensorwise") or bf16_layers(setup, spec.layers) >= spec.layers:
        return 0.0
    r, t = RECIPES[lp], setup.tp
    tokens = setup.batch * setup.seq / setup.cp
    h = spec.hidden
    shapes = [(h, spec.q_dim / t), (h, spec.kv_dim / t), (spec.q_dim / t, h), (h, spec.intermediate / t),
              (spec.intermediate / t, h)]
    compiled = bool(getattr(setup, "compile", False))
    return max(quantised_copies(r, tokens, k, n, compiled) for k, n in shapes)


def notes(spec, setup, gpu) -> list[str]:
    """What --low-precision (a torchao recipe other than tensorwise: float8.notes) changed, with its NBs."""
    lp = running(setup)
    if lp in ("", "tensorwise"):
        return []
    r = RECIPES[lp]
    gemms = {(True, True, True): "forward, dgrad and wgrad GEMMs", (True, True, False):
             "forward and dgrad GEMMs (wgrad in bf16)"}[LOW_GEMMS[lp]]
    big = backward_transient(spec, setup)
    n = bf16_layers(setup, spec.layers)
    bf16 = f"; {n} layer(s) kept bf16 (filter_fqns)" if n else ""
    if lp == "nvfp4" and setup.recompute == "op":
        saved = ("op SAC stores no NVFP4 GEMM output (aten._scaled_mm_v2 is not on its save list): each NVFP4 "
                 "layer keeps its input and the SDPA outputs and re-runs its whole forward in backward")
    elif lp == "nvfp4":
        saved = ("NVFP4Linear saves its input's and weight's codes, 9/16 B per element, not the bf16 inputs "
                 "(nvfp4_linear.py:141-149)" + ("; compiled: NB eager's set, the partitioner's unmeasured"
                                                 if setup.compile else ""))
    elif setup.compile and setup.recompute == "none":
        saved = ("compiled: each matmul input's cast recomputed, not saved (measured on CPU)" if lp in COMPILED_RECAST
                 else "compiled: the saved set of bf16 (" + ("measured on CPU" if lp != "mxfp8" else "NB: unmeasured")
                 + ")")
    else:
        saved = "saved tensors as in bf16 (torchao saves the high-precision input and weight)"
    lib = {"mxfp8": "MXLinear", "fp4": "NVFP4Linear"}.get(r.peak, "Float8Linear")
    out = [f"{lp}: torchao {lib} on the projections (LM head bf16), "
           f"{gemms} at the {r.peak} peak{bf16}; {saved}; the quantised operand copies of the largest linear's "
           f"backward ({big / 2**20:.0f} MiB) counted beside each layer's backward high point (NB: may over-read "
           "where that point is outside such a linear)"]
    if gpu is not None and r.peak in gpu.peak_flops:
        casts = {"row": "amax + cast per GEMM operand", "block": "one block-scaled cast per GEMM operand"}[r.scale]
        if r.name == "nvfp4":
            casts = "per operand an amax pass and one pass writing its row and RHT'd column codes"
        fraction = "" if r.peak != "mxfp8" else f"; NB: times the fp8 GEMM fraction (no {r.peak} one measured)"
        out.append(f"{lp}: GEMMs at {gpu.peak_flops[r.peak] / 1e12:.0f} TFLOP/s dense{fraction}; the quantisation "
                   f"({casts}) timed as memory-bound ops")
    return out
