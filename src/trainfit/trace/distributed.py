"""Trace one data-parallel rank of a sharded step in ONE process, at any world size (issue 7).

`trace_distributed(spec, setup)` joins a fake process group of `setup.dp` ranks (torch's own "fake" backend,
`torch.testing._internal.distributed.fake_pg.FakeStore`: every collective returns at once and moves no
data), builds the real model under FakeTensorMode, wraps it exactly as the distributed measure worker does
(trainfit.step.strategy: DDP, DDP + ZeroRedundancyOptimizer, FSDP2 fully_shard), runs the same warm-up
steps, and records the standard step with the AllocationRecorder. The recorder is on from before the model
is built, so what is resident at the step start (DDP's bucket buffers, FSDP2's sharded parameters and
whatever else the wrappers keep) is read from births and deaths, not summed. Per-rank memory -- FSDP2's
unsharded parameters, its prefetched next layer, its all-gather and reduce-scatter buffers, DDP's buckets --
is what the wrappers allocate. Each record also carries the CUDA stream it would be allocated on (streams.py:
FSDP2's all-gather copy-in and reduce-scatter streams), which only the allocator replay reads.

Two things a fake process group cannot show, and how they are handled:
- DTensor: FSDP2's sharded parameters, gradients and optimizer state are DTensors, whose ops run inside
  DTensor's own dispatch (below the recorder): outputs are counted by their local tensor (`_local_tensor`),
  so the optimizer step's per-parameter temporaries are seen; temporaries inside DTensor's dispatch
  (redistribution) are not (FSDP2's optimizer step needs none).
- backend temporaries: the backend allocates inside the collective. `backend="gloo"` (CPU) adds what
  ProcessGroupGloo allocates: `_allgather_base_` gathers into its own flat buffer of the output's size and
  copies out; `_reduce_scatter_base_` clones its input (and the clone lives until the collective ends);
  `allreduce` of DDP's buckets works in place. NCCL works in the given buffers (`backend="nccl"`: none).
  NB: collectives run synchronously here, so a backend temporary is live only during its collective; on
  gloo the work runs in a worker thread and may overlap the next ops (a few hundred KB in tiny models).

Where the model is built. The trace builds the whole unsharded model on its one (fake) device and then wraps it,
so until the wrapper returns it holds every parameter in full (Llama-3.1-70B: 263 GiB of fp32 parameters at once).
A real FSDP job never has them on the GPU together: the HF Trainer leaves an FSDP model where it was loaded
(transformers 5.24 trainer.py:480-504), on the CPU, or on the meta device under accelerate's
fsdp_cpu_ram_efficient_loading (accelerate 1.16 utils/fsdp_utils.py:817-824); fully_shard then moves one unit's
parameters to the device, shards them and drops them, unit by unit (fsdp_utils.py:870-873; torch 2.13
_fully_shard.py:266-268 -> _fsdp_init.py:369-401, :567; the shard, _fsdp_param.py:228-331); torchtitan builds on the
meta device (step/torchtitan.py). So `rec.wrapped_at` marks the event at which the wrapped model exists, and the
allocator replay leaves out the storages made and freed before it (trace/engine.py replay_args). Replayed, they made
the 70B's required the full fp32 model (263.24 GiB against a 170.76 GiB peak) and stayed cached in its reserved.
Under DDP (--zero 0/1) the parameters outlive the wrap and stay in the replay; only the construction's temporaries
go (the LM head from_config makes before tie_weights replaces it, which a user's model never holds: step/build.py).
"""
from __future__ import annotations

import contextlib
import time

import torch
from torch.distributed._functional_collectives import _is_view_op
from torch.utils._pytree import tree_leaves, tree_map_only

from ..analytic.layout import validate_layout
from ..errors import EngineUnavailableError
from ..estimate import Estimate
from ..setup import Setup
from ..spec import ModelSpec
from .cuda_kernels import cuda_kernels
from .streams import numbered_streams
from .recorder import (
    GRADIENT,
    OPTIMIZER_STATE,
    PARAMETER,
    TEMPORARY,
    AllocationRecorder,
)

WAIT_TENSOR = torch.ops._c10d_functional.wait_tensor.default


def _local(t):
    """The storage-holding tensor behind a DTensor (and a torchao fp8 weight wrapper inside it)."""
    from ..step.strategy import local

    return local(t)


