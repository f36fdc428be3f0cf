"""--emit megatron: the emitted pretrain_gpt.py arguments build megatron.core's own configs (their __post_init__
checks run on CPU) and the layout round-trips."""
from __future__ import annotations

import json
import shlex
from pathlib import Path
from types import SimpleNamespace

import pytest

from trainfit.errors import ConfigError, SetupError
from trainfit.models.resolve import load_model
from trainfit.plan.emit import emit
from trainfit.setup import Setup, validate

# Megatron-LM flag → megatron.core config field (arguments.py names; transformer_config.py / model_parallel_config.py)
FIELDS = {"--num-layers": "num_layers", "--hidden-size": "hidden_size", "--num-attention-heads": "num_attention_heads",
          "--kv-channels": "kv_channels", "--ffn-hidden-size": "ffn_hidden_size", "--num-query-groups": "num_query_groups",
          "--tensor-model-parallel-size": "tensor_model_parallel_size",
          "--pipeline-model-parallel-size": "pipeline_model_parallel_size",
          "--virtual-pipeline-model-parallel-size": "virtual_pipeline_model_parallel_size",
          "--context-parallel-size": "context_parallel_size", "--expert-model-parallel-size": "expert_model_parallel_size",
          "--sequence-parallel": "sequence_parallel", "--tp-comm-overlap": "tp_comm_overlap", "--bf16": "bf16", "--fp16": "fp16",
          "--account-for-embedding-in-pipeline-split": "account_for_embedding_in_pipeline_split",
          "--account-for-loss-in-pipeline-split": "account_for_loss_in_pipeline_split",
          "--decoder-first-pipeline-num-layers": "num_layers_in_first_pipeline_stage",
          "--decoder-last-pipeline-num-layers": "num_layers_in_last_pipeline_stage",
          "--recompute-granularity": "recompute_granularity", "--recompute-method": "recompute_method",
          "--recompute-num-layers": "recompute_num_layers", "--num-experts": "num_moe_experts",
          # TransformerConfig fields as flags (arguments.py:1621 ArgumentGroupFactory(TransformerConfig))
          "--recompute-modules": "recompute_modules", "--moe-grouped-gemm": "moe_grouped_gemm",
          "--mtp-num-layers": "mtp_num_layers", "--pipeline-model-parallel-layout": "pipeline_model_parallel_layout",
          "--moe-router-topk": "moe_router_topk", "--moe-ffn-hidden-size": "moe_ffn_hidden_size",
          "--moe-shared-expert-intermediate-size": "moe_shared_expert_intermediate_size",
          "--expert-tensor-parallel-size": "expert_tensor_parallel_size",
          "--moe-token-dispatcher-type": "moe_token_dispatcher_type",
          "--moe-flex-dispatcher-backend": "moe_flex_dispatcher_backend",
          "--overlap-moe-expert-parallel-comm": "overlap_moe_expert_parallel_comm",
          "--moe-router-num-groups": "moe_router_num_groups", "--moe-router-group-topk": "moe_router_group_topk",
          "--moe-router-score-function": "moe_router_score_function",
          "--moe-router-enable-expert-bias": "moe_router_enable_expert_bias",
          "--moe-shared-expert-gate": "moe_shared_expert_gate", "--moe-router-pre-softmax": "moe_router_pre_softmax",
          # the load-balancing loss (arguments.py:2705-2710: --moe-aux-loss-coeff type=float)
          "--moe-router-load-balancing-type": "moe_router_load_balancing_type",
          "--moe-aux-loss-coeff": "moe_aux_loss_coeff",
          "--cuda-graph-impl": "cuda_graph_impl", "--cuda-graph-scope": "cuda_graph_scope",
          "--cpu-offloading-num-layers": "cpu_offloading_num_layers",
          # ModelParallelConfig's fused cross-entropy (model_parallel_config.py:241-249)
          "--cross-entropy-loss-fusion": "cross_entropy_loss_fusion",
          "--cross-entropy-fusion-impl": "cross_entropy_fusion_impl",
          # Transformer Engine's recipes (arguments.py:1398, :1331: --fp8-param-gather sets fp8_param)
          "--fp8-format": "fp8", "--fp8-recipe": "fp8_recipe", "--fp8-param-gather": "fp8_param",
          "--fp4-format": "fp4", "--fp4-recipe": "fp4_recipe", "--fp4-param-gather": "fp4_param",
          "--first-last-layers-bf16": "first_last_layers_bf16",
          "--num-layers-at-start-in-bf16": "num_layers_at_start_in_bf16",
          "--num-layers-at-end-in-bf16": "num_layers_at_end_in_bf16"}


def _parse(text: str) -> dict:
    toks = shlex.split(text.replace("\\\n", " "))
    toks = toks[toks.index("pretrain_gpt.py") + 1:]
    out, i = {}, 0
    while i < len(toks):
        j = i + 1
        while j < len(toks) and not toks[j].startswith("--"):
            j += 1
        values = toks[i + 1:j]  # a flag's values (nargs '*' flags, e.g. --recompute-modules, take several)
        out[toks[i]] = True if not values else (values[0] if len(values) == 1 else values)
        i = j
    return out


