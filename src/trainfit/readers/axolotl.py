"""axolotl's YAML config, read key by key against its pydantic schema (axolotl commit 067b021c, 2026-07-24:
src/axolotl/utils/schemas/{config,training,peft,model,fsdp}.py, integrations/liger/args.py), defaults included.
axolotl itself does not install beside trainfit's stack (docs/check.md), so its schema is not run here."""
from __future__ import annotations

from pathlib import Path

from ..errors import SetupError
from . import Reading, names_deepspeed
from .hf_args import OPTIM, _load, leftovers

SCHEMA = "axolotl 067b021c schemas"
LIGER = ("liger_rms_norm", "liger_glu_activation", "liger_rope", "liger_fused_linear_cross_entropy")  # liger/args.py
MAPPED = ("base_model", "micro_batch_size", "gradient_accumulation_steps", "sequence_len", "bf16", "fp16",
          "gradient_checkpointing", "adapter", "lora_r", "lora_target_linear", "lora_target_modules", "load_in_4bit",
          "load_in_8bit", "peft_use_dora", "flash_attention", "sdp_attention", "eager_attention", "optimizer",
          "deepspeed", "fsdp_config", "fsdp_version", "torch_compile", "max_grad_norm", "tf32", "plugins") + LIGER
NO_EFFECT = ("base_model_config", "model_type", "tokenizer_type", "tokenizer_config", "trust_remote_code", "strict",
             "datasets", "test_datasets", "dataset_prepared_path", "val_set_size", "chat_template", "special_tokens",
             "tokens", "train_on_inputs", "num_epochs", "micro_batch_size_eval", "eval_batch_size",
             "lr_scheduler", "lr_scheduler_kwargs", "cosine_min_lr_ratio", "warmup_steps", "warmup_ratio",
             "evals_per_epoch", "saves_per_epoch", "logging_steps", "wandb_project", "wandb_entity", "wandb_name",
             "wandb_watch", "wandb_log_model", "mlflow_tracking_uri", "lora_alpha", "lora_model_dir",
             "lora_fan_in_fan_out", "pad_to_sequence_len", "eval_sample_packing", "resume_from_checkpoint",
             "auto_resume_from_checkpoints", "early_stopping_patience", "debug", "hub_model_id", "dataset_processes",
             "shuffle_merged_datasets", "sequence_len_overflow_handling", "excess_length_strategy", "group_by_length",
             "bnb_config_kwargs", "optim_args", "loss_watchdog_threshold", "loss_watchdog_patience", "flash_optimum")
EFFECT = {
    "sample_packing": "less attention time: documents packed to sequence_len, each attending within itself "
                      "(config.py:688); give --doc-len D, your dataset's token-weighted mean document length",
    "activation_offloading": "less GPU memory, more host memory and PCIe time (config.py:623)",
    "lora_dropout": "more memory: a dropout mask per adapted Linear input (trainfit models lora_dropout 0)",
    "xformers_attention": "memory and time: xformers' attention kernel (config.py:784)",
    "flex_attention": "memory and time: torch's flex attention (config.py:798)",
    "flash_attn_cross_entropy": "less memory: flash-attn's cross-entropy kernel (config.py:810)",
    "flash_attn_rms_norm": "less memory and time: flash-attn's RMSNorm kernel",
    "cut_cross_entropy": "less memory: the logits never whole (integrations/cut_cross_entropy/args.py:33)",
    "gradient_checkpointing_kwargs": "memory and time: use_reentrant changes nothing trainfit counts",
    "deepcompile": "time: DeepSpeed's compiler",
    "rl": "memory and time: an RL / preference trainer (TRL's); trainfit reads it as supervised training",
    "unfrozen_parameters": "less memory: only these parameters train",
    "fsdp": "memory and time: the deprecated FSDP list (config.py:1040): use fsdp_config",
}
ATTENTION = (("flash_attention", "flash2"), ("sdp_attention", "sdpa"), ("eager_attention", "eager"))  # config.py:791-834


