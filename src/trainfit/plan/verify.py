"""--verify: confirm the top plans' analytic peaks with the trace engine (a fake-tensor run of the real model).

Each plan's setup goes through trainfit.engines.trace, as `trainfit estimate --engine trace` does: one rank of the
step, the sharded one (DDP, ZeRO, FSDP2 on a fake process group) when dp > 1. A plan the trace engine does not
run (tp/pp, a stack whose step it does not run) is skipped with the engine's own one-line reason; without torch
the whole check is skipped with one note.
"""
from __future__ import annotations

import time

from .. import engines
from ..errors import TrainfitError

# NB: tracing cost grows with layers × width even with layer extrapolation; above this many parameters per rank
# we skip rather than keep the user waiting (a 7B step traces in a few seconds on 2 cores).
MAX_TRACE_PARAMS = 20e9


def verify(spec, candidates, max_params: float = MAX_TRACE_PARAMS) -> tuple[list[dict], str | None]:
    """Per candidate: {"trace_peak", "analytic_peak", "gap", "trace_seconds"} (gap = (analytic - trace) / trace)
    or {"skipped": why}; and a note when the trace engine is not installed."""
    missing = engines.missing_extra("trace")
    if missing is not None:
        return [], f"--verify skipped: {missing}"
    out = []
    for c in candidates:
        if c.estimate.params_per_rank > max_params:
            out.append({"skipped": f"{c.estimate.params_per_rank / 1e9:.0f}B parameters per rank is too large to trace quickly"})
            continue
        t0 = time.perf_counter()
        try:
            tr = engines.trace(spec, c.setup, flops=False)
        except TrainfitError as e:  # a layout or stack the trace engine does not run: its one-line reason
            out.append({"skipped": f"trace engine: {e}"})
            continue
        except Exception as e:  # a failure inside the trace: named, and the other plans still checked
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            out.append({"skipped": f"trace engine: {type(e).__name__}: {first}"})
            continue
        a, t = c.estimate.memory.peak, tr.memory.peak
        out.append({"trace_peak": t, "analytic_peak": a, "gap": (a - t) / t if t else None,
                    "trace_seconds": time.perf_counter() - t0})
    for c, v in zip(candidates, out):
        c.verify = v
    return out, None
