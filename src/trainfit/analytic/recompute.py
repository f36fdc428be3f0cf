"""Activation recomputation: what one layer keeps until its backward, and what its backward holds at once.

none       every saved tensor of the layer (activations.py) stays until the layer's backward;
selective  Korthikanti et al. 2022 §4.2: recompute only the attention core, so no s×s tensor is stored — the
           flash kernel's saved set (q, k, v, out, logsumexp), which is what HF runs with flash SDPA;
full       torch.utils.checkpoint (torch/utils/checkpoint.py `checkpoint`) keeps each layer's input (the residual
           stream) and re-runs the layer's forward inside its backward (Chen et al. 2016, "Training Deep Nets with
           Sublinear Memory Cost", §3).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..setup import Setup
from ..spec import ModelSpec
from .activations import FP32, LayerActivations, layer_activations, resolved_kernel
from .params import ParamCounts
from .parallel.tensor import layer_bytes_per_rank
from .precision import StateBytes


@dataclass(frozen=True)
class LayerMemory:
    activations: LayerActivations  # of a dense layer, for the breakdown
    saved: float  # kept per layer and micro-batch until that layer's backward
    backward_transient: float  # live during one layer's backward, beside the saved activations
    autocast_casts: float  # weight casts autocast keeps per layer beyond `saved` (full recompute under amp)


def layer_setup(setup: Setup) -> Setup:
    """Selective recompute saves what the flash kernel saves (no s×s probabilities)."""
    return setup if setup.recompute != "selective" else setup.with_(attention="flash")


def layer_memory(spec: ModelSpec, setup: Setup, pc: ParamCounts, st: StateBytes, tokens: int, keys: float) -> LayerMemory:
    t = setup.tp
    ls = layer_setup(setup)
    la = layer_activations(spec, ls)
    if spec.moe is not None and pc.moe_layers:
        m = spec.moe
        la_moe = layer_activations(spec, ls, mlp_width=m.expert_intermediate, experts_per_token=m.top_k)
    else:
        la_moe = la
    frac_moe = pc.moe_layers / spec.layers
    one_layer = (1 - frac_moe) * layer_bytes_per_rank(la, setup, tokens, keys) \
        + frac_moe * layer_bytes_per_rank(la_moe, setup, tokens, keys)
    casts = 0.0
    if setup.recompute == "full":
        # checkpoint keeps each layer's input (the residual stream; split t ways only under sequence parallelism)
        saved = st.residual * spec.hidden * tokens / (t if setup.sequence_parallel else 1)
        # in backward the layer's recomputed activations are live (the big intermediate gradients only appear once
        # some of them are freed); the first of them is the checkpointed input itself (same storage)
        transient = max(one_layer - saved, 0)
        if setup.precision.startswith("amp"):
            # autocast's cache keeps every weight's cast until the autocast region exits, checkpointed or not
            casts = la.fixed / t
    else:
        saved = one_layer
        # the gradients of the layer's largest intermediates.
        # NB: approximated by two MLP-intermediate gradients, or the s×s gradient for non-flash attention.
        transient = 2 * st.act * spec.intermediate * tokens / t
        if resolved_kernel(spec, ls) != "flash":
            # the softmax's fp32 s×s gradient (observed in traced eager steps; not live with the MLP's)
            transient = max(transient, FP32 * spec.heads * tokens * keys / t)
    return LayerMemory(la, saved, transient, casts)
