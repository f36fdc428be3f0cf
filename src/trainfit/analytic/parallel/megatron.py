"""Model states of one rank as Megatron-Core allocates them (--stack megatron), megatron-core 0.16.1.

  weights     the model's own parameters in the param dtype (bf16/fp16 under --bf16/--fp16: Float16Module), kept in
              the contiguous param buffer (distributed/param_and_grad_buffer.py _ParamAndGradBuffer);
  gradients   the contiguous grad buffer that backward accumulates `main_grad` into, never sharded (the distributed
              optimizer reduce-scatters inside it): fp32 when grad_reduce_in_fp32 (Megatron-LM sets it for --bf16:
              accumulate_allreduce_grads_in_fp32), else the param dtype (distributed_data_parallel.py:147);
  master      fp32 main params (optimizer.py:674, distrib_optimizer.py:386-399: the rank's shard only) and, where the
              grad buffer is 16-bit, their fp32 `.grad` copies (optimizer.py:759, distrib_optimizer.py:2419);
  optimizer   Adam's exp_avg and exp_avg_sq in fp32 (optimizer/__init__.py:396-397), of the main params.
Megatron-FSDP (--zero 2 / 3: optim_grads / optim_grads_params) shards the gradients too, and under --zero 3 the
weights, over the same groups, and keeps unsharded buckets in flight (fsdp_model_states).
The distributed optimizer (--zero 1) shards master and optimizer over the data-parallel group with context
parallelism (dp × cp: parallel_state's data_parallel_group_with_cp, what DDP's buffers use) and an expert's states over
the expert data-parallel group (Setup.expert_dp). That is Megatron's own table (docs: distrib_optimizer,
"bytes per parameter"): fp16/fp16 20 vs 4 + 16/d, bf16/fp32 18 vs 6 + 12/d, fp32/fp32 16 vs 8 + 8/d.
Fused Adam (TE/apex: stacks/megatron.toml [optimizer_impl]) updates in place: no step temporaries.
NB: each bucket is padded to a multiple of lcm(dp, 128) elements and each param starts 64-element aligned
(param_and_grad_buffer.py:635-665): under-counts by < 128·dp elements per bucket (40M-element buckets: < 0.1%).
"""
from __future__ import annotations

import math
from dataclasses import replace

from ...setup import Setup
from ...spec import ModelSpec
from ..compute_time import tensors_per_rank
from ..params import ParamCounts, hybrid_layers_params
from .expert import routed_expert_params
from .pipeline import Stage
from .zero import ModelStates

FP32 = 4


def grad_buffer_bytes(setup: Setup) -> int:
    """Bytes per element of the main-grad buffer, the one dtype backward accumulates into and the data-parallel
    group reduces (all-reduce under DDP, reduce-scatter under the distributed optimizer: param_and_grad_buffer.py:
    443-457 on bucket.grad_data; Megatron-FSDP's main_grad_buffer: fsdp/src/megatron_fsdp/param_and_grad_buffer.py:
    2030, its buckets reduce-scattered at :3244-3249): fp32 when grad_reduce_in_fp32, else the param dtype
    (distributed_data_parallel.py:147; Megatron-FSDP reads the same ddp_config field: megatron_fsdp.py:351).
    Megatron-LM core_v0.16.1 megatron/training/arguments.py:711-724: --bf16 sets accumulate_allreduce_grads_in_fp32
    (passed as grad_reduce_in_fp32: training.py:1295) unless --grad-reduce-in-bf16 (:720-721); under --fp16 it keeps
    its default False (:2194). stacks/megatron.toml [grad_buffer]."""
    fp32 = setup.precision in setup.stack_facts.fact("grad_buffer", "fp32_under") and not setup.grad_reduce_in_bf16
    return FP32 if fp32 else 2


def bytes_per_param(setup: Setup) -> dict:
    """Unsharded bytes per parameter by state: weights, gradients (the grad buffer), master (fp32 main params and
    the fp32 main-grad copies), optimizer."""
    low = setup.precision in ("bf16-master", "fp16-master")
    weight = 2 if low else FP32
    grad = grad_buffer_bytes(setup)
    # the fp32 main-grad copies of 16-bit grads live in the optimizer step only (grad_copy_bytes)
    master = (FP32 if low else 0) + (FP32 if grad == 2 else 0)
    optimizer = {"adam": 2 * FP32, "adamw": 2 * FP32, "momentum": FP32, "sgd": 0}[setup.optimizer]
    return {"weights": weight, "gradients": grad, "master": master, "optimizer": optimizer}


def shards(setup: Setup, expert: bool = False) -> int:
    """The distributed optimizer's shard count: the product of its axes' sizes for dense params (stacks/megatron.toml
    [distributed_optimizer] shards: dp × cp), the expert data-parallel size for experts."""
    if setup.zero < 1:
        return 1
    return setup.expert_dp if expert else math.prod(getattr(setup, axis) for axis in setup.stack_facts.zero_shard_axes)


