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
from .activations import FP32, LayerActivations, layer_activations
from .families import family_traits
from .backward import layer_moments
from .params import ParamCounts
from .parallel.tensor import layer_bytes_per_rank, term_divisors
from .precision import StateBytes


CPU_RNG_STATE = 5056  # bytes of torch.get_rng_state() (the mt19937 CPU generator)


@dataclass(frozen=True)
class LayerMemory:
    activations: LayerActivations  # of a dense layer, for the breakdown
    saved: float  # kept per layer and micro-batch until that layer's backward
    moments: list  # backward.Moment: the layer's backward high points (beside its saved tensors)
    autocast_casts: float  # weight casts autocast keeps per layer beyond `saved` (full recompute under amp)


def layer_setup(setup: Setup) -> Setup:
    """Selective recompute saves what the flash kernel saves (no s×s probabilities)."""
    return setup if setup.recompute != "selective" else setup.with_(attention="flash", recompute="none")


def layer_memory(spec: ModelSpec, setup: Setup, pc: ParamCounts, st: StateBytes, tokens: int, keys: float) -> LayerMemory:
    t = setup.tp
    ls = layer_setup(setup)
    la = layer_activations(spec, ls)
    moe = spec.moe is not None and pc.moe_layers > 0
    la_moe = layer_activations(spec, ls, moe=True) if moe else la
    frac_moe = pc.moe_layers / spec.layers
    one_layer = (1 - frac_moe) * layer_bytes_per_rank(la, setup, tokens, keys) \
        + frac_moe * layer_bytes_per_rank(la_moe, setup, tokens, keys)
    casts = 0.0
    recomputed = 0.0
    if setup.recompute == "full":
        # checkpoint keeps each layer's input (the residual stream; split t ways only under sequence parallelism)
        saved = st.residual * spec.hidden * tokens / (t if setup.sequence_parallel else 1)
        if setup.device == "cpu":
            # and the CPU generator's state, to replay dropout (torch/utils/checkpoint.py:1632
            # `torch.get_rng_state()`, a 5056-byte tensor); a CUDA step keeps the CPU state in host memory
            saved += CPU_RNG_STATE
        # in backward the layer's forward runs again (with a fresh copy of the RNG state on CPU): all its saved
        # tensors are live once more — less the checkpointed input itself where the layer saves its input
        # (the same storage)
        layer_input = st.residual * spec.hidden * tokens / (t if setup.sequence_parallel else 1)
        recomputed = one_layer - (layer_input if _saves_its_input(spec, setup, st) else 0) + \
            (CPU_RNG_STATE if setup.device == "cpu" else 0)
        if setup.precision.startswith("amp"):
            # autocast's cache keeps every weight's cast until the autocast region exits, checkpointed or not
            casts = ((1 - frac_moe) * la.fixed + frac_moe * la_moe.fixed) / t
    else:
        saved = one_layer
    # NB: with some dense and some MoE layers, the backward high points are those of the layer kind the rank has
    # most of
    big = la_moe if moe and frac_moe >= 0.5 else la
    div = term_divisors(big, setup)
    mlp_saved = sum(v / div[k] for k, v in big.mlp_share.items() if k in div)
    moments = layer_moments(spec, ls, st, tokens, keys, moe and frac_moe >= 0.5, mlp_saved, layer_params(spec, pc, setup),
                            recomputed)
    return LayerMemory(la, saved, moments, casts)


def _saves_its_input(spec: ModelSpec, setup: Setup, st: StateBytes) -> bool:
    """Whether the layer's saved tensors include its input: a pre-LayerNorm saves it (aten native_layer_norm); HF's
    RMSNorm saves its fp32 upcast, which is the input itself only when that is fp32 (`x.to(torch.float32)` is a
    no-op); post-norm BERT's q/k/v save it without autocast (with autocast they save their casts)."""
    if family_traits(spec)["post_norm"]:
        return not setup.precision.startswith("amp")
    if spec.norm == "layernorm":
        return True
    return st.residual == FP32


def layer_params(spec: ModelSpec, pc: ParamCounts, setup: Setup) -> float:
    """One (average) layer's parameters on one TP rank (norms replicated, as parallel/tensor.py:rank_params)."""
    return pc.norms + (pc.attention + (pc.mlp * pc.dense_layers + pc.moe_mlp * pc.moe_layers) / spec.layers) / setup.tp
