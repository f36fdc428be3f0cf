"""TRL's SFTConfig / GRPOConfig / DPOConfig as a JSON or YAML file, parsed by TRL's own classes (trl 1.16.0
trainer/{sft,grpo,dpo}_config.py, each a TrainingArguments subclass through _BaseConfig, base_config.py:21) with
transformers' HfArgumentParser, their __post_init__ checks included (GRPO's generation batch in whole prompt groups,
grpo_config.py:1131). The TrainingArguments fields map as in hf_args.py, with TRL's defaults: gradient_checkpointing
True (base_config.py:62) and bf16 unless fp16 (base_config.py:108). Which trainer: the file's keys (kind())."""
from __future__ import annotations

from pathlib import Path

from ..errors import SetupError
from . import Reading
from .hf_args import _load, apply, leftovers, parse

# Keys only one trainer's config has (trl 1.16.0): GRPO's generation, DPO's preference loss, SFT's dataset shaping
# (not use_liger_kernel: a TrainingArguments field, transformers 5.24 training_args.py:957, read by hf_args.py).
GRPO_KEYS = {"num_generations", "max_completion_length", "use_vllm", "vllm_mode", "steps_per_generation",
             "generation_batch_size", "num_iterations", "vllm_gpu_memory_utilization", "reward_weights"}
DPO_KEYS = {"beta", "precompute_ref_log_probs", "precompute_ref_batch_size", "f_divergence_type", "ld_alpha",
            "label_smoothing", "use_weighting", "discopop_tau", "loss_weights"}
SFT_KEYS = {"packing", "packing_strategy", "padding_free", "dataset_text_field", "completion_only_loss",
            "assistant_only_loss", "max_length", "max_seq_length", "activation_offloading"}

# Keys of any TRL config without an effect on a step's memory or time (data preparation, loss coefficients,
# sampling parameters, logging, the vLLM server's address)
NO_EFFECT = ("trust_remote_code", "chat_template_path", "dataset_kwargs", "dataset_num_proc",
             "eos_token", "pad_token", "truncation_mode", "shuffle_dataset", "pad_to_multiple_of", "eval_packing",
             "completion_only_loss", "assistant_only_loss", "router_aux_loss_coef", "disable_dropout",
             "num_generations_eval", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
             "generation_kwargs", "chat_template_kwargs", "vllm_model_impl", "vllm_structured_outputs_regex",
             "vllm_server_base_url", "vllm_server_host", "vllm_server_port", "vllm_server_timeout", "vllm_group_port",
             "epsilon", "epsilon_high", "delta", "sapo_temperature_neg", "sapo_temperature_pos", "vespo_k_pos",
             "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg", "importance_sampling_level", "reward_weights",
             "multi_objective_aggregation", "scale_rewards", "loss_type", "mask_truncated_completions",
             "sync_ref_model", "ref_model_mixup_alpha", "ref_model_sync_steps", "top_entropy_quantile",
             "entropy_coef", "use_adaptive_entropy", "entropy_coef_min", "entropy_coef_max", "entropy_coef_delta",
             "entropy_target", "vllm_importance_sampling_correction", "vllm_importance_sampling_mode",
             "vllm_importance_sampling_clip_max", "vllm_importance_sampling_clip_min", "vllm_importance_sampling_cap",
             "off_policy_mask_threshold", "use_bias_correction_kl", "log_completions", "log_multimodal",
             "num_completions_to_print", "log_unique_prompts", "log_completions_hub_repo", "loss_weights", "ld_alpha",
             "f_divergence_type", "f_alpha_divergence_coef", "label_smoothing", "use_weighting", "discopop_tau",
             "beta", "precompute_ref_batch_size", "packing_strategy", "lr_scheduler_kwargs",
             "torch_empty_cache_steps")
EFFECT = {
    "activation_offloading": "less GPU memory, more host memory and PCIe time: saved activations to the host "
                             "(sft_config.py:291)",
    "padding_free": "less memory and time: no padding tokens (sft_config.py:238); --doc-len models the per-document "
                    "attention",
    "packing": "less attention time: each document attends within itself (sft_config.py:222, padding-free under "
               "bfd); give --doc-len D, your dataset's token-weighted mean document length",
    "num_iterations": "more time: each generation batch trained num_iterations times, the old log-probs scored "
                      "first (grpo_config.py:689)",
    "cache_implementation": "memory of transformers' generate KV cache (static/paged layouts)",
    "use_transformers_continuous_batching": "less generation memory: a paged KV cache (grpo_config.py:1022)",
    "transformers_continuous_batching_config": "generation memory of the paged KV cache",
    "use_transformers_paged": "less generation memory: a paged KV cache",
    "vllm_max_model_length": "the colocated engine's KV-cache layout within --vllm-gpu-memory-utilization",
    "max_tool_calling_iterations": "more time: generation continued after tool calls",
    "precompute_ref_log_probs": "less memory: the reference log-probs computed before training, no reference "
                                "model kept (dpo_trainer.py:908-914)",
}
MAPPED = ("max_length", "use_liger_kernel", "num_generations", "max_completion_length",
          "generation_batch_size", "steps_per_generation", "use_vllm", "vllm_mode", "vllm_gpu_memory_utilization",
          "vllm_tensor_parallel_size", "vllm_enable_sleep_mode")


