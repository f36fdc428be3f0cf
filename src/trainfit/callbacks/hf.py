"""Pre-flight in the HF Trainer (TrainerCallback) and in an accelerate loop (`accelerate_preflight`).

    trainer = Trainer(model, args, ..., callbacks=[TrainfitCallback(gpu="H100-80GB", stop_if_not_fit=True)])

Before the first forward (a forward pre-hook: the first batch's shape is known only then) the run is estimated from
the live model, optimizer and TrainingArguments and the verdict printed; after `steps` optimizer steps the real peak
is compared with the prediction and logged (logger "trainfit.callbacks" and the trainer's log_history)."""
from __future__ import annotations

from transformers import TrainerCallback

from ..errors import SetupError
from . import live
from .layouts import accelerator_settings, autocast_of, training_args_autocast, training_args_settings
from .preflight import PeakWatch, _gpu, compare, estimate_live, judge, live_tensors, log, stop_or_go


def accelerate_preflight(accelerator, model, optimizer, batch_shape: tuple[int, int], *, grad_accum: int | None = None,
                         gpu: str | None = None, gpu_memory: float | None = None, stop_if_not_fit: bool = False,
                         engine: str = "auto", batch=None, **settings):
    """Pre-flight of an accelerate loop before its first step: the model, optimizer and (batch, seq) of one micro-
    batch per process; accelerator.mixed_precision is the autocast. Prints the verdict (main process) and returns the
    Preflight; raises WillNotFitError when stop_if_not_fit and it does not fit."""
    run = {**accelerator_settings(accelerator), "grad_accum": grad_accum or accelerator.gradient_accumulation_steps,
           "gpu": gpu, "gpu_memory": gpu_memory, **settings}
    pre = _preflight(model, optimizer, batch_shape, autocast_of(accelerator.mixed_precision), run, engine, batch,
                     accelerator.is_local_main_process)
    stop_or_go(pre, stop_if_not_fit)
    return pre


def _preflight(model, optimizer, shape, autocast, run, engine, batch, main: bool):
    spec = live.model_spec(model)
    req = live.request(model, optimizer, shape, autocast, run, spec)
    req = _gpu(req, req.device)
    pre = judge(estimate_live(req, spec, model, batch, engine, optimizer))
    if main:
        print(pre.verdict)
    log.info(pre.verdict)
    return pre


class TrainfitCallback(TrainerCallback):
    """The HF Trainer's pre-flight: estimate before the first forward, compare the real peak after `steps` steps.

    gpu / gpu_memory: the GPU to judge the fit against (a catalog name or GPU file, --gpu-memory GiB; on CUDA the
    device's own name when omitted); stop_if_not_fit: raise WillNotFitError before the first forward when it does
    not fit; engine: auto (analytic when trainfit reads the model's config, else the trace engine on the live
    module), analytic or trace; settings: any other trainfit setting (e.g. attention="sdpa")."""

    def __init__(self, gpu: str | None = None, gpu_memory: float | None = None, stop_if_not_fit: bool = False,
                 steps: int = 2, engine: str = "auto", **settings):
        if steps < 1:
            raise SetupError(f"steps={steps}: compare the peak after at least 1 step")
        self.gpu, self.gpu_memory, self.stop_if_not_fit = gpu, gpu_memory, stop_if_not_fit
        self.steps, self.engine, self.settings = steps, engine, settings
        self.preflight = None  # the Preflight once the first batch is seen
        self.logs: dict = {}  # the comparison's record once `steps` steps ran
        self._hook = self._watch = None
        self._start = 0  # the global step the comparison starts at (a resumed run's)

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        def first_forward(module, fargs, fkwargs):
            self._hook.remove()
            batch = fkwargs or ({"input_ids": fargs[0]} if fargs else {})
            autocast = training_args_autocast(args)
            run = {**training_args_settings(args), "gpu": self.gpu, "gpu_memory": self.gpu_memory, **self.settings}
            self.preflight = _preflight(model, optimizer, live.batch_shape(batch), autocast, run, self.engine,
                                        batch, state.is_local_process_zero)
            stop_or_go(self.preflight, self.stop_if_not_fit)
            self._watch, self._start = PeakWatch(self.preflight.estimate.setup.device), state.global_step
            self._watch.start(live_tensors(model, optimizer, batch))

        self._hook = model.register_forward_pre_hook(first_forward, with_kwargs=True)

    def on_step_end(self, args, state, control, **kwargs):
        if self._watch is not None and state.global_step - self._start >= self.steps:
            self._report(state)

    def on_train_end(self, args, state, control, **kwargs):
        if self._watch is not None:  # fewer steps ran than `steps`
            self._report(state)

    def _report(self, state):
        allocated, reserved = self._watch.stop()
        self._watch = None
        self.logs, line = compare(self.preflight, allocated, reserved, state.global_step - self._start)
        if state.is_local_process_zero:
            print(line)
        log.info(line)
        state.log_history.append({**self.logs, "step": state.global_step})
