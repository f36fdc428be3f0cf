"""What a sparse MoE block saves for backward, as transformers' grouped_mm experts run it (no torch).

transformers 5 runs every MoE family's experts through `grouped_mm_experts_forward`
(transformers/integrations/moe.py:424-540; the default experts implementation, modeling_utils.py:1884):
  router      F.linear(h, gate.weight) -> softmax(logits, fp32) -> topk -> [normalise: top /= top.sum()]
              (modeling_mixtral.py:103-110, modeling_qwen2_moe.py:319-328);
  dispatch    sort the S = tokens·top_k (token, expert) pairs by expert: `hidden[perm // k]`, `weights[perm]`,
              and `out[inv_perm]` each save their int64 index;
  experts     grouped_mm(x, gate_up) -> act(gate)·up -> grouped_mm(·, down) -> · routing weight. grouped_mm is not
              autocast-enabled: transformers casts the input to the weights' dtype (moe.py:376, `input.to(weight.dtype)`),
              so under autocast the experts compute in the fp32 master weights' dtype.
DeepSeek-V3 scores with a sigmoid and a group-limited top-k (`_sigmoid_router`); DeepSeek-V2 with a softmax (as
above, weights kept fp32). Qwen2-MoE adds an always-on shared expert (an ordinary gated MLP) scaled by
sigmoid(shared_expert_gate(h)) (modeling_qwen2_moe.py:339-350); DeepSeek's shared experts are not gated.
"""
from __future__ import annotations

from ..errors import SetupError
from ..setup import Setup
from ..spec import ModelSpec
from . import clamped_swiglu as swiglu
from . import torchtitan_moe
from .families import family_traits
from .moe_every_expert import every_expert_block
from .moe_imbalance import busiest_rank_load
from .precision import state_bytes

FP32 = 4
INDEX = 8


def moe_block(spec: ModelSpec, setup: Setup) -> tuple[dict, float]:
    """({"linear_inputs": bytes per token, "mlp": bytes per token}, fixed bytes) saved by one MoE block.
    "linear_inputs" are the block's own copies of its input (autocast casts, or the input itself saved by the
    router without autocast); "mlp" everything else."""
    m = spec.moe
    if torchtitan_moe.block_on(setup):  # torchtitan's own MoE module
        return torchtitan_moe.moe_block(spec, setup)
    if m.experts_every_token:  # Llama 4: no dispatch, every expert on every token (moe_every_expert.py)
        return every_expert_block(spec, setup)
    st = state_bytes(setup)
    a = st.act
    amp = st.autocast
    h, k, e, i = spec.hidden, m.top_k, m.num_experts, m.expert_intermediate
    # the experts compute in their weights' dtype (no autocast): FSDP2's gathered param_dtype where it casts them
    ex = int(st.param or st.weight)
    traits = family_traits(spec)
    # Router: autocast casts the block input for F.linear; without autocast the linear saves the input itself.
    # softmax's fp32 output and topk's indices are saved; normalising the top-k weights (Mixtral always; Qwen-MoE
    # when norm_topk_prob) saves them and their sum (MoESpec.norm_topk).
    inputs = a * h
    if m.router_scoring == "sigmoid":
        router, weight_bytes = _sigmoid_router(spec, setup)
    elif m.router_scoring == "topk_softmax":  # gpt-oss: the k top logits softmaxed in their dtype
        router, weight_bytes = swiglu.topk_softmax_router(spec, a), a
    else:
        if m.topk_method != "greedy" and spec.family == "deepseek_v2":
            # DeepseekV2TopkRouter's group_limited_greedy (max over groups, group mask) is not measured
            raise SetupError(f"{spec.name}: the analytic engine does not model DeepSeek-V2's group_limited_greedy "
                             "router; use --engine trace")
        router = FP32 * e + INDEX * k
        if m.norm_topk:
            router += FP32 * k + FP32
        # the routing weights stay fp32 (Mixtral, DeepSeek-V2's softmax(dtype=fp32)) or are cast back to the router
        # logits' dtype (Qwen-MoE: `router_top_value.to(router_logits.dtype)`, families.json moe_weights_logits_dtype)
        weight_bytes = a if traits["moe_weights_logits_dtype"] else FP32
    # (expert biases: their gathers keep the sorted expert ids, clamped_swiglu.py)
    dispatch = 3 * INDEX * k + weight_bytes * k + swiglu.bias_index_bytes(spec) * k
    # experts, per routed copy: input (h), gate_up output (2i; act(gate) and up are views of it), act(gate) (i),
    # the product (i, down's input) and down's output (h, saved by the routing-weight multiply); gpt-oss's clamped
    # SwiGLU keeps three i-wide tensors more (clamped_swiglu.py)
    experts = k * ex * (2 * h + swiglu.saved_intermediates(spec) * i)
    # the busiest expert-parallel rank's routed copies, X times the balanced ones (moe_imbalance.py; 1 at --ep 1)
    mlp = router + (dispatch + experts) * busiest_rank_load(spec, setup, setup.batch * setup.seq / setup.cp)
    fixed = FP32 * e  # grouped_mm's int32 group offsets
    if amp:
        fixed += a * e * h  # autocast's cast of the router weight
    if m.shared_intermediate:
        s = m.shared_intermediate
        # shared expert: a gated MLP (gate/up casts under autocast; else they share the saved input), its output
        # (saved by the sigmoid-gate multiply), the gate linear's own cast and sigmoid output
        # (DeepSeek's shared experts have no gate: DeepseekV3MoE.forward adds shared_experts(residuals) as is,
        # modeling_deepseek_v3.py:215-222)
        gate = 1 if m.shared_gate else 0
        if amp:
            inputs += (2 + gate) * a * h  # gate_proj, up_proj (and shared_expert_gate) each cast the input
            fixed += a * (3 * h * s + gate * h)
        mlp += 4 * a * s + gate * (a * h + a)
    return {"linear_inputs": inputs, "mlp": mlp}, fixed


def _sigmoid_router(spec: ModelSpec, setup: Setup) -> tuple[float, int]:
    """(bytes per token, routing-weight bytes) of DeepSeek-V3's router (DeepseekV3TopkRouter.forward,
    modeling_deepseek_v3.py:133-159): F.linear on `.type(float32)` operands — under autocast the linear still runs
    in the autocast dtype — then sigmoid (saves its output, which `gather` reads). The group-limited selection
    (topk over groups, masked_fill, topk) yields integer indices only, so its autograd branch is freed in the forward;
    `gather` keeps the k int64 indices. norm_topk_prob divides by the sum (saves the k weights and the sum);
    routed_scaling_factor multiplies by a Python float (saves nothing). Checked against a real CPU step
    (tests/analytic/test_mla_activations.py)."""
    m, st = spec.moe, state_bytes(setup)
    logits = st.act if st.autocast else FP32
    router = logits * m.num_experts + INDEX * m.top_k
    if m.norm_topk:  # norm_topk_prob (configuration_deepseek_v3.py:101 default True)
        router += logits * m.top_k + logits
    return router, logits
