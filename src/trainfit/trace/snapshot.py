"""A traced step as a PyTorch memory snapshot: the allocator simulator's state at the step's allocated peak
(alloc/replay.py steady_state, alloc/snapshot.py), each block with the frames PyTorch would record for it.

Frames (innermost first), as `_record_memory_history(stacks="all")` records them in torch 2.13, chosen by what the
trace knows of the storage (its category for the resident state, its phase and module for the step's):
- parameters and buffers: moved to the device by `model.to(...)` (torch/nn/modules/module.py:1363 convert,
  :964 _apply, :1383 to);
- optimizer states: torch.optim's lazy zeros_like in its first step (torch/optim/adam.py:178 _init_group,
  :238 step; torch/optim/optimizer.py:530 wrapper);
- the batch: the user's script (train.py);
- forward: the module's forward called through torch/nn/modules/module.py:1789 _call_impl; the module's frame
  names the traced module (`trace/<qualified name>`), where a GPU's frame names its modeling file's line;
- backward: the autograd engine's C++ frames only (the CUDA backward runs on the engine's device thread, which
  has no Python stack: include/torch/csrc/autograd/engine.h:225 start_device_threads; thread_main ->
  evaluate_function);
- optimizer step: torch/optim/adam.py:762 _multi_tensor_adam under :248 step.
NB: master weights (trainfit's MasterWeightOptimizer) get their own frame, which no torch rule names.
"""
from __future__ import annotations

import math

from ..alloc.replay import steady_state
from ..alloc.snapshot import snapshot_dict
from .engine import replay_args
from .recorder import BUFFER, INPUT, MASTER_WEIGHT, OPTIMIZER_STATE, PARAMETER, cuda_rounded

_SP = "/usr/lib/python3/site-packages/"


def _f(path: str, line: int, name: str) -> dict:
    return {"filename": path if path.startswith(("trace/", "train.py", "torch/csrc")) else _SP + path,
            "line": line, "name": name}


_TO = [_f("torch/nn/modules/module.py", 1363, "convert"), _f("torch/nn/modules/module.py", 964, "_apply"),
       _f("torch/nn/modules/module.py", 1383, "to"), _f("train.py", 20, "<module>")]
_STATE = [_f("torch/optim/adam.py", 178, "_init_group"), _f("torch/optim/adam.py", 238, "step"),
          _f("torch/optim/optimizer.py", 530, "wrapper"), _f("train.py", 40, "<module>")]
_BATCH = [_f("train.py", 30, "<module>")]
_ENGINE = [_f("torch/csrc/autograd/engine.cpp", 0, "torch::autograd::Engine::evaluate_function"),
           _f("torch/csrc/autograd/engine.cpp", 0, "torch::autograd::Engine::thread_main")]
_STEP = [_f("torch/optim/adam.py", 762, "_multi_tensor_adam"), _f("torch/optim/adam.py", 248, "step"),
         _f("torch/optim/optimizer.py", 530, "wrapper"), _f("train.py", 40, "<module>")]


def frames_of(r) -> list[dict]:
    """The frames PyTorch would record for the allocation of record `r` (module docstring)."""
    if r.phase == "setup":
        if r.cat in (PARAMETER, BUFFER):
            return _TO
        if r.cat == OPTIMIZER_STATE:
            return _STATE
        if r.cat == INPUT:
            return _BATCH
        if r.cat == MASTER_WEIGHT:
            return [_f("trainfit/step/master.py", 0, "MasterWeightOptimizer.__init__")]
    if r.phase == "forward":
        return [_f(f"trace/{r.module or 'model'}", 0, "forward"),
                _f("torch/nn/modules/module.py", 1789, "_call_impl"), _f("train.py", 35, "<module>")]
    if r.phase == "backward":
        return _ENGINE
    if r.phase == "optimizer":
        return _STEP
    return [_f("train.py", 50, "<module>")]


def requested(r) -> int:
    """The bytes the storage asked for (a GPU snapshot's requested_size): its shape times its element size where that
    rounds to the record's 512-byte multiple (recorder.cuda_rounded); else the record's bytes (a view's storage)."""
    try:
        n = math.prod(r.shape) * r.dtype.itemsize
    except (AttributeError, TypeError):
        return r.nbytes
    return n if 0 < n and cuda_rounded(n) == r.nbytes else r.nbytes


def snapshot_of(records, start: int, end: int | None = None, lazy=None, lazy_at: int | None = None,
                conf: str | None = None, at: int | None = None) -> tuple[dict, list]:
    """(the snapshot dict at event `at` of the replayed step (None: where its allocated bytes first peak), the records
    allocated then). The arguments are alloc.replay's."""
    step = dict(records=records, start=start, end=end, lazy=lazy, lazy_at=lazy_at)
    if at is None:
        _, _, at = steady_state(conf=conf, **step)
    a, handles, _ = steady_state(conf=conf, until=at, **step)
    by_addr = {handles[id(r)]: r for r in records if id(r) in handles}
    return snapshot_dict(a, lambda addr: (requested(by_addr[addr]), frames_of(by_addr[addr]))), list(by_addr.values())


def trace_snapshot(rec, setup, conf: str | None = None, at: int | None = None) -> tuple[dict, list]:
    """snapshot_of the traced step: rec, the trace's AllocationRecorder (trace.engine.trace_train)."""
    return snapshot_of(conf=conf, at=at, **replay_args(rec, setup))