def _configs(a: dict):
    import torch
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.transformer import TransformerConfig

    kw = {}
    for flag, field in FIELDS.items():
        if flag in a:
            v = a[flag]
            kw[field] = v if v is True or isinstance(v, list) else (int(v) if v.isdigit() else v)
    if "moe_aux_loss_coeff" in kw:  # (Megatron-LM's parser: floats, one value a scalar, arguments.py:1031-1034)
        kw["moe_aux_loss_coeff"] = float(kw["moe_aux_loss_coeff"])
    if isinstance(kw.get("recompute_modules"), str):  # one module: still a list (transformer_config.py:411)
        kw["recompute_modules"] = [kw["recompute_modules"]]
    kw["params_dtype"] = torch.bfloat16 if a.get("--bf16") else (torch.float16 if a.get("--fp16") else torch.float32)
    kw["pipeline_dtype"] = kw["params_dtype"]
    kw["add_bias_linear"] = not a.get("--disable-bias-linear")  # Megatron-LM: add_bias_linear = not the flag
    if kw.get("cpu_offloading_num_layers", 0) > 0:  # Megatron-LM core_v0.16.1 arguments.py:1236-1237
        kw["cpu_offloading"] = True
    tc = TransformerConfig(**kw)  # __post_init__: Megatron's split, vpp, recompute, SP checks
    dist = bool(a.get("--use-distributed-optimizer"))
    oc = OptimizerConfig(use_distributed_optimizer=dist, bf16=bool(a.get("--bf16")), fp16=bool(a.get("--fp16")))
    fsdp = {"use_megatron_fsdp": True, "data_parallel_sharding_strategy": a["--data-parallel-sharding-strategy"]} \
        if a.get("--use-megatron-fsdp") else {}
    dc = DistributedDataParallelConfig(use_distributed_optimizer=dist, **fsdp)
    return tc, oc, dc


def test_405b_meta_layout_round_trips():
    spec = load_model("llama-3.1-405b")
    s = Setup(stack="megatron", precision="bf16-master", tp=8, pp=16, dp=128, vpp=4, pp_split="embedding-loss",
              grad_accum=16, seq=8192, batch=1, sequence_parallel=True, recompute="full", zero=1, tp_comm_overlap=True)
    a = _parse(emit("megatron", s, spec, 8))
    tc, oc, dc = _configs(a)
    assert tc.tp_comm_overlap
    assert (tc.tensor_model_parallel_size, tc.pipeline_model_parallel_size, tc.context_parallel_size) == (8, 16, 1)
    assert tc.virtual_pipeline_model_parallel_size == 4 and tc.sequence_parallel
    assert tc.account_for_embedding_in_pipeline_split and tc.account_for_loss_in_pipeline_split
    assert tc.num_layers == 126 and tc.num_query_groups == 8 and tc.bf16
    assert tc.recompute_granularity == "full" and oc.use_distributed_optimizer and dc.use_distributed_optimizer
    assert int(a["--global-batch-size"]) * int(a["--seq-length"]) == 2048 * 8192  # 16M tokens (Llama 3 Table 4)


def test_uneven_split_selective_moe_round_trips():
    spec = load_model("mixtral-8x7b")
    s = Setup(stack="megatron", precision="bf16-master", tp=2, pp=4, dp=8, ep=4, pp_split="first:7,last:7",
              grad_accum=8, seq=4096, batch=1, sequence_parallel=True, recompute="selective", zero=0)
    a = _parse(emit("megatron", s, spec, 8))
    tc, _, _ = _configs(a)
    assert (tc.num_layers_in_first_pipeline_stage, tc.num_layers_in_last_pipeline_stage) == (7, 7)
    assert tc.recompute_granularity == "selective" and tc.expert_model_parallel_size == 4 and tc.num_moe_experts == 8


