"""--low-precision tensorwise: torchao's Float8Linear as torchtitan applies it (tensorwise dynamic scaling; stacks/torchtitan.toml
[float8]): what it changes in memory and in the matmul time.

Which layers: convert_to_float8_training swaps every nn.Linear whose two dims are multiples of 16 and whose name is not
filtered (torchtitan components/quantization/utils.py:10-27; the usual filter is the LM head, "output"): in a Llama
block all seven projections, never the embedding or the norms.

Memory, term by term (torchao 0.18):
  * saved activations, eager: unchanged — the autograd function saves the high-precision input and weight
    (torchao/float8/float8_linear.py:45 `ctx.save_for_backward(input_hp, weight_hp_t)`) and re-casts them in backward
    (:113-195). Measured on CPU (real fp8 GEMMs, torch 2.13): the torchtitan block saves 12312 B per token with and
    without Float8Linear. Compiled, the re-cast goes through a fusible transpose, so the partitioner recomputes each
    matmul input's fp8 cast from what precedes it instead of saving the input: compile_effects.block_terms (measured
    5400 B per token vs 7832 compiled bf16). Under op SAC the saved set is the policy's (mm outputs): unchanged.
  * FSDP all-gather (enable_fsdp_float8_all_gather, with dp sharding only: torchtitan float8.py:87-90): the weight
    shard is cast to fp8 before the all-gather (torchao/float8/fsdp_utils.py:228-251 fsdp_pre_all_gather returns the
    fp8 data and its scale), so every gathered Float8Linear weight is 1 byte per element instead of the stack's
    param_dtype (bf16: 2) — plus one fp32 scale per weight.
  * amax/scale state: none per step — torchao's scaling is dynamic only (float8/config.py:19-31 ScalingType DYNAMIC |
    DISABLED; delayed scaling and its amax history were removed); precompute_float8_dynamic_scale_for_fsdp keeps one
    fp32 scalar per weight (fsdp_utils.py:85), counted with the gathered scales.
  NB: the fp8 copies of one linear's operands (input, weight, gradient; fp8 + transposed copies in backward) are
  transients of that linear and not counted: under-reads a layer's backward high point by about (N·k + N·n) bytes.

Time (analytic/ops/): the converted projections' three GEMMs (forward, dgrad, wgrad) are fp8 GEMMs timed by the
roofline at the fp8 peak and its measured fraction (data/kernels.toml), attention and the LM head stay bf16; each
operand's amax reduction and fp8 cast (input and weight in forward; dY and the transposed copies in backward) are
memory-bound ops of the list. `compute_speedup` below is the flat --efficiency override's version (FLOP share at
the fp8 peak). NB: torchao's small scale kernels (a few per linear) are counted as part of the cast launches.
"""
from __future__ import annotations

from ..hardware import GPU, list_gpus
from ..precision import DTYPE_BYTES
from ..setup import Setup
from ..spec import ModelSpec
from .activations import FP32, linear_params_per_layer
from .parallel.pipeline import Stage
from .precision import policy_dtype
from .te_recipes import runs_te
from .timing import compute_dtype

LINEARS_PER_LAYER = 7  # q, k, v, o, gate, up, down (a Llama block; compile_effects.not_modelled checks the block)


def converted(spec: ModelSpec, setup: Setup) -> int:
    """Parameters of one layer (one TP rank) in Float8Linear modules: every projection whose dims are multiples of 16
    (module_filter_fn)."""
    h, t = spec.hidden, setup.tp
    shapes = [(h, spec.q_dim), (h, spec.kv_dim), (h, spec.kv_dim), (spec.q_dim, h)]
    shapes += [(h, spec.intermediate)] * (3 if spec.gated_mlp else 2)
    return sum(k * n for k, n in shapes if k % 16 == 0 and n % 16 == 0) // t


def autocast_copies_skipped(spec: ModelSpec, setup: Setup) -> float:
    """Parameters of one whole layer whose autocast low-precision weight copy is never made: torchao's Float8Linear
    casts the high-precision weight to fp8 itself, calling no op on autocast's lists with it (float8/
    float8_linear.py:255-268), so a layer under --precision amp-* saves 2 bytes per converted parameter fewer than
    nn.Linear's cached bf16 copy (the trace of torchtitan's step: tests/stacks/test_torchtitan_float8_engines.py);
    in the converted share of the layers (--bf16-*-layers keep theirs). NB: MXLinear's and NVFP4's weights are
    assumed to keep the copies (unmeasured: may over-read)."""
    if setup.low_precision not in ("tensorwise", "rowwise", "rowwise_with_gw_hp") or runs_te(setup):
        return 0.0
    from .torchao_recipes import converted_share

    return converted(spec, setup) * setup.tp * converted_share(spec, setup)


def fp8_all_gather(setup: Setup) -> bool:
    """--fp8-all-gather: torchtitan's enable_fsdp_float8_all_gather, which acts only with FSDP sharding
    (float8.py:87-90), i.e. ZeRO-3 over dp > 1 (setup/rules.py refuses it elsewhere)."""
    return setup.fp8_all_gather and setup.zero == 3 and setup.dp > 1


