"""--low-precision under --stack megatron: Transformer Engine's recipes as Megatron-Core's TE layers run them
(Transformer Engine v2.9, the oldest release megatron-core 0.16.1 pairs with: its METADATA requires
transformer-engine >= 2.9.0a0, < 2.12.0; paths below are transformer_engine/pytorch/..., megatron/core/...).

Which GEMMs: every TE linear of the layer (linear_qkv, linear_proj, linear_fc1, linear_fc2; the experts' grouped
fc1/fc2 and the shared expert), never the embedding, the output layer, the router or the attention core
(fp8_dot_product_attention off: megatron transformer_config.py:477). --bf16-first/last-layers: Megatron's
first_last_layers_bf16 runs N first / M last layers outside the recipe (transformer_config.py:486-495; the first on the
first pipeline stage, the last on the last).

Memory, per quantised weight element of an fp8 layer (one rank):
  * the weight workspace: TE quantises each weight once per optimizer step and keeps it in module._fp8_workspaces
    (module/base.py:1385-1438 get_weight_workspace with cache_name "weight"; linear.py:253-260), because Megatron
    passes is_first_microbatch (megatron extensions/transformer_engine.py:671-678; pipeline_parallel/schedules.py:
    404-405 set_is_first_microbatch): a persistent copy beside the bf16 parameter. It holds the rowwise data for the
    forward and the columnwise data for dgrad (linear.py:393-395 update_usage(columnwise_usage=True)): per-tensor fp8
    keeps a transposed copy on GPUs whose fp8 GEMMs are TN-only (sm90: csrc/quantizer.cpp:126,137 with_transpose =
    columnwise && !nvte_is_non_tn_fp8_gemm_supported(); utils.py:490-496: non-TN from sm100), one copy on sm100;
    the block-scaled formats (blockwise, MXFP8, NVFP4) keep rowwise and columnwise data, each with its scales.
  * --fp8-all-gather (Megatron --fp8-param-gather / --fp4-param-gather: TransformerConfig.fp8_param / fp4_param,
    transformer_config.py:444-450, 520-525): the parameter itself is the quantised tensor (its rowwise and columnwise
    data as above) and the bf16 copy is gone; the distributed optimizer keeps its fp32 main params as before, and the
    param buffer it all-gathers into is in the recipe's format.
  * delayed scaling: an amax history of fp8_amax_history_len rows and a scale per quantised tensor, 3 per GEMM in
    forward and 2 in backward (quantization.py:1055-1076 DelayedScalingRecipeState; module/base.py:767), fp32.
Saved activations, per token of an fp8 layer: TE saves the quantised input of each linear for its wgrad GEMM
(columnwise usage only, rowwise dropped: layernorm_linear.py:404-414, linear.py:372-390) instead of the bf16 one.
linear_qkv's and linear_fc1's norm outputs (ln_out), linear_fc2's input (the activation's output, which bias-SwiGLU
does not save) and the experts' inputs shrink to the recipe's bytes; linear_proj's quantised input is a new copy
beside the attention core's bf16 output, which flash attention keeps for its own backward (a swap under selective
recompute, where the core's output is saved by nobody else).
NB: the quantised input's rowwise copy in forward and dY's two copies in backward are transients of one linear;
the backward's largest (linear_fc1's dY, rowwise + columnwise) is added to the layer's backward temporaries.

Time (ops/te_casts.py): the GEMMs at the recipe's peak (low_precision.Recipe.peak), the casts before them.
"""
from __future__ import annotations

from ..low_precision import recipe
from ..setup import Setup
from ..spec import ModelSpec
from .activations import attention_linear_params
from .params import local_experts
from .parallel.pipeline import Stage

FP32 = 4
FWD_TENSORS, BWD_TENSORS = 3, 2  # quantised tensors per GEMM with delayed scaling (module/base.py:767)
AMAX_HISTORY_LEN = 1  # Megatron's --fp8-amax-history-len default (transformer_config.py:463 fp8_amax_history_len)
LINEARS = 4  # linear_qkv, linear_proj, linear_fc1, linear_fc2 (gpt_layer_specs.py with Transformer Engine)
# Quantised copies of a tensor kept for its rowwise and columnwise GEMMs: two for every recipe on sm90. NB: the memory
# model does not know the GPU; per-tensor fp8 (tensorwise, delayed) on sm100 keeps one (quantizer.cpp:126,137):
# over-counts one byte per weight element there (and per dY element in backward)
COPIES = 2


def runs_te(setup) -> bool:
    """--low-precision is run by Transformer Engine on this stack (stacks/*.toml [low_precision] library)."""
    facts = setup.stack_facts.facts.get("low_precision", {})
    return getattr(setup, "low_precision", "none") != "none" and facts.get("library") == "transformer-engine"


