"""Scratch that CPU kernels allocate through c10 *inside* one op, measured by running the op on this CPU.

Why a probe and not a formula: what a CPU matmul allocates internally depends on the instruction set the
process sees, and oneDNN decides it at run time. Sources (PyTorch files at the commits read; 2.13 may
shift lines): pytorch@00403466 aten/src/ATen/native/mkldnn/Matmul.cpp, pytorch@014a3027
aten/src/ATen/native/CPUBlas.cpp, pytorch@131c37be .../mkldnn/IDeepRegistration.cpp, pytorch@008ec6b1
aten/src/ATen/native/cpu/FlashAttentionKernel.cpp, intel/ideep@8a6cc4e0 (branch ideep_pytorch).
  * bf16 (and fp16) matmuls: `aten.mm`/`addmm` reach `cpublas::gemm`, whose bf16 overload first tries
    `mkldnn_bf16_gemm` (CPUBlas.cpp:361-386) and otherwise falls to `gemm_stub` (:416-418);
    `bmm`/`baddbmm` call `mkldnn_matmul` (Matmul.cpp:313-398) when `use_mkldnn_matmul` holds
    (LinearAlgebra.cpp, bmm_out_or_baddbmm_: `if (apply_heur && use_mkldnn_matmul(batch1, batch2,
    self_or_result))`). Both need `use_mkldnn_bf16_matmul()` = mkldnn enabled && `mkldnn_bf16_device_check()`
    (Matmul.cpp:105-107; `mkldnn_gemm` :160-167 also needs m*n*k > 16^3, `use_mkldnn_bf16_matmul(mat1,
    mat2, result)` :487-511 the same via `checksize` :450-485). On x86 the device check is
    `ideep::has_bf16_type_support()` (aten/src/ATen/native/mkldnn/Utils.h, mkldnn_bf16_device_check), i.e.
    `dnnl::get_effective_cpu_isa() >= avx2_vnni_2` (ideep abstract_types.hpp:81-88): true on AVX512
    (avx512_core and up, AVX512-BF16, AMX) and AVX2-VNNI-2 CPUs; false on plain AVX2, and false when
    ONEDNN_MAX_CPU_ISA=AVX2 caps oneDNN's effective ISA — hence no such scratch there.
  * On that path `ideep::matmul_forward::compute` (Matmul.cpp:199-201, 397-398) runs the primitive in
    user-scratchpad mode (ideep operators/matmul.hpp:866) and, per call, allocates the scratchpad and any
    reordered (blocked) copy of src/weights as ideep tensors (matmul.hpp:1290-1296: `reorder_if_differ_in`,
    `tensor scratchpad(pd.scratchpad_desc())`). An ideep tensor's buffer comes from its engine's `malloc`
    (tensor.hpp:544-545; abstract_types.hpp:113-123), which PyTorch points at c10's CPU allocator
    (IDeepRegistration.cpp:12-19, `RegisterEngineAllocator cpu_alloc(engine::cpu_engine(), ...
    c10::GetAllocator(c10::DeviceType::CPU)->raw_allocate(size) ...)`; ideep_pin_singletons.hpp:19-28).
    c10's CPU allocator reports those blocks to the profiler like any tensor (c10/core/CPUAllocator.cpp,
    ProfiledCPUMemoryReporter), so the measured peak counts them; the dispatch-level recorder, which runs
    the fake kernel, cannot see them.
  * Without oneDNN the bf16 gemm's `gemm_stub` kernels keep fp32 accumulators in `std::make_unique`
    buffers (aten/src/ATen/native/cpu/BlasKernel.cpp), and fp32 goes to MKL's sgemm (CPUBlas.cpp:227-268;
    `mkldnn_reduced_f32_gemm` is taken only at bf32/tf32 precision, Matmul.cpp:113-124): malloc'd,
    invisible to c10 and to the measured peak. What remains through c10 there is layout copies
    (addmm_impl_cpu_/bmm clone an operand that is neither contiguous nor transposed; so does
    `mkldnn_matmul`, Matmul.cpp:387-388), which depend on the layout, not on the sizes.
  * CPU flash attention: `cpu_flash_attention` allocates per-thread `buf`/`buf_reduced` with `at::empty`
    (FlashAttentionKernel.cpp:422-433) on every ISA, sized by `num_thread`, the q/kv split sizes and the
    head size (padded when `need_pack`, :390-413); its K/V packing buffers are `std::make_unique`
    (:460-465, not c10) and, in that version, fp16-only (flash_attention_kernel_impl: `could_pack =
    (query.scalar_type() == kHalf && cpublas::need_pack(kHalf))`); `cpu_flash_attention_backward` has its
    own `at::empty` `buf`/`buf_reduced` (`size_per_thread = 2 * qSplitSize * kvSplitSize`).
  * Convolutions run oneDNN (`mkldnn_convolution`, the same ideep allocator) or slow_conv2d's im2col
    `at::empty` buffers: c10 scratch on any ISA (measured here: as large as the output, or larger).

The analytic engine models the matmul part of this by formula from oneDNN's own booking (analytic/onednn.py);
tests/analytic/test_onednn_scratch.py checks that formula against this probe.

So for the ops in PROBED, when the trace uses CPU semantics (recorder.host_is_device), we run the same op
once on real zero tensors of the same sizes/strides/offsets/dtypes on this CPU, outside the fake and
dispatch modes, under the profiler's memory events (the source trainfit.measure reads), and record
    scratch = (max live bytes allocated during the op) - (bytes still live when it returns: its outputs)
as a TEMPORARY born before the outputs and dying right after them (recorder.py), so the recorder's running
total reaches exactly the op's real high-water mark whatever the order of allocations inside it. Results
are cached per (op, sizes, strides, offsets, aliasing, dtypes, scalars, threads, oneDNN settings).

Skipped as known zero (CUDA-semantics traces never probe at all): matmuls that cannot reach oneDNN by the
checks above (fp32 at the default fp32 precision; bf16/fp16 where `_is_mkldnn_bf16_supported()` /
`_is_mkldnn_fp16_supported()` is false; other dtypes) whose operands are each dense in their stride order
(addmm_impl_cpu_ then clones none of them, whatever the sizes: it clones only an operand with neither
stride 1 nor a leading dimension >= the matrix extent) are probed once per *layout class* (op, dtypes,
which dims are 1 or broadcast, stride order): on the call itself, or, above the cap, on a dense copy
shrunk to at most SHRINK per dim. Every later call of a class that measured 0 is 0 without running it.

Cost cap: a call whose work exceeds PROBE_MAX_FLOPS (or whose real tensors would exceed PROBE_MAX_BYTES) is
not run; it is listed in `unprobed` and the estimate says so (NB: can under-read, by that kernel's scratch,
if the peak falls inside it). At ~1 GFLOP/s (bf16 without oneDNN on two AVX2 cores, the slowest path
measured here) the cap bounds one probe to ~0.3 s.
NB: the probe runs the kernel once, cold: c10 memory a first call allocates and keeps (none seen) would be
counted as an output, not as scratch.
"""
from __future__ import annotations

