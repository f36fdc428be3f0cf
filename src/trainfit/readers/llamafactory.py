"""LLaMA-Factory's training YAML (`llamafactory-cli train FILE`): its TrainingArguments keys parsed by transformers'
own HfArgumentParser (as hf_args.py), its own keys read against its argument dataclasses (LLaMA-Factory commit
ff6d4d12, 2026-08-18: src/llamafactory/hparams/{model,data,finetuning}_args.py), defaults included. LLaMA-Factory
itself does not install beside trainfit's stack (docs/check.md), so its parser is not run here."""
from __future__ import annotations

from pathlib import Path

from ..errors import SetupError
from . import Reading
from .hf_args import _load, apply, leftovers, parse

SCHEMA = "LLaMA-Factory ff6d4d12 hparams"
ATTENTION = {"fa2": "flash2", "fa3": "flash", "sdpa": "sdpa", "disabled": "eager"}  # extras/constants.py:147-152
MAPPED = ("model_name_or_path", "stage", "finetuning_type", "lora_rank", "lora_target", "use_dora",
          "quantization_bit", "quantization_method", "quantization_type", "cutoff_len", "enable_liger_kernel",
          "disable_gradient_checkpointing", "flash_attn")
NO_EFFECT = ("template", "dataset", "dataset_dir", "eval_dataset", "overwrite_cache", "preprocessing_num_workers",
             "max_samples", "val_size", "plot_loss", "trust_remote_code", "lora_alpha", "double_quantization",
             "pref_beta", "pref_loss", "adapter_name_or_path", "cache_dir", "tokenized_path", "train_on_prompt",
             "mask_history", "streaming", "buffer_size", "mix_strategy", "interleave_probs", "new_special_tokens",
             "resize_vocab", "split_special_tokens", "image_max_pixels", "video_max_pixels", "enable_thinking",
             "default_system", "ddp_timeout")
EFFECT = {
    "packing": "less attention time: samples packed to cutoff_len (data_args.py:108)",
    "neat_packing": "less attention time: packed samples attend within themselves (data_args.py:112); give --doc-len "
                    "D, your dataset's token-weighted mean sample length",
    "use_unsloth": "less memory and time: Unsloth's kernels (model_args.py:129)",
    "upcast_layernorm": "more memory: fp32 norm weights (model_args.py:153)",
    "lora_dropout": "more memory: a dropout mask per adapted Linear input (trainfit models lora_dropout 0; "
                    "finetuning_args.py:73)",
    "use_galore": "less memory: GaLore's low-rank optimizer states (finetuning_args.py:266)",
    "use_apollo": "less memory: APOLLO's optimizer states (finetuning_args.py:305)",
    "use_badam": "less memory: BAdam trains one block at a time (finetuning_args.py:356)",
    "shift_attn": "less attention memory: LongLoRA's shifted short attention (model_args.py:121)",
    "rope_scaling": "no memory change; longer contexts than the model's (model_args.py:113)",
    "pissa_init": "no effect on a step's memory (finetuning_args.py:107)",
    "freeze_trainable_layers": "finetuning_type freeze: only these layers train (finetuning_args.py:23)",
    "ref_model": "more memory: a reference model (finetuning_args.py:223)",
}


def read(path: Path, text: str, dp: int | None = None) -> Reading:
    raw = _load(path, text)
    try:
        from transformers import Seq2SeqTrainingArguments
    except ImportError:
        raise SetupError(f"{path}: reading LLaMA-Factory's training keys needs transformers") from None
    a, ds, warned = parse(path, raw, Seq2SeqTrainingArguments)  # training_args.py: LF's TrainingArguments subclass it
    r = Reading(f"{path} ({SCHEMA}: LLaMA-Factory is not installed; training keys by transformers' "
                "HfArgumentParser)", warned=warned)
    if not raw.get("model_name_or_path"):  # model_args.py:38
        raise SetupError(f"{path}: LLaMA-Factory needs model_name_or_path (model_args.py:38): add it")
    r.model = str(raw["model_name_or_path"])
    apply(r, a, raw, ds)
    # LLaMA-Factory checkpoints unless disable_gradient_checkpointing (model_args.py:145,
    # model/model_utils/checkpointing.py:184)
    r.values["recompute"] = "none" if raw.get("disable_gradient_checkpointing") else "full"
    stage = raw.get("stage", "sft")  # finetuning_args.py:460
    if stage not in ("pt", "sft"):
        r.not_modelled.append(f"stage = {stage!r}: not modelled (more memory: preference pairs, a reference or "
                              "reward model): read as supervised fine-tuning")
    # cutoff_len, default 2048 (data_args.py:46). NB: unpacked batches pad to their longest sample, at most this.
    r.set("seq", int(raw.get("cutoff_len") or 2048), "cutoff_len")
    _finetuning(path, r, raw)
    kernel = str(raw.get("flash_attn", "auto"))  # model_args.py:117
    if kernel in ATTENTION:
        r.set("attention", ATTENTION[kernel], "flash_attn")
    if raw.get("enable_liger_kernel"):  # model_args.py:137
        r.set("liger", True, "enable_liger_kernel")
    off = tuple(k for k in EFFECT if k in raw and not raw[k])
    leftovers(r, raw, MAPPED, NO_EFFECT + off, EFFECT)
    return r


def _finetuning(path: Path, r: Reading, raw: dict) -> None:
    kind = raw.get("finetuning_type", "lora")  # finetuning_args.py:464, default lora
    if kind == "lora":
        r.set("lora_rank", int(raw.get("lora_rank") or 8), "lora_rank")  # :77, default 8
        target = str(raw.get("lora_target", "all"))  # :81, "all" = every linear module
        r.set("lora_targets", "all-linear" if target == "all" else target, "lora_target")
        if raw.get("use_dora"):  # :103
            r.set("dora", True, "use_dora")
    elif kind in ("freeze", "oft"):
        r.not_modelled.append(f"finetuning_type = {kind!r}: not modelled (less memory: part of the model or "
                              "orthogonal adapters train): read as full fine-tuning")
    bits = raw.get("quantization_bit")  # model_args.py:283
    if bits:
        method = str(raw.get("quantization_method", "bnb"))  # :279
        if method != "bnb" or bits not in (4, 8):
            raise SetupError(f"{path}: quantization_method {method} with quantization_bit {bits}: trainfit models "
                             "bitsandbytes 4- and 8-bit (bnb)")
        r.set("quant", str(raw.get("quantization_type", "nf4")) if bits == 4 else "int8", "quantization_bit")  # :287
