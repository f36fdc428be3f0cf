"""The standard training step (DESIGN.md §3), shared by the measure and trace engines."""
from .build import build_model, hf_config, make_batches
from .standard import MasterWeightOptimizer, make_optimizer, prepare, run_step


def stack_step(setup):
    """The module that runs `setup.stack`'s step (trainfit.step.hf, trainfit.step.torchtitan or, for the
    distributed measure, trainfit.step.deepspeed): build(spec, setup,
    device, mesh), wrap(model, setup, device_type, device_index, mesh) -> (model, optimizer), make_batches(spec,
    setup, device), run_step(model, optimizer, batches, setup, phase), prepare(spec, setup, device), STRATEGIES
    (--zero -> how the stack applies data parallelism) and NOTE (a line for the engines' notes, "" for none)."""
    if getattr(setup, "stack", "hf") == "torchtitan":
        from . import torchtitan as step
    elif getattr(setup, "stack", "hf") == "deepspeed" and getattr(setup, "mode", "train") == "train":
        from . import deepspeed as step
    else:
        from . import hf as step
    return step


def strategy_name(kit, setup) -> str:
    """How the stack's step `kit` applies data parallelism to `setup`: its STRATEGIES entry for (--zero,
    --fsdp-version) where it has one, else for --zero."""
    return kit.STRATEGIES.get((setup.zero, setup.fsdp_version), kit.STRATEGIES[setup.zero])


__all__ = ["build_model", "hf_config", "make_batches", "make_optimizer", "prepare", "run_step",
           "MasterWeightOptimizer", "stack_step", "strategy_name"]