import gc
import os
import time

import torch
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_unflatten

aten = torch.ops.aten

PROBE_MAX_FLOPS = 1 << 28  # ~268 MFLOP: <= ~0.3 s on the slowest CPU path measured here (see docstring)
PROBE_MAX_BYTES = 64 << 20  # real zero tensors materialised for one probe
SHRINK = 32  # per-dim size of the copy that verifies a layout class (32^3 > 16^3: past oneDNN's size gate)


def _overloads(*names: str) -> frozenset:
    ops = set()
    for name in names:
        packet = getattr(aten, name, None)
        if packet is not None:
            ops.update(getattr(packet, o) for o in packet.overloads())
    return frozenset(ops)


MATMUL = _overloads("mm", "addmm", "addmm_", "_addmm_activation", "bmm", "baddbmm", "baddbmm_", "addbmm",
                    "addbmm_", "mv", "addmv", "addmv_", "dot")
ATTENTION = _overloads("_scaled_dot_product_flash_attention_for_cpu",
                       "_scaled_dot_product_flash_attention_for_cpu_backward")
CONVOLUTION = _overloads("convolution", "convolution_backward")
# fp8 GEMMs (torchao's Float8Linear on CPU): _scaled_mm_out_cpu runs oneDNN's matmul on every ISA (aten/src/ATen/
# native/Blas.cpp, mkldnn_scaled_mm in mkldnn/Matmul.cpp), its scratchpad through c10 as above; measured here: a
# block of the output's size with an fp32 output. Probed call by call (no layout class: always oneDNN).
SCALED_MM = _overloads("_scaled_mm")
# Composite kernels whose C++ body makes tensors the dispatch-level recorder cannot see (a TorchDispatchMode handles
# the op, so the at:: calls inside run below it), seen as c10 events of torch 2.13 under their op:
#  * _safe_softmax (SDPA's math path, aten/src/ATen/native/transformers/attention.cpp `_safe_softmax`): beside its
#    output, a -inf mask of the input's shape in bool (isneginf), its all() over the softmax dim, and two scalars. A
#    CPU model whose SDPA takes the math path (MLA's v narrower than q/k, fp32 with GQA) peaks inside it when its
#    attention is re-run in backward (torchtitan's deepseek_v3, full recompute: 1.9 % of the step's peak).
#  * index_put_ with integer indices (aten/src/ATen/native/TensorAdvancedIndexing.cpp `_index_put_impl_`): an int64
#    copy of an int32 index (torchtitan's MoE unpermute, `out[permuted_indices, :] = ...`, models/moe/utils.py:62).
SOFTMAX_INDEXING = _overloads("_safe_softmax", "index_put_", "index_put", "_index_put_impl_")
PROBED = MATMUL | ATTENTION | CONVOLUTION | SCALED_MM | SOFTMAX_INDEXING

