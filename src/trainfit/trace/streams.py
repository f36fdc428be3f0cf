"""The CUDA stream each traced storage would be allocated on, for the caching-allocator replay (alloc/replay.py).

The CUDA caching allocator files every block under the stream current at its malloc and returns it to that
stream's pool when freed (c10/cuda/CUDACachingAllocator.cpp: malloc reads getCurrentCUDAStream; free_block
re-inserts into the pool keyed by (stream, size, ptr)), so a block freed on a side stream cannot serve the
compute stream. FSDP2 picks its streams through a device handle: `_get_device_handle(device.type)` =
`getattr(torch, device.type)` (torch/distributed/device_mesh.py:143-150, torch 2.13). In the fake-process-group
trace FSDP2's device is the CPU, and torch.cpu's stubs already behave: every `torch.cpu.Stream()` is its own
object and `torch.cpu.stream(s)` sets what `torch.cpu.current_stream()` returns until it exits
(torch/cpu/__init__.py:136-221). So the side streams are already switched during the trace; all this module adds
is a number for each: the streams `torch.cpu.Stream` creates while `numbered_streams` is on are numbered
1, 2, ... in creation order, and the default stream is 0.

Where FSDP2 (torch 2.13, torch/distributed/fsdp/_fully_shard/) allocates on CUDA, which the trace reproduces:
- streams: FSDPCommContext.lazy_init creates all_gather_copy_in_stream, all_gather_stream,
  reduce_scatter_stream (high priority) and all_reduce_stream (_fsdp_param_group.py:84-102), i.e. 1-4 here;
  get_all_gather_streams (:116-126) uses the first two in forward and pre-backward (implicit prefetch), the
  current stream otherwise.
- all-gather input and output: one flat buffer (the input is a view of it) plus the bf16 cast of the shards,
  both allocated inside `device_handle.stream(all_gather_copy_in_stream)` (_fsdp_collectives.py:336-361,
  416-421); the output is freed by dropping `comm_ctx.all_gather_state` after the next group's copy-out
  (forward, _fsdp_param_group.py:429-432) or at once after this copy-out (:489): references held until the
  copy-out event, no record_stream.
- copy-out targets (the unsharded parameters): init_all_gather_outputs/alloc_storage in
  foreach_all_gather_copy_out (_fsdp_collectives.py:457-463, _fsdp_param.py:616-627, 1066-1069), on the
  current (compute) stream; freed by free_storage at reshard.
- reduce-scatter input: allocated on the current stream (_fsdp_collectives.py:597-601, before the
  `stream(reduce_scatter_stream)` block), kept in comm_ctx.reduce_scatter_states until the next group's
  post_backward pops it (_fsdp_param_group.py:648-657, 717-719) or the end of backward (_fsdp_state.py:428-431).
- reduce-scatter output and the reduce-dtype cast (the sharded gradients are views of it): inside
  `stream(reduce_scatter_stream)` (_fsdp_collectives.py:611-616) and `stream(post_reduce_stream)` (:685-698);
  they live as .grad until the optimizer's zero_grad, and return to the reduce-scatter stream's pool.
- all-reduce (HSDP only): `stream(all_reduce_stream)` (:652-672), buffer held by AllReduceState until the next
  layer (_fsdp_param_group.py:759-761).
DDP and ZeroRedundancyOptimizer make no side-stream allocations in our steps: DDP's reducer allocates its bucket
views in the constructor on the current stream (torch/csrc/distributed/c10d/reducer.cpp, initialize_buckets:
at::empty on the parameters' device) and all-reduces them in place; DDP's own side streams are for input copies
(`use_side_stream_for_tensor_copies`, torch/nn/parallel/distributed.py:1038-1040, our inputs are already on the
device) and DDP mixed precision (`_mp_stream`, :1091, not used by trainfit.step.strategy); ZeroRedundancyOptimizer
uses none (torch/distributed/optim/zero_redundancy_optimizer.py has no stream). Their records stay on stream 0.
"""
from __future__ import annotations

import contextlib
import itertools

import torch


def current_stream_index() -> int:
    """The number of torch.cpu's current stream: 0 for the default stream, n for the n-th numbered one."""
    return getattr(torch.cpu.current_stream(), "index", 0)


@contextlib.contextmanager
def numbered_streams(rec=None):
    """Number the torch.cpu streams created while on, and (with `rec`, an AllocationRecorder) have the recorder
    tag each birth with the current one. Reads only: the trace's births, deaths and peak are unchanged."""
    saved = torch.cpu.Stream
    count = itertools.count(1)

    class Stream(saved):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.index = next(count)

    torch.cpu.Stream = Stream
    if rec is not None:
        rec.stream_of = current_stream_index
    try:
        yield
    finally:
        torch.cpu.Stream = saved
        if rec is not None:
            rec.stream_of = None
