"""A DeepSpeed config JSON, parsed by DeepSpeed's own DeepSpeedConfig (deepspeed 0.19.8 runtime/config.py:439): its
batch identity, ZeRO, precision, clipping and offload blocks as DeepSpeed resolves them. The data-parallel degree is
the file's train_batch_size / (micro-batch × accumulation) (× sequence_parallel_size: config.py:461-469);
DeepSpeedConfig itself takes the world size from torch.distributed, so it parses the file as rank 0 of that many.
"auto" values are filled as the HF Trainer fills them from TrainingArguments (transformers 5.24.0
integrations/deepspeed.py:136-192 trainer_config_process) when a TrainingArguments file is read with it (`_fill`),
else named in the notes."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from ..errors import SetupError
from ..stacks import get_stack
from ..stacks.deepspeed_config import OPTIMIZER_TYPES
from . import Reading, _file

# zero_optimization keys trainfit models at DeepSpeed's defaults (stacks/deepspeed.toml facts of the same name)
ZERO_FACTS = ("contiguous_gradients", "reduce_bucket_size", "allgather_bucket_size", "stage3_prefetch_bucket_size",
              "stage3_param_persistence_threshold", "stage3_max_live_parameters", "stage3_max_reuse_distance",
              "sub_group_size")
NO_EFFECT = ("steps_per_print", "scheduler", "zero_allow_untested_optimizer", "tensorboard", "wandb", "csv_monitor",
             "comet", "checkpoint", "gradient_predivide_factor", "prescale_gradients", "dump_state")
EFFECT = {"wall_clock_breakdown": "more time when true: synchronised timers",
          "flops_profiler": "more time while profiling", "memory_breakdown": "more time when true",
          "communication_data_type": "time: the gradient reduction's dtype",
          "data_types": "memory: the gradient accumulation dtype (grad_accum_dtype)",
          "torch_autocast": "memory and time: DeepSpeed's autocast mode",
          "compression_training": "memory and time", "sparse_attention": "memory and time",
          "pipeline": "memory and time: DeepSpeed's pipeline engine",
          "zero_force_ds_cpu_optimizer": "time: the CPU optimizer", "aio": "time of NVMe offload",
          # the optimizer DeepSpeed builds (runtime/engine.py:2476 _configure_basic_optimizer) of a type trainfit
          # has no --optimizer for (OPTIMIZERS reads the others): its type sets the states' bytes
          "optimizer": "memory: its type sets the optimizer states; trainfit counts --optimizer's (adamw by "
                       "default)"}
WHEN_TRUE = ("wall_clock_breakdown", "memory_breakdown")  # switches with an effect only when on
ZERO_NO_EFFECT = ("stage3_gather_16bit_weights_on_model_save", "gather_16bit_weights_on_model_save",
                  "round_robin_gradients", "load_from_fp32_weights", "elastic_checkpoint")
ZERO_EFFECT = {"reduce_scatter": "time", "allgather_partitions": "time: one all-gather or a broadcast per partition",
               "zero_quantized_weights": "less time and memory: ZeRO++ qwZ",
               "zero_quantized_gradients": "less time: ZeRO++ qgZ", "zero_hpz_partition_size": "more memory, "
               "less time: ZeRO++ hpZ", "memory_efficient_linear": "memory"}


def read_offload(r: Reading, opt: str, par: str, opt_key: str, par_key: str) -> None:
    """ZeRO's offload devices (`opt`, `par`: "none", "cpu" or "nvme"), read from the file's keys `opt_key` and
    `par_key` (a DeepSpeed config's, or accelerate's inline deepspeed_config): --offload params needs both
    (stage3.py:824-831: two switches; with the parameters alone the optimizer states stay on the GPU), --offload
    optimizer the optimizer's alone."""
    if par != "none" and opt == "none":
        r.skip(par_key, par, "less GPU memory: the 16-bit parameter partitions in host memory; trainfit's --offload "
               "params also moves the optimizer's (ZeRO-Infinity with offload_optimizer), so none is modelled here")
    elif par != "none":
        r.set("offload", "params", par_key)
    elif opt != "none":
        r.set("offload", "optimizer", opt_key)
    if "nvme" in (opt, par):
        r.skip("offload device", "nvme", "time: trainfit models CPU offload (ZeRO-Infinity to NVMe is slower)")


