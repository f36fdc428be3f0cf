"""--mode serve --server vllm: the constant-size state of linear-attention and Mamba layers, as vLLM 0.33's hybrid
allocator holds it (the wheel's vllm/..., read at 0.33.0).

A Gated DeltaNet layer (Qwen3-Next) or a Mamba-2 block (Nemotron-H) keeps, per sequence, a conv state and a
recurrent (SSM) state whatever the sequence's length; vLLM gives each such layer a MambaSpec whose page is one
sequence's state (v1/kv_cache_interface.py:1094-1129, page_size_bytes = the sum of the states' bytes):
  Gated DeltaNet (model_executor/layers/mamba/mamba_utils.py:272-294 gated_delta_net_state_shape):
      conv (conv_dim / tp, conv_kernel − 1), recurrent (value_heads / tp, value_head_dim, key_head_dim)
  Mamba-2 (mamba_utils.py:186-212 mamba2_state_shape): n_groups raised to tp when tp does not divide it
      (extra_groups_for_head_shards, :261-270); conv ((inner + 2 n_groups d_state) / tp, conv_kernel − 1),
      SSM (heads / tp, head_dim, d_state)
  dtypes (mamba_utils.py:98-111 _mamba_state_dtype): the conv state in mamba_cache_dtype ("auto": the model's dtype),
      the recurrent state in mamba_ssm_cache_dtype ("auto": the conv state's); Nemotron-H's config hook sets float32
      (model_executor/models/config.py:812-835 NemotronHForCausalLMConfig, DEFAULT_MAMBA_SSM_CACHE_DTYPE) — a
      Mamba-2 hybrid's SSM state here is fp32, a Gated DeltaNet's recurrent state the model dtype (Qwen3-Next has no
      config hook). NB: a config naming mamba_ssm_cache_dtype is not read (ModelSpec does not carry it).
The state's element counts are the spec's (GatedDeltaNetSpec.conv_dim / recurrent_state, HybridSpec.conv_dim /
ssm_state), which transformers' cache holds too (trace/inference.cache_tensors) at its own widths and dtypes.

One pool holds every layer's pages, so vLLM makes the attention page at least a state page
(platforms/interface.py:940-1131 _align_hybrid_block_size, run by update_block_size_for_backend :750-787):
  page1      = one token's K and V of one attention layer on this rank (FullAttentionSpec)
  alignment  = max(the attention kernel's smallest block, --block-size): 16 — FlashAttention's MultipleOf(16)
               (v1/attention/backends/flash_attn.py:357-367), FlashInfer's smallest 16 (NB: FA4's head-256 kernel
               on Blackwell takes 128, fa_utils.py:14; ROCm backends not read: the block there may be coarser,
               holding fewer blocks); with prefix caching
               ("align" mode) its lcm with the layers' prefill-checkpoint alignment: 64 for Gated DeltaNet on Hopper
               and Blackwell, whose prefill runs FlashInfer's GDN kernel
               (model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py:245-267, :689-702;
               v1/attention/backends/gdn_attn.py:34 FLASHINFER_GDN_CHECKPOINT_ALIGNMENT), none for Mamba-2
               (MambaMixer2 declares none: abstract.py:65-70)
  block_size = alignment × ceil(state page / (alignment × page1)), when larger than --block-size
  the state page is padded up to block_size × page1 (mamba_page_size_padded)
Prefix caching is on by default for hybrid models (config/model.py:2239-2279 is_prefix_caching_supported;
engine/arg_utils.py:3075-3076), which sets mamba_cache_mode "align" (model_executor/models/config.py:750-785
MambaModelConfig); a request then holds 2 state blocks per layer group, + 1 prefill-checkpoint block where the layer
exports checkpoints (MambaSpec.max_memory_usage_bytes, kv_cache_interface.py:1135-1141; MambaMixer2.get_kv_cache_spec,
mamba_mixer2.py:1108-1118: always; the Gated DeltaNet layer, qwen_gdn_linear_attn.py:739-760: under FlashInfer's
prefill); without prefix caching ("none") 1. No speculative decoding (num_speculative_blocks 0).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..hardware import GPU
from ..setup import Setup
from ..spec import ModelSpec
from . import roofline
from .inference import kv_values_per_token_layer
from .precision import DTYPE_BYTES

KERNEL_BLOCK = 16  # the attention kernels' smallest block (flash_attn.py:357-367 MultipleOf(16); FlashInfer 16)
GDN_CHECKPOINT_ALIGNMENT = 64  # v1/attention/backends/gdn_attn.py:34
PREFIX_CACHING = True  # `vllm serve`'s default for hybrid models (config/model.py:2277-2279)
GDN_FLASHINFER = ("hopper", "blackwell")  # qwen_gdn_linear_attn.py:245-267 (Blackwell: NB CUDA >= 13 assumed)


@dataclass(frozen=True)
class StatePage:
    """One sequence's state in one linear-attention / Mamba layer on one rank: conv and recurrent bytes."""

    conv: int
    recurrent: int

    @property
    def bytes(self) -> int:
        return self.conv + self.recurrent