def kind(raw: dict) -> str | None:
    """grpo, dpo or sft when `raw` has keys only that TRL config has, else None (plain TrainingArguments)."""
    keys = set(raw)
    if keys & GRPO_KEYS:
        return "grpo"
    if keys & DPO_KEYS:
        return "dpo"
    if keys & SFT_KEYS:
        return "sft"
    return None


def _classes():
    try:
        import trl
        from trl import DPOConfig, GRPOConfig, SFTConfig
    except ImportError:
        raise SetupError("reading a TRL config needs trl: pip install trl (or trainfit[test])") from None
    return trl.__version__, {"sft": SFTConfig, "grpo": GRPOConfig, "dpo": DPOConfig}


def read(path: Path, text: str, dp: int | None = None) -> Reading:
    raw = _load(path, text)
    if "max_seq_length" in raw:
        raise SetupError(f"{path}: max_seq_length is TRL's old name (trl 1.16 SFTConfig has max_length, "
                         "sft_config.py:202): rename the key")
    which = kind(raw) or "sft"
    version, classes = _classes()
    cls = classes[which]
    dp = dp or 1
    plain = dict(raw)
    if which == "grpo" and plain.get("generation_batch_size") is None:
        # TRL sizes the generation batch over all ranks (grpo_config.py:1097-1115); this parse runs as one process,
        # so the global generation batch goes in whole: per_device_train_batch_size × dp × steps_per_generation
        # (default gradient_accumulation_steps, :1099)
        micro = int(plain.get("per_device_train_batch_size", 8))
        spg = plain.pop("steps_per_generation", None) or int(plain.get("gradient_accumulation_steps", 1))
        plain["generation_batch_size"] = micro * dp * int(spg)
    a, ds, warned = parse(path, plain, cls)
    r = Reading(f"{path} (trl {version} HfArgumentParser → {cls.__name__})", warned=warned)
    if which == "grpo":  # (first: a key the RL step does not take is refused by its own name, Reading.set)
        r.set("mode", "rl", "GRPOConfig")
    apply(r, a, raw, ds, bf16_default=True)
    if which == "grpo":
        _grpo(r, a, raw, dp)
    else:
        _sequence(r, a, which)
        # TRL 1.16's SFT and DPO trainers always patch in its fused LM head: per-token log-probs in tiles, the logits
        # never whole (sft_trainer.py:1144, dpo_trainer.py:960; trainer/utils.py:1548)
        r.set("loss", "chunked-logprob", f"{cls.__name__} (TRL's fused LM head)")
        if a.use_liger_kernel:  # base_config.py:91: Liger's kernels, its fused cross-entropy off (sft_trainer.py:1140)
            r.set("liger", True, "use_liger_kernel")
        if which == "dpo":
            _dpo(r, a)
    _model_init(r, a.model_init_kwargs, raw, ds)
    # a switch left off (False, None, 0) has no effect
    off = tuple(k for k in EFFECT if k in raw and not raw[k])
    leftovers(r, raw, MAPPED + ("model_init_kwargs",) + (("beta",) if which == "grpo" else ()), NO_EFFECT + off,
              EFFECT)
    return r


# model_init_kwargs' attn_implementation -> --attention (transformers' names)
ATTENTION = {"eager": "eager", "sdpa": "sdpa", "flash_attention_2": "flash2"}
INIT_NO_EFFECT = ("trust_remote_code", "revision", "use_cache", "low_cpu_mem_usage")


