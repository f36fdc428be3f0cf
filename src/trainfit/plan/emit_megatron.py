"""`trainfit plan --emit megatron`: a Megatron-LM `pretrain_gpt.py` command line for the chosen plan.

Flag names are Megatron-LM's (megatron/training/arguments.py; each maps 1:1 onto a megatron.core config field,
e.g. --tensor-model-parallel-size → ModelParallelConfig.tensor_model_parallel_size, --account-for-embedding-in-
pipeline-split → TransformerConfig.account_for_embedding_in_pipeline_split (transformer_config.py:96-100),
--decoder-first/last-pipeline-num-layers → num_layers_in_first/last_pipeline_stage, --use-distributed-optimizer
→ DistributedDataParallelConfig/OptimizerConfig.use_distributed_optimizer, --use-megatron-fsdp and
--data-parallel-sharding-strategy → DistributedDataParallelConfig.use_megatron_fsdp / data_parallel_sharding_strategy). tests/plan/test_emit_megatron.py builds
megatron.core's own configs from the emitted list, so their __post_init__ checks validate it.
"""
from __future__ import annotations

import shlex

from ..analytic.ops.shape import aux_loss_coeff
from ..analytic.mtp import mtp_layers
from ..models.hf_config import rope_parameters
from ..setup import Setup, parse_pp_split
from ..setup.pp_layout import Layout
from ..spec import ModelSpec

# the stack whose step the command runs (stacks/megatron.toml: Megatron-Core's)
STACK = "megatron"
PRECISIONS = ("bf16-master", "fp16-master", "fp32")  # 16-bit weights with fp32 main params, or fp32


def supports(s: Setup) -> str | None:
    """None: the command runs every plan of the megatron stack (emit.supports holds the plan to it)."""
    return None


def _data_parallel(s: Setup) -> list[str]:
    """--zero 1: the distributed optimizer; --zero 2 / 3: Megatron-FSDP with the sharding strategy Megatron-FSDP
    numbers the same (fsdp/src/megatron_fsdp/fully_shard.py:41-53), with the flags its user guide requires
    (Megatron-LM core_v0.16.1 docs/discussions/megatron-fsdp-user-guide/megatron-fsdp-user-guide.md:27-37: the
    distributed optimizer over its buffers, the fsdp_dtensor checkpoint format that arguments.py:690-691 asserts).
    The guide's --no-gradient-accumulation-fusion is left out: arguments.py:677-681 only warns, and Megatron-Bridge's
    FSDP recipes keep the fusion (scripts/performance/utils/helpers.py:116-126 at v0.2.0), as trainfit models it."""
    # the gradient reduce hidden behind the backward, as the time model has it (parallel/zero.py dp_comm), and the
    # parameter all-gather behind the forward where the setup says (--overlap-param-gather, which Megatron-LM accepts
    # only beside --overlap-grad-reduce: core_v0.16.1 arguments.py:600-601)
    overlap = (["--overlap-grad-reduce"] if s.dp * s.cp > 1 or s.overlap_param_gather else []) + \
        (["--overlap-param-gather"] if s.overlap_param_gather else [])
    if s.zero == 1:
        return ["--use-distributed-optimizer"] + overlap
    if s.zero >= 2:
        strategy = {2: "optim_grads", 3: "optim_grads_params"}[s.zero]
        return ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", strategy, "--use-distributed-optimizer",
                "--ckpt-format", "fsdp_dtensor"] + overlap
    return overlap


def _recompute(rec: str) -> list[str]:
    """Megatron's recompute flags (transformer_config.py recompute_granularity/method/num_layers)."""
    if rec == "none":
        return []
    if rec == "selective":
        return ["--recompute-granularity", "selective"]
    if rec == "full":  # every layer: uniform over chunks of one layer
        return ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    method, _, n = rec.partition(":")  # uniform:N / block:N
    return ["--recompute-granularity", "full", "--recompute-method", method, "--recompute-num-layers", n]


