"""The one result type every engine returns (DESIGN.md §2): compare engines field by field."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
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
    WEIGHT_SYNC = "weight_sync"  # the switch to generation: the actor's weights into the rollout engine


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
    # the most sequences held at once, each of max_batch_tokens tokens (--mode infer: the largest batch at --seq;
    # --mode serve: the requests of --prompt-len + --completion-len running at once under load)
    max_batch: int | None = None
    max_batch_tokens: int | None = None
    # --mode infer: the longest context at --batch; --mode serve: the model length (--max-model-len), the longest
    # request the server takes (how many of those fit at once: serving.max_concurrent_sequences), not max_batch's
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
    # the node's host memory (analytic/fit_rule.py host_verdict): what the node's ranks keep there (offloaded states,
    # pinned buffers) and the node's capacity (--host-memory or the cluster's); None: nothing offloaded / not known
    host_required: int | None = None
    host_capacity: int | None = None


@dataclass(frozen=True)
class StepTime:
    """Seconds per optimizer step, by term (the step-time model, analytic/step_time.py); the terms add up to
    `step_seconds`."""

    compute: float  # forward + backward matmul time of all micro-batches (excl. recompute)
    recompute: float
    tp_comm: float  # tensor-parallel all-reduces (critical path)
    cp_comm: float  # exposed ring-attention K/V passing (context parallelism)
    ep_comm: float  # expert-parallel all-to-alls (critical path)
    pp_comm: float  # pipeline point-to-point sends
    bubble: float  # pipeline fill and drain: (p−1)/v micro-batch times
    dp_comm: float  # exposed data-parallel communication (after overlap)
    optimizer: float  # optimizer.step(): memory-bound elementwise update
    host_copies: float  # exposed GPU <-> host copies: offloaded activations (after overlap), evicted paged states
    host_issue: float  # the GPU waiting on an eager host's kernel launches (host_issue_exposed)
    straggler: float  # the job's slowest GPU over the mean chip in the compute-bound kernels (stragglers.py)
    step_seconds: float
    tokens_per_second: float
    mfu: float  # model FLOPs (no recompute) / (world × step × peak)
    hfu: float  # hardware FLOPs (with recompute) / (world × step × peak)
    dp_comm_total: float  # DP communication before overlap (for the reader)
    dp_bandwidth: str  # "intra" or "inter"
    efficiency: float  # FLOPs of the matmuls + attention / (their time × the compute dtype's dense peak); fp8 GEMMs
    #                    can lift it past 1 — or, under the flat override, the fraction given
    # seconds of the step's compute (compute + recompute) by kind: gemm, attention, memory (memory-bound kernels),
    # launches (kernel launch cost); empty under the flat --efficiency override
    compute_terms: dict = field(default_factory=dict)
    kernels: float = 0.0  # kernels launched per step, the optimizer's included (what host_issue counts); 0 if flat
    optimizer_casts: float = 0.0  # of `optimizer`: the fp32 master's casts run as their own copy kernels
    grad_clip: float = 0.0  # of `optimizer`: the stack's gradient clipping (passes, launches, norm all-reduces)

    def as_dict(self) -> dict:
        """asdict(self) without its recursion: the fields are numbers and a string but compute_terms, a dict of
        numbers (copied, as asdict copies it)."""
        d = {name: getattr(self, name) for name in _STEP_TIME_FIELDS}
        d["compute_terms"] = dict(self.compute_terms)
        return d


_STEP_TIME_FIELDS = tuple(f.name for f in fields(StepTime))


@dataclass(frozen=True)
class PassTime:
    """One inference pass (the prefill, or one decode step) timed op by op (analytic/infer_time.py)."""

    gpu_seconds: float  # seconds of the pass's kernels on the GPU
    kernels: float  # count of kernels launched
    host_bound: bool  # the host's kernel issue outlasts the GPU's work

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Serving:
    """A serving engine's start-up sizing on one GPU (analytic/serving.py vLLM, analytic/serving_sglang.py SGLang):
    what both servers have, and each one's own settings under its own names in `knobs`."""

    server: str  # "vllm" or "sglang"
    version: str  # the server's version modelled
    max_model_len: int  # tokens: the longest request served (SGLang's context_length)
    kv_cache_dtype: str
    cuda_total: int  # bytes: the device's total as cudaMemGetInfo reports it
    requested: int  # bytes the engine takes for weights and KV cache (vLLM: and activations, CUDA graphs)
    weights: int  # bytes
    activation_peak: int  # bytes: the largest eager transient (vLLM's profile run; SGLang's chunk or logits)
    cuda_graphs: int  # bytes
    available_kv: int  # bytes left for the KV cache
    kv_bytes_per_token: float  # bytes: this GPU's layers and heads (+ a draft's)
    kv_blocks: int  # count: vLLM's blocks, SGLang's pages
    kv_tokens: int  # tokens the KV cache holds
    max_concurrent_sequences: float  # count of max_model_len requests the KV cache holds at once
    # the server's own settings and sizing, under its own names: vLLM gpu_memory_utilization,
    # max_num_batched_tokens, max_num_seqs, block_size, cuda_graph_sizes; SGLang mem_fraction_static,
    # context_length, chunked_prefill_size, cuda_graph_max_bs, page_size, pre_model_load, headroom, remainder_short,
    # max_total_num_tokens, max_running_requests and, with speculative decoding, speculative_algorithm,
    # draft_model, draft_layers, draft_weights, speculative_num_steps, speculative_eagle_topk,
    # speculative_num_draft_tokens
    knobs: dict = field(default_factory=dict)
    # under load (analytic/serving_time.py ServingTime.as_dict): concurrency, prompt_len, output_len, ttft_seconds,
    # tpot_seconds, output_tokens_per_second (one replica) and _per_gpu, the engine step's tokens and seconds by part
    load: dict = field(default_factory=dict)
    experts_format: str | None = None  # the routed experts' format where loaded as the checkpoint stores them (mxfp4)
    quant_as_stored: bool = False  # --quant is the checkpoint's own quant_method (ModelSpec.checkpoint_quant)

    def as_dict(self) -> dict:
        return {**{f.name: getattr(self, f.name) for f in fields(self) if f.name != "knobs"}, **self.knobs}


