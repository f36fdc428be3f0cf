"""The memory knobs `trainfit plan` adds to a layout when no plain plan fits: Liger's kernels, the tiled MLP,
DeepSpeed-Ulysses, activation offload and ZeRO-Offload / ZeRO-Infinity (FSDP2 CPU offload on hf), each where the
stack runs it (stacks/<stack>.toml [features] runs and [parallel] axes; the setting's own rules refuse the rest).

Search order (LEVELS): the fastest way first, the next slower one only when nothing fits — the HF Transformers
DeepSpeed guide's rule for choosing ZeRO stages and offloads ("We start with the fastest approach and if running into
GPU OOM we then go to the next slower approach", huggingface.co/docs/transformers/v4.30.0/main_classes/deepspeed, "How
to Choose Which ZeRO Stage and Offloads To Use For Best Performance"; speed-wise "Stage 2 > Stage 2 + offload > Stage 3
> Stage 3 + offloads"). The levels, in ArcticTraining's long-sequence recipe (ALST, Bekman et al. 2025, arXiv
2506.13996): kernels on the same GPUs (Liger's fused loss and kernels, the tiled MLP: no extra traffic), then the
sequence over GPUs (Ulysses: all-to-alls inside the data-parallel ranks), then the checkpointed activations in host
memory (PCIe each layer), then the model states in host memory (the optimizer step on the CPU). NB: a later level can
be faster than an earlier one for some model (the levels' order is the guide's, not timed), so a plan found at level
k is the fastest of level k, not always the fastest overall.
"""
from __future__ import annotations

from ..analytic.layout import model_takes
from ..setup import Setup
from ..spec import ModelSpec
from ..stacks import get_stack
from .space import Layout, divisors

LEVELS = ("kernels", "ulysses", "activation offload", "state offload")
# the knobs by name (PlanQuery.knobs: those a search may use; --emit keeps those its config holds)
ALL = ("liger", "tiled_mlp", "ulysses", "offload-activations", "offload-states")
STATES = ("optimizer", "params")


def kernels(spec: ModelSpec, stack: str) -> dict:
    """Liger and the tiled MLP (auto: ArcticTraining's tile count), where the stack and the model run them."""
    st, out = get_stack(stack), {}
    if st.runs("liger-loss") and model_takes(spec, liger=True):
        out["liger"] = True
    if st.runs("tiled-mlp") and model_takes(spec, tiled_mlp=0):
        out["tiled_mlp"] = 0
    return out


def ulysses_degrees(spec: ModelSpec, stack: str, lay: Layout, seq: int) -> list[int]:
    """Ulysses degrees > 1 of a data-parallel-only layout: dividing --dp (DeepSpeed carves the groups out of the
    data-parallel ranks, parallel_state_sp.py:37-56), the heads (ulysses_sp.py:147-153) and the sequence (:706-707)."""
    if not get_stack(stack).runs("ulysses") or (lay.tp, lay.pp, lay.cp) != (1, 1, 1):
        return []
    return [n for n in divisors(lay.dp) if n > 1 and seq % n == 0 and spec.heads % n == 0
            and (spec.kv_heads % n == 0 or n % spec.kv_heads == 0)]  # (analytic/layout.py validate_layout)


def state_offloads(stack: str) -> tuple[str, ...]:
    """The --offload states the stack runs: ZeRO-Offload / -Infinity ([parallel] axes offload), FSDP2's CPU offload
    policy ([cpu_offload]) or torchao's CPUOffloadOptimizer ([features] cpu-offload-optimizer)."""
    st = get_stack(stack)
    out = list(STATES) if "offload" in st.axes else []
    if st.facts.get("cpu_offload") is not None and "params" not in out:
        out.append("params")
    if st.runs("cpu-offload-optimizer") and "optimizer" not in out:
        out.insert(0, "optimizer")
    return tuple(out)


def levels(spec: ModelSpec, stack: str, lay: Layout, seq: int, allowed: tuple[str, ...] = ALL) -> list[list[dict]]:
    """The settings tried on `lay` under `stack`, one list per LEVELS entry (empty where the stack runs none), of
    the knobs `allowed` (ALL names)."""
    k = {n: v for n, v in kernels(spec, stack).items() if n in allowed}
    uly = ([{**k, "ulysses": n} for n in ulysses_degrees(spec, stack, lay, seq)] if "ulysses" in allowed else [])
    acts = ([{**k, **u, "offload": "activations"} for u in [{}] + uly]
            if get_stack(stack).runs("activation-offload") and "offload-activations" in allowed else [])
    states = state_offloads(stack) if "offload-states" in allowed else ()
    st = [{"offload": s} for s in states] + [{**a, "offload": f"activations+{s}"} for a in acts for s in states]
    return [[k] if k else [], uly, acts, st]


def setup_flags(s: Setup) -> str:
    """The CLI flags of the memory knobs a plan's setup runs ("" for a plain plan)."""
    return flags({"liger": s.liger, "ulysses": s.ulysses, "offload": s.offload,
                  **({"tiled_mlp": s.tiled_mlp} if s.tiled_mlp is not None else {})})


def flags(extra: dict) -> str:
    """The CLI flags of a level's settings."""
    out = []
    if extra.get("liger"):
        out.append("--liger")
    if "tiled_mlp" in extra:
        out.append(f"--tiled-mlp {extra['tiled_mlp'] or 'auto'}")
    if extra.get("ulysses", 1) > 1:
        out.append(f"--ulysses {extra['ulysses']}")
    if extra.get("offload", "none") != "none":
        out.append(f"--offload {extra['offload']}")
    return " ".join(out)


def judged_knobs(knobs: tuple[str, ...], gpu) -> tuple[str, ...]:
    """The knobs searched on `gpu`: the offloads only where the node's host memory is known (--host-memory, or a
    cluster file's node), since an offloaded plan fits or not by the host as much as by the device
    (fit_rule.host_verdict); elsewhere they are named, not planned (diagnose.py)."""
    return knobs if gpu.host_memory else tuple(k for k in knobs if not k.startswith("offload"))
