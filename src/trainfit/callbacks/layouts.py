"""The layout and the step settings a trainer's own configuration gives: transformers' TrainingArguments,
accelerate's Accelerator, FSDP and DeepSpeed settings (no import of those packages: read by attribute)."""
from __future__ import annotations

from ..errors import SetupError


def autocast_of(mixed: str | None) -> str | None:
    """accelerate's mixed_precision (accelerator.py:748) as the autocast dtype: no, bf16, fp16; fp8 refused."""
    table = {None: None, "no": None, "bf16": "bf16", "fp16": "fp16"}
    if str(mixed) not in table and mixed is not None:
        raise SetupError(f"accelerate mixed_precision {mixed!r} is not read by the pre-flight: use no, bf16 or fp16, "
                         "or pass low_precision=... (trainfit's --low-precision)")
    return table[mixed if mixed is None else str(mixed)]


def training_args_autocast(args) -> str | None:
    """TrainingArguments bf16 / fp16 (5.24 training_args.py:874-885): autocast in that dtype."""
    return "bf16" if args.bf16 else "fp16" if args.fp16 else None


def training_args_settings(args) -> dict:
    """trainfit settings of transformers' TrainingArguments (5.24 training_args.py): gradient_accumulation_steps,
    max_grad_norm, activation_checkpointing (:908; gradient_checkpointing its alias, :926), world_size (:2003),
    FSDP (fsdp_config after _process_fsdp_args, :2775-2793: reshard_after_forward True = full_shard, False =
    shard_grad_op, cpu_offload) and DeepSpeed (hf_deepspeed_config, :1707-1711: its zero_optimization.stage)."""
    out = {"grad_accum": args.gradient_accumulation_steps, "max_grad_norm": args.max_grad_norm,
           "dp": args.world_size}
    if args.activation_checkpointing or args.gradient_checkpointing:
        kwargs = args.activation_checkpointing_kwargs or args.gradient_checkpointing_kwargs or {}
        n = kwargs.get("every_n_layers", 1) if isinstance(kwargs, dict) else 1
        out["recompute"] = "full" if n == 1 else f"layer:{n}"
        if isinstance(kwargs, dict) and kwargs.get("offload"):
            out["offload"] = "activations"
    if getattr(args, "torch_compile", False):  # :940, the whole model compiled (--compile on --stack hf)
        out["compile"] = True
    if getattr(args, "tf32", None):  # :898 (time only)
        out["tf32"] = True
    if getattr(args, "use_liger_kernel", False):  # :957: which of Liger's kernels apply depends on the model
        raise SetupError("use_liger_kernel: pass the Liger kernels the model gets as trainfit settings (e.g. "
                         "loss='fused-linear'), the pre-flight does not read them")
    if args.fsdp:
        out.update(fsdp_settings(args.fsdp_config or {}))
    ds = getattr(args, "hf_deepspeed_config", None)
    if args.deepspeed and ds is not None:
        out.update(deepspeed_settings(ds.config))
    return out


def fsdp_settings(cfg: dict) -> dict:
    reshard = cfg.get("reshard_after_forward", True)
    reshard = True if reshard is None else reshard  # (accelerate: None = FULL_SHARD)
    stages = {True: 3, "full_shard": 3, "FULL_SHARD": 3, False: 2, "shard_grad_op": 2, "SHARD_GRAD_OP": 2}
    if reshard not in stages:
        raise SetupError(f"FSDP sharding {reshard!r} is not modelled: trainfit models full_shard (--zero 3) and "
                         "shard_grad_op (--zero 2) over every rank")
    out = {"zero": stages[reshard]}
    if cfg.get("cpu_offload"):
        out["offload"] = "params"
    return out


def deepspeed_settings(config: dict) -> dict:
    """--stack deepspeed with the config's ZeRO stage and offload (DeepSpeed's zero_optimization block) and its
    precision: bf16 / fp16 enabled = 16-bit weights with fp32 masters (bf16-master, fp16-master: DeepSpeed 0.19.8
    runtime/config.py:512 bfloat16_config / float16_config, precision_config.py:30-31 "bf16" or "bfloat16"; the
    inverse of stacks/deepspeed_config.py ds_config), neither = fp32; after the HF Trainer has filled its "auto" values (trainer_config_process)."""
    def enabled(*blocks) -> bool:
        return any((config.get(b) or {}).get("enabled") is True for b in blocks)

    if enabled("torch_autocast"):
        raise SetupError("DeepSpeed's torch_autocast is not modelled: use its bf16 or fp16 block")
    z = config.get("zero_optimization", {}) or {}
    out = {"stack": "deepspeed", "zero": int(z.get("stage", 0)),
           "precision": "bf16-master" if enabled("bf16", "bfloat16") else "fp16-master" if enabled("fp16") else "fp32"}
    off = [k for k in ("offload_optimizer", "offload_param")
           if str((z.get(k) or {}).get("device", "none")).lower() not in ("none", "auto")]
    if off:
        out["offload"] = "params" if "offload_param" in off else "optimizer"
    return out


def accelerator_settings(accelerator) -> dict:
    """trainfit settings of an accelerate 1.15 Accelerator: num_processes (accelerator.py:676); the FSDP plugin's
    reshard_after_forward (utils/dataclasses.py:1673, a bool under FSDP2, a ShardingStrategy under FSDP1) and
    cpu_offload (:1709; __post_init__ makes it CPUOffload(offload_params) or CPUOffloadPolicy / OffloadPolicy); the
    DeepSpeed plugin's config (:1325 deepspeed_config) or zero_stage (:1173)."""
    out = {"dp": accelerator.num_processes}
    state = accelerator.state
    fsdp = getattr(state, "fsdp_plugin", None)
    if fsdp is not None:
        reshard = getattr(fsdp, "reshard_after_forward", True)
        reshard = getattr(reshard, "name", reshard)  # FSDP1's ShardingStrategy enum
        offload = getattr(fsdp, "cpu_offload", None)
        offload = type(offload).__name__ == "CPUOffloadPolicy" or bool(getattr(offload, "offload_params", False))
        out.update(fsdp_settings({"reshard_after_forward": reshard, "cpu_offload": offload}))
    ds = getattr(state, "deepspeed_plugin", None)
    if ds is not None:
        out.update(deepspeed_settings(getattr(ds, "deepspeed_config", None) or
                                      {"zero_optimization": {"stage": ds.zero_stage}}))
    return out
