"""The --json contract (issue 2): one object per estimate; integer bytes and FLOPs; stable keys."""
from __future__ import annotations

import json
from dataclasses import asdict

from ..estimate import Estimate


def estimate_dict(e: Estimate) -> dict:
    d = {
        "engine": e.engine,
        "model": e.model,
        "mode": e.setup.mode,
        "params": e.params,
        "params_per_rank": e.params_per_rank,
        "setup": asdict(e.setup),
        "memory": asdict(e.memory),
        "flops": asdict(e.flops),
        "notes": list(e.notes),
        "detail": e.detail,
    }
    # host bytes of what is offloaded (ZeRO-Offload's states, analytic/parallel/deepspeed.py; activations,
    # analytic/memory.py); 0 when nothing is
    d["memory"]["host_memory"] = int((e.detail or {}).get("host_memory", 0))
    if e.setup.mode == "train":  # the stack modelled and the defaults it resolved (trainfit/stacks/*.toml)
        st = e.setup.stack_facts
        d["stack"] = {"name": st.name, "version": st.version, "summary": st.summary,
                      "optimizer_kernel": e.setup.optimizer_kernel, "recompute": e.setup.recompute}
    if e.setup.mode == "rl" and "rl" in (e.detail or {}):  # the RL step's shape, models, phase times (analytic/rl.py)
        d["rl"] = e.detail["rl"]
    if e.setup.mode == "serve":  # the serving engine's sizing: KV tokens, blocks, concurrency (analytic/serving.py)
        d["serving"] = e.detail["serving"]
    if e.time is not None:
        d["time"] = {k: v for k, v in asdict(e.time).items() if v is not None}
    if e.fit is not None:  # the fit rule's verdict (analytic/fit_rule.py): required within capacity
        d["fit"] = asdict(e.fit)
    return d


def dumps(obj) -> str:
    return json.dumps(obj, indent=2, default=lambda o: asdict(o) if hasattr(o, "__dataclass_fields__") else str(o))
