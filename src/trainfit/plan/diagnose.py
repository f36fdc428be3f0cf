"""When nothing fits: say why, and what would — the fewest GPUs of this type, or which knob to turn."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..analytic import fit_rule
from ..analytic.fit_rule import reserve_bytes
from ..analytic.step_time import layout_step_time
from ..analytic.unmodelled import check_training_setup
from ..cluster import larger_in_nodes
from ..engines import analytic
from ..errors import NotModelledError, SetupError
from ..hardware import GPU
from ..setup import Setup
from ..units import fmt_bytes
from ..analytic.layout import check_stack_model, validate_layout
from .fit import PeakOracle
from .knobs import LEVELS as KNOB_LEVELS, judged_knobs, levels as knob_levels, setup_flags
from .space import Layout, Where, divisors, layouts, tp_allowed, variants

MAX_GPUS = 1 << 17


@dataclass
class Diagnosis:
    reason: str  # "layout", "batch" or "memory"
    message: str
    leanest_device_total: int | None = None  # the leanest plan's device total at micro-batch 1 (the estimate's)
    leanest_setup: Setup | None = None
    min_gpus: int | None = None
    suggestions: list[str] = field(default_factory=list)
    leanest_time: dict | None = None  # the leanest plan timed anyway (StepTime.as_dict()), beside its verdict


def leanest(spec, gpu: GPU, q, gpus: int, oracle: PeakOracle, level: int | None = None) -> tuple[int | None, Setup | None]:
    """The leanest plan of `gpus` GPUs that the query allows (its fixed --tp/--pp, and --dp when `gpus` is the
    query's count; micro-batch 1, the most ZeRO and recompute searched): (its shortfall, its setup), the shortfall
    being what the step's tensors need beyond the fit rule's capacity (analytic/fit_rule.py: required − capacity(gpu,
    setup, --reserve); <= 0 fits), as the search judges it. (None, None) when no layout is allowed. `level`: under
    that level's memory knobs (plan/knobs.py LEVELS), as the search tries them when no plain plan fits."""
    from ..stacks import get_stack
    from .search import planned_setup

    reserve = reserve_bytes(q.reserve)
    best, where = None, None
    for lay in layouts(oracle.spec, gpus, gpu.gpus_per_node, q.tp, q.pp, q.dp if gpus == q.gpus else None):
        for stack in q.stacks:
            recs, zeros = q.recomputes_for(stack), q.zeros_for(stack)
            for prec in q.precisions_for(stack):
                # the most ZeRO the stack runs here and the analytic engine models (as the search leaves the rest out)
                for zero in (sorted(zeros, reverse=True) if lay.dp > 1 else (0,)):
                    if get_stack(stack).runs_layout(lay.dp, lay.tp, lay.pp, zero, prec) is not None:
                        continue
                    modelled = False
                    lean = _most_sharded_experts(oracle.spec, gpu, q, lay, stack)
                    extras = [{}] if level is None else knob_levels(oracle.spec, stack, lay, q.seq, judged_knobs(q.knobs, gpu))[level]
                    for rec, extra in ((r, x) for r in (("full",) if "full" in recs else recs) for x in extras):
                        try:
                            s = planned_setup(spec, batch=1, seq=q.seq, grad_accum=max(lay.pp, 1), precision=prec,
                                              optimizer=q.optimizer, recompute=rec, dp=lay.dp, tp=lay.tp, pp=lay.pp,
                                              zero=zero, sequence_parallel=lay.tp > 1, stack=stack, ep=lean.ep,
                                              etp=lean.settings(get_stack(stack).etp_default)["etp"], **extra)
                            if extra:
                                validate_layout(oracle.spec, s)
                            else:  # (the stack's rules on the model, as the search's groups: plan/search.py)
                                check_stack_model(oracle.spec, s)
                            check_training_setup(oracle.spec, s)
                        except NotModelledError:
                            continue  # (the search leaves it out: plan/search.py _group_base)
                        except SetupError:
                            if level is None:
                                raise
                            continue  # a knob the stack's rules refuse here (as the search skips it)
                        modelled = True
                        short = oracle.peak(s) - fit_rule.capacity(gpu, s, reserve, oracle.spec)
                        if best is None or short < best:
                            best, where = short, s
                    if modelled:
                        break
    return best, where


def _most_sharded_experts(spec, gpu: GPU, q, lay: Layout, stack: str) -> Layout:
    """A MoE model's leanest expert layout of `lay` on `stack`: of the (ep, etp) the search tries there (space.SEARCHED,
    the axes the stack runs), the one with the most ep × etp. NB: taken as the leanest because each rank's expert
    weights and gradients shrink with ep · etp while the expert states, sharded over the dp × cp × tp / (ep · etp)
    expert data-parallel ranks, do not change; the search itself weighs every pair."""
    from ..stacks import get_stack

    run = {"ep", "etp"} & set(get_stack(stack).axes)
    if not run or not spec.is_moe:
        return lay
    return max(variants(spec, lay, Where(q.seq, gpu.gpus_per_node), run), key=lambda v: (v.ep * (v.etp or v.tp), v.ep))


def _experts(s: Setup) -> str:
    """The expert layout of a diagnosis's plan, where there is one ("ep 8, etp 1, ")."""
    return (f"ep {s.ep}, " if s.ep > 1 else "") + (f"etp {s.etp}, " if s.etp is not None else "")


def _fits(short: int | None) -> bool:
    return short is not None and short <= 0


def _counts(start: int, gpn: int):
    """GPU counts worth trying above `start`: 1..gpn within a node, then whole nodes (1, 2, 3, 4, 6, 8, ... nodes)."""
    n = 1
    while n <= gpn:
        if n > start:
            yield n
        n *= 2
    k = 1
    while k * gpn <= MAX_GPUS:
        if k * gpn > start:
            yield k * gpn
        k = k + 1 if k < 4 else (k + k // 2 if k < 16 else k * 2)


def diagnose(spec, gpu: GPU, q, result, oracle: PeakOracle) -> Diagnosis:
    """`spec`: the model as loaded (search's); `oracle`: the search's, on the model the setups train."""
    model = oracle.spec
    if not layouts(model, q.gpus, gpu.gpus_per_node, q.tp, q.pp, q.dp):
        tps = [t for t in divisors(q.gpus) if tp_allowed(model, t, gpu.gpus_per_node)]
        msg = (f"no data × tensor × pipeline layout of {q.gpus} GPUs suits {model.name}: tensor parallelism must divide "
               f"its {model.heads} heads, {model.kv_heads} KV heads and MLP width {model.intermediate} and stay within "
               f"{gpu.gpus_per_node} GPUs of a node (possible here: {tps or 'none'}); pipeline parallelism must divide "
               f"its {model.layers} layers")
        if q.tp or q.pp or q.dp:
            msg += "; drop the fixed --tp/--pp/--dp"
        return Diagnosis("layout", msg)
    if result.stats["batch_unreachable"] == result.stats["layouts"]:
        seqs = q.global_batch_tokens / q.seq
        need = min(lay.dp * lay.pp for lay in layouts(model, q.gpus, gpu.gpus_per_node, q.tp, q.pp, q.dp))
        return Diagnosis("batch", f"a global batch of {q.global_batch_tokens:,.0f} tokens is {seqs:.1f} sequences of "
                         f"{q.seq}: too few to give every data-parallel rank a micro-batch and fill every pipeline on "
                         f"{q.gpus} GPUs; use --global-batch-tokens >= {need * q.seq:,} or fewer GPUs",
                         suggestions=[f"--global-batch-tokens {need * q.seq}"])
    short, where = leanest(spec, gpu, q, q.gpus, oracle)
    d = Diagnosis("memory", "", leanest_setup=where)
    room = f"{fmt_bytes(gpu.memory)} per {gpu.name}" + (f" less --reserve {q.reserve:g} GiB" if q.reserve else "")
    # (report/plan.py prints it after 'nothing fits: ')
    d.message = f"no layout of {q.gpus} GPUs is allowed in {room}"
    if where is not None:  # its fit, device total and time as `trainfit estimate` gives them (timed although it does
        # not fit, issue 14)
        est = analytic(spec, where, gpu, reserve=q.reserve)
        d.leanest_device_total = est.memory.device_total
        d.leanest_time = (est.detail.step_time if q.efficiency is None else
                          layout_step_time(model, where, gpu, q.efficiency, oracle.pc)).as_dict()
        d.message = (f"in {room}, the leanest plan (tp {where.tp}, pp {where.pp}, dp {where.dp}, "
                     f"{_experts(where)}"
                     f"ZeRO-{where.zero}, {where.recompute} recompute, {where.precision}, micro-batch 1) needs "
                     f"{fmt_bytes(est.fit.required)} of the {fmt_bytes(est.fit.capacity)} its tensors may take per GPU "
                     "(the fit rule: the allocated peak + the fragmentation the caching allocator cannot release, "
                     "against the GPU less the CUDA context, cuBLAS workspace and NCCL buffers); run unconstrained "
                     f"it would hold a device total of {fmt_bytes(est.memory.device_total)}")
    if not _fits(short):
        for n in _counts(q.gpus, gpu.gpus_per_node):
            if (q.tp and n % q.tp) or (q.pp and n % q.pp):
                continue
            p, s = leanest(spec, gpu, q, n, oracle)
            if _fits(p):
                d.min_gpus = n
                total = analytic(spec, s, gpu, reserve=q.reserve).memory.device_total
                d.suggestions.append(f"--gpus {n} (the fewest {gpu.name}s that fit: device total {fmt_bytes(total)} "
                                     f"per GPU with tp {s.tp}, pp {s.pp}, dp {s.dp}, {_experts(s)}ZeRO-{s.zero}, "
                                     f"{s.recompute} "
                                     "recompute)")
                break
    if not _fits(short) and result.stats.get("knob_levels"):  # (the levels the search tried: plan/knobs.py)
        d.message += ("; the memory knobs the stacks run (Liger, the tiled MLP, Ulysses" +
                      (", activation and state offload" if gpu.host_memory else "") + ": plan/knobs.py) were searched "
                      "too" + ("" if gpu.host_memory else "; offload is searched where the node's host memory is "
                               "known: add --host-memory GiB or --cluster"))
        for n in _counts(q.gpus, gpu.gpus_per_node):  # fewer GPUs than the plain layouts need, with the knobs
            if d.min_gpus is not None and n >= d.min_gpus:
                break
            if (q.tp and n % q.tp) or (q.pp and n % q.pp):
                continue
            # level by level, as the search (plan/knobs.py); the device judged as the search does, then the node's
            # host memory by the estimate (fit_rule.host_verdict). NB: the leanest of a level is its most offloaded
            # setup, so a less aggressive one of the same level that would fit is not named
            found = next(((lv, s) for lv in range(len(KNOB_LEVELS)) for p, s in [leanest(spec, gpu, q, n, oracle, lv)]
                          if _fits(p) and analytic(spec, s, gpu, reserve=q.reserve).fit.fits), None)
            if found is not None:
                s = found[1]
                d.suggestions.append(f"--gpus {n} {setup_flags(s)} (the fewest {gpu.name}s with the memory knobs: "
                                     f"tp {s.tp}, pp {s.pp}, dp {s.dp}, ZeRO-{s.zero}, {s.recompute} recompute)")
                break
    d.suggestions += knobs(spec, gpu, q, oracle)
    if _fits(short):  # memory would fit at micro-batch 1 but the batch split did not allow it
        d.message += (" and fits at micro-batch 1, but the global batch split does not allow micro-batch 1 with these "
                      "layouts: change --global-batch-tokens")
    return d


def knobs(spec, gpu: GPU, q, oracle: PeakOracle) -> list[str]:
    """Single changes that would make the leanest plan of this many GPUs fit."""
    out = []
    changes = [("--optimizer adamw-8bit", dict(optimizer="adamw-8bit")), ("--optimizer sgd", dict(optimizer="sgd")),
               ("--precision bf16 (pure bf16 states, no fp32 master)", dict(precisions=("bf16",)))]
    s = q.seq // 2
    while s >= 128:
        changes.append((f"--seq {s}", dict(seq=s, global_batch_tokens=None)))
        s //= 2
    trials = []
    for label, change in changes:
        try:
            trials.append((label, replace(q, **change)))
        except SetupError:  # a change the searched stacks do not run (torchtitan builds no SGD)
            continue
    seen_seq = False
    for label, qq in trials:
        if label.startswith("--seq") and seen_seq:
            continue
        if qq.optimizer == q.optimizer and qq.precisions == q.precisions and qq.seq == q.seq:
            continue
        if _fits(leanest(spec, gpu, qq, q.gpus, oracle)[0]):
            out.append(label)
            seen_seq = seen_seq or label.startswith("--seq")
    bigger = [g.name for g in sorted(larger_in_nodes(gpu), key=lambda g: g.memory)
              if _fits(leanest(spec, g, q, q.gpus, oracle)[0])]
    if bigger:
        out.append(f"--gpu {bigger[0]} (or: {', '.join(bigger[1:4])})" if len(bigger) > 1 else f"--gpu {bigger[0]}")
    return out