def read(path: Path, text: str, dp: int | None = None) -> Reading:
    try:
        raw = json.loads(text)
    except ValueError as e:
        raise SetupError(f"{path}: not valid JSON ({e}): fix the file") from None
    r = Reading(f"{path} (deepspeed DeepSpeedConfig)")
    _shape(raw, path)
    auto = [k for k, v in raw.items() if v == "auto"]
    zraw = dict(raw.get("zero_optimization") or {})
    auto += [f"zero_optimization.{k}" for k, v in zraw.items() if v == "auto"]
    # bf16/fp16 "enabled": "auto" (DeepSpeed's own parse would take it as off): filled by _fill
    amp = {b: {k: v for k, v in raw[b].items() if k != "enabled"} for b in ("bf16", "fp16")
           if isinstance(raw.get(b), dict) and raw[b].get("enabled") == "auto"}
    auto += [f"{b}.enabled" for b in amp]
    cfg = parse({k: v for k, v in raw.items() if v != "auto"} | amp | (
        {"zero_optimization": {k: v for k, v in zraw.items() if v != "auto"}} if zraw else {}), r, str(path))
    r.together.append(lambda readings: _fill(r, auto, cfg, raw, readings))
    if "activation_checkpointing" in raw:
        r.together.append(lambda readings: _trainer_checkpoints(r, readings))
    _settings(cfg, raw, r, auto)
    facts = get_stack("deepspeed")
    for k, v in raw.items():
        if k in MAPPED or v == "auto" or (k == "optimizer" and "optimizer" in r.values):  # (_settings read its type)
            continue
        if k in NO_EFFECT or (k in WHEN_TRUE and not v):
            r.skip(k, v, "no effect on a step's memory or time")
        elif k in EFFECT:
            r.skip(k, v, EFFECT[k])
        else:
            r.unknown.append(k)
    for k, v in zraw.items():
        if k in ("stage", "offload_optimizer", "offload_param") or v == "auto":
            continue
        if k == "overlap_comm":  # (config.py:384-386: None resolves to stage == 3)
            stage = cfg.zero_optimization_stage
            if v and stage in facts.fact("overlap_comm", "choice"):
                r.set("overlap_comm", True, "zero_optimization.overlap_comm")
            elif stage in facts.fact("overlap_comm", "stages") and not v:
                r.skip("zero_optimization.overlap_comm", v, "more time: ZeRO-3 then reduces on the backward's stream "
                                                            "(trainfit models its default, overlapped)")
            elif v and stage == 0:
                r.skip("zero_optimization.overlap_comm", v, "no effect: ZeRO-0 reduces after the backward "
                                                            "(engine.allreduce_gradients)")
            continue
        if k in ZERO_FACTS:
            if v != facts.fact(k):
                r.skip(f"zero_optimization.{k}", v, f"memory and time: trainfit models DeepSpeed's {facts.fact(k)!r}")
        elif k in ZERO_NO_EFFECT:
            r.skip(f"zero_optimization.{k}", v, "no effect on a step's memory or time")
        elif k in ZERO_EFFECT:
            r.skip(f"zero_optimization.{k}", v, ZERO_EFFECT[k])
        else:
            r.unknown.append(f"zero_optimization.{k}")
    return r


def _shape(raw: dict, path: Path) -> None:
    """The values trainfit reads before DeepSpeed's own parse, of the types DeepSpeed takes (runtime/config.py: the
    batch sizes and sequence_parallel_size whole numbers, zero_optimization an object: DeepSpeedZeroConfig(**it));
    else one line (a TypeError traceback, or a batch of 2.0 or 1e400 dropped without a word)."""
    for k in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
              "sequence_parallel_size"):
        v = raw.get(k)
        if v is not None and v != "auto" and not (isinstance(v, int) and not isinstance(v, bool) and v > 0):
            raise SetupError(f"{path}: {k} is {v!r}, not a positive whole number (DeepSpeed batches and ranks "
                             "count sequences and processes): fix the file")
    z = raw.get("zero_optimization")
    if z is not None and not isinstance(z, dict):
        raise SetupError(f"{path}: zero_optimization is {z!r}, not an object ({{\"stage\": N, ...}}: DeepSpeed "
                         "builds DeepSpeedZeroConfig from its keys): fix the file")


