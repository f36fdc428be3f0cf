"""Inference time of an eager HF forward (--mode infer: trainfit.step.infer runs a prefill and one decode step): each
pass is its op list (analytic/ops/, the training step's lists without a backward or a loss) timed by the roofline
(compute_time.time_ops), and never faster than the host can issue its kernels (step_time.host_issue_exposed's rule).

Prefill: the layers over batch x seq tokens, the final norm over all of them and the LM head over the last token of
each sequence (transformers' logits_to_keep=1, which the step passes). Decode: the same at one query token per
sequence attending to the cache, plus the cache's growth: DynamicCache appends each layer's new k and v with
torch.cat, a copy of the whole cache (transformers cache_utils.py DynamicLayer.update); under autocast its weights'
casts are autocast's cached ones, made in the prefill (ops/cast.py uncached).
NB: pipeline stages (--pp, device_map style) run one after another here, so every layer is timed on one GPU.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..hardware import GPU
from ..setup import Setup
from ..spec import ModelSpec
from .compute_time import ListTime, layer_kinds, time_ops
from .ops import Op, embedding_forward, head_forward, layer_forward, shape_of
from .ops.cast import uncached
from .ops.rotary import ATTN_CAST
from .params import ParamCounts
from .precision import state_bytes
from .roofline import host_seconds_per_kernel
from .serving_state import attention_layers
from .inference import kv_bytes_per_token
from .timing import compute_dtype
from .tower_time import cross_layer_forward, cross_share, tower_times


@dataclass(frozen=True)
class PassTime:
    """One forward pass: the GPU's kernels, the kernels the host issues, and the pass's time (the larger)."""
    gpu: ListTime
    seconds: float

    @property
    def host_bound(self) -> bool:
        return self.seconds > self.gpu.seconds


def _attending(ops: list[Op], q_len: int, kv_len: int) -> list[Op]:
    """The attention cores see `kv_len` keys (one query token attends to the whole cache: not causal), and
    autocast's cast of k before them (rotary.rope_casts: the cache keeps k in fp32 under autocast,
    inference.kv_bytes_per_token) casts every cached key, not the new ones only."""
    def keys(o: Op) -> Op:
        if o.kind == "attention":
            return o._replace(n=kv_len, causal=o.m > 1 and o.causal)
        if o.name == f"k{ATTN_CAST}":
            return o._replace(reads=o.reads * kv_len / q_len, writes=o.writes * kv_len / q_len)
        return o
    return [keys(o) for o in ops]


def forward_time(spec: ModelSpec, setup: Setup, gpu: GPU, pc: ParamCounts, q_len: int, kv_len: int,
                 logits_rows: float | None = None, casts_cached: bool = True) -> PassTime:
    """One forward over `q_len` new tokens per sequence with `kv_len` keys in attention. logits_rows: the LM head's
    rows (default one per sequence, logits_to_keep=1); casts_cached False: a decode step that enters its own
    autocast region (an accelerate-wrapped forward) casts its weights anew."""
    st = state_bytes(setup)
    # a decode step (one token against the cache) runs Gated DeltaNet layers' recurrent rule (Shape.decode)
    sh = replace(shape_of(spec, setup, st, compute_dtype(setup)), seq=q_len, decode=q_len == 1 and kv_len > 1)
    # the decode step runs in the prefill's autocast context: its weights' casts are cached (ops/cast.py uncached)
    ran = uncached if sh.decode and casts_cached else list
    total = ListTime()
    for w, moe, linear, block in layer_kinds(spec):
        total = total + (w * spec.layers) * time_ops(gpu, _attending(ran(layer_forward(spec, sh, moe, linear, block)),
                                                                     q_len, kv_len))
    # Llama 3.2 Vision's cross-attention layers: their own list, over the vision tokens (NB: the decode step's kv_cat
    # below still counts them, whose cache over the vision tokens is read, not concatenated: an over-count)
    share = cross_share(spec)
    if share:
        total = (1 - share) * total + (share * spec.layers) * time_ops(gpu, ran(cross_layer_forward(spec, setup, sh)))
    total = total + time_ops(gpu, ran(embedding_forward(spec, sh) + head_forward(spec, sh, logits_rows=logits_rows or setup.batch)))
    if q_len > 1:  # a VLM's prefill runs its image encoder first (tower_time.py); a decode step does not
        total = total + tower_times(spec, setup, gpu, sh)[0]
    if q_len == 1 and spec.causal:  # the cache's torch.cat per attention layer: reads the old k, v and the new
        cache = setup.batch * kv_len * kv_bytes_per_token(spec, setup)  # (this rank's share)
        # (a hybrid stack's attention blocks only: its Mamba blocks update their state in place, ops/mamba2.py)
        total = total + time_ops(gpu, [Op("kv_cat", "memory", "", reads=cache, writes=cache,
                                          kernels=2 * attention_layers(spec),
                                          source="transformers cache_utils.py DynamicLayer.update (torch.cat)")])
    return _pass(total)


def _pass(total: ListTime) -> PassTime:
    """An eager forward is issued op by op: the GPU waits when the host is slower (step_time.host_issue_exposed)."""
    return PassTime(total, max(total.seconds, total.kernels * host_seconds_per_kernel(no_grad=True)))


def prefill_decode(spec: ModelSpec, setup: Setup, gpu: GPU, pc: ParamCounts) -> tuple[PassTime, PassTime | None]:
    """The prefill of batch x seq tokens and, for a causal model, one decode step at seq + 1 keys; an
    encoder-decoder's generate() (encoder_decoder_time.prefill_decode_lists)."""
    if spec.encdec is not None:
        from .encoder_decoder_time import prefill_decode_lists
        return tuple(_pass(time_ops(gpu, ops)) for ops in prefill_decode_lists(spec, setup))
    pre = forward_time(spec, setup, gpu, pc, setup.seq, setup.seq)
    dec = forward_time(spec, setup, gpu, pc, 1, setup.seq + 1) if spec.causal else None
    return pre, dec
