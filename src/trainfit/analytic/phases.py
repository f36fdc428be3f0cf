"""The peak of a training step as the largest of its three high points (not the sum of categories).

  forward end      states + activations saved by every layer + the loss's logits buffers;
  backward         either its start (all activations + the logits gradients) or its end (all gradients),
                   since activations are freed layer by layer as gradients appear (live bytes are linear in
                   between, so the maximum is at one end);
  optimizer step   states + all gradients + the optimizer's temporaries.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StepBytes:
    """One rank's bytes, by what they are, that the phases combine."""

    resident: dict  # weights, master_weights, optimizer_states, comm_buffers: live through the step
    gradients: float  # all of this rank's gradients
    grads_before: float  # gradients live before backward (earlier micro-batches' under accumulation)
    activations: float  # saved for backward at the forward's end (all in-flight micro-batches)
    forward_transient: float  # the logits buffers and autocast caches at the forward's end
    loss_backward: float  # the loss's gradients at the backward's start
    layer_backward: float  # one layer's backward temporaries (and its ZeRO reduce-scatter buffers)
    last_saved: float  # saved tensors still live at the backward's end: the embedding's and the first layer's
    gathered: float  # ZeRO-3's gathered parameters, live in forward and backward
    optimizer_transient: float


@dataclass(frozen=True)
class Peak:
    phases: dict  # phase -> bytes
    phase: str
    peak: int
    at_peak: dict  # category -> bytes at the peak


def peak(b: StepBytes) -> Peak:
    states = sum(b.resident.values())
    forward_end = states + b.grads_before + b.activations + b.forward_transient + b.gathered
    # the loss's gradients and a layer's backward temporaries are not live at the same time
    start_transient = max(b.loss_backward, b.layer_backward)
    bwd_start = states + b.grads_before + b.activations + start_transient + b.gathered
    # end of backward: all gradients, the first layer's saved tensors (freed by its own backward) and the embedding's
    bwd_end = states + b.gradients + b.last_saved + b.layer_backward + b.gathered
    optimizer_step = states + b.gradients + b.optimizer_transient
    phases = {"forward_end": int(forward_end), "backward": int(max(bwd_start, bwd_end)),
              "optimizer_step": int(optimizer_step)}
    phase = max(phases, key=phases.get)
    if phase == "forward_end":
        at = {**b.resident, "gradients": b.grads_before, "activations": b.activations,
              "temporaries": b.forward_transient + b.gathered}
    elif phase == "backward" and bwd_start >= bwd_end:
        at = {**b.resident, "gradients": b.grads_before, "activations": b.activations,
              "temporaries": start_transient + b.gathered}
    elif phase == "backward":
        at = {**b.resident, "gradients": b.gradients, "activations": b.last_saved,
              "temporaries": b.layer_backward + b.gathered}
    else:
        at = {**b.resident, "gradients": b.gradients, "activations": 0, "temporaries": b.optimizer_transient}
    return Peak(phases, phase, phases[phase], {k: int(v) for k, v in at.items()})
