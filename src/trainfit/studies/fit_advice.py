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


def _fits(spec: ModelSpec, setup: Setup, gpu: GPU, reserve: float) -> bool:
    try:
        e = analytic(spec, setup, gpu, reserve=reserve)
    except TrainfitError:  # a layout the model does not allow
        return False
    return e.time is not None and e.time.fits


def _largest(lo: int, hi: int, ok) -> int:
    """Largest v in [lo, hi] with ok(v), for ok monotone decreasing; lo - 1 if none."""
    if not ok(lo):
        return lo - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return hi if ok(hi) else lo


def fit_advice(spec: ModelSpec, setup: Setup, gpu: GPU, reserve: float = 1.0) -> list[str]:
    """Single changes (as CLI flags, with a short why) under which `setup` fits on `gpu` (keeping `reserve` GiB
    free, as the estimate did); [] if it fits already."""

    def _fits_(spec, setup, gpu):
        return _fits(spec, setup, gpu, reserve)
    if _fits_(spec, setup, gpu):
        return []
    out: list[str] = []
    s = setup
    if s.mode == "train":
        if s.batch > 1:  # smaller micro-batch, more accumulation: the same tokens per step
            b = _largest(1, s.batch - 1, lambda b: _fits_(spec, s.with_(batch=b, grad_accum=-(-s.batch * s.grad_accum // b)), gpu))
            if b >= 1:
                out.append(f"--batch {b} --grad-accum {-(-s.batch * s.grad_accum // b)} (same tokens per step)")
        if s.recompute != "full" and _fits_(spec, s.with_(recompute="full"), gpu):
            out.append("--recompute full")
        if s.dp > 1:
            z = next((z for z in range(s.zero + 1, 4) if _fits_(spec, s.with_(zero=z), gpu)), None)
            if z is not None:
                out.append(f"--zero {z}")
        else:  # shard over more GPUs: the fewest data-parallel ranks with ZeRO-3 (FSDP)
            d = 2
            while d <= MAX_DP and not _fits_(spec, s.with_(dp=d, zero=3), gpu):
                d *= 2
            if d <= MAX_DP:
                out.append(f"--dp {d} --zero 3 ({d} GPUs, FSDP)")
        if s.precision not in ("bf16",) and _fits_(spec, s.with_(precision="bf16"), gpu):
            out.append("--precision bf16 (pure bf16 weights, grads and states)")
        for opt in ("adamw-8bit", "sgd"):
            if s.optimizer != opt and _fits_(spec, s.with_(optimizer=opt), gpu):
                out.append(f"--optimizer {opt}")
                break
    else:
        for prec in ("int8", "int4"):
            if s.precision != prec and _fits_(spec, s.with_(precision=prec), gpu):
                out.append(f"--precision {prec} (quantised weights)")
                break
        if s.batch > 1:
            b = _largest(1, s.batch - 1, lambda b: _fits_(spec, s.with_(batch=b), gpu))
            if b >= 1:
                out.append(f"--batch {b}")
    t = next((t for t in range(s.tp + 1, gpu.gpus_per_node + 1)
              if spec.heads % t == 0 and _fits_(spec, s.with_(tp=t, sequence_parallel=s.mode == "train"), gpu)), None)
    if t is not None:
        out.append(f"--tp {t}" + (" --sequence-parallel" if s.mode == "train" else "") + f" ({t} GPUs per replica)")
    if s.seq > 1:
        q = _largest(1, s.seq - 1, lambda q: _fits_(spec, s.with_(seq=q), gpu))
        if q >= 1:
            out.append(f"--seq {q}")
    bigger = sorted((g for g in list_gpus() if g.memory > gpu.memory and g.vendor == gpu.vendor),
                    key=lambda g: (g.memory, g.name))
    g = next((g for g in bigger if _fits_(spec, s, g)), None)
    if g is not None:
        out.append(f"--gpu {g.name}")
    return out