def read(path: Path, text: str, dp: int | None = None) -> Reading:
    raw = _load(path, text)
    r = Reading(f"{path} ({SCHEMA}: axolotl is not installed)")
    if not raw.get("base_model"):  # model.py:17: required
        raise SetupError(f"{path}: axolotl needs base_model (model.py:17): add it")
    r.model = str(raw["base_model"])
    r.set("batch", int(raw.get("micro_batch_size") or 1), "micro_batch_size")  # training.py:77, default 1
    r.set("grad_accum", int(raw.get("gradient_accumulation_steps") or 1), "gradient_accumulation_steps")  # :71
    if raw.get("batch_size") and "gradient_accumulation_steps" not in raw:
        r.not_modelled.append("batch_size: axolotl derives gradient_accumulation_steps from it and the world size: "
                              "pass --grad-accum")
    elif "batch_size" in raw:
        r.no_effect.append("batch_size")
    r.set("seq", int(raw.get("sequence_len") or 512), "sequence_len")  # config.py:665, default 512
    # bf16 default "auto" (config.py:559): bf16 where the GPU has it (Ampere on). NB: read as bf16.
    bf16 = raw.get("bf16", "auto")
    prec = "amp-fp16" if raw.get("fp16") and bf16 is not True else "amp-bf16" if bf16 else "fp32"
    # (its TrainingArguments fill DeepSpeed's "auto" bf16/fp16.enabled: transformers integrations/deepspeed.py:183-184)
    r.fills = {"bf16.enabled": prec == "amp-bf16", "fp16.enabled": prec == "amp-fp16"}
    if raw.get("deepspeed") is None:  # with DeepSpeed its own config's bf16/fp16 block decides
        r.set("stack", "hf", "axolotl (the HF Trainer)")
        r.set("precision", prec, "bf16/fp16")
    else:
        names_deepspeed(r, raw["deepspeed"])
    ckpt = raw.get("gradient_checkpointing", False)  # config.py:600: true, false, "offload", "offload_disk"
    fsdp_ckpt = (raw.get("fsdp_config") or {}).get("activation_checkpointing")  # fsdp.py:20
    r.set("recompute", "full" if ckpt or fsdp_ckpt else "none", "gradient_checkpointing")
    if isinstance(ckpt, str):
        r.not_modelled.append(f"gradient_checkpointing = {ckpt!r}: not modelled (less GPU memory: the checkpoints "
                              "go to host memory or disk)")
    _adapter(path, r, raw)
    for key, kernel in ATTENTION:
        if raw.get(key):
            r.set("attention", kernel, key)
    optim = str(raw.get("optimizer") or "adamw_torch_fused")  # training.py:122, default adamw_torch_fused
    if optim not in OPTIM:
        raise SetupError(f"{path}: optimizer {optim!r}: trainfit models {', '.join(OPTIM)}")
    r.set("optimizer", OPTIM[optim][0], "optimizer")
    if OPTIM[optim][1]:
        r.set("optimizer_impl", OPTIM[optim][1], "optimizer")
    _fsdp(r, raw)
    if raw.get("torch_compile"):
        r.set("compile", True, "torch_compile")
    if raw.get("max_grad_norm") is not None:  # training.py:264
        r.set("max_grad_norm", float(raw["max_grad_norm"]), "max_grad_norm")
    if raw.get("tf32") is True:
        r.set("tf32", True, "tf32")
    liger = [k for k in LIGER if raw.get(k)]
    if liger and len(liger) == len(LIGER):  # the LigerPlugin with every kernel: trainfit's --liger
        r.set("liger", True, ", ".join(LIGER))
    elif liger:
        r.not_modelled.append(f"{', '.join(liger)}: not modelled (less memory: some of Liger's kernels; --liger "
                              "is all of them)")
    off = tuple(k for k in EFFECT if k in raw and not raw[k])
    leftovers(r, raw, MAPPED, NO_EFFECT + off, EFFECT)
    return r


def _adapter(path: Path, r: Reading, raw: dict) -> None:
    adapter = raw.get("adapter")  # peft.py:41: lora, qlora, or none (full fine-tuning)
    if not adapter:
        if raw.get("load_in_4bit") or raw.get("load_in_8bit"):
            raise SetupError(f"{path}: load_in_4bit/load_in_8bit without an adapter trains a quantised base: set "
                             "adapter: lora or qlora")
        return
    if adapter not in ("lora", "qlora"):
        raise SetupError(f"{path}: adapter {adapter!r}: trainfit models lora and qlora")
    if not raw.get("lora_r"):  # peft.py:53
        raise SetupError(f"{path}: adapter {adapter} needs lora_r (peft.py:53): add it")
    r.set("lora_rank", int(raw["lora_r"]), "lora_r")
    targets = raw.get("lora_target_modules")  # peft.py:56-58
    if raw.get("lora_target_linear"):
        r.set("lora_targets", "all-linear", "lora_target_linear")
    elif targets:
        r.set("lora_targets", targets if isinstance(targets, str) else ",".join(targets), "lora_target_modules")
    if raw.get("peft_use_dora"):
        r.set("dora", True, "peft_use_dora")
    if adapter == "qlora" or raw.get("load_in_4bit"):  # loaders/model.py:719: bnb_4bit_quant_type nf4
        r.set("quant", "nf4", "adapter qlora / load_in_4bit")
    elif raw.get("load_in_8bit"):  # peft.py:31
        r.set("quant", "int8", "load_in_8bit")


def _fsdp(r: Reading, raw: dict) -> None:
    fsdp = raw.get("fsdp_config")  # config.py:1049, fsdp.py
    if not fsdp:
        return
    version = raw.get("fsdp_version") or fsdp.get("fsdp_version")  # config.py:1052, fsdp.py:15
    if version:
        r.set("fsdp_version", int(version), "fsdp_version")
    # fsdp.py:75: reshard_after_forward false keeps the gathered weights to backward (ZeRO-2's layout)
    r.set("zero", 2 if fsdp.get("reshard_after_forward") is False else 3, "fsdp_config.reshard_after_forward")
    if fsdp.get("offload_params"):  # fsdp.py:24
        r.set("offload", "params", "fsdp_config.offload_params")
    for k, v in fsdp.items():
        if k not in ("fsdp_version", "reshard_after_forward", "offload_params", "activation_checkpointing"):
            r.skip(f"fsdp_config.{k}", v, "memory and time: FSDP options beyond sharding, offload and checkpointing")
