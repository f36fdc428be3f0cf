"""Pipeline parallelism: which layers each stage holds and how many micro-batches' activations it stores at once.

Layer split (megatron/core/transformer/transformer_block.py:75-200 `get_num_layers_to_build`, checked in
transformer_config.py:1359-1480):
  * even: layers / pp per stage.
  * embedding-loss (account_for_embedding_in_pipeline_split + account_for_loss_in_pipeline_split,
    transformer_config.py:96-100): the embedding and the loss each count as one layer, (layers + 2) / pp per stage,
    and the first and last stages build one decoder layer fewer (transformer_block.py:187-198). Llama 3 405B on
    pp 16: 7 / 8 ... 8 / 7 (Dubey et al. 2024, "The Llama 3 Herd of Models", §3.3.2).
  * first:N,last:M (decoder_first/last_pipeline_num_layers → num_layers_in_first/last_pipeline_stage,
    transformer_block.py:102-145): N on the first, M on the last, the rest even over the middle stages.
  * a layout string (pipeline_model_parallel_layout, "Et*3|(tt|)*29,m|L": setup/pp_layout.py): each virtual
    stage's layers as written (transformer_block.py:90-93 get_num_layers_to_build reads the layout).

In flight (megatron/core/pipeline_parallel/schedules.py:738-796 `get_pp_rank_microbatches`): rank r runs
  1F1B: p − r − 1 warm-up forwards, interleaved (v model chunks per rank, micro-batch groups of g = pp,
  model_parallel_config.py:447-448): 2(p − r − 1) + (v − 1)·g warm-up chunk-forwards,
then one more forward before its first backward, all capped at the m·v chunk-micro-batches of the step. One
chunk holds layers / v of the rank's layers, so `in_flight` (in whole-stage micro-batches) = chunks / v. Rank 0,
interleaved: p + (p − 1)/v = p·(1 + (p − 1)/(p·v)) — Korthikanti et al. 2022 §4.2.3 (Narayanan et al. 2021 §2.2.2).

Time: the bubble is (p−1)/(v·m) of the ideal time (Narayanan et al. 2021, §2.2.1 eq. 1 and §2.2.2); the interleaved
schedule sends v× as many activations between stages (ibid. §2.2.2). The slowest stage sets the pace.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...errors import SetupError
from ...setup import Setup, parse_pp_split
from ...setup.pp_layout import Layout
from ...spec import ModelSpec
from .collectives import Links


@dataclass(frozen=True)
class Stage:
    """What one pipeline stage holds. Stored activations = in_flight × layers × one layer's bytes."""

    index: int
    layers: int
    embedding: bool
    head: bool
    in_flight: float  # micro-batches (of the whole stage) whose activations are stored at once
    mtp: int = 0  # multi-token-prediction layers on this stage (analytic/mtp.py)


def split(layers: int, pp: int, pp_split: str = "even") -> tuple[int, int, int]:
    """(first, middle, last) decoder layers per stage; raises SetupError where Megatron's config checks would
    (transformer_config.py:1359-1480), with the fix."""
    if pp == 1:
        return layers, layers, layers
    how = parse_pp_split(pp_split)
    if isinstance(how, Layout):  # Megatron's layout string: each rank's decoder layers as written (pp_layout.py)
        if len(how.stages) % pp:
            how.check(pp, 1, layers, 0)  # (raises the stage-count error with its fix)
        per = how.decoder_layers(pp)
        # NB: the middle ranks as the busiest of them (memory and time take the worst stage)
        return per[0], max(per[1:-1]) if pp > 2 else per[0], per[-1]
    if how == "even":
        if layers % pp:
            raise SetupError(f"--pp {pp} does not divide the {layers} layers; use a divisor of {layers}, or "
                             "--pp-split embedding-loss / first:N,last:M (--stack megatron)")
        per = layers // pp
        return per, per, per
    if how == "embedding-loss":
        if (layers + 2) % pp:
            raise SetupError(f"--pp-split embedding-loss: the {layers} layers + embedding + loss = {layers + 2} must "
                             f"be divisible by --pp {pp} (transformer_config.py:1436-1448); use a divisor of {layers + 2}")
        per = (layers + 2) // pp
        if per < 2:
            raise SetupError(f"--pp-split embedding-loss on --pp {pp}: the first and last stages would hold no "
                             "decoder layer; use a smaller --pp")
        return per - 1, per, per - 1
    first, last = how
    rest, left = layers, pp
    for n in (first, last):
        if n > 0:
            rest -= n
            left -= 1
    if rest < 0 or bool(rest) != bool(left) or (left and rest % left):
        named = " and ".join(k for k, n in (("first", first), ("last", last)) if n > 0)
        raise SetupError(f"--pp-split {pp_split}: {_uneven_why(layers, pp, named, layers - rest, rest, left)} "
                         "(transformer_config.py:1404-1418)")
    mid = rest // left if left else 0
    return first if first > 0 else mid, mid, last if last > 0 else mid


def _uneven_why(layers: int, pp: int, named: str, ends: int, rest: int, left: int) -> str:
    """Why first:N,last:M does not split `layers` over `pp` stages (`ends` layers on the `named` stages, `rest` and
    `left` other stages for the rest), with the fix: Megatron wants every layer placed and each other ("middle")
    stage the same count, none empty."""
    both = " and " in named
    held = f"the {named} stage{'s hold' if both else ' holds'}"
    if rest < 0:
        return f"{held} {ends} layers, more than the model's {layers}: give fewer"
    if not left:
        return (f"{held} {ends} of the {layers} layers and --pp {pp} has no other stage for the other "
                f"{rest}: place all {layers}, or raise --pp")
    stages = f"{left} other stage{'s' if left > 1 else ''}"
    if not rest:
        return (f"{held} all {layers} layers and leave{'' if both else 's'} the {stages} of --pp {pp} empty: "
                "give fewer, or lower --pp")
    return f"the {rest} remaining layers do not split evenly over the {stages} of --pp {pp}: change N or M"