@dataclass(frozen=True)
class RLStep:
    """An RL post-training step's shape, models and phase times (analytic/rl.py, docs/rl.md)."""

    algo: str  # grpo or ppo
    rollout: str  # who generates: hf or vllm
    prompts: int  # count per GPU per optimizer step
    completions: int  # count generated at once (prompts × group size)
    micro_batch: int  # completions per training micro-batch
    grad_accum: int  # count of micro-batches
    prompt_len: int  # tokens
    completion_len: int  # tokens
    models: dict[str, str]  # role -> model name
    scored_by: list[str]  # roles scoring the completions, in order
    resident: dict[str, int]  # role -> bytes the model holds between phases
    rollout_buffers: int  # bytes of the generation batch kept through the step
    engine: int  # bytes of a colocated vLLM engine, held through every phase (0 for HF)
    phase_seconds: dict[str, float]  # phase -> seconds (empty without a GPU)
    serving: Serving | None = None  # --rollout vllm: the colocated engine's sizing
    # the rollout's own records: vLLM kv_tokens_needed (tokens of all completions); HF kv_bytes_per_token (bytes),
    # prefill_peak and decode_peak (bytes)
    rollout_records: dict = field(default_factory=dict)
    # --dp GPUs (analytic/rl_placement.py): placement, groups (group -> GPUs), host_per_gpu and host_per_node
    # (bytes offloaded), transfers (what -> bytes each way per GPU per step), sync_bytes; empty on TRL's one GPU
    placement: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("serving", "rollout_records")}
        if self.serving is not None:
            d["serving"] = self.serving.as_dict()
        return {**d, **self.rollout_records}