def test_moe_dispatcher_and_overlap_round_trip():
    """--moe-dispatcher and --overlap-moe-comm build TransformerConfig's dispatcher fields, and its __post_init__
    accepts the overlap with them (transformer_config.py:1852-1884: ep > 1, alltoall/flex, vpp under pp, bf16)."""
    spec = load_model("qwen3-30b-a3b")
    for how in ("alltoall", "allgather", "deepep", "hybridep"):
        s = Setup(stack="megatron", precision="bf16-master", pp=2, vpp=4, dp=16, ep=8, grad_accum=8, seq=4096,
                  zero=1, moe_dispatcher=how, overlap_moe_comm=how != "allgather")
        tc, _, _ = _configs(_parse(emit("megatron", s, spec, 8)))
        assert tc.moe_token_dispatcher_type == ("flex" if how in ("deepep", "hybridep") else how)
        if tc.moe_token_dispatcher_type == "flex":
            assert tc.moe_flex_dispatcher_backend == how
        assert tc.overlap_moe_expert_parallel_comm == (how != "allgather")
    # DeepSeek-V3's node-limited routing: 8 groups, 4 picked (its config's n_group, topk_group)
    v3 = Setup(stack="megatron", precision="bf16-master", pp=2, vpp=2, dp=64, ep=64, grad_accum=8, seq=4096, zero=1,
               moe_dispatcher="deepep", overlap_moe_comm=True)
    tc, _, _ = _configs(_parse(emit("megatron", v3, load_model("deepseek-v3"), 8)))
    assert (tc.moe_router_num_groups, tc.moe_router_group_topk, tc.moe_flex_dispatcher_backend) == (8, 4, "deepep")
    # the default is written too (Megatron-LM's own default, allgather, is not what is modelled)
    plain = Setup(stack="megatron", precision="bf16-master", dp=8, ep=8, seq=4096)
    assert _parse(emit("megatron", plain, spec, 8))["--moe-token-dispatcher-type"] == "alltoall"


def test_te_recipes_round_trip():
    """Each --low-precision recipe under megatron builds TransformerConfig's fp8/fp4 fields (its __post_init__ checks
    the bf16 first/last layers against num_layers / pp); delayed with bf16 layers is refused by both."""

    spec = load_model("llama-3.1-8b")
    base = dict(stack="megatron", precision="bf16-master", dp=8, zero=1, seq=8192, batch=1, grad_accum=16)
    for lp in ("delayed", "tensorwise", "blockwise", "mxfp8"):
        bf16 = dict(bf16_first_layers=1, bf16_last_layers=2) if lp != "delayed" else {}
        tc, _, _ = _configs(_parse(emit("megatron", Setup(**base, low_precision=lp, fp8_all_gather=True, **bf16),
                                        spec, 8)))
        assert (tc.fp8, tc.fp8_recipe, tc.fp8_param, tc.fp4) == ("hybrid", lp, True, None)
        if bf16:
            assert tc.first_last_layers_bf16 and (tc.num_layers_at_start_in_bf16, tc.num_layers_at_end_in_bf16) == (1, 2)
    tc, _, _ = _configs(_parse(emit("megatron", Setup(**base, low_precision="nvfp4", fp8_all_gather=True,
                                                      bf16_first_layers=2, bf16_last_layers=2), spec, 8)))
    assert (tc.fp4, tc.fp4_recipe, tc.fp4_param, tc.fp8) == ("e2m1", "nvfp4", True, None)
    with pytest.raises(ValueError, match="Delayed scaling"):  # Megatron's own check (transformer_config.py:990)
        _configs({"--num-layers": "32", "--hidden-size": "4096", "--num-attention-heads": "32", "--bf16": True,
                  "--fp8-format": "hybrid", "--fp8-recipe": "delayed", "--first-last-layers-bf16": True})
    with pytest.raises(SetupError, match="delayed scaling"):
        validate(Setup(**base, low_precision="delayed", bf16_first_layers=1))


def test_recompute_modules_round_trip():
    """--recompute-modules layernorm,moe_act (C8's) becomes Megatron's list; TransformerConfig's __post_init__
    accepts it (moe_act needs --moe-grouped-gemm: transformer_config.py:1213-1216)."""
    spec = load_model("qwen3-235b-a22b")
    s = Setup(stack="megatron", precision="bf16-master", tp=2, pp=4, dp=4, ep=8, etp=1, grad_accum=8, seq=4096,
              batch=1, sequence_parallel=True, recompute="selective", recompute_modules="layernorm,moe_act", zero=1,
              pp_split="first:22,last:24")
    a = _parse(emit("megatron", s, spec, 8))
    assert a["--recompute-modules"] == ["layernorm", "moe_act"] and a["--recompute-granularity"] == "selective"
    tc, _, _ = _configs(a)
    assert tc.recompute_granularity == "selective" and tc.recompute_modules == ["layernorm", "moe_act"]
    assert tc.moe_grouped_gemm


def test_cuda_graph_scope_round_trips():
    """--cuda-graph-scope moe_router,moe_preprocess (C7's recipe) becomes Megatron's TE graph flags, which
    TransformerConfig's __post_init__ accepts (transformer_config.py:1740-1760: moe_preprocess with moe_router)."""
    spec = load_model("qwen3-30b-a3b")
    s = Setup(stack="megatron", precision="bf16-master", dp=8, ep=8, grad_accum=8, seq=4096, batch=1, zero=1,
              cuda_graph_scope="moe_router,moe_preprocess")
    a = _parse(emit("megatron", s, spec, 8))
    assert a["--cuda-graph-impl"] == "transformer_engine"
    assert a["--cuda-graph-scope"] == ["moe_router", "moe_preprocess"]
    tc, _, _ = _configs(a)
    assert tc.cuda_graph_impl == "transformer_engine" and len(tc.cuda_graph_scope) == 2


