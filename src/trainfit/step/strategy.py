"""Data-parallel strategies for `--zero` (issue 7), shared by the distributed measure worker (real process
group) and the distributed trace (fake process group), so that both run exactly the same wrapped step.

    zero 0  torch DistributedDataParallel (default buckets, gradient_as_bucket_view=False: DDP copies each
            gradient into its own flat bucket buffer, resident from construction -- a second gradient-sized
            allocation, which the analytic engine counts as comm_buffers)
    zero 1  DDP + torch.distributed.optim.ZeroRedundancyOptimizer (optimizer states sharded by parameter,
            gradients all-reduced in full: ZeRO stage 1, Rajbhandari et al. 2020 "P_os")
    zero 2  FSDP2 `fully_shard(reshard_after_forward=False)` on every decoder layer and the root: parameters,
            gradients and optimizer states sharded at rest, each layer's parameters gathered in forward and
            kept unsharded until its backward (FSDP1's SHARD_GRAD_OP). NB: that holds *all* layers' full
            parameters from the end of forward until backward frees them, beside the sharded copy, which is
            more than ZeRO-2's "P_os+g" accounting (full weights + sharded grads/states) assumes.
    zero 3  FSDP2 `fully_shard(reshard_after_forward=True)` on every decoder layer and the root (FULL_SHARD;
            FSDP2 keeps the root's own parameters -- embeddings, final norm, LM head -- unsharded after
            forward, by design).

Mixed precision under FSDP2 (--zero 2/3 with amp-bf16/amp-fp16), as HF Trainer / accelerate 1.16 runs it: accelerate
gives every fully_shard call a MixedPrecisionPolicy whose param_dtype and reduce_dtype are the amp dtype, output_dtype
unset (state.py:975-976 set_mixed_precision; utils/dataclasses.py:1981-2012, the dtype_args at :2008-2012; 1.15 also
set output_dtype, its :2137-2141; utils/fsdp_utils.py:768 mp_policy), over fp32 shards (fsdp_utils.py:802-806
upcasts the trainable parameters), and still wraps the forward in torch.autocast (accelerator.py:1791-1801,
native_amp). So each layer is all-gathered and
computes in bf16/fp16 under autocast, and its gradients are reduce-scattered in the same dtype. The stack fact
stacks/hf.toml [mixed_precision] fsdp_policy says so; the analytic engine reads the same fact
(analytic/precision.py). fp32, bf16 and bf16-master set no policy: accelerate's mixed_precision is "no" there (a
model loaded in bfloat16 and trained without bf16=True is sharded and gathered in bf16 as it is).

Decoder layers are the modules whose class is in the HF model's `_no_split_modules` (what accelerate's FSDP
auto-wrap uses), else the children of the largest ModuleList.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..errors import EngineUnavailableError

if TYPE_CHECKING:  # pragma: no cover
    from ..setup import Setup

STRATEGIES = {0: "DDP", 1: "DDP + ZeroRedundancyOptimizer (ZeRO-1)",
              2: "FSDP2 fully_shard, reshard_after_forward=False (ZeRO-2 / SHARD_GRAD_OP)",
              3: "FSDP2 fully_shard, reshard_after_forward=True (ZeRO-3 / FULL_SHARD)",
              (2, 1): "FSDP1 FullyShardedDataParallel, SHARD_GRAD_OP (ZeRO-2)",
              (3, 1): "FSDP1 FullyShardedDataParallel, FULL_SHARD (ZeRO-3)"}


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    names = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names] if names else []
    if layers:
        return layers
    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
    if not lists:
        return []
    return list(max(lists, key=len))


def check_strategy(setup: "Setup") -> None:
    if setup.tp > 1 or setup.pp > 1:
        raise EngineUnavailableError("the distributed measure/trace runs data parallelism only: --tp/--pp are analytic-only")
    if setup.precision == "bf16-master" and setup.dp > 1:
        raise EngineUnavailableError("--precision bf16-master is not run under DDP/ZeRO/FSDP by the measure/trace "
                                     "engines; use bf16 or amp-bf16, or the analytic engine")
    if setup.quant and setup.dp > 1 and setup.zero >= 2:
        # trainfit's base keeps bitsandbytes' default uint8 storage (step/quant.py), which fully_shard cannot turn
        # into a DTensor (accelerate 1.15 leaves such Params4bit out of FSDP: utils/fsdp_utils.py:790-806), and
        # bnb's Params4bit cannot wrap FSDP2's sharded (fake) tensors (nn/modules.py:233 _make_subclass)
        raise EngineUnavailableError("--quant with --zero 2/3 (QLoRA under FSDP) is modelled by the analytic engine "
                                     "only; use --engine analytic, or --zero 0/1 for the trace/measure engines")
    if setup.grad_accum > 1 and setup.dp > 1:
        # DDP would all-reduce every micro-batch (no no_sync), FSDP2 reduce-scatter each one: not the step users run
        raise EngineUnavailableError("--grad-accum > 1 with --dp > 1 is not run by the distributed measure/trace "
                                     "engines; use --grad-accum 1 or the analytic engine")


def _optimizer_class_and_kwargs(setup: "Setup"):
    import inspect

    from ..step.standard import _torch_optimizer

    proto = _torch_optimizer([torch.nn.Parameter(torch.zeros(1))], setup.optimizer, setup.optimizer_kernel)
    accepted = inspect.signature(type(proto).__init__).parameters
    # defaults can hold keys the constructor does not take (AdamW's decoupled_weight_decay)
    kwargs = {k: v for k, v in proto.defaults.items() if k in accepted and (k not in ("differentiable", "fused") or v)}
    return type(proto), kwargs


def wrap(model: torch.nn.Module, setup: "Setup", device_type: str = "cpu", device_index: int | None = None,
         mesh=None):
    """(wrapped model, optimizer) for `setup.zero` over the default process group (module docstring).

    Call after `init_process_group` and after the model is built (same seed on every rank) and
    recompute is enabled. Returns the module to call in the step and the optimizer to step.
    `mesh`: FSDP2's DeviceMesh (default: a 1-D mesh over the default group; the fake-tensor trace makes it
    outside FakeTensorMode, whose tensors DeviceMesh cannot read).
    """
    import torch.distributed as dist

    from ..step import make_optimizer

    check_strategy(setup)
    z = setup.zero
    if z in (0, 1):
        from torch.nn.parallel import DistributedDataParallel as DDP

        ids = [device_index] if device_type == "cuda" and device_index is not None else None
        ddp = DDP(model, device_ids=ids)
        if z == 0:
            return ddp, make_optimizer(ddp, setup)
        from torch.distributed.optim import ZeroRedundancyOptimizer

        cls, kwargs = _optimizer_class_and_kwargs(setup)
        params = [p for p in ddp.parameters() if p.requires_grad]
        return ddp, ZeroRedundancyOptimizer(params, optimizer_class=cls, **kwargs)
    if setup.fsdp_version == 1:
        wrapped = _wrap_fsdp1(model, setup, device_type, device_index)
        return wrapped, make_optimizer(wrapped, setup)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = mesh if mesh is not None else init_device_mesh(device_type, (dist.get_world_size(),))
    kw = dict(mesh=mesh, reshard_after_forward=z == 3, mp_policy=mixed_precision_policy(setup))
    for layer in decoder_layers(model):
        fully_shard(layer, **kw)
    fully_shard(model, **kw)
    return model, make_optimizer(model, setup)


def _wrap_fsdp1(model: torch.nn.Module, setup: "Setup", device_type: str, device_index: int | None):
    """FSDP1 as accelerate's fsdp_version 1 under the HF Trainer wraps it (analytic/parallel/fsdp1.py): one
    FullyShardedDataParallel unit per decoder layer (transformer_auto_wrap_policy on _no_split_modules) and the root,
    FULL_SHARD (--zero 3) or SHARD_GRAD_OP (--zero 2), MixedPrecision(param_dtype, reduce_dtype, buffer_dtype) from
    the same policy as FSDP2's, use_orig_params=True (transformers training_args.py:2876-2877), and torch's defaults
    limit_all_gathers=True, backward_prefetch=BACKWARD_PRE (fully_sharded_data_parallel.py:404, 411)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    dtypes = _policy_dtypes(setup)
    policy = None
    if dtypes:
        policy = MixedPrecision(param_dtype=dtypes.get("param_dtype"), reduce_dtype=dtypes.get("reduce_dtype"),
                                buffer_dtype=dtypes.get("param_dtype"))
    device = torch.device(device_type, device_index) if device_type == "cuda" and device_index is not None \
        else torch.device(device_type)
    layers = {type(m) for m in decoder_layers(model)}
    return FSDP(model, auto_wrap_policy=ModuleWrapPolicy(layers) if layers else None, mixed_precision=policy,
                sharding_strategy=ShardingStrategy.FULL_SHARD if setup.zero == 3 else ShardingStrategy.SHARD_GRAD_OP,
                device_id=device, use_orig_params=True, limit_all_gathers=True)


