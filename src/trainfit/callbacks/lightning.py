"""Pre-flight in Lightning (lightning.pytorch or pytorch_lightning 2.x): a Callback.

    trainer = L.Trainer(..., callbacks=[TrainfitLightningCallback(gpu="H100-80GB", stop_if_not_fit=True)])

Facts read from Lightning 2.6.6 (src/lightning/pytorch/): trainer.py:1289 precision (the precision plugin's flag:
"32-true", "bf16-mixed", "16-mixed", "bf16-true"), :1277 optimizers, :1241 world_size, :443 accumulate_grad_batches,
:476 gradient_clip_val, :490 should_stop; strategies/fsdp.py:185 sharding_strategy, :176 cpu_offload;
strategies/deepspeed.py:289 config;
callbacks/callback.py:76-86 on_train_batch_start/end (the batch in hand before the first step). Lightning 2.6.6
loops/optimization/automatic.py:131-140: automatic optimization's closure runs training_step before zero_grad, so
the previous step's gradients live through the next forward (closure_order). Lightning is in the test extra only:
without it the class refuses in one line."""
from __future__ import annotations

from dataclasses import replace

from ..errors import EngineUnavailableError, SetupError
from . import live
from .layouts import deepspeed_settings, fsdp_settings
from .preflight import PeakWatch, WillNotFitError, _gpu, compare, estimate_live, judge, live_tensors, log, stop_or_go

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:
    try:
        from pytorch_lightning.callbacks import Callback
    except ImportError:
        Callback = None

# the precision flag -> the autocast dtype (the weights' dtype is read from the module Lightning converted)
AUTOCAST = {"32-true": None, "32": None, "bf16-mixed": "bf16", "16-mixed": "fp16", "bf16-true": None}


def trainer_settings(trainer) -> tuple[str | None, dict]:
    """(autocast, trainfit settings) of a Lightning Trainer."""
    precision = str(trainer.precision)
    if precision not in AUTOCAST:
        raise SetupError(f"Lightning precision {precision!r} is not modelled: use 32-true, bf16-mixed, 16-mixed or "
                         "bf16-true")
    out = {"dp": trainer.world_size, "grad_accum": trainer.accumulate_grad_batches,
           "max_grad_norm": trainer.gradient_clip_val}
    strategy = trainer.strategy
    kinds = {c.__name__ for c in type(strategy).__mro__}  # a subclass of Lightning's strategy reads as its base
    if "FSDPStrategy" in kinds:
        name = getattr(strategy.sharding_strategy, "name", strategy.sharding_strategy)
        # fsdp.py:176 cpu_offload (_init_cpu_offload: a CPUOffload whose offload_params is the flag)
        offload = bool(getattr(getattr(strategy, "cpu_offload", None), "offload_params", False))
        out.update(fsdp_settings({"reshard_after_forward": str(name).lower(), "cpu_offload": offload}),
                   fsdp_version=1)  # torch's FullyShardedDataParallel (FSDP1) around the module (fsdp.py:310)
    elif "DeepSpeedStrategy" in kinds:
        out.update(deepspeed_settings(deepspeed_config(strategy.config or {}, precision)))
    elif not kinds & {"SingleDeviceStrategy", "DDPStrategy"}:
        raise SetupError(f"Lightning's {type(strategy).__name__} is not modelled: trainfit reads single-device, DDP, "
                         "FSDP and DeepSpeed strategies")
    return AUTOCAST[precision], out


def deepspeed_config(config: dict, precision: str) -> dict:
    """The DeepSpeed config as Lightning hands it to DeepSpeed: its strategy adds an fp16 block for 16-mixed/16-true
    and a bf16 block for bf16-mixed/bf16-true unless the config has one (lightning/fabric/strategies/deepspeed.py
    937-950 _format_precision_config, called from the strategy's setup, pytorch/strategies/deepspeed.py:359), so a
    strategy read before setup gets the precision the run will have."""
    if "fp16" not in config and precision in ("16-mixed", "16-true"):
        return {**config, "fp16": {"enabled": True}}
    if "bf16" not in config and precision in ("bf16-mixed", "bf16-true"):
        return {**config, "bf16": {"enabled": True}}
    return config


