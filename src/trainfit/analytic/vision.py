"""The analytic engine for image classifiers (ResNet, ConvNeXt, ViT): a training step's memory by phase, FLOPs and
time, in the same Estimate as the transformer engine (engine.py), with no torch.

The step is the HF eager step trainfit runs (trainfit.step.standard: gradients set to None, forward + loss,
backward, optimizer.step). Memory is walked op by op over vision_graph's op list, in forward order and then in
reverse (autograd runs a node once every consumer of its output has run; with one node per op, reverse creation
order): a tensor lives from its op to its last forward consumer, or while an op that saved it has not run its
backward (the engine releases a node's saved variables after it runs: torch/csrc/autograd/engine.cpp
call_function, release_variables without retain_graph). A gradient buffer lives from the first consumer's
backward to its producer's; a second gradient into the same tensor (the residual's two branches) is summed into
the first (torch/csrc/autograd/input_buffer.cpp accumulate). A residual add's backward hands its gradient to
both branches without a copy, except to a branch of a narrower dtype (a 16-bit output added to the fp32 stream),
which gets a cast (engine.cpp validate_outputs). Under autocast a weight's 16-bit gradient is cast to the fp32
.grad by the cast's own node (ToCopyBackward0), which runs after the op's node has released its gradient input and
saved tensors. On CUDA every tensor is rounded up to the caching allocator's 512-byte block
(CUDACachingAllocator.cpp kMinBlockSize; alloc/caching_allocator.py K_MIN_BLOCK).
Against the trace engine (tests/models/test_vision.py, docs/benchmarks/models.md): exact on the tiny ResNets and ViT in
fp32 and amp; ViT bf16 +0.3 %; ConvNeXt within 2.4 % (NB: under autocast: HF's ConvNextModel keeps the
stem's fp32 output in a Python local through the encoder, not modelled).

NB: reserved is the peak plus the cuBLAS workspace: the cached blocks of tensors freed before the peak are not
modelled for vision models (under).
NB: cuDNN's convolution workspace (picked per algorithm by cuDNN's heuristics or benchmark, taken from the caching
allocator and freed within the op) is not counted: an under-count by up to the largest conv's workspace at the
peak (and it stays cached: reserved). On a CPU, oneDNN's per-op scratch (measured by trace/kernel_scratch.py) is
not counted either.
NB: --channels-last changes strides, not sizes: a channels_last tensor holds the same N·C·H·W elements
(torch.empty(..., memory_format=torch.channels_last).nbytes equals the contiguous tensor's), so no byte here
changes; it changes which cuDNN kernels run (NHWC tensor-core kernels), i.e. time, not memory: the step time
(analytic/vision_time.py) drops cuDNN's NCHW<->NHWC transposes around tensor-core convs.

--recompute full (ViT: transformers checkpoints every ViTLayer, vision_setup.CHECKPOINTS): non-reentrant
torch.utils.checkpoint keeps each layer's input (its frame's saved inputs) and packs nothing else of the layer; in
the backward the layer's first unpack reruns its forward, keeping what each op saves, and stops at the last
packed tensor (vision_graph.checkpointed). The walk replays that rerun before the layer's backward (recompute);
autocast's weight casts made in a checkpointed forward stay in autocast's cache until the forward ends. Against
the trace engine running transformers' own checkpointing (tests/models/test_vision_recompute.py): tiny-vit fp32
exact, amp +0.02 %, bf16 +0.12 %; the trace equals a real CPU step (measure).

Step time: every kernel of the step timed by the roofline (analytic/vision_time.py: convs as cuDNN implicit GEMMs,
TF32 for fp32 convs where the GPU has it; memory-bound ops at the achieved HBM bandwidth; SDPA; the optimizer step;
the host-issue bound), a StepTime like the token models'; --mfu is an override. Against NVIDIA's published
ResNet-50 v1.5 rows (docs/benchmarks/models.md, out of sample): V100 FP32 −9.5 %, the tensor-core rows +27 % to +42 %
(optimistic).
"""
from __future__ import annotations

from ..alloc.caching_allocator import K_MIN_BLOCK
from ..errors import SetupError
from ..estimate import Detail, Estimate, Flops, Memory, Timing
from ..hardware import GPU
from .. import overheads
from ..units import fmt_bytes
from ..setup import Setup
from ..spec import VisionSpec
from . import fit_rule
from .optimizer import clip_temporaries, optimizer_temporaries
from .precision import state_bytes
from .timing import budget, mfu_step_terms, step_seconds
from ..vision_setup import check_image
from .vision_graph import FP32, HALF, INT64, Op, checkpointed, vision_ops
from .vision_time import dtypes, vision_step_time

