"""Megatron-Core's MoE layer as it runs (megatron-core 0.16.1 transformer/moe/, Transformer Engine v2.9): TopKRouter
with the fused router kernels, the alltoall token dispatcher with TE's fused permutation, TEGroupedMLP, and the
combine. Paths cited as moe/<file>:line are megatron-core 0.16.1's megatron/core/transformer/moe/; TE's as
te:<path>:line at v2.9.

The fused paths are the ones Megatron-Bridge's MoE recipes run (stacks/megatron.toml [moe]: moe_router_fusion,
moe_permute_fusion); the dispatcher is the alltoall one (parallel/expert.py times its all-to-alls).

What differs from transformers' block (ops/moe.py), kernel by kernel:
- the grouped GEMM is one cuBLAS GEMM per local expert, launched in a loop over TE's compute streams
  (te:transformer_engine/common/gemm/cublaslt_gemm.cu:941-966 multi_stream_cublas_gemm, called by
  te:transformer_engine/pytorch/module/grouped_linear.py:171 forward, :363 dgrad, :413 wgrad), so each of fc1 and
  fc2 launches `local` GEMMs per pass, and under a quantised recipe `local` quantise kernels per operand
  (ops/te_casts.split_kernels); the GEMMs go round-robin to the streams (expert j on stream j mod 4: stacks/
  megatron.toml [moe] gemm_streams), so at most 4 share the SMs at a time (compute_time.time_ops);
- the dispatcher's metadata (moe/token_dispatcher.py:469-590 preprocess) is a handful of small reductions, an
  all-gather of the token counts, and device-to-host copies followed by a host synchronisation (analytic/
  step_time.py moe_host_syncs);
- under an fp8/fp4 recipe the experts' rows are padded to the recipe's alignment before linear_fc1 and unpadded
  after linear_fc2 (TE's Fp8Padding / Fp8Unpadding copies: quantization_padding);
- permute / sort-by-expert / unpermute are TE's Triton kernels (te:transformer_engine/pytorch/triton/
  permutation.py), the activation is the probability-weighted SwiGLU (moe/experts.py:689-696
  weighted_bias_swiglu_impl).
The router's force-balance benchmark option (moe/router.py:655-657 apply_random_logits) adds its two noise kernels
(router_ops; analytic/moe_imbalance.py times the busiest rank's load it leaves). NB: CUDA graphs of the router
and preprocess (cuda_graph_scope moe_router / moe_preprocess: one graph launch in place of their kernels) are not
modelled: pessimistic by their few kernels where a run graphs them. gpt-oss (Megatron-Bridge's GPT-OSS provider:
expert biases, quick GeGLU with clamp and linear offset) runs the same layer with its fused activation after eager
clamps and a host-synchronising copy (quick_geglu_prelude) and _apply_bias; Llama 4's every-expert block keeps
transformers' op list (ops/moe.py). NB: every launch costs the host the calibrated eager time per kernel
(data/kernels.toml [host], Python-issued aten kernels); TE issues the per-expert GEMMs and quantises from a C++ loop
(each GEMM with its own cuBLASLt heuristic query), unmeasured here: likely pessimistic for those launches.
"""
from __future__ import annotations

from ...spec import ModelSpec
from ..activations import FP32, INDEX
from .moe import _experts_gemm, expert_dims, moe_block, shared_expert_ops
from .op import Op, Shape, bwd_kernel, gemm, memory, no_kernel

SRC = "megatron-core 0.16.1 transformer/moe/"
BOOL = 1  # bytes of a torch.bool routing-map element


# LOCAL: under sequence parallelism the MoE layer's input and output are the rank's 1/tp of the sequence
# (transformer_layer.py:703-756 hands it the norm of the scattered residual; moe_layer.py:379-383 refuses MoE with
# TP but without sequence parallelism in training): the router, the permutes and the combine's unpermute run on those
# tokens, the experts on what the dispatcher brings them (ops/moe.py expert_dims), the shared experts on the
# TP-gathered sequence.


