"""torchtitan's low-precision linear converters (--low-precision on --stack torchtitan) as the trace and measure
engines run them: torchao's Float8Linear swapped in by torchtitan 0.2.2's own recipe logic, on CPU and fake tensors.

torchtitan builds the model on the meta device, then runs its model converters (train.py:153-155), then
parallelize_llama (apply_ac, apply_fsdp) -- build() in step/torchtitan.py calls `convert` at that point. The
converter for --low-precision tensorwise / rowwise / rowwise_with_gw_hp is Float8LinearConverter
(components/quantization/float8.py, torchtitan 0.2.2 wheel; torchao 0.18 installed):
    :65-74   recipe_name set (rowwise, rowwise_with_gw_hp): Float8LinearConfig.from_recipe_name(recipe_name), and
             enable_fsdp_float8_all_gather refused beside it (:66-69); recipe_name None (the default, tensorwise):
             :85-94 Float8LinearConfig(enable_fsdp_float8_all_gather = dp_shard_enabled and
             enable_fsdp_float8_all_gather, emulate).
    :140-156 convert: torchao.float8.convert_to_float8_training(model, config, module_filter_fn=partial(
             module_filter_fn, filter_fqns)) (components/quantization/utils.py:10-27: an nn.Linear with both weight
             dims divisible by 16 whose fqn contains none of filter_fqns).
filter_fqns: the stack's [low_precision] filter (stacks/torchtitan.toml, commonly ["output"]) plus one "layers.<i>."
per block kept in bf16 by --bf16-first-layers / --bf16-last-layers (torchtitan's blocks are named layers.0 ..
layers.<n-1>, models/llama3/model/model.py:454-456; the trailing dot keeps "layers.1." from matching layers.10).
emulate stays False, as on an SM89+ GPU: the forward and backward GEMMs are torch._scaled_mm (torchao
float8/float8_ops.py), which PyTorch also runs on CPU (and on fake tensors), so the step holds what a GPU's holds.
The converter's SM89 check (float8.py:37-45) is the GPU's, not the recipe's, and is not run.
post_optimizer_hook precomputes FSDP scales only with precompute_float8_dynamic_scale_for_fsdp (default False,
config/job_config.py:735): not run.

--fp8-all-gather (enable_fsdp_float8_all_gather, tensorwise with --zero 3): FSDP2's all-gather extensions (torchao
float8/fsdp_utils.py fsdp_pre_all_gather / fsdp_post_all_gather) gather each weight shard cast to fp8 and hand
Float8Linear a Float8TrainingTensor; the trace counts the wrappers by their inner tensors (trace/recorder.py unwraps).
Refused in one line by `check`: rowwise_with_gw_hp under autocast on --device cpu (the real step fails); mxfp8:
torchtitan's MXLinearConverter (components/quantization/mx.py:42-58) asserts an SM100 GPU and imports
torchao.prototype.mx_formats.config.MXLinearConfig, which the installed torchao (0.18) no longer has (its MX linear
training moved to torchao.prototype.moe_training); nvfp4: torchtitan 0.2.2 has no NVFP4 linear converter. Recipes
other stacks run (delayed, blockwise: Transformer Engine) never reach here: Setup refuses them for --stack torchtitan
(stacks/torchtitan.toml [low_precision] recipes).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..analytic.torchao_recipes import filter_fqns
from ..errors import EngineUnavailableError

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from ..setup import Setup

# torchao Float8Linear recipes torchtitan's Float8LinearConverter runs (job_config.py:738 recipe_name; None means
# tensorwise, float8.py:85-94)
FLOAT8 = ("tensorwise", "rowwise", "rowwise_with_gw_hp")
WHY_NOT = {
    "mxfp8": ("torchtitan 0.2.2's MXLinearConverter (components/quantization/mx.py:42-58) needs an SM100 GPU and "
              "torchao's MXLinearConfig, which torchao 0.18 no longer has"),
    "nvfp4": "torchtitan 0.2.2 has no NVFP4 linear converter",
}


def check(setup: "Setup") -> None:
    """One-line refusal for a --low-precision setup the trace and measure engines cannot run on this stack."""
    lp = setup.low_precision
    if lp == "none":
        return
    if lp not in FLOAT8:
        why = WHY_NOT.get(lp, "not a torchao Float8Linear recipe")
        raise EngineUnavailableError(f"--low-precision {lp}: {why}; use --engine analytic")
    if lp == "rowwise_with_gw_hp" and setup.device == "cpu" and setup.policy.autocast:
        # Float8Linear casts its input to the autocast dtype under CUDA autocast only (float8_linear.py:258-262):
        # under CPU autocast the input stays fp32 while the output gradient arrives in bf16, and the recipe's
        # high-precision weight-gradient mm (:197-200) refuses the mixed operands (RuntimeError in the real step)
        raise EngineUnavailableError("--low-precision rowwise_with_gw_hp with autocast fails on CPU (torchao casts "
                                     "Float8Linear inputs under CUDA autocast only): use --device cuda, --precision "
                                     "bf16 or --engine analytic")


def float8_config(setup: "Setup"):
    """torchao's Float8LinearConfig as Float8LinearConverter.__init__ makes it (float8.py:65-94)."""
    from torchao.float8 import Float8LinearConfig

    if setup.low_precision == "tensorwise":  # recipe_name None: torchtitan's tensorwise path (float8.py:85-94)
        dp_shard_enabled = setup.dp > 1 and setup.zero >= 2  # step/torchtitan.py parallel_dims: zero 2/3 shard
        return Float8LinearConfig(enable_fsdp_float8_all_gather=dp_shard_enabled and setup.fp8_all_gather,
                                  emulate=False)
    return Float8LinearConfig.from_recipe_name(setup.low_precision)  # float8.py:71-73


def convert(model: "torch.nn.Module", setup: "Setup", layers: int) -> None:
    """Float8LinearConverter.convert (float8.py:140-156) on `model`, in place; nothing for --low-precision none."""
    if setup.low_precision == "none":
        return
    check(setup)
    from functools import partial

    try:
        from torchao.float8 import convert_to_float8_training
        from torchtitan.components.quantization.utils import module_filter_fn
    except ImportError as e:
        raise EngineUnavailableError(f"--low-precision {setup.low_precision} on --stack torchtitan needs torchao "
                                     f"({e.name} is missing): pip install torchao") from e
    convert_to_float8_training(model, config=float8_config(setup),
                               module_filter_fn=partial(module_filter_fn, filter_fqns=filter_fqns(setup, layers)))