def rank_params(spec: ModelSpec, pc: ParamCounts, setup: Setup, stage: Stage) -> tuple[float, float]:
    """(dense, expert) parameters on this rank: attention/MLP/vocab over tp (Shoeybi et al. 2019 §3), norms
    replicated; routed experts num_experts/ep per rank, each split etp ways (transformer/moe/experts.py
    TEGroupedMLP: num_local_experts = num_moe_experts // ep, linear_fc1/fc2 over expert_tensor_parallel).
    Row-parallel biases (linear_proj, a dense linear_fc2) are full size on every rank (tensor_parallel/layers.py:
    1213 RowParallelLinear: bias of output_size); the word embedding is vocab-parallel, the learned position
    embedding a plain replicated torch.nn.Embedding (language_model_embedding.py:56,67).
    NB: the router (replicated) is divided by tp: under-counts by < 0.01%."""
    t = setup.tp
    experts = routed_expert_params(spec, pc)
    per_layer = pc.attention + (pc.mlp * pc.dense_layers + (pc.moe_mlp - experts) * pc.moe_layers) / spec.layers
    # Qwen3-Next's Gated DeltaNet layers (modeling_qwen3_next.py:877-880): their mixer in place of the attention
    per_layer += pc.linear_layers * (pc.linear_attention - pc.attention) / spec.layers
    if spec.hybrid is not None:
        # Nemotron-H: one mixer (Mamba-2, attention or MLP) and one norm per block (NemotronHBlock,
        # modeling_nemotron_h.py:934), ParamCounts holding one block of each kind: their mean per block, as
        # tensor.rank_params takes it (it had been attention + MLP + norms in every block)
        per_layer = (hybrid_layers_params(spec, pc.attention, pc.mlp, pc.norms) - spec.layers * pc.norms) / spec.layers
    row_bias = spec.hidden * ((1 if spec.out_bias else 0) +
                              (pc.dense_layers / spec.layers if spec.mlp_bias else 0))
    dense = stage.layers * (pc.norms + (per_layer - row_bias) / t + row_bias)
    expert = stage.layers * spec.moe_share * experts / (setup.ep * setup.expert_tp)
    word = min(pc.embedding, spec.vocab * spec.hidden)
    if stage.embedding:
        dense += word / t + (pc.embedding - word)
        # a VLM's image encoder (and Mllama's cross-attention norms and gates), on the first stage and not split by
        # TP, as tensor.rank_params holds it: Megatron-based VLM recipes run the transformers tower beside the
        # GPTModel (Megatron-Bridge's Qwen2.5-VL provider, ms-swift megatron/model/qwen2_5_vl/vit.py `model.visual`)
        dense += pc.vision + pc.cross_extras
    if stage.head:
        dense += pc.final + pc.lm_head / t
        if spec.tied_embeddings and not stage.embedding:
            dense += pc.embedding / t  # the last stage's copy of the tied word embedding (LanguageModule)
    if stage.mtp:  # multi-token prediction (analytic/mtp.py): its layers, and the embedding its stage builds
        from ..mtp import layer_params
        d, e = layer_params(spec, pc, setup)
        dense += stage.mtp * d
        expert += stage.mtp * e
        if not stage.embedding and not (stage.head and spec.tied_embeddings):
            dense += word / t  # gpt_model.py:149-150 (pre_process or mtp_process)
    return dense, expert


def megatron_tensors(spec: ModelSpec, layers: int, embedding: bool, head: bool) -> int:
    """Parameter tensors of a stage as Megatron-Core builds them (each an optimizer operand, each a tensor its clip's
    norm visits): per layer linear_qkv (q, k and v fused), linear_proj, linear_fc1 (gate and up fused under SwiGLU)
    and linear_fc2, each a weight and its bias where the model has one, and each norm's weight (+ bias); the word
    (+ learned position) embedding; the final norm and the output layer (none of its own when tied to the word
    embedding on the same stage). MoE layers as compute_time.tensors_per_rank counts them (NB)."""
    if spec.moe is not None:
        return tensors_per_rank(spec, layers, embedding, head)
    norm = 1 + int(spec.norm_bias and spec.norm != "rmsnorm")
    per_layer = 4 + int(spec.qkv_bias) + int(spec.out_bias) + 2 * int(spec.mlp_bias) + spec.norms_per_layer * norm
    n = layers * per_layer
    if embedding:
        n += 1 + (spec.positions == "learned")
    if head:
        n += norm + (0 if (spec.tied_embeddings and embedding) else 1)
    return n


