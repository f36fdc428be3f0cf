"""The weights as SGLang counts them: the caching allocator's segments that hold one rank's parameters.

SGLang builds the model on the GPU — every parameter a torch.empty under `with target_device:` (0.5.23
model_loader/loader.py:836-844; 0.4.9.post2 :429-435) — then copies the checkpoint in, and reads the weights as
the drop of cudaMemGetInfo's free memory across loading, each reading after torch.cuda.empty_cache()
(model_executor/model_runner.py:1365 weight_load_mem_usage; utils/common.py:428-456 get_available_gpu_memory;
0.4.9.post2 model_runner.py:576-661, utils.py:354-373). The KV pool is sized from that free memory
(serving_sglang's module docstring), so the weights take what PyTorch's caching allocator RESERVES for them, not
their bytes: CUDACachingAllocator.cpp get_allocation_size gives a request of 1-10 MiB a block of a shared 20 MiB
segment and a larger one a segment of its own rounded up to 2 MiB; empty_cache frees only whole free segments
(trainfit.alloc simulates these rules, Allocator). E.g. per layer:
  QwQ-32B (Qwen2.5-32B) at tp 4, bf16: qkv 17.5 MiB → 18, o_proj 12.5 → 14, gate_up 135 → 136, down 67.5 → 68:
      3.5 MiB × 64 layers = 224 MiB (its SGLang 0.4.3.post4 log's "mem usage" is 15.54 GB; the bytes 15.32 GiB);
  Qwen3-235B-A22B-FP8 at tp 4: the fp8 qkv (9 MiB) and o_proj (8 MiB) share a 20 MiB segment whose last 3 MiB no
      later request fits (its 1 MiB router gates go to the small pool): 3 MiB × 94 layers = 282 MiB.
The allocation order is the construction order of SGLang's decoder models (models/llama.py, qwen2.py,
qwen3_moe.py: embedding; per layer the attention — fused qkv weight [+ bias], o_proj [+ bias], on the first layer
the rotary cos/sin cache computed on the GPU in fp32 (layers/rotary_embedding/base.py:253-266: freqs, cos and sin
are freed, the concatenation kept), q/k norms —, the MLP — dense: gate_up, down; MoE: the stacked experts w13 and
w2 (fused_moe_triton/layer.py), the router gate, a shared expert and its gate —, the layer's two norms; then the
final norm and the LM head), each tensor sized as serving.weights_per_gpu counts it.
NB: not enumerated, so no slack counted (under): MLA attention (DeepSeek), the linear-attention / Mamba hybrids'
stacks (Qwen3-Next, Nemotron-H), quantisation scales and zeros
(fp8 block scales, AWQ/GPTQ's, all small-pool tensors), a draft model's weights.
"""
from __future__ import annotations

from ..alloc.caching_allocator import Allocator
from ..setup import Setup
from ..spec import ModelSpec
from .activations import FP32
from .embedding import rotary_dim
from .params import norm_params
from .precision import DTYPE_BYTES
from .serving import _weight_dtype, embedding_bytes, expert_weight_bytes, kv_share, quant_bytes


