"""What would fit: the changes under which a setup fits its GPU, each with its peak and step time, by slowdown.

One definition for `trainfit estimate` (when a setup does not fit), `trainfit fit`, the HTML report and the web
page. Every suggestion is checked with the analytic engine on the device total (as the estimate judges), so
`trainfit estimate` with the suggested flags fits. Two kinds of change:
- memory knobs (knobs: recompute, 8-bit optimizer, optimizer in backward, pure bf16, Liger's fused loss, --liger, the tiled MLP,
  activation offloading, LoRA, QLoRA, micro-batch 1 with accumulation), tried alone and in combinations of up to
  three — one per group — since a fine-tuning setup that fits a 24 GB card usually needs several at once;
- single changes searched for their smallest value (searches monotone in the knob: the peak grows with batch and
  sequence, falls with ZeRO-3 ranks and tensor parallelism): data parallelism with ZeRO-3, tensor parallelism, a
  shorter sequence, a larger GPU; the states sharded (ZeRO on the ranks given, else the fewest ranks with ZeRO-3)
  beside up to two memory knobs too (LoRA under FSDP / ZeRO-3), adding GPUs that way only where no change fits the
  GPUs given.
Ranked by slowdown: the time per token per GPU against the original setup's (timed although it does not fit),
so more GPUs cost what they add. A combination is dropped when a subset of its knobs already fits at no greater
slowdown. Knobs that change what is trained (LoRA, QLoRA, a shorter sequence) say so.
"""
from __future__ import annotations

import math

from dataclasses import dataclass, field
from itertools import combinations

from .. import cancel
from ..analytic.gpu_support import check_gpu
from ..analytic.layout import model_takes
from ..analytic.unmodelled import check_modelled
from ..cluster import larger_in_nodes
from ..engines import analytic
from ..errors import TrainfitError
from ..estimate import Estimate
from ..hardware import GPU
from ..setup import Setup, combine_offload
from ..spec import ModelSpec
from ..units import fmt_bytes, fmt_count

MAX_DP = 1024
DP_CHOICES = tuple(2 ** k for k in range(1, MAX_DP.bit_length()))  # the data-parallel ranks tried with ZeRO-3: 2 … 1024
SHARD = "shard"  # the sharding's mark among a suggestion's knobs (_ranked)
MAX_KNOBS = 3  # combinations of up to this many memory knobs
SHOWN = 6  # suggestions kept, fastest first


@dataclass(frozen=True)
class Knob:
    group: str  # a combination takes at most one knob per group
    flags: str
    changes: dict
    why: str