def _moe_dispatcher(s: Setup) -> list[str]:
    """The token dispatcher the plan was timed with (analytic/parallel/expert.py), always written: Megatron-LM's own
    default is allgather, trainfit's alltoall (megatron-core 0.16.1 transformer_config.py:675-682
    moe_token_dispatcher_type, moe_flex_dispatcher_backend; model_parallel_config.py:264
    overlap_moe_expert_parallel_comm, Megatron-LM's --overlap-moe-expert-parallel-comm)."""
    how = s.moe_dispatcher or "alltoall"
    out = ["--moe-token-dispatcher-type", how] if how in ("alltoall", "allgather") else \
        ["--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", how]
    if s.moe_dispatcher_sms:  # TransformerConfig.moe_deepep_num_sms / moe_hybridep_num_sms (:722, :725)
        out += [f"--moe-{how}-num-sms", str(s.moe_dispatcher_sms)]
    return out + (["--overlap-moe-expert-parallel-comm"] if s.overlap_moe_comm else [])


def _load_balancing(s: Setup, spec: ModelSpec) -> list[str]:
    """The router's load-balancing loss, where the step is timed with it (stacks/megatron.toml [moe] aux_loss): its
    type and coefficient from the same table. Megatron-LM's default coefficient is 0.0 (megatron-core 0.16.1
    transformer_config.py:659), under which TopKRouter runs none of the loss's kernels (router.py:253-273, :598);
    flags: Megatron-LM core_v0.16.1 arguments.py:2705-2710."""
    facts = s.stack_facts.facts
    coeff = aux_loss_coeff(spec, facts)
    if not coeff:
        return []
    kind = "seq_aux_loss" if spec.family in facts["moe"]["seq_aux_loss_families"] else "aux_loss"
    return ["--moe-router-load-balancing-type", kind, "--moe-aux-loss-coeff", f"{coeff:g}"]


def _router_order(spec: ModelSpec) -> list[str]:
    """Where the softmax comes in the router. Megatron's softmax router takes the top-k of the logits and softmaxes
    those k (megatron-core 0.16.1 moe/moe_utils.py:709-716): the top-k of the full softmax renormalised. A model
    whose router keeps the full softmax's top-k weights as they are (MoESpec.norm_topk False: Qwen-MoE's
    norm_topk_prob False, DeepSeek-V2's router) needs the softmax first, --moe-router-pre-softmax
    (TransformerConfig.moe_router_pre_softmax, transformer_config.py:617; Megatron refuses a top-1 softmax router
    without it, :1633-1640). A sigmoid router renormalises its k > 1 weights either way (moe_utils.py:725)."""
    return ["--moe-router-pre-softmax"] if spec.moe.router_scoring == "softmax" and not spec.moe.norm_topk else []


def _expert_bias(spec: ModelSpec) -> bool:
    """DeepSeek-V3's router: sigmoid scores with the e_score_correction_bias, which balances the load (TransformerConfig
    moe_router_score_function, moe_router_enable_expert_bias: transformer_config.py:626, :634, the bias with sigmoid
    only, :1593; Megatron's default is a softmax router without the bias)."""
    return spec.moe.router_scoring == "sigmoid"


def _low_precision(s: Setup) -> list[str]:
    """Transformer Engine's recipe (Megatron-LM core_v0.16.1 arguments.py:1621 builds --fp8-format, --fp8-recipe,
    --fp4-format, --fp4-recipe, --fp4-param-gather, --first-last-layers-bf16, --num-layers-at-start/end-in-bf16 from
    TransformerConfig's fields, transformer_config.py:429-525; --fp8-param-gather: arguments.py:1398, → fp8_param
    :1331). fp8 recipes with the hybrid format (e4m3 forward, e5m2 gradients: what Megatron-Bridge's recipes run)."""
    lp = s.low_precision
    if lp == "none":
        return []
    fp4 = lp == "nvfp4"
    out = ["--fp4-format", "e2m1", "--fp4-recipe", lp] if fp4 else ["--fp8-format", "hybrid", "--fp8-recipe", lp]
    if s.fp8_all_gather:
        out += ["--fp4-param-gather" if fp4 else "--fp8-param-gather"]
    if s.bf16_first_layers or s.bf16_last_layers:
        out += ["--first-last-layers-bf16", "--num-layers-at-start-in-bf16", str(s.bf16_first_layers),
                "--num-layers-at-end-in-bf16", str(s.bf16_last_layers)]
    return out


