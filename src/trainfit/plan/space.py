"""The search space: parallel layouts of N GPUs that the model's shape allows, and the (micro-batch, accumulation)
splits of a global batch. Pure arithmetic, no memory or time here."""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields, replace
from functools import lru_cache

from ..spec import ModelSpec


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def tp_allowed(spec: ModelSpec, tp: int, gpus_per_node: int) -> bool:
    """Megatron's constraints (Shoeybi et al. 2019 §3): tp splits attention heads and the MLP width; key/value
    heads are split or replicated (GQA: tp divides kv heads or kv heads divide tp); tp stays inside a node (its
    all-reduces are on the critical path and need NVLink). Mirrors analytic.engine.validate_layout."""
    if tp > gpus_per_node or spec.heads % tp:
        return False
    if spec.kv_heads % tp and tp % spec.kv_heads:
        return False
    return not (spec.intermediate and spec.intermediate % tp)


@dataclass(frozen=True)
class Layout:
    dp: int
    tp: int
    pp: int
    cp: int = 1  # Megatron context parallelism
    vpp: int = 1  # Megatron interleaved 1F1B chunks per rank
    pp_split: str = "even"  # Megatron's layer split (parallel/pipeline.py)
    ep: int = 1  # expert parallelism (MoE): experts split over ep ranks of the dp × cp × tp ranks of a stage
    etp: int | None = None  # expert tensor parallelism; None: tp (Megatron's expert_tensor_parallel_size default)

    def settings(self, etp_default: int | None = None) -> dict:
        """The Setup fields of this layout (setup/settings.py names) on a stack whose expert tensor-parallel degree
        without --etp is `etp_default` (Stack.etp_default; None: tp): the layout's etp None, tp's degree (_etps), is
        said as --etp tp where that default differs (torchtitan's 1), so the stack runs the layout searched."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        if self.etp is None and self.ep > 1 and etp_default not in (None, self.tp):
            out["etp"] = self.tp
        return out

    def axes(self) -> tuple[str, ...]:
        """The searched settings (SEARCHED) this layout sets away from their defaults: a stack must run them all."""
        return tuple(a.name for a in SEARCHED if getattr(self, a.name) != a.default)

    def runs_on(self, stack) -> bool:
        """Whether `stack` (a stacks.Stack) runs this layout as a layout of its own: it runs every setting the layout
        sets (axes), and an expert-TP degree without expert parallelism only where its etp applies at ep 1 (Stack.
        etp_needs_ep: torchtitan's --etp 1 at ep 1 is its default layout again, which the search has already)."""
        return all(a in stack.axes for a in self.axes()) and not (
            self.ep == 1 and self.etp is not None and stack.etp_needs_ep)


# Context parallelism is searched from this sequence length on (Megatron's CP targets long context: Llama 3 used
# CP 16 only for its 128k stage, Dubey et al. 2024 §3.3.2); NB: shorter sequences could also use it.
CP_MIN_SEQ = 16384


@dataclass(frozen=True)
class Where:
    """What an axis's candidates may depend on besides the model and the layout."""
    seq: int
    gpus_per_node: int


def _pp_splits(spec: ModelSpec, lay: Layout, at: Where) -> list[str]:
    """even, Megatron's embedding-loss split (transformer_config.py:96-100) and its first:N,last:M splits
    (balanced_ends) where pp > 1; each where the layers split (parallel/pipeline.py chunked_layers). A first:N,last:M
    split that puts the same decoder layers on every stage as even or embedding-loss is left out: it runs the same
    step, and those two take every --vpp it takes (their chunks count the same layers or one more on the ends)."""
    from ..analytic.parallel.pipeline import chunked_layers, split
    from ..errors import SetupError

    named = ("even", "embedding-loss") if lay.pp > 1 else ("even",)
    out, seen = [], set()
    for how in (*named, *balanced_ends(spec.layers, lay.pp)):
        try:
            chunked_layers(spec.layers, lay.pp, how)
        except SetupError:
            continue
        first, middle, last = split(spec.layers, lay.pp, how)
        layers = (first, middle, last) if lay.pp > 2 else (first, last)  # (pp 2 has no middle stage)
        if how not in named and layers in seen:
            continue
        seen.add(layers)
        out.append(how)
    return out


@lru_cache(maxsize=256)
def balanced_ends(layers: int, pp: int) -> tuple[str, ...]:
    """Megatron's uneven splits (--decoder-first/last-pipeline-num-layers N, M > 0, the other layers even over the
    pp − 2 middle stages: transformer_config.py:1359-1420 at core_v0.16.1) whose heaviest stage holds the fewest
    layers any of them can: every such (N, M), so a lighter first stage (it holds pp micro-batches in flight) is
    searched beside the even-handed ones. A model whose layer count pp divides neither way (DeepSeek-V3's 61 on
    pp 16: first:1..4 with 4 a middle stage) pipelines only so. NB: splits with a heavier stage are not searched: one
    is faster only where an end stage's extras (the LM head and loss, MTP layers) outweigh the layers it could shed,
    and fits where these do not only through a still lighter first stage (errs slow, or toward nothing fitting)."""
    if pp < 2 or pp > layers:
        return ()
    # (N, k, M): k the middle stages' layers (pp == 2: none, k = 0)
    shapes = ([(n, 0, layers - n) for n in range(1, layers)] if pp == 2 else
              [(n, k, layers - k * (pp - 2) - n) for k in range(1, layers // (pp - 2) + 1)
               for n in range(1, layers - k * (pp - 2))])
    shapes = [x for x in shapes if x[2] >= 1]
    least = min(max(x) for x in shapes)
    return tuple(f"first:{n},last:{m}" for n, k, m in shapes if max(n, k, m) <= least)


def _vpps(spec: ModelSpec, lay: Layout, at: Where) -> list[int]:
    """Every interleaving depth that splits each stage's layers into equal chunks (pipeline.check), down to one layer
    a chunk (Megatron-Bridge's Qwen3-30B-A3B H100 recipe runs pp 2 with 24 chunks of one layer)."""
    if lay.pp == 1:
        return [1]
    from ..analytic.parallel.pipeline import chunked_layers

    chunked = [n for n in chunked_layers(spec.layers, lay.pp, lay.pp_split) if n]  # (pp 2: no middle stage, 0)
    return [v for v in range(1, min(chunked) + 1) if all(n % v == 0 for n in chunked)]


def _cps(spec: ModelSpec, lay: Layout, at: Where) -> list[int]:
    """CP degrees carved out of dp (world = dp·tp·pp·cp), from CP_MIN_SEQ on, where the sequence splits into 2·cp
    load-balanced chunks (setup/rules.py)."""
    return [c for c in divisors(lay.dp) if c == 1 or (at.seq >= CP_MIN_SEQ and at.seq % (2 * c) == 0)]


def _eps(spec: ModelSpec, lay: Layout, at: Where) -> list[int]:
    """Expert-parallel degrees of a MoE model: divisors of the expert count (Megatron: moe/moe_layer.py:101) that
    divide the dp × cp × tp ranks of a stage (parallel_state.py:788-794: the expert layout etp × ep × edp tiles them;
    the etp axis is checked with its own values)."""
    if not spec.is_moe:
        return [1]
    ranks = lay.dp * lay.cp * lay.tp
    return [e for e in divisors(spec.moe.num_experts) if ranks % e == 0]


def _etps(spec: ModelSpec, lay: Layout, at: Where) -> list[int | None]:
    """Expert tensor-parallel degrees of a MoE model: those that divide the expert MLP width, with ep tile the stage's
    dp × cp × tp ranks (stacks/megatron.py refuse) and keep the expert-TP group inside a node (etp innermost in
    Megatron's expert rank order: parallel_state.py:788-794), below tp or above it; tp itself is Megatron's default,
    None. NB: an expert-TP group across nodes (its gather over the NIC) is not searched."""
    if not spec.is_moe:
        return [None]
    ranks = lay.dp * lay.cp * lay.tp
    if ranks % lay.ep:
        return []
    return [None if t == lay.tp else t for t in divisors(ranks // lay.ep)
            if t <= at.gpus_per_node and at.gpus_per_node % t == 0 and spec.moe.expert_intermediate % t == 0]


def _dispatchers(spec: ModelSpec, lay: Layout, at: Where) -> list[str | None]:
    """The token dispatchers of an expert layout (ep > 1; vocab.MOE_DISPATCHERS, alltoall as the setting's default
    None): each moves the same tokens by another exchange (analytic/parallel/expert.py); timed_variants keeps those
    the stack runs ([moe] dispatchers), and its rules refuse the layouts one cannot run (DeepEP's group sizes)."""
    if not spec.is_moe or lay.ep <= 1:
        return [None]
    from ..setup.vocab import MOE_DISPATCHERS

    return [None] + [d for d in MOE_DISPATCHERS if d != "alltoall"]


def _moe_overlaps(spec: ModelSpec, lay: Layout, at: Where) -> list[bool]:
    """--overlap-moe-comm off and on for an expert layout (ep > 1); Megatron's own checks (stacks/megatron.py
    _moe_overlap: the dispatcher, the recompute policy, the virtual pipeline, the precision) refuse the rest."""
    return [False, True] if spec.is_moe and lay.ep > 1 else [False]


def _carve_cp(lay: Layout, c: int) -> Layout:
    return replace(lay, dp=lay.dp // c, cp=c)


@dataclass(frozen=True)
class Axis:
    name: str  # the Setup field (setup/settings.py) and the stacks' [parallel] axes name (stacks/*.toml)
    default: object  # the value a stack that does not run the axis has
    values: Callable[[ModelSpec, Layout, Where], list]  # candidates for a layout with the earlier axes already set
    apply: Callable[[Layout, object], Layout] | None = None  # how a value enters the layout; None: the field is set
    none_means: str = ""  # what a value of None runs, as `trainfit plan` names it (etp: tp's degree)

    def label(self, value) -> str:
        """A searched value as `trainfit plan` lists it."""
        return self.none_means if value is None else ("on" if value else "off") if isinstance(value, bool) else \
            str(value)


# The settings searched beyond dp × tp × pp, in the order their candidates are chained (vpp after pp_split, etp after
# cp and ep): each is tried on the stacks whose [parallel] axes list it. Searching one more setting is one row here.
SEARCHED: tuple[Axis, ...] = (
    Axis("pp_split", "even", _pp_splits),
    Axis("vpp", 1, _vpps),
    Axis("cp", 1, _cps, _carve_cp),
    Axis("ep", 1, _eps),
    Axis("etp", None, _etps, none_means="tp"),
)
# The settings searched that change only the step time, never the memory (analytic.memory.NOT_IN_MEMORY): tried
# inside each group of a layout (plan/search.py), which judges its memory once for all of them, on the stacks whose
# [parallel] axes list them.
TIMED: tuple[Axis, ...] = (
    Axis("moe_dispatcher", None, _dispatchers, none_means="alltoall"),
    Axis("overlap_moe_comm", False, _moe_overlaps),
)


def variants(spec: ModelSpec, lay: Layout, at: Where, run: Iterable[str]) -> list[Layout]:
    """Every assignment of the searched settings in `run` (the axes some planned stack runs) to one dp × tp × pp
    layout of the same GPUs; an axis not in `run` keeps its default."""
    out = [lay]
    for a in SEARCHED:
        if a.name not in run:
            continue
        put = a.apply or (lambda x, v, n=a.name: replace(x, **{n: v}))
        out = [put(x, v) for x in out for v in a.values(spec, x, at)]
    return out


def timed_variants(spec: ModelSpec, lay: Layout, at: Where, run: Iterable[str],
                   dispatchers: Iterable[str] | None = None) -> list[dict]:
    """Every assignment of the TIMED settings in `run` to one layout, as Setup fields; the defaults ({}) first.
    `dispatchers`: the MoE dispatchers the stack runs (stacks/*.toml [moe] dispatchers; None: every one)."""
    out = [{}]
    for a in TIMED:
        if a.name in run:
            out = [{**x, **({a.name: v} if v != a.default else {})} for x in out for v in a.values(spec, lay, at)]
    if dispatchers is not None:
        out = [x for x in out if x.get("moe_dispatcher", "alltoall") in dispatchers]
    return out


def layouts(spec: ModelSpec, gpus: int, gpus_per_node: int, tp: int | None = None, pp: int | None = None,
            dp: int | None = None, uneven: bool = False) -> list[Layout]:
    """Every dp × tp × pp == gpus with tp valid for the model and pp dividing the layers (fixed where given); with
    `uneven`, also the other pp up to the layer count (Megatron's embedding-loss and first:N,last:M splits,
    _pp_splits)."""
    out = []
    for t in divisors(gpus):
        if (tp is not None and t != tp) or not tp_allowed(spec, t, gpus_per_node):
            continue
        for p in divisors(gpus // t):
            if (pp is not None and p != pp) or (spec.layers % p and not (uneven and p <= spec.layers)):
                continue
            d = gpus // (t * p)
            if dp is not None and d != dp:
                continue
            out.append(Layout(d, t, p))
    return out


def recompute_module_sets(spec: ModelSpec, stack: str) -> list[str | None]:
    """The --recompute-modules values searched under `stack`'s selective policy: its [plan] recompute_modules that
    the model has something for (megatron_recompute.check_model refuses the others, as Megatron does), Megatron's
    default core_attn as None (the setting's own default); [None] where the stack has no recompute modules."""
    from ..analytic.megatron_recompute import check_model
    from ..errors import SetupError
    from ..setup import Setup
    from ..stacks import get_stack

    st, out = get_stack(stack), []
    for names in st.plan_recompute_modules:
        if names == "core_attn":
            out.append(None)
            continue
        try:
            check_model(spec, Setup(stack=stack, precision=st.plan_precisions[0], recompute="selective",
                                    recompute_modules=names))
        except SetupError:
            continue
        out.append(names)
    return out or [None]


def batch_splits(layout: Layout, global_seqs: float | None, max_batch: int, tolerance: float) -> list[tuple[int, int]]:
    """(micro-batch, grad_accum) pairs for one layout.

    With a global batch of `global_seqs` sequences: micro-batch × accumulation × dp must equal it within
    `tolerance` (relative), accumulation ≥ pp so that 1F1B can fill the pipeline (Narayanan et al. 2021 §2.2).
    Without one: accumulation = pp (the least that fills the pipeline; 1 without pipelining) and micro-batches
    of 1, 2, 4, ... up to `max_batch` (the largest that fits) and `max_batch` itself.
    """
    p = layout.pp
    if global_seqs is None:
        accum = p if p > 1 else 1
        bs, b = [], 1
        while b <= max_batch:
            bs.append(b)
            b *= 2
        if max_batch >= 1 and max_batch not in bs:
            bs.append(max_batch)
        return [(b, accum) for b in bs]
    per_rank = global_seqs / layout.dp
    out = []
    # interleaving runs micro-batch groups of pp: the accumulation is a multiple of pp (schedules.py:995-1015)
    step = p if layout.vpp > 1 else 1
    for b in range(1, max_batch + 1):
        accum = max(step, step * round(per_rank / (b * step)))
        if accum < p:  # the nearest count is too few to fill the pipeline: pp micro-batches, if within tolerance
            accum = p
            if abs(b * accum * layout.dp - global_seqs) > tolerance * global_seqs:
                break  # larger micro-batches leave even fewer micro-batches
        if abs(b * accum * layout.dp - global_seqs) <= tolerance * global_seqs:
            out.append((b, accum))
    return out


def max_micro_batch(layout: Layout, global_seqs: float | None, tolerance: float, cap: int = 4096) -> int:
    """The largest micro-batch the batch constraint could ever allow (before memory)."""
    if global_seqs is None:
        return cap
    return max(0, min(cap, int(global_seqs * (1 + tolerance) / (layout.dp * layout.pp))))