OPTIMIZERS = ("sgd", "momentum", "adam", "adamw")
STATES = {"sgd": 1, "momentum": 1, "adam": 2, "adamw": 2}  # state tensors per parameter (sgd: none, st.optimizer 0)
PRECISIONS = ("fp32", "amp-fp16", "amp-bf16", "bf16")
LABEL = INT64  # labels: int64 class indices, one per image


def image_size(spec: VisionSpec, setup: Setup) -> int:
    return setup.image_size or spec.image_size


def image_bytes(spec: VisionSpec, setup: Setup, st) -> int:
    """One micro-batch of images, in the weights' dtype (the HF step casts the batch to the model's dtype)."""
    size = image_size(spec, setup)
    return int(setup.batch * spec.channels * size * size * st.weight)


def check(spec: VisionSpec, setup: Setup) -> None:
    """What the vision engines model: one rank's HF eager training step, with the optimizers and precisions below."""
    if setup.optimizer not in OPTIMIZERS:
        raise SetupError(f"--optimizer {setup.optimizer}: for vision models trainfit models {', '.join(OPTIMIZERS)}")
    if setup.precision not in PRECISIONS:
        raise SetupError(f"--precision {setup.precision}: for vision models trainfit models {', '.join(PRECISIONS)}")
    check_image(spec, image_size(spec, setup))