def closure_order(e, pl_module):
    """The estimate `e` of a step under Lightning's automatic optimization (automatic.py:131-140 at 2.6.6:
    training_step, then zero_grad, then backward): from the second step on the forward runs with the previous
    step's gradients still alive, so the forward end's high point gains the gradients' bytes. Manual optimization
    (automatic_optimization False) zeroes where the user does: `e` unchanged. NB: the fit rule's required bytes
    grow by the same amount, the fragmentation of the extra blocks not counted (under)."""
    m = e.memory
    fwd = m.phases.get("forward_end")
    if not getattr(pl_module, "automatic_optimization", True) or fwd is None or fwd + m.gradients <= m.peak:
        return e
    extra = fwd + m.gradients - m.peak
    memory = replace(m, peak=fwd + m.gradients, peak_phase="forward_end",
                     phases={**m.phases, "forward_end": fwd + m.gradients},
                     required=None if m.required is None else m.required + extra,
                     reserved=None if m.reserved is None else m.reserved + extra,
                     device_total=None if m.device_total is None else m.device_total + extra)
    fit = e.fit
    if fit is not None:
        fit = replace(fit, required=fit.required + extra, headroom=fit.headroom - extra,
                      fits=fit.headroom - extra >= 0)
    return replace(e, memory=memory, fit=fit)


class _Preflight:
    """The callback's work, Lightning's hooks as plain methods (the class below only adds Lightning's base)."""

    def __init__(self, gpu: str | None = None, gpu_memory: float | None = None, stop_if_not_fit: bool = False,
                 steps: int = 2, engine: str = "auto", **settings):
        if Callback is None:
            raise EngineUnavailableError("TrainfitLightningCallback needs Lightning: pip install lightning")
        if steps < 1:
            raise SetupError(f"steps={steps}: compare the peak after at least 1 step")
        self.gpu, self.gpu_memory, self.stop_if_not_fit = gpu, gpu_memory, stop_if_not_fit
        self.steps, self.engine, self.settings = steps, engine, settings
        self.preflight, self.logs, self._watch = None, {}, None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.preflight is not None:
            return
        autocast, run = trainer_settings(trainer)
        run = {**run, "gpu": self.gpu, "gpu_memory": self.gpu_memory, **self.settings}
        optimizer = trainer.optimizers[0] if trainer.optimizers else None
        spec = live.model_spec(pl_module)
        req = live.request(pl_module, optimizer, live.batch_shape(batch), autocast, run, spec)
        req = _gpu(req, req.device)
        self.preflight = judge(closure_order(estimate_live(req, spec, pl_module, batch, self.engine, optimizer), pl_module))
        if trainer.is_global_zero:
            print(self.preflight.verdict)
        log.info(self.preflight.verdict)
        try:
            stop_or_go(self.preflight, self.stop_if_not_fit)
        except WillNotFitError:
            trainer.should_stop = True
            raise
        self._watch = PeakWatch(req.device)
        self._watch.start(live_tensors(pl_module, optimizer, batch))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self._watch is None or trainer.global_step < self.steps:
            return
        allocated, reserved = self._watch.stop()
        self._watch = None
        self.logs, line = compare(self.preflight, allocated, reserved, trainer.global_step)
        if trainer.is_global_zero:
            print(line)
        log.info(line)
        if trainer.logger is not None:
            trainer.logger.log_metrics({k: v for k, v in self.logs.items() if v is not None}, step=trainer.global_step)


TrainfitLightningCallback = type("TrainfitLightningCallback", (_Preflight,) + ((Callback,) if Callback else ()),
                                 {"__doc__": _Preflight.__doc__, "__module__": __name__})
