"""trainfit: will it train (or serve) on my hardware? Memory, compute and the fastest configuration that fits.

The Python API (no torch at import; the trace and measure engines import it when called):

    estimate(model, engine="analytic", **settings) -> Estimate   a catalog name, config.json path or cached hub id
    trace_module(module_or_factory, batch=None, **settings)      the training step of any nn.Module, on fake tensors
    measure_step(model, **settings) -> Estimate                  real steps here (cpu) or on a GPU (device="cuda")
    compare(model or Request, **settings) -> {label: Estimate}   training vs inference
    SETTINGS                                                     every setting: name, default, help, choices, modes

`settings` are the fields of `Setup` and `RunSettings` (trainfit.setup), with the CLI's names and defaults:
batch, seq, grad_accum, precision, optimizer, recompute, attention, dp, tp, pp, zero, sequence_parallel, device,
mode, kv_dtype, gpu, mfu, tokens, price. Every result is an `Estimate` (trainfit.estimate): memory by category and
phase with the peak, FLOPs, and with `gpu=` the fit, step time and budget.
"""
from .api import compare, estimate
from .errors import TrainfitError
from .estimate import Estimate
from .setup import SETTINGS, Request, Setup

__version__ = "0.1.0"
__all__ = ["estimate", "trace_module", "measure_step", "compare", "Estimate", "Request", "Setup", "SETTINGS",
           "TrainfitError"]


def trace_module(module_or_factory, batch=None, **settings) -> Estimate:
    """Trace a training step of any nn.Module (or a factory returning one, or (module, example batch)) on fake
    tensors: nothing is allocated. `batch`: one micro-batch (tensor, tuple or dict).

    >>> import torch
    >>> e = trace_module(torch.nn.Linear(1024, 1024), torch.zeros(8, 1024), precision="fp32", optimizer="sgd")
    >>> e.memory.weights == (1024 * 1024 + 1024) * 4  # fp32 weight and bias
    True
    """
    from .engines import TRACED_MODULE, trace_module as run
    from .setup import refuse_unread

    refuse_unread(settings, "trace_module()", TRACED_MODULE)  # (the others would change nothing it traces)
    return run(module_or_factory, batch, Setup(**settings))


def measure_step(model: str, steps: int = 3, warmup: int = 1, **settings) -> Estimate:
    """Run the standard step for real (random weights) and read its true peak from PyTorch's allocation records.
    (Not named `measure`: that is the engine's subpackage, trainfit.measure.)

    >>> e = measure_step("tiny-llama", batch=1, seq=32, device="cpu", steps=0)
    >>> e.engine, e.memory.peak > e.memory.weights
    ('measure', True)
    """
    from .api import measure
    from .engines import MEASURED
    from .errors import SetupError
    from .setup import refuse_unread

    refuse_unread(settings, "measure_step()", MEASURED)  # (as `trainfit measure` offers them)
    for name, n, least in (("steps", steps, 0), ("warmup", warmup, 1)):
        if isinstance(n, bool) or not isinstance(n, int) or n < least:
            raise SetupError(f"measure_step(): {name} must be an integer >= {least}, got {n!r}")
    return measure(Request(model=model, **settings), steps=steps, warmup=warmup)