@dataclass(frozen=True)
class Detail:
    """What an estimate says beyond Memory, Flops and Timing: the common vocabulary, typed (None: not modelled
    by this engine or mode), and each engine's own free-form `records`.

    records, by engine:
      analytic  training: the peak stage's memory terms (analytic/memory.py, megatron_memory.py): stage,
                layers_on_rank, in_flight_microbatches (count), activation_per_layer, attention_scores_per_layer,
                autocast_weight_copies_per_layer, logits_buffers, optimizer_temporaries, zero3_gathered_params
                (bytes), activation_terms_per_token (bytes per token by kind), ...; vision: buffers, inputs
                (bytes), param_tensors (count)
      trace     timeline, top_tensors, activations_by_module (bytes), baseline (bytes by kind), storages (count),
                trace_seconds (s), segments (the allocator simulator's, bytes -> count), flops_by_module,
                decode_flops (inference), cpu_isa, kernel_scratch (CPU runs), extrapolated_from_layers,
                timeline_layers, reserved_from (extrapolated traces), example_batch (a user's module traced on
                inputs without token ids, trace/user.py: name -> [shape, dtype]; its FLOPs per_token are per sample)
      measure   phase_peaks, baseline, inputs, rss_peak, reserved_peak, device_used (bytes), step_times or
                prefill_times and decode_seconds (s), kv_cache_decode (bytes); per torch.distributed rank: rank,
                host, comm_seconds (s), comm_buffers (bytes), strategy; the rank chosen of several: rank_peaks
                (rank -> bytes)
    """

    params_active: int | None = None  # count of parameters each token runs through (MoE: the routed experts')
    params_trainable: int | None = None  # count of LoRA adapters' parameters (only they train)
    head: str | None = None  # the task head trained (trainfit.heads)
    num_labels: int | None = None  # count of a classifier head's outputs
    image_size: int | None = None  # pixels per image side (vision models)
    # bytes in host memory: offloaded optimizer states or activations, evicted paged optimizer states
    host_memory: int | None = None
    paged_optimizer_states: int | None = None  # bytes of bitsandbytes' paged states (CUDA unified memory)
    kv_bytes_per_token: float | None = None  # bytes of KV cache per token (inference)
    step_time: StepTime | None = None  # the training step's time by term (the step-time model; not under --mfu)
    prefill: PassTime | None = None  # inference timed op by op (not under --mfu)
    decode: PassTime | None = None
    serving: Serving | None = None  # --mode serve: the serving engine's sizing
    rl: RLStep | None = None  # --mode rl
    records: dict = field(default_factory=dict)  # the engine's own, by name (see the class doc)

    def __post_init__(self) -> None:
        clash = set(self.records) & {f.name for f in fields(self)}
        if clash:
            raise ValueError(f"Detail.records must not repeat its typed fields, got {sorted(clash)}")

    def with_records(self, **records) -> "Detail":
        """This detail with `records` added (replacing any of the same name)."""
        return replace(self, records={**self.records, **records})

    def as_dict(self) -> dict:
        """The typed fields that are set (nested ones as dicts) and the records, in one object."""
        d = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name != "records" and v is not None:
                d[f.name] = v.as_dict() if hasattr(v, "as_dict") else v
        return {**d, **self.records}


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
    detail: Detail = field(default_factory=Detail)
    fit: Fit | None = None  # with a GPU, where the engine judges the fit (Timing.fits/headroom repeat it)

    def to_dict(self) -> dict:
        """The --json contract (issue 2): one object per estimate; integer bytes and FLOPs; stable keys."""
        s = self.setup
        d = {"engine": self.engine, "model": self.model, "mode": s.mode, "params": self.params,
             "params_per_rank": self.params_per_rank, "setup": asdict(s), "memory": asdict(self.memory),
             "flops": asdict(self.flops), "notes": list(self.notes), "detail": self.detail.as_dict()}
        # host bytes of what is offloaded or evicted (Detail.host_memory); 0 when nothing is
        d["memory"]["host_memory"] = self.detail.host_memory or 0
        if s.mode == "train":  # the stack modelled and the defaults it resolved (trainfit/stacks/*.toml)
            st = s.stack_facts
            d["stack"] = {"name": st.name, "version": st.version, "summary": st.summary,
                          "optimizer_kernel": s.optimizer_kernel, "recompute": s.recompute}
        if s.mode == "rl" and self.detail.rl is not None:  # the RL step's shape, models, phase times
            d["rl"] = self.detail.rl.as_dict()
        if s.mode == "serve" and self.detail.serving is not None:  # the serving engine's sizing
            d["serving"] = self.detail.serving.as_dict()
        if self.time is not None:
            d["time"] = {k: v for k, v in asdict(self.time).items() if v is not None}
        if self.fit is not None:  # the fit rule's verdict (analytic/fit_rule.py): required within capacity
            d["fit"] = asdict(self.fit)
        return d
