"""An accelerate config YAML/JSON, loaded by accelerate's own loader (accelerate 1.15.0
commands/config/config_args.py:43 load_config_from_file → ClusterConfig), read as `accelerate launch` runs it:
distributed_type, num_processes, mixed_precision, and the FSDP block (accelerate's FSDP guide: fsdp_version, 1
unless given; 2's fsdp_reshard_after_forward, FSDP1's fsdp_sharding_strategy; utils/dataclasses.py
FullyShardedDataParallelPlugin)."""
from __future__ import annotations

from pathlib import Path

from ..errors import SetupError
from . import Reading, _file
from .deepspeed import read_offload

NO_EFFECT = ("compute_environment", "debug", "machine_rank", "main_training_function", "rdzv_backend",
             "same_network", "use_cpu", "gpu_ids", "main_process_ip", "main_process_port", "enable_cpu_affinity",
             "tpu_name", "tpu_zone", "tpu_use_cluster", "tpu_use_sudo", "command_file", "commands", "tpu_vm",
             "tpu_env", "num_machines", "mpirun_config", "megatron_lm_config", "parallelism_config", "fp8_config",
             "deepspeed_config", "fsdp_config")
FSDP_NO_EFFECT = ("fsdp_auto_wrap_policy", "fsdp_transformer_layer_cls_to_wrap",
                  "fsdp_state_dict_type", "fsdp_cpu_ram_efficient_loading", "fsdp_sync_module_states",
                  "fsdp_use_orig_params", "fsdp_min_num_params")
FSDP_EFFECT = {"fsdp_backward_prefetch": "memory and time: FSDP1's prefetch of the next gather",
               "fsdp_forward_prefetch": "memory and time: FSDP1's explicit forward prefetch",
               "fsdp_limit_all_gathers": "memory: FSDP1's rate limiter"}


