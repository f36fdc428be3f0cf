"""--mode serve --server vllm: what a vLLM engine holds on each GPU, and the KV cache it is left with.

vLLM 0.33 sizes its paged KV cache once, at start-up (v1/worker/gpu_worker.py determine_available_memory,
:641-757; utils/mem_utils.py memory_profiling, :230-317):
  requested  = ceil(total × gpu_memory_utilization)        total = cudaMemGetInfo's (v1/worker/utils.py:724)
  non-KV     = what the engine took since its baseline snapshot (weights, persistent buffers, non-torch memory
               made after it) + the profile run's transient peak (torch peak − allocated after it)
  available  = requested − non-KV − the CUDA-graph estimate (profile_cudagraph_memory, default on:
               envs.py:2219, VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1)
  blocks     = available // (block_size × KV bytes per token of every layer)   (v1/core/kv_cache_planning.py:681)
  tokens     = blocks / ceil(max_model_len / block_size) × max_model_len,  concurrency = that / max_model_len
               (kv_cache_utils.py:1061-1150, the "GPU KV cache size: N tokens" and "Maximum concurrency" lines)
Models of several cache kinds (sliding-window, Llama 4's chunked local attention, linear-attention / Mamba states)
split into layer groups sharing one block pool (layer_kinds, cache_groups, blocks_per_request: a block is one page of
each layer of a group, a request holds blocks in every group); linear-attention / Mamba layers keep a constant-size
state per sequence, and the attention block grows so one page holds it (analytic/serving_state.py).
The CUDA context, NCCL communicators and the cuBLAS handles and workspace exist before the snapshot
(gpu_worker.py:499-541): outside `requested`, but on the device (the device total).

The profile run (gpu_model_runner.py profile_run, _dummy_sampler_run :5866-5926) is one forward of
max_num_batched_tokens tokens and the sampler over max_num_seqs rows; its transient peak is the larger of
  forward: inside one layer, as the down projection runs, the residual stream, its normalised copy (the MLP's
           input, still referenced by the decoder layer) and the projection's output (h each) beside the fused
           gate_up output (2i) and SiluAndMul's output (i) (model_executor/models/llama.py LlamaMLP.forward: locals
           live to its return; fused_add_rms_norm works in place); or, as o_proj runs, the fused qkv output and
           the attention output beside the same three — per token, in the model dtype, the sharded ones over TP;
  sampler: the forward's output hidden states (T × h), the R = min(max_num_seqs, T) rows the sampler is given and
           their torch.rand_like (R × h each), beside the logits of R rows (vocab per row: LogitsProcessor gathers
           the vocab shards) and the buffers of the path the version's sampler takes with the dummy run's top-p 0.9
           and top-k = vocab − 1 (sampler_buffers; data/servers.toml names the path per version).
Non-torch memory made after the snapshot: the kernel images CUDA loads lazily as the profile run first launches them
(data/servers.toml non_torch_lazy_bytes, fitted on calibration C11). NB: taken as model-, GPU- and TP-independent;
NCCL's buffers at TP > 1 are made before the snapshot (gpu_worker.py init_device) and not counted here.
Which versions subtract the CUDA-graph estimate from the KV cache: data/servers.toml graphs_in_kv (0.33.0 only of the
versions listed: the others capture their graphs after the KV cache, out of what gpu_memory_utilization leaves).
vLLM 0.8.x (servers.toml non_torch = "device") subtracts every non-torch byte on the device instead (its
determine_available_memory: total × util − torch's allocated peak − (total − free − torch allocated)): the CUDA context,
NCCL, custom all-reduce buffers and the cuBLAS workspace (overheads.py: what 0.9.2+ leave before the snapshot) with the
lazily loaded kernels (non_torch_device).
CUDA graphs (profile_cudagraph_memory, gpu_model_runner.py:6268-6405): vLLM captures the two smallest sizes of each
mode (FULL and PIECEWISE), counts the first capture whole and the second as the per-graph cost of the rest; here
the first capture is the graph pool's activations at the largest capture size (the forward transient at that many
tokens) and every further graph costs vLLM's floor of 1 MiB (:6351-6354). NB: under where graphs cost more.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import SetupError
from ..estimate import Serving as ServingDetail
from ..hardware import GPU
from ..setup import Setup
from ..spec import ModelSpec
from ..units import next_pow2
from .activations import FP32
from .embedding import rotary_dim
from .inference import kv_bytes_per_token
from .params import ParamCounts, count_params
from . import roofline, serving_state
from .. import serving_versions
from .precision import DTYPE_BYTES

VLLM_VERSION = serving_versions.parse("vllm").version  # the default (current) release
DEFAULT_BLOCK_SIZE = 16  # config/cache.py:185, 462-463
VOCAB_PADDING = 64  # model_executor/layers/vocab_parallel_embedding.py:36 (pad_vocab_size)
GRAPH_FLOOR = 1 << 20  # gpu_model_runner.py:6351-6354: at least 1 MiB per further graph
GRAPH_MODES = 2  # FULL_AND_PIECEWISE, the v1 default (config/compilation.py:618); servers.toml graph_modes per version
GROUP = 128  # AWQ/GPTQ group size of the published int4 checkpoints (a checkpoint property; NB: 128 assumed)
# MXFP4 (OCP Microscaling: 4-bit e2m1 values, one e8m0 scale byte per block of 32): vLLM's Mxfp4MoEMethod.create_weights
# (model_executor/layers/quantization/mxfp4.py, commit 007d5005) stores w13 (E, 2I, H/2) and w2 (E, H, I/2) as uint8
# (two values a byte) and their scales (E, 2I, H/32), (E, H, I/32) as uint8 (`mxfp4_block = 32`)
MXFP4_BLOCK = 32
MXFP4_BYTES = 0.5 + 1 / MXFP4_BLOCK
# Triton's MXFP4 backend keeps the loaded scales (layer.w13_weight_scale / w2_weight_scale: never deleted or replaced)
# beside the swizzled copies its PrecisionConfig holds (0.14.1 model_executor/layers/quantization/mxfp4.py:746-785:
# `del layer.w13_weight` only; 0.19.0 fused_moe/oracle/mxfp4.py:721-753 and quantization/mxfp4.py:297-308); the
# weights themselves are replaced. NB: the swizzled scale layout's own padding is not counted (under)
MXFP4_TRITON_SCALE_COPIES = 2


@dataclass(frozen=True)
class Knobs:
    """The engine's settings, defaults resolved as `vllm serve` resolves them on this GPU."""

    utilization: float
    max_model_len: int
    max_num_batched_tokens: int
    max_num_seqs: int
    block_size: int
    kv_dtype: str
    capture_sizes: tuple[int, ...]  # () with --enforce-eager
    version: str = VLLM_VERSION  # the vLLM release modelled (--server vllm==X)