def test_layout_and_mtp_round_trip():
    """DeepSeek-V3 on PP 8 with Megatron-Bridge's (8, 2) layout (recipes/deepseek/h100/deepseek_v3.py:59): the
    emitted --pipeline-model-parallel-layout and --mtp-num-layers build TransformerConfig, whose __post_init__
    parses the layout, derives VPP 2 and validates 61 decoder layers and one MTP layer
    (pipeline_parallel_layer_layout.py:85-150); no VPP flag beside the layout (arguments.py:503-514)."""
    spec = load_model("deepseek-v3")
    s = Setup(stack="megatron", precision="bf16-master", tp=2, pp=8, vpp=2, dp=8, ep=8, etp=1, grad_accum=16,
              seq=4096, batch=1, sequence_parallel=True, zero=1, pp_split="Et*4|(t*4|)*14,tmL")
    a = _parse(emit("megatron", s, spec, 8))
    assert a["--mtp-num-layers"] == "1" and "--virtual-pipeline-model-parallel-size" not in a
    tc, _, _ = _configs(a)
    assert tc.virtual_pipeline_model_parallel_size == 2 and tc.mtp_num_layers == 1
    from megatron.core.transformer.enums import LayerType

    # the last rank's second virtual stage: one decoder layer, the MTP layer and the loss (stage 15 = vpp 1, pp 7)
    assert tc.pipeline_model_parallel_layout.layout[7][1] == [LayerType.decoder, LayerType.mtp, LayerType.loss]
    assert not tc.mtp_standalone


def test_megatron_fsdp_round_trips():
    """--zero 2 / 3 write Megatron-FSDP with the sharding strategy Megatron-FSDP itself numbers 2 / 3 (its
    ShardingStrategy IntEnum, fsdp/src/megatron_fsdp/fully_shard.py:41-53), the distributed optimizer and the
    fsdp_dtensor checkpoint format its user guide requires; --zero 1 stays the distributed optimizer alone."""
    from megatron.core.distributed.fsdp.src.megatron_fsdp.fully_shard import ShardingStrategy

    spec = load_model("llama-3.1-8b")
    for zero in (1, 2, 3):
        s = Setup(stack="megatron", precision="bf16-master", dp=8, grad_accum=16, seq=8192, batch=1, zero=zero,
                  recompute="block:5", low_precision="tensorwise", fp8_all_gather=True)
        a = _parse(emit("megatron", s, spec, 8))
        tc, oc, dc = _configs(a)
        assert oc.use_distributed_optimizer and dc.use_distributed_optimizer and tc.fp8_param
        assert dc.use_megatron_fsdp == (zero >= 2)
        if zero >= 2:
            assert ShardingStrategy[dc.data_parallel_sharding_strategy.upper()] == zero
            assert a["--ckpt-format"] == "fsdp_dtensor"
        else:
            assert "--data-parallel-sharding-strategy" not in a


def test_cpu_offloading_round_trips_and_is_refused_as_megatron_refuses():
    """--offload-layers 40 (Megatron-Bridge's GB200 Llama-3.1-70B FP8-CS recipe) becomes --cpu-offloading-num-layers,
    which builds TransformerConfig with cpu_offloading; its __post_init__ and Setup refuse the same things:
    N >= num_layers (transformer_config.py:1137-1142), pipeline parallelism (:1144-1147), recompute (:1149-1152)."""
    import pytest

    from trainfit.analytic.layout import check_stack_model
    from trainfit.errors import SetupError

    spec = load_model("llama-3.1-70b")
    base = dict(stack="megatron", precision="bf16-master", dp=64, zero=3, seq=8192, batch=2, grad_accum=2)
    a = _parse(emit("megatron", Setup(**base, offload_layers=40), spec, 8))
    assert a["--cpu-offloading-num-layers"] == "40"
    tc, _, _ = _configs(a)
    assert tc.cpu_offloading and tc.cpu_offloading_num_layers == 40 and tc.cpu_offloading_activations
    shape = {"--num-layers": "80", "--hidden-size": "8192", "--num-attention-heads": "64", "--bf16": True}
    for extra, match, setup in (
            ({"--cpu-offloading-num-layers": "80"}, "less than 80", dict(offload_layers=80)),
            ({"--cpu-offloading-num-layers": "8", "--pipeline-model-parallel-size": "2"}, "Pipeline parallelism",
             dict(offload_layers=8, pp=2, dp=32)),
            ({"--cpu-offloading-num-layers": "8", "--recompute-granularity": "full", "--recompute-method": "uniform",
              "--recompute-num-layers": "1"}, "recomputation", dict(offload_layers=8, recompute="full"))):
        with pytest.raises(ValueError, match=match):
            _configs({**shape, **extra})
        with pytest.raises(SetupError, match="--offload-layers"):
            s = Setup(**{**base, **setup})
            validate(s)
            check_stack_model(spec, s)


