"""When an estimate does not fit its GPU: the smallest change per knob that would make it fit (no torch).

Each suggestion changes one knob (micro-batch with accumulation keeping the tokens per step, recompute, ZeRO,
tensor parallelism, precision, optimizer, sequence, a larger GPU) and is checked with the analytic engine, so
`trainfit estimate` with the suggested flags fits. Searches are monotone in the knob (the peak grows with batch
and sequence, falls with tp and ZeRO), so a bisection or an ordered scan finds the smallest change.
"""
from __future__ import annotations

from ..engines import analytic
from ..errors import TrainfitError
from ..hardware import GPU, list_gpus
from ..setup import Setup
from ..spec import ModelSpec

MAX_DP = 1024


def _largest(lo: int, hi: int, ok) -> int:
    """Largest v in [lo, hi] with ok(v), for ok monotone decreasing; lo - 1 if none."""
    if not ok(lo):
        return lo - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return hi if ok(hi) else lo


def fit_advice(spec: ModelSpec, setup: Setup, gpu: GPU, reserve: float = 0.0) -> list[str]:
    """Single changes (as CLI flags, with a short why) under which `setup` fits on `gpu` (keeping `reserve` GiB
    free, as the estimate did); [] if it fits already."""
    s = setup

    def fits(on: GPU = gpu, **changes) -> bool:
        try:  # a change the model or the settings do not allow is simply not advice
            e = analytic(spec, s.with_(**changes), on, reserve=reserve)
        except TrainfitError:
            return False
        return e.time is not None and e.time.fits

    def accum(b: int) -> int:  # accumulation that keeps the tokens per step at micro-batch b
        return -(-s.batch * s.grad_accum // b)

    if fits():
        return []
    out: list[str] = []
    if s.mode == "train":
        if s.batch > 1:
            b = _largest(1, s.batch - 1, lambda b: fits(batch=b, grad_accum=accum(b)))
            if b >= 1:
                out.append(f"--batch {b} --grad-accum {accum(b)} (same tokens per step)")
        if s.recompute != "full" and fits(recompute="full"):
            out.append("--recompute full")
        if s.dp > 1:
            z = next((z for z in range(s.zero + 1, 4) if fits(zero=z)), None)
            if z is not None:
                out.append(f"--zero {z}")
        else:  # shard over more GPUs: the fewest data-parallel ranks with ZeRO-3 (FSDP)
            d = next((d for d in (2 ** k for k in range(1, MAX_DP.bit_length())) if fits(dp=d, zero=3)), None)
            if d is not None:
                out.append(f"--dp {d} --zero 3 ({d} GPUs, FSDP)")
        if s.precision != "bf16" and fits(precision="bf16"):
            out.append("--precision bf16 (pure bf16 weights, grads and states)")
        opt = next((o for o in ("adamw-8bit", "sgd") if s.optimizer != o and fits(optimizer=o)), None)
        if opt is not None:
            out.append(f"--optimizer {opt}")
    else:
        prec = next((p for p in ("int8", "int4") if s.precision != p and fits(precision=p)), None)
        if prec is not None:
            out.append(f"--precision {prec} (quantised weights)")
        if s.batch > 1:
            b = _largest(1, s.batch - 1, lambda b: fits(batch=b))
            if b >= 1:
                out.append(f"--batch {b}")
    train = s.mode == "train"
    t = next((t for t in range(s.tp + 1, gpu.gpus_per_node + 1)
              if spec.heads % t == 0 and fits(tp=t, sequence_parallel=train)), None)
    if t is not None:
        out.append(f"--tp {t}" + (" --sequence-parallel" if train else "") + f" ({t} GPUs per replica)")
    if s.seq > 1:
        q = _largest(1, s.seq - 1, lambda q: fits(seq=q))
        if q >= 1:
            out.append(f"--seq {q}")
    bigger = sorted((g for g in list_gpus() if g.memory > gpu.memory and g.vendor == gpu.vendor),
                    key=lambda g: (g.memory, g.name))
    g = next((g for g in bigger if fits(on=g)), None)
    if g is not None:
        out.append(f"--gpu {g.name}")
    return out
