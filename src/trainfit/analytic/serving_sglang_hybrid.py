"""--server sglang: the pools SGLang 0.5.23 (the wheel's sglang/srt/...) sizes for hybrid models — the Mamba state pool
of linear-attention / Mamba hybrids and the full + SWA token pools of hybrid sliding-window models.

Linear attention / Mamba (Qwen3-Next's Gated DeltaNet, Nemotron-H's Mamba-2; MambaPool): before the token pool,
mem_cache/kv_cache_configurator.py:3229-3411 _handle_max_mamba_cache (called from _profile_available_bytes,
:3034-3035) takes the state pool out of the rest, sized by mamba_full_memory_ratio r (default 0.9:
arg_groups/fields/schedule.py:220-226) when max_mamba_cache_size is not given and there is no speculative decoding:
  budget = rest × r / (1 + r);  K = max_mamba_cache_size = (budget − per_req) // per_req
  rest  −= (K + 1) × per_req      (+1: the pool's padding slot)
  per_req = the states of every state layer (configs/mamba_utils.py:114-126 mamba_cache_per_req): the conv state
  (conv_dim / tp, conv_kernel − 1) in SGLANG_MAMBA_CONV_DTYPE (default bfloat16, environ.py:1628) and the temporal
  state (heads / tp, head_dim, state) in mamba_ssm_dtype (the config's, else float32: mamba_utils.py:47-105);
  Qwen3-Next's GDN as a Mamba-2 shape with n_groups = key heads, heads = value heads, state = key head dim
  (configs/qwen3_next.py:288-313), Nemotron-H's (configs/nemotron_h.py:425-439).
The token pool then holds only the attention layers (model_executor/pool_configurator.py:229-239: the cell counts
mambaish full_attention_layer_ids), and the running requests are capped at K // ratio
(kv_cache_configurator.py:3133-3150): ratio = 3 state slots per request (MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO,
:227) + 2 tracking slots of the radix cache's "extra_buffer" strategy, which "auto" picks for these architectures
under the overlap scheduler (arg_groups/overrides.py:369-436, :453-486; mem_cache/allocation_sizing.py:11-19).

Hybrid sliding-window (HybridSWAPoolConfigurator, pool_configurator.py:656-921), for the architectures SGLang lists
(configs/model_config.py:2651-2697 is_hybrid_swa_model: gpt-oss, Llama4ForConditionalGeneration, Gemma 4, ...;
Gemma 2/3 and the text-only Llama4ForCausalLM are not, and keep every layer's tokens in one pool): per token
  cell = full_per_token × full layers + swa_full_tokens_ratio × swa_per_token × SWA layers   (:786-803)
  full tokens = int(rest // cell) page-aligned = max_total_num_tokens; SWA tokens = int(full × ratio) page-aligned
  (:859-893), ratio 0.8 by default (schedule.py:150-162); SGLang refuses an SWA pool of window + page tokens or
  fewer (:198-216).
NB: not modelled — speculative decoding with these pools (refused), the request-capped SWA pool
(SWARequestCapPoolConfigurator: only with --max-running-requests and the radix cache off), unified memory.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import SetupError
from ..setup import Setup
from ..spec import ModelSpec
from . import serving_state
from .inference import kv_values_per_token_layer
from .precision import DTYPE_BYTES

MAMBA_FULL_MEMORY_RATIO = 0.9  # arg_groups/fields/schedule.py:220-226
STATE_SLOTS_PER_REQUEST = 3 + 2  # kv_cache_configurator.py:227 + extra_buffer's 2 tracking slots (overlap on)
SWA_FULL_TOKENS_RATIO = 0.8  # schedule.py:150-162
CONV_DTYPE, SSM_DTYPE = "bf16", "fp32"  # environ.py:1628; configs/mamba_utils.py:71
HYBRID_SWA_ARCHS = ("GptOssForCausalLM", "Llama4ForConditionalGeneration", "Gemma4ForCausalLM",
                    "Gemma4ForConditionalGeneration")  # configs/model_config.py:2655-2690 (those in the catalog)


@dataclass(frozen=True)
class StatePool:
    per_request: int  # bytes: every state layer's conv + SSM state of one request on this GPU
    slots: int  # K = max_mamba_cache_size
    bytes: int  # (K + 1) slots

    @property
    def max_requests(self) -> int:
        return self.slots // STATE_SLOTS_PER_REQUEST


def state_pool(spec: ModelSpec, setup: Setup, rest: float) -> StatePool | None:
    """The Mamba state pool out of `rest` bytes (module docstring); None for a model without state layers."""
    layers = serving_state.state_layers(spec)
    if not layers:
        return None
    per_req = layers * serving_state.state_page(spec, setup, CONV_DTYPE, SSM_DTYPE).bytes
    budget = rest * MAMBA_FULL_MEMORY_RATIO / (1 + MAMBA_FULL_MEMORY_RATIO)
    slots = int((budget - per_req) // per_req)
    if slots <= 0:
        raise SetupError(f"--server sglang: no room for {spec.name}'s linear-attention / Mamba state pool "
                         f"({per_req / 2**20:.1f} MiB per request); SGLang raises at start-up: raise "
                         "--mem-fraction-static, add --tp or --quant")
    return StatePool(per_req, slots, (slots + 1) * per_req)


def is_hybrid_swa(spec: ModelSpec) -> bool:
    """SGLang keeps separate full and SWA pools for this model (module docstring)."""
    return bool(spec.sliding_window and spec.sliding_window_layers) and any(
        a in HYBRID_SWA_ARCHS for a in spec.architectures)


@dataclass(frozen=True)
class SWAPool:
    full_tokens: int  # max_total_num_tokens
    swa_tokens: int
    cell: float  # bytes per full token, the SWA layers' share at the ratio
    bytes: int


def swa_pool(spec: ModelSpec, setup: Setup, kv_dtype: str, rest: float, page: int) -> SWAPool:
    """Full and SWA token pools of a hybrid sliding-window model out of `rest` bytes (module docstring). The SWA
    layers' heads are the full layers' (gpt-oss: get_swa_num_kv_heads the same)."""
    per_token = kv_values_per_token_layer(spec, setup.tp) * DTYPE_BYTES[kv_dtype]  # kv heads x (head + v head)
    swa_layers = spec.sliding_window_layers // setup.pp
    full_layers = spec.layers // setup.pp - swa_layers
    cell = per_token * full_layers + SWA_FULL_TOKENS_RATIO * per_token * swa_layers
    full = int(rest // cell) // page * page
    swa = int(full * SWA_FULL_TOKENS_RATIO) // page * page
    if spec.sliding_window + page >= swa:
        raise SetupError(f"--server sglang: the SWA pool ({swa:,} tokens) cannot hold one request of window "
                         f"{spec.sliding_window}; SGLang raises at start-up: raise --mem-fraction-static")
    return SWAPool(full, swa, cell, int((full * full_layers + swa * swa_layers) * per_token))


__all__ = ["StatePool", "state_pool", "SWAPool", "swa_pool", "is_hybrid_swa", "STATE_SLOTS_PER_REQUEST"]