def test_loss_fusion_round_trips_and_is_refused_off_megatron():
    """--loss-fusion te / native (Megatron-Bridge's GPT provider default cross_entropy_loss_fusion True, its Llama
    recipes' impl "te") becomes --cross-entropy-loss-fusion --cross-entropy-fusion-impl, which build
    TransformerConfig's own fields (model_parallel_config.py:241-249); none writes neither (Megatron's default off).
    Other stacks and TE's Triton kernels off CUDA are refused, one line each."""
    import pytest

    from trainfit.errors import SetupError

    spec = load_model("llama-3.1-8b")
    base = dict(stack="megatron", precision="bf16-master", dp=8, zero=1, seq=8192, batch=1, grad_accum=4)
    for impl in ("native", "te"):
        a = _parse(emit("megatron", Setup(**base, loss_fusion=impl), spec, 8))
        tc, _, _ = _configs(a)
        assert tc.cross_entropy_loss_fusion and tc.cross_entropy_fusion_impl == impl
    tc, _, _ = _configs(_parse(emit("megatron", Setup(**base), spec, 8)))
    assert not tc.cross_entropy_loss_fusion
    with pytest.raises(SetupError, match="--loss-fusion is Megatron's fused cross-entropy"):
        validate(Setup(stack="torchtitan", dp=8, zero=3, loss_fusion="te"))
    with pytest.raises(SetupError, match="--loss-fusion te: .*Triton"):
        validate(Setup(stack="megatron", precision="bf16-master", device="cpu", loss_fusion="te"))
    validate(Setup(stack="megatron", precision="bf16-master", device="cpu", loss_fusion="native"))


def test_the_emitted_command_builds_the_planned_architecture(tmp_path):
    """Norms, positions and attention reach megatron.core's configs as the model has them (Megatron-LM's defaults are
    LayerNorm, learned absolute positions, rotary base 10000: without the flags the command built another model)."""
    from megatron.core.transformer import MLATransformerConfig, TransformerConfig

    from trainfit.plan.emit_megatron import check_model

    s = Setup(stack="megatron", precision="bf16-master", tp=1, dp=8, zero=1, seq=4096, batch=1)
    a = _parse(emit("megatron", s, load_model("llama-3.1-8b"), 8))
    assert (a["--normalization"], float(a["--norm-epsilon"])) == ("RMSNorm", 1e-5)
    assert (a["--position-embedding-type"], a["--rotary-base"], a["--rope-scaling-factor"]) == ("rope", "500000", "8")
    assert a["--use-rope-scaling"] is True
    tc = TransformerConfig(num_layers=32, hidden_size=4096, num_attention_heads=32, normalization=a["--normalization"],
                           layernorm_epsilon=float(a["--norm-epsilon"]))
    assert tc.normalization == "RMSNorm"
    assert _parse(emit("megatron", s, load_model("qwen3-30b-a3b"), 8))["--qk-layernorm"] is True
    assert _parse(emit("megatron", s, load_model("qwen2.5-7b"), 8))["--add-qkv-bias"] is True
    # DeepSeek-V3: multi-latent attention with YaRN, three dense layers first (first_k_dense_replace 3)
    v3 = load_model("deepseek-v3")
    d = _parse(emit("megatron", Setup(stack="megatron", precision="bf16-master", pp=16, dp=64, ep=64, zero=1,
                                      seq=4096, batch=1, grad_accum=32), v3, 8))
    freq = eval(d["--moe-layer-freq"])  # (Megatron-LM's moe_freq_type evaluates the same expression)
    assert len(freq) == 61 and freq[:3] == [0, 0, 0] and sum(freq) == 58
    mla = MLATransformerConfig(num_layers=61, hidden_size=7168, num_attention_heads=128,
                               q_lora_rank=int(d["--q-lora-rank"]), kv_lora_rank=int(d["--kv-lora-rank"]),
                               qk_head_dim=int(d["--qk-head-dim"]), qk_pos_emb_head_dim=int(d["--qk-pos-emb-head-dim"]),
                               v_head_dim=int(d["--v-head-dim"]), rope_type=d["--rope-type"],
                               rotary_scaling_factor=float(d["--rotary-scaling-factor"]), moe_layer_freq=freq)
    assert (mla.q_lora_rank, mla.kv_lora_rank, mla.qk_pos_emb_head_dim) == (1536, 512, 64)
    # its router: sigmoid scores with the e_score_correction_bias, the top-k weights × routed_scaling_factor 2.5
    # (the checkpoint's config.json; DeepseekV3TopkRouter, DeepseekV3MoE), not Megatron's default softmax router
    router = TransformerConfig(num_layers=61, hidden_size=7168, num_attention_heads=128, num_moe_experts=256,
                               moe_router_topk=8, moe_router_score_function=d["--moe-router-score-function"],
                               moe_router_enable_expert_bias=d["--moe-router-enable-expert-bias"],
                               moe_router_topk_scaling_factor=float(d["--moe-router-topk-scaling-factor"]))
    config = json.loads((Path(__file__).parents[2] / "src/trainfit/models/catalog/deepseek-v3.json").read_text())
    assert (router.moe_router_score_function, router.moe_router_enable_expert_bias,
            router.moe_router_topk_scaling_factor) == ("sigmoid", True, config["routed_scaling_factor"])
    from trainfit.readers import read

    sh = tmp_path / "v3.sh"
    sh.write_text(emit("megatron", Setup(stack="megatron", precision="bf16-master", pp=16, dp=64, ep=64, zero=1,
                                         seq=4096, batch=1, grad_accum=32), v3, 8))
    assert not [k for k in read(sh).unknown if "router" in k]  # (check reads them as the model's own)
    q = _parse(emit("megatron", s, load_model("qwen3-30b-a3b"), 8))  # (a softmax router, no scaling: the defaults)
    assert not {"--moe-router-score-function", "--moe-router-enable-expert-bias",
                "--moe-router-topk-scaling-factor"} & set(q)
    # what the command would build otherwise is refused in one line, before the search
    for name, what in (("gpt-oss-120b", "attention sinks"), ("mistral-7b", "sliding-window")):
        with pytest.raises(SetupError, match=what):
            check_model(load_model(name))