def chunked_layers(layers: int, pp: int, pp_split: str = "even") -> tuple[int, int, int]:
    """(first, middle, last) layers each stage's --vpp model chunks divide: the decoder layers (split), with the
    embedding on the first and the loss on the last stage under embedding-loss (transformer_block.py:174-178;
    transformer_config.py:1371-1432)."""
    first, middle, last = split(layers, pp, pp_split)
    extra = 1 if pp_split == "embedding-loss" else 0
    return first + extra, middle, last + extra


def layout_of(setup: Setup) -> Layout | None:
    """--pp-split's Megatron layout string, parsed (None for the other splits)."""
    how = parse_pp_split(setup.pp_split)
    return how if isinstance(how, Layout) else None


def warmup_chunks(pp: int, rank: int, vpp: int, micro_batches: int) -> int:
    """Warm-up forwards of `rank` (schedules.py:760-786; micro-batch group size g = pp, the default)."""
    if vpp == 1:
        n = pp - rank - 1
    else:
        n = 2 * (pp - rank - 1) + (vpp - 1) * pp
    return min(n, micro_batches * vpp)


def in_flight(pp: int, rank: int, vpp: int, micro_batches: int) -> float:
    """Whole-stage micro-batches whose activations rank `rank` stores at its peak: the warm-up forwards plus the
    first steady-state forward (schedules.py max_outstanding_backprops = warm-up + 1), capped at the step's
    m·v chunk-micro-batches, in units of the v chunks of a stage."""
    chunks = min(warmup_chunks(pp, rank, vpp, micro_batches) + 1, micro_batches * vpp)
    return chunks / vpp


def stages(spec: ModelSpec, setup: Setup) -> list[Stage]:
    """The distinct stages: the first, a middle one where its layers differ (rank 1: the most in flight of the
    middle ranks), and the last; memory takes the worst.
    NB: with embedding-loss and --vpp the embedding's missing layer is in rank 0's first chunk only; counted
    spread over its chunks (an over-estimate by under one layer × the in-flight chunks of chunk 0)."""
    p, v, m = setup.pp, setup.vpp, setup.grad_accum
    mtp = _mtp.stage_mtp(spec, setup)
    if p == 1:
        return [Stage(0, spec.layers, True, True, 1, mtp[0])]
    first, middle, last = split(spec.layers, p, setup.pp_split)
    out = [Stage(0, first, True, False, in_flight(p, 0, v, m), mtp[0])]
    if p > 2 and (middle != first or mtp[1] != mtp[0]):
        out.append(Stage(1, middle, False, False, in_flight(p, 1, v, m), mtp[1]))
    out.append(Stage(p - 1, last, False, True, in_flight(p, p - 1, v, m), mtp[2]))
    return out


def check(spec: ModelSpec, setup: Setup) -> None:
    """Megatron's pipeline checks, one-line SetupErrors with the fix."""
    p, v, m = setup.pp, setup.vpp, setup.grad_accum
    lay = layout_of(setup)
    if lay is not None:  # the layout sets every virtual stage's layers itself (pp_layout.Layout.check)
        from ..mtp import mtp_layers  # (mtp.py reads the stages)
        lay.check(p, v, spec.layers, mtp_layers(spec, setup))
    chunked = chunked_layers(spec.layers, p, setup.pp_split)  # raises split's errors for any --vpp
    if v > 1 and lay is None:
        for name, total in zip(("first", "middle", "last"), chunked):
            if total % v:
                with_ends = setup.pp_split == "embedding-loss" and name != "middle"
                raise SetupError(f"--vpp {v}: the {name} pipeline stage's {total} layers"
                                 f"{' (with the embedding/loss)' if with_ends else ''} must split into {v} equal "
                                 f"chunks; use a --vpp dividing {total}")
        # interleaving: micro-batch groups of pp in [pp, m] and m % pp == 0 (schedules.py:995-1015)
        if m < p or m % p:
            raise SetupError(f"--vpp {v} (interleaved 1F1B) runs micro-batches in groups of --pp {p}: --grad-accum "
                             f"{m} must be a multiple of {p}")


def pp_comm_seconds(spec: ModelSpec, setup: Setup, links: Links, tokens: float, act_bytes: float,
                    virtual_stages: int) -> float:
    """One micro-batch's pipeline sends, on the critical path: the activation goes forward and its gradient back once
    per stage boundary (v times interleaved); each TP rank sends its 1/t share (Narayanan et al. 2021 §4.1
    scatter/gather; sequence parallelism shards it anyway)."""
    t, p = setup.tp, setup.pp
    if p <= 1:
        return 0.0
    x = tokens * spec.hidden * act_bytes  # one b·s·h activation
    # stages are outermost (placement tp-cp-dp-pp, collectives.py): a send crosses nodes once the group spans them
    return 2 * virtual_stages * (x / t) / links.over(setup.world_size)


def bubble_seconds(pp: int, virtual_stages: int, micro_batch: float) -> float:
    """The pipeline bubble of a step of micro-batches taking `micro_batch` seconds each on the slowest stage:
    (p−1)/(v·m) of m·t_mb (Narayanan et al. 2021 §2.2.2)."""
    return (pp - 1) / virtual_stages * micro_batch if pp > 1 else 0.0


# (imported last, as the module, not its names: mtp.py reads the layout from here; a function-level import costs its
# resolution on every call, and this one sits on the engine's and the planner's hot path)
from .. import mtp as _mtp  # noqa: E402