def largest_param(spec: ModelSpec, setup: Setup, stage: Stage) -> float:
    """Elements of the rank's largest parameter tensor: the vocab-parallel word embedding or output layer (vocab/t x
    h), linear_qkv ((q + 2 kv)/t x h, one fused tensor: attention/qkv projections), linear_fc1 (its gate and up fused
    under SwiGLU: mlp/layers.py) or linear_proj / linear_fc2. NB: MoE experts' grouped weights are not compared."""
    t, h = setup.tp, spec.hidden
    q = spec.heads * spec.head_dim
    sizes = [(q + 2 * spec.kv_dim) * h / t, q * h / t, spec.intermediate * h * (2 if spec.gated_mlp else 1) / t,
             spec.intermediate * h / t]
    if stage.embedding or stage.head:
        sizes.append(spec.vocab * h / t)
    return max(sizes)


def grad_copy_bytes(spec: ModelSpec, pc: ParamCounts, setup: Setup, stage: Stage) -> float:
    """The part of `master` that is the fp32 copies of a 16-bit grad buffer's shard (distrib_optimizer.py:2419
    `shard_main_param.grad = shard_model_grad.float()`; optimizer.py:759 without the distributed optimizer), made by
    the optimizer step and set to None by the next step's optimizer.zero_grad() before its forward (Megatron-LM
    core_v0.16.1 megatron/training/training.py:1619; distrib_optimizer.py:2286-2298 -> optimizer.py:57-68
    _zero_grad_group_helper, set_to_none): alive in the optimizer phase only. Megatron-FSDP's alike: its
    update_main_grads casts each main-grad shard to its fp32 main weight's dtype before the step
    (fsdp/src/megatron_fsdp/param_and_grad_buffer.py:2646-2649 `optimizer_grad.to(param.dtype)`, megatron_fsdp.py:
    1181) and zero_grad drops them (:2470-2480)."""
    b = bytes_per_param(setup)
    if b["gradients"] != 2 or b["master"] < 2 * FP32:
        return 0.0
    dense, expert = rank_params(spec, pc, setup, stage)
    return (dense / shards(setup) + expert / shards(setup, expert=True)) * FP32


def megatron_model_states(spec: ModelSpec, pc: ParamCounts, setup: Setup, stage: Stage) -> ModelStates:
    dense, expert = rank_params(spec, pc, setup, stage)
    b = bytes_per_param(setup)
    sharded = dense / shards(setup) + expert / shards(setup, expert=True)
    n = dense + expert
    if setup.zero >= 2:
        return fsdp_model_states(spec, pc, setup, stage, b, n, sharded)
    # DDP accumulates straight into the grad buffer and reduces in place: no bucket copies (comm = 0)
    return ModelStates(n * b["weights"], n * b["gradients"], sharded * b["master"], sharded * b["optimizer"], 0.0)


def fsdp_model_states(spec: ModelSpec, pc: ParamCounts, setup: Setup, stage: Stage, b: dict, n: float,
                      sharded: float) -> ModelStates:
    """Megatron-FSDP (--zero 2: optim_grads, --zero 3: optim_grads_params; stacks/megatron.toml [megatron_fsdp]):
    the main weights, main grads and optimizer states sharded over the same groups as the distributed optimizer's
    (`sharded`), the 16-bit weights too under --zero 3; beside them (comm) the unsharded buckets in flight: under
    --zero 3 two TransformerLayer units' gathered weights and fp32 gradients (the one computing, the one prefetched
    or being reduce-scattered) and the modules outside the units (embedding, final norm, output layer) gathered from
    their forward to their backward; under --zero 2 two gradient buckets of at most bucket_elements.
    NB: without --fsdp-double-buffer the buckets are allocated and freed around each unit (storage resize), so they
    are counted as resident through the step: over-counts a peak outside the forward/backward (the optimizer step)
    by them."""
    in_flight = setup.stack_facts.fact("megatron_fsdp", "in_flight")
    weights = (sharded if setup.zero >= 3 else n) * b["weights"]
    # the fp32 main weights and, over a 16-bit main-grad buffer, the fp32 copies of its shard the optimizer steps on
    # (update_main_grads: grad_copy_bytes, the optimizer phase's only), as the distributed optimizer's (bytes_per_param).
    # NB: with --precision fp32 Megatron-FSDP still keeps an fp32 main weight buffer (preserve_fp32_weights,
    # param_and_grad_buffer.py:2004): not counted, under by 4/d bytes per parameter there
    master = b["master"]
    if setup.zero >= 3:
        unit_d, unit_e = rank_params(spec, pc, setup, replace(stage, layers=1, embedding=False, head=False, mtp=0))
        outside_d, _ = rank_params(spec, pc, setup, replace(stage, layers=0))
        unit = unit_d + unit_e
        comm = (in_flight * unit * (b["weights"] + b["gradients"])
                + outside_d * (1 - 1 / shards(setup)) * b["weights"])
    else:
        bucket = min(n, setup.stack_facts.fact("megatron_fsdp", "bucket_elements"))
        comm = in_flight * bucket * b["gradients"]
    return ModelStates(weights, sharded * b["gradients"], sharded * master, sharded * b["optimizer"], comm)