def _model_init(r: Reading, kw, raw: dict, ds) -> None:
    """model_init_kwargs, the trainers' from_pretrained arguments (sft_trainer.py:683, grpo_trainer.py:335;
    trainer/utils.py:1332-1336 create_model_from_path): `dtype` is the weights' (float32 unless given): bfloat16 is
    pure bf16 training, the Trainer's autocast upcasting nothing (weights, gradients and optimizer states in bf16:
    --precision bf16), unless DeepSpeed's bf16/fp16 block decides; attn_implementation the attention kernel."""
    for k, v in (kw or {}).items() if isinstance(kw, dict) else ():
        key = f"model_init_kwargs.{k}"
        if k == "dtype" and ds is not None:
            r.skip(key, v, "no effect: DeepSpeed's bf16/fp16 block decides the precision")
        elif k == "dtype" and str(v) in ("bfloat16", "torch.bfloat16") and not raw.get("fp16"):
            r.values["precision"] = "bf16"  # (over apply's amp-bf16 / fp32: the weights are bf16)
        elif k == "dtype" and str(v) in ("float32", "torch.float32"):
            r.skip(key, v, "no effect: TRL's own default (fp32 weights)")
        elif k == "attn_implementation" and v in ATTENTION:
            r.set("attention", ATTENTION[v], key)
        elif k in INIT_NO_EFFECT:
            r.skip(key, v, "no effect on a step's memory or time")
        else:
            r.skip(key, v, "memory and time: the weights' dtype (auto: the checkpoint's)" if k == "dtype" else
                   "memory and time: a from_pretrained argument trainfit does not read")


def _sequence(r: Reading, a, which: str) -> None:
    if a.max_length is None:  # no truncation: the dataset's longest sample decides
        r.not_modelled.append("max_length = None: the dataset's longest sample sets the sequence: pass --seq")
        return
    # sft_config.py:202 / dpo_config.py:195 (default 1024). NB: without packing a batch pads to its longest sample,
    # at most max_length: --seq max_length is the worst batch (more memory than a typical one).
    r.set("seq", a.max_length, "max_length")


def _dpo(r: Reading, a) -> None:
    # DataCollatorForPreference stacks prompt+chosen and prompt+rejected in one batch (dpo_trainer.py:169): the
    # policy runs 2 × per_device_train_batch_size sequences
    r.values["batch"] = 2 * a.per_device_train_batch_size
    if not a.precompute_ref_log_probs:
        r.not_modelled.append("reference model: not modelled (more memory and time: a frozen copy of the policy "
                              "scores each batch, dpo_trainer.py:908-927; none with a peft adapter)")


def _grpo(r: Reading, a, raw: dict, dp: int) -> None:
    r.set("mode", "rl", "GRPOConfig")
    r.set("rl_algo", "grpo", "GRPOConfig")
    group = a.num_generations  # grpo_config.py:480
    r.set("group_size", group, "num_generations")
    r.set("completion_len", a.max_completion_length, "max_completion_length")  # grpo_config.py:494
    micro = a.per_device_train_batch_size
    spg = a.generation_batch_size // (micro * dp)  # grpo_config.py:1103-1108 over dp ranks
    completions = micro * spg  # one GPU's generation batch
    if completions % group:
        raise SetupError(f"{r.source}: one GPU's generation batch of {completions} completions "
                         f"(per_device_train_batch_size × steps_per_generation) holds part of a group of "
                         f"{group}: trainfit models whole prompt groups per GPU: make it a multiple of "
                         "num_generations")
    # --batch counts prompts per GPU, --grad-accum the micro-batches their completions train in (docs/rl.md)
    r.values["batch"] = completions // group
    r.values["grad_accum"] = spg
    if spg != a.gradient_accumulation_steps:
        r.not_modelled.append(f"gradient_accumulation_steps = {a.gradient_accumulation_steps} with "
                              f"steps_per_generation = {spg}: trainfit takes one optimizer step per generation "
                              "batch (no effect on the peak; time per optimizer step differs)")
    if dp > 1:
        r.set("dp", dp, "--dp")
    # GRPOConfig 1.16 has no prompt limit: the dataset's prompts decide
    r.not_modelled.append("prompt length: the dataset's (TRL pads a batch's prompts to its longest): pass --prompt-len")
    if a.use_vllm:
        if a.vllm_mode == "colocate":  # grpo_config.py:594
            r.set("rollout", "vllm", "use_vllm + vllm_mode colocate")
            r.set("vllm_gpu_memory_utilization", float(a.vllm_gpu_memory_utilization), "vllm_gpu_memory_utilization")
            r.set("rollout_tp", a.vllm_tensor_parallel_size, "vllm_tensor_parallel_size")  # grpo_config.py:671
            if a.vllm_enable_sleep_mode:  # vllm_generation.py:366: llm.sleep(level=2) between generations
                r.set("vllm_sleep_level", 2, "vllm_enable_sleep_mode")
        else:
            r.not_modelled.append("vllm_mode = 'server': not modelled (less memory: generation runs on the server's "
                                  "own GPUs; trainfit counts it on the training GPU)")
    if a.beta:  # grpo_config.py:681: a reference model when beta > 0
        r.set("beta", float(a.beta), "beta")
    if a.use_liger_kernel:
        r.not_modelled.append("use_liger_kernel = True: not modelled (about the same memory: Liger's chunked GRPO "
                              "loss in place of TRL's chunked log-prob head)")
