"""DeepSpeed's step (`--stack deepspeed`) behind the same functions as trainfit.step.hf: build, wrap, make_batches,
run_step, prepare, for the distributed measure (trainfit.measure.worker, one torch.distributed.run process a rank).

wrap is `deepspeed.initialize(model, optimizer, config)` with the JSON `trainfit plan/estimate --emit deepspeed`
writes for the setup (trainfit.stacks.deepspeed_config: DeepSpeed's own bucket defaults, bf16/fp16, ZeRO stage). The
client optimizer is the torch optimizer of `--optimizer` with the setup's kernel (torch AdamW(fused=True) by
default): DeepSpeed's FusedAdam needs CUDA (ops/adam/fused_adam.py), and on CUDA the analytic engine counts
FusedAdam, whose fused kernel has the same no-temporaries property. The step is the engine's own: engine(**batch),
engine.backward(loss), engine.step() (engine.py), gradient accumulation inside the engine (its micro-steps).

The measured peak is the live-bytes level read from the allocation records of the whole session (the profiler runs
from before the model is built, trainfit.measure.dist_peak), not a sum of resident tensors: the ZeRO optimizers
keep flat buffers that the model's parameters view (stage_1_and_2.py:509) and fp32 partitions the client optimizer
holds (:556-577), which READ_BASELINE tells the worker to take as they are.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable

from ..errors import EngineUnavailableError, SetupError
from .build import build_model, make_batches
from .standard import enable_recompute

STRATEGIES = {0: "DeepSpeed engine, ZeRO-0 (data parallel)", 1: "DeepSpeedZeroOptimizer, ZeRO-1",
              2: "DeepSpeedZeroOptimizer, ZeRO-2", 3: "DeepSpeedZeroOptimizer_Stage3, ZeRO-3"}
NOTE = "DeepSpeed's own step: deepspeed.initialize with the --emit deepspeed config"
DDP_TAKES_MESH = False  # deepspeed.initialize uses the default process group
READ_BASELINE = True  # the worker reads the session's live bytes (module docstring)
EXPERT_PARALLEL = True  # --ep: AutoEP (the config's expert_parallel block, stacks/deepspeed_config.py)
# every buffer the engine keeps is a tensor Python holds (the optimizers' flat groups, partitions, ipg buckets): a
# block none holds at the step's end was freed unreported. gloo's worker thread can drop the last reference to a
# collective's input after the caller: the flat bucket an all-reduce runs on (engine.py:3796 and
# zero/stage_1_and_2.py:2367, allreduce_bucket), whose free the profiler then never sees (trainfit.measure.worker,
# dist_peak.analyse_blocks alive)
def python_held(setup) -> bool:
    return True


PRECISIONS = ("bf16-master", "fp16-master", "fp32")


def check(setup) -> None:
    """One-line refusals for what this step does not run (the analytic engine models them)."""
    if setup.tp > 1 or setup.pp > 1:
        raise SetupError("--engine measure --stack deepspeed runs ZeRO data parallelism only: --tp/--pp are "
                         "analytic-only (use --engine analytic)")
    if setup.precision not in PRECISIONS:
        raise SetupError(f"--stack deepspeed --engine measure runs {', '.join(PRECISIONS)} (DeepSpeed's bf16/fp16 "
                         f"modes or plain fp32), not --precision {setup.precision}")
    if setup.offload != "none":
        raise SetupError("--offload is modelled by the analytic engine; the measure engine runs DeepSpeed without "
                         "ZeRO-Offload (its DeepSpeedCPUAdam is a separate C++ build)")
    if setup.quant:
        raise SetupError("--quant under --stack deepspeed is modelled by the analytic engine only (bitsandbytes' "
                         "packed weights with a float quant storage): use --engine analytic")
    if setup.compile or setup.low_precision != "none":
        raise SetupError("--compile/--low-precision are not run under DeepSpeed by the measure engine: use --engine analytic")


def check_ranks(spec, setup) -> None:
    """The distributed measure's refusals: DeepSpeed's own engine, not trainfit's DDP/ZeRO/FSDP strategies."""
    check(setup)


def ds_config(setup) -> dict:
    """The DeepSpeed config of `--emit deepspeed` for the setup (trainfit.stacks.deepspeed_config)."""
    from ..stacks.deepspeed_config import ds_config as config

    return config(setup)


def build(spec, setup, device="cpu", mesh=None):
    """The transformers model (seed set by the caller) with recompute enabled; DeepSpeed wraps it in `wrap`."""
    model = build_model(spec, setup, device=device)
    enable_recompute(model, setup)
    return model


def client_optimizer(model, setup):
    """The torch optimizer over the model's parameters; under --ep a callable DeepSpeed calls once AutoEP has
    replaced the MoE blocks (engine.py:2336-2340, `client_optimizer(model_parameters)`), over the parameters split
    into the dense group and one 'moe' group per expert-parallel size: ZeRO-1/2 assert such a group exists
    (deepspeed 0.19.8 runtime/zero/stage_1_and_2.py:872-874) and partition it over the expert-data-parallel group
    (:876-881); split as DeepSpeed splits its own optimizer's parameters (engine.py:2330-2331 ->
    moe/utils.py:156-183 configure_moe_param_groups)."""
    from .standard import _torch_optimizer

    if setup.ep <= 1:
        return _torch_optimizer(list(model.parameters()), setup.optimizer, setup.optimizer_kernel)
    from deepspeed.moe.utils import configure_moe_param_groups

    return lambda params: _torch_optimizer(configure_moe_param_groups(list(params)), setup.optimizer,
                                           setup.optimizer_kernel)


