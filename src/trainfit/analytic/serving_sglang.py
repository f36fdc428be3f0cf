"""--mode serve --server sglang: what an SGLang server holds on each GPU, and the KV pool it is left with.

SGLang 0.5.23 (the wheel's sglang/srt/...) sizes its token-to-KV pool once, at start-up, from a static fraction.
Older releases (--server sglang==0.4.1, 0.4.3.post4, 0.4.4) differ in the defaults only (data/servers.toml, cited
at their version): mem_fraction_static by tp alone, the chunked prefill size and decode graph batch by GPU memory,
no prefill graphs; their pool formula and max_running_requests are this one's.

  mem_fraction_static  (arg_groups/memory_hook.py:47-344 handle_gpu_memory_settings, when not given):
      gpu_mem   = nvidia-smi's memory.total in MiB (utils/common.py:990-1015, 802-832: get_nvgpu_memory_capacity)
      chunked_prefill_size and the decode CUDA-graph max_bs by gpu_mem (:87-167): < 20 GiB 2048 / 8; < 35 GiB
          4096 / 48 (160 from tp 4); < 60 GiB 4096 / 32 (160 from tp 4); < 90 GiB and < 160 GiB 8192 / 256 (512
          from tp 4); else 16384 / 512
      reserved  = 512 + 1.5 × max(chunked_prefill_size, 2048) + tp × pp / 8 × 1024 + the graph reserve, MiB
          (:300-313), at least 10 GiB on GPUs above 60 GiB (:314-315)
      graph reserve (reserve_for_graph_mb, :355-399) = 2 × decode max_bs + 8 × the number of prefill
          ("breakable", the CUDA default: model_executor/cuda_graph_config.py:119-123, 150-153) capture sizes
          (arg_groups/cuda_graph_hook.py:480-497; 1.5 GiB instead for MLA)
      mem_fraction_static = round((gpu_mem − reserved) / gpu_mem, 3)   (:324-328)
      (post-capture KV sizing is off by default: environ.py:640 SGLANG_ENABLE_POST_CAPTURE_KV_SIZING=False.)
  pre = the free memory after the process group's start, before the weights load
        (distributed/bootstrap.py:194-222 measure_pre_model_load_memory; cudaMemGetInfo's free)
  rest = free after the weights load − pre × (1 − mem_fraction_static)
        (mem_cache/kv_cache_configurator.py:2990-3060 _profile_available_bytes) = pre × f − weights
  max_total_num_tokens = rest // cell_size // page_size × page_size   (model_executor/pool_configurator.py:637-647)
  cell_size = kv heads per rank (max(1, kv_heads // attn tp), configs get_num_kv_heads) × (head_dim + v_head_dim)
        × this rank's layers × the KV dtype's bytes; MLA: (kv_lora_rank + qk_rope_head_dim) × layers × bytes
        (pool_configurator.py:340-535 _compute_cell_size)
  with speculative decoding (--speculative-algorithm, --draft-model): the draft's weights join the target's and the
        cell grows by the draft's layers (analytic/serving_sglang_spec.py)
  hybrids (analytic/serving_sglang_hybrid.py): linear-attention / Mamba layers' states come out of rest first (the
        MambaPool) and hold no token slot; gpt-oss's sliding layers take their own pool (HybridSWAPoolConfigurator);
        Gemma 2/3 and the text-only Llama 4 keep every layer's tokens in one pool
  page_size: 1 on CUDA (arg_groups/overrides.py:1343-1362 _page_size_default; FA4 on SM100 forces 128, :1270-1296)
  max_running_requests = min(max(min(tokens / context_len × 512, 4096), 2048), tokens // 2)
        (kv_cache_configurator.py:3119-3140 resolve_max_num_reqs)
The scheduler logs "max_total_num_tokens=N, chunked_prefill_size=..., max_running_requests=..., context_len=..."
(managers/scheduler.py:1267-1275) and the pool "KV Cache is allocated. ... #tokens: N, K size: x GB, V size: y GB"
(mem_cache/memory_pool.py:2073-2097, GB = 2**30).
Unlike vLLM there is no profile run: activations and CUDA graphs live in what (1 − mem_fraction_static) leaves,
and SGLang does not check that they fit — the graph captures only log "avail mem"
(model_executor/model_runner_components/cuda_graph_setup.py:683-698, 757-791); a remainder too small shows up as a
CUDA out-of-memory error at capture or at the first large prefill. What lives there (remainder_needs):
  activations: the larger of a chunked-prefill forward (serving.forward_transient at chunked_prefill_size tokens:
      SGLang's LlamaMLP.forward, models/llama.py:124-140, keeps gate_up and its activation as vLLM's does) and the
      logits of max_running_requests rows — the head's output in the model dtype and its fp32 copy
      (layers/logits_processor.py:1359-1368), softmaxed in place (layers/sampler.py:293-298: no further copy);
  CUDA graphs: the decode graphs' private pool, the largest capture (cuda_graph_max_bs tokens: the forward, or the
      head's output), the persistent fp32 logits buffer of cuda_graph_max_bs rows (graph_shared_output.py:62-90,
      model_executor/runner/base_runner.py:113-121), and SGLang's own estimate of the prefill graphs' non-torch
      memory, 8 MiB per capture size (1.5 GiB under MLA; memory_hook.py:380-389: their torch memory is the
      activations', reused).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .. import overheads, serving_versions
from ..errors import SetupError
from ..estimate import Serving as ServingDetail
from ..hardware import GPU
from ..setup import Setup
from ..spec import ModelSpec
from . import serving_segments as segments
from . import serving_sglang_hybrid as hybrid
from . import serving_sglang_spec as speculative
from . import serving_state
from .params import ParamCounts, count_params
from .activations import FP32
from .embedding import rotary_dim
from .precision import DTYPE_BYTES
from .serving import _weight_dtype, check, forward_transient, logits_transient, weights_per_gpu

SGLANG_VERSION = serving_versions.parse("sglang").version  # the current release, plain --server sglang
MiB = 1 << 20
PREFILL_GRAPH_NON_TORCH = 8 * MiB  # per prefill capture size (memory_hook.py:384-386, SGLang's own estimate)
MLA_PREFILL_GRAPHS = 1.5 * 1024 * MiB  # memory_hook.py:387-389 (its estimate for MLA backends' prefill graphs)
PAGE_SIZE = 1  # arg_groups/overrides.py:1361-1362 (CUDA, non-FA4)


@dataclass(frozen=True)
class Knobs:
    """SGLang's settings, defaults resolved as `python -m sglang.launch_server` resolves them on this GPU."""

    mem_fraction_static: float
    context_length: int
    chunked_prefill_size: int
    cuda_graph_max_bs: int  # decode; 0 with --enforce-eager (both graph phases disabled)
    prefill_graph_sizes: int  # how many prefill capture sizes (0 with --enforce-eager)
    page_size: int
    kv_dtype: str
    version: str = SGLANG_VERSION  # the release whose defaults these are (--server sglang==X)


