"""The planner's search: every layout × ZeRO stage × recompute (and Megatron's recompute modules) × precision ×
(micro-batch, accumulation), ranked
by tokens per second among the plans that fit the GPU.

One verdict with `trainfit estimate`: every candidate is the Setup `estimate` builds for the same settings
(`planned_setup`: Request.setup, the model's defaults resolved), timed by the estimate's step-time model
(analytic/step_time.py layout_step_time), its fit judged by the estimate's rule (analytic/fit_rule.py: required <=
capacity(gpu, setup, --reserve)); the top plans' numbers are the analytic engine's estimate of their setup
(trainfit.engines.analytic), so `trainfit estimate` with a plan's settings answers the same step time, peak,
device total, headroom and fit.

Cost: a large search (one that judges its groups when taken: Space.judge_first) enters each layout of a stack as one
entry (LAYOUT: _layout_entry), bounded by the best bound any of its groups could have; the search taking it builds
its groups then, so the groups of a layout the bound never reaches are never built (DeepSeek-V3 on 1,024 H100s: 782
of 2,036 layouts taken, in one process). Every (layout, ZeRO, recompute, precision) group enters as one entry,
bounded by the best of its (micro-batch, accumulation) splits' bounds from their layers alone
(step_time.layer_floor: each stage's layers × one layer's forward and backward, the ends, the TP collectives and
pipeline sends, bubble and stragglers, the op lists' times memoised whatever the pipeline; Floors.of_splits, shared
by the layout's every group), at the splits its room allows: each pipeline stage's states plus b × its saved bytes
must fit (PeakOracle.micro_batch_room, memory.stage_saved_floors; no engine call), and a group whose room allows
none never enters. Groups are taken best bound first (_time_best_first): a group taken has its splits entered, each
bounded again by the exact bound on its throughput (step_time.step_floor: its compute and critical-path
communication, the op lists' times memoised on what they read — compute_time._timed_layer: one layer's Shape, shared
by every ZeRO stage, recompute policy and pipeline layout) and timed best bound first; a group or setup whose bound
cannot reach its group's best or the --top fastest groups' is never judged or timed: the plans returned are those of
timing every one (tests/plan/test_search_exact.py). A group's memory is judged only when one of its splits is about
to be timed (fit.PeakOracle: the largest fitting micro-batch bounds all others, since the peak grows with the
micro-batch; b = 1 and b = 2 bound it, two engine calls; a split between the two bounds is settled when it is the
one: _Unsettled), so the groups whose splits are all bounded out first cost no engine call. A selective group's splits
start from the bound with nothing recomputed, which its layout's module sets share (Floors.below_every_policy), and
get their own only when taken. The settings that change only the step time (space.TIMED: the MoE dispatcher,
--overlap-moe-comm) are searched inside each group, its memory judged once for all of them at the defaults' capacity
(a dispatcher's own buffers beside the allocator, overheads.OWN_BUFFERS, leave less: each of its setups judged again
when timed). Only the top plans get a full estimate.
"""
from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from .. import cancel, limits
from ..analytic.fit_rule import capacity, reserve_bytes
from ..analytic.layout import check_stack_model, validate_layout
from ..analytic.ops import WHOLE_LAYER
from ..analytic.params import count_params
from ..analytic.precision import state_bytes
from ..analytic.stacks import model_for
from ..analytic.step_time import layout_step_time
from ..analytic.timing import budget
from ..analytic.unmodelled import check_training_setup
from ..engines import analytic
from ..errors import NotModelledError, SetupError
from ..estimate import Estimate, StepTime
from ..hardware import GPU
from ..models.hf_config import for_setup
from ..overheads import OWN_BUFFERS
from ..setup import BY_NAME, OPTIMIZERS, TRAIN_PRECISIONS, Request, Setup, check_recompute, check_value
from ..spec import ModelSpec, VisionSpec
from ..stacks import get_stack, names
from .fit import PeakOracle
from .floors import Floors, tokens_bound
from .gc_paused import gc_paused
from .parallel import MIN_GROUPS, searched_in_parallel
from .knobs import ALL as KNOBS, LEVELS as KNOB_LEVELS, judged_knobs, levels as knob_levels
from .space import (SEARCHED, TIMED, Layout, Where, batch_splits, layouts, max_micro_batch, recompute_module_sets,
                    timed_variants, variants)

