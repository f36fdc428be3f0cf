"""--low-precision on torchtitan's step: torchao's Float8Linear swapped into the model as torchtitan 0.2.2's
Float8LinearConverter does it, for the real step (measure engine) and the fake one (trace engine).

torchtitan (paths inside the torchtitan 0.2.2 wheel, torchao 0.18.0's API):
    train.py:154-155       build_model_converters(job_config, parallel_dims).convert(model): on the meta-device
                           model, before parallelize_llama (train.py:254: apply_ac, apply_fsdp / apply_ddp)
    components/quantization/float8.py:65-84   recipe_name set (rowwise, rowwise_with_gw_hp):
                           Float8LinearConfig.from_recipe_name(recipe_name); rowwise also sets
                           torch._inductor.config.emulate_precision_casts = True
    components/quantization/float8.py:85-94   no recipe_name (tensorwise, the default): Float8LinearConfig(
                           enable_fsdp_float8_all_gather = dp_shard enabled and the option, emulate=False)
    components/quantization/float8.py:149-156 convert_to_float8_training(model, config, module_filter_fn)
    components/quantization/utils.py:10-27    module_filter_fn: nn.Linear with both dims multiples of 16 and no
                           filter_fqns entry in its name (stacks/torchtitan.toml [low_precision] filter: "output")

Float8LinearConverter itself is not called: it takes a whole JobConfig and refuses to run below sm89 unless
`emulate` (float8.py:37-45), which replaces the fp8 GEMMs by high-precision ones. Here a CPU runs torchao's real path
(torch's CPU _scaled_mm, torch >= 2.13), and a CUDA device below sm89 is refused as torchtitan refuses it.
MXFP8 (torchtitan's MXLinearConverter, components/quantization/mx.py) needs sm100 and is not run.
"""
from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

import torch

from ..errors import EngineUnavailableError

if TYPE_CHECKING:  # pragma: no cover
    from ..setup import Setup

# the recipes torchtitan's Float8LinearConverter runs (float8.py:65-100; Float8Linear.recipe_name,
# config/job_config.py:738): tensorwise is its default config, the two others torchao's named recipes
FLOAT8_RECIPES = ("tensorwise", "rowwise", "rowwise_with_gw_hp")


def check(setup: "Setup", device: str | None = None) -> None:
    """One-line refusals for the recipes and devices this converter does not run."""
    lp = setup.low_precision
    if lp == "none":
        return
    if lp not in FLOAT8_RECIPES:
        raise EngineUnavailableError(f"--low-precision {lp}: the trace and measure engines run torchao's Float8Linear "
                                     f"({', '.join(FLOAT8_RECIPES)}); {lp} needs torchtitan's MXLinear on sm100: use "
                                     "--engine analytic")
    dev = torch.device(device or setup.device)
    if dev.type == "cuda" and torch.cuda.is_available() and torch.cuda.get_device_capability(dev) < (8, 9):
        # float8.py:37-45: "float8 is only supported on SM89 or later"
        raise EngineUnavailableError(f"--low-precision {lp}: fp8 GEMMs need sm89 or later (this GPU is sm"
                                     f"{''.join(map(str, torch.cuda.get_device_capability(dev)))}); use --engine analytic")


def float8_config(setup: "Setup"):
    """torchao's Float8LinearConfig for `setup`, as torchtitan builds it (float8.py:65-94)."""
    from torchao.float8 import Float8LinearConfig

    if setup.low_precision == "tensorwise":  # float8.py:85-94 (no recipe_name)
        from ..analytic.float8 import fp8_all_gather

        return Float8LinearConfig(enable_fsdp_float8_all_gather=fp8_all_gather(setup), emulate=False)
    if setup.low_precision == "rowwise":  # float8.py:79-84 (pytorch/pytorch#150859; acts only under compile)
        import torch._inductor.config

        torch._inductor.config.emulate_precision_casts = True
    return Float8LinearConfig.from_recipe_name(setup.low_precision)  # float8.py:71-73


def apply_low_precision(model: torch.nn.Module, setup: "Setup", device: str | None = None) -> None:
    """Swap `model`'s eligible nn.Linear modules for torchao's Float8Linear in place (train.py:154-155, before
    parallelisation); nothing under --low-precision none. `device`: where the step will run (default setup.device)."""
    if setup.low_precision == "none":
        return
    check(setup, device)
    try:
        from torchao.float8 import convert_to_float8_training
        from torchtitan.components.quantization.utils import module_filter_fn
    except ImportError as e:
        raise EngineUnavailableError(f"--low-precision {setup.low_precision} needs torchao 0.18 and torchtitan 0.2.2 "
                                     f"({e.name} is missing): pip install 'trainfit[torchtitan]' torchao") from e
    filter_fqns = [setup.stack_facts.fact("low_precision", "filter")]  # stacks/torchtitan.toml [low_precision]
    # --bf16-first-layers / --bf16-last-layers: the blocks' names added to filter_fqns (utils.py:24-25 matches them
    # as substrings of "layers.<i>.attention.wq"...; analytic/torchao_recipes.py bf16_layers)
    n = len(model.layers)
    filter_fqns += [f"layers.{i}." for i in range(n) if i < setup.bf16_first_layers or i >= n - setup.bf16_last_layers]
    convert_to_float8_training(model, config=float8_config(setup),
                               module_filter_fn=partial(module_filter_fn, filter_fqns=filter_fqns))