# What the emitted command cannot build: Megatron-LM core_v0.16.1's GPT (gpt_layer_specs.py with Transformer Engine) has
# no flag for these, or builds them another way than the model trainfit timed (each a one-line refusal: check_model)
UNBUILT = (("vision", "a vision tower"), ("encdec", "an encoder-decoder"), ("hybrid", "Mamba-2 blocks"),
           ("linear_attn", "Gated DeltaNet layers"), ("attn_sinks", "attention sinks (gpt-oss)"),
           ("sliding_window", "sliding-window attention"), ("attention_chunk", "chunked attention (Llama 4)"),
           ("parallel_residual", "a parallel residual (GPT-NeoX, Phi-2)"), ("attn_softcap", "attention softcapping"),
           ("attn_output_gate", "a gated attention output (Qwen3-Next)"), ("embedding_norm", "an embedding norm"))


def check_model(spec: ModelSpec) -> None:
    """Refuse, before the search, a model the emitted pretrain_gpt.py would build differently (UNBUILT; and YaRN
    RoPE outside multi-latent attention, which Megatron-LM core_v0.16.1 asserts against: arguments.py:1357-1358)."""
    from ..errors import SetupError

    for field, what in UNBUILT:
        if getattr(spec, field, None):
            raise SetupError(f"--emit megatron: {spec.name} has {what}, which the emitted pretrain_gpt.py command "
                             "would not build; plan without --emit, or --emit torchtitan / deepspeed / accelerate")
    if not spec.causal:
        raise SetupError(f"--emit megatron: {spec.name} is an encoder; pretrain_gpt.py builds decoders only")
    kind = rope_parameters(spec.config)[1]
    if spec.positions == "rotary" and spec.mla is None and kind not in (None, "default", "llama3"):
        raise SetupError(f"--emit megatron: {spec.name}'s {kind} RoPE runs in Megatron-LM's multi-latent attention "
                         "only (arguments.py:1357-1358); plan without --emit")


def _architecture(spec: ModelSpec) -> list[str]:
    """The model's norms, positions and attention as Megatron-LM flags, where its defaults differ (LayerNorm,
    learned absolute positions, biases on, gelu): TransformerConfig's normalization, layernorm_epsilon (--norm-epsilon),
    qk_layernorm, add_qkv_bias, multi_latent_attention (transformer_config.py:150-152, 167, 205-208, 237; flags from
    the fields: arguments.py:1621), GPTModel's position_embedding_type, rotary_base, rotary_percent and Llama 3's rope
    scaling (arguments.py:1645-1664), and MLA's ranks and YaRN (arguments.py:2723-2740)."""
    out = ["--normalization", "RMSNorm"] if spec.norm == "rmsnorm" else []
    cfg = spec.config
    eps = cfg.get("rms_norm_eps", cfg.get("layer_norm_eps", cfg.get("layer_norm_epsilon")))
    if eps is not None:
        out += ["--norm-epsilon", f"{float(eps):g}"]
    if spec.positions == "rotary":
        theta, kind, scaling = rope_parameters(spec.config)
        out += ["--position-embedding-type", "rope", "--rotary-base", str(int(theta))]
        if spec.rotary_fraction != 1.0:
            out += ["--rotary-percent", f"{spec.rotary_fraction:g}"]
        if kind == "llama3":
            out += ["--use-rope-scaling", "--rope-scaling-factor", f"{float(scaling['factor']):g}"]
    elif spec.positions == "none":
        out += ["--position-embedding-type", "none"]
    if spec.qk_norm:
        out += ["--qk-layernorm"]
    if spec.qkv_bias and not (spec.out_bias or spec.mlp_bias):
        out += ["--add-qkv-bias"]  # (with --disable-bias-linear: biases on q, k, v only, Qwen2's)
    if spec.mla is not None:
        m, (_, kind, scaling) = spec.mla, rope_parameters(spec.config)
        out += ["--multi-latent-attention", "--kv-lora-rank", str(m.kv_lora_rank), "--qk-head-dim",
                str(m.qk_nope_head_dim), "--qk-pos-emb-head-dim", str(m.qk_rope_head_dim), "--v-head-dim",
                str(m.v_head_dim)] + (["--q-lora-rank", str(m.q_lora_rank)] if m.q_lora_rank else [])
        if kind == "yarn":
            out += ["--rope-type", "yarn", "--rotary-scaling-factor", f"{float(scaling['factor']):g}",
                    "--mscale", f"{float(scaling.get('mscale', 1.0)):g}",
                    "--mscale-all-dim", f"{float(scaling.get('mscale_all_dim', 0.0)):g}"]
    return out