class ShardedRecorder(AllocationRecorder):
    """AllocationRecorder that counts DTensor outputs by their local shard and adds backend temporaries."""

    def __init__(self, *a, backend: str = "gloo", **k):
        super().__init__(*a, **k)
        from torch.distributed.tensor import DTensor

        self.plain = self.plain | {DTensor}
        self.backend = backend
        self.in_flight = {}  # a functional collective's output storage id -> its inputs, until the wait
        self.wrapped_at = None  # the event at which the wrapped model exists (_trace_rank; trace/engine.py replay_args)
        c10d = torch.ops.c10d
        self.scratch_of = {}
        if backend == "gloo":
            self.scratch_of = {c10d._allgather_base_.default: lambda args: args[0],  # output buffer
                               c10d._reduce_scatter_base_.default: lambda args: args[1]}  # input clone

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.unwraps(types):  # torchao's fp8 wrappers (not DTensor, counted by its local tensor below)
            return NotImplemented
        scratch = None
        pick = self.scratch_of.get(func)
        if pick is not None:
            t = pick(args)
            scratch = self._born(self.size(t.numel() * t.element_size()), TEMPORARY, tuple(t.shape), t.dtype,
                                 f"{self.backend} {func._opname} buffer")
        # a functional collective's wait returns the tensor it waited on (torch/csrc/distributed/c10d/Functional.cpp
        # wait_tensor: `return tensor`), where the op's fake kernel makes a new one
        out = args[0] if func is WAIT_TENSOR else func(*args, **(kwargs or {}))
        self._hold_collective_inputs(func, args, kwargs, out)
        if self.flops is not None:
            self.flops.count(func, args, kwargs, out)
        if scratch is None and (func in self.promoting or func in self.probed):
            # a CPU kernel's own copies and scratch, as the one-process recorder probes them, on the local shards (a
            # DTensor op reaches here as its local op too)
            local_args, local_kwargs, local_out = tree_map_only(torch.Tensor, _local, (args, kwargs or {}, out))
            scratch = self._cpu_scratch(func, local_args, local_kwargs, local_out)
        outs = out if type(out) in (tuple, list) else (out,)
        live = self.live
        for o in outs:
            if isinstance(o, torch.Tensor):
                o = _local(o)
                st = o.untyped_storage()
                rec = live.get(id(st))
                if rec is None:
                    self._register(st, o, TEMPORARY)
                elif self.size(st.nbytes()) != rec.nbytes:
                    self._resized(rec, st)
        if scratch is not None:
            scratch.death = self.event
            self.event += 1
            self.total -= scratch.nbytes
        return out

    def _hold_collective_inputs(self, func, args, kwargs, out) -> None:
        """A functional collective's input lives until an eager step waits on its output: the op registers its Work
        under the output (torch/csrc/distributed/c10d/Functional.cpp: `c10d::register_work(output, work)`), the Work
        holds the tensors it sends (gloo's AsyncAlltoallWork as members; NCCL's WorkNCCL stashes them for the
        allocator) until wait_tensor, and eager code waits at the output's first use that is not a view (torch 2.13.0
        distributed/_functional_collectives.py:1129-1143, AsyncCollectiveTensor.__torch_dispatch__). Under
        FakeTensorMode that module waits at once (:1402-1405 _maybe_wrap_tensor; :1388-1399 _are_we_tracing takes
        fake mode for compilation), so the trace holds the input itself, keyed by the output's storage, until that
        first use: e.g. torchtitan's MoE runs its shared experts while the combine's all-to-all is in flight
        (models/moe/moe.py:525-535)."""
        if func is WAIT_TENSOR:
            return
        # (prim ops, e.g. prim::device, read metadata: no wait, and no schema _is_view_op can look up)
        if self.in_flight and func.namespace != "prim" and not _is_view_op(func):
            for a in tree_leaves((args, kwargs)):
                if isinstance(a, torch.Tensor):
                    self.in_flight.pop(id(_local(a).untyped_storage()), None)
        if func.namespace in ("_c10d_functional", "_c10d_functional_autograd") and isinstance(out, torch.Tensor):
            self.in_flight[id(_local(out).untyped_storage())] = [_local(a) for a in args if isinstance(a, torch.Tensor)]

    def storage_resized(self, tensor) -> None:
        """FSDP2 frees and re-allocates its unsharded parameters with `untyped_storage().resize_()`, which no
        dispatched op reports: record it as the allocator sees it. They are gathered copies of the parameters:
        temporaries, never activations, even when they outlive the forward (reshard_after_forward=False, the
        root's parameters) -- as the analytic engine counts them (analytic/parallel/zero.py gathered_params)."""
        st = _local(tensor).untyped_storage()
        rec = self.live.get(id(st))
        if rec is None:
            if st.nbytes():
                self._register(st, tensor, TEMPORARY)
        elif self.size(st.nbytes()) != rec.nbytes:
            self._resized(rec, st)
        rec = self.live.get(id(st))
        if rec is not None:
            rec.fixed = True
            rec.name = rec.name or "FSDP2 gathered parameters"

    def adopt(self, tensor, cat, name=""):
        return super().adopt(_local(tensor), cat, name)