@dataclass(frozen=True)
class Serving:
    knobs: Knobs
    cuda_total: int
    pre_model_load: int  # free memory when SGLang takes its baseline (total − CUDA context − NCCL)
    requested: int  # pre × mem_fraction_static: the weights' and the KV pool's share
    weights: int
    headroom: int  # pre × (1 − mem_fraction_static): activations and CUDA graphs live in it
    available_kv: int
    kv_bytes_per_token: float  # cell_size (the target's, + a draft's layers at its per-layer size)
    kv_tokens: int  # max_total_num_tokens
    max_running_requests: int
    max_concurrent_sequences: float
    kv_pool: int
    activations: int  # the largest eager transient (chunked prefill forward or the logits): in the headroom
    cuda_graphs: int  # in the headroom too
    draft: speculative.Draft | None = None  # speculative decoding's draft (weights counted in `weights`)
    state_bytes: int = 0  # one request's linear-attention / Mamba states (MambaPool; in kv_pool with the pool's slots)
    state_slots: int = 0  # max_mamba_cache_size
    swa_tokens: int = 0  # the SWA pool of a hybrid sliding-window model (its full pool: kv_tokens)

    @property
    def remainder_needs(self) -> int:
        """What SGLang holds outside mem_fraction_static beside the context and NCCL."""
        return self.activations + self.cuda_graphs

    @property
    def remainder_short(self) -> int:
        """Bytes by which the headroom falls short of that (0 when it fits)."""
        return max(0, self.remainder_needs - self.headroom)

    def largest_fraction(self) -> float:
        """The largest --mem-fraction-static that leaves the headroom the activations and graphs need."""
        return math.floor((1 - self.remainder_needs / self.pre_model_load) * 1000) / 1000

    @property
    def max_sequences(self) -> int:
        """The most requests the scheduler runs at once (max_running_requests)."""
        return self.max_running_requests

    @property
    def context(self) -> int:
        return self.knobs.context_length

    def sizing(self) -> ServingDetail:
        """Estimate.detail.serving: the numbers SGLang logs, its settings and its own sizing in knobs."""
        k = self.knobs
        knobs = {"mem_fraction_static": k.mem_fraction_static, "context_length": k.context_length,
                 "chunked_prefill_size": k.chunked_prefill_size, "cuda_graph_max_bs": k.cuda_graph_max_bs,
                 "page_size": k.page_size, "pre_model_load": self.pre_model_load, "headroom": self.headroom,
                 "remainder_short": self.remainder_short, "max_total_num_tokens": self.kv_tokens,
                 "max_running_requests": self.max_running_requests}
        if self.draft:
            d = self.draft
            knobs |= {"speculative_algorithm": d.algorithm, "draft_model": d.model, "draft_layers": d.layers,
                      "draft_weights": int(d.weights), "speculative_num_steps": d.steps,
                      "speculative_eagle_topk": d.topk, "speculative_num_draft_tokens": d.draft_tokens}
        return ServingDetail(
            server="sglang", version=k.version, max_model_len=k.context_length, kv_cache_dtype=k.kv_dtype,
            cuda_total=self.cuda_total, requested=self.requested, weights=self.weights,
            activation_peak=self.activations, cuda_graphs=self.cuda_graphs, available_kv=self.available_kv,
            kv_bytes_per_token=self.kv_bytes_per_token, kv_blocks=self.kv_tokens // k.page_size,
            kv_tokens=self.kv_tokens, max_concurrent_sequences=round(self.max_concurrent_sequences, 2), knobs=knobs)


