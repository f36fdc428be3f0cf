"""Memory snapshots of a real CUDA step for `trainfit explain` (cuda_truth.py --snapshots).

The case's model is built with torch's allocation history on (torch/cuda/memory.py:892 _record_memory_history,
enabled="state", context="state": frames of the blocks alive, no event history, so the file stays small; stacks="all":
the backward's C++ frames, the autograd engine's device thread having no Python stack), one warm-up step runs
(prepare: the optimizer states exist), and the snapshot is taken at the next step's backward start (the step's phase
callback), where the forward's saved tensors are all live. An out-of-memory observer
(torch._C._cuda_attach_out_of_memory_observer: fn(device, alloc, device_alloc, device_free), called before the
exception unwinds) writes the snapshot at the OOM instead when the step does not fit. Needs CUDA: no CPU path.
"""
from __future__ import annotations

import pickle
from pathlib import Path

_CURRENT: dict = {}  # the path the OOM observer writes to (observers cannot be detached: one is attached per process)


def _observer(device, alloc, device_alloc, device_free) -> None:
    import torch

    path = _CURRENT.get("oom")
    if path is not None:
        Path(path).write_bytes(pickle.dumps(torch.cuda.memory._snapshot()))


def record(spec, setup, device: str, folder: Path, case_id: str) -> dict:
    """Write <folder>/<case_id>.pickle (the snapshot at backward start) or <case_id>-oom.pickle; returns
    {"path": ..., "explained": trainfit.memory_snapshot.explain's bytes} or {"error": ...}."""
    import torch

    from trainfit.memory_snapshot import explain, load
    from trainfit.step import stack_step

    folder.mkdir(parents=True, exist_ok=True)
    path, oom = folder / f"{case_id}.pickle", folder / f"{case_id}-oom.pickle"
    if not _CURRENT.get("attached"):
        torch._C._cuda_attach_out_of_memory_observer(_observer)
        _CURRENT["attached"] = True
    _CURRENT["oom"] = oom
    taken: dict = {}

    def phase(name: str) -> None:
        if name == "backward" and "snapshot" not in taken:
            taken["snapshot"] = torch.cuda.memory._snapshot()

    torch.cuda.memory._record_memory_history(enabled="state", context="state", stacks="all")
    try:
        step = stack_step(setup)
        model, optimizer, batches = step.prepare(spec, setup, device=device)
        step.run_step(model, optimizer, batches, setup, phase)
        torch.cuda.synchronize()
        path.write_bytes(pickle.dumps(taken["snapshot"]))
        written = path
    except torch.OutOfMemoryError:
        written = oom
    except Exception as e:
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
        _CURRENT["oom"] = None
        model = optimizer = batches = taken = None  # noqa: F841 (the case's tensors go before the next case)
        torch.cuda.empty_cache()
    if not written.is_file():
        return {"error": "no snapshot written"}
    return {"path": str(written), "bytes": explain(load(written)).bytes}