# DeepSpeed's keys the HF Trainer fills from TrainingArguments -> their fields (transformers 5.24.0
# integrations/deepspeed.py:144-161, 183-184); the batch and clipping are the TrainingArguments reading's own settings
TRAINER = {"train_micro_batch_size_per_gpu": "per_device_train_batch_size",
           "gradient_accumulation_steps": "gradient_accumulation_steps",
           "train_batch_size": "world size × per_device_train_batch_size × gradient_accumulation_steps",
           "gradient_clipping": "max_grad_norm", "bf16.enabled": "bf16", "fp16.enabled": "fp16"}
AMP_AUTO = {"bf16.enabled", "fp16.enabled"}  # the "auto" keys that decide the precision (_fill sets it then)
# TRAINER's keys a TrainingArguments reading sets as trainfit settings -> those settings (bf16/fp16.enabled: its fills)
MATCHED = {"train_micro_batch_size_per_gpu": "batch", "gradient_accumulation_steps": "grad_accum",
           "gradient_clipping": "max_grad_norm"}
# filled from the model's hidden size when the Trainer builds the engine (integrations/deepspeed.py:203-241)
HIDDEN = ("zero_optimization.reduce_bucket_size", "zero_optimization.stage3_prefetch_bucket_size",
          "zero_optimization.stage3_param_persistence_threshold")


def _fill(r: Reading, auto: list, cfg, raw: dict, readings: list) -> None:
    """The "auto" values `auto` as the HF Trainer fills them from the TrainingArguments read with `r` (its `fills`),
    else named; bf16/fp16.enabled set the precision (off when nothing fills them). The file's other values of those
    keys must equal the TrainingArguments' (_match)."""
    trainer = next((o for o in readings if o.fills), None)
    fills = trainer.fills if trainer else None
    if trainer:
        _match(r, raw, trainer)
    for k in auto:
        if k in TRAINER:
            if fills is None:
                off = ", read as false" if k.endswith(".enabled") else ""
                r.not_modelled.append(f"{k} = 'auto': the HF Trainer fills it from TrainingArguments' {TRAINER[k]}, "
                                      f"and none were read with it{off}: pass them to check too")
        elif k in HIDDEN:
            r.not_modelled.append(f"{k} = 'auto': not modelled (memory and time: the HF Trainer fills it from the "
                                  "model's hidden size; trainfit models DeepSpeed's default)")
        else:
            r.not_modelled.append(f"{k} = 'auto': not modelled (left to the HF Trainer)")
    if not AMP_AUTO & set(auto):
        return
    fills = fills or {}
    bf16 = fills.get("bf16.enabled", False) if "bf16.enabled" in auto else cfg.bfloat16_config.enabled
    fp16 = fills.get("fp16.enabled", False) if "fp16.enabled" in auto else cfg.float16_config.enabled
    if bf16 and fp16:  # (DeepSpeed's config.py:511-512)
        raise SetupError(f"{r.source}: bf16 and fp16 are both enabled once TrainingArguments fill 'auto': DeepSpeed "
                         "rejects it (bfloat16 and fp16 modes cannot be simultaneously enabled)")
    r.set("precision", _precision(bf16, fp16), "bf16/fp16.enabled")


def _trainer_checkpoints(r: Reading, readings: list) -> None:
    """Under the HF Trainer (a TrainingArguments-style reading with `r`) the activation_checkpointing block has no
    effect: DeepSpeed's engine never applies it (runtime/engine.py: only deepspeed.checkpointing's own callers do, as
    Megatron-DeepSpeed) and transformers never calls deepspeed.checkpointing; the model checkpoints by
    TrainingArguments' gradient_checkpointing (torch.utils.checkpoint), which decides --recompute."""
    if not any(o.fills for o in readings if o is not r):
        return
    r.values.pop("recompute", None)
    r.not_modelled = [x for x in r.not_modelled if not x.startswith("activation_checkpointing.")]
    r.skip("activation_checkpointing", "…", "no effect under the HF Trainer: TrainingArguments' "
           "gradient_checkpointing decides")