def knobs(s: Setup, spec: ModelSpec | None = None) -> list[Knob]:
    """The memory knobs that change something for setup `s` (training); with `spec`, those the model takes."""
    out = [
        Knob("recompute", "--recompute full", dict(recompute="full"), "activations recomputed in backward"),
        Knob("optimizer", "--optimizer adamw-8bit", dict(optimizer="adamw-8bit"), "8-bit optimizer states"),
        Knob("optimizer", "--optimizer paged-adamw-8bit", dict(optimizer="paged-adamw-8bit"),
             "8-bit states in unified memory, evicted to the host when the device is full"),
        Knob("in_backward", "--optimizer-in-backward", dict(optimizer_in_backward=True),
             "each gradient applied and freed as it is made"),
        Knob("precision", "--precision bf16", dict(precision="bf16"), "pure bf16 weights, gradients and states"),
        Knob("loss", "--loss fused-linear", dict(loss="fused-linear"), "Liger's fused linear cross-entropy"),
        _activation_offload(s),
        Knob("adapters", "--lora-rank 16", dict(lora_rank=16), "LoRA adapters only: a different fine-tune"),
        Knob("adapters", "--lora-rank 16 --quant nf4 --precision bf16",
             dict(lora_rank=16, quant="nf4", precision="bf16"), "QLoRA on a 4-bit base: a different fine-tune"),
    ]
    runs = s.stack_facts.runs
    if runs("liger-loss") and (spec is None or model_takes(spec, liger=True)):
        # Liger's kernels with its fused loss (analytic/liger.py): in place of the fused loss alone, which it includes
        # (--liger turns --loss full into fused-linear, settings.py) while its RMSNorm and SwiGLU save less
        out = [k for k in out if spec is None or k.flags != "--loss fused-linear"]
        out.append(Knob("loss", "--liger", dict(liger=True), "Liger's kernels and fused linear cross-entropy"))
    if runs("tiled-mlp") and (spec is None or (s.seq > spec.hidden and model_takes(spec, tiled_mlp=0))):
        # ArcticTraining's tiled MLP (analytic/long_context.py), for sequences longer than the hidden size: its auto
        # count is ceil(seq / hidden) slices (tiled_compute.py:51-56); NB: one slice is an MLP checkpoint, which
        # --recompute already offers, so shorter sequences are not tried
        out.append(Knob("tiled", "--tiled-mlp auto", dict(tiled_mlp=0), "each MLP run on slices of the sequence"))
    if s.mode == "rl":  # --batch is prompts; the step's P x G completions train in --grad-accum micro-batches
        completions = s.batch * s.group_size  # (docs/rl.md: TRL's per_device_train_batch_size = P x G / accum)
        out.append(Knob("batch", f"--grad-accum {completions}", dict(grad_accum=completions),
                        "micro-batches of one completion: the same completions per step"))
    elif s.batch > 1:
        accum = s.batch * s.grad_accum
        out.append(Knob("batch", f"--batch 1 --grad-accum {accum}", dict(batch=1, grad_accum=accum),
                        "same tokens per step"))
    return [k for k in out if any(getattr(s, name) != v for name, v in k.changes.items())
            and not (s.lora_rank and k.group in ("adapters", "optimizer"))]


def _activation_offload(s: Setup) -> Knob:
    """--offload activations, with the recompute policy the stack's variant needs (stacks/<stack>.toml
    [activation_offload] needs_recompute: ArcticTraining's offloads each checkpointed layer's input). Beside the
    setup's own state offload (--offload optimizer/params stays): the flag added to the given ones combines with
    theirs (combine_offload), so the setup judged is the one `estimate` gets."""
    offload = combine_offload(f"{s.offload}+activations")
    need = s.stack_facts.facts.get("activation_offload", {}).get("needs_recompute")
    if need and s.recompute != need:
        return Knob("offload", f"--offload activations --recompute {need}", dict(offload=offload, recompute=need),
                    "checkpointed layers' inputs in host memory")
    return Knob("offload", "--offload activations", dict(offload=offload), "saved activations in host memory")


def ulysses_degrees(s: Setup, gpu: GPU) -> list[int]:
    """DeepSpeed-Ulysses degrees worth trying with more GPUs (the groups carved out of --dp × n ranks): 2, 4, 8 within
    a node, where the stack runs it on a data-parallel-only setup (setup/rules.py refuses the rest)."""
    if not s.stack_facts.runs("ulysses") or s.ulysses > 1 or (s.tp, s.pp, s.cp) != (1, 1, 1):
        return []
    return [n for n in (2, 4, 8) if n <= gpu.gpus_per_node]


