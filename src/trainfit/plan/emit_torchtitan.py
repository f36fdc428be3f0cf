"""torchtitan's job-config TOML of a plan, and the torchrun command line that launches torchtitan with its keys as
overrides: torchtitan 0.2.2's JobConfig (torchtitan/config/job_config.py; every key cites its line, and
tests/plan/test_emit_torchtitan.py parses the file with torchtitan's own ConfigManager)."""
from __future__ import annotations

import json
import math

from ..analytic.torchao_recipes import MX_RECIPES, filter_fqns
from ..errors import SetupError
from ..setup import Setup
from ..spec import ModelSpec
from ..stacks import get_stack


# the stack whose step the job config (and the torchrun line) runs
STACK = "torchtitan"
PRECISIONS = get_stack("torchtitan").precisions  # the job config's training.dtype / mixed_precision_param


def supports(s: Setup) -> str | None:
    """None when torchtitan (its job config, or the torchrun command line) runs plan `s` of the torchtitan stack
    (emit.supports holds the plan to it), else why not."""
    why = get_stack("torchtitan").runs_layout(s.dp, s.tp, s.pp, s.zero, s.precision)
    if why:
        return why
    if s.precision not in PRECISIONS:
        return f"torchtitan runs {', '.join(PRECISIONS)}, not {s.precision}"
    if getattr(s, "low_precision", "none") == "nvfp4":  # (stacks/torchtitan.toml [releases."2026-08"])
        return ("torchtitan's NVFP4 converter is in its 2026-08 main, whose jobs are Python config functions "
                "(models/llama3/config_registry.py:229-249 llama3_8b_first_85_pct_layers_nvfp4, run with --module "
                "llama3 --config ...), not the 0.2.2 job-config TOML emitted here")
    if s.seq % (2 * s.tp * s.cp):  # parallelize.py:69-74, parallel_dims.py:365-372 (seq_len_divisor = tp * 2 * cp)
        return f"torchtitan needs --seq divisible by 2 × tp × cp = {2 * s.tp * s.cp}"
    return None


