"""Before the first step: the estimate of a live run and its verdict; after the first steps: the real peak against
the prediction. Shared by every trainer's callback (hf.py, torchtitan.py, lightning.py)."""
from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from .. import engines
from ..errors import SetupError, TrainfitError, UnknownGPUError
from ..estimate import Estimate
from ..units import fmt_bytes

log = logging.getLogger("trainfit.callbacks")


class WillNotFitError(TrainfitError):
    """stop_if_not_fit=True and the estimate says the run does not fit."""


@dataclass(frozen=True)
class Preflight:
    estimate: Estimate
    fits: bool | None  # None: nothing to judge against (no GPU named or found, the host's free memory unknown)
    verdict: str  # one line

    @property
    def predicted(self) -> int:
        return self.estimate.memory.peak


def _gpu(req, device: str):
    """The request with its GPU: the one named, else on CUDA the catalog's entry for the device's own name (None
    when the catalog does not know it: say gpu=...)."""
    if req.gpu is not None or device != "cuda":
        return req
    import torch

    name = torch.cuda.get_device_name()
    try:
        from ..hardware import resolve_gpu

        resolve_gpu(name)
    except UnknownGPUError:
        log.warning("trainfit: the GPU %r is not in trainfit's catalog: pass gpu='H100-80GB' (or a GPU file) to "
                    "judge the fit", name)
        return req
    return replace(req, gpu=name)


def estimate_live(req, spec, model=None, batch=None, engine: str = "auto", optimizer=None) -> Estimate:
    """The analytic engine when trainfit reads the model's config (`spec`), else the trace engine on the live module
    and its first batch (trace/user.py: the module copied as fake tensors, not run), its optimizer built with the
    live `optimizer`'s param groups (live.optimizer_groups)."""
    from .. import api

    if engine not in ("auto", "analytic", "trace"):
        raise SetupError(f"engine={engine!r}: use auto, analytic or trace")
    if engine == "analytic" and spec is None:
        raise SetupError(f"trainfit does not read {req.model}'s config: use engine='trace' (or 'auto')")
    if spec is not None and engine != "trace":
        return api.analytic(req, spec)
    if model is None or batch is None:
        raise SetupError("the trace engine runs the live module on its first batch: pass the batch")
    from ..analytic.fit_rule import reserve_bytes, with_fit
    from ..overheads import with_device_total

    gpu = api.gpu_of(req)
    from .live import optimizer_groups

    groups = optimizer_groups(optimizer, model)
    traced = with_device_total(engines.trace_module(model, batch, req.setup(None), param_groups=groups), gpu)
    if gpu is not None and traced.memory.required is None:  # a CPU run's trace: no caching allocator simulated
        log.warning("trainfit: gpu=%r not judged: the trace of a module on the CPU has no CUDA allocator figure "
                    "(run it on the GPU, or a model whose config trainfit reads); judged against the host instead",
                    req.gpu)
    return with_fit(traced, gpu, reserve_bytes(req.reserve))


def judge(e: Estimate) -> Preflight:
    """The verdict: the fit rule's on the GPU (analytic/fit_rule.py), else on the CPU the peak against the host's
    free memory (api.available_memory, as `trainfit measure` checks it)."""
    from ..api import available_memory

    s = e.setup
    lora = f", LoRA r={s.lora_rank}" + (f" on a {s.quant} base" if s.quant else "") if s.lora_rank else ""
    what = (f"{e.model}: {s.batch} x {s.seq} tokens x {s.grad_accum} accumulated, {s.precision}, {s.optimizer} "
            f"({s.optimizer_kernel}), recompute {s.recompute}, dp {s.dp} zero {s.zero} on {s.stack}{lora}: "
            f"peak {fmt_bytes(e.memory.peak)} per rank ({e.engine})")
    if e.fit is not None:
        f = e.fit
        word = "fits" if f.fits else "DOES NOT FIT"
        return Preflight(e, f.fits, f"trainfit: {what}; {word} {f.gpu}: needs {fmt_bytes(f.required)} of "
                                    f"{fmt_bytes(f.capacity)} ({fmt_bytes(abs(f.headroom))} "
                                    f"{'free' if f.fits else 'short'})")
    if s.device == "cpu":
        free = available_memory("cpu")
        if free is not None:
            fits = e.memory.peak <= free
            return Preflight(e, fits, f"trainfit: {what}; {'fits' if fits else 'DOES NOT FIT'} the host's "
                                      f"{fmt_bytes(free)} free")
    return Preflight(e, None, f"trainfit: {what}; no GPU to judge the fit against (pass gpu=...)")


def stop_or_go(pre: Preflight, stop_if_not_fit: bool) -> None:
    if stop_if_not_fit and pre.fits is False:
        raise WillNotFitError(pre.verdict + " -- stopped before the first step (stop_if_not_fit=True): lower the "
                              "batch or sequence, shard (FSDP/ZeRO), checkpoint activations or use LoRA")


# -- after the first steps -----------------------------------------------------------------------------------------
class PeakWatch:
    """The real peak of the steps between start() and stop(): CUDA's allocator statistics
    (torch.cuda.max_memory_allocated / max_memory_reserved after reset_peak_memory_stats), or on the CPU c10's
    allocator records (engines.cpu_peak_session)."""

    def __init__(self, device: str):
        self.device = device
        self._session = None

    def start(self, tensors) -> None:
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        else:
            self._session = engines.cpu_peak_session()
            self._session.start(tensors)

    def stop(self) -> tuple[int, int | None]:
        """(allocated peak, reserved peak or None on the CPU)."""
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
        return self._session.stop().peak, None


def compare(pre: Preflight, allocated: int, reserved: int | None, steps: int) -> tuple[dict, str]:
    """The trainer's log record (trainfit/... keys) and one line: the real peak against the prediction; error =
    (predicted - real) / real."""
    m = pre.estimate.memory
    logs = {"trainfit/predicted_peak": m.peak, "trainfit/real_peak": allocated,
            "trainfit/peak_error": (m.peak - allocated) / allocated if allocated else None}
    line = (f"trainfit: peak over the first {steps} step(s) {fmt_bytes(allocated)} allocated, predicted "
            f"{fmt_bytes(m.peak)} ({logs['trainfit/peak_error']:+.1%})")
    if reserved is not None and m.reserved:
        logs.update({"trainfit/predicted_reserved": m.reserved, "trainfit/real_reserved": reserved,
                     "trainfit/reserved_error": (m.reserved - reserved) / reserved if reserved else None})
        line += f"; {fmt_bytes(reserved)} reserved, predicted {fmt_bytes(m.reserved)}"
    return logs, line


def live_tensors(model, optimizer=None, batch=None) -> list:
    """The tensors live before a step: parameters, buffers, gradients, optimizer state and the batch."""
    import torch

    from .live import unwrap_optimizer

    out = list(model.parameters()) + list(model.buffers()) + [p.grad for p in model.parameters()]
    if optimizer is not None:
        out += [v for st in unwrap_optimizer(optimizer).state.values() for v in st.values()]
    fields = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (tuple, list)) else [batch]
    return out + [t for t in fields if isinstance(t, torch.Tensor)]