# Process-wide: the same op on the same CPU with the same settings allocates the same.
_CACHE: dict[tuple, int] = {}
_CLASSES: dict[tuple, int] = {}  # layout class -> the scratch its verifying probe measured
_FAILED: set[tuple] = set()  # calls whose probe raised (not retried)


def cpu_isa() -> dict:
    """What decides the kernels' paths on this CPU (for Estimate.detail and test messages)."""
    return {
        "capability": torch.backends.cpu.get_cpu_capability(),
        "mkldnn_bf16": bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()),
        "mkldnn_fp16": bool(torch.ops.mkldnn._is_mkldnn_fp16_supported()),
        "avx512_bf16": bool(torch.cpu._is_avx512_bf16_supported()),
        "amx": bool(torch.cpu._is_amx_tile_supported()),
        "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA", ""),
        "threads": torch.get_num_threads(),
    }


def _settings() -> tuple:
    return (torch.get_num_threads(), torch.backends.mkldnn.enabled, torch.backends.mkldnn.matmul.fp32_precision,
            bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()), bool(torch.ops.mkldnn._is_mkldnn_fp16_supported()))


def _reaches_onednn(tensors, settings) -> bool:
    """Whether a matmul on these dtypes can take the oneDNN path (module docstring)."""
    _, enabled, fp32_precision, bf16, fp16 = settings
    if not enabled:
        return False
    dtypes = {t.dtype for t in tensors}
    return ((torch.bfloat16 in dtypes and bf16) or (torch.float16 in dtypes and fp16)
            or (torch.float32 in dtypes and fp32_precision not in ("none", "ieee")))


# -- the work of one call, for the cost cap -----------------------------------------------------------
def _work(func, args, out) -> int:
    """FLOPs of the call, roughly (only compared with PROBE_MAX_FLOPS)."""
    ts = [a for a in args if isinstance(a, torch.Tensor)]
    if func in MATMUL or func in SCALED_MM:
        name = func._schema.name.split("::")[-1]
        a, b = (ts[1], ts[2]) if name.startswith(("add", "badd", "_addmm")) else (ts[0], ts[1])
        return 2 * a.numel() * (b.shape[-1] if b.dim() >= 2 else 1)
    if func in SOFTMAX_INDEXING:  # elementwise over the input (index_put: its values, args[2])
        return 8 * ts[-1 if len(ts) > 1 else 0].numel()
    if func in ATTENTION:
        q, k = (ts[0], ts[1]) if "backward" not in func._schema.name else (ts[1], ts[2])
        fwd = 4 * q.numel() * k.shape[-2]
        return fwd if "backward" not in func._schema.name else 5 * fwd // 2
    # convolution(input, weight, bias, stride, padding, dilation, transposed, ...): 2 FLOPs per weight
    # element per output element (per input element when transposed); backward ~2x (input + weight grads).
    if "backward" in func._schema.name:
        g, x, w, transposed = ts[0], ts[1], ts[2], args[7]
        return 4 * (x if transposed else g).numel() * (w.numel() // max(1, w.shape[0]))
    x, w, transposed = ts[0], ts[1], args[6]
    o = out if isinstance(out, torch.Tensor) else x
    return 2 * (x if transposed else o).numel() * (w.numel() // max(1, w.shape[0]))


# -- keys ----------------------------------------------------------------------------------------------
def _leaf_key(x, aliases: dict):
    if isinstance(x, torch.Tensor):
        sid = id(x.untyped_storage())
        alias = aliases.setdefault(sid, len(aliases))
        return (tuple(x.shape), x.stride(), x.storage_offset(), x.dtype, alias)
    if isinstance(x, (int, float, bool, str, type(None), torch.dtype, torch.memory_format, torch.layout)):
        return x
    return repr(x)


def _call_key(func, leaves, settings) -> tuple:
    aliases: dict = {}
    return (func, settings, tuple(_leaf_key(x, aliases) for x in leaves))


def _order(t) -> tuple:
    """Dims of size > 1 and stride != 0, outermost first (by stride)."""
    dims = [d for d in range(t.dim()) if t.shape[d] > 1 and t.stride(d) != 0]
    return tuple(sorted(dims, key=lambda d: (-t.stride(d), -d)))


def _dense(t, order) -> bool:
    expect = 1
    for d in reversed(order):
        if t.stride(d) != expect:
            return False
        expect *= t.shape[d]
    return True


def _signature(t) -> tuple:
    order = _order(t)
    return (t.dtype, tuple(s == 1 for s in t.shape), tuple(st == 0 for st in t.stride()), order, _dense(t, order))


# -- materialising real tensors ------------------------------------------------------------------------
def _extent(t) -> int:
    """Elements of storage a tensor reaches, from its storage offset 0."""
    if t.numel() == 0:
        return t.storage_offset() + 1
    return t.storage_offset() + sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride())) + 1


