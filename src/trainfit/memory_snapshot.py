"""Read a PyTorch CUDA memory snapshot and attribute its bytes: what `trainfit explain` shows.

The file: `torch.cuda.memory._dump_snapshot(path)` (a pickle of `_snapshot()`'s dict, torch 2.13
torch/cuda/memory.py:1129-1146), the same dict saved by an out-of-memory observer
(`torch._C._cuda_attach_out_of_memory_observer(fn)`, fn(device, alloc, device_alloc, device_free) calling
`_snapshot()` before the exception unwinds; its history then ends in an "oom" entry, memory.py:1085-1104), a
`torch.save` of it, or `torch.cuda.memory_snapshot()`'s list of segments. Format: memory.py:1034-1083 (segments
with blocks; each block's size, requested_size, state and, when `_record_memory_history` was on, its frames).
A pickle can run code when loaded: a snapshot holds only dicts, lists, tuples, strings and numbers, so it is read
with an Unpickler that refuses every class (and a torch.save zip with torch.load(weights_only=True)).

Categories, from a block's frames (innermost first; the rules name the frames torch records, stacks="all"):
- optimizer_states: allocated in torch.optim's `_init_group` (torch/optim/adam.py:178, the states' zeros_like);
  any other torch/optim frame: the optimizer step's temporaries;
- gradients / temporaries: allocated by the autograd engine (torch/csrc/autograd/engine.cpp's C++ frames: the CUDA
  backward runs on the engine's device thread, which has no Python stack: torch 2.13
  include/torch/csrc/autograd/engine.h:225 start_device_threads; or torch/autograd/graph.py
  _engine_run_backward on a CPU). A parameter's gradient is an ordinary output of a backward op that
  AccumulateGrad keeps (include/torch/csrc/autograd/functions/accumulate_grad.h:82-83, 192-200: it steals the
  tensor, or clones it inside the engine too), so no frame names it: a backward block counts as a gradient when its requested size is a
  weight block's (one gradient per weight block). NB: an activation's gradient of a weight's size reads as a
  gradient (gradients high); a gradient in another dtype than its weight (fp32 gradients of bf16 weights) as a
  temporary (gradients low). Under torch/utils/checkpoint.py: activations recomputed for the backward;
- activations: allocated inside an nn.Module's forward (torch/nn/modules/module.py _call_impl). NB: in a snapshot
  taken inside the forward this includes the running op's temporaries (activations high);
- weights: allocated building or moving the model (other torch/nn frames: module.py _apply/convert, a layer's
  __init__, torch/nn/init.py; transformers' modeling_utils.py; safetensors; accelerate's set_module_tensor_to_device);
- inputs and other: every other block with frames (the batch, user code); unattributed: blocks without frames
  (history was not recorded: `torch.cuda.memory._record_memory_history()` before building the model);
- the allocator's own: rounding (size - requested_size of allocated blocks), fragmented (free blocks inside
  segments that hold an allocated block: release_cached_blocks cannot give them back), cached (segments with no
  allocated block: empty_cache or an OOM retry gives them back), awaiting free (freed on one stream, waiting for
  another: active_awaiting_free).
"""
from __future__ import annotations

import pickle
import zipfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from .errors import SnapshotError
from .references import not_a_file

TENSOR_CATEGORIES = ("weights", "gradients", "optimizer_states", "activations", "temporaries", "inputs_and_other",
                     "unattributed")
ALLOCATOR_CATEGORIES = ("rounding", "fragmented", "cached", "awaiting_free")
STATES = ("active_allocated", "active_awaiting_free", "inactive")  # a block's (torch/cuda/memory.py Block)