def test_plan_emit_megatron_searches_megatrons_step(cli):
    """plan --emit megatron without --stack: the hf plans cannot run on Megatron-LM, so the command searches
    Megatron's own step (as --emit torchtitan searches torchtitan's), not the hf stack again ('no plan fits')."""
    code, out, err = cli("plan", "llama-3.1-8b", "--gpu", "H100-80GB", "--gpus", "8", "--seq", "4096", "--emit",
                         "megatron")
    assert code == 0 and "pretrain_gpt.py" in out and "stack megatron:" in err, err


def test_moe_overlap_beside_mtp_is_refused_as_megatron_refuses(cli):
    """Megatron refuses --overlap-moe-expert-parallel-comm beside MTP layers without pipelining, or beside more than
    one (transformer_config.py:1889-1896). The estimate took both (DeepSeek-V3's own MTP layer at pp 1: exit 0); now
    one line, exit 2. plan picked the overlap for DeepSeek-V3 at pp 1 and emitted it beside --mtp-num-layers 1,
    which TransformerConfig rejects; it searches it no more there."""
    argv = ("estimate", "deepseek-v3", "--gpu", "H100-80GB", "--stack", "megatron", "--dp", "64", "--ep", "64",
            "--overlap-moe-comm")
    code, out, err = cli(*argv)
    assert code == 2 and not out and "\n" not in err.strip()
    assert "multi-token-prediction" in err and "--pp > 1" in err and "1889-1896" in err
    assert cli(*argv, "--mtp-layers", "0")[0] == 0
    code, out, err = cli("estimate", "tiny-deepseek", "--gpu", "H100-80GB", "--stack", "megatron", "--dp", "2",
                         "--pp", "2", "--vpp", "2", "--pp-split", "Et|t|t|mmL", "--mtp-layers", "2", "--ep", "2",
                         "--grad-accum", "4", "--overlap-moe-comm")
    assert code == 2 and "at most, not 2" in err
    code, out, err = cli("plan", "deepseek-v3", "--gpu", "H100-80GB", "--gpus", "1024", "--seq", "4096",
                         "--global-batch-tokens", "16M", "--stack", "megatron", "--pp", "1", "--recompute", "selective",
                         "--emit", "megatron")
    assert code == 0, err
    a = _parse(out)
    assert a["--pipeline-model-parallel-size"] == "1" and a["--mtp-num-layers"] == "1"
    assert "--overlap-moe-expert-parallel-comm" not in a
    # Megatron's own check on the combination (TransformerConfig.__post_init__)
    s = Setup(stack="megatron", precision="bf16-master", dp=8, ep=8, seq=4096, zero=1, overlap_moe_comm=True,
              mtp_layers=1)
    with pytest.raises(AssertionError, match="MTP layer"):
        _configs(_parse(emit("megatron", s, load_model("qwen3-30b-a3b"), 8)))


