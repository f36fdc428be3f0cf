"""Bytes per parameter of the model states under each precision policy and optimizer (no torch).

Mixed precision per Micikevicius et al. 2018 ("Mixed Precision Training") as torch.autocast does it:
fp32 weights/grads/states, low-precision activations. Master copies per Rajbhandari et al. 2020 (ZeRO, §3:
"2Ψ + 2Ψ + 12Ψ = 16Ψ bytes" for fp16 weights + fp16 grads + fp32 master, momentum, variance).

The mechanism is the stack's (stacks/*.toml [mixed_precision]): torch.autocast (hf; torchtitan without FSDP), or
FSDP2's MixedPrecisionPolicy (torchtitan with FSDP: torch/distributed/fsdp/_fully_shard/_fsdp_param.py casts each
fp32 shard to param_dtype for the all-gather, so the model computes on low-precision unsharded parameters — its
activations and residual stream are low precision too, with no autocast casts — and _fsdp_collectives.py
foreach_reduce reduce-scatters the gradients in reduce_dtype).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ..precision import DTYPE_BYTES, PRECISIONS
from ..setup import BNB_OPTIMIZERS, TORCHAO_OPTIMIZERS, Setup
from . import kbit_prep, torchao_optim


@dataclass(frozen=True)
class StateBytes:
    weight: float  # bytes per parameter
    grad: float
    master: float  # fp32 master copy (bf16-master only)
    optimizer: float  # optimizer state bytes per parameter (Adafactor: see `factored`)
    factored: bool  # Adafactor keeps row + column statistics per matrix instead of per-element state
    act: int  # activation (compute) dtype bytes
    residual: int  # dtype of the residual stream: fp32 under autocast (embeddings are never autocast)
    autocast: bool = False  # the forward runs under torch.autocast (per-call input casts, cached weight casts)
    param: float = 0.0  # FSDP mixed precision: bytes per element of the unsharded compute parameters and their
    #                     gradients (param_dtype, the weights' own under a policy without one: --fsdp-param-dtype
    #                     none); 0 without a policy (FSDP gathers the parameters in their own dtype)
    reduce: float = 0.0  # FSDP2 mixed precision: bytes per element of the reduce-scatter input (reduce_dtype)


def fsdp_policy_on(setup: Setup) -> bool:
    """Whether FSDP runs with the stack's (or --fsdp-*-dtype's) mixed-precision policy at all: FSDP is on (dp > 1 with
    sharded states: torchtitan's parallel_dims.fsdp_enabled, trainfit's hf --zero 2/3), over fp32 weights (an amp-*
    policy), and the stack sets one: its mechanism is fsdp2 (torchtitan, instead of autocast:
    torchtitan/distributed/utils.py:243-263, maybe_enable_amp: autocast only without FSDP) or its [mixed_precision]
    fsdp_policy is on (hf: accelerate's policy beside its autocast, stacks/hf.toml)."""
    mp = setup.stack_facts.facts.get("mixed_precision", {})
    return (_fsdp_sharding(setup) and (mp.get("value") == "fsdp2" or bool(mp.get("fsdp_policy")))
            and bool(PRECISIONS[setup.precision].autocast))


def _fsdp_sharding(setup: Setup) -> bool:
    """A training step whose FSDP shards the states (shard_ranks: dp × cp on torchtitan, its FSDP spans the
    context-parallel ranks)."""
    return _zero().shard_ranks(setup) > 1 and setup.zero >= 2 and setup.mode == "train"


def _policy_always(setup: Setup) -> bool:
    """Whether FSDP is on and the stack passes its MixedPrecisionPolicy whatever the precision (mechanism fsdp2:
    torchtitan's apply_fsdp, models/llama3/infra/parallelize.py:313, with mixed_precision_reduce under training.dtype
    bfloat16 too)."""
    return _fsdp_sharding(setup) and setup.stack_facts.facts.get("mixed_precision", {}).get("value") == "fsdp2"


def fsdp2_mixed_precision(setup: Setup) -> bool:
    """Whether the step gathers FSDP's parameters in a low-precision param_dtype (fsdp_policy_on, and the policy's
    param_dtype is not "none" or the shards' fp32: --fsdp-param-dtype none/fp32 gathers fp32 and leaves the casts to
    autocast, as a FullyShardedDataParallel without a MixedPrecision did)."""
    return fsdp_policy_on(setup) and policy_dtype(setup, "param_dtype") not in ("none", "fp32")


def policy_dtype(setup: Setup, field: str) -> str:
    """The dtype of the FSDP mixed-precision policy's field ("param_dtype", "reduce_dtype") under `setup`'s
    precision: --fsdp-param-dtype / --fsdp-reduce-dtype, else the stack's [mixed_precision] fact, where "compute" is
    the policy's compute dtype (hf: accelerate's amp dtype for both). "none": no dtype set (param_dtype: the stored
    fp32; reduce_dtype: the gradients' own, i.e. param_dtype's: torch 2.13 fsdp/_fully_shard/_fsdp_param.py
    init_dtype_attrs, fsdp/_flat_param.py _init_param_reduce_dtypes)."""
    given = getattr(setup, "fsdp_" + field)
    dtype = given if given is not None else setup.stack_facts.fact("mixed_precision", field)
    return PRECISIONS[setup.precision].compute if dtype == "compute" else dtype


def bitsandbytes_optimizer(setup: Setup) -> bool:
    """Whether the setup's optimizer is bitsandbytes' (setup.BNB_OPTIMIZERS on a stack whose [optimizers] runs
    them from bitsandbytes: the hf stack's adamw-8bit, paged and 32-bit Lion)."""
    return setup.optimizer in BNB_OPTIMIZERS and setup.stack_facts.facts["optimizers"].get("bitsandbytes", False)


# The last few setups' answers, looked up by identity: a Setup is frozen, so the same object has the same answer, and
# one memory or step-time evaluation asks for the same setup's many times (every layer's terms, the clip, the states).
_RECENT: list[tuple[Setup, StateBytes]] = []
_RECENT_SIZE = 4


def state_bytes(setup: Setup) -> StateBytes:
    """Bytes per element of the model states and activations under `setup`'s precision, optimizer and stack."""
    for known, got in _RECENT:
        if known is setup:
            return got
    got = _state_bytes(setup)
    _RECENT.insert(0, (setup, got))
    del _RECENT[_RECENT_SIZE:]
    return got


def _state_bytes(setup: Setup) -> StateBytes:
    pol = PRECISIONS[setup.precision]  # the policy's dtypes (trainfit/precision.py)
    act = 4 if pol.compute == "fp32" else 2
    # the residual stream keeps the weights' dtype: fp32 under autocast (embeddings are never autocast)
    residual = 4 if pol.weight == "fp32" else 2
    if setup.mode in ("infer", "serve"):  # no gradients, masters or optimizer states (an fp16 serving policy has none)
        return StateBytes(DTYPE_BYTES[pol.weight], 0, 0, 0, False, act, residual, bool(pol.autocast))
    autocast, param, reduce = bool(pol.autocast), 0.0, 0.0
    if fsdp2_mixed_precision(setup):
        # MixedPrecisionPolicy(param_dtype, reduce_dtype) (stacks/*.toml [mixed_precision]): param_dtype is the
        # policy's compute dtype (torchtitan's mixed_precision_param, bf16 by default; accelerate's amp dtype); the
        # embedding runs on a low-precision weight, so the residual stream is low precision as well. The hf stack
        # keeps torch.autocast on, but over low-precision weights and inputs it casts nothing: cached_cast
        # (aten/src/ATen/autocast_mode.cpp) casts only tensors not already in the target dtype and caches only fp32
        # leaves that require grad, so there are no weight copies and no per-call input casts (autocast=False here).
        # NB: autocast still runs its fp32-list ops (layer_norm, softmax, ... on CUDA) in fp32 on a bf16 input; the
        # HF Llama-style blocks upcast their norms, softmax and loss explicitly, so nothing changes there, but a
        # LayerNorm family's norm output is fp32 under hf FSDP on CUDA, which this under-counts (saved norm outputs
        # in bf16): -2.9 % / -3.6 % on a 2-layer GPT-2 at --zero 3 / 2 (docs/benchmarks/stacks.md; CPU autocast keeps
        # layer_norm in bf16 and matches the trace).
        autocast, residual = False, act
        param = DTYPE_BYTES[pol.compute]
    if fsdp_policy_on(setup):
        if not param:
            # --fsdp-param-dtype none/fp32: the unsharded copies and their gradients are fp32 (the stored dtype),
            # each cast per use by autocast (autocast stays on, the residual stream fp32); the policy's moments
            # (parallel/zero.py unsharded_at) count them at these bytes. FSDP2's unsharded parameters are
            # nn.Parameters (torch 2.13 fsdp/_fully_shard/_fsdp_param.py:677), leaves, so autocast's cache keeps
            # their casts to the forward's end; FSDP1's are views (parallel/fsdp1.py caches_weight_casts).
            # (a bf16 reduce over them: its reduce-scatter input is the policy's; -0.15 % vs the trace, tiny llama)
            param = DTYPE_BYTES[pol.weight]
        # reduce_dtype "none" reduces in the unsharded gradients' dtype: param_dtype's, or the fp32 shards' without one
        rd = policy_dtype(setup, "reduce_dtype")
        reduce = param if rd == "none" else DTYPE_BYTES[rd]
    elif _policy_always(setup):
        # over 16-bit weights the policy's param_dtype is theirs (no cast) but its reduce_dtype still applies: torch
        # 2.13 fsdp/_fully_shard/_fsdp_param.py init_dtype_attrs keeps a reduce_dtype that differs from the
        # parameters', so the reduce-scatter input is fp32 (seen in a real 2-rank torchtitan step at --precision bf16)
        rd = policy_dtype(setup, "reduce_dtype")
        reduce = 0.0 if rd == "none" else DTYPE_BYTES[rd]
    if kbit_prep.fp32_stream(setup):  # --kbit-prep: an fp32 embedding or norm weight makes the stream fp32
        residual = 4
    weight = DTYPE_BYTES[pol.weight]
    grad = weight  # .grad has the parameter's dtype in PyTorch
    master = DTYPE_BYTES[pol.master] if pol.master else 0.0
    # the optimizer keeps its state in the dtype of the parameters it updates (fp32 masters when present)
    s = DTYPE_BYTES[pol.state]
    opt = {
        "sgd": 0.0,
        "momentum": s,  # momentum buffer
        "adam": 2 * s,  # exp_avg, exp_avg_sq (Kingma & Ba 2015, Alg. 1)
        "adamw": 2 * s,  # Loshchilov & Hutter 2019: same state as Adam
        # Chen et al. 2023 ("Symbolic Discovery of Optimization Algorithms"): one momentum; bitsandbytes' 32-bit
        # Lion (the hf stack's) keeps it fp32 whatever the weights (step/optimizers.py)
        "lion": 4.0 if bitsandbytes_optimizer(setup) else s,
        # Dettmers et al. 2022 ("8-bit Optimizers via Block-wise Quantization"): two uint8 states + one fp32 absmax
        # per 256-element block each (bitsandbytes 0.50 optim/optimizer.py:519-526); small tensors: optimizer.py
        "adamw-8bit": 2.0 + 2 * 4 / 256,
        "paged-adamw-8bit": 2.0 + 2 * 4 / 256,
        "paged-adamw": 8.0,  # bitsandbytes' 32-bit AdamW: two fp32 states whatever the weights
        "adafactor": 0.0,  # factored: rows + columns, computed per matrix in memory.py
        # torchao's block-quantised states (codes + fp32 block scales) of a large tensor; small tensors and the
        # per-tensor qmaps: analytic/torchao_optim.py
        **{name: torchao_optim.per_element(setup) for name in TORCHAO_OPTIMIZERS if name == setup.optimizer},
    }[setup.optimizer]
    return StateBytes(weight, grad, master, opt, setup.optimizer == "adafactor", act, residual, autocast, param, reduce)


@lru_cache(maxsize=1)
def _zero():
    """analytic/parallel/zero.py, imported on first use (it imports this module, and importing it at the end of this
    one breaks the import of parallel/fsdp1.py first); then looked up here, not resolved as an import each call (the
    engine's and the planner's hot path)."""
    from .parallel import zero

    return zero
