"""--low-precision nvfp4 on --stack torchtitan (--stack-release 2026-08): torchtitan's NVFP4LinearConverter swapping
the decoder layers' linears for torchao's NVFP4Linear. What it changes beside the other torchao recipes
(torchao_recipes.py: which GEMMs, the bf16 layers; ops/nvfp4_casts.py: the quantise kernels).

Sources: torchtitan b5bcd76c6 components/quantization/nvfp4.py (the converter), torchao 0.18
prototype/moe_training/nvfp4_training/nvfp4_linear.py (the autograd Function nvfp4_mm_triton), torch 2.13.
  * all three GEMMs in NVFP4 (nvfp4_linear.py:126-136 forward, :201-211 dgrad, :219-229 wgrad), each through
    torch.nn.functional.scaled_mm, i.e. aten._scaled_mm_v2 (torch/nn/functional.py:7207), at the GPU's fp4 peak;
  * saved for backward (nvfp4_linear.py:141-149): the input's RHT'd columnwise NVFP4 codes and scales, the weight's
    transposed NVFP4 codes and scales, two fp32 amaxes and the seed: 9/16 byte per input element and per weight
    element (a new tensor per layer, not a view of the gathered weight), instead of the bf16 input and weight view;
  * per-op SAC: torchtitan's save list stores aten.mm outputs (stacks/torchtitan.toml [op_sac]); the NVFP4 GEMM is
    aten._scaled_mm_v2, which no save list names (torchtitan 0.2.2 parallelize.py:36-51; at b5bcd76c6
    distributed/activation_checkpoint.py:31-94, which adds torch's compute-intensive ops: aten.mm and aten._scaled_mm,
    not _v2: torch/_functorch/partitioners.py:2971-2983), and torchao's quantise kernels are custom ops no list
    names either: a converted block stores only its input and the SDPA outputs, and its backward re-runs its whole
    forward, the seven NVFP4 GEMMs and their casts included;
  * every converted GEMM's M, K and N must be multiples of 128 (nvfp4_linear.py:94-98; torchtitan nvfp4.py:97-110
    raises for a model dim, the kernel for a TP-local one): the converter raises instead of filtering, so trainfit
    refuses such a setup (check).
"""
from __future__ import annotations

from ..errors import SetupError

NAME = "nvfp4"
GEMM_OP = "scaled_mm_v2"  # the aten op NVFP4Linear's GEMMs dispatch to (module docstring)


def active(setup) -> bool:
    """--low-precision nvfp4 run by torchao (Transformer Engine's NVFP4, --stack megatron, is te_recipes.py's)."""
    from .te_recipes import runs_te

    return getattr(setup, "low_precision", "none") == NAME and not runs_te(setup)


def converted_share(spec, setup) -> float:
    """Of the layers, the share whose linears run NVFP4 (the rest: --bf16-first/last-layers, filtered out)."""
    from . import torchao_recipes

    return torchao_recipes.converted_share(spec, setup) if active(setup) else 0.0


def sac_stores_gemm(setup, dtype: str) -> bool:
    """Whether per-op SAC stores the output of a GEMM of `dtype`: an NVFP4 GEMM's (aten._scaled_mm_v2) only where
    the stack's save list names that op."""
    from ..low_precision import RECIPES

    if not active(setup) or dtype != RECIPES[NAME].peak:
        return True
    return GEMM_OP in setup.stack_facts.fact("op_sac", "save")


def sac_mm_share(spec, setup) -> float:
    """Of the layers, the share whose matmul outputs per-op SAC stores (the NVFP4 layers' are recomputed)."""
    from ..low_precision import RECIPES

    return 1.0 if sac_stores_gemm(setup, RECIPES[NAME].peak) else 1 - converted_share(spec, setup)


def check(spec, setup, gpu=None) -> None:
    """Refuse an NVFP4 setup whose converted GEMMs torchao cannot run: on a GPU not NVIDIA's (the converter needs
    CUDA sm100: torchtitan nvfp4.py:291-292; float8.check_gpu has already asked for the fp4 peak), or with a local
    dim (tokens, in and out features over TP) not a multiple of the stack's dims_multiple (stacks/torchtitan.toml
    [releases."2026-08"] low_precision)."""
    if not active(setup) or converted_share(spec, setup) == 0:
        return
    if gpu is not None and gpu.vendor != "nvidia":
        raise SetupError(f"--low-precision nvfp4 runs torchao's NVFP4 kernels on NVIDIA sm100 GPUs (torchtitan's "
                         f"converter checks CUDA capability 10.0), not on {gpu.name}: choose a --gpu such as B200")
    block = setup.stack_facts.facts["low_precision"].get("dims_multiple", {}).get(NAME)
    if not block:
        return
    t, h = setup.tp, spec.hidden
    # each dim: (its local size, the flag that moves it; None: the model's own width, which no flag moves)
    dims = {"tokens per rank (batch × seq / cp)": (setup.batch * setup.seq // setup.cp, "--batch/--seq"),
            "hidden": (h, None), "q projection / tp": (spec.q_dim / t, "--tp"),
            "k/v projection / tp": (spec.kv_dim / t, "--tp"), "MLP width / tp": (spec.intermediate / t, "--tp")}
    bad = {name: flag if flag != "--tp" or (v * t) % block == 0 else None  # (tp 1's width: no --tp helps)
           for name, (v, flag) in dims.items() if v % block}
    if bad:
        shown = ", ".join(f"{name} = {dims[name][0]:g}" for name in bad)
        flags = list(dict.fromkeys(bad.values()))
        how = (f"no flag changes {spec.name}'s own widths: use another --low-precision" if None in flags else
               f"change {' or '.join(flags)}, or keep the layers bf16")
        raise SetupError(f"--low-precision nvfp4: torchao's NVFP4 kernels need every GEMM dim a multiple of {block} "
                         f"(torchtitan's converter raises, it does not skip): {shown}; {how}")


def layer_saved_delta(spec, setup, st, tokens: float) -> float:
    """Bytes one layer (one TP rank, the layers' mean) saves beyond bf16's with no recompute — also what a re-run
    NVFP4 layer holds again in its backward (full, op). Each converted linear saves its input's column codes and
    its weight's transposed codes, 9/16 byte per element each (nvfp4_linear.py:141-149), not the bf16 input and a
    view of the weight:
      + the codes of the inputs of wq, wk, wv, w1, w3 (the norms' outputs, T·h each: replicated over TP), of wo
        (the attention output, q_dim/t) and of w2 (the SiLU·mul product, intermediate/t);
      + the weights' codes, 9/16 byte per projection weight of the rank (fixed, not per token);
      − the two norm outputs and the SiLU·mul product in the compute dtype, which only the bf16 linears saved (the
        norms' backward reads their inputs; SiLU·mul's its gate and up; SDPA its own output).
    NB: a Llama block's projections (q, k, v, o, gate, up, down); sequence parallelism's gathered inputs as above."""
    share = converted_share(spec, setup)
    if not share:
        return 0.0
    from ..low_precision import RECIPES

    q = RECIPES[NAME].quantised_bytes
    t, h, i = setup.tp, spec.hidden, spec.intermediate
    codes = q(5 * h + spec.q_dim / t + i / t)
    bf16 = st.act * (2 * h + i / t)
    weights = q(2 * h * (spec.q_dim + spec.kv_dim) + 3 * h * i) / t
    return share * ((codes - bf16) * tokens + weights)
