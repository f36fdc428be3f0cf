"""FSDP1 — torch.distributed.fsdp.FullyShardedDataParallel — as accelerate's fsdp_version 1 runs it (--fsdp-version 1,
--stack hf; stacks/hf.toml [fsdp] versions): what differs from FSDP2 (parallel/fsdp2.py), torch 2.13.

  * Each wrapped unit's parameters are one FlatParameter, padded to a multiple of dp, whose unsharded copy
    `_full_param_padded` has param_dtype under a MixedPrecision and the stored dtype without one
    (torch/distributed/fsdp/_flat_param.py:1280-1292). The all-gather writes into it directly
    (_flat_param.py:1440-1480 _all_gather_flat_param: all_gather_into_tensor) and the module computes on views of it
    (_flat_param.py:1517-1521: `_use_unsharded_views(as_params=False)` in forward): no copy-out kernel.
  * The backward's gradients of the views make the unit's unsharded flat gradient (param_dtype), cast to
    reduce_dtype on the post-backward stream where the two differ (_runtime_utils.py:757-764) and reduce-scattered
    from as it is (_runtime_utils.py:846-857, reduce_scatter_single into a new 1/dp shard): no copy-in kernel. The
    shard is cast back to the fp32 gradient shard where reduce_dtype is lower (_runtime_utils.py:1030
    _cast_grad_to_param_dtype), as FSDP2's is.
  * Under a MixedPrecision the fp32 shard is first cast to a low-precision shard `_mp_shard` (1/dp of the unit,
    _flat_param.py:1342-1357, freed after the all-gather), as FSDP2's all-gather input is (not counted either).
  * limit_all_gathers (fully_sharded_data_parallel.py:411, True by default) stops the CPU while two freed units'
    all-gathers are in flight (_runtime_utils.py:297-303; _limiter_utils.py:15, `_max_num_inflight_all_gathers =
    2`): the current unit and the next one unsharded, as FSDP2's forward prefetch holds them. backward_prefetch
    BACKWARD_PRE (fully_sharded_data_parallel.py:404, the default) all-gathers the next unit at this unit's
    pre-backward (_runtime_utils.py:690-693 _prefetch_handle), as FSDP2's backward prefetch does; the root's flat
    parameter is not resharded after forward (as FSDP2's root).
  So the bytes one rank holds at the step's moments are FSDP2's under the same policy (parallel/zero.py and
  parallel/fsdp2.py count them), less FSDP2's held buffers: the last all-gather output at the forward's end and the
  previous group's reduce-scatter input (FSDP1 drops its flat gradient at the end of the post-backward hook,
  _runtime_utils.py:846-861; on CUDA the block waits for the reduce-scatter, :772 record_stream: reserved, not
  allocated). NB: where reduce_dtype differs from param_dtype, the post-backward's cast copy beside the flat gradient
  is a moment not modelled (-2.2 % vs the trace under full recompute on a 2-layer Llama, CUDA semantics). NB: FSDP1's
  unit gradient is concatenated from its views' gradients
  (SplitWithSizesBackward) into one flat tensor, 2 × param_dtype × the unit for a moment, where FSDP2's copy-in holds
  param_dtype + reduce_dtype: equal unless reduce_dtype is wider (then FSDP1's is lower); not modelled.
  * Autocast without a policy: the module's weights are views of the flat parameter in forward, not leaves, so
    autocast casts them per call without caching them (aten/src/ATen/autocast_mode.cpp cached_cast:
    `arg.requires_grad() && arg.is_leaf()`); a matmul still saves its cast weight for backward, so only under
    activation checkpointing does the difference show: the casts die with the checkpointed forward, where FSDP2's
    unsharded nn.Parameters are leaves whose casts the cache keeps to the forward's end (analytic/recompute.py).
    This holds with use_orig_params=True too (the HF Trainer's default, transformers training_args.py:2876-2877):
    the original parameters are set to plain tensor views in forward (_flat_param.py:1517-1521).

CPUOffload(offload_params=True) (--offload params under --zero 3: accelerate 1.15.0's fsdp_offload_params with
fsdp_version 1, utils/dataclasses.py:2178-2191 set_cpu_offload -> CPUOffload(offload_params=True), passed to
FullyShardedDataParallel at accelerator.py:1948):
  * host, per rank: each unit's padded fp32 shard `_local_shard`, pinned (_flat_param.py:1257-1261; the flat
    parameter is moved to the CPU at wrapping, _init_utils.py:671-673), and a pinned fp32 gradient shard of the same
    size made beside it at the lazy init, `_cpu_grad` (_flat_param.py:1262-1266); the optimizer's states, made by
    torch.optim beside the parameters, which are views of the CPU shards (use_orig_params=True), and the optimizer
    step there. The same host bytes as FSDP2's CPUOffloadPolicy (parallel/fsdp_offload.py).
  * device, at rest: nothing of the model's states (after the reshard the flat parameter points at the CPU shard,
    _flat_param.py:1837-1843; `.grad` is the CPU `_cpu_grad` after the backward, prepare_gradient_for_optim
    :1694-1698). Each unshard copies the unit's fp32 shard to the device first (pre_unshard: `flat_param_to(device)`
    :1335-1338, or under a MixedPrecision `_local_shard.to(device)` cast into `_mp_shard`, :1342-1357) and
    all-gathers it into `_full_param_padded` as without offload: NB these per-unit shards (1/dp of a unit) are not
    counted, as FSDP2's are not.
  * device, in backward: unlike FSDP2's offload, each unit's reduce-scattered gradient shard, cast to fp32
    (_runtime_utils.py:917, :1047-1048), is kept on the device as `_saved_grad_shard` (_runtime_utils.py:918-927) after
    its non-blocking copy into `_cpu_grad` (_offload_grad :969-989), until the root's post-backward callback
    deletes it (_finalize_params -> prepare_gradient_for_optim, _runtime_utils.py:1199, _flat_param.py:1717-1720):
    the rank's gradient shards build up on the device through the backward exactly as without offload, and are
    gone at the optimizer step (keeps_gradient_shards).
  * PCIe per micro-batch: the H2D copy of every unit's fp32 shard at each unshard (forward, and backward under
    FULL_SHARD; the root is not resharded after forward) and the D2H copy of its fp32 gradient shard on the
    post-backward stream, which the callback waits for (_runtime_utils.py:1107-1111): FSDP2's offload's traffic and
    step terms (parallel/fsdp_offload.py offload_seconds).
  * gradient accumulation: the HF Trainer accumulates under accelerate's no_sync (accelerator.py:1284-1297 unless
    sync_each_batch), where FSDP1 keeps every unit's unsharded gradient on the device, and torch's CPU offload does
    not accumulate sharded gradients outside no_sync (_flat_param.py:1642-1646): refused (accumulation_refusal).
  This CPU-only torch build cannot run it: `pin_memory()` needs an accelerator ("Cannot access accelerator device
  when none is available"), and fake tensors have no `aten._pin_memory` (torch/_subclasses/fake_impls.py:1743,
  "NYI: aten._pin_memory.default"); on a CPU compute device the offload is a no-op anyway (pre_unshard's copy is
  skipped when the shard is on the compute device, :1335).
"""
from __future__ import annotations