def torchtitan_ffn(shape: dict) -> int:
    """The FFN width torchtitan builds for a flavor (models/llama3/model/model.py:332-336, hidden_dim = 4·dim)."""
    hidden = int(2 * (4 * shape["dim"]) / 3)
    if shape.get("ffn_dim_multiplier") is not None:
        hidden = int(shape["ffn_dim_multiplier"] * hidden)
    m = shape.get("multiple_of", 256)
    return m * ((hidden + m - 1) // m)


def torchtitan_moe_flavor(spec: ModelSpec) -> tuple[str, str, dict] | None:
    """(model name, flavor, shape) of the torchtitan MoE model (stacks/torchtitan.toml [moe_models]: deepseek_v3,
    qwen3) whose width, depth, heads, vocabulary, expert width, expert count and top-k equal `spec`'s, else None."""
    facts = get_stack("torchtitan").facts.get("moe_models", {})
    if spec.moe is None or spec.family not in facts.get("families", ()):
        return None
    key = (spec.hidden, spec.layers, spec.heads, spec.vocab, spec.moe.expert_intermediate, spec.moe.num_experts,
           spec.moe.top_k)
    for name, flavors in facts.items():
        for flavor, shape in flavors.items() if isinstance(flavors, dict) else ():
            if isinstance(shape, dict) and key == (shape["dim"], shape["n_layers"], shape["n_heads"],
                                                   shape["vocab_size"], shape["moe_inter_dim"], shape["num_experts"],
                                                   shape["top_k"]):
                return name, flavor, shape
    return None


def torchtitan_flavor(spec: ModelSpec) -> tuple[str, str, dict] | None:
    """(model name, flavor, shape) of the torchtitan registry model whose shape equals `spec`'s, else None.
    torchtitan builds models from its registry only (stacks/torchtitan.toml [models]): Llama blocks with RMSNorm,
    SwiGLU, RoPE, untied embeddings and no biases; and its MoE models ([moe_models], torchtitan_moe_flavor)."""
    if spec.moe is not None:
        return torchtitan_moe_flavor(spec)
    if (not spec.causal or spec.moe is not None or not spec.gated_mlp or spec.norm != "rmsnorm"
            or spec.positions != "rotary" or spec.tied_embeddings or spec.qkv_bias or spec.out_bias or spec.mlp_bias
            or spec.qk_norm or spec.parallel_residual or spec.norms_per_layer != 2 or spec.sliding_window
            or spec.embed_proj_dim or spec.activation not in ("silu", "swish")):
        return None
    for name, flavors in get_stack("torchtitan").models().items():
        for flavor, shape in flavors.items():
            kv = shape.get("n_kv_heads", shape["n_heads"])
            if (spec.hidden, spec.layers, spec.heads, spec.kv_heads, spec.vocab, spec.intermediate, spec.head_dim) \
                    == (shape["dim"], shape["n_layers"], shape["n_heads"], kv, shape.get("vocab_size", 128256),
                        torchtitan_ffn(shape), shape["dim"] // shape["n_heads"]):
                return name, flavor, shape
    return None


def torchtitan_flavor_or_error(spec: ModelSpec, engine: str = "torchtitan") -> tuple[str, str, dict]:
    got = torchtitan_flavor(spec)
    if got is None:
        moe = get_stack("torchtitan").facts.get("moe_models", {})
        names = ", ".join([f"{n} {f}" for n, fl in get_stack("torchtitan").models().items() for f in fl]
                          + [f"{n} {f}" for n, fl in moe.items() if isinstance(fl, dict) for f, shape in fl.items()
                             if isinstance(shape, dict)])
        raise SetupError(f"--emit {engine}: torchtitan builds only its registry's models ({names}; "
                         f"torchtitan/models/llama3, deepseek_v3, qwen3, llama4, gpt_oss __init__.py) and {spec.name} "
                         "has the shape of none of them")
    return got


def torchtitan_sections(s: Setup, spec: ModelSpec, tokens: float | None = None, need_model: bool = True) -> dict:
    """The job config of plan `s` as {section: {key: value}}: the keys of torchtitan 0.2.2's JobConfig
    (config/job_config.py, line numbers in TORCHTITAN_KEYS) that the layout sets. Without a registry flavor of
    the model's shape: an error, or (need_model=False) no [model] section."""
    found = torchtitan_flavor_or_error(spec) if need_model else torchtitan_flavor(spec)
    dtype, param = {"amp-bf16": ("float32", "bfloat16"), "bf16": ("bfloat16", "bfloat16"),
                    "fp32": ("float32", "float32")}[s.precision]
    training = {"seq_len": s.seq, "dtype": dtype, "mixed_precision_param": param, "mixed_precision_reduce": "float32"}
    if s.pp > 1:  # one local batch = the 1F1B schedule's grad_accum micro-batches (pipeline_parallel.py:186-199)
        training.update(local_batch_size=s.batch * s.grad_accum, global_batch_size=s.batch * s.grad_accum * s.dp)
    else:  # train.py:196-215: accumulation steps = global / (local × data-parallel degree)
        training.update(local_batch_size=s.batch, global_batch_size=s.batch * s.grad_accum * s.dp)
    if tokens:
        training["steps"] = max(1, math.ceil(tokens / s.tokens_per_step))
    if s.offload_state == "params":  # FSDP2's CPUOffloadPolicy (stacks/torchtitan.toml [cpu_offload])
        training["enable_cpu_offload"] = True
    shard = s.dp if s.zero >= 2 else 1
    replicate = s.dp if s.zero == 0 else 1
    parallelism = {"data_parallel_replicate_degree": replicate, "data_parallel_shard_degree": shard,
                   "tensor_parallel_degree": s.tp, "pipeline_parallel_degree": s.pp,
                   "context_parallel_degree": s.cp}
    if s.tp_comm_overlap:  # async TP (stacks/torchtitan.toml [tp_comm_overlap])
        parallelism["enable_async_tensor_parallel"] = True
    if s.ep > 1:  # the routed experts over ep ranks borrowed from dp_shard (× tp with etp 1): parallel_dims.py:136-158
        parallelism.update(expert_parallel_degree=s.ep, expert_tensor_parallel_degree=s.expert_tp)
        if s.moe_dispatcher == "deepep":  # DeepEP's dispatch and combine (stacks/torchtitan.toml [expert_dispatch])
            parallelism["expert_parallel_comm_backend"] = "deepep"
    if s.zero >= 2 and (shard > 1 or s.cp > 1):  # FSDP over dp_shard × cp (parallel_dims.py:333-335 fsdp_enabled)
        # ZeRO-3: "default" reshards every block after its forward but not [norm, output] (the stack fact
        # fsdp.reshard_last = false) — unless pipelining, where "default" means never (parallelize.py:319-327)
        parallelism["fsdp_reshard_after_forward"] = ("default" if s.pp == 1 else "always") if s.zero == 3 else "never"
    if s.pp > 1:  # 1F1B over grad_accum micro-batches of `batch`, layers split evenly as trainfit models them
        parallelism.update(pipeline_parallel_schedule="1F1B", pipeline_parallel_microbatch_size=s.batch,
                           pipeline_parallel_first_stage_less_layers=0, pipeline_parallel_last_stage_less_layers=0)
    if s.recompute == "none":
        ac = {"mode": "none"}
    elif s.recompute == "full":
        ac = {"mode": "full"}
    elif s.recompute == "op":
        ac = {"mode": "selective", "selective_ac_option": "op"}
    else:  # layer:N
        ac = {"mode": "selective", "selective_ac_option": s.recompute.split(":", 1)[1]}
    out = {
        "job": {"description": f"trainfit plan: {spec.name}, dp {s.dp} x tp {s.tp} x pp {s.pp}"
                               f"{f' x cp {s.cp}' if s.cp > 1 else ''}"
                               f"{f' (ep {s.ep})' if s.ep > 1 else ''}, ZeRO-{s.zero}, "
                               f"{s.recompute} recompute, {s.precision}"},
        "model": {"name": found[0], "flavor": found[1], "hf_assets_path": found[2]["hf_assets_path"]} if found else None,
        "optimizer": {"name": {"adam": "Adam", "adamw": "AdamW"}[s.optimizer], "implementation": s.optimizer_kernel},
        "training": training,
        "parallelism": parallelism,
        "activation_checkpoint": ac,
        # torch.compile as the plan models it (analytic/compile_effects.py): per block and the loss, or
        # (--compile-loss) the loss alone
        "compile": ({"enable": True, "components": ["loss"]} if getattr(s, "compile_loss", False)
                    else {"enable": bool(getattr(s, "compile", False))}),
        **quantize_sections(s, spec),
    }
    if out["model"] is None and "quantize_converter" in out:
        out["model"] = {}
    if "quantize_converter" in out:  # the converter named on [model] (config/job_config.py:118)
        out["model"]["converters"] = [out.pop("quantize_converter")]
    return {k: v for k, v in out.items() if v is not None}


def quantize_sections(s: Setup, spec: ModelSpec) -> dict:
    """--low-precision as torchtitan's converter config: [quantize.linear.float8] (tensorwise without recipe_name:
    the only path that takes enable_fsdp_float8_all_gather, components/quantization/float8.py:65-99; rowwise,
    rowwise_with_gw_hp by recipe_name) or [quantize.linear.mx] (mxfp8: recipe mxfp8_cublas, or mxfp8_cublas_rceil
    under --mx-scale rceil). filter_fqns: the LM
    head ("output", as trainfit models it: float8's default list is empty, job_config.py:741) and the
    --bf16-first/last-layers as "layers.<i>." (a substring match: components/quantization/utils.py:24-25)."""
    lp = getattr(s, "low_precision", "none")
    if lp == "none":
        return {}
    fqns = filter_fqns(s, spec.layers)  # (a plan with a recipe is a torchtitan one: Setup refuses it elsewhere)
    if lp == "mxfp8":
        name = next(k for k, v in MX_RECIPES.items() if v == getattr(s, "mx_scale", "floor"))
        return {"quantize_converter": "quantize.linear.mx",
                "quantize.linear.mx": {"recipe_name": name, "filter_fqns": fqns}}
    keys: dict = {"filter_fqns": fqns}
    if lp == "tensorwise":
        keys.update(enable_fsdp_float8_all_gather=bool(s.fp8_all_gather),
                    precompute_float8_dynamic_scale_for_fsdp=bool(s.fp8_all_gather))
    else:
        keys["recipe_name"] = lp
    return {"quantize_converter": "quantize.linear.float8", "quantize.linear.float8": keys}


# Where each emitted key is declared and what it means in torchtitan 0.2.2 (file:line inside the wheel).
TORCHTITAN_KEYS = {
    "job.description": "config/job_config.py:25",
    "model.name": "config/job_config.py:101; protocols/train_spec.py (get_train_spec by name)",
    "model.flavor": "config/job_config.py:104; train.py:138 (train_spec.model_args[flavor]); models/llama3/__init__.py:29-100, deepseek_v3/__init__.py:29-157, qwen3/__init__.py:33-191",
    "model.hf_assets_path": "config/job_config.py:107 (tokenizer and HF assets folder)",
    "optimizer.name": "config/job_config.py:135; components/optimizer.py:314-320 (Adam, AdamW)",
    "optimizer.implementation": "config/job_config.py:151; components/optimizer.py:299-311 (fused / foreach flags)",
    "training.local_batch_size": "config/job_config.py:253 (per-device batch); distributed/pipeline_parallel.py:186-194 (split into micro-batches under PP)",
    "training.global_batch_size": "config/job_config.py:256; train.py:196-215 (gradient accumulation steps = global / (local × dp))",
    "training.seq_len": "config/job_config.py:261",
    "training.steps": "config/job_config.py:267",
    "training.dtype": "config/job_config.py:275 (bfloat16 = params, grads and optimizer states in bf16)",
    "training.mixed_precision_param": "config/job_config.py:282; models/llama3/infra/parallelize.py:125-140 (FSDP2 MixedPrecisionPolicy), distributed/utils.py maybe_enable_amp (autocast without FSDP)",
    "training.mixed_precision_reduce": "config/job_config.py:290",
    "training.enable_cpu_offload": "config/job_config.py:270; models/llama3/infra/parallelize.py:315-317 (CPUOffloadPolicy)",
    "parallelism.data_parallel_replicate_degree": "config/job_config.py:313; models/llama3/infra/parallelize.py:125-151 (HSDP with shard > 1, else DDP)",
    "parallelism.data_parallel_shard_degree": "config/job_config.py:324 (FSDP degree; -1 = leftover ranks)",
    "parallelism.fsdp_reshard_after_forward": "config/job_config.py:336; models/llama3/infra/parallelize.py:319-357",
    "parallelism.tensor_parallel_degree": "config/job_config.py:351; models/llama3/infra/parallelize.py:76-94 (apply_tp, sequence parallel norms)",
    "parallelism.enable_async_tensor_parallel": "config/job_config.py:357; distributed/tensor_parallel.py:16-25 (compile required)",
    "parallelism.pipeline_parallel_degree": "config/job_config.py:360",
    "parallelism.pipeline_parallel_schedule": "config/job_config.py:396",
    "parallelism.pipeline_parallel_microbatch_size": "config/job_config.py:412; distributed/pipeline_parallel.py:186-194",
    "parallelism.pipeline_parallel_first_stage_less_layers": "config/job_config.py:377; distributed/pipeline_parallel.py:65-66",
    "parallelism.pipeline_parallel_last_stage_less_layers": "config/job_config.py:383",
    "parallelism.context_parallel_degree": "config/job_config.py:428; distributed/parallel_dims.py:137 (FSDP over dp_shard × cp), models/llama3/infra/parallelize.py:99-105 (ring attention in every block; rotate method: torch's default all-gather in training)",
    "parallelism.expert_parallel_degree": "config/job_config.py:454; distributed/parallel_dims.py:136-158 (ep carved from dp_shard × cp × tp)",
    "parallelism.expert_tensor_parallel_degree": "config/job_config.py:464 (1 or tp; parallel_dims.py:58-59)",
    "parallelism.expert_parallel_comm_backend": "config/job_config.py:474 (standard or deepep; models/deepseek_v3/model/"
                                                "args.py:116, infra/parallelize.py:99-133)",
    "activation_checkpoint.mode": "config/job_config.py:652; distributed/activation_checkpoint.py:159-191",
    "activation_checkpoint.selective_ac_option": "config/job_config.py:655; distributed/activation_checkpoint.py:27-50 (every N-th block), 52-137 (op: per-op SAC)",
    "compile.enable": "config/job_config.py:722",
    "compile.components": "config/job_config.py:725; components/loss.py:33-35 (the loss compiled when listed)",
    "model.converters": "config/job_config.py:118; components/quantization/float8.py:238, mx.py:171 (the converters' names)",
    "quantize.linear.float8.enable_fsdp_float8_all_gather": "config/job_config.py:732; components/quantization/float8.py:87-94",
    "quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp": "config/job_config.py:735; components/quantization/float8.py:95-99,162-173",
    "quantize.linear.float8.recipe_name": "config/job_config.py:738; components/quantization/float8.py:65-84 (torchao Float8LinearConfig.from_recipe_name)",
    "quantize.linear.float8.filter_fqns": "config/job_config.py:741; components/quantization/utils.py:10-27 (substring match, dims divisible by 16)",
    "quantize.linear.mx.recipe_name": "config/job_config.py:777; components/quantization/mx.py:61 (torchao MXLinearConfig.from_recipe_name)",
    "quantize.linear.mx.filter_fqns": "config/job_config.py:784; components/quantization/mx.py:65,85-89",
}


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return json.dumps(str(v))  # a TOML basic string is a JSON string


def torchtitan_toml(s: Setup, spec: ModelSpec, tokens: float | None = None) -> str:
    """The torchtitan job config TOML of plan `s` (`torchrun ... -m torchtitan.train --job.config_file plan.toml`),
    each key with where torchtitan defines it."""
    lines = [f"# torchtitan 0.2.2 job config written by `trainfit plan` for {spec.name}",
             f"# plan: micro-batch {s.batch} x accumulation {s.grad_accum} x dp {s.dp} = {s.tokens_per_step:,} tokens "
             f"per step; stack torchtitan; every key's meaning: torchtitan/<file:line> beside it"]
    for section, keys in torchtitan_sections(s, spec, tokens).items():
        lines += ["", f"[{section}]"]
        for k, v in keys.items():
            lines.append(f"{k} = {_toml_value(v)}  # {TORCHTITAN_KEYS[f'{section}.{k}']}")
    return "\n".join(lines) + "\n"


def write(s: Setup, spec: ModelSpec, gpus_per_node: int, tokens: float | None = None) -> str:
    return torchtitan_toml(s, spec, tokens)