def _match(r: Reading, raw: dict, trainer: Reading) -> None:
    """The HF Trainer refuses a value in `raw` other than "auto" that differs from its TrainingArguments' (`trainer`):
    transformers 5.24.0 integrations/deepspeed.py:130-132 fill_match, raised at :258-263 trainer_config_finalize."""
    hf = {k: trainer.values[n] for k, n in MATCHED.items() if n in trainer.values} | trainer.fills
    bad = []
    for k, want in hf.items():
        block, _, key = k.rpartition(".")
        node = raw.get(block) if block else raw
        ds = node.get(key) if isinstance(node, dict) else None
        if ds is not None and ds != "auto" and ds != want:
            bad.append(f"{k} {ds!r} vs {TRAINER[k]} {want!r}")
    if bad:
        raise SetupError(f"{_file(r)}: {', '.join(bad)} (TrainingArguments of {_file(trainer)}): the HF Trainer refuses "
                         "DeepSpeed values that mismatch its TrainingArguments: set them to \"auto\" or make them "
                         "equal")


def _precision(bf16: bool, fp16: bool) -> str:
    """DeepSpeed's bf16 / fp16 modes: 16-bit weights with fp32 masters, else fp32."""
    return "bf16-master" if bf16 else "fp16-master" if fp16 else "fp32"


MAPPED = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping",
          "bf16", "bfloat16", "fp16", "zero_optimization", "activation_checkpointing", "sequence_parallel_size",
          "expert_parallel")


def read_optimizer(cfg, r: Reading) -> None:
    """The optimizer block's type as trainfit's --optimizer (stacks/deepspeed_config.py OPTIMIZER_TYPES, as
    DeepSpeedConfig spells it: DeepSpeed's own names lower-cased, DEEPSPEED_OPTIMIZERS); SGD with a momentum is
    trainfit's momentum. Another type stays listed as changing the optimizer states (EFFECT)."""
    from deepspeed.runtime.config import DEEPSPEED_OPTIMIZERS

    momentum = (cfg.optimizer_params or {}).get("momentum", 0)
    for ours, kind in OPTIMIZER_TYPES.items():
        if cfg.optimizer_name == (kind.lower() if kind.lower() in DEEPSPEED_OPTIMIZERS else kind) and \
                (ours != "sgd" or not momentum) and (ours != "momentum" or momentum):
            r.set("optimizer", ours, "optimizer.type")
            return


def _config_class(source: str):
    """deepspeed.runtime.config.DeepSpeedConfig, imported quietly: importing deepspeed detects the accelerator and
    logs "Setting accelerator to CPU" through its logger, whose handler writes to stdout (deepspeed/utils/logging.py
    LoggerFactory.create_logger: StreamHandler(stream=sys.stdout)), which would break `check --json` and one-line
    errors. That import-time line is dropped; the logger's later lines go to stderr."""
    import contextlib
    import io
    import logging

    try:
        with contextlib.redirect_stdout(io.StringIO()):
            from deepspeed.runtime.config import DeepSpeedConfig
    except ImportError:
        raise SetupError(f"{source}: reading a DeepSpeed config needs deepspeed (pip install deepspeed)") from None
    for h in logging.getLogger("DeepSpeed").handlers:
        if type(h) is logging.StreamHandler:  # (its own: not a subclass another tool attached, pytest's capture)
            h.setStream(_Stderr())
    return DeepSpeedConfig


class _Stderr:
    """A stream that writes to whatever sys.stderr is at the time (a handler keeps the object it was given)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def parse(d: dict, r: Reading, source: str):
    """DeepSpeed's own parse of `d` as one rank sees it (train_batch_size per rank: its world size is 1 here)."""
    DeepSpeedConfig = _config_class(source)
    micro, accum, total = (d.get("train_micro_batch_size_per_gpu"), d.get("gradient_accumulation_steps"),
                           d.get("train_batch_size"))
    one = dict(d)
    if not micro and not total:  # all "auto" (the HF Trainer's): DeepSpeed parses the rest with one sequence
        one.update(train_micro_batch_size_per_gpu=1, gradient_accumulation_steps=1, train_batch_size=1)
    elif micro and accum:
        one["train_batch_size"] = micro * accum
    elif total and (micro or accum):
        raise SetupError(f"{source}: give train_micro_batch_size_per_gpu and gradient_accumulation_steps (trainfit "
                         "cannot tell the data-parallel degree from train_batch_size and one of them)")
    try:
        return DeepSpeedConfig(one)
    except (AssertionError, ValueError, TypeError, KeyError) as e:
        raise SetupError(f"{source}: DeepSpeed rejects it ({str(e).splitlines()[0] if str(e) else type(e).__name__})")\
            from None


