"""The peak of a training step as the largest of its high points (not the sum of categories).

  forward end      states + activations saved by every layer + the loss's logits buffers; for a post-norm encoder
                   also the last layer's own forward high point (forward_moments.py), the head's tensors not made;
  backward         the loss's backward (all activations + the logits' gradients), the final norm's backward (the
                   head's saved tensors freed, its gradients made), then layer by layer: at each
                   layer's high point (backward.py) the gradients so far, the activations of the layers not yet
                   done and that layer's temporaries. Layer by layer the live bytes change by a constant (one
                   layer's gradients in, its saved tensors out), so the largest is the last layer's or the first's;
                   then the embedding's backward (all gradients);
  optimizer step   states + all gradients + the optimizer's temporaries.
Gradients appear as each module's backward runs (AccumulateGrad); with gradient accumulation all of them exist
from the start (earlier micro-batches'), and so they do where the stack makes its gradient buffer before the step.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class LayerKind:
    """One kind of layer where the layers of a rank differ (torchtitan's layer:N: checkpointed or not)."""

    saved: float  # one layer's saved bytes (one micro-batch)
    backward: float  # beside its saved tensors at its backward high point
    freed: float  # of its saved tensors, those freed by then
    grads_done: float  # gradient bytes of the layer made by then
    gradients: float | None = None  # all of one such layer's gradient bytes (None: StepBytes.layer_gradients)
    # the layer's live bytes at its forward high point, its saved tensors so far included (0: not a moment; a
    # hybrid stack's Mamba-2 block: the end of its scan, analytic/hybrid_training.py)
    forward: float = 0.0


@dataclass(frozen=True)
class Pattern:
    """Each layer's kind, first to last, as runs: `runs` holds (block, times) pairs, the block repeated `times` times
    and itself (kind, count) pairs, `count` alike layers of a kind (StepBytes.kinds' keys). Alike and repeating layers
    are written once, not once per layer: a T5 of 10**9 layers a stack is four runs, Llama 4's interleave one block
    of its period repeated, and the per-layer moments are taken where they may peak (_layer_points)."""

    runs: tuple

    @classmethod
    def of(cls, kinds) -> "Pattern":
        """The pattern of a sequence of each layer's kind, written out (a run of one layer each)."""
        return cls(((tuple((k, 1) for k in kinds), 1),))

    @classmethod
    def of_runs(cls, *runs: tuple) -> "Pattern":
        """The pattern of (kind, count) runs, first to last (runs of no layer dropped)."""
        return cls(((tuple(r for r in runs if r[1] > 0), 1),))

    def __len__(self) -> int:
        return sum(times * sum(n for _, n in block) for block, times in self.runs)

    @property
    def first(self):
        """The first layer's kind."""
        return next(k for block, times in self.runs if times for k, n in block if n)

    def counts(self) -> dict:
        """The layers of each kind."""
        out: dict = {}
        for block, times in self.runs:
            for k, n in block:
                out[k] = out.get(k, 0) + times * n
        return out


def _ends(n: int) -> range | tuple:
    """The positions of a run of n where a moment linear in the position may peak, its first two and last two (two:
    the model's first and last layers are moments of their own, next to a run's linear rest)."""
    return range(n) if n <= 4 else (0, 1, n - 2, n - 1)


@dataclass(frozen=True)
class StepBytes:
    """One rank's bytes, by what they are, that the phases combine."""

    resident: dict  # weights, master_weights, optimizer_states, comm_buffers: live through the step
    gradients: float  # all of this rank's gradients
    # every gradient exists through the backward: earlier micro-batches', or a buffer made before the step
    # (Megatron's contiguous grad buffer, ZeRO-3's gradient partition buffer)
    accumulating: bool
    head_gradients: float  # gradients made by the LM head's and final norm's backward (before the layers')
    layer_gradients: float  # one layer's gradients
    layers: int  # layers on this rank
    in_flight: int  # micro-batches whose activations are stored at once (pipeline stage 0)
    layer_saved: float  # one layer's saved bytes for one micro-batch
    embedding_saved: float  # the embedding block's saved bytes for one micro-batch (live to the backward's end)
    head_saved: float  # the head's and loss's saved bytes (freed by the loss's and head's backward)
    inputs: float  # of head_saved, the batch's labels (live to the end)
    forward_transient: float  # the logits buffers and autocast caches at the forward's end
    loss_backward: float  # the loss's gradients at the backward's start
    layer_backward: float  # beside a layer's saved tensors at its backward high point (ZeRO buffers included)
    layer_freed: float  # of the layer's saved tensors, those already freed at that high point
    layer_grads_done: float  # gradient bytes of that layer made by then
    embedding_backward: float  # the embedding's backward: the incoming gradient (and a tied weight's two partials)
    gathered: float  # ZeRO-3's gathered parameters, live in forward and backward
    optimizer_transient: float
    # the (b, 1, s, s) masks full recomputation keeps (recompute.checkpoint_held_masks), per micro-batch: all of
    # them through the last layer's backward, the first layer's at its backward, none at the embedding's
    masks_held: float = 0.0
    masks_first: float = 0.0
    # the gradients left on the device at the optimizer step where they differ from `gradients` (None: the same;
    # FSDP1's CPU offload frees its device copies at the backward's end, parallel/fsdp1.py keeps_gradient_shards)
    step_gradients: float | None = None
    # beside every layer's saved tensors at the last layer's forward high point (forward_moments.py; 0: none)
    last_layer_forward: float = 0.0
    norm_kept: float = 0.0  # of head_saved, the final norm's tensors still saved at its backward's high point
    norm_backward: float = 0.0  # the final norm's backward temporaries at that point
    head_matmul: float = 0.0  # inside the LM head's backward matmuls (loss.head_matmuls; 0: not a moment)
    head_matmul_freed: float = 0.0  # of head_saved, what is freed by then (the saved log-softmax output)
    # per moment, the gathered parameters and FSDP buffers where they differ from `gathered` (parallel/fsdp2.py);
    # "layer_backward": (constant, per layer) for a layer k between the first and the last: constant + (k+1)·per
    gathered_at: dict = field(default_factory=dict)
    # layers of different kinds: the kinds and each layer's kind, first to last (empty: all layers alike, as
    # layer_saved, layer_backward, layer_freed, layer_grads_done say)
    kinds: tuple = ()
    pattern: Pattern | tuple = ()  # (a tuple: each layer's kind, written out; taken as Pattern.of it)
    # --optimizer-in-backward: each gradient is applied and freed as it is made (step/in_backward.py), so instead
    # of the gradients so far a backward moment holds one: the largest gradient with its step's temporaries
    in_backward_step: float | None = None
    # --offload activations: how many layers' saved tensors are on the device at once (None: all of them)
    layers_on_device: int | None = None
    step_inputs: float = 0.0  # inputs live through the optimizer step too (a VLM's pixel rows: analytic/vlm.py)
    # of embedding_saved, what a backward that runs before the embedding's frees: a VLM's tower saved set (the tower
    # runs after the text embedding lookup, so autograd runs its backward first: analytic/vlm.py tower_saved)
    embedding_freed: float = 0.0
    # gradients made after the embedding's backward: Mllama's tower, whose forward ran before the embedding's, so
    # autograd runs its backward last (analytic/mllama.py); not made yet at the embedding's backward
    late_gradients: float = 0.0

    def __post_init__(self):
        if self.pattern and not isinstance(self.pattern, Pattern):
            object.__setattr__(self, "pattern", Pattern.of(self.pattern))

    @property
    def layers_saved(self) -> float:
        """The saved bytes of all this rank's layers for one micro-batch held on the device (all, unless offloaded)."""
        n = self.layers if self.layers_on_device is None else min(self.layers, self.layers_on_device)
        if self.pattern:  # NB (offloaded): the largest kinds taken for the layers on the device
            total = 0
            for saved, count in sorted(((self.kinds[k].saved, c) for k, c in self.pattern.counts().items()),
                                       reverse=True):
                total += min(n, count) * saved
                n -= min(n, count)
            return total
        return n * self.layer_saved

    @property
    def activations(self) -> float:
        """Saved for backward at the forward's end (all in-flight micro-batches)."""
        return self.in_flight * (self.layers_saved + self.embedding_saved + self.masks_held) + self.head_saved


@dataclass(frozen=True)
class Peak:
    phases: dict  # phase -> bytes
    phase: str
    peak: int
    at_peak: dict  # category -> bytes at the peak
    moments: dict = field(default_factory=dict)  # moment name -> allocated bytes (loss_backward, ...)


def peak(b: StepBytes) -> Peak:
    before = b.gradients if b.accumulating else 0
    in_bwd = b.in_backward_step is not None

    def grads(made: float) -> float:
        # NB (in backward): the largest gradient at every backward moment over-reads the moments of smaller ones
        if in_bwd:
            return b.in_backward_step
        return b.gradients if b.accumulating else made

    def gathered(name: str) -> float:
        return b.gathered_at.get(name, b.gathered)

    others = (b.in_flight - 1) * (b.layers_saved + b.embedding_saved + b.masks_held)  # other micro-batches in flight
    after_head = b.activations - b.head_saved + b.inputs
    # (name, gradients, activations, temporaries)
    moments = [
        ("forward_end", before, b.activations, b.forward_transient + gathered("forward_end")),
        # the loss's gradients and a layer's backward temporaries are not live at the same time
        ("loss_backward", before, b.activations, b.loss_backward + gathered("loss_backward")),
        ("head_backward", before, b.activations - b.head_matmul_freed, b.head_matmul + gathered("loss_backward")),
        # the final norm belongs to the head's FSDP group ([norm, output]), still gathered during its backward
        ("final_norm_backward", grads(b.head_gradients), after_head + b.norm_kept,
         b.norm_backward + gathered("loss_backward")),
    ]
    if b.last_layer_forward:  # the head's tensors not made yet
        moments.append(("last_layer_forward", before, b.activations - b.head_saved,
                        b.last_layer_forward + gathered("forward_end")))
    if b.pattern:
        moments += _mixed_layer_forward(b, before, gathered)
        moments += _mixed_layer_moments(b, grads, others, gathered)
    else:
        moments += [
            ("last_layer_backward", grads(b.head_gradients + b.layer_grads_done), after_head - b.layer_freed,
             b.layer_backward + gathered("last_layer_backward")),
        ]
        if b.layers > 2 and "next_layer_backward" in b.gathered_at:
            # the layer before the last, where FSDP2 holds both a prefetched copy and the last layer's kept
            # reduce-scatter input (parallel/zero.py unsharded_at): the last layer's gradients made and its saved
            # tensors freed
            moments.append(("next_layer_backward", grads(b.head_gradients + b.layer_gradients + b.layer_grads_done),
                            after_head - b.layer_saved - b.layer_freed,
                            b.layer_backward + gathered("next_layer_backward")))
        moments += [
            ("first_layer_backward",
             grads(b.head_gradients + (b.layers - 1) * b.layer_gradients + b.layer_grads_done),
             others + b.embedding_saved + b.masks_first + b.layer_saved - b.layer_freed + b.inputs,
             b.layer_backward + gathered("first_layer_backward")),
        ]
    moments += [
        ("embedding_backward", grads(b.gradients - b.late_gradients), others + b.embedding_saved - b.embedding_freed
         + b.inputs,
         b.embedding_backward + gathered("embedding_backward")),
        # in backward, nothing is left for the step after it
        ("optimizer_step", 0 if in_bwd else b.gradients if b.step_gradients is None else b.step_gradients,
         b.step_inputs, 0 if in_bwd else b.optimizer_transient),
    ]
    # each moment's categories in whole bytes, its total their sum: the peak and its breakdown are one computation
    resident = {k: whole(v) for k, v in b.resident.items()}
    parts = {name: {**resident, "gradients": whole(g), "activations": whole(act), "temporaries": whole(tmp)}
             for name, g, act, tmp in moments}
    totals = {name: sum(at.values()) for name, at in parts.items()}
    phases = {"forward_end": max(v for k, v in totals.items() if k.startswith("forward_end") or k.endswith("_forward")),
              "backward": max(v for k, v in totals.items() if k.endswith("backward")),
              "optimizer_step": totals["optimizer_step"]}
    phase = max(phases, key=phases.get)
    name = max(totals, key=totals.get)
    return Peak(phases, phase, phases[phase], parts[name], totals)


def whole(x: float) -> int:
    """Bytes as a whole number: the nearest, a half up. The terms are real-valued: a layer's bytes averaged over
    layers of different kinds (recompute.layer_params: DeepSeek's dense and MoE layers), a rank's 1/dp share.
    NB: the engines pad a share up to whole elements (deepspeed 0.19.8: ZeRO-3 pads each parameter to a multiple
    of dp, a partition of ceil(numel / dp) elements, runtime/zero/partition_parameters.py:1693-1696 _padding_size,
    :1816-1817 _partition_param; ZeRO-1/2 pad the flat group to a multiple of 2·dp, stage_1_and_2.py:441, :505-516,
    :585), which the n/dp shares here do not: under by less than one element a parameter."""
    return math.floor(x + 0.5)


def _layer_points(b: StepBytes):
    """(k, kind, below, after) for each layer k (counting from 0) where a per-layer moment may peak, with the saved
    bytes of the layers before it and the gradients of those after it. Along a run of alike layers, or a block's
    repetitions, each moment changes by a constant per layer (a layer's or a block's saved bytes in, its gradients
    out; an FSDP2 layer's buffers by `per`): linear, so the largest is at the run's ends (_ends), and the rest are
    not walked (a pattern of 10**9 layers). A pattern written out (Pattern.of) is every layer, summed as before."""
    def grad(kind) -> float:
        g = b.kinds[kind].gradients
        return b.layer_gradients if g is None else g

    runs = b.pattern.runs
    # the gradients of the layers after each (block, times) run
    after_run = [0.0] * len(runs)
    for i in range(len(runs) - 2, -1, -1):
        block, times = runs[i + 1]
        after_run[i] = after_run[i + 1] + times * sum(grad(k) * n for k, n in block)
    k0, below_run = 0, 0.0  # the run's first layer, the saved bytes before it
    for (block, times), after_block in zip(runs, after_run):
        width = sum(n for _, n in block)
        saved = sum(b.kinds[k].saved * n for k, n in block)
        grads = sum(grad(k) * n for k, n in block)
        # within the block: each (kind, count)'s first layer and the saved bytes before it, the gradients after it
        starts, before, inner = [], 0, 0.0
        for k, n in block:
            starts.append((before, inner))
            before, inner = before + n, inner + b.kinds[k].saved * n
        later, tail = [0.0] * len(block), 0.0
        for j in range(len(block) - 1, -1, -1):
            later[j] = tail
            tail += grad(block[j][0]) * block[j][1]
        for r in _ends(times):
            for (kind, n), (first, below_in), after_in in zip(block, starts, later):
                for q in _ends(n):
                    yield (k0 + r * width + first + q, kind,
                           below_run + r * saved + below_in + q * b.kinds[kind].saved,
                           after_block + (times - 1 - r) * grads + after_in + (n - 1 - q) * grad(kind))
        k0, below_run = k0 + times * width, below_run + times * saved


def _mixed_layer_moments(b: StepBytes, grads, others: float, gathered) -> list:
    """Each layer's backward high point when the layers differ: layer k (counting from 0) holds the gradients of
    the head and of the layers after it, the saved tensors of the layers before it and its own high point. (With
    alike layers the live bytes change by a constant per layer, so the first and the last suffice; here the
    largest may lie between: every layer where it may, _layer_points.) The first and last layers keep their FSDP
    buffers' moments."""
    n = len(b.pattern)
    out = []
    for k, kind, below, after in _layer_points(b):
        lk = b.kinds[kind]
        name = "last_layer_backward" if k == n - 1 else ("first_layer_backward" if k == 0 else f"layer_{k}_backward")
        if k in (0, n - 1) or "layer_backward" not in b.gathered_at:
            held = gathered(name if k in (0, n - 1) else "")
        else:
            constant, per = b.gathered_at["layer_backward"]
            held = constant + (k + 1) * per
        out.append((name, grads(b.head_gradients + after + lk.grads_done),
                    others + b.embedding_saved + (b.masks_first if k == 0 else b.masks_held) + b.inputs + below
                    + lk.saved - lk.freed, lk.backward + held))
    return out


def _mixed_layer_forward(b: StepBytes, before: float, gathered) -> list:
    """The forward high point of each layer whose kind has one (LayerKind.forward): the embedding's and the layers
    before it saved tensors, its own live bytes (all micro-batches in flight but this one at their forward end)."""
    out = []
    others = (b.in_flight - 1) * (b.layers_saved + b.embedding_saved + b.masks_held)
    for k, kind, below, _ in _layer_points(b):
        lk = b.kinds[kind]
        if lk.forward:
            out.append((f"layer_{k}_forward", before, others + b.embedding_saved + b.masks_held + b.inputs + below,
                        lk.forward + gathered("forward_end")))
    return out
