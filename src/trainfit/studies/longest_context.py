"""`trainfit fit --longest-context`: the longest sequence whose training step fits the GPU, for the setup as given
and under each technique that lengthens it, longest first.

Every length is judged by the analytic engine's fit rule (analytic/fit_rule.py), as `trainfit estimate` judges it,
so `trainfit estimate --seq N` with the answer's flags fits and `--seq N+1` does not. The search is monotone in the
sequence (every saved activation and transient grows with it): doubling from the shortest length that runs until
one does not fit, then bisection (fit_advice._largest), over multiples of that shortest length. The techniques are the memory knobs `trainfit fit` tries (fit_advice.knobs: full
recompute, 8-bit or paged optimizer states, the optimizer in backward, pure bf16, Liger's fused loss, activation
offload, LoRA, QLoRA), each alone on top of the user's setup, FlashAttention-2 (--attention flash2, where the
rules allow it), and, where the stack splits the sequence over GPUs (its [parallel] axes include cp), context
parallelism over 2, 4 and 8 GPUs of a node, and where it runs DeepSpeed-Ulysses, the sequence split over 2, 4 and 8
times the data-parallel GPUs (stacks/<stack>.toml [features]).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..analytic.unmodelled import check_modelled
from ..errors import TrainfitError
from ..hardware import GPU
from ..setup import Setup
from ..spec import ModelSpec
from .fit_advice import _Judge, _largest, judged_bytes, knobs, ulysses_degrees

MAX_SEQ = 1 << 24  # the search's ceiling: 16M tokens, beyond every model's positions
CP_DEGREES = (2, 4, 8)
GRANULES = 13  # powers of two tried as the lengths' step: 1 to 4096


@dataclass(frozen=True)
class Longest:
    flags: str  # the CLI flags of the technique ("" for the setup as given)
    why: str
    seq: int  # the longest sequence that fits; 0 when not even one token does
    # what the step needs from the allocator at `judged_seq` (the longest that fits, else the shortest that runs:
    # how far it is from fitting) and the capacity it is judged on; None where no length runs at all
    required: int | None
    capacity: int | None
    step_seconds: float | None  # at the longest that fits; None when none fits
    gpus: int
    setup: Setup = field(repr=False, compare=False)
    judged_seq: int | None = None

    def as_dict(self) -> dict:
        return {"flags": self.flags, "why": self.why, "seq": self.seq, "required": self.required,
                "capacity": self.capacity, "judged_seq": self.judged_seq, "step_seconds": self.step_seconds,
                "gpus": self.gpus}


def longest_seq(judge: _Judge, **changes) -> int:
    """The longest --seq at which `judge`'s setup with `changes` fits its GPU; 0 if none (module docstring)."""
    def ok(q: int) -> bool:
        return judge.fits(seq=q, **changes)

    # the lengths' granularity: the shortest power of two that runs (a sequence split over --cp N ranks must be a
    # multiple of 2N: shorter ones are refused, not out of memory — memory only grows with the length)
    step = next((g for g in (1 << k for k in range(GRANULES)) if ok(g)), 0)
    if not step:
        return 0

    def ok_steps(n: int) -> bool:
        return ok(n * step)

    lo, n = 1, 2
    while n * step <= MAX_SEQ and ok_steps(n):
        lo, n = n, 2 * n
    return step * _largest(lo, min(n, MAX_SEQ // step), ok_steps)


def techniques(spec: ModelSpec, setup: Setup, gpu: GPU) -> list[tuple[str, str, dict]]:
    """(flags, why, changes) of each technique tried: the memory knobs, then context parallelism where the stack
    runs it (stacks/<stack>.toml [parallel] axes)."""
    out = [(k.flags, k.why, k.changes) for k in knobs(setup)]
    if setup.attention != "flash2":  # (refused where it does not run: CUDA, 16-bit, the hf stack)
        out.append(("--attention flash2", "FlashAttention-2 (HF's integration runs it in the model's 16-bit "
                    "dtype, with no s×s probabilities)", dict(attention="flash2")))
    out += [(f"--dp {setup.dp * n} --ulysses {n}", f"the sequence split over {n} GPUs (DeepSpeed-Ulysses)",
             dict(dp=setup.dp * n, ulysses=n)) for n in ulysses_degrees(setup, gpu)]
    if "cp" in setup.stack_facts.axes and setup.cp == 1:
        out += [(f"--cp {c}", f"the sequence split over {c} GPUs (context parallelism)", dict(cp=c))
                for c in CP_DEGREES if c <= gpu.gpus_per_node]
    return out


def longest_context(spec: ModelSpec, setup: Setup, gpu: GPU, reserve: float = 0.0) -> list[Longest]:
    """The setup as given, then each technique that fits a longer sequence than it, longest first."""
    check_modelled(spec)
    j = _Judge(spec, setup, gpu, reserve)
    given = _answer(j, setup, "", "as given", {})
    found = [_answer(j, setup, flags, why, changes) for flags, why, changes in techniques(spec, setup, gpu)]
    longer = sorted((x for x in found if x.seq > given.seq), key=lambda x: (-x.seq, x.gpus, x.flags))
    return [given] + longer


def _answer(j: _Judge, setup: Setup, flags: str, why: str, changes: dict) -> Longest:
    q = longest_seq(j, **changes)
    if not q:  # the shortest length that runs, judged: what it needs against the capacity
        for g in (1 << k for k in range(GRANULES)):
            try:
                e = j.estimate(setup.with_(seq=g, **changes))
            except TrainfitError:  # (a length the settings refuse: a sequence split over --cp N ranks)
                continue
            if e is not None:
                return Longest(flags, why, 0, *judged_bytes(e), None, e.setup.world_size, setup, g)
        return Longest(flags, why, 0, None, None, None, setup.world_size, setup)
    s = setup.with_(seq=q, **changes)
    e = j.estimate(s)
    required, capacity = judged_bytes(e)
    return Longest(flags, why, q, required, capacity, e.time.step_seconds, s.world_size, s, q)
