"""The one result type every engine returns (DESIGN.md §2): compare engines field by field."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .setup import Setup

PHASES = ("forward_end", "backward", "optimizer_step")  # training; inference uses "prefill" / "decode"


@dataclass(frozen=True)
class Memory:
    """Bytes per GPU rank. Categories are what is resident at the peak's phase, except `activations`,
    which is the most saved for backward at any time (forward end)."""

    weights: int
    gradients: int
    optimizer_states: int
    master_weights: int
    activations: int
    temporaries: int
    kv_cache: int
    peak: int
    peak_phase: str
    phases: dict[str, int]  # total live bytes at each phase's high point
    at_peak: dict[str, int] = field(default_factory=dict)  # category -> bytes live at the peak


@dataclass(frozen=True)
class Flops:
    forward: int  # per optimizer step, per rank (all micro-batches)
    backward: int
    recompute: int
    step: int  # hardware FLOPs: forward + backward + recompute
    model_step: int  # model FLOPs (no recompute), the numerator of MFU
    per_token: int  # model FLOPs per trained token


@dataclass(frozen=True)
class Timing:
    gpu: str
    mfu: float
    step_seconds: float
    tokens_per_second: float  # whole job (all ranks)
    fits: bool
    headroom: int  # GPU memory minus peak (negative: does not fit)
    # with --tokens:
    train_tokens: float | None = None
    train_seconds: float | None = None
    gpu_hours: float | None = None
    cost_usd: float | None = None
    energy_kwh: float | None = None
    # inference
    prefill_seconds: float | None = None
    decode_tokens_per_second: float | None = None
    max_batch: int | None = None
    max_seq: int | None = None


@dataclass(frozen=True)
class Estimate:
    engine: str
    model: str
    params: int  # whole model
    params_per_rank: int
    setup: Setup
    memory: Memory
    flops: Flops
    time: Timing | None = None
    notes: tuple[str, ...] = ()
    detail: dict = field(default_factory=dict)  # engine-specific extras (per-layer breakdown, top tensors, ...)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["mode"] = self.setup.mode
        return d
