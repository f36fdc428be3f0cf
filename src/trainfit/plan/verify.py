"""--verify: confirm the top plans' analytic peaks with the trace engine (fake-tensor run of the real model).

The trace engine is optional (torch + transformers) and traces one rank of a setup; it is imported lazily and
skipped, with a note, when absent or when the model is too large to trace in reasonable time.
"""
from __future__ import annotations

import time

# NB: tracing cost grows with layers × width even with layer extrapolation; above this many parameters per rank
# we skip rather than keep the user waiting (a 7B step traces in a few seconds on 2 cores).
MAX_TRACE_PARAMS = 20e9


def verify(spec, candidates, max_params: float = MAX_TRACE_PARAMS) -> tuple[list[dict], str | None]:
    """Per candidate: {"trace_peak", "analytic_peak", "gap"} (gap = (analytic - trace) / trace); or a note."""
    try:
        from ..trace.engine import trace_spec
    except ImportError as e:
        return [], f"--verify skipped: the trace engine is unavailable ({e}); pip install 'trainfit[torch]'"
    out = []
    for c in candidates:
        if c.estimate.params_per_rank > max_params:
            out.append({"skipped": f"{c.estimate.params_per_rank / 1e9:.0f}B parameters per rank is too large to trace quickly"})
            continue
        t0 = time.perf_counter()
        try:
            tr = trace_spec(spec, c.setup, flops=False)
        except Exception as e:  # the trace engine may not support a layout (e.g. pipeline stages): say so, go on
            out.append({"skipped": f"trace engine: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"})
            continue
        a, t = c.estimate.memory.peak, tr.memory.peak
        out.append({"trace_peak": t, "analytic_peak": a, "gap": (a - t) / t if t else None,
                    "trace_seconds": time.perf_counter() - t0})
    for c, v in zip(candidates, out):
        c.verify = v
    return out, None
