"""HF `TrainingArguments` as a JSON or YAML file, parsed by transformers' own HfArgumentParser (transformers 5.24
hf_argparser.py parse_dict into training_args.py TrainingArguments, its __post_init__ validation included). bf16 /
fp16 are read from the file rather than validated: TrainingArguments refuses them on a machine without the GPU
(training_args.py _validate_args), and trainfit checks for the target GPU. TRL's configs, TrainingArguments
subclasses, go to trl.py, which shares parse/apply/leftovers."""
from __future__ import annotations

import copy
import json
import warnings
from pathlib import Path

from ..errors import SetupError
from . import Reading, names_deepspeed
from .accelerate import reshard_zero

# TrainingArguments.optim (training_args.py OptimizerNames) -> (trainfit --optimizer, --optimizer-impl): the HF
# Trainer's builds (transformers trainer_optimizer.py:201-207: torch's AdamW, fused=True for adamw_torch_fused only;
# torch.optim.SGD for sgd), torch's AdamW and SGD without fused running foreach on CUDA (torch/optim/adam.py:935-939,
# sgd.py:277-284 _default_to_fused_or_foreach); the stack's own default (fused) is adamw_torch_fused's
OPTIM = {"adamw_torch": ("adamw", "foreach"), "adamw_torch_fused": ("adamw", "fused"), "adamw_torch_4bit":
         ("adamw-torchao-4bit", None), "adamw_torch_8bit": ("adamw-torchao-8bit", None),
         "adamw_bnb_8bit": ("adamw-8bit", None), "adamw_8bit": ("adamw-8bit", None),
         "paged_adamw_8bit": ("paged-adamw-8bit", None), "paged_adamw_32bit": ("paged-adamw", None),
         "paged_adamw": ("paged-adamw", None), "lion_32bit": ("lion", None), "sgd": ("sgd", "foreach"),
         "adafactor": ("adafactor", None)}
MAPPED = ("per_device_train_batch_size", "gradient_accumulation_steps", "bf16", "fp16", "gradient_checkpointing",
          "max_grad_norm", "optim", "fsdp", "torch_compile", "deepspeed", "activation_checkpointing")
NO_EFFECT_PREFIX = ("output_dir", "overwrite_output_dir", "logging_", "save_", "eval_", "per_device_eval",
                    "learning_rate", "weight_decay", "adam_", "warmup_", "lr_scheduler", "num_train_epochs",
                    "max_steps", "seed", "data_seed", "report_to", "run_name", "push_to_hub", "hub_", "do_train",
                    "do_eval", "do_predict", "remove_unused_columns", "label_names", "disable_tqdm", "load_best",
                    "metric_for_best", "greater_is_better", "resume_from", "dataset_text_field", "log_level",
                    "include_", "prediction_loss_only", "project", "trackio")
EFFECT = {"dataloader_num_workers": "host memory and time only", "dataloader_pin_memory": "host memory only",
          "gradient_checkpointing_kwargs": "memory and time: use_reentrant changes nothing trainfit counts",
          "group_by_length": "time only",
          "torch_compile_mode": "time", "tf32": "time: TF32 matmuls (trainfit --tf32)",
          "fsdp_config": "memory and time: FSDP options beyond the sharding, version, offload and checkpointing",
          "ddp_bucket_cap_mb": "memory: DDP's gradient buckets", "ddp_find_unused_parameters": "time",
          "neftune_noise_alpha": "no effect on memory",
          "liger_kernel_config": "memory and time: Liger's kernels switched one by one (--liger: Liger's defaults)"}


def _load(path: Path, text: str) -> dict:
    if path.suffix.lower() == ".json":
        data = json.loads(text)
    else:
        import yaml

        data = yaml.safe_load(text)
    if not isinstance(data, dict):
        raise SetupError(f"{path}: a mapping of TrainingArguments fields is expected")
    return data


def parse(path: Path, raw: dict, cls):
    """(the `cls` (TrainingArguments or a subclass) HfArgumentParser makes of `raw`, its deepspeed value, what `cls`
    warned about the file: e.g. a deprecated key, training_args.py:1541, said in check's lines rather than as a
    Python warning on stderr). bf16/fp16 go in as False: their check needs the GPU (training_args.py
    _validate_args); the callers read them from `raw`."""
    try:
        from transformers import HfArgumentParser
    except ImportError:
        raise SetupError(f"{path}: reading TrainingArguments needs transformers") from None
    if raw.get("bf16") and raw.get("fp16"):  # (transformers 5.24.0 training_args.py:1784-1785, _validate_args)
        raise SetupError(f"{path}: bf16 and fp16 are both true: {cls.__name__} rejects it (At most one of fp16 and "
                         "bf16 can be True, but not both): keep one")
    # (a deep copy: TrainingArguments fills fsdp_config's dict in place, training_args.py:2802-2808)
    plain = copy.deepcopy({k: v for k, v in raw.items() if k not in ("bf16", "fp16", "tf32")})
    plain.update(bf16=False, fp16=False)
    plain.setdefault("output_dir", "trainfit-check")
    ds = plain.pop("deepspeed", None)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            (a,) = HfArgumentParser(cls).parse_dict(plain, allow_extra_keys=True)
    except (ValueError, TypeError) as e:
        raise SetupError(f"{path}: {cls.__name__} rejects it ({str(e).splitlines()[0]})") from None
    return a, ds, list(dict.fromkeys(f"{cls.__name__} warns: {w.message}" for w in caught))