def _version(setup: Setup) -> serving_versions.Version:
    return serving_versions.parse(setup.server or "sglang")


def capacity_defaults(gpu_mib: float, tp: int, version: str = SGLANG_VERSION) -> tuple[int, int]:
    """(chunked_prefill_size, decode cuda graph max_bs) by nvidia-smi's MiB: the version's tiers (data/servers.toml
    capacity; 0.5.23 memory_hook.py:87-167)."""
    facts = serving_versions.parse(f"sglang=={version}")
    for below, chunked, small_tp, large_tp in facts["capacity"]:
        if gpu_mib < below:
            return chunked, small_tp if tp < 4 else large_tp
    chunked, small_tp, large_tp = facts["capacity_above"]
    return chunked, small_tp if tp < 4 else large_tp


def prefill_capture_sizes(max_bs: int) -> list[int]:
    """arg_groups/cuda_graph_hook.py:480-497 (token counts captured for the breakable prefill graph)."""
    sizes = (list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32)) +
             list(range(576, 1025, 64)) + list(range(1280, 4097, 256)) + list(range(4608, max_bs + 1, 512)))
    return [s for s in sizes if s <= max_bs]


def prefill_graphs_non_torch(prefill_sizes: int, mla: bool) -> float:
    """SGLang's estimate of the prefill graphs' non-torch memory, bytes (reserve_for_graph_mb, :380-389)."""
    if not prefill_sizes:
        return 0.0
    return MLA_PREFILL_GRAPHS if mla else prefill_sizes * PREFILL_GRAPH_NON_TORCH


def default_mem_fraction(gpu_mib: float, setup: Setup, k_chunked: int, max_bs: int, prefill_sizes: int,
                         mla: bool) -> float:
    """memory_hook.py:296-328 (the regular, non-disaggregated, non-DP-attention path)."""
    reserved = 512 + max(k_chunked, 2048) * 1.5 + setup.tp * setup.pp / 8 * 1024
    reserved += 2 * max_bs + prefill_graphs_non_torch(prefill_sizes, mla) / MiB  # reserve_for_graph_mb, :357-389
    if gpu_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((gpu_mib - reserved) / gpu_mib, 3)


def fraction_by_tp(rule: list, tp: int) -> float:
    """mem_fraction_static of the releases that chose it by tp alone ([at least this tp, fraction], largest first:
    0.4.3.post4 server_args.py:203-214)."""
    return next(f for least, f in rule if tp >= least)