def recipe_layers(setup: Setup, stage: Stage) -> int:
    """Of the stage's layers, those in the recipe: --bf16-first-layers on the first stage, --bf16-last-layers on the
    last run outside it (transformer_config.py:486-495, at most num_layers / pp each: :999-1017).
    NB: with --vpp the first / last model chunk is taken as the stage's."""
    bf16 = (setup.bf16_first_layers if stage.index == 0 else 0) + \
        (setup.bf16_last_layers if stage.index == setup.pp - 1 else 0)
    return max(0, stage.layers - bf16)


def quantised_params(spec: ModelSpec, setup: Setup, moe: bool) -> float:
    """Weights of one layer's TE linears on one rank: attention and dense MLP over tp; a MoE layer's routed experts
    num_experts/ep per rank, each split etp ways, and its shared expert over tp (the router stays bf16)."""
    gate = 3 if spec.gated_mlp else 2
    attn = attention_linear_params(spec) / setup.tp
    if not moe:
        return attn + gate * spec.hidden * spec.intermediate / setup.tp
    m = spec.moe
    return attn + routed_quantised(spec, setup) + gate * spec.hidden * (m.shared_intermediate or 0) / setup.tp


def routed_quantised(spec: ModelSpec, setup: Setup) -> float:
    """Weights of one MoE layer's routed experts on one rank: num_experts/ep of them, each split etp ways."""
    m = spec.moe
    gate = 3 if spec.gated_mlp else 2
    return m.num_experts * gate * spec.hidden * m.expert_intermediate / (setup.ep * setup.expert_tp)


def weight_copies(setup: Setup) -> int:
    """Quantised copies the recipe keeps of each weight (rowwise and columnwise data: COPIES), but one under
    Megatron-FSDP (--zero 3) with --fp8-all-gather for per-tensor fp8 (tensorwise, delayed): its model weight buffer
    holds the fp8 parameters' uint8 data (megatron-core 0.15 / 0.16.1 fsdp/src/megatron_fsdp/param_and_grad_buffer.py:
    1811-1820 / :1940-1949 param_dtype uint8), a transpose weight buffer is made only for MXFP8 (0.16.1 :1951-1961,
    mixed_precision.py:182-184 fp8_need_transpose_data), and the Float8Tensor transpose caches are dropped after each
    module's forward and backward (keep_fp8_transpose_cache False, the default: distributed_data_parallel_config.py:97;
    megatron_fsdp.py:497-504 at 0.15, and its README: "(number of parameter x 1 Byte) of memory overhead" when kept).
    NB: on sm90 each fp8 GEMM's transpose is then made per use, one linear's at a time (not counted: under by one
    weight's bytes at most); sm100 needs none (non-TN fp8 GEMMs)."""
    r = recipe(setup)
    if setup.zero >= 3 and setup.fp8_all_gather and r is not None and r.scale == "tensor":
        return 1
    return COPIES


def weight_bytes(spec: ModelSpec, setup: Setup, stage: Stage, moe_share: float) -> float:
    """Bytes the recipe adds to the stage's resident weights (negative: saves): the quantised copies of the
    recipe's layers' weights, less their bf16 parameters under --fp8-all-gather, and delayed scaling's amax
    histories and scales. `moe_share`: the share of the stage's layers that are MoE layers.
    NB: MXFP8 with --fp8-param-gather may gather through the grad buffer (DistributedDataParallelConfig.
    reuse_grad_buf_for_mxfp8_param_ag, param_and_grad_buffer.py:340-355): modelled like the other recipes."""
    r = recipe(setup)
    if r is None:
        return 0.0
    n = recipe_layers(setup, stage)
    params = n * ((1 - moe_share) * quantised_params(spec, setup, False) +
                  (moe_share * quantised_params(spec, setup, True) if moe_share else 0.0))
    out = params * weight_copies(setup) * r.per_element
    if setup.fp8_all_gather:
        from .parallel.megatron import bytes_per_param

        # the 16-bit parameter dropped (fp8_param: the quantised tensor is the parameter)
        out -= params * bytes_per_param(setup)["weights"]
    if r.name == "delayed":
        gemms = n * ((1 - moe_share) * LINEARS + moe_share * (2 + 2 * local_experts(spec, setup)))
        out += gemms * (FWD_TENSORS + BWD_TENSORS) * (AMAX_HISTORY_LEN + 1) * FP32
    return out