DEFAULT_STACKS = (BY_NAME["stack"].default,)  # planned when --stack is not given


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
    precisions: tuple[str, ...] | None = None  # None: each stack's ([plan] precisions)
    optimizer: str = "adamw"
    recomputes: tuple[str, ...] | None = None  # None: each stack's own ([plan] recomputes)
    zeros: tuple[int, ...] | None = None  # None: each stack's ZeRO stages
    stacks: tuple[str, ...] = DEFAULT_STACKS
    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    reserve: float = 0.0  # GiB per GPU kept free beyond the device total: the run setting --reserve (setup/settings.py)
    efficiency: float | None = None  # None: the roofline-timed op list; a number: flat fraction of peak (override)
    batch_tolerance: float = 0.05  # relative deviation allowed from the requested global batch
    top: int = 5
    knobs: tuple[str, ...] = KNOBS  # the memory knobs searched when no plain plan fits (plan/knobs.py)

    def __post_init__(self) -> None:
        if not isinstance(self.gpus, int) or self.gpus < 1:
            raise SetupError(f"--gpus must be a positive integer, got {self.gpus!r}")
        limits.check_world(self.gpus, "--gpus")  # (the layouts' divisors are then found in O(sqrt gpus): plan/space.py)
        check_value(BY_NAME["seq"], self.seq)  # the one definition of --seq's bounds
        if self.global_batch_tokens is not None and self.global_batch_tokens < self.seq:
            raise SetupError(f"--global-batch-tokens {self.global_batch_tokens:g} is less than one sequence of "
                             f"{self.seq} tokens; raise it or lower --seq")
        bad = [p for p in (self.precisions or ()) if p not in TRAIN_PRECISIONS]
        if bad or self.precisions == ():
            raise SetupError(f"--precision {','.join(bad) or '(empty)'} is not a training precision; choose from: "
                             f"{', '.join(TRAIN_PRECISIONS)} (comma-separated)")
        if self.optimizer not in OPTIMIZERS:
            raise SetupError(f"--optimizer {self.optimizer!r} is not supported; choose one of: {', '.join(OPTIMIZERS)}")
        bads = [x for x in self.stacks if x not in names()]
        if bads or not self.stacks or len(set(self.stacks)) != len(self.stacks):
            raise SetupError(f"--stacks {','.join(self.stacks) or '(empty)'}: give distinct stacks from "
                             f"{', '.join(names())} (comma-separated)")
        if self.recomputes is not None:
            if not self.recomputes:
                raise SetupError("--recompute (empty): give policies, comma-separated (e.g. none,full)")
            for r in self.recomputes:
                check_recompute(r)  # the one definition of a valid policy (layer:N included)
            if "selective" in self.recomputes and not any("selective" in get_stack(x).plan_recomputes
                                                          for x in self.stacks):
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
                    runs = {"precision": st.precisions, "recompute": st.plan_recomputes,
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
        check_value(BY_NAME["reserve"], self.reserve)  # the one definition of --reserve (GiB, >= 0)
        if self.efficiency is not None and not 0 < self.efficiency <= 1:
            raise SetupError(f"--efficiency must be in (0, 1], got {self.efficiency}")
        if not 0 <= self.batch_tolerance < 1:
            raise SetupError(f"--batch-tolerance must be in [0, 1), got {self.batch_tolerance}")
        for name in ("tp", "pp", "dp"):
            v = getattr(self, name)
            if v is not None and (v < 1 or self.gpus % v):
                raise SetupError(f"--{name} {v} must be a positive divisor of --gpus {self.gpus}")
        refused = self.split_refusals()
        if len(refused) == len(self.stacks):  # a fixed split no planned stack runs is refused, not an empty plan
            raise SetupError(refused[self.stacks[0]])
        if self.top < 1:
            raise SetupError(f"--top must be >= 1, got {self.top}")
        if any(k not in KNOBS for k in self.knobs):
            raise SetupError(f"knobs {', '.join(self.knobs)}: give some of {', '.join(KNOBS)}")

    def split_refusals(self) -> dict[str, str]:
        """{stack: why} for the planned stacks that do not run the fixed --tp/--pp split (stacks/*.toml
        [model_parallel]): they plan nothing, said in the result's notes."""
        return {x: why for x in self.stacks if (why := get_stack(x).splits_model(self.tp or 1, self.pp or 1))}

    def precisions_for(self, stack: str) -> tuple[str, ...]:
        given = self.precisions if self.precisions is not None else get_stack(stack).plan_precisions
        return tuple(p for p in given if p in get_stack(stack).precisions)

    def recomputes_for(self, stack: str) -> tuple[str, ...]:
        """The policies searched for `stack`: the given ones it runs, or its own ([plan] recomputes)."""
        if self.recomputes is None:
            return get_stack(stack).plan_recomputes
        runs = get_stack(stack).policies
        return tuple(r for r in self.recomputes if (r.split(":")[0] if r.startswith("layer:") else r) in runs)

    def zeros_for(self, stack: str) -> tuple[int, ...]:
        stages = get_stack(stack).zero_stages
        return stages if self.zeros is None else tuple(z for z in self.zeros if z in stages)


def planned_setup(spec: ModelSpec, **settings) -> Setup:
    """The Setup `trainfit estimate` runs for these settings of `spec` (api.resolve: Request.setup resolves the
    model's defaults — its head, the stack's precision — and Setup the rest: attention kernel, optimizer kernel,
    clipping norm), so a plan and the estimate of its settings are the same step."""
    return Request(model=spec.name, **settings).setup(spec)


_TEMPLATES: dict = {}  # (spec, --seq) -> planned_setup(spec, seq=...): the Request's defaults resolved for the model


def _templated(spec: ModelSpec) -> bool:
    """Whether the model's Request defaults depend on --seq alone, so a group's setup can be derived from a template:
    not a vision model's (group_setup, _layout_base)."""
    return not isinstance(spec, VisionSpec) and getattr(spec, "vision", None) is None


def group_setup(spec: ModelSpec, **settings) -> Setup:
    """planned_setup(spec, **settings) for the search's groups, without building a Request each time: the setup of
    --seq alone (its model-dependent defaults resolved: head, target length) with the group's settings set by
    Setup.with_, which checks every rule of the Setup again; the Request's own checks are its run settings' (GPU,
    price, budget), which the planner never sets, and its value checks are the Setup's (tests/plan/
    test_search_exact.py compares the two). A vision model's defaults depend on more settings: planned_setup."""
    if not _templated(spec):
        return planned_setup(spec, **settings)
    key = (spec, settings["seq"])
    template = _TEMPLATES.get(key)
    if template is None:
        if len(_TEMPLATES) >= 64:
            _TEMPLATES.clear()
        template = _TEMPLATES[key] = planned_setup(spec, seq=settings["seq"])
    return template.with_(**settings)


@dataclass
class Candidate:
    setup: Setup
    time: StepTime  # the estimate's step-time terms (under --efficiency, the flat override's)
    estimate: Estimate  # the analytic engine's estimate of `setup` on the GPU: memory, headroom, fit
    budget: dict = field(default_factory=dict)  # with --tokens
    warnings: tuple[str, ...] = ()  # what the stack's own code warns of for this setup on the GPU (StackModel.warnings)

    @property
    def peak(self) -> int:
        return self.estimate.memory.peak

    @property
    def capacity(self) -> int:
        """Bytes the step's tensors may take: the estimate's (fit_rule.capacity with --reserve)."""
        return self.estimate.fit.capacity

    @property
    def headroom(self) -> int:
        """The estimate's headroom (fit_rule: capacity − what the step's tensors need)."""
        return self.estimate.fit.headroom


@dataclass
class PlanResult:
    model: str
    gpu: GPU
    query: PlanQuery
    candidates: list[Candidate]
    stats: dict
    diagnosis: object | None = None  # diagnose.Diagnosis when nothing fits
    notes: tuple[str, ...] = ()


def check_fixed_axes(spec: ModelSpec, gpu: GPU, q: PlanQuery) -> None:
    """A fixed --tp or --pp the model or the node cannot take is the user's error, said in one line (the estimate's
    own layout check, analytic.layout.validate_layout), not an empty search."""
    if q.tp is not None:
        validate_layout(spec, Setup(tp=q.tp, seq=q.seq))  # (at the query's --seq: a learned position table)
        if q.tp > gpu.gpus_per_node:
            raise SetupError(f"--tp {q.tp}: tensor parallelism stays inside a node, of {gpu.gpus_per_node} "
                             f"{gpu.name}s; use --tp {gpu.gpus_per_node} or less")
    if q.pp is not None and not layouts(spec, q.gpus, gpu.gpus_per_node, None, q.pp, None,
                                        uneven=_runs_any(q, "pp_split")):
        # (Megatron's uneven splits are searched above; infer: the layer split alone, the stacks' rules are PlanQuery's)
        validate_layout(spec, Setup(pp=q.pp, mode="infer"))


def _runs_any(q: PlanQuery, *axes: str) -> bool:
    """Whether a planned stack runs one of `axes` ([parallel] axes)."""
    return any(a in get_stack(x).axes for x in q.stacks for a in axes)


class Space:
    """One search's fixed parts — the model as planned (its head: hf_config.for_setup, as the analytic engine
    resolves it), its memory oracle and throughput bounds, the layouts with the settings each stack searches beside
    them — and what searching its layouts collects: `fitting` (_search_group's entries) and `stats`. Built the same
    way in each worker process of a parallel search (plan/parallel.py), which searches a share of the layouts."""

    def __init__(self, spec: ModelSpec, gpu: GPU, q: PlanQuery):
        self.spec, self.gpu, self.q = spec, gpu, q
        self.model = model = for_setup(spec, planned_setup(spec, seq=q.seq))
        check_fixed_axes(model, gpu, q)
        self.oracle = PeakOracle(model, count_params(model))
        self.floors = Floors(model, gpu, self.oracle.pc, q.efficiency)  # shared by a layout's ZeRO stages
        self.gseqs = q.global_batch_tokens / q.seq if q.global_batch_tokens else None
        lays = layouts(model, q.gpus, gpu.gpus_per_node, q.tp, q.pp, q.dp, uneven=_runs_any(q, "pp_split"))
        run = {a.name for a in SEARCHED if _runs_any(q, a.name)}  # the settings beyond dp × tp × pp (space.SEARCHED)
        self.at = Where(q.seq, gpu.gpus_per_node)
        self.timed = {a.name for a in TIMED if _runs_any(q, a.name)}  # those tried inside each group (space.TIMED)
        # under a selective policy, the recompute modules each stack searches (space.recompute_module_sets)
        self.module_sets = {x: recompute_module_sets(model, x) for x in q.stacks}
        self.lays = [v for lay in lays for v in variants(model, lay, self.at, run)] if run else lays
        self.stats = {"layouts": len(self.lays), "searched": 0, "timed": 0, "fits": 0, "memory_judged": 0,
                      "groups": 0, "batch_unreachable": 0,
                      "stacks": {x: {"precisions": list(q.precisions_for(x)), "recomputes": list(q.recomputes_for(x)),
                                     "zeros": list(q.zeros_for(x)), "groups": 0, "axes": {},
                                     "recompute_modules": self.module_sets[x]} for x in q.stacks}}
        self.fitting: list[tuple] = []  # every setup that fits, with its throughput bound (_search_group)
        # A search too small to share over processes (plan/parallel.py MIN_GROUPS) judges each group's memory as it
        # enters: its groups are few and cheap to judge, and the op lists of the micro-batches that do not fit are then
        # never built for their bounds (llama-3.1-8b on 8 A100s: 0.57 -> 0.19 s). A larger one judges only the groups
        # its bound reaches (DeepSeek-V3 on 1,024 H100s: 64,373 -> ~24,000 engine calls).
        self.judge_first = self.groups() < MIN_GROUPS
        self.tried: dict[tuple, list[list[dict]]] = {}  # each (layout, stack)'s knob levels (plan/knobs.py), once

    def groups(self) -> int:
        """How many (layout, stack, precision, ZeRO, recompute, modules) groups the plain pass searches at most (the
        parallel search's size test: plan/parallel.py)."""
        q = self.q
        n = 0
        for stack in q.stacks:
            per = len(q.precisions_for(stack)) * len(q.zeros_for(stack)) * sum(
                len(self.module_sets[stack]) if r == "selective" else 1 for r in q.recomputes_for(stack))
            facts = get_stack(stack)
            n += per * sum(lay.runs_on(facts) for lay in self.lays)
        return n

    def splits(self, lay: Layout) -> tuple | None:
        """(largest micro-batch, the global batch's splits or None) of a layout; None where the batch cannot split."""
        q = self.q
        bcap = max_micro_batch(lay, self.gseqs, q.batch_tolerance)
        got = batch_splits(lay, self.gseqs, bcap, q.batch_tolerance) if self.gseqs is not None else None
        return None if bcap < 1 or (got is not None and not got) else (bcap, got)

    def search_layouts(self, level: int | None = None, progress: Callable[[int, int], None] | None = None,
                       families: Iterable[int] | None = None) -> None:
        """Every group of every layout; with `level`, under that level's memory knobs (plan/knobs.py LEVELS);
        `families`: the layouts of those shape families only (family_members' numbers), family by family in that
        order (a worker's part of a parallel search, claimed as it goes)."""
        q, model = self.q, self.model
        members = self.family_members() if families is not None else None
        order = enumerate(self.lays) if members is None else ((i, self.lays[i]) for f in families for i in members[f])
        for i, lay in order:
            if progress is not None and level is None:
                progress(i, len(self.lays))
            plain = self.splits(lay)
            if level is None and not plain:
                self.stats["batch_unreachable"] += 1
                continue
            for stack in q.stacks:
                facts = get_stack(stack)
                if not lay.runs_on(facts):
                    continue  # cp, vpp, uneven splits, ep, etp: the stacks that run them ([parallel] axes)
                if level is not None and (lay, stack) not in self.tried:
                    self.tried[lay, stack] = knob_levels(model, stack, lay, q.seq, q.knobs)
                for extra in ([{}] if level is None else self.tried[lay, stack][level]):
                    # Ulysses groups share each sequence: dp / ulysses ranks train different ones (Setup.tokens)
                    n = extra.get("ulysses", 1)
                    got = plain if n == 1 else self.splits(replace(lay, dp=lay.dp // n))
                    if got:
                        tv = timed_variants(model, lay, self.at, self.timed & set(facts.axes),
                                            facts.facts.get("moe", {}).get("dispatchers"))
                        _search_stack(self.spec, self.gpu, q, lay, stack, self.oracle, self.floors, self.gseqs, *got,
                                      self.stats, self.fitting, self.module_sets[stack], extra, level, tv,
                                      self.judge_first)

    def family_members(self) -> list[list[int]]:
        """The layouts (their indices) of each shape family, the families numbered as they first appear: the layouts
        of one tp, cp, ep and etp, whose micro-batches run the same op shapes (ops/shape.py Shape: the memoised
        layers' lists and times, compute_time), so a parallel search that gives each worker whole families times
        each shape in one process only."""
        seen: dict[tuple, list[int]] = {}
        for i, lay in enumerate(self.lays):
            seen.setdefault((lay.tp, lay.cp, lay.ep, lay.etp), []).append(i)
        return list(seen.values())

    def time_best_first(self, best: dict, spares: bool | None = None, shared=None) -> None:
        """The fitting setups timed into `best` (_time_best_first)."""
        _time_best_first(self.gpu, self.q, self.oracle, self.floors, self.fitting, best, self.stats, spares, shared)


@gc_paused
def search(spec: ModelSpec, gpu: GPU, q: PlanQuery, tokens: float | None = None,
           progress: Callable[[int, int], None] | None = None, workers: int = 1) -> PlanResult:
    """`spec`: the model as loaded (api.load_spec), as `trainfit estimate` takes it. `progress(i, n)`: called as
    each of the n layouts starts and with i = n once all are entered, while the groups they reach are judged and
    timed (the CLI's bar; a parallel search calls it with the workers' count of layouts started). `workers`: the
    processes a large search's layouts are shared over (plan/parallel.py; 1: this one); the plans are the same."""
    t0 = time.perf_counter()
    q = replace(q, knobs=judged_knobs(q.knobs, gpu))  # offload only where the node's host memory is known
    space = Space(spec, gpu, q)
    stats, oracle = space.stats, space.oracle
    best: dict[tuple, tuple[tuple, tuple[Setup, StepTime]]] = {}
    if not searched_in_parallel(space, best, workers, progress):
        space.search_layouts(progress=progress)
        if progress is not None:
            progress(len(space.lays), len(space.lays))  # (every layout entered: the fastest groups judged and timed)
        space.time_best_first(best)
    # nothing fits plainly: the memory knobs the stacks run, level by level (plan/knobs.py: the search order rule)
    for level, name in enumerate(KNOB_LEVELS):
        if best:
            break
        space.search_layouts(level)
        stats["knob_levels"] = stats.get("knob_levels", 0) + any(lv[level] for lv in space.tried.values())
        if space.fitting:
            stats["knobs"] = name
        space.time_best_first(best)
    for d in stats["stacks"].values():  # the values each searched setting took (None: its default, e.g. etp = tp)
        d["axes"] = {k: sorted(v, key=lambda x: (x is not None, str(x) if isinstance(x, str) else x or 0))
                     for k, v in d["axes"].items()}
    ranked = sorted(best.values(), key=lambda v: v[0])
    cands = []
    for _, (setup, tm) in ranked[: q.top * POOL]:
        if len(cands) == q.top:
            break
        est = analytic(spec, setup, gpu, reserve=q.reserve)  # the estimate's own numbers for this setup
        if setup.offload != "none" and not est.fit.fits:  # the node's host memory (fit_rule.host_verdict), which
            stats["host_rejected"] = stats.get("host_rejected", 0) + 1  # the device-only search does not judge
            continue
        if q.efficiency is None:
            tm = est.detail.step_time
        c = Candidate(setup, tm, est, warnings=tuple(model_for(setup).warnings(spec, setup, gpu)))
        if tokens:
            c.budget = budget(tokens, tm.tokens_per_second, setup.world_size, gpu, tm.as_dict())
        cands.append(c)
    elapsed = time.perf_counter() - t0
    stats.update(seconds=elapsed, engine_calls=oracle.calls,
                 searched_per_second=stats["searched"] / elapsed if elapsed > 0 else float("inf"))
    notes = tuple(q.split_refusals().values())
    why = stats.get("not_modelled_why")
    if why is not None:
        if not cands and not stats["memory_judged"]:  # no group the engine models: its reason is the answer
            raise NotModelledError(f"plan: the analytic engine models no layout of {spec.name} on {q.gpus} GPUs: {why}")
        notes += (f"layouts the analytic engine does not model were left out ({why})",)
    result = PlanResult(spec.name, gpu, q, cands, stats, notes=notes)
    if not cands:
        from .diagnose import diagnose

        result.diagnosis = diagnose(spec, gpu, q, result, oracle)
    return result


# Without a global batch, a group whose room allows micro-batches up to this many is bounded over all of them and
# judged only when taken (_search_group); above it, its memory is judged first (the bound's op lists at every
# micro-batch up to the room's would cost more than the engine calls they save)
LAZY_LIMIT = 64

# The fastest groups kept beyond --top (POOL x --top of them): the spares for the plans the host-memory verdict
# rejects (offloaded plans: fit_rule.host_verdict, which the device-only search does not judge).
POOL = 4


def timed_settings() -> tuple[str, ...]:
    """The settings the search turns on that change the step time, not the table's columns: every stack's [plan]
    switches and the TIMED settings (report/plan.py prints them per plan)."""
    from ..stacks import get_stack, names

    switched = {k: None for name in names() for k in get_stack(name).facts.get("plan", {}).get("switches", {})}
    return tuple({**{a.name: None for a in TIMED}, **switched})


def _search_stack(spec, gpu, q, lay: Layout, stack: str, oracle: PeakOracle, floors: Floors, gseqs, bcap, splits_all,
                  stats: dict, fitting: list, module_sets, extra: dict, level: int | None,
                  timed: list[dict] = ({},), judge_first: bool = False) -> None:
    """Every (precision, ZeRO, recompute, modules) group of `lay` under `stack` with the settings `extra`, each with
    the TIMED settings' assignments `timed` (space.timed_variants)."""
    facts = get_stack(stack)
    seen = stats["stacks"][stack]["axes"]
    for a in SEARCHED:
        if a.name in facts.axes:
            seen.setdefault(a.name, set()).add(getattr(lay, a.name))
    for a in TIMED:
        if a.name in facts.axes:
            seen.setdefault(a.name, set()).update(v.get(a.name, a.default) for v in timed)
    groups = []  # (precision, ZeRO, recompute, modules) of each group the stack's layout rules let through
    for prec in q.precisions_for(stack):
        # the ranks --zero shards over: dp, × cp where the stack shards over the context-parallel ranks
        shard = lay.dp * (lay.cp if "cp" in facts.zero_shard_axes else 1)
        for zero in (q.zeros_for(stack) if shard > 1 or extra.get("offload", "none") != "none" else (0,)):
            if facts.runs_layout(lay.dp, lay.tp, lay.pp, zero, prec) is not None:
                continue  # e.g. torchtitan's DDP beside tensor/pipeline parallelism
            groups += [(prec, zero, r, m) for r in q.recomputes_for(stack)
                       for m in (module_sets if r == "selective" else (None,))]
    stats["groups"] += len(groups)
    stats["stacks"][stack]["groups"] += len(groups)
    if splits_all is not None:  # every split × assignment of every group, those the stack's code refuses too
        stats["searched"] += len(groups) * len(splits_all) * len(timed)
    group_args = _LayoutArgs(spec, gpu, q, lay, oracle, floors, gseqs, bcap, splits_all, stats, stack, extra, level,
                             timed, judge_first, {})
    if level is None and splits_all is not None and not judge_first and len(groups) > 1:
        entry = _layout_entry(group_args, groups)  # its groups built when the search takes it
        if entry is not None:
            fitting.append(entry._replace(order=len(fitting)))
        return
    for group in groups:
        cancel.check()  # (the web's time limit and disconnects)
        _search_group(group_args, group, fitting)


def plan_switches(stack: str, lay: Layout, gpu: GPU, zero: int) -> dict:
    """The settings every plan of `stack` runs with (stacks/*.toml [plan] switches: Megatron's TP communication overlap,
    fused cross entropy and parameter-gather overlap, torchtitan's async TP, DeepSpeed's overlap_comm), each where the
    setup takes it: --tp-comm-overlap where there is TP to overlap (setup/rules.py), the data-parallel overlaps where
    ZeRO shards over more than one rank. NB: AMD plans keep the TP overlap and TE's loss off (TE's userbuffers and
    Triton loss, torch's symmetric memory read for CUDA only): errs slow there."""
    switches = dict(get_stack(stack).facts.get("plan", {}).get("switches", {}))
    if lay.tp <= 1 or gpu.vendor != "nvidia":
        switches.pop("tp_comm_overlap", None)
    if gpu.vendor != "nvidia":
        switches.pop("loss_fusion", None)
    if zero < 1 or lay.dp * lay.cp <= 1:  # no sharded parameters to gather (Megatron-Bridge: data_parallel_size > 1)
        switches.pop("overlap_param_gather", None)
    if zero not in get_stack(stack).facts.get("overlap_comm", {}).get("choice", ()):  # (DeepSpeed's: ZeRO-1/2)
        switches.pop("overlap_comm", None)
    return switches


class _LayoutArgs(NamedTuple):
    """What a layout's groups under one stack share (_search_stack): the search's fixed parts, the layout's splits,
    the stack, the settings `extra`, the knob level, the TIMED assignments and the judging mode."""
    spec: ModelSpec
    gpu: GPU
    q: PlanQuery
    lay: Layout
    oracle: PeakOracle
    floors: Floors
    gseqs: float | None
    bcap: int
    splits_all: tuple | None
    stats: dict
    stack: str
    extra: dict
    level: int | None
    timed: list
    judge_first: bool
    bases: dict  # each group's _group_base (its setup and switches, or the error it raised), built once: _built_base


def _memory_keys(args: _LayoutArgs, group: tuple, switches: dict) -> tuple[tuple, tuple]:
    """(the group's family: the key of its capacity and stage states, its settings but the recompute policy and
    modules, which neither reads; the key of its saved bytes, its settings but the ZeRO stage, which they never read)
    (PeakOracle.capacity, micro_batch_room)."""
    prec, zero, rec, modules = group
    extra_key = tuple(sorted((args.extra or {}).items()))
    return (("family", (args.lay, zero, prec, args.stack, extra_key, tuple(switches))),
            (args.lay, prec, args.stack, extra_key, rec, modules))


def _search_group(args: _LayoutArgs, group: tuple, fitting: list) -> None:
    """The group's splits, under each of its TIMED assignments `timed` (one memory judgement for all of them: the
    memory never reads those settings), appended to `fitting` as one GROUP entry (_Entry with its _Pending splits)
    bounded by the best of its splits' bounds from their layers (Floors.of_splits: one per split for every group of
    the layout), which _time_best_first judges and refines for the entries it takes; none where its room (each
    stage's states and saved bytes alone: PeakOracle.micro_batch_room) admits no split. `judge_first`: its memory
    judged now, the splits above its largest fitting micro-batch never bounded (Space.judge_first).
    Its memory is judged before its assignments are built (memory never reads them: memory_key), so the
    assignments the stack's code rules refuse (stats["stack_refused"]) are found only in the groups whose memory may
    fit. `args`: the layout's (_search_stack's group_args); `group`: (precision, ZeRO, recompute, modules)."""
    spec, gpu, q, lay, oracle, floors, gseqs, bcap, splits_all, stats, stack, extra, level, timed, judge_first, _ = \
        args
    prec, zero, rec, modules = group
    try:
        base, switches = _built_base(args, group)
    except NotModelledError as e:  # a setup the analytic engine has not derived (e.g. Nemotron-H under ZeRO-3)
        _not_modelled(stats, e, len(timed))
        return
    except SetupError:  # a combination the stack's own rules refuse (stacks/<stack>.py refuse), e.g. its expert layout
        stats["stack_refused"] = stats.get("stack_refused", 0) + len(timed)
        return
    # The fit rule's capacity: the GPU less --reserve and this layout's fixed overheads (context, cuBLAS workspace,
    # its NCCL communicators), which do not depend on the micro-batch or the accumulation, keyed on the group's family
    family, saved_key = _memory_keys(args, group, switches)
    cap = oracle.capacity(gpu, base, reserve_bytes(q.reserve), key=family)
    # Memory depends on the accumulation only through "more than one micro-batch" (earlier micro-batches'
    # gradients stay live) and the 1F1B depth min(pp, accum) = pp; so two largest batches cover every split.
    # The largest micro-batch that fits is judged when one of the group's splits is first about to be timed
    # (_Unsettled: two engine calls bound it, lo fits and hi is the secant's; a split between them is settled when
    # timed, _time_best_first); a group none of whose splits is timed costs none. A split for which any pipeline
    # stage's states and saved bytes alone outgrow the capacity cannot fit: the group's room (PeakOracle.
    # micro_batch_room, no engine call; the states read no recompute policy, the saved bytes no ZeRO stage) caps the
    # micro-batch first.
    room = oracle.micro_batch_room(base, cap, family, saved_key)
    spans: dict[bool, _Unsettled] = {}
    verdict = _Group(stats)

    def span(multi: bool) -> _Unsettled:
        if multi not in spans:
            probe = base if (lay.pp > 1 or not multi) else base.with_micro_batches(1, 2)
            # (at the probe's accumulation the room caps the micro-batch its engine calls look for)
            limit = room.largest(lay.pp, lay.vpp, probe.grad_accum, bcap)
            spans[multi] = _Unsettled(oracle, probe, cap, limit, verdict)
        return spans[multi]

    allowed = counted = None  # (a group judged when timed: the micro-batches of its splits, _Judged)
    if splits_all is None:  # no global batch: accumulation fills the pipeline, micro-batch up to the largest fit
        probe = span(lay.pp > 1)
        # (searched: the splits up to the largest micro-batch its room allows, before its memory is judged; with a
        # global batch, _search_stack counts them)
        counted = len(batch_splits(lay, None, probe.limit, q.batch_tolerance)) if not probe.hopeless else 0
        stats["searched"] += counted * len(timed)
        if probe.hopeless:
            splits = ()
        elif not judge_first and probe.limit <= LAZY_LIMIT:
            # its splits' micro-batches run up to the largest that fits, which only its memory tells: bounded over
            # every micro-batch its room allows, its memory judged only when one of them is about to be timed
            splits = [(b, lay.pp if lay.pp > 1 else 1) for b in range(1, probe.limit + 1)]
            allowed = _Judged(probe, lay, q.batch_tolerance)
        else:
            splits = batch_splits(lay, None, probe.largest(), q.batch_tolerance)
            counted = None
    else:
        splits = splits_all
    # the group's splits its room does not rule out (and under `judge_first` its memory), each with its bound
    # from the layers (Floors.of_splits, shared by the layout's groups of the same splits), entered as one entry at
    # the best of them (GROUP), its memory judged and its splits entered when the search takes it (_Pending.entries)
    # (the room at the splits' least accumulation, the fewest micro-batches in flight, caps every split's)
    largest = room.largest(lay.pp, lay.vpp, min((a for _, a in splits), default=1), bcap)
    kept = tuple((b, accum) for b, accum in splits if b <= largest
                 and not span(accum > 1).hopeless and not (judge_first and b > span(accum > 1).hi))
    if not kept:  # every setup of the group, whatever its TIMED assignment (memory never reads them: memory_key)
        verdict.judged(False)
        return
    bounded = floors.of_splits(base, state_bytes(base), kept, rerun=True)
    key = (lay, zero, rec, prec, stack, modules, tuple(sorted((extra or {}).items())), level)
    neg, b, accum, _ = min(bounded)
    # (its TIMED assignments' setups are built when it is taken: _assignments; until then its one setup stands for
    # them all, which its bound and its memory never tell apart)
    fitting.append(_Entry(neg, len(fitting), key, b, accum, GROUP, (((), base),),
                          pending=_Pending(bounded, span, (spec, timed), allowed, counted)))


def _assignments(spec: ModelSpec, base: Setup, timed: list[dict], stats: dict) -> tuple:
    """(assignment, setup) of each of a group's TIMED assignments `timed` that the stack's rules take, the defaults
    first (`base`); those refused counted in stats["stack_refused"]."""
    out = [((), base)]
    for v in timed[1:]:
        try:
            variant = base.with_exchange(**v)
            check_stack_model(spec, variant)  # (and the stack's rules on the model: Megatron's overlap beside MTP)
            out.append((tuple(sorted(v.items())), variant))
        except SetupError:  # e.g. Megatron's --overlap-moe-comm under full recompute (stacks/megatron.py)
            stats["stack_refused"] = stats.get("stack_refused", 0) + 1
    return tuple(out)


def _not_modelled(stats: dict, e: NotModelledError, setups: int) -> None:
    """Count `setups` the analytic engine does not model (stats["not_modelled"]), keeping the first reason."""
    stats["not_modelled"] = stats.get("not_modelled", 0) + setups
    stats.setdefault("not_modelled_why", str(e))


def _probe_accum(lay: Layout) -> int:
    """The accumulation of a group's memory probe: interleaving keeps more in flight as the accumulation grows until
    the warm-up saturates (pipeline.in_flight: rank 0 at m >= 2·pp, m a multiple of pp), so that depth bounds every
    split's."""
    return (2 * lay.pp if lay.vpp > 1 else lay.pp) if lay.pp > 1 else 1


def _group_base(args: _LayoutArgs, group: tuple) -> tuple[Setup, dict]:
    """(the group's setup at its memory probe — micro-batch 1, _probe_accum — with the stack's plan switches, the
    switches set): without the switches where their own rules refuse the group (torchtitan's async TP: compile).
    SetupError where the stack's rules refuse the group itself; NotModelledError where the analytic engine has not
    derived its terms (analytic/unmodelled.check_training_setup: the search leaves it out and says so)."""
    spec, gpu, q, lay, stack, extra = args.spec, args.gpu, args.q, args.lay, args.stack, args.extra
    prec, zero, rec, modules = group
    switches = plan_switches(stack, lay, gpu, zero)
    shared = dict(batch=1, seq=q.seq, grad_accum=_probe_accum(lay), precision=prec, optimizer=q.optimizer,
                  sequence_parallel=lay.tp > 1, stack=stack, **lay.settings(get_stack(stack).etp_default),
                  **(extra or {}))
    own = dict(recompute=rec, zero=zero, **({"recompute_modules": modules} if modules else {}))
    layout = _layout_base(args, prec, shared)
    try:
        base = _derived(spec, layout, shared, {**own, **switches})
    except SetupError:
        if not switches:
            raise
        base = _derived(spec, layout, shared, own)  # a group the switches' own rules refuse (torchtitan's: compile)
        switches = {}
    if extra:
        validate_layout(args.oracle.spec, base)  # the model takes them (Liger's families, gated MLPs, Ulysses' heads)
    else:  # the stack's rules on the model (torchtitan's gpt_oss: bf16 blocks, no TP/CP/PP), as every engine's entry
        check_stack_model(args.oracle.spec, base)
    check_training_setup(args.oracle.spec, base)  # NotModelledError where the engine has not derived its terms
    return base, switches


def _layout_base(args: _LayoutArgs, prec: str, shared: dict) -> Setup | None:
    """The setup of a layout's groups of one precision at their defaults (no recompute, ZeRO-0, no switch), built
    once per layout (args.bases): each group's setup is derived from it (_derived), so Setup.with_ checks one by one
    only the settings the group sets (its recompute, ZeRO stage, modules, switches) where group_setup would check
    all of the layout's again. None where that default setup is itself refused (or not a plain model's: group_setup's
    vision path): its groups are built from the template (_derived)."""
    key = ("layout", prec)
    if key not in args.bases:
        try:
            layout = group_setup(args.spec, **shared) if _templated(args.spec) else None
        except SetupError:
            layout = None
        args.bases[key] = layout
    return args.bases[key]


def _derived(spec: ModelSpec, layout: Setup | None, shared: dict, own: dict) -> Setup:
    """group_setup(spec, **shared, **own): `layout` (the same `shared` settings, validated) with `own` set, which
    Setup.with_ validates as it validates every setup (the rules that tie settings together all run again; the
    values of the settings not set passed for this mode already), or the template's where there is no `layout`.
    The same Setup either way (tests/plan/test_search_exact.py)."""
    return group_setup(spec, **shared, **own) if layout is None else layout.with_(**own)


def _built_base(args: _LayoutArgs, group: tuple) -> tuple[Setup, dict]:
    """_group_base(args, group), built once per layout (args.bases): a layout's entry builds some of its groups'
    setups to bound it, and the search builds them all again when it takes the layout. The error it raised, again."""
    got = args.bases.get(group)
    if got is None:
        try:
            got = args.bases[group] = _group_base(args, group)
        except (NotModelledError, SetupError) as e:
            args.bases[group] = e
            raise
    if isinstance(got, Exception):
        raise got.with_traceback(None)  # (its first traceback dropped, not grown by each raise)
    return got


def _layout_entry(args: _LayoutArgs, groups: list[tuple]) -> "_Entry | None":
    """One LAYOUT entry for a layout's `groups` under one stack, bounded by the most tokens/s any of them could
    reach: for each (precision, ZeRO stage), the best of Floors.of_splits over the splits the loosest of its rooms
    allows (each stage's states of that ZeRO stage, its saved bytes under the recompute policy and modules that
    save least: the room of every group is no looser, PeakOracle.micro_batch_room), which is a group's own bound
    over a superset of its splits (_search_group: its key and state bytes read no recompute policy, Floors.of_splits
    none; the ZeRO stage through the state bytes and the switches, hence one per stage; the switches read the ZeRO
    stage, not the policy: plan_switches and the rules that refuse them). The setups it builds are
    one per ZeRO stage and one per policy of each precision, not one per group; the groups are built when the
    search takes the entry (_Lazy.entries). None where no group can fit (or the stack refuses them all)."""
    gpu, lay, oracle, splits_all = args.gpu, args.lay, args.oracle, args.splits_all
    reserve = reserve_bytes(args.q.reserve)
    least = min(accum for _, accum in splits_all)
    negs = []
    for prec in dict.fromkeys(g[0] for g in groups):
        def base_of(g: tuple) -> tuple[Setup, dict] | None:  # (_built_base's, None where the stack refuses it)
            try:
                return _built_base(args, g)
            except NotModelledError as e:  # (its reason kept; its setups counted if its layout is taken)
                _not_modelled(args.stats, e, 0)
            except SetupError:
                pass
            return None

        mine = [g for g in groups if g[0] == prec]
        zeros, policies = dict.fromkeys(g[1] for g in mine), dict.fromkeys(g[2:] for g in mine)
        # a group of each ZeRO stage whose policy the stack takes, of each policy at a stage it takes
        by_zero = {z: next((g for g in mine if g[1] == z and base_of(g) is not None), None) for z in zeros}
        by_policy = {p: next((g for g in mine if g[2:] == p and base_of(g) is not None), None) for p in policies}
        saved = []  # (policy, its saved-bytes key), its bytes memoised from a setup of its own
        for p, g in by_policy.items():
            if g is not None:
                base, switches = base_of(g)
                family, key = _memory_keys(args, g, switches)
                oracle.micro_batch_room(base, oracle.capacity(gpu, base, reserve, key=family), family, key)
                saved.append((p, key))
        for g in by_zero.values():
            if g is None:
                continue
            base, switches = base_of(g)
            family = _memory_keys(args, g, switches)[0]
            cap = oracle.capacity(gpu, base, reserve, key=family)
            st = state_bytes(base)
            # the policies that re-run whole layers bounded each with its re-run over the splits its room allows;
            # the others together without one, over the splits the loosest of their rooms allows
            rest = 0
            for (rec, modules), key in saved:
                largest = oracle.micro_batch_room(base, cap, family, key).largest(lay.pp, lay.vpp, least, args.bcap)
                if rec.split(":", 1)[0] not in WHOLE_LAYER:
                    rest = max(rest, largest)
                    continue
                kept = tuple((b, accum) for b, accum in splits_all if b <= largest)
                if kept:
                    x = base.keyed((("recompute", rec), ("recompute_modules", modules)))
                    negs.append(min(args.floors.of_splits(x, st, kept, rerun=True))[0])
            kept = tuple((b, accum) for b, accum in splits_all if b <= rest)
            if kept:
                negs.append(min(args.floors.of_splits(base, st, kept))[0])
    if not negs:  # every group's room rules out every split (or the stack refuses every group): none built
        return None
    key = ("layout", lay, args.stack, tuple(sorted((args.extra or {}).items())), args.level)
    return _Entry(min(negs), 0, key, 0, 0, LAYOUT, (),
                  pending=_Lazy(args, groups, len(groups) * len(splits_all) * len(args.timed)))


class _Lazy:
    """A LAYOUT entry's groups, built when the search takes it (_layout_entry); `setups`: their splits × TIMED
    assignments."""

    __slots__ = ("args", "groups", "setups")

    def __init__(self, args: _LayoutArgs, groups: list[tuple], setups: int):
        self.args, self.groups, self.setups = args, groups, setups

    def entries(self, e: "_Entry", stats: dict) -> list["_Entry"]:
        """Its groups' GROUP entries (_search_group), none bounded above `e`'s bound; counted in
        stats["layouts_taken"]."""
        stats["layouts_taken"] = stats.get("layouts_taken", 0) + 1
        out: list[_Entry] = []
        for group in self.groups:
            cancel.check()  # (the web's time limit and disconnects)
            _search_group(self.args, group, out)
        return out

    def count(self, e: "_Entry") -> int:
        """The setups of its groups (_skipped)."""
        return self.setups


class _Unsettled:
    """A group's memory probe (its setup at the probe's accumulation, the capacity, the largest micro-batch the batch
    constraint and the group's room allow), judged only when the search takes one of its splits: `hopeless` at once
    where that is none (the room: PeakOracle.micro_batch_room, no engine call); else the largest micro-batch that
    fits lies in [lo, hi] (PeakOracle.batch_bounds: two engine calls, on first asking), settled by
    PeakOracle.largest_batch the first time a split between them is asked about (`fits`). Each verdict is told to
    its group (_Group)."""

    __slots__ = ("oracle", "probe", "capacity", "limit", "group", "hopeless", "_bounds", "_largest")

    def __init__(self, oracle: PeakOracle, probe: Setup, capacity: int, limit: int, group: "_Group"):
        self.oracle, self.probe, self.capacity, self.limit = oracle, probe, capacity, limit
        self.group, self._bounds, self._largest = group, None, None
        self.hopeless = limit < 1

    @property
    def lo(self) -> int:
        return self._judged()[0]

    @property
    def hi(self) -> int:
        return self._judged()[1]

    def _judged(self) -> tuple[int, int]:
        if self._bounds is None:
            self._bounds = self.oracle.batch_bounds(self.probe, self.capacity, self.limit)
            self.group.judged(self._bounds[0] >= 1)
            if self._bounds[0] == self._bounds[1]:
                self._largest = self._bounds[0]
        return self._bounds

    def largest(self) -> int:
        if self._largest is None:
            self._judged()
        if self._largest is None:
            self._largest = self.oracle.largest_batch(self.probe, self.capacity, self.limit)
        return self._largest

    def fits(self, b: int) -> bool:
        return b <= self.lo or (b <= self.hi and b <= self.largest())

    def settled(self, b: int) -> bool | None:
        """Whether micro-batch `b` fits, where it is known without an engine call (the probe judged, b at or below
        its lo or above its hi); None where it is not."""
        if self._bounds is None:
            return None
        return True if b <= self._bounds[0] else False if b > self._bounds[1] else None


class _Group:
    """A group's memory verdict, counted into the search's stats as the search finds it: `memory_judged` (groups
    whose memory was judged: their states alone, or a probe's engine calls) and `fits` (of them, those whose
    micro-batch of 1 fits)."""

    __slots__ = ("stats", "seen", "fit")

    def __init__(self, stats: dict):
        self.stats, self.seen, self.fit = stats, False, False

    def judged(self, fits: bool) -> None:
        if not self.seen:
            self.seen = True
            self.stats["memory_judged"] = self.stats.get("memory_judged", 0) + 1
        if fits and not self.fit:
            self.fit = True
            self.stats["fits"] += 1


# An entry's bound (_time_best_first): a group's, the best of its splits' from their layers (Floors.of_splits);
# a split's from its layers alone (Floors.of_layers), with nothing recomputed and no expert exchanges, with its
# group's recompute and no exchanges (all its assignments), its one setup's own
LAYOUT, GROUP, LAYERS, COARSE, SHARED, EXACT = -3, -2, -1, 0, 1, 2


def _start(setup: Setup, variants: int) -> int:
    """The first level an entry of a group is bounded at past LAYERS: a selective policy's re-run is a few modules',
    so its entries start from the bound of nothing re-run, which the layout's groups share; the others re-run whole
    layers, or nothing, and start from their own recompute (with several TIMED assignments, without the exchanges)."""
    return COARSE if setup.recompute == "selective" else SHARED if variants > 1 else EXACT


def _start_floor(floors: Floors, setup: Setup, st, level: int) -> float:
    """The floor of `setup` at an entry's `level` (COARSE, SHARED or EXACT)."""
    return floors.below_every_policy(setup, st) if level == COARSE else floors.without_exchanges(setup, st) \
        if level == SHARED else floors(setup, st)


class _Entry(NamedTuple):
    """A fitting split of a group, best first by its bound (the most tokens/s its setups could reach; under --efficiency
    the flat override's), then by `order` (the setups are never compared). `variants`: (TIMED assignment, setup) pairs:
    the group's setups (at its probe micro-batch) until EXACT, whose one setup is at (b, accum)."""
    neg_bound: float
    order: int
    key: tuple
    b: int
    accum: int
    level: int
    variants: tuple
    unsettled: _Unsettled | None = None  # the group's probe where this split's fit is not settled (b above its lo)
    pending: "_Pending | None" = None  # a GROUP entry's splits, entered when it is taken


class _Pending:
    """A group's splits not yet entered: (negated bound, micro-batch, accumulation, whether from the layers) of
    each (Floors.of_splits: its entry starts at LAYERS, else at COARSE), with the group's memory probes (`span`) and
    its (model, TIMED assignments), whose setups are built when it is taken (_assignments)."""

    __slots__ = ("splits", "span", "timed", "allowed", "counted")

    def __init__(self, splits: list, span: Callable[[bool], _Unsettled], timed: tuple,
                 allowed: "_Judged | None" = None, counted: int | None = None):
        self.splits, self.span, self.timed, self.allowed, self.counted = splits, span, timed, allowed, counted

    def count(self, e: "_Entry") -> int:
        """The setups of the group entry `e`: its splits (`counted`, as `searched` counts them, where its splits are
        the candidates of a group judged when taken) × its TIMED assignments (those the stack's rules would refuse
        too: they are judged when it is taken)."""
        return len(self.timed[1]) * (len(self.splits) if self.counted is None else self.counted)

    def entries(self, e: "_Entry", stats: dict) -> list["_Entry"]:
        """The group entry `e`'s splits that its memory does not rule out (judged when first needed: a split above
        its probe's known fit is settled when taken), as entries of their own, each with the group's TIMED
        assignments the stack's rules take, and starting at LAYERS or COARSE, its own floors from _start's level."""
        out = []
        variants = _assignments(self.timed[0], e.variants[0][1], self.timed[1], stats)
        start = _start(variants[0][1], len(variants))
        judged = self.allowed
        for neg, b, accum, layers in self.splits:
            if judged is not None and judged.known() and not judged.fits(b):
                continue  # (not one of the group's splits: above its largest fitting micro-batch, or not of them)
            level = LAYERS if layers else COARSE
            probe = self.span(accum > 1)
            if probe.settled(b) is False:
                stats["memory_rejected_splits"] = stats.get("memory_rejected_splits", 0) + len(variants)
                continue
            first = variants[0][1].with_micro_batches(b, accum)
            if judged is not None:  # (its membership, judged when one of its splits is about to be timed)
                check = None if judged.known() else judged
            else:
                check = None if probe.settled(b) else probe
            out.append(_Entry(neg, 0, e.key, b, accum, level,
                              ((variants[0][0], first),) if start == EXACT and level != COARSE else variants, check))
        return out


class _Judged:
    """The splits of a group without a global batch (space.batch_splits: micro-batches 1, 2, 4, ... up to its largest
    fitting one and that one, at the accumulation filling its pipeline), which only its memory tells: judged on first
    asking (its probe's largest: PeakOracle.largest_batch), when one of them is about to be timed. `fits(b)`: b is
    one of them (an _Entry's `unsettled`, as _Unsettled is)."""

    __slots__ = ("probe", "lay", "tolerance", "_bs")

    def __init__(self, probe: _Unsettled, lay: Layout, tolerance: float):
        self.probe, self.lay, self.tolerance, self._bs = probe, lay, tolerance, None

    def known(self) -> bool:
        return self._bs is not None

    def fits(self, b: int) -> bool:
        if self._bs is None:
            self._bs = {x for x, _ in batch_splits(self.lay, None, self.probe.largest(), self.tolerance)}
        return b in self._bs


def _skipped(stats: dict, e: _Entry) -> None:
    """Count an entry's setups the bound skips (`bounded`; of them, `bounded_unsettled`: those whose fit was never
    settled, a split above its group's known fit)."""
    n = e.pending.count(e) if e.pending is not None else len(e.variants)
    stats["bounded"] = stats.get("bounded", 0) + n
    if e.unsettled is not None or e.pending is not None:
        stats["bounded_unsettled"] = stats.get("bounded_unsettled", 0) + n


def _refined(e: _Entry, floors: Floors) -> list[_Entry]:
    """A LAYERS entry bounded from its stage's own lists at the level its group starts from (_start), a COARSE one
    with its recompute policy (SHARED, or EXACT for one assignment), or a SHARED one split into its assignments
    (EXACT, each setup at the entry's split)."""
    first = e.variants[0][1].with_micro_batches(e.b, e.accum)
    if e.level == LAYERS:
        start = _start(first, len(e.variants))
        return [e._replace(neg_bound=-tokens_bound(first, _start_floor(floors, first, state_bytes(first), start)),
                           level=start)]
    if e.level == COARSE and len(e.variants) > 1:
        return [e._replace(neg_bound=-tokens_bound(first, floors.without_exchanges(first, state_bytes(first))),
                           level=SHARED)]
    out = []
    for v, x in e.variants:
        x = first if x is e.variants[0][1] else x.with_micro_batches(e.b, e.accum)
        out.append(e._replace(neg_bound=-tokens_bound(x, floors(x, state_bytes(x))), level=EXACT, variants=((v, x),)))
    return out


def _time_best_first(gpu: GPU, q: PlanQuery, oracle: PeakOracle, floors: Floors, fitting: list, best: dict,
                     stats: dict, spares: bool | None = None, shared=None) -> None:
    """Time the fitting setups, highest bound first, into `best` (each group's fastest over its splits and TIMED
    assignments: one plan per group). Exact: a setup is skipped only where its bound — the most tokens/s it could
    reach — is below its own group's best so far or below the --top fastest groups' (POOL x --top where offloaded
    setups may be rejected later: the spares), so its group's best cannot change or could not enter the ranking's
    head; once the bound falls below the pool's, every later one does. A GROUP entry taken has its memory judged and
    its splits that may fit entered (_Pending.entries), each at LAYERS (its bound from its layers: Floors.of_layers;
    taken, bounded from its stage's own lists at its group's first level, _refined) or COARSE (a group's TIMED
    assignments at one split, bounded with nothing recomputed and no expert exchanges: Floors.below_every_policy);
    taken, a COARSE entry is bounded again with its own recompute policy (SHARED: Floors.without_exchanges, which
    none of its assignments can beat) or, one assignment alone, with its own floor (EXACT), and put back; a SHARED
    entry taken is split into its assignments, each with its own floor. Every bound is at or above the next (tests/plan/
    test_floors.py), so the order stays best first. `stats`: timed, bounded (setups skipped). `spares`: keep the POOL
    of spares whatever the setups, or none (False: a parallel search's share of the plain pass, which offloads
    nothing); None: where any setup is offloaded. `shared`: the parallel search's threshold (plan/parallel.py
    Threshold), the `size`-th fastest tokens/s of the groups every share has timed so far, below which a setup cannot
    enter the whole search's `size` fastest either: skipped as below this share's own; told this share's fastest."""
    # the fastest groups' best tokens/s, at most `size` of them: --top, or the POOL of spares where the host-memory
    # verdict may reject some (offloaded setups)
    if spares is None:
        spares = any(x.offload != "none" for e in fitting for _, x in e.variants)
    size, top = q.top * (POOL if spares else 1), {}
    reserve = reserve_bytes(q.reserve)
    heap = list(fitting)
    heapq.heapify(heap)  # (entries differ in their order: the setups are never compared)
    order = len(fitting)
    while heap:
        e = heapq.heappop(heap)
        if ((len(top) == size and -e.neg_bound < min(top.values()))
                or (shared is not None and -e.neg_bound < shared.value)):
            for x in [e, *heap]:
                _skipped(stats, x)
            return
        old = best.get(e.key)
        if old is not None and -e.neg_bound < -old[0][0]:  # none of its setups can beat its group's best
            _skipped(stats, e)
            continue
        if e.pending is not None:  # a group taken: its memory judged, its splits that may fit entered
            for split in e.pending.entries(e, stats):
                heapq.heappush(heap, split._replace(order=order))
                order += 1
            continue
        if e.level != EXACT:
            for refined in _refined(e, floors):
                heapq.heappush(heap, refined._replace(order=order))
                order += 1
            continue
        if e.unsettled is not None and not e.unsettled.fits(e.b):  # its memory, settled: it does not fit
            stats["memory_rejected_splits"] = stats.get("memory_rejected_splits", 0) + 1
            continue
        key, b, ((_, setup),) = e.key, e.b, e.variants
        if setup.moe_dispatcher in OWN_BUFFERS and not oracle.fits(setup, capacity(gpu, setup, reserve, oracle.spec)):
            # its dispatcher's own buffers beside the allocator leave less than its group's capacity (the
            # defaults', which admitted the split: _search_group)
            stats["memory_rejected_splits"] = stats.get("memory_rejected_splits", 0) + 1
            continue
        cancel.check()
        # the estimate's step time (NB: without paged optimizer states' migration, which the estimate adds where the
        # device cannot hold them all: rank optimistic for a paged optimizer on a full GPU; the plan shows the
        # estimate's)
        tm = layout_step_time(oracle.spec, setup, gpu, q.efficiency, oracle.pc)
        stats["timed"] += 1
        lay, zero, rec, prec, stack, modules, extra, _ = key
        # rank: fastest first; ties to the larger micro-batch (bigger GEMMs run faster in practice), less ZeRO,
        # less recompute (Megatron's default modules first), then the stacks' order as given
        rank = (-tm.tokens_per_second, -b, zero, recompute_rank(rec), modules or "",
                q.precisions_for(stack).index(prec), lay.pp, lay.tp, lay.cp, lay.vpp, lay.pp_split, lay.ep,
                lay.etp or lay.tp, setup.moe_dispatcher or "", setup.overlap_moe_comm, q.stacks.index(stack), extra)
        if old is None or rank < old[0]:
            best[key] = (rank, (setup, tm))
            if key in top or len(top) < size:
                top[key] = tm.tokens_per_second
            elif tm.tokens_per_second > min(top.values()):
                del top[min(top, key=top.get)]
                top[key] = tm.tokens_per_second
            if shared is not None and key in top:
                shared.publish(top.values())  # (for the other shares: plan/parallel.py Threshold)