@contextlib.contextmanager
def fake_process_group(world_size: int, rank: int = 0):
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise EngineUnavailableError("a process group is already initialised in this process; the distributed trace "
                                     "needs its own fake one")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


def trace_rank(spec: ModelSpec, setup: Setup, *, rank: int = 0, backend: str | None = None, warmup: int = 2,
               flops: bool = False):
    """(model, recorder, Analysis) of one rank's standard step under the strategy for `setup.zero`."""
    from .fake import fake_mode, translated_errors
    from .optimizer_scalars import optimizer_scalar_reads

    backend = backend or ("nccl" if setup.device == "cuda" else "gloo")
    with fake_process_group(setup.dp, rank), translated_errors(spec.name), _no_param_verification():
        from ..step import stack_step

        mesh = None
        if setup.zero >= 2 or stack_step(setup).DDP_TAKES_MESH:  # (torchtitan's apply_ddp)
            from torch.distributed.device_mesh import init_device_mesh

            mesh = init_device_mesh("cpu", (setup.dp,))  # reads real rank tensors: outside FakeTensorMode
        with fake_mode(), optimizer_scalar_reads():
            return _trace_rank(spec, setup, backend, warmup, flops, mesh)


def _fake_allreduce_hook(model, world: int) -> None:
    """DDP's built-in all-reduce hook takes its result from the work's future, which the fake backend leaves
    empty; this hook does what the built-in one does to memory (divide the bucket in place, all-reduce in
    place, hand the same buffer back) and returns the bucket itself."""
    from ..step.strategy import ddp_of

    ddp = ddp_of(model, init=True)  # torchtitan's replicate() builds its DDP at the first forward: build it now
    if ddp is None:
        return

    def hook(state, bucket):
        buf = bucket.buffer()
        buf.div_(world)
        fut = torch.futures.Future()
        fut.set_result(buf)
        return fut

    ddp.register_comm_hook(None, hook)
    ddp.reducer = _NoRebuild(ddp.reducer)


class _NoRebuild:
    """DDP re-partitions its buckets at the second forward (`_rebuild_buckets`, in the order gradients became
    ready), agreeing on the new partition with a broadcast of real index tensors, which fake tensors cannot do.
    The new buckets hold the same bytes (every gradient once), so the trace keeps the first partition."""

    def __init__(self, reducer):
        self._reducer = reducer

    def _rebuild_buckets(self) -> bool:
        return False

    def __getattr__(self, name):
        return getattr(self._reducer, name)


@contextlib.contextmanager
def _fsdp_storage_hooks(rec: ShardedRecorder):
    from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group

    alloc, free = _fsdp_param.alloc_storage, _fsdp_param.free_storage

    def alloc_storage(tensor):
        alloc(tensor)
        rec.storage_resized(tensor)

    def free_storage(tensor):
        free(tensor)
        rec.storage_resized(tensor)

    # FSDP1 (--fsdp-version 1) resizes its flat parameters' storages the same way (torch/distributed/utils.py:167-196
    # _alloc_storage(tensor, size) / _free_storage, called by fsdp/_flat_param.py unshard and reshard)
    from torch.distributed.fsdp import _flat_param

    alloc1, free1 = _flat_param._alloc_storage, _flat_param._free_storage

    def alloc_storage1(tensor, size):
        alloc1(tensor, size)
        rec.storage_resized(tensor)

    def free_storage1(tensor):
        free1(tensor)
        rec.storage_resized(tensor)

    _fsdp_param.alloc_storage, _fsdp_param.free_storage = alloc_storage, free_storage
    _fsdp_param_group.alloc_storage = alloc_storage
    _flat_param._alloc_storage, _flat_param._free_storage = alloc_storage1, free_storage1
    # a fake storage has no data pointer: FSDP1's SHARD_GRAD_OP check that the unsharded flat parameter is allocated
    # (_flat_param.py:2270-2274, utils.py:355-356 data_ptr() > 0) reads its size instead
    allocated = _flat_param._data_ptr_allocated
    _flat_param._data_ptr_allocated = _flat_param._storage_size_allocated
    try:
        yield
    finally:
        _flat_param._data_ptr_allocated = allocated
        _fsdp_param.alloc_storage, _fsdp_param.free_storage = alloc, free
        _fsdp_param_group.alloc_storage = alloc
        _flat_param._alloc_storage, _flat_param._free_storage = alloc1, free1