def megatron_moe_block(spec: ModelSpec, sh: Shape) -> list[Op]:
    """The forward kernels of one MoE layer on the busiest expert-parallel rank: its `local` experts each receive
    sh.moe_load times the balanced rows of its expert-TP group's tokens' copies (ops/moe.py expert_dims,
    busiest_per_expert); the router, permute and unpermute run on the rank's own tokens and their k copies
    (LOCAL)."""
    m = spec.moe
    if m.experts_every_token:
        return moe_block(spec, sh)
    h, a, T, e, k, i, local, per_expert, rows = expert_dims(spec, sh, sh.expert_tp or sh.tp)
    ops = router_ops(spec, sh) + dispatch_ops(spec, sh)
    gate = 2 if spec.gated_mlp else 1
    if sh.te:  # under a quantised recipe the experts' rows are padded to the recipe's alignment first
        ops.append(quantization_padding(spec, sh, rows, local))
    # TEGroupedMLP (moe/experts.py:628-720): linear_fc1, the weighted activation, linear_fc2; one GEMM per expert
    ops += _experts_gemm(gemm("experts_in", per_expert, gate * i, h, sh, SRC + "experts.py:670 linear_fc1 "
                              "(TE GroupedLinear)", batch=local, fp8=bool(sh.te))._replace(
        kernels=local, streams=sh.moe_gemm_streams), sh)
    act = ("experts.py:697-705 weighted_bias_quick_geglu_impl (gpt-oss: quick GeGLU + 1, · prob, one kernel)"
           if m.swiglu_limit else "experts.py:689-696 weighted_bias_swiglu_impl (act(gate) · up · prob, one kernel)")
    # (an expert bias of linear_fc1 is added in TE's GEMM epilogue: experts.py:548-549 skip_bias_add False)
    if m.swiglu_limit:
        ops += quick_geglu_prelude(rows * i, sh)
    ops.append(memory("experts_act", rows * (gate * i * a + FP32), rows * i * a, SRC + act, "experts_act"))
    ops += _experts_gemm(gemm("experts_out", per_expert, h, i, sh, SRC + "experts.py:748 linear_fc2 (TE GroupedLinear)",
                              batch=local, fp8=bool(sh.te))._replace(kernels=local, streams=sh.moe_gemm_streams), sh)
    if m.expert_bias:
        ops.append(fc2_bias(spec, sh, rows, local))
    if sh.te:
        ops.append(quantization_unpadding(spec, sh, rows, local))
    ops += combine_ops(spec, sh)
    if m.shared_intermediate:  # shared_experts.py: a gated MLP beside the routed experts
        ops += shared_expert_ops(spec, sh, SRC + "shared_experts.py")
        T = sh.norm_tokens  # the gate reads the layer's input, the add its output: the rank's own tokens (LOCAL)
        if m.shared_gate:  # shared_experts.py:128-131: linear to one logit, its sigmoid, the output scaled
            ops += [gemm("shared_expert_gate", T, 1, h, sh, SRC + "shared_experts.py:129 gate_weight"),
                    memory("shared_sigmoid", T * a, T * a, SRC + "shared_experts.py:130 sigmoid", "combine"),
                    memory("shared_scale", T * h * a + T * a, T * h * a, SRC + "shared_experts.py:131 output * gate",
                           "combine")]
        ops.append(memory("shared_add", 2 * T * h * a, T * h * a,
                          SRC + "moe_layer.py:347 output + shared_expert_output", "combine", saves=False))
    return ops