def _moe_layers(spec: ModelSpec) -> list[str]:
    """Which layers are MoE where not all are: TransformerConfig.moe_layer_freq as a pattern (transformer_config.py:556;
    arguments.py:231-245 moe_freq_type, :2693), 1 an expert layer: Llama 4's interleave (MoESpec.layer_step: layer i
    is MoE iff i % step == step - 1), else the dense layers first (DeepSeek's first_k_dense_replace)."""
    m = spec.moe
    if m.layer_step >= 2:
        return ["--moe-layer-freq", f"([0]*{m.layer_step - 1}+[1])*{spec.layers // m.layer_step}"]
    if m.sparse_layers is not None and m.sparse_layers < spec.layers:
        return ["--moe-layer-freq", f"([0]*{spec.layers - m.sparse_layers}+[1]*{m.sparse_layers})"]
    return []


def args(s: Setup, spec: ModelSpec) -> list[str]:
    """The pretrain_gpt.py arguments of setup `s` for model `spec`."""
    out = ["--num-layers", str(spec.layers), "--hidden-size", str(spec.hidden),
           "--num-attention-heads", str(spec.heads), "--kv-channels", str(spec.head_dim),
           "--ffn-hidden-size", str(spec.intermediate), "--seq-length", str(s.seq),
           "--max-position-embeddings", str(max(s.seq, spec.max_positions or s.seq)),
           "--micro-batch-size", str(s.batch), "--global-batch-size", str(s.batch * s.grad_accum * s.dp),
           "--tensor-model-parallel-size", str(s.tp), "--pipeline-model-parallel-size", str(s.pp),
           "--context-parallel-size", str(s.cp)]
    if spec.kv_heads != spec.heads:
        out += ["--group-query-attention", "--num-query-groups", str(spec.kv_heads)]
    out += _architecture(spec)
    if spec.activation == "silu":
        out += ["--swiglu"]
    if not (spec.qkv_bias or spec.out_bias or spec.mlp_bias):
        out += ["--disable-bias-linear"]
    if not spec.tied_embeddings:
        out += ["--untie-embeddings-and-output-weights"]
    if s.tp > 1 and s.sequence_parallel:
        out += ["--sequence-parallel"]
    if s.tp_comm_overlap:  # model_parallel_config.py:186 tp_comm_overlap (Transformer Engine's userbuffers)
        out += ["--tp-comm-overlap"]
    if s.offload_layers:  # model_parallel_config.py:373 cpu_offloading_num_layers (arguments.py:1621 generates the
        # flag; :1236-1237 turns cpu_offloading on with it)
        out += ["--cpu-offloading-num-layers", str(s.offload_layers)]
    if s.loss_fusion != "none":  # model_parallel_config.py:241-249 cross_entropy_loss_fusion, cross_entropy_fusion_impl
        # (flags generated by arguments.py:1621)
        out += ["--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl", s.loss_fusion]
    how = parse_pp_split(s.pp_split)
    if s.pp > 1 and s.vpp > 1 and not isinstance(how, Layout):  # (a layout sets the virtual stages: arguments.py:503)
        out += ["--virtual-pipeline-model-parallel-size", str(s.vpp)]
    if isinstance(how, Layout):  # --pipeline-model-parallel-layout (Megatron-LM core_v0.16.1 arguments.py:2217)
        out += ["--pipeline-model-parallel-layout", how.text]
    elif how == "embedding-loss":
        out += ["--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"]
    elif isinstance(how, tuple):
        first, last = how
        out += (["--decoder-first-pipeline-num-layers", str(first)] if first > 0 else []) + \
               (["--decoder-last-pipeline-num-layers", str(last)] if last > 0 else [])
    if spec.is_moe:
        # flags generated from TransformerConfig's fields (Megatron-LM core_v0.16.1 arguments.py:1621 with
        # argument_utils.py:82): moe_ffn_hidden_size (transformer_config.py:561; unset it falls back to
        # --ffn-hidden-size, :1054-1056), moe_shared_expert_intermediate_size (:534), and ModelParallelConfig's
        # expert_model_parallel_size / expert_tensor_parallel_size (model_parallel_config.py:72-78; None: tp, :413-414)
        out += _moe_layers(spec)
        out += ["--num-experts", str(spec.moe.num_experts), "--moe-router-topk", str(spec.moe.top_k),
                "--moe-ffn-hidden-size", str(spec.moe.expert_intermediate),
                "--expert-model-parallel-size", str(s.ep)]
        if spec.moe.shared_intermediate:
            out += ["--moe-shared-expert-intermediate-size", str(spec.moe.shared_intermediate)]
        if spec.moe.shared_gate:  # Qwen-MoE's sigmoid gate on the shared expert, as timed (ops/megatron_moe.py):
            # TransformerConfig.moe_shared_expert_gate (transformer_config.py:546; shared_experts.py:128-131)
            out += ["--moe-shared-expert-gate"]
        if s.etp is not None:
            out += ["--expert-tensor-parallel-size", str(s.etp)]
        if spec.moe.route_groups:  # group-limited routing (transformer_config.py:598-614)
            out += ["--moe-router-num-groups", str(spec.moe.route_groups),
                    "--moe-router-group-topk", str(spec.moe.route_group_topk)]
        if _expert_bias(spec):
            out += ["--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias"]
        out += _load_balancing(s, spec) + _router_order(spec)
        if spec.moe.routed_scaling != 1.0:  # moe_router_topk_scaling_factor (transformer_config.py:622; None: 1)
            out += ["--moe-router-topk-scaling-factor", f"{spec.moe.routed_scaling:g}"]
        out += _moe_dispatcher(s)
        out += ["--moe-grouped-gemm"]  # TEGroupedMLP, the experts the megatron stack models (megatron_activations.py)
        # the fused router and permutation the stack times (stacks/megatron.toml [moe]: Megatron-Bridge's recipes);
        # Megatron-LM's defaults are off (megatron-core 0.16.1 transformer_config.py:708, :711; flags generated by
        # arguments.py:1621), which would run the unfused kernels
        out += ["--moe-router-fusion", "--moe-permute-fusion"]
    if mtp_layers(spec, s):  # TransformerConfig.mtp_num_layers (transformer_config.py:48; arguments.py:1621)
        out += ["--mtp-num-layers", str(mtp_layers(spec, s))]
    out += _data_parallel(s)
    out += {"bf16-master": ["--bf16"], "fp16-master": ["--fp16"], "fp32": []}[s.precision]
    if s.grad_reduce_in_bf16:
        out += ["--grad-reduce-in-bf16"]  # arguments.py:720-721, :2178
    # Megatron-LM's --clip-grad (default 1.0) -> OptimizerConfig.clip_grad; 0 turns clipping off
    out += ["--clip-grad", f"{s.grad_clip_norm:g}"]
    out += _recompute(s.recompute)
    if s.recompute_modules and s.recompute == "selective":
        # TransformerConfig.recompute_modules as a flag (Megatron-LM core_v0.16.1 arguments.py:1621: every config field,
        # a list as space-separated values)
        out += ["--recompute-modules", *s.recompute_modules.split(",")]
    if s.cuda_graph_scope:
        # TransformerConfig.cuda_graph_impl / cuda_graph_scope (transformer_config.py:777-791; a list as
        # space-separated values, arguments.py:1621)
        out += ["--cuda-graph-impl", "transformer_engine", "--cuda-graph-scope", *s.cuda_graph_scope.split(",")]
    return out + _low_precision(s)


def command(s: Setup, spec: ModelSpec, gpus_per_node: int) -> str:
    world = s.world_size
    nodes = max(1, -(-world // gpus_per_node))
    head = ["torchrun", f"--nproc-per-node={min(world, gpus_per_node)}", f"--nnodes={nodes}", "pretrain_gpt.py"]
    return " \\\n    ".join([shlex.join(head)] + [shlex.join(p) for p in _pairs(args(s, spec))]) + "\n"


def _pairs(a: list[str]) -> list[list[str]]:
    """Flags with their values, one per line."""
    out: list[list[str]] = []
    for x in a:
        if x.startswith("--"):
            out.append([x])
        else:
            out[-1].append(x)
    return out


def write(s: Setup, spec: ModelSpec, gpus_per_node: int, tokens: float | None = None) -> str:
    return command(s, spec, gpus_per_node)