def state_layers(spec: ModelSpec) -> int:
    """The layers that keep a constant-size state per sequence (Gated DeltaNet layers, Mamba-2 blocks)."""
    if spec.hybrid is not None:
        return spec.hybrid.mamba_layers
    return spec.linear_attn.layers if spec.linear_attn is not None else 0


def attention_layers(spec: ModelSpec) -> int:
    """The layers with a K/V cache: a hybrid stack's attention blocks, or every layer but the linear-attention ones."""
    if spec.hybrid is not None:
        return spec.hybrid.attention_layers
    return spec.layers - state_layers(spec)


def state_page(spec: ModelSpec, setup: Setup, conv_dtype: str, state_dtype: str) -> StatePage:
    """One layer's states of one sequence on one TP rank, the conv state in `conv_dtype` and the recurrent / SSM
    state in `state_dtype` (module docstring: vLLM's mamba_utils.py shapes; SGLang 0.5.23's Mamba2StateShape.create,
    configs/mamba_utils.py:194-245, holds the same shapes for both kinds of layer)."""
    t = setup.tp
    if spec.hybrid is not None:
        m = spec.hybrid
        groups = m.n_groups + (t - m.n_groups if m.n_groups % t else 0)  # extra_groups_for_head_shards
        conv = (m.ssm_inner + 2 * groups * m.d_state) // t * (m.conv_kernel - 1)
        recurrent = m.ssm_state // t
    else:
        g = spec.linear_attn
        groups = g.key_heads + (t - g.key_heads if g.key_heads % t else 0)  # SGLang: n_groups = key heads
        conv = (g.value_dim + 2 * groups * g.key_head_dim) // t * (g.conv_kernel - 1)
        recurrent = g.recurrent_state // t
    return StatePage(conv * DTYPE_BYTES[conv_dtype], recurrent * DTYPE_BYTES[state_dtype])


def vllm_state_page(spec: ModelSpec, setup: Setup, model_dtype: str) -> StatePage:
    """vLLM's MambaSpec page (module docstring): the conv state in the model dtype, the recurrent state in it too
    (Gated DeltaNet) or in fp32 (Mamba-2: NemotronHForCausalLMConfig)."""
    return state_page(spec, setup, model_dtype, "fp32" if spec.hybrid is not None else model_dtype)


def exports_checkpoints(spec: ModelSpec, gpu: GPU) -> bool:
    """Whether the state layers keep a prefill-checkpoint block under prefix caching: Mamba-2 always
    (mamba_mixer2.py:1108-1118), Gated DeltaNet under FlashInfer's prefill (Hopper, Blackwell)."""
    return spec.hybrid is not None or roofline.kernels_for(gpu).generation in GDN_FLASHINFER


def checkpoint_alignment(spec: ModelSpec, gpu: GPU) -> int:
    """The state layers' prefill-checkpoint alignment in tokens (1: none)."""
    if spec.hybrid is None and exports_checkpoints(spec, gpu):
        return GDN_CHECKPOINT_ALIGNMENT
    return 1


def attention_page_per_token(spec: ModelSpec, setup: Setup, kv_dtype: str) -> float:
    """One token's K and V in one attention layer on one rank (FullAttentionSpec with block_size 1)."""
    return kv_values_per_token_layer(spec, setup.tp) * DTYPE_BYTES[kv_dtype]


def hybrid_block_size(spec: ModelSpec, setup: Setup, gpu: GPU, kv_dtype: str, model_dtype: str,
                      prefix_caching: bool = PREFIX_CACHING) -> int:
    """The attention block size vLLM settles on so one attention page holds a state page (module docstring)."""
    align = max(KERNEL_BLOCK, setup.block_size)
    if prefix_caching:
        align = math.lcm(align, checkpoint_alignment(spec, gpu))
    page1 = attention_page_per_token(spec, setup, kv_dtype)
    block = align * math.ceil(vllm_state_page(spec, setup, model_dtype).bytes / (align * page1))
    return max(setup.block_size, block)


def state_blocks_per_request(spec: ModelSpec, gpu: GPU, prefix_caching: bool = PREFIX_CACHING) -> int:
    """Blocks one request holds in each state-layer group (MambaSpec.max_memory_usage_bytes / page)."""
    if not prefix_caching:
        return 1
    return 2 + int(exports_checkpoints(spec, gpu))


__all__ = ["StatePage", "state_layers", "attention_layers", "state_page", "vllm_state_page", "hybrid_block_size",
           "state_blocks_per_request", "attention_page_per_token", "PREFIX_CACHING"]