def construction(spec: ModelSpec, setup: Setup) -> list[tuple[str, str, float]]:
    """SGLang's allocations for one rank's weights, in order: ("alloc", name, bytes) or ("free", name, 0)
    (module docstring). The rank is the first pipeline stage (the embedding and spec.layers / pp layers), the
    LM head and final norm only without pipeline parallelism, as serving.weights_per_gpu counts it."""
    b = DTYPE_BYTES[_weight_dtype(setup)]
    q = quant_bytes(setup)
    t, h = setup.tp, spec.hidden
    kv_rows = spec.kv_dim * kv_share(spec, t)
    qkv_rows = spec.q_dim / t + 2 * kv_rows
    norm = norm_params(spec, h) * b
    moe_layers = spec.moe_layers
    ops: list[tuple[str, str, float]] = [("alloc", "embed", embedding_bytes(spec, setup))]
    for i in range(spec.layers // setup.pp):
        ops.append(("alloc", f"{i}.qkv", qkv_rows * h * q))
        if spec.qkv_bias:
            ops.append(("alloc", f"{i}.qkv_bias", qkv_rows * b))
        ops.append(("alloc", f"{i}.o_proj", spec.q_dim / t * h * q))
        if spec.out_bias:
            ops.append(("alloc", f"{i}.o_bias", h * b))
        if i == 0 and spec.positions == "rotary":
            half = (spec.max_positions or 0) * rotary_dim(spec) / 2 * FP32
            ops += [("alloc", "freqs", half), ("alloc", "cos", half), ("alloc", "sin", half),
                    ("alloc", "rotary_cache", 2 * half), ("free", "freqs", 0), ("free", "cos", 0), ("free", "sin", 0)]
        if spec.qk_norm:
            ops += [("alloc", f"{i}.q_norm", spec.head_dim * b), ("alloc", f"{i}.k_norm", spec.head_dim * b)]
        ops += _mlp(spec, setup, i, i >= spec.layers - moe_layers)
        ops += [("alloc", f"{i}.norm{j}", norm) for j in range(spec.norms_per_layer)]
    if setup.pp == 1:
        ops.append(("alloc", "final_norm", norm_params(spec, h) * b if spec.final_norm else 0))
        if not spec.tied_embeddings:
            ops.append(("alloc", "lm_head", embedding_bytes(spec, setup)))
    return ops


def _mlp(spec: ModelSpec, setup: Setup, i: int, sparse: bool) -> list[tuple[str, str, float]]:
    b = DTYPE_BYTES[_weight_dtype(setup)]
    q = quant_bytes(setup)
    t, h = setup.tp, spec.hidden
    if not sparse:
        up = (2 if spec.gated_mlp else 1) * spec.intermediate / t
        ops = [("alloc", f"{i}.gate_up", up * h * q)]
        if spec.mlp_bias:
            ops.append(("alloc", f"{i}.gate_up_bias", up * b))
        ops.append(("alloc", f"{i}.down", spec.intermediate / t * h * q))
        if spec.mlp_bias:
            ops.append(("alloc", f"{i}.down_bias", h * b))
        return ops
    m = spec.moe
    ex = expert_weight_bytes(spec, setup)  # a checkpoint's own MXFP4 experts (gpt-oss; NB: SGLang's layout not read)
    ops = [("alloc", f"{i}.w13", m.num_experts * 2 * m.expert_intermediate / t * h * ex),
           ("alloc", f"{i}.w2", m.num_experts * m.expert_intermediate / t * h * ex),
           ("alloc", f"{i}.router", m.num_experts * h * b)]  # whole on every rank, model dtype (serving.layer_bytes)
    if m.shared_intermediate:
        ops += [("alloc", f"{i}.shared_gate_up", 2 * m.shared_intermediate / t * h * q),
                ("alloc", f"{i}.shared_down", m.shared_intermediate / t * h * q)]
    if m.shared_gate:
        ops.append(("alloc", f"{i}.shared_expert_gate", h * b))
    return ops


def reserved(ops) -> tuple[int, int]:
    """(what the caching allocator reserves once the ops ran and the cache was emptied, the bytes still live)."""
    a = Allocator()
    live: dict[str, tuple[int, int]] = {}
    for op, name, nbytes in ops:
        if op == "alloc":
            n = int(nbytes)
            live[name] = (a.malloc(n), n) if n > 0 else (0, 0)
        else:
            handle, _ = live.pop(name)
            if handle:
                a.free(handle)
    a.empty_cache()
    return a.reserved, sum(n for _, n in live.values())


def slack(spec: ModelSpec, setup: Setup) -> int:
    """Bytes the allocator holds for one rank's weights beyond the weights themselves (module docstring); 0 for
    MLA models and linear-attention / Mamba hybrids (not enumerated: NB under)."""
    if spec.mla is not None or spec.linear_attn is not None or spec.hybrid is not None:
        return 0
    held, live = reserved(construction(spec, setup))
    return held - live