def apply(r: Reading, a, raw: dict, ds, bf16_default: bool = False) -> None:
    """The TrainingArguments fields every HF-Trainer-based trainer shares, from parsed `a` into `r`; `bf16_default`:
    bf16 when the file sets neither bf16 nor fp16 (TRL's configs: base_config.py:108)."""
    r.set("batch", a.per_device_train_batch_size, "per_device_train_batch_size")
    r.set("grad_accum", a.gradient_accumulation_steps, "gradient_accumulation_steps")
    bf16 = raw.get("bf16")
    if bf16 is None:
        bf16 = bf16_default and not raw.get("fp16")
    # what the HF Trainer fills DeepSpeed's "auto" bf16/fp16.enabled with (integrations/deepspeed.py:183-184)
    r.fills = {"bf16.enabled": bool(bf16 or raw.get("bf16_full_eval")),
               "fp16.enabled": bool(raw.get("fp16") or raw.get("fp16_full_eval"))}
    if ds is None:  # with DeepSpeed its own config's bf16/fp16 block decides (integrations/deepspeed.py)
        r.set("stack", "hf", "TrainingArguments")
        r.set("precision", "amp-bf16" if bf16 else "amp-fp16" if raw.get("fp16") else "fp32", "bf16/fp16")
        # TF32 matmuls (trainfit --tf32, fp32 only): tf32 true turns them on, and so does torch_compile with tf32
        # unset and neither bf16 nor fp16 (transformers 5.24.0 training_args.py:1664-1680, enable_tf32)
        compiled = raw.get("tf32") is None and a.torch_compile
        if not bf16 and not raw.get("fp16") and ("tf32" in raw or compiled):
            r.set("tf32", raw.get("tf32") is True or compiled, "tf32" if "tf32" in raw else "torch_compile")
    else:
        names_deepspeed(r, ds)
    # gradient_checkpointing, renamed activation_checkpointing in transformers 5.24 (training_args.py:1541 warns)
    ckpt = a.gradient_checkpointing or getattr(a, "activation_checkpointing", False)
    # FSDP: transformers 5.24 sets `fsdp` True and moves its legacy string / list ("full_shard offload") into
    # fsdp_config, then builds accelerate's FSDP plugin kwargs from it (training_args.py:2775-2880
    # _process_fsdp_args, :2890-2937 _apply_legacy_fsdp_to_config): fsdp_version (default 2), reshard_after_forward
    # (FSDP2 a bool, FSDP1 a strategy name), cpu_offload, FSDP's own activation_checkpointing
    plugin = (getattr(a, "fsdp_plugin_args", None) or {}) if a.fsdp else {}
    if ckpt and plugin.get("activation_checkpointing"):  # trainer.py:878-884 (Trainer.__init__) refuses both
        raise SetupError(f"{r.source}: fsdp_config activation_checkpointing and gradient_checkpointing are both true: "
                         "the HF Trainer refuses it (FSDP's own activation checkpointing and the "
                         "activation_checkpointing training argument can't both be set to True): keep one")
    r.set("recompute", "full" if ckpt or plugin.get("activation_checkpointing") else "none",
          "gradient_checkpointing / fsdp_config.activation_checkpointing")
    r.set("max_grad_norm", float(a.max_grad_norm), "max_grad_norm")
    optim = str(getattr(a.optim, "value", a.optim))
    if optim not in OPTIM:
        raise SetupError(f"optim {optim!r}: trainfit models {', '.join(OPTIM)}")
    r.set("optimizer", OPTIM[optim][0], "optim")
    if OPTIM[optim][1]:
        r.set("optimizer_impl", OPTIM[optim][1], "optim")
    if plugin:  # reshard_after_forward as accelerate's config takes it (true / full_shard: ZeRO-3, ...)
        zero = reshard_zero(plugin["reshard_after_forward"])
        r.set("zero", zero, "fsdp / fsdp_config.reshard_after_forward")
        if zero >= 2:
            r.set("fsdp_version", int(plugin["fsdp_version"]), "fsdp_config.version")
        if plugin.get("cpu_offload"):
            r.set("offload", "params", "fsdp offload / fsdp_config.cpu_offload")
    if a.torch_compile:
        r.set("compile", True, "torch_compile")


def leftovers(r: Reading, raw: dict, mapped, no_effect: tuple = (), effect: dict | None = None) -> None:
    """Every key of `raw` not in `mapped`: no effect, not modelled (with its effect), or unknown."""
    effect = {**EFFECT, **(effect or {})}
    for k, v in raw.items():
        if k in mapped or k in MAPPED or (k == "tf32" and "tf32" in r.values):
            continue
        if any(k.startswith(p) for p in NO_EFFECT_PREFIX) or k in no_effect:
            r.skip(k, v, "no effect on a step's memory or time")
        elif k in effect:
            r.skip(k, v, effect[k])
        else:
            r.unknown.append(k)


def read(path: Path, text: str, dp: int | None = None) -> Reading:
    raw = _load(path, text)
    try:
        from transformers import TrainingArguments
    except ImportError:
        raise SetupError(f"{path}: reading TrainingArguments needs transformers") from None
    a, ds, warned = parse(path, raw, TrainingArguments)
    r = Reading(f"{path} (transformers HfArgumentParser → TrainingArguments)", warned=warned)
    apply(r, a, raw, ds)
    if a.use_liger_kernel:  # training_args.py:957; trainer.py:1494-1495 applies Liger's defaults to the model
        r.set("liger", True, "use_liger_kernel")
    leftovers(r, raw, ("use_liger_kernel",))
    return r