def _real_leaves(leaves, shrink: bool):
    """Real zero tensors for the tensor leaves: same sizes/strides/offsets/dtypes and the same storage
    sharing (or, with shrink, each dim > 1 cut to SHRINK and laid out densely in the same stride order)."""
    out, bases = [], {}
    for x in leaves:
        if not isinstance(x, torch.Tensor):
            out.append(x)
            continue
        if shrink:
            sizes = [s if s <= 1 else min(s, SHRINK) for s in x.shape]
            strides, step = [0] * x.dim(), 1
            for d in reversed(_order(x)):
                strides[d] = step
                step *= sizes[d]
            for d in range(x.dim()):
                if x.shape[d] == 1:
                    strides[d] = 1
            out.append(torch.zeros(step, dtype=x.dtype).as_strided(sizes, strides))
            continue
        key = (id(x.untyped_storage()), x.dtype)
        n = max(_extent(y) for y in leaves if isinstance(y, torch.Tensor)
                and id(y.untyped_storage()) == key[0] and y.dtype == x.dtype)
        base = bases.get(key)
        if base is None:
            base = bases[key] = torch.zeros(n, dtype=x.dtype)
        out.append(base.as_strided(tuple(x.shape), x.stride(), x.storage_offset()))
    return out


def _materialised_bytes(leaves, out) -> int:
    seen, total = set(), 0
    for x in leaves:
        if isinstance(x, torch.Tensor):
            k = (id(x.untyped_storage()), x.dtype)
            if k not in seen:
                seen.add(k)
                total += _extent(x) * x.element_size()
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return total + sum(o.numel() * o.element_size() for o in outs if isinstance(o, torch.Tensor))


# -- the probe -----------------------------------------------------------------------------------------
def _profiler():
    from torch._C._profiler import ProfilerActivity, ProfilerConfig, ProfilerState, _ExperimentalConfig
    from torch.autograd import _disable_profiler, _enable_profiler, _prepare_profiler

    # The profiler torch.profiler.profile(activities=[CPU], profile_memory=True) runs (measure/cpu_peak.py),
    # driven directly: the same c10 allocation events, without its ~3 s first-use cost in Python.
    config = ProfilerConfig(ProfilerState.KINETO, False, True, False, False, False, _ExperimentalConfig())
    acts = {ProfilerActivity.CPU}

    def start():
        _prepare_profiler(config, acts)
        _enable_profiler(config, acts)

    return start, _disable_profiler


def scratch_of(run) -> tuple[int, int]:
    """Run `run()` (real tensors) under the profiler's memory events: (max live bytes allocated during the
    call, bytes of those still live when it returns), both from c10's own running total, events ordered
    as trainfit.measure.cpu_peak.analyse orders them (time, then event-tree order)."""
    if torch.autograd._profiler_enabled():  # ours would end the caller's session: not measured
        raise RuntimeError("a profiler session is already active")
    start, stop = _profiler()
    was = gc.isenabled()
    gc.disable()  # a collection inside would free older tensors mid-call
    try:
        start()
        try:
            result = run()
        finally:
            roots = stop().experimental_event_tree()
        del result  # the outputs die after the session: they count as "still live"
    finally:
        if was:
            gc.enable()
    allocs, stack, i = [], list(reversed(roots)), 0
    while stack:  # pre-order walk, as cpu_peak._walk
        e = stack.pop()
        stack.extend(reversed(e.children))
        ef = e.extra_fields
        if type(ef).__name__ == "_ExtraFields_Allocation" and ef.device.type == "cpu":
            allocs.append((e.start_time_ns, i, ef.alloc_size, ef.total_allocated))
        i += 1
    if not allocs:
        return 0, 0
    allocs.sort(key=lambda a: (a[0], a[1]))
    base = allocs[0][3] - allocs[0][2]
    return max(a[3] for a in allocs) - base, allocs[-1][3] - base