@dataclass(frozen=True)
class Suggestion:
    flags: str  # the CLI flags that apply it
    why: str
    required: int  # what the step's tensors need from the allocator under it (the fit rule: Estimate.fit)
    capacity: int  # what they may take on the GPU (GPU memory - --reserve - fixed overheads)
    step_seconds: float
    tokens_per_second: float  # the whole job's
    gpus: int
    slowdown: float  # time per token per GPU against the original setup's (1.0 = as fast)
    setup: Setup = field(repr=False, compare=False)
    knobs: frozenset = field(default=frozenset(), repr=False, compare=False)

    @property
    def times(self) -> str:
        """The slowdown as the reports print it ("n/a" where either side runs no tokens: NaN)."""
        return f"{self.slowdown:.2f}x" if math.isfinite(self.slowdown) else "n/a"

    def line(self) -> str:
        pace = (f"{self.times} the time per token per GPU" if math.isfinite(self.slowdown) else
                f"{fmt_count(self.tokens_per_second / self.gpus)} tokens/s per GPU; the setup as given runs none"
                if self.tokens_per_second > 0 else "no tokens run, as in the setup as given")
        return f"{self.flags} ({self.why}; needs {fmt_bytes(self.required)} of {fmt_bytes(self.capacity)}, {pace})"

    def as_dict(self) -> dict:
        return {"flags": self.flags, "why": self.why, "required": self.required,
                "capacity": self.capacity, "step_seconds": self.step_seconds,
                "tokens_per_second": self.tokens_per_second, "gpus": self.gpus,
                "slowdown": self.slowdown if math.isfinite(self.slowdown) else None}  # (JSON has no NaN)


class _Judge:
    """Estimates setups on a GPU (analytic engine, cached) and turns the fitting ones into suggestions."""

    def __init__(self, spec: ModelSpec, base: Setup, gpu: GPU, reserve: float):
        check_gpu(base, gpu)  # what the GPU lacks no search on it lifts: refused, not 'nothing fits' (trainfit fit)
        self.spec, self.base, self.gpu, self.reserve = spec, base, gpu, reserve
        self.cache: dict = {}
        ref = self.estimate(base)
        self.per_gpu = ref.time.tokens_per_second / base.world_size if ref is not None else None

    def estimate(self, s: Setup, on: GPU | None = None) -> Estimate | None:
        key = (s, (on or self.gpu).name)
        if key not in self.cache:
            cancel.check()  # every candidate is an engine call: the web's time limit and disconnects stop here
            try:  # a change the model or the settings do not allow is simply not advice
                self.cache[key] = analytic(self.spec, s, on or self.gpu, reserve=self.reserve)
            except cancel.Stopped:
                raise
            except TrainfitError:
                self.cache[key] = None
        return self.cache[key]

    def cannot_fit(self, s: Setup, on: GPU | None = None) -> bool:
        """True where `s` does not fit, read off the estimate under a flat --mfu, which skips the step-time model
        (about half an estimate): a training step's fit verdict reads its memory only (analytic/engine.py judges it
        before and apart from the step time), so it is the full estimate's, or the full estimate refuses the setup
        (it runs every check the flat one does, and the kernel model's). False where that says nothing: the setup
        fits or is refused there, another mode, or the full estimate is already cached; the full estimate decides.
        Most candidates the advice tries do not fit (the searches for the least dp, tp, sequence that fits)."""
        if s.mode != "train" or (s, (on or self.gpu).name) in self.cache:
            return False
        cancel.check()
        try:
            e = analytic(self.spec, s, on or self.gpu, reserve=self.reserve, mfu=1.0)
        except cancel.Stopped:
            raise
        except TrainfitError:
            return False
        return e.fit is not None and e.time is not None and not e.time.fits

    def fits(self, on: GPU | None = None, **changes) -> bool:
        try:
            s = self.base.with_(**changes)
        except TrainfitError:
            return False
        if self.cannot_fit(s, on):
            return False
        e = self.estimate(s, on)
        return e is not None and e.time is not None and e.time.fits

    def suggest(self, flags: str, why: str, on: GPU | None = None, knobs: frozenset = frozenset(),
                **changes) -> Suggestion | None:
        try:
            s = self.base.with_(**changes)
        except TrainfitError:
            return None
        if self.cannot_fit(s, on):
            return None
        e = self.estimate(s, on)
        if e is None or e.time is None or not e.time.fits:
            return None
        per_gpu = e.time.tokens_per_second / s.world_size
        slowdown = self.per_gpu / per_gpu if self.per_gpu and per_gpu else float("nan")
        required, capacity = judged_bytes(e)
        return Suggestion(flags, why, required, capacity, e.time.step_seconds, e.time.tokens_per_second, s.world_size,
                          slowdown, s, knobs)