def read(path: Path, text: str, dp: int | None = None) -> Reading:
    try:
        from accelerate.commands.config.config_args import load_config_from_file
    except ImportError:
        raise SetupError(f"{path}: reading an accelerate config needs accelerate (pip install accelerate)") from None
    try:
        cfg = load_config_from_file(str(path))
    except (TypeError, ValueError, KeyError) as e:
        raise SetupError(f"{path}: accelerate's loader rejects it ({e})") from None
    r = Reading(f"{path} (accelerate load_config_from_file)")
    dist = str(getattr(cfg.distributed_type, "value", cfg.distributed_type))
    n = cfg.num_processes if cfg.num_processes and cfg.num_processes > 0 else None
    fsdp = dict(cfg.fsdp_config or {})
    if dist == "DEEPSPEED":
        ds = dict(cfg.deepspeed_config or {})
        if ds.get("deepspeed_config_file"):
            raise SetupError(f"{path}: distributed_type DEEPSPEED with a deepspeed_config_file: pass that DeepSpeed "
                             "config JSON to `trainfit check` beside it")
        return _deepspeed(r, cfg, ds, n)
    if dist not in ("NO", "MULTI_GPU", "FSDP"):
        raise SetupError(f"{path}: distributed_type {dist}: trainfit reads NO, MULTI_GPU and FSDP configs")
    r.set("stack", "hf", "accelerate")
    mp = str(getattr(cfg.mixed_precision, "value", cfg.mixed_precision))
    if mp == "fp8":
        raise SetupError(f"{path}: mixed_precision fp8 (Transformer Engine / torchao through accelerate) is not "
                         "modelled; use bf16")
    r.set("precision", {"bf16": "amp-bf16", "fp16": "amp-fp16"}.get(mp, "fp32"), "mixed_precision")
    if dist == "NO":
        r.set("dp", 1, "distributed_type")
    elif n is not None:
        r.set("dp", n, "num_processes")
    r.set("zero", _zero(fsdp) if dist == "FSDP" else 0, "fsdp_config")
    hybrid = str(fsdp.get("fsdp_sharding_strategy", fsdp.get("fsdp_reshard_after_forward", ""))).upper()
    if dist == "FSDP" and hybrid in ("4", "5", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2") and (cfg.num_machines or 1) > 1:
        # torch FSDP's hybrid strategies shard within a node and replicate across nodes (torch/distributed/fsdp/
        # _init_utils.py:161, :201-213 _init_intra_node_process_group)
        r.not_modelled.append(f"fsdp_sharding_strategy {hybrid} over {cfg.num_machines} machines (HSDP: sharded "
                              "within a machine, replicated across): trainfit shards over all ranks (NB: less "
                              "memory, more gather traffic than the run)")
    if dist == "FSDP" and r.values["zero"] >= 2:
        # FSDP1 unless the config says 2: `accelerate launch --fsdp_version` defaults to "1"
        # (commands/launch.py:517-522), the config's fsdp_config filling only the keys it names (:1313-1326);
        # FullyShardedDataParallelPlugin reads FSDP_VERSION (utils/launch.py:281, utils/dataclasses.py:1709-1710)
        r.set("fsdp_version", int(fsdp.get("fsdp_version", 1)), "fsdp_config.fsdp_version")
    if fsdp.get("fsdp_activation_checkpointing"):
        r.set("recompute", "full", "fsdp_activation_checkpointing")
        r.together.append(lambda readings: _trainer_keeps_fsdp_checkpoints(r, readings))
    if fsdp.get("fsdp_offload_params"):
        r.set("offload", "params", "fsdp_offload_params")
    _top_keys(r, cfg, dist)
    for k, v in fsdp.items():
        if k in ("fsdp_version", "fsdp_reshard_after_forward", "fsdp_sharding_strategy",
                 "fsdp_activation_checkpointing", "fsdp_offload_params"):
            continue
        if k in FSDP_NO_EFFECT:
            r.skip(f"fsdp_config.{k}", v, "no effect on a step's memory or time")
        elif k in FSDP_EFFECT:
            r.skip(f"fsdp_config.{k}", v, FSDP_EFFECT[k])
        else:
            r.unknown.append(f"fsdp_config.{k}")
    return r


def _trainer_keeps_fsdp_checkpoints(r: Reading, readings: list) -> None:
    """TrainingArguments (or a trainer config: a reading with `fills`) read with this FSDP config: their
    gradient_checkpointing false, the default, leaves FSDP's own activation checkpointing on (the Trainer takes the
    FSDP plugin `accelerate launch` builds from this file, and refuses only both on: transformers 5.24
    trainer.py:878-884), so their recompute 'none' is no second policy: this file's decides."""
    for o in readings:
        if o is not r and o.fills and o.values.get("recompute") == "none":
            o.values.pop("recompute")


DS_NO_EFFECT = ("zero3_save_16bit_model", "deepspeed_multinode_launcher", "deepspeed_hostfile",
                "deepspeed_exclusion_filter", "deepspeed_inclusion_filter", "offload_optimizer_nvme_path",
                "offload_param_nvme_path")


def _deepspeed(r: Reading, cfg, ds: dict, n: int | None) -> Reading:
    """distributed_type DEEPSPEED with its settings inline (no deepspeed_config_file): the DeepSpeed config accelerate's
    DeepSpeedPlugin builds from them (utils/dataclasses.py:1131-1218: ZeRO stage 2 unless given, the offload
    devices, gradient_accumulation_steps and gradient_clipping; set_mixed_precision :1301-1325 turns bf16/fp16 on
    from mixed_precision), as readers/deepspeed.py reads a DeepSpeed JSON."""
    from .deepspeed import _precision

    mp = str(getattr(cfg.mixed_precision, "value", cfg.mixed_precision))
    if mp == "fp8":
        raise SetupError(f"{_file(r)}: mixed_precision fp8 (Transformer Engine through accelerate) is not modelled; "
                         "use bf16")
    r.set("stack", "deepspeed", "distributed_type")
    r.set("precision", _precision(mp == "bf16", mp == "fp16"), "mixed_precision")
    if n is not None:
        r.set("dp", n, "num_processes")
    r.set("zero", int(ds.get("zero_stage", 2)), "deepspeed_config.zero_stage")
    opt, par = (str(ds.get(k, "none")).lower() for k in ("offload_optimizer_device", "offload_param_device"))
    read_offload(r, opt, par, "deepspeed_config.offload_optimizer_device", "deepspeed_config.offload_param_device")
    gas, clip = ds.get("gradient_accumulation_steps"), ds.get("gradient_clipping")
    if isinstance(gas, int) and not isinstance(gas, bool):
        r.set("grad_accum", gas, "deepspeed_config.gradient_accumulation_steps")
    if isinstance(clip, (int, float)) and not isinstance(clip, bool):
        r.set("max_grad_norm", float(clip), "deepspeed_config.gradient_clipping")
    for k, v in ds.items():
        if k in ("zero_stage", "offload_optimizer_device", "offload_param_device"):
            continue
        if k in ("gradient_accumulation_steps", "gradient_clipping"):
            if not (isinstance(v, (int, float)) and not isinstance(v, bool)):  # "auto": the script's Accelerator's
                r.skip(f"deepspeed_config.{k}", v, "memory and time: filled from the training script's Accelerator")
            continue
        if k in DS_NO_EFFECT:
            r.skip(f"deepspeed_config.{k}", v, "no effect on a step's memory or time")
        elif k == "zero3_init_flag":
            r.skip(f"deepspeed_config.{k}", v, "no effect on a step's memory or time (the model's construction only)")
        else:
            r.unknown.append(f"deepspeed_config.{k}")
    _top_keys(r, cfg, "DEEPSPEED")
    return r


def _top_keys(r: Reading, cfg, dist: str) -> None:
    """The config's keys besides distributed_type, mixed_precision, num_processes and the block of `dist`: no effect,
    read only with another distributed_type, not modelled, or unknown."""
    own = {"FSDP": "fsdp_config", "DEEPSPEED": "deepspeed_config"}.get(dist)
    for k, v in cfg.to_dict().items():
        if k in ("distributed_type", "mixed_precision", "num_processes", own) or (k == "fsdp_config" and not v):
            continue
        if k == "parallelism_config" and v and dist == "FSDP":  # `accelerate launch` runs it under FSDP2 when not
            # empty (commands/launch.py:1261-1262, :1298; utils/launch.py:369-392: the PARALLELISM_CONFIG_* sizes)
            r.skip(k, v, "memory and time: accelerate's N-d parallelism (dp_replicate × dp_shard × tp × cp); "
                         "trainfit shards over all num_processes ranks, without TP or CP")
        elif k in NO_EFFECT:
            if v not in (None, {}) and k.endswith("_config"):
                r.skip(k, v, "read only with its distributed_type")
            else:
                r.skip(k, v, "no effect on a step's memory or time")
        elif k == "downcast_bf16":
            r.skip(k, v, "TPU only")
        elif k == "dynamo_config":
            r.skip(k, v, "memory and time: torch.compile through accelerate (trainfit's --compile is the stacks')")
        else:
            r.unknown.append(k)


def _zero(fsdp: dict) -> int:
    """FSDP2's fsdp_reshard_after_forward (reshard_zero); FSDP1's fsdp_sharding_strategy (FULL_SHARD / HYBRID_SHARD:
    3, SHARD_GRAD_OP: 2, NO_SHARD: 0), by name or accelerate's number (1-5: utils/constants.py
    FSDP_SHARDING_STRATEGY)."""
    if "fsdp_reshard_after_forward" in fsdp:
        return reshard_zero(fsdp["fsdp_reshard_after_forward"])
    return _strategy(fsdp.get("fsdp_sharding_strategy", "FULL_SHARD"))


def reshard_zero(v) -> int:
    """The ZeRO stage of an FSDP reshard_after_forward value as accelerate takes it (its config here, the plugin
    kwargs TrainingArguments builds in hf_args.py): true ZeRO-3, false ZeRO-2, or an FSDP1 strategy name given
    under the FSDP2 key (accelerate accepts both)."""
    if isinstance(v, str):
        return _strategy(v)
    return 3 if v else 2


def _strategy(v) -> int:
    names = {"1": "FULL_SHARD", "2": "SHARD_GRAD_OP", "3": "NO_SHARD", "4": "HYBRID_SHARD", "5": "HYBRID_SHARD_ZERO2"}
    v = names.get(str(v), str(v).upper())
    zero = {"FULL_SHARD": 3, "HYBRID_SHARD": 3, "SHARD_GRAD_OP": 2, "HYBRID_SHARD_ZERO2": 2, "NO_SHARD": 0}.get(v)
    if zero is None:
        raise SetupError(f"fsdp_sharding_strategy {v!r}: use FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD or NO_SHARD")
    return zero