def mixed_precision_policy(setup: "Setup"):
    """accelerate's FSDP2 MixedPrecisionPolicy for `setup` (module docstring): param_dtype = reduce_dtype = the amp
    dtype when the stack fact [mixed_precision] fsdp_policy is on and the precision is an
    amp-* policy, or the dtypes --fsdp-param-dtype / --fsdp-reduce-dtype set (accelerate's mixed_precision_policy
    dict; "none" = unset: param_dtype None gathers the fp32 shards as they are); else fully_shard's default (no casts:
    accelerate passes `MixedPrecisionPolicy()`, fsdp_utils.py:768)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(**_policy_dtypes(setup))


def _policy_dtypes(setup: "Setup") -> dict:
    """{param_dtype, reduce_dtype}: the torch dtypes of the step's FSDP mixed-precision policy, {} for
    none (analytic/precision.py policy_dtype reads the same settings and facts)."""
    from ..analytic.precision import policy_dtype
    from .build import _TORCH_DTYPE as TORCH_DTYPES, autocast_dtype

    if autocast_dtype(setup) is None or not setup.stack_facts.facts.get("mixed_precision", {}).get("fsdp_policy"):
        return {}
    param, reduce = (policy_dtype(setup, f) for f in ("param_dtype", "reduce_dtype"))
    out = {}
    if param != "none":
        out["param_dtype"] = TORCH_DTYPES[param]
    if reduce != "none":
        out["reduce_dtype"] = TORCH_DTYPES[reduce]
    return out


def local(t):
    """The rank-local tensor behind a DTensor (FSDP2 parameters, their gradients and optimizer state), and behind a
    wrapper of one plain tensor inside it (torchao's WeightWithDynamicFloat8CastTensor under --fp8-all-gather)."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    while is_traceable_wrapper_subclass(t):
        inner = [x for x in (getattr(t, n) for n in t.__tensor_flatten__()[0]) if isinstance(x, torch.Tensor)]
        if len(inner) != 1:  # (DTensor flattens to its local tensor and its device mesh)
            break
        t = inner[0]
    return t


def inner_optimizer(optimizer):
    """ZeroRedundancyOptimizer keeps the real state in `.optim` (this rank's shard)."""
    return getattr(optimizer, "optim", optimizer)


def resident_tensors(model: torch.nn.Module, optimizer) -> dict[str, list[torch.Tensor]]:
    """Rank-local tensors resident between steps: weights (+buffers), optimizer state, DDP's bucket buffers."""
    weights = [local(p) for p in model.parameters()] + [local(b) for b in model.buffers()]
    states = []
    for st in inner_optimizer(optimizer).state.values():
        for v in st.values():
            if isinstance(v, torch.Tensor):
                states.append(local(v))
    return {"weights": weights, "states": states, "buckets": ddp_buckets(model), "gradients": fsdp1_kept_grads(model)}


def fsdp1_kept_grads(model: torch.nn.Module) -> list[torch.Tensor]:
    """FSDP1's sharded flat gradients still held between steps: with use_orig_params=True, zero_grad(set_to_none)
    clears the original parameters' .grad views only, and the FlatParameter's .grad is dropped at the root's next
    pre-forward (torch 2.13 fsdp/_runtime_utils.py:594 -> _flat_param.py:2447-2470
    _reset_flat_param_grad_info_if_needed). [] without FSDP1."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    return [m._handle.flat_param.grad for m in model.modules() if isinstance(m, FSDP) and m._handle is not None
            and m._handle.flat_param.grad is not None]


def ddp_of(model, init: bool = False):
    """The DistributedDataParallel behind `model`: itself, or the one torch's composable `replicate()` (torchtitan's
    apply_ddp) builds at the module's first forward (torch/distributed/_composable/replicate.py, lazy_init; `init`:
    build it now); None when there is none."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    if isinstance(model, DDP):
        return model
    from torch.distributed._composable.replicate import DDP as Replicated, replicate

    if not isinstance(model, Replicated):
        return None
    state = replicate.state(model)
    if init and state._init_args:
        state.lazy_init()
    return getattr(state, "_ddp", None)


def ddp_buckets(model) -> list[torch.Tensor]:
    """Stand-ins for DDP's flat gradient bucket buffers: with gradient_as_bucket_view=False the reducer holds
    one buffer per bucket, the buckets partition the parameters that need gradients, so their bytes are the
    gradients' bytes (torch/csrc/distributed/c10d/reducer.cpp, initialize_buckets). Returned as meta tensors
    of the right size (only their bytes are read)."""
    ddp = ddp_of(model)
    if ddp is None:
        return []
    return [torch.empty(p.numel(), dtype=p.dtype, device="meta") for p in ddp.parameters() if p.requires_grad]
