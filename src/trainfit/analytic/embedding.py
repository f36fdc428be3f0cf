"""What the embedding block keeps for backward until the end of the backward pass: the token ids, the learned
positions' indices, the embedding dropout's mask, BERT's embedding norm, and rotary models' cos/sin tables."""
from __future__ import annotations

from ..setup import Setup
from ..spec import ModelSpec
from . import torchtitan_moe
from .activations import FP32, INDEX, _norm_saved, dropout_mask_bytes
from .families import family_traits
from .precision import StateBytes


def rotary_dim(spec: ModelSpec) -> int:
    """Channels of each head that rotary rotates: head_dim × partial_rotary_factor (GPT-NeoX's rotary_pct,
    modeling_gpt_neox.py `rotary_ndims`)."""
    if spec.mla is not None:
        # MLA rotates only the qk_rope_head_dim channels: transformers sets head_dim to it for the rotary
        # embedding (configuration_deepseek_v3.py:123, configuration_deepseek_v2.py:124)
        return spec.mla.qk_rope_head_dim
    return int(spec.head_dim * spec.rotary_fraction)


def rotary_tables(spec: ModelSpec, seq: int, r: int, batch: int = 1) -> int:
    """Bytes of the position tables HF's rotary embedding returns for one forward: cos and sin, (1, s, rotary_dim)
    in the hidden states' dtype (modeling_llama.py LlamaRotaryEmbedding.forward: `cos.to(dtype=x.dtype)`), one per
    sequence of the `batch` where the positions are M-RoPE's (family fact rotary_per_sequence: Qwen2.5-VL, Qwen3-VL),
    or DeepSeek-V2's one complex64 freqs_cis of (1, s, rotary_dim / 2) (modeling_deepseek_v2.py:214-219
    `torch.polar`)."""
    if (spec.mla is not None and spec.family == "deepseek_v2") or family_traits(spec).get("rotary_complex"):
        # (Llama 4 the same: modeling_llama4.py:205-208 Llama4TextRotaryEmbedding.forward, `torch.polar`)
        return 8 * seq * rotary_dim(spec) // 2
    rows = batch if family_traits(spec)["rotary_per_sequence"] else 1
    return 2 * rows * seq * rotary_dim(spec) * r


def embedding_saved(spec: ModelSpec, setup: Setup, st: StateBytes, tokens: int) -> float:
    """Bytes saved by the embedding block for one micro-batch (torch embedding_backward needs the ids)."""
    r, h = st.residual, spec.hidden
    p_emb, _, _ = spec.dropouts
    saved = INDEX * tokens  # token ids saved by the embedding backward
    if spec.positions == "learned":
        # the position embedding saves its indices: one row of positions (GPT-2's and BERT's position_ids), or
        # one per sequence where they come from the attention mask (OPT's cumsum positions; families.json)
        saved += INDEX * (tokens if family_traits(spec)["positions_per_sequence"] else setup.seq)
    if spec.positions == "rotary" and setup.stack_facts.facts.get("rotary", {}).get("value") == "complex-buffer":
        # torchtitan's freqs_cis: one complex64 (8-byte) buffer of seq × rotary_dim/2, resident (a non-persistent
        # buffer precomputed for max_seq_len = the training seq_len); the rotary multiplies keep views of it
        # NB: counted with the first micro-batch's embedding bytes, so once per micro-batch in flight on a pipeline
        # (torchtitan's qwen3 keeps an fp32 cos/sin cache of seq × 2·head_dim in its place: its rope_cache,
        # models/qwen3/model/model.py:36-52)
        cos_sin = torchtitan_moe.model_fact(spec, setup, "rotary_cos_sin")
        saved += FP32 * setup.seq * 2 * spec.head_dim if cos_sin else 8 * setup.seq * rotary_dim(spec) // 2
    elif spec.positions == "rotary":
        # HF's rotary tables (rotary_tables); every layer's q·cos, k·sin saves the same tensors, freed after the
        # first layer's backward
        saved += rotary_tables(spec, setup.seq, r, setup.batch)
        saved += INDEX * setup.seq  # the positions (cache_position) the rotary table was computed from
    if p_emb > 0:
        saved += dropout_mask_bytes(setup, r) * h * tokens  # dropout mask on the (fp32 under amp) embeddings
    if spec.embedding_norm:
        saved += _norm_saved(spec, r) * tokens
    return saved