# expert_parallel keys at AutoEP's defaults that trainfit's --ep models (auto_ep_config.py:42-50 parse_autoep_config;
# the preset is found from the model's type when unnamed, stacks/deepspeed.toml [expert_parallel] families)
EP_MODELLED = {"enabled": None, "autoep_size": None, "expert_tensor_parallel_size": 1, "preset_model": None,
               "comm_backend": "comm"}


def read_expert_parallel(cfg, raw: dict, r: Reading) -> None:
    """AutoEP's block (runtime/config.py:171-176, parsed by DeepSpeed into cfg.expert_parallel_config): enabled with
    autoep_size N is --ep N; its other keys away from their defaults are named as not modelled."""
    block = raw.get("expert_parallel")
    if not isinstance(block, dict):
        return
    ep = cfg.expert_parallel_config
    if ep.enabled:
        r.set("ep", int(ep.autoep_size), "expert_parallel.autoep_size")
    for k, v in block.items():
        if k in EP_MODELLED and (EP_MODELLED[k] is None or v == EP_MODELLED[k]):
            continue
        r.skip(f"expert_parallel.{k}", v, "memory and time: trainfit models AutoEP's defaults (the all-to-all of "
                                          "comm_backend 'comm', separate gate and up GEMMs, no expert TP)")


def _settings(cfg, raw: dict, r: Reading, auto: list) -> None:
    r.set("stack", "deepspeed", "deepspeed")
    micro, accum = raw.get("train_micro_batch_size_per_gpu"), raw.get("gradient_accumulation_steps")
    if isinstance(micro, int):
        r.set("batch", cfg.train_micro_batch_size_per_gpu, "train_micro_batch_size_per_gpu")
    if isinstance(accum, int):
        r.set("grad_accum", cfg.gradient_accumulation_steps, "gradient_accumulation_steps")
    sp = raw.get("sequence_parallel_size", 1)
    if sp > 1:
        r.set("ulysses", sp, "sequence_parallel_size")
    total = raw.get("train_batch_size")
    if isinstance(total, int) and isinstance(micro, int) and isinstance(accum, int):
        dp, left = divmod(total * sp, micro * accum)  # config.py:602-605 (train = micro × accumulation × world)
        if left or dp < 1:
            raise SetupError(f"train_batch_size {total} is not micro-batch {micro} × accumulation {accum} × a whole "
                             "number of ranks: DeepSpeed would refuse it")
        r.set("dp", dp, "train_batch_size")
    r.set("zero", int(cfg.zero_optimization_stage), "zero_optimization.stage")
    if not AMP_AUTO & set(auto):  # (else _fill)
        r.set("precision", _precision(cfg.bfloat16_config.enabled, cfg.float16_config.enabled), "bf16/fp16.enabled")
    if "gradient_clipping" in raw and raw["gradient_clipping"] != "auto":
        r.set("max_grad_norm", float(cfg.gradient_clipping), "gradient_clipping")
    z = cfg.zero_config
    opt = getattr(z.offload_optimizer, "device", None) if z.offload_optimizer else None
    par = getattr(z.offload_param, "device", None) if z.offload_param else None
    opt, par = (str(getattr(x, "value", x)) if x is not None else "none" for x in (opt, par))
    read_offload(r, opt, par, "zero_optimization.offload_optimizer", "zero_optimization.offload_param")
    read_optimizer(cfg, r)
    read_expert_parallel(cfg, raw, r)
    if "activation_checkpointing" in raw:  # DeepSpeed's checkpointing API (the model must call it: HF
        # gradient_checkpointing=True): every layer recomputed, as the writer emits it
        r.set("recompute", "full", "activation_checkpointing")
        ac = cfg.activation_checkpointing_config
        for k in ("partition_activations", "cpu_checkpointing", "contiguous_memory_optimization"):
            if getattr(ac, k, False):
                r.skip(f"activation_checkpointing.{k}", True, "less memory: trainfit models plain checkpoints")