class _DataOnly(pickle.Unpickler):
    """Unpickles builtin data only: a reference to any class or function is refused (pickle docs, "Restricting
    Globals": find_class is called for every global the stream names)."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"it refers to {module}.{name}, which a memory snapshot never does")


def load(path: str | Path) -> dict:
    """The snapshot dict ({"segments": [...], "device_traces": [...]}) in `path`, or a SnapshotError saying why not."""
    how = "torch.cuda.memory._dump_snapshot(path)"
    why = not_a_file(path)  # the text as given: Path("") is ".", a folder
    if why:
        raise SnapshotError(f"{why}: give the path of a snapshot saved with {how}")
    p = Path(path)
    try:
        if zipfile.is_zipfile(p):
            import torch

            data = torch.load(p, weights_only=True, map_location="cpu")
        else:
            with open(p, "rb") as f:
                data = _DataOnly(f).load()
    except Exception as e:  # every unpickling failure is one line: the file is not what we read
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise SnapshotError(f"{path}: not a PyTorch memory snapshot pickle ({first}); save one with {how}") from None
    if isinstance(data, list):  # torch.cuda.memory_snapshot(): the segments alone
        data = {"segments": data, "device_traces": []}
    if not isinstance(data, dict) or not isinstance(data.get("segments"), list):
        raise SnapshotError(f"{path}: a pickle, but not a memory snapshot (no 'segments' list); save one with {how}")
    for i, s in enumerate(data["segments"]):
        if not (isinstance(s, dict) and "total_size" in s and isinstance(s.get("blocks"), list)
                and all(isinstance(b, dict) and "size" in b and "state" in b for b in s["blocks"])):
            raise SnapshotError(f"{path}: a segment lacks total_size or blocks with size and state: not the format of "
                                f"{how} (torch/cuda/memory.py Segment, Block)")
        if "device" in s and not _is_size(s["device"]):  # (a CUDA device index: memory_snapshot.cpp)
            raise SnapshotError(f"{path}: segment {i}'s device is {s['device']!r:.40}, not a CUDA device index (an "
                                f"int >= 0): save the snapshot again with {how}")
        sizes = [(f"segment {i}'s total_size", s["total_size"])] + [
            (f"segment {i} block {j}'s {k}", b[k]) for j, b in enumerate(s["blocks"])
            for k in ("size", "requested_size") if k in b]
        for what, v in sizes:
            if not _is_size(v):
                v = repr(v) if len(repr(v)) <= 40 else repr(v)[:40] + "…"
                raise SnapshotError(f"{path}: {what} is {v}, not a byte count (an int >= 0: torch/cuda/memory.py "
                                    f"Segment, Block): save the snapshot again with {how}")
        for j, b in enumerate(s["blocks"]):
            # the block's own invariants (memory.py Block): one of the allocator's three states, rounded up from the
            # request, inside its segment; else the categories come out negative or above what is reserved
            if b["state"] not in STATES:
                raise SnapshotError(f"{path}: segment {i} block {j}'s state is {b['state']!r:.40}, not one of "
                                    f"{', '.join(STATES)} (torch/cuda/memory.py Block): save the snapshot again with "
                                    f"{how}")
            if b.get("requested_size", 0) > b["size"]:
                raise SnapshotError(f"{path}: segment {i} block {j}'s requested_size {b['requested_size']} is above "
                                    f"its size {b['size']} (the allocator rounds requests up: torch/cuda/memory.py "
                                    f"Block): save the snapshot again with {how}")
        split = sum(b["size"] for b in s["blocks"])
        if split != s["total_size"]:  # (torch's own reader asserts it: _memory_viz.py segsum, "Segment size mismatch")
            raise SnapshotError(f"{path}: segment {i}'s blocks add up to {split} bytes, not its total_size "
                                f"{s['total_size']} (a segment is split into its blocks: torch/cuda/memory.py "
                                f"Segment): save the snapshot again with {how}")
        for j, b in enumerate(s["blocks"]):
            if not _are_frames(b.get("frames", [])):
                raise SnapshotError(f"{path}: segment {i} block {j}'s frames are not a list of frames (each a dict "
                                    "of filename, line, name: torch/cuda/memory.py Frame): save the snapshot again "
                                    f"with {how}")
    traces = data.get("device_traces") or []
    if not (isinstance(traces, list) and all(isinstance(t, list) and all(isinstance(e, dict) for e in t)
                                             for t in traces)):
        raise SnapshotError(f"{path}: its device_traces are not a list of each device's list of entries (dicts: "
                            f"torch/cuda/memory.py Snapshot, TraceEntry): save the snapshot again with {how}")
    for e in (e for t in traces for e in t if e.get("action") == "oom"):  # (the entries explain reads)
        for k in ("size", "device_free"):
            if e.get(k) is not None and not _is_size(e[k]):
                raise SnapshotError(f"{path}: an oom entry's {k} is {e[k]!r:.40}, not a byte count (an int >= 0: "
                                    f"torch/cuda/memory.py TraceEntry): save the snapshot again with {how}")
    return data


def _are_frames(frames) -> bool:
    """A block's frames as torch writes them (torch/cuda/memory.py Frame): a list of dicts whose filename and name
    are strings and whose line is an int, where given (the categories read them: _kind, _where)."""
    return isinstance(frames, list) and all(
        isinstance(f, dict) and isinstance(f.get("filename", ""), str) and isinstance(f.get("name", ""), str)
        and isinstance(f.get("line", 0), int) for f in frames)


def _is_size(v) -> bool:
    """A byte count as torch writes one: an int >= 0 (a bool is an int to isinstance, not a size)."""
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


@dataclass
class Explained:
    reserved: int  # sum of segments' total_size: torch.cuda.memory_reserved at the snapshot
    allocated: int  # sum of allocated blocks' sizes: memory_allocated
    bytes: dict[str, int]  # TENSOR_CATEGORIES and ALLOCATOR_CATEGORIES -> bytes (they sum to `reserved`)
    by_site: list[tuple[str, str, int]]  # (where: file:line:function, category, bytes), largest first
    segments: int
    blocks: int  # allocated blocks (state active_allocated): the blocks that make up `allocated`
    with_frames: float  # share of allocated bytes whose blocks carry frames
    oom: dict | None = None  # the last "oom" history entry: size requested, device_free
    notes: list[str] = field(default_factory=list)


def _fmt(f: dict) -> str:
    """A frame as torch/cuda/_memory_viz.py _frame_fmt writes it (file's base name:line:function), without importing
    torch (trainfit's base install has none)."""
    return f"{f.get('filename', '').split('/')[-1]}:{f.get('line', 0)}:{f.get('name', '')}"


def _where(frames: list[dict]) -> str | None:
    """The innermost frame outside torch (the model's or the user's code); else the innermost torch.nn frame; else
    the innermost frame."""
    for f in frames:
        fn = f.get("filename", "")
        if "/torch/" not in fn and not fn.startswith(("torch/", "<")) and not fn.endswith((".cpp", ".h")) \
                and fn not in ("", "??"):
            return _fmt(f)
    nn = next((_fmt(f) for f in frames if "torch/nn/" in f.get("filename", "")), None)
    return nn or (_fmt(frames[0]) if frames else None)


def _kind(frames: list[dict]) -> str:
    """A block's category from its frames (module docstring), 'backward' for the autograd engine's blocks."""
    if not frames:
        return "unattributed"
    names = [(f.get("filename", ""), f.get("name", "")) for f in frames]
    if any("torch/optim/" in fn for fn, _ in names):
        return "optimizer_states" if any(n == "_init_group" for _, n in names) else "temporaries"
    if any("torch::autograd::Engine" in n or "autograd/engine.cpp" in fn or n == "_engine_run_backward"
           for fn, n in names):
        return "activations" if any("torch/utils/checkpoint.py" in fn for fn, _ in names) else "backward"
    if any("torch/nn/modules/module.py" in fn and n in ("_call_impl", "_wrapped_call_impl") for fn, n in names):
        return "activations"
    if any("torch/nn/" in fn or "transformers/modeling_utils.py" in fn or "safetensors" in fn
           or n == "set_module_tensor_to_device" for fn, n in names):
        return "weights"
    return "inputs_and_other"


def explain(data: dict) -> Explained:
    """Attribute every reserved byte of snapshot `data` (load's dict) to a category (module docstring). A snapshot of
    a process using several GPUs holds each one's segments (each segment names its device: torch/csrc/cuda/
    memory_snapshot.cpp segmentInfoToDict): the GPU that reserved the most is explained, as one GPU is predicted."""
    reserved_on = Counter()
    for s in data["segments"]:
        reserved_on[s.get("device", 0)] += s["total_size"]
    device = max(reserved_on, key=lambda d: reserved_on[d]) if len(reserved_on) > 1 else None
    segments = [s for s in data["segments"] if device is None or s.get("device", 0) == device]
    traces = data.get("device_traces") or []
    if device is not None:  # (device_traces: one list per device, by index)
        traces = [traces[device]] if isinstance(device, int) and 0 <= device < len(traces) else []
    out = Counter({k: 0 for k in TENSOR_CATEGORIES + ALLOCATOR_CATEGORIES})
    sites: Counter = Counter()
    blocks, framed, allocated = [], 0, 0
    for s in segments:
        # allocated means state "active_allocated" only, as torch 2.13 torch/cuda/_memory_viz.py:219 (calc_active) and
        # :274 (segsum) count it; "inactive" and "active_awaiting_free" are not (memory.py:1065-1069)
        live = any(b["state"] == "active_allocated" for b in s["blocks"])
        for b in s["blocks"]:
            if b["state"] == "active_allocated":
                frames = b.get("frames") or []
                requested = b.get("requested_size", b["size"])
                out["rounding"] += b["size"] - requested
                allocated += b["size"]
                framed += b["size"] if frames else 0
                blocks.append((_kind(frames), requested, frames))
            elif b["state"] == "active_awaiting_free":
                out["awaiting_free"] += b["size"]
            else:
                out["fragmented" if live else "cached"] += b["size"]
    weights = Counter(req for kind, req, _ in blocks if kind == "weights")
    for kind, requested, frames in blocks:
        if kind == "backward":
            kind = "gradients" if weights[requested] > 0 else "temporaries"
            if kind == "gradients":
                weights[requested] -= 1
        out[kind] += requested
        sites[(_where(frames) or "(no frames)", kind)] += requested
    reserved = sum(s["total_size"] for s in segments)
    ooms = [e for trace in traces for e in trace or [] if e.get("action") == "oom"]
    ex = Explained(reserved=reserved, allocated=allocated, bytes=dict(out),
                   by_site=sorted(((w, k, n) for (w, k), n in sites.items()), key=lambda x: -x[2]),
                   segments=len(segments), blocks=len(blocks),
                   with_frames=framed / allocated if allocated else 0.0,
                   oom={"size": ooms[-1].get("size"), "device_free": ooms[-1].get("device_free")} if ooms else None)
    if device is not None:
        from .units import fmt_bytes

        others = ", ".join(f"cuda:{d} {fmt_bytes(n)}" for d, n in sorted(reserved_on.items()) if d != device)
        ex.notes.append(f"the snapshot holds {len(reserved_on)} GPUs' segments: cuda:{device} is explained (it "
                        f"reserved the most, {fmt_bytes(reserved)}); the others reserved {others}")
    if allocated and ex.with_frames < 0.5:
        ex.notes.append("most blocks carry no frames: call torch.cuda.memory._record_memory_history() before "
                        "building the model, so the snapshot says what allocated each block")
    return ex
