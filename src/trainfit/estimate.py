"""The one result type every engine returns (DESIGN.md §2): compare engines field by field."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum

from .setup import Setup


class Category(str, Enum):
    """What holds memory: the one vocabulary of `Memory.at_peak` in every engine, the reports and the JSON."""

    WEIGHTS = "weights"  # parameters as the model holds them
    BUFFERS = "buffers"  # non-parameter module state (rotary tables, BatchNorm statistics)
    MASTER_WEIGHTS = "master_weights"  # fp32 copies the optimizer updates (bf16-master)
    OPTIMIZER_STATES = "optimizer_states"
    COMM_BUFFERS = "comm_buffers"  # DDP gradient buckets, ZeRO/FSDP flat buffers
    GRADIENTS = "gradients"
    ACTIVATIONS = "activations"  # saved for backward
    KV_CACHE = "kv_cache"
    TEMPORARIES = "temporaries"  # made and freed within the phase
    INPUTS = "inputs"  # the batch
    OTHER = "other"  # not attributable by the engine (measure: from allocation records alone)


class Phase(str, Enum):
    FORWARD_END = "forward_end"
    BACKWARD = "backward"
    OPTIMIZER_STEP = "optimizer_step"
    PREFILL = "prefill"
    DECODE = "decode"
    # an RL step (analytic/rl.py): the rollout's generation, the frozen models' scoring, PPO's critic update
    GENERATE = "generate"
    SCORE = "score"
    CRITIC_STEP = "critic_step"


CATEGORY_NAMES = frozenset(c.value for c in Category)
PHASE_NAMES = frozenset(p.value for p in Phase)
PHASES = (Phase.FORWARD_END.value, Phase.BACKWARD.value, Phase.OPTIMIZER_STEP.value)  # training phases


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
    at_peak: dict[str, int] = field(default_factory=dict)  # Category value -> bytes live at the peak
    # what the GPU really holds (issue 13): the caching allocator's reserved bytes at the peak (allocated + cached
    # blocks and segment slack), and reserved + the fixed overheads (CUDA context, cuBLAS workspaces, NCCL
    # buffers) = what nvidia-smi shows; None where the engine does not model them
    reserved: int | None = None
    device_total: int | None = None
    overheads: dict[str, int] = field(default_factory=dict)  # fixed overhead name -> bytes (in device_total)
    # what the step's tensors need from the caching allocator for every request to be served on a device that has
    # no more (analytic/fit_rule.py): the peak + the fragmentation its OOM path cannot release; less than reserved,
    # whose freed blocks a constrained run gives back. None where the engine does not model it
    required: int | None = None

    def __post_init__(self) -> None:
        # every engine fills the same Memory the same way: Category names, Phase names
        bad = set(self.at_peak) - CATEGORY_NAMES
        if bad:
            raise ValueError(f"Memory.at_peak keys must be Category values, got {sorted(bad)}")
        if self.peak_phase not in PHASE_NAMES or set(self.phases) - PHASE_NAMES:
            raise ValueError(f"Memory phases must be Phase values, got {self.peak_phase!r} / {sorted(self.phases)}")


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
    headroom: int  # Estimate.fit's (capacity - required); a serving engine's: GPU memory - --reserve - device total
    gpu_memory: int | None = None  # bytes of device memory judged against (the catalog's, a --gpu file's or --gpu-memory)
    # with --tokens:
    train_tokens: float | None = None
    train_seconds: float | None = None
    gpu_hours: float | None = None
    cost_usd: float | None = None
    energy_kwh: float | None = None  # GPU boards at average_power_watts (analytic/energy.py)
    average_power_watts: float | None = None
    # inference
    prefill_seconds: float | None = None
    decode_tokens_per_second: float | None = None
    max_batch: int | None = None
    max_seq: int | None = None


@dataclass(frozen=True)
class Fit:
    """The fit rule's verdict on one GPU (analytic/fit_rule.py verdict): fits <=> required <= capacity."""

    gpu: str
    gpu_memory: int  # bytes of device memory judged against (the catalog's, a --gpu file's or --gpu-memory)
    capacity: int  # bytes the step's tensors may take: GPU memory - --reserve - fixed overheads (fit_rule.capacity)
    required: int  # what they need (Memory.required), with the paged optimizer states resident beside them
    headroom: int  # capacity - required (negative: does not fit)
    fits: bool


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
    fit: Fit | None = None  # with a GPU, where the engine judges the fit (Timing.fits/headroom repeat it)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["mode"] = self.setup.mode
        return d