def judged_bytes(e: Estimate) -> tuple[int, int]:
    """(required, capacity) of a fitting estimate's verdict: the fit rule's (Estimate.fit); a serving engine, which
    has none, is judged on its device total within GPU memory - --reserve (analytic/engine.py _serving_estimate)."""
    if e.fit is not None:
        return e.fit.required, e.fit.capacity
    return e.memory.device_total, e.memory.device_total + e.time.headroom


def _combinations(ks: list[Knob], most: int) -> list[tuple[Knob, ...]]:
    """The combinations of 1 to `most` knobs, one per group."""
    return [c for n in range(1, most + 1) for c in combinations(ks, n) if len({k.group for k in c}) == n]


def _merged(combo: tuple[Knob, ...]) -> dict:
    changes: dict = {}
    for k in combo:
        changes.update(k.changes)
    return changes


def _least(values: tuple[int, ...], ok) -> int | None:
    """The least of ascending `values` with ok(v), for ok monotone (false, then true: the states per rank fall as
    ZeRO-3 ranks are added); None if none. Bisection: log2 of the values' count engine calls, not one per value."""
    lo, hi = 0, len(values)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(values[mid]) else (mid + 1, hi)
    return values[lo] if lo < len(values) else None


def _largest(lo: int, hi: int, ok) -> int:
    """Largest v in [lo, hi] with ok(v), for ok monotone decreasing; lo - 1 if none."""
    if not ok(lo):
        return lo - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return hi if ok(hi) else lo


