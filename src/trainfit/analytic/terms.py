"""Which fields of a step-time result (StepTime.as_dict(): trainfit.estimate, made by analytic/step_time.py) are
seconds of the step, read generically so that new terms appear in the reports and the energy model without code
changes."""
from __future__ import annotations

# StepTime fields that are not a share of the step: totals, rates, ratios and labels.
NOT_TERMS = frozenset({"step_seconds", "tokens_per_second", "mfu", "hfu", "efficiency", "dp_comm_total",
                       "dp_bandwidth"})


def time_terms(step: dict) -> dict[str, float]:
    """name -> seconds of every term of the step, in StepTime's order (zero terms included). StepTime lists its
    terms first and `step_seconds` after them, so the fields after `step_seconds` (rates, ratios, totals, and any
    such field added later) are never read as terms; NOT_TERMS guards dicts in another order."""
    out = {}
    for k, v in step.items():
        if k == "step_seconds":
            break
        if k not in NOT_TERMS and isinstance(v, (int, float)) and not isinstance(v, bool):
            out[k] = float(v)
    return out


def is_waiting(name: str) -> bool:
    """The GPU runs no compute kernel of its own: the pipeline bubble (waiting on other stages), exposed
    communication (`*_comm`: waiting on the network; NCCL's kernels hold a few SMs) and the host's kernel launches
    (`host_issue`: the GPU idles between short kernels), and the job's slowest GPU (`straggler`: the others wait
    for it at each collective)."""
    return name in ("bubble", "host_issue", "straggler") or name.endswith("_comm")