class _Walk:
    """Live bytes by category while the step runs. Tensors live in storages (views and the in-place add share
    their input's); a storage is freed when no forward consumer, saver or the model's output holds it. Gradients
    live in buffers (a residual's two branches share one). `moment` records a high-point candidate."""

    def __init__(self, rounded: bool, base: dict):
        self.rounded, self.base = rounded, base
        self.storage: dict[str, str] = {}  # tensor -> storage
        self.bytes: dict[str, int] = {}  # live storage -> bytes
        self.refs: dict[str, int] = {}
        self.savers: dict[str, int] = {}  # storage -> ops keeping it for backward
        self.kept = 0  # bytes ops made and keep themselves (statistics, indices, autocast casts)
        self.grads = 0  # parameter .grad bytes made so far
        self.gbuf: dict[str, int] = {}  # tensor -> gradient buffer
        self.gbytes: dict[int, int] = {}
        self.grefs: dict[int, int] = {}
        self.temp = 0
        self.best: dict[str, tuple[int, dict]] = {}

    def r(self, n: float) -> int:
        n = int(n)
        return K_MIN_BLOCK * -(-n // K_MIN_BLOCK) if (self.rounded and n) else n

    def moment(self, phase: str) -> None:
        act = sum(b for s, b in self.bytes.items() if self.savers.get(s)) + self.kept
        tmp = sum(b for s, b in self.bytes.items() if not self.savers.get(s)) + sum(self.gbytes.values()) + self.temp
        at = {**self.base, "gradients": self.grads, "activations": act, "temporaries": tmp}
        total = sum(at.values())
        if total > self.best.get(phase, (-1, {}))[0]:
            self.best[phase] = (total, at)

    def drop(self, t: str, savers: int = 0) -> None:
        s = self.storage.get(t)
        if s is None:
            return
        self.refs[s] -= 1
        self.savers[s] = self.savers.get(s, 0) - savers
        if self.refs[s] <= 0:
            self.bytes.pop(s, None)

    def grad_new(self, t: str, nbytes: int) -> None:
        """A gradient for t: a new buffer, or summed into the one t has (the new one freed after the op)."""
        if t in self.gbuf:
            self.temp += nbytes
            return
        g = len(self.grefs) + 1
        while g in self.grefs:
            g += 1
        self.gbuf[t], self.gbytes[g], self.grefs[g] = g, nbytes, 1

    def grad_share(self, t: str, g: int) -> None:
        if t not in self.gbuf:
            self.gbuf[t] = g
            self.grefs[g] += 1

    def grad_drop(self, t: str) -> None:
        g = self.gbuf.pop(t, None)
        if g is not None:
            self.grefs[g] -= 1
            if self.grefs[g] == 0:
                del self.gbytes[g], self.grefs[g]


def recompute(w: "_Walk", ops: list[Op], first: int, last: int, run) -> None:
    """Rerun ops[first..last] in the backward, keeping what each saves; the early stop comes at the last op's
    saved inputs (autograd packs inputs before the kernel runs: the last op's output is not made, NB: unless it
    saves it)."""
    made = {op.out for op in ops[first:last + 1]}
    uses: dict[str, int] = {}
    for op in ops[first:last + 1]:
        for t in op.ins + op.holds:
            uses[t] = uses.get(t, 0) + 1
    for t, n in uses.items():
        if t not in made:  # the block's input, held by the checkpoint: each rerun consumer takes a reference
            w.refs[w.storage[t]] += n
    for j in range(first, last + 1):
        early_stop = j == last and ops[j].out not in ops[j].saves
        run(j, ops[j], uses.get(ops[j].out, 0), True, "backward", makes=not early_stop)


def walk(spec: VisionSpec, setup: Setup) -> dict:
    """The step's high points: {phase: (bytes, {category: bytes})}, the resident sizes and the op list."""
    st = state_bytes(setup)
    size = image_size(spec, setup)
    ops = vision_ops(spec, setup.batch, size, st.act, int(st.weight), st.autocast)
    w = _Walk(setup.device == "cuda", {})
    r = w.r
    tensors = [n for op in ops for n in op.tensors]
    bn_channels = [op.tensors[0] for op in ops if op.kind == "bn"]
    adam_step = r(FP32) if setup.optimizer in ("adam", "adamw") else 0  # a `step` scalar per tensor (NB: on the
    # device as the trace and the fused kernel keep it; torch's default keeps it on the host)
    w.base = {
        "weights": sum(r(n * st.weight) for n in tensors),
        # BatchNorm running_mean/var in the weights' dtype (Module.to casts floating buffers) + num_batches_tracked
        "buffers": sum(2 * r(c * st.weight) + r(INT64) for c in bn_channels),
        # each state its own tensor (momentum_buffer; exp_avg and exp_avg_sq), rounded one by one
        "optimizer_states": sum(STATES[setup.optimizer] * r(n * st.optimizer / STATES[setup.optimizer]) + adam_step
                                for n in tensors) if st.optimizer else 0,
        # every micro-batch of the step is made before it runs (trainfit.step: a list of batches)
        "inputs": setup.grad_accum * (r(image_bytes(spec, setup, st)) + r(setup.batch * LABEL)),
    }
    accumulating = setup.grad_accum > 1  # the walk is the last micro-batch's: the step's high points
    w.grads = sum(r(n * st.grad) for n in tensors) if accumulating else 0
    consumers: dict[str, int] = {}
    for op in ops:
        for t in op.ins + op.holds:
            consumers[t] = consumers.get(t, 0) + 1
    logits = ops[-1].ins[0]
    own = [sum(r(b) for b in op.own_saved) for op in ops]
    blocks = checkpointed(ops, setup.recompute)
    first_of = {first: name for name, (first, _) in blocks.items()}
    last_of = {last: name for name, (_, last) in blocks.items()}
    held = {}  # block -> its input, kept by the checkpoint
    cache = 0  # autocast's weight casts made in checkpointed blocks: cached until the forward's autocast exits

    def run(i: int, op: Op, uses: int, saving: bool, phase: str, makes: bool = True) -> None:
        """Op i's forward: its output (unless not `makes`), what it keeps (saving) or makes and frees (not
        saving), then its inputs dropped."""
        nonlocal cache
        if makes and op.alias:
            s = w.storage[op.out] = w.storage[op.ins[0]]
            w.refs[s] += uses
        elif makes:
            s = w.storage[op.out] = op.out
            w.bytes[s], w.refs[s] = r(op.out_bytes), uses
        transient = 0
        if saving:
            w.kept += own[i]
            for t in op.saves:
                if t not in w.storage:
                    continue  # the images: an input, resident through the step (w.base)
                s = w.storage[t]
                w.refs[s] += 1
                w.savers[s] = w.savers.get(s, 0) + 1
        else:  # under the checkpoint's pack hook nothing is kept but autocast's cached weight casts
            wcast = r(op.own_saved[-1]) if op.cast_params and op.kind in ("conv", "linear") else 0
            cache += wcast
            w.kept += wcast
            transient = own[i] - wcast
        w.temp = sum(r(b) for b in op.fwd_temp) + transient
        w.moment(phase)
        w.temp = 0
        for t in op.ins + op.holds:
            w.drop(t)

    for i, op in enumerate(ops):
        if i in first_of:  # the checkpoint saves the block's input (torch/utils/checkpoint.py save_inputs)
            held[first_of[i]] = x = op.ins[0]
            w.refs[w.storage[x]] += 1
            w.savers[w.storage[x]] = w.savers.get(w.storage[x], 0) + 1
        # the model's output keeps the logits, and the step the loss, to the step's end
        uses = consumers.get(op.out, 0) + (op.out == logits or op.kind == "loss")
        run(i, op, uses, op.block not in blocks, "forward_end")
    w.kept -= cache  # (autocast_mode.cpp clear_cache on the outermost autocast's exit)
    for i in range(len(ops) - 1, -1, -1):
        op = ops[i]
        if i in last_of:  # its first unpack reruns the block's forward, saving (torch/utils/checkpoint.py)
            first = blocks[last_of[i]][0]
            recompute(w, ops, first, i, run)
        if op.passes_grad:
            # adds and views hand the output's gradient to every input as is, except to an input of a narrower
            # dtype (a promoting add): the engine casts the gradient to it (validate_outputs), a new tensor
            casts = op.grads_in or (0,) * len(op.ins)
            for t, g in zip(op.ins, casts):
                if g:
                    w.grad_new(t, r(g))
                else:
                    w.grad_share(t, w.gbuf[op.out])
            if not op.tensors and not any(casts):
                w.grad_drop(op.out)
                continue
        else:
            for t, g in zip(op.ins, op.grads_in):
                if g:
                    w.grad_new(t, r(g))
        made = sum(r(n * st.grad) for n in op.tensors)
        half = sum(r(n * HALF) for n in op.tensors) if op.cast_params else 0
        # accumulating: the .grad of earlier micro-batches exist; the new gradient is summed into it and freed
        # (torch/csrc/autograd/functions/accumulate_grad.h: variable_grad += new_grad, in place)
        if accumulating:
            w.temp += 0 if half else made
        else:
            w.grads += 0 if half else made
        w.temp += half + sum(r(b) for b in op.bwd_temp)
        w.moment("backward")
        w.temp = 0
        w.grad_drop(op.out)
        w.kept -= own[i]
        for t in op.saves:
            w.drop(t, savers=1)
        if i in first_of:  # the block's last node released its saved tensors: the checkpoint's frame goes
            w.drop(held[first_of[i]], savers=1)
        if half:  # then the casts' ToCopyBackward0 nodes: each 16-bit gradient beside its fp32 .grad
            w.temp, w.grads = (half + made, w.grads) if accumulating else (half, w.grads + made)
            w.moment("backward")
            w.temp = 0
    w.bytes = {s: b for s, b in w.bytes.items() if s == "loss"}  # the step keeps the loss it returns
    w.gbytes, w.kept = {}, 0
    w.grads = sum(r(n * st.grad) for n in tensors)
    # the clip's temporaries come and go before the step's own (step/standard.py clip_gradients)
    w.temp = int(max(optimizer_temporaries(setup, st, sum(tensors), max(tensors)),
                     clip_temporaries(setup, st.grad, len(tensors), max(tensors), r)))
    w.moment("optimizer_step")
    return {"best": w.best, "base": w.base, "ops": ops, "params": sum(tensors), "param_tensors": len(tensors),
            "gradients": w.grads,  # every parameter's .grad, as the step ends its backward
            "saved_at_forward_end": w.best["forward_end"][1]["activations"]}


def step_flops(ops: list[Op]) -> tuple[int, int]:
    """(forward, backward) FLOPs of the convolutions, linears and attention (q·kᵀ and p·v: 4·N²·d per image and
    layer): the backward computes the gradients of both the input and the weight, 2x the forward (NB: the stem's
    input gradient is not computed — the images need none — so this over-counts by the stem's forward FLOPs;
    normalisation, activation and pooling FLOPs are not counted: under)."""
    fwd = sum(op.flops for op in ops if op.kind in ("conv", "linear", "sdpa"))
    return fwd, 2 * fwd


def estimate(spec: VisionSpec, setup: Setup, gpu: GPU | None = None, mfu: float | None = None,
             tokens: float | None = None, reserve: float = 0.0, **_ignored) -> Estimate:
    check(spec, setup)
    res = walk(spec, setup)
    phases = {k: v[0] for k, v in res["best"].items()}
    phase = max(phases, key=phases.get)
    at = {k: int(v) for k, v in res["best"][phase][1].items()}
    base = res["base"]
    params = res["params"]
    fwd, bwd = step_flops(res["ops"])
    again = [op for first, last in checkpointed(res["ops"], setup.recompute).values()
             for op in res["ops"][first:last]]  # rerun in the backward, up to the early stop (vision_graph)
    rec = step_flops(again)[0] * setup.grad_accum
    fwd, bwd = fwd * setup.grad_accum, bwd * setup.grad_accum
    images = setup.batch * setup.grad_accum
    flops = Flops(fwd, bwd, rec, fwd + bwd + rec, fwd + bwd, (fwd + bwd) // max(1, images))
    reserved, device_total, beside, held = overheads.device_memory(
        overheads.reserved_from_allocated(phases[phase]), gpu, setup)
    # Memory.gradients: every parameter's .grad (estimate.Memory; the trace's grad_bytes), at_peak those live there
    memory = Memory(weights=base["weights"], gradients=res["gradients"], optimizer_states=base["optimizer_states"],
                    master_weights=0, activations=res["saved_at_forward_end"], temporaries=at["temporaries"],
                    kv_cache=0, peak=phases[phase], peak_phase=phase, phases=phases, at_peak=at,
                    reserved=reserved, device_total=device_total, overheads=beside, required=phases[phase])
    size = image_size(spec, setup)
    notes = [f"{spec.name}: {size}x{size} images, {spec.num_labels} classes; HF eager step ({setup.device} semantics)"
             + ("; --recompute full: each layer checkpointed as transformers' activation_checkpointing_enable does "
                "(its input kept; its forward rerun in the backward up to the last op that saves)"
                if setup.recompute == "full" else ""),
             "cuDNN convolution workspace not counted (NB: under by up to the largest conv's workspace)",
             "--channels-last: same bytes (strides change, not sizes); no NCHW<->NHWC transposes in the step time"
             if setup.channels_last else "channels-last would not change these bytes (strides, not sizes); the step "
             "time counts cuDNN's NCHW<->NHWC transposes around tensor-core convs"]
    timing = fit = tm = None
    if gpu is not None:
        if mfu is None:  # the kernels the step runs, timed by the roofline (analytic/vision_time.py)
            tm = vision_step_time(setup, gpu, res["ops"], params, res["param_tensors"],
                                  image_bytes(spec, setup, state_bytes(setup)), flops.model_step)
            secs, achieved = tm.step_seconds, tm.mfu
            terms = tm.as_dict()
        else:
            secs, achieved = step_seconds(flops.step, gpu, setup, mfu), mfu
            terms = mfu_step_terms(flops.step, gpu, setup, mfu)
        extra = budget(tokens, images * setup.dp / secs, setup.world_size, gpu, terms) if tokens else {}
        fit = fit_rule.verdict(gpu, setup, phases[phase], fit_rule.reserve_bytes(reserve))  # NB: required = the peak
        timing = Timing(gpu=gpu.name, mfu=achieved, step_seconds=secs, tokens_per_second=images * setup.dp / secs,
                        fits=fit.fits, headroom=fit.headroom, gpu_memory=gpu.memory, **extra)
        conv_dt, lin_dt = dtypes(setup, gpu)
        notes.append(f"step time from FLOPs at the stated --mfu {mfu:.0%} (an override)" if mfu is not None else
                     f"step time: each kernel of the step timed by the roofline (analytic/vision_time.py: convs as "
                     f"cuDNN implicit GEMMs in {conv_dt}, linears in {lin_dt}, depthwise convs and the other ops "
                     "memory-bound, + optimizer + host issue); --mfu overrides it; tokens/s are images/s")
        notes.append(overheads.describe(beside, held) + "; NB: the cached blocks of freed tensors not counted")
        notes.append(f"fits = the step's requests can be served at capacity: required {fmt_bytes(fit.required)} "
                     f"(the allocated peak; NB: its fragmentation not modelled, under) <= capacity "
                     f"{fmt_bytes(fit.capacity)} (GPU memory less --reserve and the fixed overheads)")
    detail = Detail(image_size=size, num_labels=spec.num_labels, step_time=tm,
                    records={"buffers": base["buffers"], "inputs": base["inputs"],
                             "param_tensors": res["param_tensors"]})
    return Estimate("analytic", spec.name, params, params, setup, memory, flops, timing, tuple(notes), detail, fit)