def suggestions(spec: ModelSpec, setup: Setup, gpu: GPU, reserve: float = 0.0, shown: int = SHOWN,
                larger_gpu: bool = True) -> list[Suggestion]:
    """Changes under which `setup` fits on `gpu` (keeping `reserve` GiB free), fastest first; [] if it fits.
    `larger_gpu`: also suggest the smallest larger GPU it fits on."""
    j = _Judge(spec, setup, gpu, reserve)
    if j.fits():
        return []
    s = setup
    found: list[Suggestion] = []

    def add(x: Suggestion | None) -> None:
        if x is not None:
            found.append(x)

    if s.mode in ("train", "rl"):  # (an RL step trains: its memory knobs, those --mode rl takes: Setup.with_)
        ks = knobs(s, spec)
        for combo in _combinations(ks, MAX_KNOBS):
            add(j.suggest(" ".join(k.flags for k in combo), "; ".join(k.why for k in combo),
                          knobs=frozenset(k.flags for k in combo), **_merged(combo)))
        # the states sharded over data-parallel ranks, alone or beside up to MAX_KNOBS - 1 memory knobs (LoRA or
        # QLoRA under FSDP / ZeRO-3, with recompute: how a model too large for its GPUs is fine-tuned), each bundle
        # at the least sharding that fits it: more ZeRO on the ranks given, else the fewest ranks with ZeRO-3 (FSDP).
        # Bundles that add GPUs only where no change fits the GPUs given (the question is those GPUs; sharding alone
        # is always shown, with recompute where alone it fits nowhere), and none that fits unsharded; the sharding is
        # one knob (SHARD) to _ranked, so a bundle is kept beside a fitting subset of it only where faster
        given = s.dp > 1 or not any(x.gpus == s.world_size for x in found)
        bundles = _combinations(ks, MAX_KNOBS - 1) if given else [(k,) for k in ks if k.group == "recompute"]
        for combo in [(), *bundles]:
            if combo and not given and any(SHARD in x.knobs for x in found):
                break  # (sharding alone fits: more GPUs, no more knobs)
            changes, flags = _merged(combo), "".join(" " + k.flags for k in combo)
            if combo and j.fits(**changes):
                continue
            why, marks = "".join("; " + k.why for k in combo), frozenset({SHARD, *(k.flags for k in combo)})
            if s.dp > 1:
                z = next((z for z in range(s.zero + 1, 4) if j.fits(zero=z, **changes)), None)
                if z is not None:
                    add(j.suggest(f"--zero {z}{flags}", f"shards more of the states over the data-parallel ranks{why}",
                                  knobs=marks, **changes, zero=z))
            else:
                d = _least(DP_CHOICES, lambda d: j.fits(dp=d, zero=3, **changes))
                if d is not None:
                    add(j.suggest(f"--dp {d} --zero 3{flags}", f"{d} GPUs, FSDP{why}", knobs=marks, **changes,
                                  dp=d, zero=3))
        # the sequence over more GPUs (DeepSpeed-Ulysses), ZeRO-3 over all of them: the fewest that fit
        # (alone, then with Liger's loss where it is a knob here: at long context the logits dominate, ALST §3)
        liger = [({"liger": True}, " --liger", "; Liger's kernels")] if any(k.flags == "--liger" for k in ks) else []
        for extra, more, why in [({}, "", "")] + liger:
            n = next((n for n in ulysses_degrees(s, gpu) if j.fits(dp=s.dp * n, ulysses=n, zero=3, **extra)), None)
            if n is not None:
                add(j.suggest(f"--dp {s.dp * n} --ulysses {n} --zero 3{more}", f"the sequence split over {n} GPUs "
                              f"(DeepSpeed-Ulysses){why}", dp=s.dp * n, ulysses=n, zero=3, **extra))
                break
    else:
        for p in ("int8", "int4"):
            add(j.suggest(f"--precision {p}", "quantised weights", precision=p))
        if s.batch > 1:
            b = _largest(1, s.batch - 1, lambda b: j.fits(batch=b))
            if b >= 1:
                add(j.suggest(f"--batch {b}", "fewer sequences at once", batch=b))
    train = s.mode == "train"
    # (--mode rl: the actor has no --tp and its sequences are --prompt-len + --completion-len, not --seq)
    for extra, flags in (({}, ""), (dict(recompute="full"), " --recompute full") if train else ({}, "")):
        t = next((t for t in range(s.tp + 1, gpu.gpus_per_node + 1) if s.mode != "rl"
                  and spec.heads % t == 0 and j.fits(tp=t, sequence_parallel=train, **extra)), None)
        if t is not None:
            add(j.suggest(f"--tp {t}" + (" --sequence-parallel" if train else "") + flags, f"{t} GPUs per replica",
                          tp=t, sequence_parallel=train, **extra))
            break
    # inference: no longer than the positions the model was trained to (the estimate's longest context, inference.
    # largest_context, is capped there too); training may run a rotary model past them (long-context fine-tuning)
    limit = spec.position_limit(s.mode) if s.mode != "train" else 0
    top = min(s.seq - 1, limit) if limit else s.seq - 1
    if top >= 1 and s.mode != "rl":
        q = _largest(1, top, lambda q: j.fits(seq=q))
        if q >= 1:
            add(j.suggest(f"--seq {q}", "shorter sequences: a different job", seq=q))
    # a larger GPU in the same nodes (--cluster's, so that `--gpu X` beside the given flags is the estimate judged
    # here; one its catalog entry holds) of the same host memory (--host-memory or the cluster's: not the GPU's)
    bigger = sorted(larger_in_nodes(gpu), key=lambda g: (g.memory, g.name))
    g = next((g for g in bigger if j.fits(on=g)), None) if larger_gpu else None
    if g is not None:
        add(j.suggest(f"--gpu {g.name}", "a larger GPU", on=g))
    return _ranked(found)[:shown]


FASTER = 0.99  # a combination is shown beside a fitting subset of its knobs only where > 1 % faster than it


