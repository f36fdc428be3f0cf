"""The --json text: Estimate.to_dict() (the contract: one object per estimate; integer bytes and FLOPs; stable keys)
and the objects around it, serialised."""
from __future__ import annotations

import json
import math
from dataclasses import asdict


def dumps(obj) -> str:
    """JSON text (RFC 8259: no NaN or Infinity, which json.dumps would write as bare words no JSON parser reads): a
    number that is not finite is null, as "not known"."""
    return json.dumps(finite(obj), indent=2,
                      default=lambda o: finite(asdict(o)) if hasattr(o, "__dataclass_fields__") else str(o))


def finite(obj):
    """`obj` with every float that is not finite (inf, nan) as None, through dicts, lists and tuples."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj
