"""The analytic engine for CNN image classifiers (ResNet): a training step's memory by phase, FLOPs and time, in
the same Estimate as the transformer engine (engine.py), with no torch.

The step is the HF eager step trainfit runs (trainfit.step.standard: gradients set to None, forward + loss,
backward, optimizer.step). Memory is walked op by op over vision_graph's op list, in forward order and then in
reverse (autograd runs a node once every consumer of its output has run; with one node per op, reverse creation
order): a tensor lives from its op to its last forward consumer, or while an op that saved it has not run its
backward (the engine releases a node's saved variables after it runs: torch/csrc/autograd/engine.cpp
call_function, release_variables without retain_graph). A gradient buffer lives from the first consumer's
backward to its producer's; a second gradient into the same tensor (the residual's two branches) is summed into
the first (torch/csrc/autograd/input_buffer.cpp accumulate). The residual add's backward hands its gradient to
both branches without a copy. Under autocast a weight's 16-bit gradient is cast to the fp32 .grad by the cast's
own node (ToCopyBackward0), which runs right after the op's. On CUDA every tensor is rounded up to the caching
allocator's 512-byte block (CUDACachingAllocator.cpp kMinBlockSize; alloc/caching_allocator.py K_MIN_BLOCK).

NB: cuDNN's convolution workspace (picked per algorithm by cuDNN's heuristics or benchmark, taken from the caching
allocator and freed within the op) is not counted: an under-count by up to the largest conv's workspace at the
peak (and it stays cached: reserved). On a CPU, oneDNN's per-op scratch (measured by trace/kernel_scratch.py) is
not counted either.
NB: --channels-last changes strides, not sizes: a channels_last tensor holds the same N·C·H·W elements
(torch.empty(..., memory_format=torch.channels_last).nbytes equals the contiguous tensor's), so no byte here
changes; it changes which cuDNN kernels run (NHWC tensor-core kernels), i.e. time, not memory.
"""
from __future__ import annotations

from ..alloc.caching_allocator import K_MIN_BLOCK
from ..errors import SetupError
from ..estimate import Estimate, Flops, Memory, Timing
from ..hardware import GPU
from .. import overheads
from ..setup import Setup
from ..spec import VisionSpec
from .optimizer import optimizer_temporaries
from .precision import state_bytes
from .timing import budget, mfu_step_terms, step_seconds
from .vision_graph import FP32, INT64, Op, vision_ops, vision_params

# A CNN step is timed from its FLOPs at a flat model-FLOPs utilisation: the step-time model (step_time.py,
# roofline.py) walks a transformer's GEMMs and attention, not convolutions. NB: an assumption, stated in the
# notes; --mfu overrides it.
VISION_MFU = 0.4
OPTIMIZERS = ("sgd", "momentum", "adam", "adamw")
PRECISIONS = ("fp32", "amp-fp16", "amp-bf16", "bf16")
LABEL = INT64  # labels: int64 class indices, one per image


def image_size(spec: VisionSpec, setup: Setup) -> int:
    return setup.image_size or spec.image_size


def check(spec: VisionSpec, setup: Setup) -> None:
    """What the vision engines model: one rank's HF eager training step, with the optimizers and precisions below."""
    if setup.optimizer not in OPTIMIZERS:
        raise SetupError(f"--optimizer {setup.optimizer}: for vision models trainfit models {', '.join(OPTIMIZERS)}")
    if setup.precision not in PRECISIONS:
        raise SetupError(f"--precision {setup.precision}: for vision models trainfit models {', '.join(PRECISIONS)}")
    size = image_size(spec, setup)
    if spec.family == "vit" and size % spec.patch:
        raise SetupError(f"--image-size {size} is not a multiple of {spec.name}'s patch size {spec.patch}")
    if spec.is_cnn and size < 32:
        raise SetupError(f"--image-size {size}: {spec.name} downsamples by 32; use --image-size 32 or more")


class _Walk:
    """Live bytes by category while the step runs; `moment` records a high-point candidate."""

    def __init__(self, rounded: bool, base: dict):
        self.rounded = rounded
        self.base = base  # resident: weights, buffers, optimizer_states, inputs
        self.live: dict[str, int] = {}  # tensor -> bytes (activations: forward outputs, saved tensors)
        self.refs: dict[str, int] = {}
        self.saved_own = 0  # bytes ops keep themselves (BN statistics, indices, weight casts)
        self.grads = 0  # parameter .grad bytes made so far
        self.gbuf: dict[str, int] = {}  # tensor -> gradient buffer id
        self.gsize: dict[int, int] = {}  # buffer id -> bytes
        self.grefs: dict[int, int] = {}
        self.temp = 0
        self.best: dict[str, tuple[int, dict]] = {}

    def r(self, n: float) -> int:
        n = int(n)
        return K_MIN_BLOCK * -(-n // K_MIN_BLOCK) if (self.rounded and n) else n

    def moment(self, phase: str, saved: set) -> None:
        act = sum(b for t, b in self.live.items() if t in saved) + self.saved_own
        tmp = sum(b for t, b in self.live.items() if t not in saved) + sum(self.gsize.values()) + self.temp
        at = {**self.base, "gradients": self.grads, "activations": act, "temporaries": tmp}
        total = sum(at.values())
        if total > self.best.get(phase, (-1, {}))[0]:
            self.best[phase] = (total, at)

    def release(self, t: str) -> None:
        self.refs[t] -= 1
        if self.refs[t] <= 0:
            self.live.pop(t, None)

    def grad_release(self, t: str) -> None:
        g = self.gbuf.pop(t, None)
        if g is not None:
            self.grefs[g] -= 1
            if self.grefs[g] == 0:
                del self.gsize[g], self.grefs[g]

    def grad_give(self, t: str, nbytes: int) -> None:
        """A gradient for tensor t: a new buffer, or summed into the one it has (the new one freed)."""
        if t not in self.gbuf:
            g = self.next_id = getattr(self, "next_id", 0) + 1
            self.gbuf[t], self.gsize[g], self.grefs[g] = g, nbytes, 1


def walk(spec: VisionSpec, setup: Setup) -> dict:
    """The step's high points: {phase: (bytes, {category: bytes})} and the resident sizes."""
    st = state_bytes(setup)
    ops = vision_ops(spec, setup.batch, image_size(spec, setup))
    w = _Walk(setup.device == "cuda", {})
    r = w.r
    act, auto = st.act, st.autocast
    tensors = [n for op in ops for n in op.tensors]
    bn_stats = [op.stats for op in ops if op.kind == "bn"]
    size = image_size(spec, setup)
    pixel_bytes = setup.batch * spec.channels * size * size * int(st.weight)
    opt_per_tensor = (r(FP32) if setup.optimizer in ("adam", "adamw") else 0)  # Adam's `step` scalar per tensor
    w.base = {
        "weights": sum(r(n * st.weight) for n in tensors),
        # BatchNorm running_mean/var in the weights' dtype (Module.to casts floating buffers) + num_batches_tracked
        "buffers": sum(2 * r(c * st.weight) + r(INT64) for c in bn_stats),
        "optimizer_states": sum(r(n * st.optimizer) + opt_per_tensor for n in tensors) if st.optimizer else 0,
        "inputs": r(pixel_bytes) + r(setup.batch * LABEL),
    }
    # forward: who consumes and who saves each tensor
    consumers: dict[str, int] = {}
    for op in ops:
        for t in op.ins:
            consumers[t] = consumers.get(t, 0) + 1
    saved: set = set()
    w.refs = dict(consumers)
    own: dict[int, int] = {}  # op index -> bytes it keeps
    for i, op in enumerate(ops):
        kept = sum(r(b) for b in op.own_saved)
        if auto and op.weights:
            kept += sum(r(n * 2) for n in op.tensors)  # the cached 16-bit weight cast, saved by the op
        if auto and op.kind == "conv" and op.ins[0] == "pixel_values" and st.weight == FP32:
            kept += r(pixel_bytes // 2)  # autocast's 16-bit copy of the fp32 images, saved by the stem conv
        saves = [t for t in op.saves if t != "pixel_values"]
        if op.kind == "loss":  # cross_entropy in fp32 (autocast's fp32 list): the upcast, then log_softmax's output
            w.temp = r(op.own_saved[0]) if act != FP32 else 0
        if op.in_place:
            base = op.ins[0]
            w.live[op.out] = w.live.pop(base)
            w.refs[op.out] = consumers.get(op.out, 0)
            w.refs.pop(base, None)
        elif op.kind != "loss":
            w.live[op.out] = r(op.out_elems * act)
            w.refs[op.out] = consumers.get(op.out, 0) + (1 if op.kind == "linear" else 0)  # logits: the output
        own[i] = kept
        w.saved_own += kept
        for t in saves:
            w.refs[t] = w.refs.get(t, 0) + 1
            saved.add(t)
        w.moment("forward_end", saved)
        w.temp = 0
        for t in op.ins:
            if not (op.in_place and t == op.ins[0]) and t != "pixel_values":
                w.release(t)
    # backward, last op first
    for i in range(len(ops) - 1, -1, -1):
        op = ops[i]
        if op.kind == "loss":
            # nll_loss_backward and log_softmax_backward, fp32 (B x labels each), then the cast to the logits' dtype
            n = op.own_saved[0]
            w.temp = 2 * r(n)
            w.moment("backward", saved)
            w.temp = 0
            w.grad_give(op.ins[0], r(n // FP32 * act))
            w.saved_own -= own[i]
            continue
        made = []
        for t in op.ins:
            if t == "pixel_values":
                continue
            if op.kind == "add":
                g = w.gbuf[op.out]
                if t not in w.gbuf:
                    w.gbuf[t] = g
                    w.grefs[g] += 1
                continue
            nbytes = w.live.get(t) or r(_elems(ops, t) * act)
            if t in w.gbuf:
                w.temp += nbytes  # summed into the buffer it has, then freed
            else:
                w.grad_give(t, nbytes)
                made.append(t)
        grads = sum(r(n * st.grad) for n in op.tensors)
        if auto and op.weights:
            w.temp += sum(r(n * 2) for n in op.tensors)  # the 16-bit weight gradient before its fp32 cast
        w.grads += grads
        w.moment("backward", saved)
        w.temp = 0
        w.grad_release(op.out)
        w.saved_own -= own[i]
        for t in op.saves:
            if t != "pixel_values":
                w.release(t)
        if op.kind == "linear":
            pass  # the logits stay referenced by the model's output until the step ends
    live_params = len(tensors)
    largest = max(tensors)
    w.grads = w.base["weights"] * st.grad // st.weight if st.weight else 0
    w.live, w.gsize, w.saved_own = {}, {}, 0
    w.temp = int(optimizer_temporaries(setup, st, sum(tensors), largest))
    w.moment("optimizer_step", set())
    return {"best": w.best, "base": w.base, "ops": ops, "params": sum(tensors), "param_tensors": live_params,
            "saved_at_forward_end": w.best["forward_end"][1]["activations"]}


def _elems(ops: list[Op], t: str) -> int:
    for op in ops:
        if op.out == t:
            return op.out_elems
    raise KeyError(t)


def step_flops(ops: list[Op]) -> tuple[int, int]:
    """(forward, backward) FLOPs of the convolutions and the classifier: the backward computes the gradients of
    both the input and the weight, 2x the forward (NB: the stem conv's input gradient is not computed — the images
    need none — so this over-counts by the stem's forward FLOPs; BN/ReLU/pooling FLOPs are not counted)."""
    fwd = sum(op.flops for op in ops if op.kind in ("conv", "linear"))
    return fwd, 2 * fwd


def estimate(spec: VisionSpec, setup: Setup, gpu: GPU | None = None, mfu: float | None = None,
             tokens: float | None = None, reserve: float = 0.0, **_ignored) -> Estimate:
    check(spec, setup)
    if spec.family != "resnet":
        raise SetupError(f"the analytic engine models ResNet-family CNNs; {spec.name} is {spec.family}: use "
                         "--engine trace or --engine measure (transformers builds it)")
    mfu = VISION_MFU if mfu is None else mfu
    res = walk(spec, setup)
    phases = {k: v[0] for k, v in res["best"].items()}
    phase = max(phases, key=phases.get)
    at = {k: int(v) for k, v in res["best"][phase][1].items()}
    base = res["base"]
    params = res["params"]
    fwd, bwd = step_flops(res["ops"])
    fwd, bwd = fwd * setup.grad_accum, bwd * setup.grad_accum
    images = setup.batch * setup.grad_accum
    flops = Flops(fwd, bwd, 0, fwd + bwd, fwd + bwd, (fwd + bwd) // max(1, images))
    reserved, device_total, beside, held = overheads.device_memory(
        overheads.reserved_from_allocated(phases[phase]), gpu, setup)
    memory = Memory(weights=base["weights"], gradients=at["gradients"], optimizer_states=base["optimizer_states"],
                    master_weights=0, activations=res["saved_at_forward_end"], temporaries=at["temporaries"],
                    kv_cache=0, peak=phases[phase], peak_phase=phase, phases=phases, at_peak=at,
                    reserved=reserved, device_total=device_total, overheads=beside)
    size = image_size(spec, setup)
    notes = [f"{spec.name}: {size}x{size} images, {spec.num_labels} classes; HF eager step ({setup.device} semantics)",
             "cuDNN convolution workspace not counted (NB: under by up to the largest conv's workspace)",
             "--channels-last: same bytes (strides change, not sizes)" if setup.channels_last else
             "channels-last would not change these bytes (strides, not sizes)"]
    timing = None
    if gpu is not None:
        secs = step_seconds(flops.step, gpu, setup, mfu)
        extra = budget(tokens, images * setup.dp / secs, setup.world_size, gpu,
                       mfu_step_terms(flops.step, gpu, setup, mfu)) if tokens else {}
        headroom = gpu.memory - int(reserve * 2**30) - device_total
        timing = Timing(gpu=gpu.name, mfu=mfu, step_seconds=secs, tokens_per_second=images * setup.dp / secs,
                        fits=headroom >= 0, headroom=headroom, gpu_memory=gpu.memory, **extra)
        notes.append(f"step time from FLOPs at MFU {mfu:.0%} (the transformer step-time model does not walk "
                     "convolutions; --mfu overrides it); tokens/s are images/s")
        notes.append(overheads.describe(beside, held, cached_block=True))
    detail = {"image_size": size, "num_labels": spec.num_labels, "buffers": base["buffers"], "inputs": base["inputs"],
              "param_tensors": res["param_tensors"]}
    return Estimate("analytic", spec.name, params, params, setup, memory, flops, timing, tuple(notes), detail)