def _padding_launches(local: int) -> int:
    """Launches of one TE multi-row (un)padding call over `local` splits: a kernel per 64 of them
    (te:transformer_engine/common/util/padding.cu:25 kMaxTensorsPerKernel = 64, one MultiPaddingArgs per launch)."""
    return -(-local // 64)


def quantization_padding(spec: ModelSpec, sh: Shape, rows: float, local: int) -> Op:
    """TEGroupedMLP under an fp8/fp4 recipe (moe/experts.py:603-606, :646-653): each local expert's rows padded to the
    recipe's alignment (te:transformer_engine/pytorch/module/fp8_padding.py:113-118: 16, 32 for MXFP8) by Fp8Padding,
    once for the permuted tokens and once for their probabilities: each a tex.fused_multi_row_padding copy
    (fp8_padding.py:37-39) into a new tensor; its backward the unpadding copy (:60-66), each. With routed counts that
    are not multiples of the alignment (forced-balance or learned routing: almost never all of them) the copy runs
    (fp8_padding.py:121-122 skips it only when every split is aligned). NB: the padded rows (under one alignment per
    expert) are not added to the GEMMs' M: optimistic by under 16 or 32 rows in several hundred."""
    h, a = spec.hidden, sh.act
    moved = rows * (h * a + FP32)
    return memory("experts_pad", moved, moved, "te:transformer_engine/pytorch/module/fp8_padding.py:20-68 "
                  "(moe/experts.py:648-653 quantization_padding of the tokens and the probabilities)", saves=False,
                  kernels=2 * _padding_launches(local))


def quantization_unpadding(spec: ModelSpec, sh: Shape, rows: float, local: int) -> Op:
    """The experts' output back to the routed rows (moe/experts.py:761-762 quantization_unpadding: TE's Fp8Unpadding,
    te:transformer_engine/pytorch/module/fp8_unpadding.py:24-45 tex.fused_multi_row_unpadding; :48-66 its backward
    the padding copy): one copy of rows x hidden each way."""
    moved = rows * spec.hidden * sh.act
    return memory("experts_unpad", moved, moved, "te:transformer_engine/pytorch/module/fp8_unpadding.py:24-66 "
                  "(moe/experts.py:761-762)", saves=False, kernels=_padding_launches(local))


GEGLU_SRC = "megatron-core 0.16.1 fusions/fused_bias_geglu.py:"


def quick_geglu_prelude(x: float, sh: Shape) -> list[Op]:
    """What weighted_bias_quick_geglu_impl runs eagerly before its fused kernel (gpt-oss's clamp_value and
    linear_offset, fused_bias_geglu.py:424-434) over the routed rows' x = rows · i elements of each half: the two
    halves' clamps (the glu half from above, the linear half both ways) and their torch.cat, then
    `torch.tensor(linear_offset, device=...)`, a host-to-device copy that synchronises the host with the stream
    (torch's copy without non_blocking: memcpy_and_sync, a cudaStreamSynchronize; host_queue.DRAIN_OPS). Backward
    (tools/autograd/derivatives.yaml clamp: clamp_backward): the cat passes views of its gradient on; each clamp's
    mask (le; ge, le and logical_and_ for the two-sided one), a zero scalar and where; the chunk's halves concatenated
    back (split_backward: cat). The moe_act recompute runs them again with the activation (names experts_act_*:
    megatron_recompute.rerun_ops). Without that recompute the clamps save the unclamped fc1 output beside the
    fused kernel's clamped input (megatron_activations.clamped)."""
    a = x * sh.act
    m = x * BOOL

    def k(n: str, r: float, w: float, kernels: int = 1) -> Op:
        return bwd_kernel(f"experts_act_{n}", r, w, kernels=kernels)
    glu_bwd = (k("clamp_glu.mask", a, m), k("clamp_glu.zero", 0, 0), k("clamp_glu.where", m + a, a),
               k("chunk.backward", 2 * a, 2 * a))  # (the chunk is the first op: its gradient is made last)
    linear_bwd = (k("clamp_linear.mask", 2 * a, 2 * m, kernels=2), k("clamp_linear.and", 2 * m, m),
                  k("clamp_linear.zero", 0, 0), k("clamp_linear.where", m + a, a))
    return [memory("experts_act_clamp_glu", a, a, GEGLU_SRC + "428 x_glu.clamp(max=clamp_value)", "experts_act",
                   bwd_ops=glu_bwd),
            memory("experts_act_clamp_linear", a, a, GEGLU_SRC + "429 x_linear.clamp(-clamp_value, clamp_value)",
                   "experts_act", bwd_ops=linear_bwd),
            memory("experts_act_cat", 2 * a, 2 * a, GEGLU_SRC + "426-432 torch.cat of the clamped halves",
                   "experts_act", saves=False, bwd_ops=(no_kernel("experts_act_cat.backward"),)),
            memory("experts_act_offset", 0, sh.act, GEGLU_SRC + "434 torch.tensor(linear_offset, device=input.device)",
                   "experts_act", saves=False, grad=False)]


def fc2_bias(spec: ModelSpec, sh: Shape, rows: float, local: int) -> Op:
    """linear_fc2's expert bias, returned by TE (experts.py:571-572 skip_bias_add True) and added per local expert
    by TEGroupedMLP._apply_bias (experts.py:609-626): for each expert `t + b * p` over its rows (the bias times the
    fp32 probabilities: an fp32 [rows, h]; the bf16 output plus it: fp32), torch.cat of the experts' fp32 pieces,
    and .to() back to the activation dtype: 2 kernels per local expert and 2 more, each over rows x h. Its backward
    (autograd, per expert: derivatives.yaml add and mul, engine.cpp validate_outputs' casts): .to()'s gradient up to
    fp32 once; the cat's pieces are views; then for each expert the gradient cast to the bf16 output's dtype, grad·p
    and its sum over the rows (the bias's gradient, cast to its dtype), grad·b and its sum over h (the
    probabilities'): 6 kernels per local expert and 1."""
    h, a = spec.hidden, sh.act
    el = rows * h
    moved = el * (FP32 + (a + FP32 + FP32) + 2 * FP32 + (FP32 + a)) + rows * FP32

    def k(n: str, r: float, w: float, access: str = "vector") -> Op:
        return bwd_kernel(f"experts_out_bias.{n}", r, w, access, kernels=local)
    bwd = (bwd_kernel("experts_out_bias.to.backward", el * a, el * FP32, "upcast"),
           k("out_grad_cast", el * FP32, el * a), k("grad_p", el * FP32 + rows * FP32, el * FP32, "strided"),
           k("bias_grad_sum", el * FP32, 0), k("bias_grad_cast", 0, 0), k("grad_b", el * FP32, el * FP32, "strided"),
           k("prob_grad_sum", el * FP32, rows * FP32))
    return memory("experts_out_bias", moved / 2, moved / 2, SRC + "experts.py:609-626 _apply_bias", "combine",
                  saves=False, kernels=2 * local + 2, bwd_ops=bwd)


def router_ops(spec: ModelSpec, sh: Shape) -> list[Op]:
    """TopKRouter.forward (moe/router.py): the gating GEMM (:79-101), the fused top-k with its score function
    (:573-584 topk_routing_with_score_function, fused: te fused_topk_with_score_function, one kernel writing the
    probabilities and the routing map), and in training with an aux loss (:596-624): the fused scores for the loss
    (compute_routing_scores_for_aux_loss), the tokens per expert (moe_utils.py:214 get_tokens_per_expert_and_token_
    count: a column sum of the map), the fused switch loss (moe_utils.py:118-120 fused_moe_aux_loss), and its
    logging (router.py:448-450 save_to_aux_losses_tracker(aux_loss / coeff): the division and the tracker's add).
    NB: the loss's all-reduce over the TP x CP group (moe_utils.py:224) is not counted (a no-op at TP = CP = 1)."""
    m, h = spec.moe, spec.hidden
    T, e = sh.norm_tokens, m.num_experts  # the rank's own tokens (under sequence parallelism its 1/tp: LOCAL)
    ops = [gemm("router", T, e, h, sh, SRC + "router.py:79-101 gating")]
    if sh.moe_force_balance:  # router.py:655-657 apply_random_logits (the benchmarks' forced balance)
        ops.append(memory("router_random_logits", T * e * FP32, 2 * T * e * FP32, SRC + "moe_utils.py:1110-1131 "
                          "RandomSTE: logits.clone() and .normal_(), two kernels; its backward passes the gradient on "
                          "(:1134-1144, no kernel)", "router", saves=False, kernels=2, grad=False))
    ops.append(memory("router_topk", T * e * FP32, T * e * (FP32 + BOOL), SRC + "router.py:573-584 fused top-k",
                      "router", saves=False))
    if sh.moe_aux_loss:
        ops += [memory("router_aux_scores", T * e * FP32, T * e * (FP32 + BOOL),
                       SRC + "router.py:600 fused aux-loss scores", "router", saves=False),
                memory("router_aux_loss", T * e * (FP32 + BOOL), FP32, SRC + "router.py:275-314 tokens per expert "
                       "(column sum), fused switch loss, / coeff, the tracker's add", "router", saves=False, kernels=4)]
    return ops


def dispatch_ops(spec: ModelSpec, sh: Shape) -> list[Op]:
    """MoEAlltoAllTokenDispatcher up to the experts (moe/token_dispatcher.py): preprocess's reductions of the routing
    map (:511 tokens per expert, :533 input splits, :548-560 the gathered counts sliced and summed three ways:
    5 kernels) and the all-gather of the counts (:539); the device-to-host copies of the splits and counts
    (:875-893: 3 copies of tensors, tokens_per_expert, input_splits, output_splits; output_splits_tp too with
    TP > 1); permutation 1 (:637, te triton/permutation.py:242-280 three row-id-map passes and :436 the
    permute); the all-to-alls of the tokens and the probabilities (:666-672: timed in parallel/expert.py, here
    their launches); permutation 2 by local expert (:732 sort_chunks_by_idxs: :874 the chunk map, :978 the
    sort). Backward: the permute's is one unpermute kernel (:319), the sort's one sort (:703)."""
    m, h, a = spec.moe, spec.hidden, sh.act
    T, e, k = sh.norm_tokens, m.num_experts, m.top_k  # (LOCAL)
    rows = T * k
    received = expert_dims(spec, sh, sh.expert_tp or sh.tp)[-1]  # after the all-to-all and the expert-TP gather
    copies = 3 + (1 if sh.tp > 1 else 0)
    return [memory("dispatch_metadata", T * e * BOOL, e * INDEX, SRC + "token_dispatcher.py:469-590 preprocess",
                   saves=False, grad=False, kernels=5 + 1 + copies),
            memory("permute", T * h * a + T * e * (BOOL + FP32), rows * (h * a + FP32),
                   SRC + "moe_utils.py:289-334 permute (fused: TE's Triton permute)", "dispatch", saves=False,
                   kernels=4, bwd=1),
            memory("dispatch_a2a", 0.0, 0.0, SRC + "token_dispatcher.py:666-672 all_to_all x2", saves=False,
                   kernels=2),
            memory("sort_by_expert", received * (h * a + FP32), received * (h * a + FP32),
                   SRC + "token_dispatcher.py:732 sort_chunks_by_idxs (fused)", "dispatch", saves=False,
                   kernels=2, bwd=1)]


def combine_ops(spec: ModelSpec, sh: Shape) -> list[Op]:
    """The combine (moe/token_dispatcher.py): unsort by local expert (:767 sort_chunks_by_idxs: chunk map and
    sort), the all-to-all back (:810), unpermutation 1 (:833 unpermute, fused: te triton/permutation.py:615
    one kernel reading the k copies of each token, writing its sum; backward :785 one kernel, the probabilities
    already applied in the activation)."""
    m, h, a = spec.moe, spec.hidden, sh.act
    T, k = sh.norm_tokens, m.top_k  # (LOCAL)
    rows = T * k
    received = expert_dims(spec, sh, sh.expert_tp or sh.tp)[-1]
    return [memory("unsort_by_expert", received * h * a, received * h * a,
                   SRC + "token_dispatcher.py:767 sort_chunks_by_idxs (fused)", "combine", saves=False,
                   kernels=2, bwd=1),
            memory("combine_a2a", 0.0, 0.0, SRC + "token_dispatcher.py:810 all_to_all", saves=False),
            memory("unpermute", rows * h * a, T * h * a, SRC + "token_dispatcher.py:833 unpermute (fused)",
                   "combine", saves=False)]