def knobs(spec: ModelSpec, setup: Setup, gpu: GPU) -> Knobs:
    # SGLang's defaults read nvidia-smi's memory.total (utils get_nvgpu_memory_capacity); its pool reads CUDA's
    version = _version(setup)
    if setup.pp > 1 and not version.facts.get("pipeline_parallel", True):  # (servers.toml: the releases without)
        having = [v for v in serving_versions.versions("sglang")
                  if serving_versions.parse(f"sglang=={v}").facts.get("pipeline_parallel", True)]
        raise SetupError(f"--pp {setup.pp}: SGLang {version.version} has no pipeline parallelism (no --pp-size in its "
                         f"ServerArgs; SGLang {', '.join(having)} has it): drop --pp (use --tp), or --server sglang")
    gpu_mib = gpu.smi_memory / MiB
    chunked, max_bs = capacity_defaults(gpu_mib, setup.tp, version.version)
    max_bs = 0 if setup.enforce_eager else max_bs
    graphs = version["prefill_graphs"] and not setup.enforce_eager
    prefill = len(prefill_capture_sizes(chunked)) if graphs else 0
    # MLA's prefill graph captures at most 8192 tokens (memory_hook.py:222-227): its reserve is flat anyway
    fraction = setup.mem_fraction_static
    if fraction is None and "mem_fraction_by_tp" in version.facts:
        fraction = fraction_by_tp(version["mem_fraction_by_tp"], setup.tp)
    elif fraction is None:
        fraction = default_mem_fraction(gpu_mib, setup, chunked, max_bs, prefill, spec.mla is not None)
    context = setup.max_model_len or spec.max_positions or setup.seq
    if setup.max_model_len and spec.max_positions and setup.max_model_len > spec.max_positions:
        raise SetupError(f"--max-model-len {setup.max_model_len} exceeds {spec.name}'s max_position_embeddings "
                         f"({spec.max_positions}); SGLang refuses it without SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN")
    return Knobs(fraction, context, chunked, max_bs, prefill, PAGE_SIZE, setup.kv_dtype or _weight_dtype(setup),
                 version.version)