@contextlib.contextmanager
def _no_param_verification():
    """DDP's constructor checks that every rank has the same parameter shapes by reading real tensors (an
    all-gather of sizes); under FakeTensorMode there is nothing to read and the fake group has one real rank."""
    import torch.distributed.utils as dutils
    from torch.nn.parallel import distributed as ddp_mod

    saved = ddp_mod._verify_param_shape_across_processes
    ddp_mod._verify_param_shape_across_processes = lambda *a, **k: None
    try:
        yield
    finally:
        ddp_mod._verify_param_shape_across_processes = saved
    del dutils


def _trace_rank(spec, setup, backend, warmup, flops, mesh):
    from ..step import hf as hf_step
    from ..step import stack_step
    from ..step.standard import enable_recompute
    from .analysis import TRAIN_PHASES, analyse
    from .engine import build_hf
    from .modules import ModuleStack

    step = stack_step(setup)
    run_step = step.run_step
    if True:
        rec = ShardedRecorder(None, count_flops=flops, round_cuda=setup.device == "cuda", backend=backend)
        # numbered_streams: each record's CUDA stream (FSDP2's side streams) for the allocator replay, reads only;
        # cuda_kernels: --device cuda's kernels' saved tensors
        with rec, numbered_streams(rec), _fsdp_storage_hooks(rec), cuda_kernels(setup):
            torch.manual_seed(0)
            if step is hf_step:  # the transformers model, with transformers' refusals in one line
                model = build_hf(spec, setup)
                enable_recompute(model, setup)
            else:
                model = step.build(spec, setup, mesh=mesh, fake=True)
            wrapped, optimizer = step.wrap(model, setup, "cpu", mesh=mesh)
            rec.wrapped_at = rec.event  # the replay's device memory starts here (module docstring)
            _fake_allreduce_hook(wrapped, setup.dp)
            batches = step.make_batches(spec, setup)
            for _ in range(max(2, warmup)):
                run_step(wrapped, optimizer, batches, setup)
            # categories of what is resident
            for name, p in model.named_parameters():
                rec.adopt(p, PARAMETER, name)
            inner = getattr(optimizer, "optim", optimizer)
            for st in inner.state.values():
                for key, t in st.items():
                    if isinstance(t, torch.Tensor):
                        rec.adopt(t, OPTIMIZER_STATE, key)
            handles = []
            for name, p in model.named_parameters():
                if p.requires_grad:
                    def hook(p, name=name + ".grad"):
                        if p.grad is not None:
                            rec.adopt(p.grad, GRADIENT, name)
                    handles.append(p.register_post_accumulate_grad_hook(hook))
            modules = ModuleStack(model)
            rec.modules = modules
            try:
                with modules:
                    start = rec.event
                    rec.reset_peak()
                    run_step(wrapped, optimizer, batches, setup, phase=rec.set_phase)
            finally:
                for h in handles:
                    h.remove()
        an = analyse(rec, start, TRAIN_PHASES)
    return model, rec, an


def trace_distributed(spec: ModelSpec, setup: Setup, *, backend: str | None = None, flops: bool = False,
                      alloc_conf: str | None = None) -> Estimate:
    """The trace engine's Estimate for one rank of `setup` (dp ranks, zero stage), from a fake process group."""
    from .engine import NOTES, RESERVED_NOTE, estimate_from

    if setup.dp < 2:
        raise EngineUnavailableError("the distributed trace needs --dp >= 2 (one rank: trainfit.trace.trace_spec)")
    validate_layout(spec, setup)  # e.g. --seq past a model's learned positions: refused before tracing
    t0 = time.perf_counter()
    model, rec, an = trace_rank(spec, setup, backend=backend, flops=flops)
    from ..step import stack_step, strategy_name

    kit = stack_step(setup)
    notes = NOTES + (f"distributed trace: rank 0 of {setup.dp}, fake process group, {strategy_name(kit, setup)}, "
                     f"{backend or ('nccl' if setup.device == 'cuda' else 'gloo')} backend temporaries" +
                     ("; the allocator replay starts from the wrapped model (a job loads it on the CPU or the meta "
                      "device, not unsharded on the GPU)" if setup.device == "cuda" else ""),) + \
        ((kit.NOTE,) if kit.NOTE else ()) + tuple(getattr(kit, "trace_notes", lambda *_: ())(spec, setup)) + \
        ((RESERVED_NOTE,) if setup.device == "cuda" else ())
    est = estimate_from(spec.name, model, setup, rec, an, setup.batch * setup.seq, time.perf_counter() - t0, notes,
                        alloc_conf=alloc_conf)
    import dataclasses

    n_local = sum(_local(p).numel() for p in model.parameters())
    return dataclasses.replace(est, params_per_rank=n_local)
