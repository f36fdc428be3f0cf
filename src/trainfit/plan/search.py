"""The planner's search: every layout × ZeRO stage × recompute × precision × (micro-batch, accumulation), ranked
by tokens per second among the plans whose analytic peak fits the GPU.

Cost: memory needs a few engine calls per (layout, ZeRO, recompute, precision) group (fit.PeakOracle: the
largest fitting micro-batch bounds all others, since the peak grows with the micro-batch); the time model is
arithmetic per candidate (timing.step_time). Only the top plans get a full `analytic.engine.estimate`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import NamedTuple

from ..analytic.fit_rule import DEFAULT_RESERVE
from ..engines import analytic as estimate
from ..overheads import fixed_bytes
from ..analytic.params import count_params
from ..analytic.precision import state_bytes
from ..analytic.timing import budget
from ..errors import SetupError
from ..estimate import Estimate
from ..hardware import GPU
from ..setup import OPTIMIZERS, STACKS, TRAIN_PRECISIONS, Setup, check_recompute
from ..spec import ModelSpec
from ..stacks import get_stack
from .fit import PeakOracle
from .space import Layout, batch_splits, layouts, max_micro_batch, megatron_variants
from ..analytic.step_time import ModelCosts, StepTime, stage_params, step_time

DEFAULT_PRECISIONS = ("amp-bf16", "bf16-master")
# the precisions searched when none are given: hf's fp32-master pair; torchtitan's FSDP2 mixed precision (its pure
# bf16, training.dtype bfloat16, is searched when asked for: --precision amp-bf16,bf16)
# Megatron and DeepSpeed: bf16 weights and gradients with an fp32 master (their `--bf16` / `bf16.enabled`)
STACK_PRECISIONS = {"hf": DEFAULT_PRECISIONS, "torchtitan": ("amp-bf16",), "megatron": ("bf16-master",),
                    "deepspeed": ("bf16-master",)}
# Stacks whose plans are data-parallel only (ZeRO over dp, tp = pp = 1): trainfit models DeepSpeed's ZeRO engine,
# not its PipelineModule / Megatron-DeepSpeed tensor parallelism (stacks/deepspeed.toml axes).
DP_ONLY = ("deepspeed",)
# layer:N values searched where a stack checkpoints every N-th layer (torchtitan's selective_ac_option = N)
LAYER_EVERY = (2, 4)


def stack_recomputes(stack: str) -> tuple[str, ...]:
    """The recompute policies searched for a stack: its policies (stacks/*.toml [recompute]) less `selective`
    (hf's attention-score recompute equals none under the flash attention plans run; torchtitan's selective is
    op, searched as op), with layer:N for N in LAYER_EVERY. Megatron's selective (core attention, Korthikanti et
    al. 2022 §4.3) is searched; its uniform:N / block:N are left to the user."""
    out = []
    for p in get_stack(stack).policies:
        if p == "layer":
            out += [f"layer:{n}" for n in LAYER_EVERY]
        elif p in ("uniform", "block"):
            continue
        elif p != "selective" or stack == "megatron":
            out.append(p)
    return tuple(out)


def recompute_rank(rec: str) -> float:
    """Tie-break order, least recomputation first: none, layer:N (1/N of the layers), op, selective, full."""
    if rec.startswith("layer:"):
        return 1 / int(rec.split(":", 1)[1])
    return {"none": 0.0, "op": 0.6, "selective": 0.8, "full": 1.0}[rec]


@dataclass(frozen=True)
class PlanQuery:
    gpus: int
    seq: int = 2048
    global_batch_tokens: float | None = None
    precisions: tuple[str, ...] | None = None  # None: each stack's (STACK_PRECISIONS)
    optimizer: str = "adamw"
    recomputes: tuple[str, ...] | None = None  # None: each stack's own (stack_recomputes)
    zeros: tuple[int, ...] | None = None  # None: each stack's ZeRO stages
    stacks: tuple[str, ...] = ("hf",)
    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    margin: float = 0.05  # fraction of GPU memory kept free beyond the modelled device total (unmodelled slack)
    efficiency: float | None = None  # None: the roofline-timed op list; a number: flat fraction of peak (override)
    batch_tolerance: float = 0.05  # relative deviation allowed from the requested global batch
    top: int = 5

    def __post_init__(self) -> None:
        if not isinstance(self.gpus, int) or self.gpus < 1:
            raise SetupError(f"--gpus must be a positive integer, got {self.gpus!r}")
        if self.seq < 1:
            raise SetupError(f"--seq must be a positive integer, got {self.seq!r}")
        if self.global_batch_tokens is not None and self.global_batch_tokens < self.seq:
            raise SetupError(f"--global-batch-tokens {self.global_batch_tokens:g} is less than one sequence of "
                             f"{self.seq} tokens; raise it or lower --seq")
        bad = [p for p in (self.precisions or ()) if p not in TRAIN_PRECISIONS]
        if bad or self.precisions == ():
            raise SetupError(f"--precision {','.join(bad) or '(empty)'} is not a training precision; choose from: "
                             f"{', '.join(TRAIN_PRECISIONS)} (comma-separated)")
        if self.optimizer not in OPTIMIZERS:
            raise SetupError(f"--optimizer {self.optimizer!r} is not supported; choose one of: {', '.join(OPTIMIZERS)}")
        bads = [x for x in self.stacks if x not in STACKS]
        if bads or not self.stacks or len(set(self.stacks)) != len(self.stacks):
            raise SetupError(f"--stacks {','.join(self.stacks) or '(empty)'}: give distinct stacks from "
                             f"{', '.join(STACKS)} (comma-separated)")
        if self.recomputes is not None:
            if not self.recomputes:
                raise SetupError("--recompute (empty): give policies, comma-separated (e.g. none,full)")
            for r in self.recomputes:
                check_recompute(r)  # the one definition of a valid policy (layer:N included)
            if "selective" in self.recomputes and "megatron" not in self.stacks:
                raise SetupError("--recompute selective means each stack's own policy: hf's recomputes attention "
                                 "scores that the planned steps (flash attention) never store (it equals none), "
                                 "torchtitan's is op; search none,full (and op for torchtitan; selective is "
                                 "megatron's core-attention recompute)")
        if self.zeros is not None and (not self.zeros or any(z not in (0, 1, 2, 3) for z in self.zeros)):
            raise SetupError(f"--zero {','.join(map(str, self.zeros)) or '(empty)'}: ZeRO stages are 0, 1, 2 and 3; "
                             "give a comma-separated list of them (e.g. --zero 1,3)")
        for name in self.stacks:  # every stack searches something, every value given is run by some stack
            st = get_stack(name)
            if self.optimizer not in st.optimizers:
                raise SetupError(f"--optimizer {self.optimizer}: --stack {name} builds {', '.join(st.optimizers)} "
                                 "only; change --optimizer or drop the stack")
            for what, got in (("precision", self.precisions_for(name)), ("recompute", self.recomputes_for(name)),
                              ("zero", self.zeros_for(name))):
                if not got:
                    runs = {"precision": st.precisions, "recompute": stack_recomputes(name),
                            "zero": st.zero_stages}[what]
                    raise SetupError(f"--{what}: none of the values given is run by --stack {name} (it runs "
                                     f"{', '.join(map(str, runs))}); add one of those or drop the stack")
        for what, given, per in (("precision", self.precisions, self.precisions_for),
                                 ("recompute", self.recomputes, self.recomputes_for),
                                 ("zero", self.zeros, self.zeros_for)):
            unused = [v for v in (given or ()) if all(v not in per(x) for x in self.stacks)]
            if unused:
                raise SetupError(f"--{what} {unused[0]} is not run by --stack {','.join(self.stacks)}; drop it or "
                                 "add a stack that runs it (see `trainfit plan --help`)")
        if not 0 <= self.margin < 1:
            raise SetupError(f"--margin is a fraction of GPU memory in [0, 1), got {self.margin}")
        if self.efficiency is not None and not 0 < self.efficiency <= 1:
            raise SetupError(f"--efficiency must be in (0, 1], got {self.efficiency}")
        if not 0 <= self.batch_tolerance < 1:
            raise SetupError(f"--batch-tolerance must be in [0, 1), got {self.batch_tolerance}")
        for name in ("tp", "pp", "dp"):
            v = getattr(self, name)
            if v is not None and (v < 1 or self.gpus % v):
                raise SetupError(f"--{name} {v} must be a positive divisor of --gpus {self.gpus}")
        if self.top < 1:
            raise SetupError(f"--top must be >= 1, got {self.top}")

    def precisions_for(self, stack: str) -> tuple[str, ...]:
        given = self.precisions if self.precisions is not None else STACK_PRECISIONS[stack]
        return tuple(p for p in given if p in get_stack(stack).precisions)

    def recomputes_for(self, stack: str) -> tuple[str, ...]:
        """The policies searched for `stack`: the given ones it runs, or its own (stack_recomputes)."""
        if self.recomputes is None:
            return stack_recomputes(stack)
        runs = get_stack(stack).policies
        return tuple(r for r in self.recomputes if (r.split(":")[0] if r.startswith("layer:") else r) in runs)

    def zeros_for(self, stack: str) -> tuple[int, ...]:
        stages = get_stack(stack).zero_stages
        return stages if self.zeros is None else tuple(z for z in self.zeros if z in stages)


def usable(gpu: GPU, margin: float) -> int:
    """Bytes a plan's device total may fill: the GPU minus the safety margin (and the estimate's --reserve default)."""
    return int(gpu.memory - DEFAULT_RESERVE - margin * gpu.memory)


def capacity(gpu: GPU, margin: float, setup: Setup | None = None) -> int:
    """Bytes a plan's peak may use, on the estimate's basis (its fit is device total <= GPU memory): `usable` minus
    the fixed overheads the device total adds to the peak (overheads.fixed_bytes: CUDA context, cuBLAS workspace,
    and for `setup` its NCCL communicators; without a setup, one process's context and workspace). The step's own
    reserve (the allocated peak + one cached block) is the oracle's side (plan/fit.py)."""
    base = setup if setup is not None else Setup()
    return usable(gpu, margin) - fixed_bytes(gpu, base)


class _Cfg(NamedTuple):
    """The fields of Setup that the time model reads, without Setup's validation cost (search inner loop)."""

    batch: int
    seq: int
    grad_accum: int
    precision: str
    recompute: str
    dp: int
    tp: int
    pp: int
    zero: int
    stack: str = "hf"
    mode: str = "train"
    device: str = "cuda"  # the plans run CUDA kernels: flash attention
    sequence_parallel: bool = False
    optimizer: str = "adamw"
    optimizer_impl: str | None = None
    cp: int = 1
    vpp: int = 1
    pp_split: str = "even"
    ep: int = 1
    etp: int | None = None
    offload: str = "none"
    lora_rank: int = 0  # the planner plans full training: no adapters (the time model reads these)
    lora_targets: str = "all-linear"
    dora: bool = False
    quant: str | None = None
    optimizer_in_backward: bool = False
    max_grad_norm: float | None = None  # the stack's own clipping (Setup.grad_clip_norm)

    # what the recompute FLOPs read of a Setup (analytic/flops.py recompute_per_token), computed as Setup does
    stack_facts = Setup.stack_facts
    recompute_policy = Setup.recompute_policy
    recompute_layers = Setup.recompute_layers
    layers_every = Setup.layers_every
    world_size = Setup.world_size
    expert_tp = Setup.expert_tp
    expert_dp = Setup.expert_dp
    policy = Setup.policy
    optimizer_kernel = Setup.optimizer_kernel
    grad_clip_norm = Setup.grad_clip_norm

    @property
    def attention_kernel(self) -> str:
        return "flash"


@dataclass
class Candidate:
    setup: Setup
    time: StepTime
    estimate: Estimate | None = None  # the analytic engine's full result (top candidates only)
    capacity: int = 0
    budget: dict = field(default_factory=dict)  # with --tokens

    @property
    def peak(self) -> int:
        return self.estimate.memory.peak if self.estimate else -1

    @property
    def headroom(self) -> int:
        """capacity minus what the step's tensors reserve (the allocated peak + the allocator's cached block:
        the estimate's reserved without a GPU), as the estimate's own headroom."""
        return self.capacity - (self.estimate.memory.reserved if self.estimate else -1)


@dataclass
class PlanResult:
    model: str
    gpu: GPU
    query: PlanQuery
    candidates: list[Candidate]
    stats: dict
    capacity: int
    diagnosis: object | None = None  # diagnose.Diagnosis when nothing fits
    notes: tuple[str, ...] = ()


def search(spec: ModelSpec, gpu: GPU, q: PlanQuery, tokens: float | None = None) -> PlanResult:
    t0 = time.perf_counter()
    pc = count_params(spec)
    cap = capacity(gpu, q.margin)
    oracle = PeakOracle(spec, pc)
    costs = ModelCosts.of(spec, q.seq, pc)
    gseqs = q.global_batch_tokens / q.seq if q.global_batch_tokens else None
    lays = layouts(spec, q.gpus, gpu.gpus_per_node, q.tp, q.pp, q.dp, uneven="megatron" in q.stacks)
    if "megatron" in q.stacks:  # Megatron's own axes: cp, vpp, pp_split (space.megatron_variants)
        lays = [v for lay in lays for v in megatron_variants(spec, lay, q.seq)]
    st_of = {(x, p): state_bytes(Setup(precision=p, optimizer=q.optimizer, stack=x))
             for x in q.stacks for p in q.precisions_for(x)}
    stats = {"layouts": len(lays), "searched": 0, "timed": 0, "fits": 0, "groups": 0, "batch_unreachable": 0,
             "memory_rejected_groups": 0, "stacks": {x: {"precisions": list(q.precisions_for(x)),
                                                         "recomputes": list(q.recomputes_for(x)),
                                                         "zeros": list(q.zeros_for(x)), "groups": 0}
                                                     for x in q.stacks}}
    best: dict[tuple, tuple[float, Candidate | tuple]] = {}
    for lay in lays:
        bcap = max_micro_batch(lay, gseqs, q.batch_tolerance)
        splits_all = batch_splits(lay, gseqs, bcap, q.batch_tolerance) if gseqs is not None else None
        if bcap < 1 or (splits_all is not None and not splits_all):
            stats["batch_unreachable"] += 1
            continue
        sp = stage_params(spec, pc, lay.tp, lay.pp, lay.pp_split)
        plain = lay.cp == 1 and lay.vpp == 1 and lay.pp_split == "even"
        for stack in q.stacks:
            if stack != "megatron" and not plain:
                continue  # cp, vpp and uneven splits are Megatron's
            if stack in DP_ONLY and (lay.tp > 1 or lay.pp > 1):
                continue
            facts = get_stack(stack)
            for prec in q.precisions_for(stack):
                st = st_of[(stack, prec)]
                for zero in (q.zeros_for(stack) if lay.dp > 1 else (0,)):
                    if facts.runs_layout(lay.dp, lay.tp, lay.pp, zero, prec) is not None:
                        continue  # e.g. torchtitan's DDP beside tensor/pipeline parallelism
                    for rec in q.recomputes_for(stack):
                        stats["groups"] += 1
                        stats["stacks"][stack]["groups"] += 1
                        _search_group(spec, gpu, q, lay, prec, zero, rec, st, sp, costs, oracle, cap, gseqs, bcap,
                                      splits_all, stats, best, stack)
    ranked = sorted(best.values(), key=lambda v: v[0])
    cands = []
    for _, (cfg, tm) in ranked[: q.top]:
        rec = cfg.recompute
        setup = Setup(batch=cfg.batch, seq=cfg.seq, grad_accum=cfg.grad_accum, precision=cfg.precision,
                      optimizer=q.optimizer, recompute=rec, dp=cfg.dp, tp=cfg.tp, pp=cfg.pp, zero=cfg.zero,
                      sequence_parallel=cfg.tp > 1, stack=cfg.stack, cp=cfg.cp, vpp=cfg.vpp, pp_split=cfg.pp_split)
        est = estimate(spec, setup)
        c = Candidate(setup, tm, est, capacity(gpu, q.margin, setup))
        if tokens:
            c.budget = budget(tokens, tm.tokens_per_second, setup.world_size, gpu, tm.as_dict())
        cands.append(c)
    elapsed = time.perf_counter() - t0
    stats.update(seconds=elapsed, engine_calls=oracle.calls,
                 searched_per_second=stats["searched"] / elapsed if elapsed > 0 else float("inf"))
    result = PlanResult(spec.name, gpu, q, cands, stats, cap)
    if not cands:
        from .diagnose import diagnose

        result.diagnosis = diagnose(spec, gpu, q, result)
    return result


def _search_group(spec, gpu, q, lay: Layout, prec, zero, rec, st, sp, costs, oracle, cap, gseqs, bcap, splits_all,
                  stats, best, stack: str = "hf") -> None:
    # Interleaving keeps more in flight as the accumulation grows until the warm-up saturates (pipeline.in_flight:
    # rank 0 at m >= 2·pp, m a multiple of pp): the memory probe uses that depth, an upper bound for every split.
    accum0 = (2 * lay.pp if lay.vpp > 1 else lay.pp) if lay.pp > 1 else 1
    base = Setup(batch=1, seq=q.seq, grad_accum=accum0, precision=prec, optimizer=q.optimizer,
                 recompute=rec, dp=lay.dp, tp=lay.tp, pp=lay.pp, zero=zero, sequence_parallel=lay.tp > 1, stack=stack,
                 cp=lay.cp, vpp=lay.vpp, pp_split=lay.pp_split)
    # Memory depends on the accumulation only through "more than one micro-batch" (earlier micro-batches'
    # gradients stay live) and the 1F1B depth min(pp, accum) = pp; so two largest batches cover every split.
    bmax: dict[bool, int] = {}
    gcap = capacity(gpu, q.margin, base)  # this layout's communicators (NCCL buffers) come off the GPU too

    def largest(multi: bool) -> int:
        if multi not in bmax:
            b = base if (lay.pp > 1 or not multi) else base.with_(grad_accum=2)
            bmax[multi] = oracle.largest_batch(b, gcap, bcap)
        return bmax[multi]

    if splits_all is None:  # no global batch: accumulation fills the pipeline, micro-batch up to the largest fit
        splits = batch_splits(lay, None, largest(lay.pp > 1), q.batch_tolerance)
        stats["searched"] += len(splits)
    else:
        splits = splits_all
        stats["searched"] += len(splits)
    key = (lay, zero, rec, prec, stack)
    any_fit = False
    for b, accum in splits:
        if b > largest(accum > 1):
            continue
        any_fit = True
        cfg = _Cfg(b, q.seq, accum, prec, base.recompute, lay.dp, lay.tp, lay.pp, zero, stack, sequence_parallel=lay.tp > 1,
                   cp=lay.cp, vpp=lay.vpp, pp_split=lay.pp_split)
        tm = step_time(spec, cfg, gpu, costs, sp, st, q.efficiency)
        stats["timed"] += 1
        # rank: fastest first; ties to the larger micro-batch (bigger GEMMs run faster in practice), less ZeRO,
        # less recompute, then the stacks' order as given
        rank = (-tm.tokens_per_second, -b, zero, recompute_rank(rec), q.precisions_for(stack).index(prec), lay.pp,
                lay.tp, lay.cp, lay.vpp, lay.pp_split, q.stacks.index(stack))
        old = best.get(key)
        if old is None or rank < old[0]:
            best[key] = (rank, (cfg, tm))
    if any_fit:
        stats["fits"] += 1
    else:
        stats["memory_rejected_groups"] += 1
