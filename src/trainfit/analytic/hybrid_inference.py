"""Inference memory of a hybrid stack (Nemotron-H: Mamba-2, attention and MLP blocks, transformers
models/nemotron_h/modeling_nemotron_h.py NemotronHBlock :934-994: one RMSNorm, one mixer, the residual add).

The cache holds K and V for the attention blocks only and a constant-size conv + SSM state per sequence for each
Mamba block (mamba2.py). The prefill runs block by block, so at a block's high point the cache holds what the
blocks before it wrote (and its own conv state, written before its scan: :511-516), not the whole model's: each
kind of block is priced at its last block in the stack (the most cache before it), and the end of the prefill with
the whole cache and the logits.
"""
from __future__ import annotations

from ..errors import NotModelledError
from ..setup import Setup
from ..spec import ModelSpec
from . import mamba2
from .activations import FP32, INDEX, attention_linear_params
from .precision import state_bytes


def block_cache_bytes(spec: ModelSpec, setup: Setup, kind: str, cached: int) -> float:
    """What one block of `kind` holds in the generate cache for `cached` tokens of setup.batch sequences."""
    from .inference import kv_bytes_per_token  # noqa: PLC0415 (inference dispatches here)

    if kind == "mamba":
        return setup.batch * mamba2.state_bytes_per_sequence(spec, state_bytes(setup))
    if kind == "attention":  # kv_bytes_per_token counts the attention blocks of a hybrid stack (one stage: no --pp)
        return kv_bytes_per_token(spec, setup) / spec.hybrid.attention_layers * setup.batch * cached
    return 0.0


def cache_before(spec: ModelSpec, setup: Setup, index: int, cached: int) -> float:
    """The cache the blocks before block `index` (0-based) hold."""
    return sum(block_cache_bytes(spec, setup, k, cached) for k in spec.hybrid.pattern[:index])


def block_cast_params(spec: ModelSpec, kind: str) -> int:
    """The weights autocast casts (and caches) for one block of `kind`: its matmuls' (biases included)."""
    h = spec.hidden
    if kind == "mamba":
        return mamba2.in_proj_params(spec) + mamba2.out_proj_params(spec) + mamba2.conv_bias_cast(spec)
    if kind == "attention":
        return attention_linear_params(spec)
    return 2 * h * spec.intermediate + ((spec.intermediate + h) if spec.mlp_bias else 0)


def _last(spec: ModelSpec, kind: str) -> int | None:
    pattern = spec.hybrid.pattern
    return max((i for i, k in enumerate(pattern) if k == kind), default=None)


def hybrid_cache_bytes(spec: ModelSpec, setup: Setup, cached: int) -> float:
    return sum(block_cache_bytes(spec, setup, k, cached) for k in spec.hybrid.pattern)


def prefill_moments(spec: ModelSpec, setup: Setup) -> list[float]:
    """Each kind's high point at its last block, with the cache written so far and, under autocast, the weight casts
    cached so far (cast_before: the blocks before; then the block's own casts that precede its high point)."""
    from .inference import _prefill_moments  # noqa: PLC0415

    st = state_bytes(setup)
    r = st.residual
    tokens = setup.batch * setup.seq
    h = spec.hidden
    pattern = spec.hybrid.pattern

    def casts(index: int) -> float:
        return st.act * sum(block_cast_params(spec, k) for k in pattern[:index]) if st.autocast else 0.0

    attn_moment, mlp_moment, _ = _prefill_moments(spec, setup, tokens)
    out = []
    i = _last(spec, "mamba")
    if i is not None:
        # the embedding output (kept to the end), the block's input (the same tensor for block 0), the norm's output
        # (NemotronHRMSNorm returns the input's dtype) and the position ids NemotronHModel builds
        held = (2 if i == 0 else 3) * r * h * tokens + INDEX * setup.seq
        own = st.act * (mamba2.in_proj_params(spec) + mamba2.conv_bias_cast(spec)) if st.autocast else 0.0
        mixer = max(mamba2.mixer_prefill(spec, st, setup.batch, setup.seq, setup.device,
                                         mamba2.scan_bmm_scratch(spec, setup, st)))
        out.append(held + mixer + cache_before(spec, setup, i, setup.seq)
                   + setup.batch * mamba2.conv_state_bytes(spec, st) + casts(i) + own)
    for kind, moment in (("attention", attn_moment), ("mlp", mlp_moment)):
        i = _last(spec, kind)
        if i is not None:
            own = st.act * block_cast_params(spec, kind) if st.autocast else 0.0
            out.append(moment + cache_before(spec, setup, i + 1, setup.seq) + casts(i) + own)
    return out


def hybrid_infer_memory(spec: ModelSpec, setup: Setup, weights: float):
    """InferMemory of a hybrid stack (`weights`: this rank's weight bytes)."""
    from .inference import InferMemory  # noqa: PLC0415

    if setup.tp > 1 or setup.pp > 1:
        # the Mamba blocks' heads and states split over TP ranks, and each pipeline stage's share of the pattern,
        # are not modelled
        raise NotModelledError(f"{spec.name}: --tp/--pp with Mamba-2 blocks are not modelled by the analytic engine; "
                               "use --engine trace on one device")

    st = state_bytes(setup)
    moments = prefill_moments(spec, setup)
    act = max(moments)
    logits = FP32 * spec.vocab / setup.tp * setup.batch  # generate's last-position logits, fp32
    kv = hybrid_cache_bytes(spec, setup, setup.seq)
    casts = st.act * sum(block_cast_params(spec, k) for k in spec.hybrid.pattern) if st.autocast else 0.0
    prefill = weights + max(act, kv + logits + casts)
    # decode: the whole cache (one more token in the attention blocks), the largest block's step, the logits
    cached = setup.seq + 1
    kv_decode = hybrid_cache_bytes(spec, setup, cached)
    step = mamba2.decode_step(spec, st, setup.batch, setup.device) if spec.hybrid.mamba_layers else 0.0
    head_cast = st.act * spec.vocab * spec.hidden / setup.tp if st.autocast else 0.0
    decode = weights + kv_decode + casts + head_cast + step + logits
    return InferMemory(int(weights), int(kv), int(act), int(logits), int(prefill), int(decode))