def test_moe_command_runs_the_fused_router_and_permutation_it_was_timed_with(tmp_path):
    """The megatron stack times TopKRouter's fused kernels and TE's fused permutation (stacks/megatron.toml [moe],
    as Megatron-Bridge's MoE recipes set them), but megatron-core 0.16.1 defaults both off (TransformerConfig
    moe_permute_fusion, moe_router_fusion: transformer_config.py:708, :711), so the emitted pretrain_gpt.py ran the
    unfused kernels. Now it says both; check reads them as modelled, and lists their absence as more time."""
    from dataclasses import fields

    from megatron.core.transformer import TransformerConfig

    from trainfit.readers import read

    defaults = {f.name: f.default for f in fields(TransformerConfig)}
    assert defaults["moe_permute_fusion"] is False and defaults["moe_router_fusion"] is False
    s = Setup(stack="megatron", precision="bf16-master", dp=8, ep=8, seq=4096, zero=1)
    text = emit("megatron", s, load_model("qwen3-30b-a3b"), 8)
    a = _parse(text)
    assert a["--moe-router-fusion"] is True and a["--moe-permute-fusion"] is True
    sh = tmp_path / "run.sh"
    sh.write_text(text)
    r = read(sh)
    assert not [k for k in r.unknown if "fusion" in k] and not [n for n in r.not_modelled if "-fusion" in n]
    sh.write_text(text.replace(" \\\n    --moe-router-fusion", "").replace(" \\\n    --moe-permute-fusion", ""))
    r = read(sh)
    assert sum(n.startswith("--moe-") and "more time: the unfused" in n for n in r.not_modelled) == 2, r.not_modelled


def test_moe_command_runs_the_load_balancing_loss_it_was_timed_with(monkeypatch, tmp_path):
    """The megatron stack times the router's load-balancing loss (stacks/megatron.toml [moe] aux_loss, ops/
    megatron_moe.py router_ops), but megatron-core 0.16.1's default coefficient is 0.0 (transformer_config.py:659),
    under which TopKRouter runs none of its kernels (router.py:253-273, :598): the emitted command trained without it.
    Now it writes the type of the same table and the model's coefficient (its config's, else the table's), per
    router, and Megatron's own TopKRouter, built from the emitted flags, runs the loss with that coefficient: the
    switch loss for Qwen3 and Mixtral, the per-sequence loss for DeepSeek's gates, at the smaller coefficient beside
    DeepSeek-V3's expert bias."""
    import torch
    from megatron.core.transformer.moe.router import TopKRouter

    from trainfit.readers import read

    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")  # (the expert bias's buffers: router.py:163-180)
    groups = SimpleNamespace(tp=None, cp=None, tp_cp=None, tp_dp_cp=None)
    s = Setup(stack="megatron", precision="bf16-master", dp=8, ep=8, seq=4096, zero=1)
    moe = s.stack_facts.facts["moe"]
    assert moe["aux_loss"]  # (what Shape.moe_aux_loss reads: ops/shape.py)
    for name, kind, coeff in (("qwen3-30b-a3b", "aux_loss", moe["aux_loss_coeff"]),
                              # the model's own, from its config.json (Megatron-Bridge's conversion maps it):
                              # Mistral's published Mixtral-8x7B config sets router_aux_loss_coef 0.02
                              ("mixtral-8x7b", "aux_loss", 0.02),
                              ("deepseek-v2-lite", "seq_aux_loss", moe["aux_loss_coeff"]),
                              ("deepseek-v3", "seq_aux_loss", moe["expert_bias_aux_loss_coeff"])):
        text = emit("megatron", s, load_model(name), 8)
        tc, _, _ = _configs(_parse(text))
        router = TopKRouter(tc, groups)
        assert router.is_aux_loss_enabled() and router.get_aux_loss_coeff(kind) == coeff > 0, name
        assert (router.expert_bias is not None) == (name == "deepseek-v3")
        sh = tmp_path / "run.sh"
        sh.write_text(text)
        assert not [n for n in read(sh).not_modelled if "load-balancing" in n or "aux-loss" in n], name
    # Megatron's defaults, the command as it was: no loss, which check lists as less time than estimated
    bare = {k: v for k, v in _parse(text).items() if k not in ("--moe-router-load-balancing-type",
                                                                 "--moe-aux-loss-coeff")}
    assert not TopKRouter(_configs(bare)[0], groups).is_aux_loss_enabled()
    sh.write_text(text.replace(" \\\n    --moe-router-load-balancing-type seq_aux_loss", "")
                  .replace(" \\\n    --moe-aux-loss-coeff 0.0001", ""))
    assert [n for n in read(sh).not_modelled if n.startswith("--moe-aux-loss-coeff = '0'")], read(sh).not_modelled


def test_shared_expert_gate_is_built_as_timed():
    """Qwen1.5-MoE's shared expert has a sigmoid gate, which the megatron stack times (ops/megatron_moe.py
    shared_expert_gate); megatron-core builds it only with moe_shared_expert_gate (transformer_config.py:546,
    shared_experts.py:128-131), off by default: the emitted command now says it, and only for a gated model."""
    s = Setup(stack="megatron", precision="bf16-master", dp=8, ep=4, seq=4096, zero=1)
    tc, _, _ = _configs(_parse(emit("megatron", s, load_model("qwen1.5-moe-a2.7b"), 8)))
    assert tc.moe_shared_expert_gate and tc.moe_shared_expert_intermediate_size
    tc, _, _ = _configs(_parse(emit("megatron", s, load_model("deepseek-v2-lite"), 8)))
    assert not tc.moe_shared_expert_gate and tc.moe_shared_expert_intermediate_size