from ...overheads import held_segments
from ...setup import Setup
from ..precision import StateBytes


def runs_fsdp1(setup: Setup) -> bool:
    """Whether the step's FSDP is FullyShardedDataParallel (--fsdp-version 1 under --dp > 1 --zero 2/3)."""
    return setup.fsdp_version == 1 and setup.mode == "train" and setup.dp > 1 and setup.zero >= 2


def offloads_params(setup: Setup) -> bool:
    """FSDP1 under CPUOffload(offload_params=True) (module docstring)."""
    return runs_fsdp1(setup) and setup.offload_state == "params"


def keeps_gradient_shards(setup: Setup) -> bool:
    """Whether the rank's fp32 gradient shards stay on the device through the backward though they are offloaded
    (FSDP1's `_saved_grad_shard`, module docstring), to be freed at the backward's end, before the optimizer step."""
    return offloads_params(setup)


def accumulation_refusal(setup: Setup) -> str | None:
    """Why FSDP1's CPU offload with gradient accumulation is not modelled (module docstring), None where it is."""
    if setup.fsdp_version != 1 or setup.offload_state != "params" or setup.grad_accum <= 1:
        return None
    return ("--offload params with --fsdp-version 1 and --grad-accum > 1: the HF Trainer accumulates under "
            "accelerate's no_sync, where FSDP1 keeps every unit's unsharded gradient on the device, and torch's CPU "
            "offload does not accumulate sharded gradients outside it (torch 2.13 fsdp/_flat_param.py:1642-1646): "
            "not modelled; use --grad-accum 1, or --fsdp-version 2")


def caches_weight_casts(setup: Setup) -> bool:
    """Whether autocast's cache keeps the weights' casts to the forward's end (module docstring): not under FSDP1,
    whose forward runs on views of its flat parameters."""
    return not runs_fsdp1(setup)


def side_stream_blocks(group_params: dict[str, float], st: StateBytes, setup: Setup) -> int:
    """What FSDP1's side streams hold in the caching allocator that the compute stream cannot reuse, beyond the
    peak's tensors (`group_params`: parameters per unit kind on this rank, unsharded). The unsharded flat parameters
    are allocated on the unshard stream (_runtime_utils.py:304-306 `with stream(unshard_stream): handle.unshard()`)
    and ARE the gathered parameters the peak counts, each freed block reused by the next unit of its size: nothing
    beyond them. Where reduce_dtype differs from param_dtype, the cast flat gradient is made on the post-backward
    stream (_runtime_utils.py:755-764): one unit-sized block of the largest kind in reduce_dtype, freed after its
    reduce-scatter and held for the next unit's.
    NB: the reduce-scatter outputs (the gradient shards) are counted by the caller, as FSDP2's."""
    p = st.param or st.weight
    r = st.reduce or st.grad
    if r == p or not group_params:
        return 0
    return held_segments([(max(group_params.values()) * r, 1)])
