"""AllocationRecorder: a dispatch-level record of every storage's birth and death during a step.

Why our own mode rather than `torch.distributed._tools.MemTracker`: MemTracker does a pytree walk, a
module-stack lookup and a per-category dict update on every op, and takes ~30 s for a 7B step on
two cores, about 10x the bare fake-tensor step. Here the per-op work is one `id()` lookup per
output (and registration of genuinely new storages); categories, activations and the peak's make-up
are worked out afterwards from the birth/death records (see `analysis.py`).

What is counted is what PyTorch's allocator would hold: one entry per untyped storage (views share
it), `storage.nbytes()` bytes (rounded like the CUDA caching allocator when asked), from the op that
returns it until its last reference dies (a weakref callback on the storage object, whose Python
object PyTorch keeps alive as long as the C++ storage lives). Allocations made and freed *inside*
one kernel (scratch buffers) are invisible at this level; for CPU runs two kinds are added back as a
TEMPORARY born before the op's outputs and dying right after them: mixed-dtype input copies, by
formula (cpu_casts.py), and the scratch of matmul, flash-attention and convolution kernels, measured
by running the op on this CPU (kernel_scratch.py). NB the trace can under-read a real peak that falls
inside another kernel's scratch.
"""
from __future__ import annotations

import weakref

import torch
from torch._prims_common import is_non_overlapping_and_dense_or_false
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass_type

from .. import cancel
from .cpu_casts import PROMOTING, cast_scratch
from .fake_overrides import OVERRIDES
from .kernel_scratch import PROBED, KernelScratch
from .flops import FlopCounter

_ADD = torch.ops.aten.add.Tensor
# Where a stopped trace may raise: the matrix products, which are only called from a model's Python forward or from
# the autograd engine (it carries an op's error back to backward()'s caller). NB: raising from every op aborted the
# process ("terminate called after throwing an instance of 'python_error'") when the op was dispatched inside C++
# that cannot carry a Python error; a step without these ops is stopped at its end instead.
_aten = torch.ops.aten
CANCEL_POINTS = frozenset((_aten.mm.default, _aten.addmm.default, _aten.bmm.default, _aten.baddbmm.default))

# Categories (index into the per-category arrays). "activation" is decided after the fact: a storage
# born in a forward phase and still alive when that forward ends (see analysis.py); until then every
# storage born during the step is recorded as TEMPORARY.
CATEGORIES = ("parameter", "buffer", "master_weight", "gradient", "optimizer_state", "activation", "temporary",
              "input", "kv_cache")
(PARAMETER, BUFFER, MASTER_WEIGHT, GRADIENT, OPTIMIZER_STATE, ACTIVATION, TEMPORARY, INPUT,
 KV_CACHE) = range(len(CATEGORIES))
# The recorder's names -> the Category every engine reports (trainfit.estimate.Category)
AS_CATEGORY = {"parameter": "weights", "buffer": "buffers", "master_weight": "master_weights",
               "gradient": "gradients", "optimizer_state": "optimizer_states", "activation": "activations",
               "temporary": "temporaries", "input": "inputs", "kv_cache": "kv_cache"}


def as_categories(at: dict) -> dict:
    return {AS_CATEGORY[k]: v for k, v in at.items()}


class Record:
    """One storage's life. `death` is None while alive; event indices order births and deaths. `stream`: the CUDA
    stream it would be allocated on (0 the compute stream, 1.. side streams in creation order: streams.py)."""

    __slots__ = ("_ref", "birth", "cat", "death", "dtype", "fixed", "module", "name", "nbytes", "phase", "shape",
                 "source", "stream")

    def __init__(self, nbytes, cat, birth, phase, module, shape, dtype, name=""):
        self.nbytes = nbytes
        self.cat = cat
        self.fixed = False  # the category is known at birth: analysis.settle_activations leaves it alone
        self.birth = birth
        self.death = None
        self.phase = phase
        self.module = module
        self.shape = shape
        self.dtype = dtype
        self.name = name
        self.stream = 0
        self.source = None  # the record of the op's first argument (its element, for a foreach op's output)


def cuda_rounded(nbytes: int) -> int:
    """The CUDA caching allocator hands out multiples of 512 bytes (c10/cuda/CUDACachingAllocator.cpp,
    kMinBlockSize), and max_memory_allocated counts the rounded size."""
    return (nbytes + 511) & ~511