@pytest.mark.parametrize("name", ["qwen1.5-moe-a2.7b", "qwen3-30b-a3b", "mixtral-8x7b", "deepseek-v2-lite"])
def test_router_weights_are_the_models_own(name):
    """The emitted router weighs each token's experts as the model does: Megatron's own top-k routing
    (moe_utils.topk_routing_with_score_function, with the emitted config's pre-softmax and score function) against
    the model's rule written from transformers (Qwen2MoeSparseMoeBlock / Qwen3MoeSparseMoeBlock: softmax over every
    expert, top-k, renormalised only under norm_topk_prob; MixtralSparseMoeBlock: always renormalised;
    DeepseekV2's router: softmax, top-k, never renormalised) on the same random logits. Qwen1.5-MoE and
    DeepSeek-V2-Lite were once emitted without --moe-router-pre-softmax: Megatron renormalised their weights."""
    import torch
    from megatron.core.transformer.moe.moe_utils import topk_routing_with_score_function

    spec = load_model(name)
    s = Setup(stack="megatron", precision="bf16-master", dp=8, ep=4, seq=4096, zero=1)
    tc, _, _ = _configs(_parse(emit("megatron", s, spec, 8)))
    logits = torch.randn(64, spec.moe.num_experts, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    probs, _ = topk_routing_with_score_function(
        logits, tc.moe_router_topk, use_pre_softmax=tc.moe_router_pre_softmax,
        score_function=tc.moe_router_score_function)
    full = torch.softmax(logits, dim=-1)
    top, index = torch.topk(full, spec.moe.top_k, dim=-1)
    renormalised = {"qwen1.5-moe-a2.7b": False, "qwen3-30b-a3b": True, "mixtral-8x7b": True,
                    "deepseek-v2-lite": False}[name]  # (the models' configs: norm_topk_prob; Mixtral's always)
    want = top / top.sum(-1, keepdim=True) if renormalised else top
    expected = torch.zeros_like(full).scatter(1, index, want)
    torch.testing.assert_close(probs.to(torch.float64), expected)


def test_gpt_oss_router_runs_no_load_balancing_loss():
    """Megatron-Bridge's GPT-OSS provider sets moe_router_load_balancing_type "none" (Megatron-Bridge v0.2.0
    src/megatron/bridge/models/gpt_oss/gpt_oss_provider.py:75), so its TopKRouter runs none of the loss's kernels
    (megatron-core 0.16.1 router.py:253-273, :598): the op list the megatron stack times has no aux-loss ops for
    gpt-oss (they were timed: 0.519 s a step of gpt-oss-120b at EP 8 on B200s, now 0.507 s), and keeps them for the
    providers that run the loss (Qwen3-MoE); the emitted command writes the loss only where it is timed."""
    from trainfit.analytic.ops.megatron_moe import router_ops
    from trainfit.analytic.ops.shape import shape_of
    from trainfit.analytic.precision import state_bytes

    s = Setup(stack="megatron", precision="bf16-master", dp=8, ep=8, seq=4096, zero=1)
    for name, runs in (("gpt-oss-120b", False), ("qwen3-30b-a3b", True)):
        spec = load_model(name)
        names = {op.name for op in router_ops(spec, shape_of(spec, s, state_bytes(s), "bf16"))}
        assert ("router_aux_loss" in names) == runs, (name, names)
    assert "--moe-aux-loss-coeff" in emit("megatron", s, load_model("qwen3-30b-a3b"), 8)


def test_a_config_without_the_loss_runs_none():
    """A model whose config.json sets its load-balancing coefficient to 0 (router_aux_loss_coef: Megatron-Bridge's
    conversion maps it to moe_aux_loss_coeff, v0.6.0 model_bridge.py:465-466) trains without the loss: megatron-core's
    TopKRouter runs none of its kernels at 0 (router.py:253-273), so neither the timed op list nor the command has
    it; the catalog's Mixtral (0.02) keeps both."""
    from trainfit.analytic.ops.megatron_moe import router_ops
    from trainfit.analytic.ops.shape import shape_of
    from trainfit.analytic.precision import state_bytes
    from trainfit.models.hf_config import spec_from_config

    s = Setup(stack="megatron", precision="bf16-master", dp=8, ep=8, seq=4096, zero=1)
    mixtral = load_model("mixtral-8x7b")
    off = spec_from_config({**mixtral.config, "router_aux_loss_coef": 0.0}, "mixtral-no-aux")
    for spec, runs in ((mixtral, True), (off, False)):
        names = {op.name for op in router_ops(spec, shape_of(spec, s, state_bytes(s), "bf16"))}
        assert ("router_aux_loss" in names) == runs
        assert ("--moe-aux-loss-coeff" in emit("megatron", s, spec, 8)) == runs
    with pytest.raises(ConfigError, match="'router_aux_loss_coef' must be a number >= 0"):
        spec_from_config({**mixtral.config, "router_aux_loss_coef": -0.1}, "mixtral-bad")