def wrap(model, setup, device_type: str = "cpu", device_index: int | None = None, mesh=None):
    """(DeepSpeed engine, its optimizer): deepspeed.initialize in the process group the worker joined."""
    try:
        import deepspeed
    except ImportError as e:
        raise EngineUnavailableError(f"--stack deepspeed --engine measure needs deepspeed ({e.name} is missing): "
                                     "pip install deepspeed") from e
    check(setup)
    _skip_shm_kernel(deepspeed)
    with _output_capture_registry_as_dict(setup):
        engine, optimizer, _, _ = deepspeed.initialize(
            model=model, optimizer=client_optimizer(model, setup),
            config={**ds_config(setup), "zero_allow_untested_optimizer": True})
    return engine, optimizer


@contextmanager
def _output_capture_registry_as_dict(setup):
    """Under --ep, let AutoEP read transformers 5.24's output-capture registry as the plain dict it expects.
    AutoEP retargets the router-logit recorders by `registry.get(key, default)` with a class-name string key
    (deepspeed 0.19.8 module_inject/auto_ep_presets/base.py:325-328, :361-363), but transformers 5.24's
    _CanRecordRegistry.get takes a model alone (utils/output_capturing.py:48-50), so replace_moe_layers raises
    "TypeError: _CanRecordRegistry.get() takes 2 positional arguments but 3 were given" (auto_ep.py:730). Inside
    deepspeed.initialize a string key is looked up as dict.get does (the registry is keyed by str(class),
    output_capturing.py:45-46); a model is looked up as before. Changes no tensor."""
    if setup.ep <= 1:
        yield
        return
    from transformers.utils import output_capturing

    registry = output_capturing._CanRecordRegistry
    original = registry.get

    def get(self, key, *default):
        return dict.get(self, key, *default) if isinstance(key, str) else original(self, key)

    registry.get = get
    try:
        yield
    finally:
        registry.get = original


def _skip_shm_kernel(deepspeed) -> None:
    """Leave out DeepSpeed's shared-memory all-reduce kernel on CPU: its backend JIT-compiles it (minutes, in the
    user's torch_extensions cache) when the process group starts (deepspeed/comm/torch.py:47-52, 207), but only
    `inference_all_reduce` uses it (:292-306); the training step's collectives are torch.distributed's (gloo), so
    the measured memory is the same without it."""
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is not None:
        deepspeed.ops.__compatible_ops__[builder.NAME] = False


def run_step(engine, optimizer, batches, setup, phase: Callable[[str], None] = lambda name: None) -> float:
    """One optimizer step: every micro-batch through engine(**b) and engine.backward (DeepSpeed scales the loss by
    the accumulation steps itself, engine.py), then engine.step() at the boundary. Returns the last loss."""
    loss = None
    for b in batches:
        phase("forward")
        loss = engine(**b).loss
        phase("backward")
        engine.backward(loss)
        if b is not batches[-1]:
            engine.step()  # a micro-step: DeepSpeed only accumulates (is_gradient_accumulation_boundary False)
    phase("optimizer")
    engine.step()
    phase("end")
    return float(loss.detach()) if loss is not None else float("nan")


def resident_tensors(engine, optimizer) -> dict:
    """What the engine keeps between steps: the module's weights (views into the ZeRO flat buffers count as those
    buffers) and the optimizer state (the client optimizer's, over DeepSpeed's fp32 partitions, and those
    partitions/masters themselves)."""
    import torch

    from .strategy import local

    weights = [local(p) for p in engine.module.parameters()] + [b for b in engine.module.buffers()]
    for name in ("bit16_groups_flat", "fp16_groups_flat", "fp16_partitioned_groups_flat"):
        weights += [t for t in (getattr(optimizer, name, None) or []) if isinstance(t, torch.Tensor)]
    states = []
    inner = getattr(optimizer, "optimizer", optimizer)
    for st in inner.state.values():
        states += [v for v in st.values() if isinstance(v, torch.Tensor)]
    for g in inner.param_groups:
        states += [p for p in g["params"] if isinstance(p, torch.Tensor)]
    # ZeRO-3's fp32 partitions: its client optimizer's groups hold them only inside the step (deepspeed 0.19.8
    # runtime/zero/stage3.py:1208 empties them, :1260-1262 _optimizer_step sets and empties them again); ZeRO-1/2's
    # single_partition_of_fp32_groups are the groups' own params (stage_1_and_2.py:584), counted once
    for name in ("fp32_partitioned_groups_flat", "single_partition_of_fp32_groups"):
        states += [t for t in (getattr(optimizer, name, None) or []) if isinstance(t, torch.Tensor)]
    return {"weights": weights, "states": states, "buckets": []}


def prepare(spec, setup, device="cpu"):
    raise EngineUnavailableError("--stack deepspeed runs on torch.distributed ranks (trainfit.measure.distributed), "
                                 "not in one process")


__all__ = ["NOTE", "DDP_TAKES_MESH", "EXPERT_PARALLEL", "STRATEGIES", "READ_BASELINE", "python_held", "check",
           "check_ranks", "ds_config", "build", "wrap", "make_batches", "run_step", "resident_tensors", "prepare"]