def _ranked(found: list[Suggestion]) -> list[Suggestion]:
    """Fastest first; a combination whose knobs include a fitting suggestion's is dropped unless more than 1 % faster
    (FASTER: one more flag for less is no advice), and so is one that holds and runs exactly as an earlier one (paged
    states when nothing is large enough to page)."""
    found = sorted(found, key=lambda x: (x.slowdown, len(x.knobs), x.flags))
    kept: list[Suggestion] = []
    for x in found:  # (against every fitting subset, also one ranked after x: a hair slower)
        if any(k.knobs and k.knobs < x.knobs and not x.slowdown < FASTER * k.slowdown for k in found) or any(
                (k.required, k.step_seconds, k.gpus) == (x.required, x.step_seconds, x.gpus) for k in kept):
            continue
        kept.append(x)
    return kept


def fit_advice(spec: ModelSpec, setup: Setup, gpu: GPU, reserve: float = 0.0) -> list[str]:
    """The suggestions as one line each (the CLI's and the web page's text)."""
    return [x.line() for x in suggestions(spec, setup, gpu, reserve)]


MAX_BATCH = 64  # `trainfit fit` grows the micro-batch of each fitting setup up to this


def fastest_that_fit(spec: ModelSpec, setup: Setup, gpu: GPU, reserve: float = 0.0,
                     shown: int = SHOWN) -> list[Suggestion]:
    """`trainfit fit`: the setup as given if it fits, else the suggestions on this GPU (not a larger one); each
    with its micro-batch grown as far as it fits (more tokens per kernel: faster per token), fastest first. A model
    the analytic engine does not model is refused in one line (its search would judge nothing)."""
    check_modelled(spec)
    j = _Judge(spec, setup, gpu, reserve)
    start = j.suggest("", "as given")
    found = [start] if start is not None else suggestions(spec, setup, gpu, reserve, 4 * shown, larger_gpu=False)
    grown: list[Suggestion] = []
    for x in found:
        s = x.setup
        if s.mode == "train" and s.grad_accum == setup.grad_accum:  # not the micro-batch knob itself
            on = gpu
            b = _largest(s.batch, MAX_BATCH, lambda b: _fits(j, s, b, on))
            if b > s.batch:
                bigger = j.suggest(f"{x.flags} --batch {b}".strip(), x.why, on=on, knobs=x.knobs,
                                   **_changes(setup, s.with_(batch=b)))
                if bigger is not None and bigger.slowdown < x.slowdown:
                    x = bigger
        grown.append(x)
    return _ranked(grown)[:shown]


def _fits(j: _Judge, s: Setup, b: int, gpu: GPU) -> bool:
    e = j.estimate(s.with_(batch=b), gpu)
    return e is not None and e.time is not None and e.time.fits


def _changes(base: Setup, s: Setup) -> dict:
    return {k: v for k, v in vars(s).items() if getattr(base, k) != v}


def frees_most(spec: ModelSpec, setup: Setup, gpu: GPU | None = None, reserve: float = 0.0,
               shown: int = 3) -> list[tuple[Knob, int]]:
    """The memory knobs of `setup` (knobs) by the bytes each alone frees from what the step needs (Memory.required,
    the fit rule's; the allocated peak where an engine has none), largest first, each checked by the analytic
    engine: `trainfit explain`'s answer to "what frees the most"."""
    def need(s: Setup) -> int | None:
        cancel.check()
        try:
            m = analytic(spec, s, gpu, reserve=reserve).memory
        except cancel.Stopped:
            raise
        except TrainfitError:
            return None  # a change the model or the settings do not allow is no answer
        return m.required if m.required is not None else m.peak

    base = need(setup)
    if base is None:
        return []
    out = []
    for k in knobs(setup):
        try:
            after = need(setup.with_(**k.changes))
        except TrainfitError:
            continue
        if after is not None and after < base:
            out.append((k, base - after))
    return sorted(out, key=lambda x: (-x[1], x[0].flags))[:shown]
