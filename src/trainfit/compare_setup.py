"""`trainfit compare`'s inference side: the inference request a training request implies, and the flags given that
it cannot carry over, named in one note (a setting the inference columns do not read is never dropped silently).

Carried over: every setting that applies to --mode infer (the registry's modes: batch, seq, attention, tp, pp,
pp-split, tf32, device, the GPU and its power cap, ...), the precision as its compute dtype (amp-bf16 -> bf16:
precision.inference_counterpart). The others go back to their defaults, each group for its reason (UNUSED)."""
from __future__ import annotations

from dataclasses import replace

from .setup import SETTINGS, Request

# why the inference columns do not read a training-only setting, by the setting's group (setup/vocab.py GROUPS);
# any other group: the setting is the training step's own (optimizer, recompute, accumulation, stack, ...)
UNUSED = {"fine-tune": "trainfit's inference engine models no bitsandbytes base or LoRA adapters: these columns "
                       "hold the whole {precision} weights",
          "parallel": "inference is modelled on one replica, sharded by --tp and --pp only"}
TRAINING_ONLY = "training only"
NOTE_START = "the infer columns do not use"
_TRAINING_ONLY = tuple(s for s in SETTINGS if "infer" not in s.meta.modes)  # stack, zero, quant, lora_rank, ...


def inference_request(req: Request) -> Request:
    """The inference of the model `req` trains (a --mode train request), at its batch and `req.seq`."""
    from .precision import DEFAULT, inference_counterpart

    return replace(req, **{s.name: s.request_default for s in _TRAINING_ONLY}, mode="infer",
                   precision=inference_counterpart(req.precision or DEFAULT["train"]))


def unused_note(req: Request) -> str | None:
    """One line naming the flags `req` sets away from their defaults that its inference (inference_request) does
    not read, grouped by why; None when there is none."""
    by_why: dict[str, list[str]] = {why: [] for why in (*UNUSED.values(), TRAINING_ONLY)}  # (this order)
    for s in _TRAINING_ONLY:
        if getattr(req, s.name) != s.request_default:
            by_why[UNUSED.get(s.meta.group, TRAINING_ONLY)].append(s.flag)
    if not any(by_why.values()):
        return None
    precision = inference_request(req).precision
    return f"{NOTE_START}: " + "; ".join(f"{', '.join(flags)} ({why.format(precision=precision)})"
                                         for why, flags in by_why.items() if flags)
