"""The --json text: Estimate.to_dict() (the contract: one object per estimate; integer bytes and FLOPs; stable keys)
and the objects around it, serialised."""
from __future__ import annotations

import json
from dataclasses import asdict


def dumps(obj) -> str:
    return json.dumps(obj, indent=2, default=lambda o: asdict(o) if hasattr(o, "__dataclass_fields__") else str(o))