def cell_size(spec: ModelSpec, setup: Setup, kv_dtype: str) -> int:
    """Bytes per token slot on one GPU (pool_configurator.py:340-535 _compute_cell_size)."""
    b = DTYPE_BYTES[kv_dtype]
    # this rank's attention layers (check() refuses a pp that does not divide them); a hybrid's linear-attention /
    # Mamba layers hold no token slot (pool_configurator.py:229-239: mambaish full_attention_layer_ids)
    layers = serving_state.attention_layers(spec) // setup.pp
    if spec.mla is not None:
        # kv_cache_configurator.py:3412 calculate_mla_kv_cache_dim: the latent and the rope key, every rank whole
        return int((spec.mla.kv_lora_rank + spec.mla.qk_rope_head_dim) * layers * b)
    heads = max(1, spec.kv_heads // setup.tp)  # configs/model_config.py get_num_kv_heads
    return int(heads * (spec.head_dim + spec.head_dim) * layers * b)  # head_dim + v_head_dim (equal in these models)


def weights_on_gpu(spec: ModelSpec, setup: Setup, pc: ParamCounts) -> float:
    """The weights as vLLM shards them (serving.weights_per_gpu: SGLang's linear layers and vocabulary padding of
    64 came from vLLM's), but the rotary cos/sin cache kept in fp32 on CUDA (layers/rotary_embedding/base.py:115-120:
    "cache needs to be in FP32 for numerical stability") where vLLM casts it to the model dtype, plus what the
    caching allocator holds for them beyond their bytes (serving_segments: SGLang reads the weights off
    cudaMemGetInfo; QwQ-32B at tp 4 +226 MiB, Qwen3-235B-A22B-FP8 at tp 4 +295 MiB, Llama-3.1-8B +1.5 MiB).
    NB: whatever else SGLang allocates between its baseline and the pool is not counted (its logs' "mem usage" at
    "Load weight end" reads ~0.07 GiB above this for Llama-3.1-8B: over-reads the pool by that)."""
    weights = weights_per_gpu(spec, setup, pc) + segments.slack(spec, setup)
    if spec.positions == "rotary":
        weights += (spec.max_positions or 0) * rotary_dim(spec) * (FP32 - DTYPE_BYTES[_weight_dtype(setup)])
    return weights


def serve_memory(spec: ModelSpec, setup: Setup, gpu: GPU, pc: ParamCounts | None = None) -> Serving:
    check(spec, setup)
    pc = pc or count_params(spec)
    dr = speculative.draft(spec, setup, pc)
    k = knobs(spec, setup, gpu)
    total = gpu.memory
    # NB: the baseline is free memory after the CUDA context, NCCL's tp communicator (sized by the GPU's
    # interconnect, NVLS off: nccl_buffers) and SGLang's custom all-reduce buffers (data/overheads.toml); the cuBLAS
    # workspace is made later and not subtracted
    pre = total - sum(overheads.overheads(gpu, setup).values())
    weights = weights_on_gpu(spec, setup, pc) + (dr.weights if dr else 0)
    requested = pre * k.mem_fraction_static
    available = requested - weights
    if available <= 0:
        raise SetupError(f"--server sglang: the weights ({weights / 2**30:.2f} GiB per GPU) exceed "
                         f"mem_fraction_static {k.mem_fraction_static} of the free memory ({pre / 2**30:.2f} GiB); "
                         "SGLang raises at start-up: raise --mem-fraction-static, add --tp or --quant")
    if dr is not None and (serving_state.state_layers(spec) or hybrid.is_hybrid_swa(spec)):
        raise SetupError(f"--server sglang: speculative decoding with {spec.name}'s hybrid pools (Mamba state or "
                         "SWA) is not modelled; use --server vllm or no draft")
    states = hybrid.state_pool(spec, setup, available)  # taken out before the token pool (serving_sglang_hybrid)
    rest = available - (states.bytes if states else 0)
    swa_tokens = 0
    if hybrid.is_hybrid_swa(spec):
        sw = hybrid.swa_pool(spec, setup, k.kv_dtype, rest, k.page_size)
        cell, tokens, pool, swa_tokens = sw.cell, sw.full_tokens, sw.bytes, sw.swa_tokens
    else:
        cell = speculative.pool_cell(cell_size(spec, setup, k.kv_dtype), spec.layers // setup.pp, dr)
        tokens = int(rest // cell) // k.page_size * k.page_size
        pool = tokens * cell
    estimated = max(min(int(tokens / k.context_length * 512), 4096), 2048)
    running = min(estimated, tokens // 2, states.max_requests if states else tokens // 2)
    return Serving(k, total, int(pre), int(requested), int(weights), int(pre - requested), int(rest), cell,
                   tokens, running, tokens / k.context_length, int(pool + (states.bytes if states else 0)),
                   int(activation_peak(spec, setup, k, running)),
                   int(cuda_graph_bytes(spec, setup, k, dr.draft_tokens if dr else 1)), dr,
                   states.per_request if states else 0, states.slots if states else 0, swa_tokens)


def activation_peak(spec: ModelSpec, setup: Setup, k: Knobs, running: int) -> float:
    """The larger eager transient (module docstring): a chunk's forward, or the logits of the running requests.
    NB: the logits moment takes a chunk's hidden states beside min(running, chunk) rows — a decode batch has only
    its own rows' hidden states and a prefill chunk rarely that many requests (over, by the hidden states: MiBs)."""
    chunk = k.chunked_prefill_size
    return max(forward_transient(spec, setup, chunk), logits_transient(spec, setup, chunk, min(running, chunk), 1))


def cuda_graph_bytes(spec: ModelSpec, setup: Setup, k: Knobs, tokens_per_request: int = 1) -> float:
    """The decode graphs' pool at cuda_graph_max_bs (× the verified draft tokens per request under speculative
    decoding), their fp32 logits buffer, and the prefill graphs' non-torch memory (module docstring).
    NB: the decode graphs' own non-torch memory (kernel nodes, tens of KiB each) and a draft's own graphs (its
    decode and extend steps) are not counted (under)."""
    bs = k.cuda_graph_max_bs * tokens_per_request
    decode = 0.0
    if bs:
        pool = max(forward_transient(spec, setup, bs), logits_transient(spec, setup, bs, bs, 0))
        decode = pool + bs * spec.vocab * FP32
    return decode + prefill_graphs_non_torch(k.prefill_graph_sizes, spec.mla is not None)


def fits(sv: Serving) -> bool:
    """SGLang starts when the pool is positive; a request longer than the pool is rejected at admission."""
    return sv.kv_tokens >= sv.knobs.context_length


__all__ = ["SGLANG_VERSION", "Knobs", "Serving", "serve_memory", "cell_size", "knobs", "fits",
           "default_mem_fraction", "capacity_defaults", "prefill_capture_sizes"]
