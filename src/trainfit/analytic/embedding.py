"""What the embedding keeps for backward: the token ids, the embedding dropout's mask, BERT's embedding norm."""
from __future__ import annotations

from ..setup import Setup
from ..spec import ModelSpec
from .activations import INDEX, _norm_saved, dropout_mask_bytes, dropouts
from .precision import StateBytes


def embedding_saved(spec: ModelSpec, setup: Setup, st: StateBytes, tokens: int) -> float:
    """Bytes saved by the embedding block for one micro-batch (torch embedding_backward needs the ids)."""
    r, h = st.residual, spec.hidden
    p_emb, _, _ = dropouts(spec)
    saved = INDEX * tokens  # token ids saved by the embedding backward
    if p_emb > 0:
        saved += dropout_mask_bytes(setup, r) * h * tokens  # dropout mask on the (fp32 under amp) embeddings
    if spec.embedding_norm:
        saved += _norm_saved(spec, r) * tokens
    return saved