def measure_call(func, leaves, spec, shrink: bool = False) -> int:
    """Kernel scratch of func on real zero tensors laid out like `leaves` (the flattened args/kwargs)."""
    with _disable_current_modes(), torch.autocast("cpu", enabled=False):
        real = _real_leaves(leaves, shrink)
        a, k = tree_unflatten(real, spec)
        gen = torch.default_generator.get_state()  # dropout_p > 0 would draw from it
        try:
            peak, live = scratch_of(lambda: func(*a, **k))
        finally:
            torch.default_generator.set_state(gen)
    return peak - live


class KernelScratch:
    """One recorder's view: the scratch of each PROBED call, and what could not be probed."""

    def __init__(self):
        self.settings = _settings()
        self.probes = 0
        self.seconds = 0.0
        self.known_zero = 0
        self.unprobed: dict[tuple, str] = {}  # call key -> op name, for calls above the cap (or that failed to run)

    def _probe(self, func, leaves, spec, shrink=False) -> int | None:
        t0 = time.perf_counter()
        try:
            n = measure_call(func, leaves, spec, shrink)
        except Exception:  # noqa: BLE001 - an op refusing zero inputs, a profiler API that moved...: listed, not fatal
            n = None
        self.seconds += time.perf_counter() - t0
        self.probes += 1
        return n

    def _skip(self, func, key) -> int:  # not measured: counts as 0, and is listed
        self.unprobed[key] = str(func).removeprefix("aten.")
        return 0

    def _layout_class(self, func, tensors) -> tuple | None:
        """The class a matmul off the oneDNN path belongs to, if its zero scratch can be verified once for
        all sizes: every operand dense in its stride order (then addmm_impl_cpu_/bmm never clone it, and a
        dense shrunk copy has the same class) and no two operands sharing storage. None otherwise."""
        if func not in MATMUL or _reaches_onednn(tensors, self.settings):
            return None
        sigs = tuple(_signature(t) for t in tensors)
        if not all(s[-1] for s in sigs) or len({id(t.untyped_storage()) for t in tensors}) != len(tensors):
            return None
        return (func, self.settings, sigs)

    def bytes(self, func, args, kwargs, out) -> int:
        leaves, spec = tree_flatten((args, kwargs))
        key = _call_key(func, leaves, self.settings)
        hit = _CACHE.get(key)
        if hit is not None:
            return hit
        if key in _FAILED or torch.autograd._profiler_enabled():  # a probe would end the caller's session
            return self._skip(func, key)
        tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
        small = (_work(func, args, out) <= PROBE_MAX_FLOPS and _materialised_bytes(leaves, out) <= PROBE_MAX_BYTES)
        cls = self._layout_class(func, tensors)
        if cls is not None:
            verified = _CLASSES.get(cls)
            if verified is None and not small:  # verify on a shrunk copy of the same class
                verified = self._probe(func, leaves, spec, shrink=True)
                if verified is not None:
                    _CLASSES[cls] = verified
            if verified == 0:
                self.known_zero += 1
                return 0
        if not small:
            return self._skip(func, key)
        n = self._probe(func, leaves, spec)
        if n is None:
            _FAILED.add(key)
            return self._skip(func, key)
        _CACHE[key] = n
        if cls is not None:
            _CLASSES.setdefault(cls, n)
        return n


def summary(scratches) -> dict:
    """Merged counters of one or more recorders' KernelScratch (for Estimate.detail): probes run, their
    seconds, calls taken as known zero, and per op the number of distinct calls (shapes) not probed."""
    out = {"probes": 0, "probe_seconds": 0.0, "known_zero": 0, "unprobed": {}}
    keys = {}
    for s in scratches:
        out["probes"] += s.probes
        out["probe_seconds"] += s.seconds
        out["known_zero"] += s.known_zero
        keys.update(s.unprobed)
    for name in keys.values():
        out["unprobed"][name] = out["unprobed"].get(name, 0) + 1
    out["probe_seconds"] = round(out["probe_seconds"], 3)
    return out


def notes(summ: dict) -> list[str]:
    if not summ["unprobed"]:
        return []
    ops = ", ".join(f"{k} x{v}" for k, v in sorted(summ["unprobed"].items()))
    return [f"NB: internal scratch not measured for CPU kernels above the probe cap ({PROBE_MAX_FLOPS / 1e6:.0f} "
            f"MFLOP) or that could not be probed (distinct shapes: {ops}): can under-read if the peak falls inside one"]