def saved_delta(spec: ModelSpec, setup: Setup, act: int, moe: bool, core_recomputed: bool) -> tuple[dict, dict]:
    """(replicated, split) bytes per token the recipe changes in one layer's saved tensors (the terms of
    megatron_activations.layer_terms: replicated split t ways only by SP, split by TP)."""
    r = recipe(setup)
    if r is None:
        return {}, {}
    e = r.per_element
    h, q = spec.hidden, spec.q_dim
    # linear_qkv's ln_out (and linear_fc1's in a dense layer) saved quantised (layernorm_linear.py:404-414). In a MoE
    # layer the pre-MLP norm is a plain TENorm whose output the router saves in bf16 (kept)
    rep = {"linear_inputs": (1 if moe else 2) * (e - act) * h}
    # linear_proj's quantised input (linear.py:372-390): beside flash's bf16 output, or in its place when the core
    # is recomputed (selective: nobody else saves the output)
    split = {"attention_output": (e - act if core_recomputed else e) * q}
    if not moe:
        split["activation_output"] = (e - act) * spec.intermediate  # linear_fc2's input
        return rep, split
    m = spec.moe
    # per routed copy: the grouped fc1's input (h, ×etp gathered: megatron_activations._moe_terms) and fc2's input
    split["expert_tokens"] = m.top_k * (e - act) * h * setup.expert_tp
    split["expert_hidden"] = m.top_k * (e - act) * m.expert_intermediate
    if m.shared_intermediate:
        # the shared expert's fc1 keeps a quantised copy of the norm output the router saves; its fc2 input shrinks
        split["shared_expert"] = e * h + (e - act) * m.shared_intermediate
    return rep, split


def backward_transient(spec: ModelSpec, setup: Setup, moe: bool) -> float:
    """Bytes per token of linear_fc1's quantised output gradient in backward: rowwise (dgrad) and columnwise
    (wgrad) data, COPIES of it (NB there: one for per-tensor fp8 on sm100; linear.py:567-575
    grad_output_quantizer.set_usage(rowwise=True, columnwise=True)), beside the bf16 gradient already counted."""
    r = recipe(setup)
    if r is None:
        return 0.0
    gate = 2 if spec.gated_mlp else 1
    width = (spec.moe.expert_intermediate * spec.moe.top_k * setup.expert_tp if moe else spec.intermediate)
    return COPIES * r.per_element * gate * width / setup.tp


def notes(spec: ModelSpec, setup: Setup) -> list[str]:
    r = recipe(setup)
    if r is None:
        return []
    gather = ("; --fp8-param-gather: weights kept only quantised (fp32 main params in the optimizer)"
              if setup.fp8_all_gather else "; the bf16 weights kept beside their quantised copies")
    bf16 = (f"; first {setup.bf16_first_layers} / last {setup.bf16_last_layers} layers in bf16"
            if setup.bf16_first_layers or setup.bf16_last_layers else "")
    return [f"Transformer Engine {r.name} ({r.summary}) on linear_qkv/proj/fc1/fc2 of each layer{gather}{bf16}; "
            "saved linear inputs quantised (te_recipes.py; NB: one linear's quantisation transients approximated by "
            "linear_fc1's output gradient)"]


def gather_saving(spec: ModelSpec, setup: Setup, layers: int, param_bytes: float, part: str = "all",
                  copies: int = 1) -> float:
    """Bytes fewer in the distributed optimizer's parameter all-gather of a stage of `layers` layers under
    --fp8-all-gather: the recipe's linears gathered in its format (rowwise data with its scales; `copies` of it
    where a buffer holds more: weight_copies) instead of `param_bytes` (megatron distributed/param_and_grad_buffer.py:
    the param buffer holds the fp8 params).
    `part`: "all", "experts" (the routed experts', gathered over the expert data-parallel group) or "dense" (the rest).
    NB: the first/last bf16 layers and the MoE/dense mix are taken as the model's average."""
    r = recipe(setup)
    if r is None or not setup.fp8_all_gather or not runs_te(setup):
        return 0.0
    moe = spec.moe_share
    n = max(0, layers - (setup.bf16_first_layers + setup.bf16_last_layers) * layers / spec.layers)
    per_layer = (1 - moe) * quantised_params(spec, setup, False) + \
        (moe * quantised_params(spec, setup, True) if moe else 0.0)
    if part != "all":
        routed = moe * routed_quantised(spec, setup) if moe else 0.0
        per_layer = routed if part == "experts" else per_layer - routed
    return n * per_layer * (param_bytes - copies * r.per_element)


def te_gather_saving(setup, act_bytes: float, rerun: float) -> float:
    """Of parallel/tensor.py's per-layer all-reduce count, the part Transformer Engine saves under sequence
    parallelism by gathering linear_qkv's and linear_fc1's inputs quantised: in forward (and a re-run forward) the
    all-gather half of each all-reduce moves element_bytes instead of act_bytes (linear.py:176-205, layernorm_linear.py
    :233-262: the local input quantised, then gather_along_first_dim with the quantizer). NB: the backward's
    re-gather of ln_out for wgrad (layernorm_linear.py:648-677) is quantised too and counted in bf16: pessimistic."""
    r = recipe(setup)
    if r is None or not runs_te(setup) or not setup.sequence_parallel:
        return 0.0
    return (2 + 2 * rerun) * 0.5 * (1 - r.per_element / act_bytes)