@dataclass(frozen=True)
class Serving:
    """Bytes per GPU and the KV capacity (the numbers vLLM logs)."""

    knobs: Knobs
    cuda_total: int  # what cudaMemGetInfo reports as the device's total
    requested: int
    weights: int
    activations: int  # the profile run's transient peak
    cuda_graphs: int
    available_kv: int
    kv_bytes_per_token: float  # this GPU's layers and heads
    kv_blocks: int
    kv_tokens: int
    max_concurrent_sequences: float
    kv_pool: int  # bytes of the blocks allocated
    blocks_per_request: int  # what one request of max_model_len holds (vLLM refuses to start below it)
    state_bytes: int = 0  # one sequence's linear-attention / Mamba states on this GPU (unpadded; serving_state)
    non_torch: int = 0  # non-torch made after vLLM's snapshot; 0.8.x: all on the device + cuBLAS (non_torch_device)
    graphs_in_kv: bool = True  # whether this version takes the CUDA graphs out of the KV cache
    non_torch_on_device: bool = False  # 0.8.x: non_torch is every non-torch byte on the device (non_torch_device)

    @property
    def max_sequences(self) -> int:
        """The most requests the engine runs at once (--max-num-seqs)."""
        return self.knobs.max_num_seqs

    @property
    def context(self) -> int:
        return self.knobs.max_model_len

    def sizing(self) -> ServingDetail:
        """Estimate.detail.serving: the numbers vLLM logs, its settings in knobs."""
        k = self.knobs
        return ServingDetail(
            server="vllm", version=k.version, max_model_len=k.max_model_len, kv_cache_dtype=k.kv_dtype,
            cuda_total=self.cuda_total, requested=self.requested, weights=self.weights,
            activation_peak=self.activations, cuda_graphs=self.cuda_graphs, available_kv=self.available_kv,
            kv_bytes_per_token=self.kv_bytes_per_token, kv_blocks=self.kv_blocks, kv_tokens=self.kv_tokens,
            max_concurrent_sequences=round(self.max_concurrent_sequences, 2),
            knobs={"gpu_memory_utilization": k.utilization, "max_num_batched_tokens": k.max_num_batched_tokens,
                   "max_num_seqs": k.max_num_seqs, "block_size": k.block_size,
                   "cuda_graph_sizes": len(k.capture_sizes), "non_torch": self.non_torch,
                   "cuda_graphs_in_kv": self.graphs_in_kv})


def log_lines(sv: ServingDetail) -> list[tuple[str, float]]:
    """The start-up accounting as vLLM logs it, in GiB (2**30, as vLLM's GiB_bytes), for a line-by-line comparison:
    "Model loading took X GiB" (gpu_model_runner.py load_model), the memory profiler's weights / non-torch / peak
    activation, "Graph capturing finished in N secs, took X GiB" and "Available KV cache memory: X GiB"
    (0.11.0 gpu_worker.py:298). `sv`: Estimate.detail.serving of --server vllm."""
    gib = 2**30
    graphs = "CUDA graphs (in the KV budget)" if sv.knobs.get("cuda_graphs_in_kv", True) else \
        "CUDA graphs (after the KV cache, not in its budget)"
    return [("Model loading took", sv.weights / gib), ("PyTorch activation peak memory", sv.activation_peak / gib),
            ("non_torch_memory", sv.knobs.get("non_torch", 0) / gib), (graphs, sv.cuda_graphs / gib),
            ("Available KV cache memory", sv.available_kv / gib)]


