"""--server sglang with speculative decoding: the draft SGLang 0.5.23 keeps beside the target (--speculative-algorithm,
--draft-model), its weights, its KV in the token pool, and the verify step's graph size.

SGLang (the wheel's sglang/srt/...) sizes one token pool for both models: the target's cell grows by the draft's
layers at the TARGET's per-layer KV size, "assumes the draft shares the target's per-layer KV size, which holds for
EAGLE/MTP drafts that reuse the target's attention config" (model_executor/pool_configurator.py:259-314):
    cell += int(cell × draft_layers / target_layers)
draft_layers: NEXTN (a path-less MTP head) the config's num_nextn_predict_layers, else the draft config's
num_hidden_layers (model_runner_components/spec_aux_hidden_state.py:146-176). The draft's weights are loaded before
the pool is sized and counted against the fraction (mem_cache/kv_cache_configurator.py:3042-3058: "If using
speculative decoding, draft weights are now counted"). What the draft holds on each GPU (at the target's TP):
  standalone: a whole model (models/<its architecture>.py), its own embedding and head;
  eagle:  its decoder layers + fc (2h -> h, a replicated nn.Linear: models/llama_eagle.py:91); the embedding and
          head are the target's (speculative/eagle_worker_v2.py:371-378 set_embed_and_head);
  eagle3: its decoder layers, the first one's qkv reading 2h (models/llama_eagle3.py:62-74), fc (3 aux hidden
          states × h -> h, :163-167) and its own head of draft_vocab_size rows (:306-318); the embedding is the
          target's (eagle_worker_v2.py:353-363 set_embed);
  nextn:  num_nextn_predict_layers of the target's decoder layers + eh_proj (2h -> h) and the enorm, hnorm and
          shared head norm (models/deepseek_nextn.py:83-139); embedding and head the target's.
Speculative steps, top-k and draft tokens when not given: (3, 1, 4), (5, 4, 8) for a LlamaForCausalLM target
under EAGLE/EAGLE3 (arg_groups/speculative_hook.py:1430-1462 _auto_choose_speculative_params). The target's verify
step runs draft-tokens tokens per request: its CUDA graphs capture cuda_graph_max_bs × that many tokens and
logits rows (model_runner.py:876-890 decode_num_tokens_per_req; decode_cuda_graph_runner.py:424-428 max_num_token).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import SetupError
from ..setup import Setup
from ..spec import ModelSpec
from .activations import FP32
from .embedding import rotary_dim
from .params import ParamCounts, count_params
from .precision import DTYPE_BYTES
from .serving import _weight_dtype, draft_of, embedding_bytes, layer_bytes, quant_bytes, weights_per_gpu


@dataclass(frozen=True)
class Draft:
    algorithm: str  # eagle, eagle3, nextn, standalone
    model: str | None  # --draft-model (None for nextn)
    layers: int  # the draft's attention layers (its KV in the pool, at the target's per-layer size)
    weights: float  # bytes on one GPU
    steps: int
    topk: int
    draft_tokens: int  # tokens per request the target verifies in one step


def algorithm(setup: Setup) -> str | None:
    return setup.speculative_algorithm or ("standalone" if setup.draft_model else None)


def auto_params(alg: str, target: ModelSpec) -> tuple[int, int, int]:
    """(num_steps, eagle_topk, num_draft_tokens): speculative_hook.py:1430-1462."""
    if alg in ("eagle", "eagle3") and "LlamaForCausalLM" in target.architectures:
        return 5, 4, 8
    return 3, 1, 4


def draft(spec: ModelSpec, setup: Setup, pc: ParamCounts) -> Draft | None:
    alg = algorithm(setup)
    if alg is None:
        return None
    steps, topk, tokens = auto_params(alg, spec)
    if alg == "nextn":
        n = spec.mtp_layers
        if not n:
            raise SetupError(f"--speculative-algorithm nextn: {spec.name}'s config has no num_nextn_predict_layers "
                             "(its MTP layers); use eagle, eagle3 or standalone with --draft-model")
        b = DTYPE_BYTES[_weight_dtype(setup)]
        h = spec.hidden
        # each MTP layer: one of the target's decoder layers, a MoE one in a MoE model (deepseek_v2.py:2785-2788
        # _is_layer_sparse: is_nextn is sparse), eh_proj replicated, three norms
        mlp = pc.moe_mlp if pc.moe_layers else pc.mlp
        weights = n * (layer_bytes(spec, setup, pc, mlp) + 2 * h * h * b + 3 * h * b)
        return Draft(alg, None, int(n), weights, steps, topk, tokens)
    d = draft_of(spec, setup)  # the vocabulary and TP checks vLLM's draft takes too
    dpc = count_params(d)
    b = DTYPE_BYTES[_weight_dtype(setup)]
    h = d.hidden
    if alg == "standalone":
        weights = weights_per_gpu(d, setup, dpc)
        if d.positions == "rotary":  # SGLang's rotary cache is fp32 on CUDA (serving_sglang.weights_on_gpu)
            weights += (d.max_positions or 0) * rotary_dim(d) * (FP32 - b)
        return Draft(alg, setup.draft_model, d.layers, weights, steps, topk, tokens)
    layers = d.layers * layer_bytes(d, setup, dpc) + dpc.final * b
    rope = (d.max_positions or 0) * rotary_dim(d) * FP32 if d.positions == "rotary" else 0
    if alg == "eagle":
        weights = layers + 2 * h * h * b + rope
    else:  # eagle3: the first layer's q, k and v read 2h (its extra h inputs sharded as the projection), fc, own head
        extra_qkv = h * (d.q_dim + 2 * d.kv_dim) / setup.tp * quant_bytes(setup)
        head_rows = d.draft_vocab or d.vocab
        head = embedding_bytes(d, setup) * head_rows / d.vocab
        weights = layers + extra_qkv + 3 * h * h * b + head + rope
    return Draft(alg, setup.draft_model, d.layers, weights, steps, topk, tokens)


def pool_cell(cell: int, target_layers: int, dr: Draft | None) -> int:
    """pool_configurator.py:310-314: the target's cell plus the draft's layers at the target's per-layer size."""
    if dr is None:
        return cell
    return cell + int(cell * dr.layers / target_layers)


__all__ = ["Draft", "algorithm", "auto_params", "draft", "pool_cell"]