_PLAIN = frozenset({torch.Tensor, FakeTensor, torch.nn.Parameter})


class AllocationRecorder(TorchDispatchMode):
    """Records storages created by ops while active, plus any pre-existing ones registered with `adopt`.

    Enter it *inside* FakeTensorMode (so it sits on top of the mode stack and sees the fake outputs).
    `modules` (a ModuleStack) supplies the owning module of each allocation; `flops` counts FLOPs.
    """

    def __init__(self, modules=None, count_flops: bool = False, round_cuda: bool = False):
        super().__init__()
        self.live: dict[int, Record] = {}  # id(storage) -> record; ids are unique while the storage lives
        self.records: list[Record] = []
        self.event = 0  # increments on every birth and death
        self.total = 0  # live bytes now
        self.peak = 0
        self.peak_event = 0
        self.step_start = 0  # event index of the step start (reset_peak): replays of the step start here
        self.stop = None  # event index at which recording stopped (__exit__)
        self.phase = "setup"
        self.phase_marks: list[tuple[int, str]] = []  # (event index at which the phase starts, name)
        # Structural marks (module entry/exit, gradient ready) for layer extrapolation; None: off.
        self.seg_marks: list[tuple[int, tuple]] | None = None
        self.bwd_marks: list[tuple[int, str]] = []  # (event, module) where a module's backward starts (with seg_marks)
        self.modules = modules
        self.stream_of = None  # () -> the current stream's number (streams.numbered_streams); None: all on 0
        # A gradient sum the autograd engine may make in place (_accumulated): (its first operand's storage
        # id, the sum's storage id, the sum's record, the event right after the sum, (peak, peak_event) before it)
        self._accum = None
        self.size = cuda_rounded if round_cuda else int
        self.flops = FlopCounter(self) if count_flops else None
        # Allocations a CPU run makes that a CUDA device would not: CPU kernels' mixed-dtype input
        # copies (cpu_casts.py) and host-side RNG state (see __enter__).
        self.host_is_device = not round_cuda
        self.promoting = PROMOTING if self.host_is_device else frozenset()
        # CPU kernels whose internal scratch depends on this CPU's ISA: measured by a probe (kernel_scratch.py).
        self.kernels = KernelScratch() if self.host_is_device else None
        self.probed = PROBED if self.host_is_device else frozenset()

    # -- phases ---------------------------------------------------------------------------------
    def set_phase(self, name: str) -> None:
        self.phase = name
        self.phase_marks.append((self.event, name))

    def mark(self, key: tuple) -> None:
        if self.seg_marks is not None:
            self.seg_marks.append((self.event, key))

    def mark_backward(self, module: str) -> None:
        if self.seg_marks is not None:
            self.bwd_marks.append((self.event, module))

    def reset_peak(self) -> None:
        """Like torch.cuda.reset_peak_memory_stats() at the step start: the peak restarts at what is live now."""
        self.peak = self.total
        self.peak_event = self.event
        self.step_start = self.event

    # -- registration ---------------------------------------------------------------------------
    def adopt(self, tensor: torch.Tensor, cat: int, name: str = "") -> Record:
        """Count a tensor that exists already (weights, optimizer state, batch), or re-label one we saw
        born (a gradient stolen by AccumulateGrad, a KV-cache entry). Returns its record."""
        st = tensor.untyped_storage()
        rec = self.live.get(id(st))
        if rec is None:
            rec = self._register(st, tensor, cat)
        else:
            rec.cat = cat
        if name:
            rec.name = name
        return rec

    def _register(self, st, tensor, cat) -> Record:
        key = id(st)
        rec = self._born(self.size(st.nbytes()), cat, tuple(tensor.shape), tensor.dtype)
        self.live[key] = rec
        live = self.live

        def died(_ref, key=key, self=self):
            # Runs when the last reference to the storage goes: that is the allocator's free.
            acc = self._accum
            if acc is not None and acc[0] == key and acc[3] == self.event:
                self._in_place(acc)
                return
            rec = live.pop(key)
            rec.death = self.event
            self.event += 1
            self.total -= rec.nbytes

        rec._ref = weakref.ref(st, died)
        return rec

    def _born(self, nbytes: int, cat: int, shape: tuple, dtype, name: str = "") -> Record:
        mod = self.modules.current if self.modules is not None else ""
        rec = Record(nbytes, cat, self.event, self.phase, mod, shape, dtype, name)
        if self.stream_of is not None:
            rec.stream = self.stream_of()
        self.event += 1
        self.records.append(rec)
        self.total += nbytes
        if self.total > self.peak:
            self.peak = self.total
            self.peak_event = rec.birth
        return rec

    # -- autograd's gradient sums ------------------------------------------------------------------
    def _accumulated(self, args, kwargs, out) -> int | None:
        """For an `aten.add.Tensor` that may be the autograd engine summing two gradients of one input: the
        storage id of its first operand (else None).

        The engine sums them in torch/csrc/autograd/input_buffer.cpp `accumulate`: `old_var.add_(var)` -- in
        place, no new block -- when grad mode is off and `can_accumulate_inplace(old_var)`: a plain tensor,
        non-overlapping and dense, whose last reference the buffer holds (`use_count() == 1` for the tensor and
        its storage: a view fails this, its base holds the storage too); else `old_var + var`. Under the trace
        every tensor is "subclass-like" (ATen/TensorSubclassLikeUtils.h isTensorSubclassLike: true while a dispatch mode is on, and for fake
        tensors), so the engine always takes the out-of-place branch here. We see the same sum and can tell
        the in-place case afterwards: the first operand's storage dies right after the sum, before any other
        event (the buffer held its last reference); `died` then folds the sum into that storage (_in_place).
        Only sums inside the backward engine (`_current_autograd_node`) with grad mode off qualify.
        NB: a backward formula whose last op is `grad + x` on a gradient it holds the last reference to is
        folded too (reads low by that one transient block); none is known in the traced models. FSDP2 traces
        (distributed.ShardedRecorder) keep the out-of-place sums (reads high by one block per such sum)."""
        if kwargs or len(args) != 2 or torch.is_grad_enabled() or torch._C._current_autograd_node() is None:
            return None
        old, var = args
        if not (isinstance(old, torch.Tensor) and isinstance(var, torch.Tensor)):
            return None
        if old.shape != out.shape or old.dtype != out.dtype or old.device != out.device \
                or not is_non_overlapping_and_dense_or_false(old) or old._base is not None:
            return None  # a view keeps its base alive: their storage's use_count is 2, the engine adds out of place
        st = old.untyped_storage()
        rec = self.live.get(id(st))
        if rec is None or rec.nbytes != self.size(out.untyped_storage().nbytes()):
            return None
        return id(st)

    def _in_place(self, acc) -> None:
        """The sum's first operand died right after the sum: the engine would have added in place. Its block
        lives on as the sum; the sum's own block never existed (its record goes, the totals and peak with it)."""
        old_key, out_key, out_rec, _, (peak, peak_event) = acc
        self._accum = None
        old_rec = self.live.pop(old_key)
        self.live[out_key] = old_rec  # the sum's storage now ends the operand's record when it dies
        old_rec._ref = out_rec._ref  # ... through the sum's weakref, which must outlive the dropped record
        old_rec.shape, old_rec.dtype = out_rec.shape, out_rec.dtype
        assert self.records[-1] is out_rec  # nothing was born since the sum (the event check in `died`)
        self.records.pop()
        self.total -= out_rec.nbytes
        self.peak, self.peak_event = peak, peak_event

    # -- allocations that bypass the dispatcher ---------------------------------------------------
    def __enter__(self):
        # torch.utils.checkpoint stashes the CPU generator state (a 5056-byte uint8 tensor) per
        # checkpointed call until its recomputation; torch.get_rng_state() builds that tensor without
        # dispatching an op, so we count its result here. (CPU memory: it counts in a CPU peak; on
        # CUDA it lives on the host and the CUDA allocator never sees it.)
        self._get_rng_state = torch.get_rng_state
        if self.host_is_device:
            def get_rng_state(*a, **k):
                t = self._get_rng_state(*a, **k)
                st = t.untyped_storage()
                if id(st) not in self.live:
                    self._register(st, t, TEMPORARY)
                return t
            torch.get_rng_state = get_rng_state
        return super().__enter__()

    def __exit__(self, *exc):
        self.stop = self.event  # later deaths are the traced objects going away, not the step's (alloc/replay.py)
        torch.get_rng_state = self._get_rng_state
        return super().__exit__(*exc)

    # -- tensor subclasses ------------------------------------------------------------------------
    plain = _PLAIN  # tensor types whose storage is the allocation (a subclass recorder adds those it unwraps itself)

    def unwraps(self, types) -> bool:
        """Whether an op on these types is left to a wrapper subclass among them (torchao's Float8TrainingTensor,
        WeightWithDynamicFloat8CastTensor): it holds plain inner tensors, and a wrapper's own storage is no
        allocation (its nbytes are its outer dtype's). Returning NotImplemented lets the subclass unwrap, as
        FakeTensorMode does (torch/_subclasses/fake_tensor.py, "[subclass inputs]"), and the ops it runs on
        the inner tensors come back here: their outputs are the storages allocated."""
        return bool(types) and any(t not in self.plain and is_traceable_wrapper_subclass_type(t) for t in types)

    # -- the hot path ---------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.unwraps(types):
            return NotImplemented
        if func in CANCEL_POINTS:
            cancel.check()  # the web's time limit and disconnects stop a trace here (trainfit/cancel.py)
        override = OVERRIDES.get(func)
        out = func(*args, **(kwargs or {})) if override is None else override(func, args, kwargs or {})
        if self.flops is not None:
            self.flops.count(func, args, kwargs, out)
        scratch = self._cpu_scratch(func, args, kwargs, out)
        live = self.live
        # where a storage came from (with seg_marks: depth_records.py finds the layer of an optimizer's temporary
        # through it): an op's first argument, element by element for a foreach op (torch.optim's multi-tensor
        # step makes one output per parameter)
        src = args[0] if self.seg_marks is not None and args else None
        if type(out) in (tuple, list):
            each = src if type(src) in (tuple, list) and len(src) == len(out) else None
            for j, o in enumerate(out):
                if isinstance(o, torch.Tensor):
                    st = o.untyped_storage()
                    if id(st) not in live:
                        new = self._register(st, o, TEMPORARY)
                        if each is not None and isinstance(each[j], torch.Tensor):
                            new.source = live.get(id(each[j].untyped_storage()))
        elif isinstance(out, torch.Tensor):
            st = out.untyped_storage()
            rec = live.get(id(st))
            if rec is None:
                operand = self._accumulated(args, kwargs, out) if func is _ADD and scratch is None else None
                peak = (self.peak, self.peak_event)
                new = self._register(st, out, TEMPORARY)
                self._accum = None if operand is None else (operand, id(st), new, self.event, peak)
                if isinstance(src, torch.Tensor):
                    new.source = live.get(id(src.untyped_storage()))
            elif self.size(st.nbytes()) != rec.nbytes:  # an out= or resize_ kernel grew it
                self._resized(rec, st)
        if scratch is not None:  # the kernel's copies die when it returns, after its outputs were made
            scratch.death = self.event
            self.event += 1
            self.total -= scratch.nbytes
        return out

    def _cpu_scratch(self, func, args, kwargs, out) -> Record | None:
        """What a CPU kernel allocates and frees inside itself (born here; the caller kills it once the op's outputs
        are registered): a mixed-dtype op's cast copies (cpu_casts.py) or a probed kernel's scratch (kernel_scratch.py);
        None for other ops and on CUDA semantics."""
        if func in self.promoting:
            n = cast_scratch(func, args, out)
            return self._born(n, TEMPORARY, (n,), torch.uint8, "cpu dtype-cast scratch") if n else None
        if func in self.probed:
            n = self.kernels.bytes(func, args, kwargs or {}, out)
            return self._born(n, TEMPORARY, (n,), torch.uint8, "cpu kernel scratch (probed)") if n else None
        return None

    def _resized(self, rec: Record, st) -> None:
        # An out= or resize_ kernel changed a storage's size in place: the allocator allocates the new
        # block, copies, then frees the old one (c10's resize_bytes_cpu); record exactly that. The
        # weakref stays on the storage and finds the new record through `live`.
        new = self._born(self.size(st.nbytes()), rec.cat, rec.shape, rec.dtype, rec.name)
        new._ref = rec._ref
        self.live[id(st)] = new
        rec.death = self.event
        self.event += 1
        self.total -= rec.nbytes