def default_limits(gpu: GPU, version: str = VLLM_VERSION) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) of `vllm serve` (UsageContext.OPENAI_API_SERVER) on this GPU: the
    version's tiers (data/servers.toml limits: 0.33.0 engine/arg_utils.py:2970-3006 — 16384 / 1024 from 160 GiB,
    8192 / 1024 from 70 GiB except A100s; 0.10.1-0.19.0 only the 70 GiB tier; 0.8.5 :1596-1609 from 70 GiB, A100s
    included), else 2048 / 256 (with chunked prefill, on by default for these models)."""
    gib = gpu.memory / 2**30
    for floor, tokens, seqs, *skips in serving_versions.parse(f"vllm=={version}")["limits"]:
        # a tier's 4th element: a device name it skips (vLLM reads the device's name: "a100" not in device_name from
        # 0.10; 0.8.5 has no such test); GPU.kernels names the chip
        if gib >= floor and not any(name in gpu.kernels.lower() for name in skips):
            return tokens, seqs
    return 2048, 256


# 0.33.0's capture-size rule (config/vllm.py:2453-2470, 2575-2591), what a version without servers.toml `capture`
# takes: up to min(2 × max_num_seqs, 512 — 1024 on Blackwell), every 16 from 256
CAPTURE_RULE = {"by_seqs": True, "top": 512, "top_blackwell": 1024, "step16_from": 256}


def capture_sizes(max_num_seqs: int, max_tokens: int, blackwell: bool = False,
                  rule: dict | None = None) -> tuple[int, ...]:
    """CUDA-graph batch sizes by the version's rule (servers.toml `capture`, else CAPTURE_RULE): up to `top` (on
    Blackwell, compute capability 10.x, `top_blackwell`), below 2 × max_num_seqs where `by_seqs`, capped by
    max_num_batched_tokens: 1, 2, 4, then every 8, every 16 from `step16_from` where the rule has one."""
    rule = rule or CAPTURE_RULE
    top = min(rule.get("top_blackwell", rule["top"]) if blackwell else rule["top"], max_tokens)
    if rule["by_seqs"]:
        top = min(top, max_num_seqs * 2)
    step16 = rule.get("step16_from", top + 1)
    sizes = [s for s in (1, 2, 4) if s <= top] + list(range(8, min(top + 1, step16), 8)) + \
        list(range(step16, top + 1, 16))
    return tuple(sizes)


def knobs(spec: ModelSpec, setup: Setup, gpu: GPU) -> Knobs:
    release = serving_versions.of(setup)
    version, facts = release.version, release.facts
    tokens, seqs = default_limits(gpu, version)
    longest = spec.max_positions or setup.seq
    max_len = setup.max_model_len or longest
    if setup.max_model_len and spec.max_positions and setup.max_model_len > spec.max_positions:
        raise SetupError(f"--max-model-len {setup.max_model_len} exceeds {spec.name}'s max_position_embeddings "
                         f"({spec.max_positions}); vLLM refuses it without VLLM_ALLOW_LONG_MAX_MODEL_LEN")
    batched = setup.max_num_batched_tokens or tokens
    flag = "--kv-cache-memory-bytes"  # (EngineArgs.kv_cache_memory_bytes from 0.11.0, engine/arg_utils.py:358)
    if setup.kv_cache_memory and not serving_versions.has_flag(release, flag):
        raise SetupError(f"--kv-cache-memory: vLLM {version}'s `vllm serve` has no {flag} (data/serve_flags.json; "
                         f"vLLM {', '.join(serving_versions.releases_taking('vllm', flag))} have it): drop it, its "
                         "--gpu-memory-utilization sizes the KV cache")
    # a default max_num_batched_tokens is capped at max_num_seqs (given or the tier's) × max_model_len (0.33.0
    # engine/arg_utils.py:3218-3224, 0.14.1 :2010-2016); servers.toml batched_capped = false where it is not
    if not setup.max_num_batched_tokens and facts.get("batched_capped", True):
        batched = min(batched, (setup.max_num_seqs or seqs) * max_len)
    # a default max_num_seqs is capped at max_num_batched_tokens (0.33.0 engine/arg_utils.py:3232-3234, 0.10.1
    # :1709-1712); 0.8.5 keeps it (servers.toml seqs_capped), and then raises below as for a given one
    seqs = setup.max_num_seqs or (min(seqs, batched) if facts.get("seqs_capped", True) else seqs)
    if batched < seqs:  # 0.33.0 config/scheduler.py:331-336, 0.8.5 config.py:2033-2037
        default = {False: " (the default)", True: ""}
        raise SetupError(f"--max-num-batched-tokens {batched}{default[bool(setup.max_num_batched_tokens)]} is below "
                         f"--max-num-seqs {seqs}{default[bool(setup.max_num_seqs)]}: vLLM {version} refuses it "
                         f"('max_num_batched_tokens ({batched}) must be greater than or equal to max_num_seqs "
                         f"({seqs})'); raise --max-num-batched-tokens or lower --max-num-seqs")
    blackwell = roofline.blackwell(gpu)
    rule = facts.get("capture")
    sizes = () if setup.enforce_eager else capture_sizes(seqs, batched, blackwell, rule)
    dtype = setup.kv_dtype or _weight_dtype(setup)
    block = setup.block_size
    if serving_state.state_layers(spec):  # one attention page holds a state page (serving_state)
        block = serving_state.hybrid_block_size(spec, setup, gpu, dtype, _weight_dtype(setup))
    utilization = setup.gpu_memory_utilization or serving_versions.of(setup)["default_utilization"]
    return Knobs(utilization, max_len, batched, seqs, block, dtype, sizes, version)


def _weight_dtype(setup: Setup) -> str:
    return {"fp32": "fp32", "fp16": "fp16"}.get(setup.precision, "bf16")


def embedding_bytes(spec: ModelSpec, setup: Setup) -> float:
    """One GPU's share of the embedding (or of an untied head): the vocabulary padded to 64, split over TP, in the
    model dtype (vLLM's fp8 checkpoints and online quantisation keep it so)."""
    vocab = math.ceil(spec.vocab / VOCAB_PADDING) * VOCAB_PADDING
    return vocab * spec.hidden / setup.tp * DTYPE_BYTES[_weight_dtype(setup)]


def layer_bytes(spec: ModelSpec, setup: Setup, pc: ParamCounts, mlp: float | None = None,
                gpu: GPU | None = None) -> float:
    """One decoder layer on one GPU — the average of the model's layers, or one whose MLP has `mlp` parameters —:
    its projections over TP (kv heads replicated when TP exceeds them; MLA's down-projections replicated), at
    --quant's bytes, norms replicated. A MoE layer's router gate (experts × hidden) is whole on every rank and in
    the model dtype whatever --quant (SGLang 0.5.23 models/qwen3_moe.py:290-296 and qwen2_moe.py:348-354
    ReplicatedLinear with no quant config, deepseek_v2.py:509-518 MoEGate an nn.Parameter in the default dtype;
    0.4.9.post2 qwen3_moe.py:131-136 the same). NB: taken as vLLM's too (its models were not read here)."""
    b = DTYPE_BYTES[_weight_dtype(setup)]
    t, h = setup.tp, spec.hidden
    moe_share = spec.moe_share if mlp is None else float(spec.moe is not None and mlp == pc.moe_mlp)
    router = spec.moe.num_experts * h * moe_share if spec.moe is not None else 0
    if mlp is None:
        mlp = (pc.mlp * pc.dense_layers + pc.moe_mlp * pc.moe_layers) / spec.layers
    layer_linear = pc.attention + mlp - router
    if spec.mla is not None:
        # MLA: the down-projections q_a_proj and kv_a_proj_with_mqa (and their norms) are replicated on every rank,
        # the up-projections and o_proj sharded (model_executor/models/deepseek_v2.py: MergedReplicatedLinear
        # fused_qkv_a_proj / ReplicatedLinear kv_a_proj_with_mqa, ColumnParallelLinear q_b_proj and kv_b_proj)
        m = spec.mla
        replicated = h * (m.q_lora_rank + m.kv_lora_rank + m.qk_rope_head_dim) + m.q_lora_rank + m.kv_lora_rank
        per_layer = (layer_linear - replicated) / t + replicated
    else:
        kv_params = 2 * spec.kv_dim * h  # k and v: each rank holds max(kv_heads / tp, 1) heads (replicated past)
        per_layer = (layer_linear - kv_params) / t + kv_params * kv_share(spec, t)
    # the experts' matrices (sharded over TP with the rest) at their own bytes where the checkpoint's differ
    experts = expert_matrices(spec) * moe_share / t
    return per_layer * quant_bytes(setup) + experts * (expert_weight_bytes(spec, setup, gpu) - quant_bytes(setup)) + \
        (pc.norms + router) * b


def expert_matrices(spec: ModelSpec) -> float:
    """One MoE layer's routed experts' matrix weights (gate/up and down; biases not included): E · (2 or 1 + 1) · I · H."""
    if spec.moe is None:
        return 0.0
    m = spec.moe
    return m.num_experts * (3 if spec.gated_mlp else 2) * m.expert_intermediate * spec.hidden


def stored_mxfp4(spec: ModelSpec, setup: Setup) -> bool:
    """Whether the engine loads the checkpoint's routed experts as their stored MXFP4 (MoESpec.experts_mxfp4:
    gpt-oss), no --quant asking for another format (expert_weight_bytes)."""
    return spec.moe is not None and spec.moe.experts_mxfp4 and not setup.quant


def expert_weight_bytes(spec: ModelSpec, setup: Setup, gpu: GPU | None = None) -> float:
    """Bytes per routed-expert matrix weight: the checkpoint's MXFP4 (4.25 bits: MXFP4_BYTES) where it stores the
    experts so (MoESpec.experts_mxfp4: gpt-oss) and no --quant asks for another format — vLLM loads it as stored
    (Mxfp4Config.get_quant_method: FusedMoE -> Mxfp4MoEMethod; its biases stay bf16, and the attention, router,
    embeddings and head, which the config's modules_to_not_convert names, run UnquantizedLinearMethod); else
    quant_bytes. Where the version runs them through Marlin (data/servers.toml mxfp4_moe), its padding of the expert
    matrices (mxfp4_padding). NB: other backends' padding of I/tp (mxfp4.py create_weights: to 64 on Hopper's Triton
    path, none at gpt-oss's 2880 with TP 1; 256 on Blackwell's FlashInfer and on ROCm), the Triton path's fp32 copies
    of the expert biases and its swizzled scales kept beside the originals (0.11.0 process_weights_after_loading
    :578-617 frees only the weights) are not counted, nor Marlin's padding of the bf16 biases (a few MiB): under."""
    if stored_mxfp4(spec, setup):
        if mxfp4_backend(setup, gpu) == "triton":  # the scales twice: as loaded and swizzled (mxfp4_triton_scales)
            return (0.5 + MXFP4_TRITON_SCALE_COPIES / MXFP4_BLOCK) * mxfp4_padding(spec, setup, gpu)
        return MXFP4_BYTES * mxfp4_padding(spec, setup, gpu)
    return quant_bytes(setup)


def mxfp4_backend(setup: Setup, gpu: GPU | None = None) -> str | None:
    """The MXFP4 MoE backend the vLLM version runs a checkpoint's MXFP4 experts on (data/servers.toml mxfp4_moe, by
    the GPU's generation where mxfp4_moe_by_generation names one); None under SGLang or where the version lists none.
    Without a GPU, the version's mxfp4_moe."""
    if serving_versions.engine_of(setup.server or "vllm") != "vllm":
        return None
    facts = serving_versions.of(setup).facts
    backend = facts.get("mxfp4_moe")
    if gpu is not None:
        backend = facts.get("mxfp4_moe_by_generation", {}).get(roofline.kernels_for(gpu).generation, backend)
    return backend


def mxfp4_padding(spec: ModelSpec, setup: Setup, gpu: GPU | None = None) -> float:
    """The factor by which vLLM's MXFP4 MoE backend grows the expert matrices and their scales. Marlin: "the moe
    marlin kernel requires that for each linear n % 256 == 0 and k % 128 == 0", so create_weights pads I/tp up to a
    multiple of 128 and H to 256 (0.11.0 model_executor/layers/quantization/mxfp4.py:189-204, 0.10.1 :156-167, 0.14.1
    :279-294, 0.19.0 fused_moe/oracle/mxfp4.py:380-385; gpt-oss's 2880 -> 2944 and 3072). Triton on CUDA: I/tp up to
    a multiple of 64, H as it is (0.14.1 quantization/mxfp4.py:327-330, 0.19.0 oracle/mxfp4.py:398-399; 2880 is one).
    1 for any other backend (FlashInfer's: not modelled, NB under) or engine."""
    backend = mxfp4_backend(setup, gpu)
    i = spec.moe.expert_intermediate / setup.tp
    if backend == "marlin":
        return (math.ceil(i / 128) * 128 / i) * (math.ceil(spec.hidden / 256) * 256 / spec.hidden)
    if backend == "triton":
        return math.ceil(i / 64) * 64 / i
    return 1.0


def mxfp4_bias_upcast(spec: ModelSpec, setup: Setup, gpu: GPU | None = None) -> float:
    """Bytes the Triton MXFP4 backend adds on one GPU by making the experts' biases fp32 (0.14.1 model_executor/layers/
    quantization/mxfp4.py:749-753, 0.19.0 fused_moe/oracle/mxfp4.py:724-726 `w13_bias.to(torch.float32)`, replacing
    the bf16 parameters): + 2 bytes per bias, w13's 2 I_pad/tp and w2's H per expert of every MoE layer of the stage;
    0 on other backends."""
    if not stored_mxfp4(spec, setup) or not spec.moe.expert_bias or mxfp4_backend(setup, gpu) != "triton":
        return 0.0
    m, pc = spec.moe, count_params(spec)
    i_pad = m.expert_intermediate / setup.tp * mxfp4_padding(spec, setup, gpu)
    per_layer = m.num_experts * ((2 if spec.gated_mlp else 1) * i_pad + spec.hidden)
    return pc.moe_layers * per_layer * (FP32 - DTYPE_BYTES[_weight_dtype(setup)]) / setup.pp


def kv_share(spec: ModelSpec, tp: int) -> float:
    """The share of the k and v projections one TP rank holds: max(kv_heads / tp, 1) of the kv heads, each head
    replicated once TP exceeds them."""
    return max(1 / tp, 1 / max(spec.kv_heads, 1))


def quant_bytes(setup: Setup) -> float:
    """Bytes per projection weight: --quant fp8 1; awq/gptq 4 bits with an fp16 scale and a 4-bit zero per GROUP
    inputs; else the model dtype's."""
    b = DTYPE_BYTES[_weight_dtype(setup)]
    return {"fp8": 1.0, "awq": 0.5 + (2 + 0.5) / GROUP, "gptq": 0.5 + (2 + 0.5) / GROUP}.get(setup.quant, b)


def _attention_bytes(spec: ModelSpec, setup: Setup, pc: ParamCounts) -> float:
    """One attention layer's projections on one GPU (as layer_bytes shards them: the k and v heads replicated past
    TP's share)."""
    kv = 2 * spec.kv_dim * spec.hidden
    return ((pc.attention - kv) / setup.tp + kv * kv_share(spec, setup.tp)) * quant_bytes(setup)


def stack_bytes(spec: ModelSpec, setup: Setup, pc: ParamCounts, gpu: GPU | None = None) -> float:
    """Every decoder layer of one pipeline stage on one GPU. A hybrid stack (Nemotron-H: one norm and one mixer per
    block) counts its attention blocks as attention layers, its MLP blocks' MLP and its Mamba-2 mixers over TP
    (vLLM's MambaMixer2 shards in_proj, conv1d, A, D, dt_bias, its gated norm and out_proj by heads: model_executor/
    layers/mamba/mamba_mixer2.py), each block's norm replicated; Qwen3-Next's Gated DeltaNet layers hold their mixer
    over TP (sharded by heads: model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py) in place of attention.
    NB: a Mamba mixer's B/C groups replicated when TP exceeds n_groups, and its small vectors at --quant's bytes
    (they stay in the model dtype): both a few MiB."""
    q, t = quant_bytes(setup), setup.tp
    if spec.hybrid is not None:
        m = spec.hybrid
        mixers = m.attention_layers * _attention_bytes(spec, setup, pc) + (
            m.mlp_layers * pc.mlp + m.mamba_layers * pc.mamba) / t * q
        return (mixers + spec.layers * pc.norms * DTYPE_BYTES[_weight_dtype(setup)]) / setup.pp
    layers = spec.layers * layer_bytes(spec, setup, pc, gpu=gpu)
    if pc.linear_layers:  # a Gated DeltaNet in place of each such layer's attention
        layers += pc.linear_layers * (pc.linear_attention / t * q - _attention_bytes(spec, setup, pc))
    return layers / setup.pp


def weights_per_gpu(spec: ModelSpec, setup: Setup, pc: ParamCounts, gpu: GPU | None = None) -> float:
    """The model's weights on one GPU as vLLM shards them: every layer as layer_bytes shards it, layers split
    evenly over PP, the embedding (embedding_bytes) on the first stage (the largest), an untied head and the final
    norm on the last. `gpu`: the device, where the version's MXFP4 backend depends on it (mxfp4_backend)."""
    b = DTYPE_BYTES[_weight_dtype(setup)]
    embed = embedding_bytes(spec, setup)
    head = 0 if spec.tied_embeddings else embed
    layers = stack_bytes(spec, setup, pc, gpu) + mxfp4_bias_upcast(spec, setup, gpu)
    # RotaryEmbedding's cos/sin cache, a buffer of (max positions, rotary dim) in the model dtype on every rank
    # (model_executor/layers/rotary_embedding/base.py _compute_cos_sin_cache; "Loading model weights took" counts it)
    rope = (spec.max_positions or 0) * rotary_dim(spec) * b if spec.positions == "rotary" else 0
    return layers + embed + rope + (head + pc.final * b if setup.pp == 1 else 0)


def forward_transient(spec: ModelSpec, setup: Setup, tokens: int) -> float:
    """The larger in-layer moment of a no-KV forward over `tokens` tokens (module docstring).
    NB: MoE layers are taken as a dense MLP of top_k × the expert width (fused_moe's intermediate caches; its
    sorted-token buffers are not counted: under), MLA's attention as standard attention of its q/k width."""
    a = DTYPE_BYTES[_weight_dtype(setup)]
    t, h = setup.tp, spec.hidden
    if spec.moe is not None:  # fused_moe's intermediate caches: top_k copies of gate_up and its activation
        i = spec.moe.expert_intermediate * spec.moe.top_k
    else:
        i = spec.intermediate
    mlp = 3 * h + 3 * i / t  # as the down projection runs: its output beside its input and gate_up's
    attention = 3 * h + (2 * spec.q_dim + 2 * spec.kv_dim) / t  # as o_proj runs: qkv, the attention output, o_proj's
    mixer = 3 * h + mixer_width(spec) / t if mixer_width(spec) else 0  # as a linear-attention / Mamba out_proj runs
    return a * tokens * max(mlp, attention, mixer)


def mixer_width(spec: ModelSpec) -> int:
    """Per token, a linear-attention / Mamba mixer's input projection and its output (0 without such layers), for the
    moment its out_proj runs (beside the residual, its normalised copy and out_proj's output, h each): Gated
    DeltaNet in_proj_qkvz + in_proj_ba (2 key_dim + 2 value_dim + 2 value_heads) and value_dim; Mamba-2 in_proj
    (2 inner + 2 n_groups d_state + heads) and inner. NB: under — the conv's output and the chunked scan's fp32
    states (Mamba-2: chunks x heads x head_dim x d_state) are not counted: the profile run runs vLLM's own fused
    kernels, not the transformers reference scan whose live tensors analytic/mamba2.py and gated_deltanet.py price."""
    if spec.hybrid is not None:
        m = spec.hybrid
        return 2 * m.ssm_inner + 2 * m.n_groups * m.d_state + m.ssm_heads + m.ssm_inner
    if spec.linear_attn is not None:
        g = spec.linear_attn
        return 2 * g.key_dim + 2 * g.value_dim + 2 * g.value_heads + g.value_dim
    return 0


def logits_transient(spec: ModelSpec, setup: Setup, tokens: int, rows: int, fp32_copies: int) -> float:
    """The output hidden states of `tokens` tokens beside the logits of `rows` rows: the head's output in the model
    dtype (the whole vocabulary per row, the shards gathered) and `fp32_copies` fp32 copies of it."""
    a = DTYPE_BYTES[_weight_dtype(setup)]
    return a * tokens * spec.hidden + rows * spec.vocab * (a + fp32_copies * FP32)


def sampler_buffers(path: str, model_bytes: int) -> dict[str, int]:
    """Bytes per logit (row × vocab element) live at once at the dummy sampler run's peak, by the sampler's path
    (data/servers.toml `sampler`), each from its code:
      both: the logits in the model dtype (compute_logits' output, held by _dummy_sampler_run) and their fp32 copy
            (v1/sample/sampler.py: `logits = logits.to(torch.float32)`, 0.11.0 :86, 0.33.0 :158), held by Sampler
            .forward while the top-k/top-p sampler runs (temperature divides it in place, 0.11.0 :127-137).
      "flashinfer" (0.33.0 topk_topp_sampler.py flashinfer_sample :631-667 -> FlashInfer's
            top_k_top_p_sampling_from_logits, filter_apply_order "top_k_first": masked_logits = top_k_mask_logits(
            logits, top_k); probs = torch.softmax(masked_logits)): two more fp32 copies.
      "torch-sort" (0.11.0 topk_topp_sampler.py apply_top_k_top_p :183, `logits.sort(dim=-1)`; its peak is inside
            the sort: what follows — the top-k and top-p bool masks, the softmax the cumsum overwrites, the scattered
            copy :185-203, then forward_native's softmax and random_sample's q :96, :232-253 — holds at most the
            logits, the sort's values and indices, two masks, the softmax and the scattered copy: 28 bytes per logit
            with bf16 logits, under the sort's 38):
            the sorted values (fp32) and indices (int64) the sort returns, and PyTorch's stable sort over R > 128
            rows (ATen/native/cuda/SortStable.cu do_launch_stable_sort_kernel -> segmented_sort_pairs: an int64
            `reverse_indices` iota from the caching allocator) -> cub's DeviceSegmentedRadixSort::SortPairs, whose
            temporary storage without a DoubleBuffer holds a 3rd keys buffer and a 3rd values buffer
            (cub/device/dispatch/dispatch_radix_sort.cuh, is_overwrite_okay false): fp32 + int64.
      "triton" (0.19.0 topk_topp_sampler.py:245-255 -> topk_topp_triton.py apply_top_k_top_p_triton :965-1050:
            the mask is applied in place on the fp32 logits; its per-program buffer: triton_buffer_bytes); then
            forward_native's softmax (:112) and random_sample's q = torch.empty_like(probs) (:334), live together
            beside the logits: two more fp32 copies.
    NB: cub's digit-histogram spine (KiB) is not counted (under)."""
    out = {"logits (model dtype)": model_bytes, "logits fp32": FP32}
    if path == "triton":
        out.update({"probs fp32": FP32, "random_sample q fp32": FP32})
    elif path == "flashinfer":
        out.update({"top-k masked logits fp32": FP32, "probs fp32": FP32})
    elif path == "torch-sort":
        out.update({"sorted values fp32": FP32, "sort indices int64": 8, "reverse indices int64": 8,
                    "cub keys buffer fp32": FP32, "cub values buffer int64": 8})
    else:
        raise LookupError(f"data/servers.toml: sampler path {path!r} is not modelled")
    return out


# what the dummy sampler run holds in hidden states beside the logits, where servers.toml names no sampler_holds:
# profile_run keeps the forward's output (T × h) and the R sampled rows, _dummy_sampler_run their torch.rand_like
# (0.10.1 gpu_model_runner.py:2433, 2622-2631; 0.11.0 :3190; 0.19.0 :5569, 5782-5793; 0.33.0 :5879)
SAMPLER_HOLDS = ("forward output", "rows", "rand_like rows")


def sampler_path(version: str, rows: int) -> str:
    """The top-k/top-p path the version's dummy sampler run takes over `rows` rows (servers.toml sampler; a Triton
    sampler falls back to the PyTorch sort below sampler_triton_min_rows: 0.19.0 topk_topp_sampler.py:251)."""
    facts = serving_versions.parse(f"vllm=={version}").facts
    if facts["sampler"] == "triton" and rows < facts["sampler_triton_min_rows"]:
        return "torch-sort"
    return facts["sampler"]


def triton_buffer_bytes(rows: int, vocab: int, sms: int) -> int:
    """apply_top_k_top_p_triton's cached per-program buffer (0.19.0 v1/sample/ops/topk_topp_triton.py:1011-1021):
    NUM_PROGRAMS = min(SMs, rows) programs; a buffer of min(next_power_of_2(NUM_PROGRAMS), SMs) rows of the vocabulary
    in the logits' dtype (fp32), kept in _TRITON_BUFFER_CACHE (held past the profile run: in its peak either way).
    SMs: torch's multi_processor_count (platforms/cuda.py:520-521)."""
    programs = min(sms, rows)
    return min(next_pow2(programs), sms) * vocab * FP32


def sampler_transient(spec: ModelSpec, setup: Setup, k: Knobs, gpu: GPU | None = None) -> float:
    """vLLM's dummy sampler run (module docstring): the hidden states it holds (SAMPLER_HOLDS, or the version's
    sampler_holds: 0.8.5 only the R rows), and the sampler's buffers over R × vocab (sampler_buffers, by the
    version's path) with the Triton sampler's per-program buffer (triton_buffer_bytes: `gpu` needed there)."""
    a = DTYPE_BYTES[_weight_dtype(setup)]
    rows = min(k.max_num_seqs, k.max_num_batched_tokens)
    facts = serving_versions.parse(f"vllm=={k.version}").facts
    path = sampler_path(k.version, rows)
    per_logit = sum(sampler_buffers(path, a).values())
    holds = facts.get("sampler_holds", SAMPLER_HOLDS)
    hidden = sum(k.max_num_batched_tokens if h == "forward output" else rows for h in holds)
    extra = 0
    if path == "triton":
        if gpu is None:
            raise LookupError(f"vLLM {k.version}'s Triton sampler buffer depends on the GPU's SM count: pass gpu")
        extra = triton_buffer_bytes(rows, spec.vocab, roofline.kernels_for(gpu).sms)
    return a * hidden * spec.hidden + rows * spec.vocab * per_logit + extra


def non_torch_device(gpu: GPU, setup: Setup) -> int:
    """vLLM 0.8.x's non-torch term (servers.toml non_torch = "device"; 0.8.5 v1/worker/gpu_worker.py:194-210): the
    allocated peak since reset_peak_memory_stats counts every live torch allocation — the cuBLAS workspace too
    (overheads.blas_workspace: torch allocates it from its caching allocator) — and `total − free − torch allocated`
    every other byte on the device: the CUDA context, NCCL's buffers, custom all-reduce (overheads.overheads, what later
    versions leave before their snapshot) and the kernels loaded lazily by the profile run (non_torch_lazy_bytes).
    NB: other processes on the device would count too (none taken)."""
    from .. import overheads

    return sum(overheads.overheads(gpu, setup).values()) + overheads.blas_workspace(gpu) + \
        serving_versions.vllm_shared("non_torch_lazy_bytes")


def cuda_graph_bytes(spec: ModelSpec, setup: Setup, k: Knobs) -> float:
    if not k.capture_sizes:
        return 0.0
    modes = serving_versions.parse(f"vllm=={k.version}").facts.get("graph_modes", GRAPH_MODES)
    return forward_transient(spec, setup, max(k.capture_sizes)) + modes * (len(k.capture_sizes) - 1) * GRAPH_FLOOR


@dataclass(frozen=True)
class LayerKinds:
    """How many layers hold each kind of cache: full attention, a sliding window (of `window` tokens), Llama 4's
    chunked local attention (chunks of `chunk` tokens), and a constant-size state per sequence (linear attention,
    Mamba: analytic/serving_state.py). Layers with no cache (Nemotron-H's MLP blocks) are in none."""

    full: int
    sliding: int
    window: int | None
    chunked: int = 0
    chunk: int | None = None
    state: int = 0

    def counts(self) -> dict[str, int]:
        """The kinds present, by name, with their layer counts (the order vLLM's groups come in does not matter)."""
        kinds = {"full": self.full, "sliding": self.sliding, "chunked": self.chunked, "state": self.state}
        return {name: n for name, n in kinds.items() if n}


def layer_kinds(spec: ModelSpec) -> LayerKinds:
    """vLLM gives a layer a sliding window where transformers' config does (its layer_types, which
    models/hf_config.py resolves into sliding_window_layers: Gemma-2's every other layer, configuration_gemma2.py:
    95-98, vLLM model_executor/models/gemma2.py:155-156; Gemma 3's five of six, gemma3.py:155; gpt-oss's even layers,
    gpt_oss.py:175; Qwen2's layers from max_window_layers), or to every layer from the config's sliding_window
    (Mistral-7B-v0.1, Phi-3-mini-4k: vLLM's Attention falls back to cache_config.sliding_window). A window as long as
    the context is full attention. Llama 4's RoPE layers are ChunkedLocalAttention (model_executor/models/llama4.py:
    251-263; the hybrid allocator stays on for them by default: envs.py:272 VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_
    HYBRID_KV_CACHE=1, config/vllm.py:2235-2253), its NoPE layers full attention. gpt-oss's attention sinks are a
    per-head logit (a parameter), no cache: its layers are sliding or full like any other."""
    attention, state = serving_state.attention_layers(spec), serving_state.state_layers(spec)
    chunked = spec.chunked_layers if spec.attention_chunk else 0
    window = spec.sliding_window
    if not window or window >= (spec.max_positions or window + 1):
        return LayerKinds(attention - chunked, 0, None, chunked, spec.attention_chunk if chunked else None, state)
    sliding = attention if spec.sliding_window_layers is None else spec.sliding_window_layers
    return LayerKinds(attention - sliding - chunked, sliding, window, chunked,
                      spec.attention_chunk if chunked else None, state)


def cache_groups(kinds: LayerKinds) -> tuple[int, dict[str, int]]:
    """(layers per group, groups of each kind) as vLLM's hybrid allocator splits the layers
    (v1/core/kv_cache_planning.py:484-557): layers of one KV spec form a bucket (full attention, a window, a chunk
    size, a state layer: MambaSpec); the group size is the smallest bucket's count — the largest's if that is under
    1.5 × the smallest (:521-536) — each bucket in ceil(n / size) groups (the last padded); every group's layers share
    the block ids of one pool, so a block holds one page of each layer of a group (bytes per block: the largest
    group's pages, :574-605)."""
    counts = kinds.counts()
    size = min(counts.values())
    if max(counts.values()) < 1.5 * size:
        size = max(counts.values())
    return size, {name: math.ceil(n / size) for name, n in counts.items()}


def in_flight_tokens(setup: Setup, k: Knobs) -> int:
    """Tokens scheduled but not settled (config/vllm.py:590-609 max_in_flight_tokens): max_num_batched_tokens per
    concurrent batch, 2 batches with async scheduling (the default) or pp of them."""
    return max(2 if setup.pp == 1 else setup.pp, 1) * k.max_num_batched_tokens


def blocks_per_request(kinds: LayerKinds, setup: Setup, k: Knobs, state_blocks: int = 0) -> int:
    """Blocks one request of max_model_len holds, summed over its cache groups (kv_cache_utils.py:1061-1097,
    get_max_concurrency_for_kv_cache_config): a full-attention group ceil(L / B); a sliding-window group
    (SlidingWindowSpec.max_admission_blocks_per_request, kv_cache_interface.py:918-944) the last window − 1 tokens
    plus the tokens in flight (in_flight_tokens), never more than L, + 1 block for a window that does not start at a
    block boundary; a chunked-local group (ChunkedLocalAttentionSpec, :864-881) a chunk plus the tokens in flight,
    never more than L; a state group `state_blocks` (serving_state.state_blocks_per_request)."""
    _, groups = cache_groups(kinds)
    length, b = k.max_model_len, k.block_size
    per_group = {"full": math.ceil(length / b), "state": state_blocks}
    if kinds.sliding:
        per_group["sliding"] = math.ceil(min(kinds.window - 1 + in_flight_tokens(setup, k), length) / b) + 1
    if kinds.chunked:
        per_group["chunked"] = math.ceil(min(kinds.chunk + in_flight_tokens(setup, k), length) / b)
    return sum(n * per_group[name] for name, n in groups.items())


def check(spec: ModelSpec, setup: Setup) -> None:
    if not spec.causal:
        raise SetupError(f"--mode serve: {spec.name} is an encoder; vLLM's KV cache serves decoders")
    if spec.vision is not None:  # the engines' encoder cache and the tower's share of the profile run: not modelled
        raise SetupError(f"--mode serve: {spec.name}'s vision tower (the engine's encoder cache, its images in the "
                         "profile run) is not modelled; use --mode infer --engine trace")
    if setup.pp > 1 and serving_state.state_layers(spec):
        raise SetupError(f"--mode serve --pp {setup.pp}: {spec.name}'s linear-attention / Mamba layers split over "
                         "pipeline stages are not modelled (their cache groups are per stage); use --tp")
    if setup.pp > 1 and spec.layers % setup.pp:
        raise SetupError(f"--pp {setup.pp} must divide {spec.name}'s {spec.layers} layers")


def draft_of(spec: ModelSpec, setup: Setup) -> ModelSpec | None:
    """--draft-model: the draft model vLLM runs beside the target (v1/spec_decode/draft_model.py), at the target's
    TP (config/speculative.py:1850-1870: draft_tensor_parallel_size defaults to it), in the target's dtype. vLLM
    gives the draft's attention layers KV-cache pages of their own in the same pool (one KV spec per layer of both
    models), and loads its weights before the profile run."""
    if not setup.draft_model:
        return None
    from ..models.resolve import load_model

    draft = load_model(setup.draft_model, field="draft_model")
    if draft.vocab != spec.vocab:
        raise SetupError(f"--draft-model {setup.draft_model}: its vocabulary ({draft.vocab:,}) is not {spec.name}'s "
                         f"({spec.vocab:,}); a draft must share the target's tokenizer")
    check(draft, setup)
    if draft.heads % setup.tp:
        raise SetupError(f"--draft-model {setup.draft_model} runs at --tp {setup.tp}, which must divide its "
                         f"{draft.heads} heads")
    return draft


def serve_memory(spec: ModelSpec, setup: Setup, gpu: GPU, pc: ParamCounts | None = None) -> Serving:
    check(spec, setup)
    pc = pc or count_params(spec)
    draft = draft_of(spec, setup)
    k = knobs(spec, setup, gpu)
    # vLLM's total is cudaMemGetInfo's (GPU.memory: nvidia-smi's less the driver's reserve; its logs print
    # total_gpu_memory 79.11-79.33 GiB on an H100). NB: the reserve varies by driver by ~0.1 GiB; --gpu-memory sets it
    total = gpu.memory
    requested = math.ceil(total * k.utilization)
    weights = weights_per_gpu(spec, setup, pc, gpu)
    act = max(forward_transient(spec, setup, k.max_num_batched_tokens), sampler_transient(spec, setup, k, gpu))
    graphs = cuda_graph_bytes(spec, setup, k)
    facts = serving_versions.parse(f"vllm=={k.version}").facts
    graphs_in_kv = facts["graphs_in_kv"]
    on_device = facts.get("non_torch") == "device"
    non_torch = non_torch_device(gpu, setup) if on_device else serving_versions.vllm_shared("non_torch_lazy_bytes")
    kinds = layer_kinds(spec)
    per_token = kv_bytes_per_token(spec, setup.with_(kv_dtype=k.kv_dtype))
    if kinds.state:  # only the attention layers' K and V grow with the tokens (the states: state_bytes)
        per_token = (kinds.full + kinds.sliding + kinds.chunked) * \
            serving_state.attention_page_per_token(spec, setup, k.kv_dtype)
    if draft is not None:  # NB: the two models' profile peaks taken as not overlapping (they run one after another)
        weights += weights_per_gpu(draft, setup, count_params(draft), gpu)
        act = max(act, forward_transient(draft, setup, k.max_num_batched_tokens))
        graphs += cuda_graph_bytes(draft, setup, k)
        per_token += kv_bytes_per_token(draft, setup.with_(kv_dtype=k.kv_dtype))
    available = requested - weights - act - non_torch - (graphs if graphs_in_kv else 0)
    if setup.kv_cache_memory:  # --kv-cache-memory-bytes: taken as given, no profiling arithmetic (0.11.0
        # v1/worker/gpu_worker.py:235-252, 0.33.0 :656-680 determine_available_memory returns it)
        available = setup.kv_cache_memory
    if draft is not None and len(kinds.counts()) > 1:
        raise SetupError("--draft-model with a target of several cache kinds (sliding-window, chunked, linear-attention "
                         "or Mamba layers): vLLM's mixed cache groups with a draft are not modelled")
    # a block: one page (block_size tokens) of each layer of a group (all of the target's and a draft's layers when
    # there is one kind): block_size × per_token × the group's share of the layers; with state layers every page is
    # the attention page (the state page padded up to it: serving_state)
    size = cache_groups(kinds)[0] if draft is None else spec.layers
    if kinds.state:
        block = size * k.block_size * serving_state.attention_page_per_token(spec, setup, k.kv_dtype)
    else:
        block = k.block_size * per_token * size / spec.layers
    blocks = max(0, int(available // block))
    per_request = blocks_per_request(kinds, setup, k, serving_state.state_blocks_per_request(spec, gpu))
    concurrency = blocks / per_request
    state = kinds.state * serving_state.vllm_state_page(spec, setup, _weight_dtype(setup)).bytes if kinds.state else 0
    return Serving(k, total, requested, int(weights), int(act), int(graphs), int(available), per_token, blocks,
                   int(concurrency * k.max_model_len), concurrency, int(blocks * block), per_request, state,
                   int(non_torch), graphs_in_kv, on_device)


def concurrency(sv) -> int:
    """Sequences one engine holds at once: its request limit (`max_sequences`) or the whole `context`-token
    sequences its KV cache holds, whichever is fewer. `sv`: either server's Serving (vLLM's or SGLang's)."""
    return min(sv.max_sequences, int(sv.max_concurrent_sequences))