def gathered_saving(spec: ModelSpec, setup: Setup, stage: Stage) -> float:
    """Bytes fewer in ZeRO-3's gathered parameters (parallel/zero.py gathered_params: the current and the prefetched
    layer) when their Float8Linear weights are gathered in fp8: (param_dtype - 1) bytes per converted element, less
    one fp32 scale per weight."""
    if not fp8_all_gather(setup) or stage.layers == 0:
        return 0.0
    if setup.bf16_first_layers or setup.bf16_last_layers:
        # NB: a bf16 layer gathers in bf16 (filter_fqns) and the high point may fall at one: no saving counted
        # (errs high by up to this saving when the peak falls at a converted layer)
        return 0.0
    param_bytes = DTYPE_BYTES[policy_dtype(setup, "param_dtype")]
    return 2 * (converted(spec, setup) * (param_bytes - 1) - LINEARS_PER_LAYER * FP32)


def fp8_share(spec: ModelSpec, layer_forward: float) -> float:
    """Of one layer's forward FLOPs per token (step_time.ModelCosts.layer_forward), the share in Float8Linear
    matmuls: 2 FLOPs per weight (flops.py)."""
    return min(1.0, 2 * linear_params_per_layer(spec) / layer_forward) if layer_forward else 0.0


def compute_speedup(spec: ModelSpec, setup: Setup, gpu: GPU, layer_forward: float, share_of_stage: float) -> float:
    """Factor by which the stage's matmul time shrinks: the converted FLOPs at the recipe's peak (tensorwise: fp8;
    torchao_recipes.py for the others), the rest (attention, LM head, bf16 layers) at the compute dtype's. `share_of_stage`: the layers' part of the stage's FLOPs."""
    from ..low_precision import recipe
    from .torchao_recipes import MODELLED, converted_share, low_gemm_share

    r = recipe(setup)  # (planner's _Cfg: none)
    if r is None or r.name not in MODELLED or r.peak not in gpu.peak_flops:
        return 1.0
    ratio = gpu.peak_flops[r.peak] / gpu.flops_for(compute_dtype(setup))
    # the recipe's low-precision GEMMs (rowwise_with_gw_hp: 2 of 3), in the converted layers only
    f = fp8_share(spec, layer_forward) * share_of_stage * low_gemm_share(r.name) * converted_share(spec, setup)
    return 1.0 / (f / ratio + (1.0 - f))


def check_gpu(setup: Setup, gpu: GPU | None) -> None:
    """A recipe needs its tensor cores: a GPU without the recipe's peak (low_precision.Recipe.peak) in the catalog
    has none (torchtitan refuses Float8Linear below SM89: components/quantization/float8.py:37-45; MX and NVFP4
    GEMMs need sm100)."""
    from ..errors import SetupError
    from ..low_precision import recipe

    r = recipe(setup)
    if r is None or gpu is None:
        return
    # NVFP4 (e2m1 with an e4m3 scale per 16 and a per-tensor fp32 scale) is NVIDIA Blackwell's format: Transformer
    # Engine runs it from compute capability 10.0 (TE pytorch/quantization.py:171-175 _compute_nvfp4_support),
    # torchao's NVFP4 GEMMs are sm100 CUDA kernels; an AMD GPU's fp4 peak is MXFP4's (e8m0 per 32)
    nvidia = r.name == "nvfp4"

    def runs(g: GPU) -> bool:
        return r.peak in g.peak_flops and (not nvidia or g.vendor == "nvidia")

    if not runs(gpu):
        have = ", ".join(g.name for g in list_gpus() if runs(g)) or "no catalog GPU lists their peak yet"
        raise SetupError(f"--low-precision {r.name} needs {'NVIDIA ' if nvidia else ''}{r.peak} tensor cores, which "
                         f"{gpu.name} has not: drop --low-precision or choose a --gpu that has them ({have})")


def notes(spec: ModelSpec, setup: Setup, gpu: GPU | None) -> list[str]:
    """What --low-precision tensorwise changed in the estimate, and in which direction it may be off."""
    if setup.low_precision != "tensorwise" or runs_te(setup):  # (Transformer Engine's: te_recipes.notes)
        return []
    if setup.recompute != "none" and setup.recompute != "selective":
        saved = f"the saved tensors are --recompute {setup.recompute}'s, float8 or not (measured on CPU)"
    elif setup.compile:
        saved = "compiled: each matmul input's fp8 cast recomputed from the preceding tensor, not saved"
    else:
        saved = "eager: saved inputs stay in the compute dtype (float8_linear.py:45)"
    gather = "; FSDP all-gathers the Float8Linear weights in fp8" if fp8_all_gather(setup) else ""
    out = [f"float8: torchao Float8Linear on the {LINEARS_PER_LAYER} projections of each layer (tensorwise "
           f"scaling, LM head kept bf16); {saved}{gather} (float8.py; NB: the fp8 operand copies of one linear "
           "are not counted: may under-read a layer's backward)"]
    if gpu is not None:
        eager = "" if setup.compile else "; without --compile torchao's casts are separate kernels (timed so)"
        out.append(f"float8: projection GEMMs in fp8 ({gpu.peak_flops['fp8'] / 1e12:.0f} TFLOP/s dense) timed by the "
                   f"roofline, with the amax and cast kernels of every operand as memory-bound ops{eager}")
    return out
