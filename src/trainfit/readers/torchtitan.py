"""A torchtitan job: a job-config TOML, or a `torchrun ... -m torchtitan.train --section.key value ...` command line,
parsed by torchtitan's own ConfigManager (torchtitan 0.2.2 config/manager.py: CLI > TOML > JobConfig's defaults;
train.py:744-745 parses its arguments the same way). The settings are read from the parsed JobConfig, defaults
included, by torchtitan's semantics (the lines cited in plan/emit_torchtitan.py TORCHTITAN_KEYS); every key the file
sets is then accounted for: mapped, not modelled (with its effect), or unknown."""
from __future__ import annotations

import tomllib
from pathlib import Path

from ..errors import SetupError
from ..analytic.torchao_recipes import MX_RECIPES
from . import Reading, _file
from .cmdline import launcher_world, named_file, split

# keys (section.key) the settings are read from (the writer's keys: emit_torchtitan.TORCHTITAN_KEYS, and these)
MAPPED = {"model.name", "model.flavor", "model.hf_assets_path", "model.converters", "optimizer.name",
          "optimizer.implementation", "optimizer.early_step_in_backward", "training.local_batch_size",
          "training.global_batch_size", "training.seq_len", "training.steps", "training.dtype",
          "training.mixed_precision_param", "training.mixed_precision_reduce", "training.enable_cpu_offload",
          "training.max_norm", "parallelism.data_parallel_replicate_degree", "parallelism.data_parallel_shard_degree",
          "parallelism.fsdp_reshard_after_forward", "parallelism.tensor_parallel_degree",
          "parallelism.pipeline_parallel_degree", "parallelism.pipeline_parallel_schedule",
          "parallelism.pipeline_parallel_microbatch_size", "parallelism.context_parallel_degree",
          "parallelism.expert_parallel_degree", "parallelism.expert_tensor_parallel_degree",
          "parallelism.expert_parallel_comm_backend",
          "parallelism.enable_async_tensor_parallel", "activation_checkpoint.mode", "activation_checkpoint.selective_ac_option", "compile.enable",
          "compile.components", "quantize.linear.float8.enable_fsdp_float8_all_gather",
          "quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp", "quantize.linear.float8.recipe_name",
          "quantize.linear.float8.filter_fqns", "quantize.linear.mx.recipe_name", "quantize.linear.mx.filter_fqns",
          "job.config_file"}
# keys with no effect on a step's memory or time (paths, logging, learning-rate values, timeouts)
NO_EFFECT = ("job.", "metrics.", "lr_scheduler.", "optimizer.lr", "optimizer.eps", "optimizer.weight_decay",
             "training.dataset", "training.gc_debug", "model.tokenizer_path", "model.print_after_conversion",
             "comm.init_timeout_seconds", "comm.train_timeout_seconds", "comm.save_traces", "checkpoint.folder",
             "checkpoint.keep_latest_k", "checkpoint.load_step", "checkpoint.initial_load",
             "checkpoint.exclude_from_loading", "activation_checkpoint.debug", "activation_checkpoint.determinism_check",
             "memory_estimation.", "validation.freq", "validation.dataset")
# keys trainfit does not model, with the direction of their effect (config/job_config.py's line of each)
EFFECT = {
    "parallelism.disable_loss_parallel": "more memory and time: the full-vocabulary logits on every TP rank (:354)",
    "parallelism.context_parallel_rotate_method": "time: alltoall instead of allgather K/V exchange (:446)",
    "parallelism.context_parallel_load_balancer": "time: the causal work per CP rank (:431)",
    "parallelism.pipeline_parallel_first_stage_less_layers": "memory and time: the first stage holds fewer layers; "
                                                             "trainfit splits evenly (:377)",
    "parallelism.pipeline_parallel_last_stage_less_layers": "memory and time: the last stage holds fewer layers; "
                                                            "trainfit splits evenly (:383)",
    "training.dataloader.": "host memory and time only (:209-240)",
    "training.gc_freq": "time: a garbage-collection pause every N steps (:296)",
    "checkpoint.": "more time (saves) and, with async_with_pinned_mem, host memory (:487-641)",
    "activation_checkpoint.preserve_rng_state": "slightly more time when on (:699)",
    "activation_checkpoint.early_stop": "less time: the recomputation stops at the last needed op (:675)",
    "activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns": "less memory: those matmuls recomputed (:661)",
    "compile.backend": "time: trainfit models inductor (:727)",
    "profiling.": "more time and memory while profiling (:42-70)",
    "comm.": "time only when tracing collectives (:839-870)",
    "fault_tolerance.": "more time: fault-tolerant replica groups (:885-900)",
    "quantize.grouped_mm.": "less time: the MoE experts' grouped GEMMs in low precision (:756-825)",
    "quantize.linear.float8.emulate": "time: float8 emulated (:747)",
    "validation.": "more time when enabled: validation steps between training steps",
}


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _cli_keys(args: list[str]) -> dict:
    out = {}
    for i, a in enumerate(args):
        if a.startswith("--") and "." in a:
            k, eq, v = a[2:].partition("=")
            section, _, key = k.rpartition(".")
            key = key[3:] if key.startswith("no-") else key
            out[f"{section}.{key.replace('-', '_')}"] = v if eq else (
                args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else True)
    return out


def parse(args: list[str], source: str):
    """torchtitan's JobConfig for `args` (its ConfigManager: tyro over the JobConfig dataclasses)."""
    try:
        from torchtitan.config import ConfigManager
    except ImportError:
        raise SetupError(f"{source}: reading a torchtitan job needs torchtitan (pip install 'trainfit[torchtitan]')") \
            from None
    import contextlib
    import io

    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said), contextlib.redirect_stdout(said):
            return ConfigManager().parse_args(args)
    except SystemExit:  # tyro's usage error: a title, then the message, between rules of dashes
        import re

        parts = [" ".join(p.replace("│", " ").split()) for p in re.split(r"[-─]{10,}", said.getvalue())]
        why = next((p for p in parts[1:] if p), None) or parts[0] or "a bad key or value"
        raise SetupError(f"{source}: torchtitan's ConfigManager rejected it ({why})") from None
    except (ValueError, TypeError, KeyError, AssertionError) as e:
        raise SetupError(f"{source}: torchtitan's ConfigManager rejected it ({str(e).splitlines()[0]})") from None


FILE_FLAGS = ("--job.config_file", "--job.config-file")  # config/manager.py:66 (_maybe_load_toml)


def _toml_keys(path: Path, text: str) -> dict:
    try:
        return _flat(tomllib.loads(text))
    except tomllib.TOMLDecodeError as e:
        raise SetupError(f"{path}: not valid TOML ({e}): fix the file") from None


def _with_file(args: list[str], found: Path) -> list[str]:
    """`args` with the --job.config_file value replaced by `found`."""
    out = []
    for i, a in enumerate(args):
        k, eq, _ = a.partition("=")
        out.append(f"{k}={found}" if eq and k in FILE_FLAGS else str(found) if i and args[i - 1] in FILE_FLAGS
                   else a)
    return out


def read(path: Path, text: str, dp: int | None = None) -> Reading:
    if path.suffix.lower() == ".toml":
        keys = _toml_keys(path, text)
        args, world = ["--job.config_file", str(path)], None
    else:
        before, args = split(text, str(path), lambda w: w == "torchtitan.train")
        keys, world = _cli_keys(args), launcher_world(before)
        if "job.config_file" in keys:  # its keys under the command line's (manager.py: CLI > TOML > defaults)
            # (torchtitan opens it from where the run starts: config/manager.py:80)
            found = named_file(str(keys["job.config_file"]), path, "--job.config_file", "torchtitan")
            keys = _toml_keys(found, found.read_text(encoding="utf-8", errors="replace")) | keys
            args = _with_file(args, found)
    r = Reading(f"{path} (torchtitan 0.2.2 ConfigManager)")
    cfg = parse(args, str(path))
    _settings(cfg, r, keys, world, dp)
    off = _sections_off(cfg)
    grouped: dict = {}
    converters = set(cfg.model.converters)
    for k, v in keys.items():
        if k.startswith("quantize.linear.") and ".".join(k.split(".")[:3]) not in converters:
            r.skip(k, v, "no effect on a step's memory or time: its converter is not in model.converters")
            continue
        if k in MAPPED:
            continue
        if any(k.startswith(p) for p in NO_EFFECT) or k.split(".")[0] in off:
            r.skip(k, v, "no effect on a step's memory or time")
        elif (hit := next((p for p in EFFECT if k.startswith(p)), None)) is not None:
            if hit.endswith("."):  # a section: one line for its keys
                grouped.setdefault(hit, []).append(f"{k.removeprefix(hit)} = {v!r}")
            else:
                r.skip(k, v, EFFECT[hit])
        else:
            r.unknown.append(k)
    for hit, items in grouped.items():
        r.skip(f"[{hit[:-1]}] {', '.join(items)}", "…", EFFECT[hit])
    return r


def _sections_off(cfg) -> set:
    """The sections switched off (their keys then change nothing): checkpoint.enable, profiling.enable_profiling,
    validation.enable, fault_tolerance.enable, memory_estimation.enable (job_config.py)."""
    flags = {"checkpoint": ("checkpoint", "enable"), "profiling": ("profiling", "enable_profiling"),
             "validation": ("validation", "enable"), "fault_tolerance": ("fault_tolerance", "enable"),
             "memory_estimation": ("memory_estimation", "enable")}
    return {name for name, (sec, key) in flags.items()
            if hasattr(cfg, sec) and not getattr(getattr(cfg, sec), key, False)}


def _precision(t) -> str:
    """training.dtype and mixed_precision_param (job_config.py:275-290; parallelize.py:125-140)."""
    if t.dtype == "bfloat16":
        return "bf16"
    return "amp-bf16" if t.mixed_precision_param == "bfloat16" else "fp32"


def _recompute(ac) -> str:
    """activation_checkpoint.mode / selective_ac_option (distributed/activation_checkpoint.py:27-191)."""
    if ac.mode in ("none", "full"):
        return ac.mode
    if ac.mode == "selective":
        option = str(ac.selective_ac_option)
        if option == "op":
            return "op"
        if not option.isdigit():  # (:177-183: 'op' or digits, else ValueError)
            raise SetupError(f"activation_checkpoint.selective_ac_option {option!r}: torchtitan refuses it (Invalid "
                             "selective AC option: 'op' or a positive int, "
                             "distributed/activation_checkpoint.py:177-183)")
        return f"layer:{int(option) or 1}"  # 0 checkpoints every layer (:39-40: `not ac_freq`), as 1 does
    raise SetupError(f"activation_checkpoint.mode = {ac.mode!r}: trainfit does not model the memory-budget "
                     "recompute; use none, full or selective")


def _settings(cfg, r: Reading, keys: dict, world: int | None, dp: int | None) -> None:
    t, p, ac = cfg.training, cfg.parallelism, cfg.activation_checkpoint
    r.set("stack", "torchtitan", "torchtitan")
    m = cfg.model
    r.model = _model_ref(m.name, m.flavor, m.hf_assets_path, r)
    r.same_model = lambda ref: _builds(ref, m.name, m.flavor)
    r.set("precision", _precision(t), "training.dtype")
    r.set("seq", t.seq_len, "training.seq_len")
    optimizer = {"Adam": "adam", "AdamW": "adamw"}.get(cfg.optimizer.name)
    if optimizer is None:
        raise SetupError(f"optimizer.name = {cfg.optimizer.name!r}: trainfit models torchtitan's Adam and AdamW")
    r.set("optimizer", optimizer, "optimizer.name")
    r.set("optimizer_impl", cfg.optimizer.implementation, "optimizer.implementation")
    if cfg.optimizer.early_step_in_backward:
        r.set("optimizer_in_backward", True, "optimizer.early_step_in_backward")
    r.set("max_grad_norm", float(t.max_norm), "training.max_norm")
    if t.enable_cpu_offload:
        r.set("offload", "params", "training.enable_cpu_offload")
    tp, pp, cp = p.tensor_parallel_degree, p.pipeline_parallel_degree, p.context_parallel_degree
    shard, replicate = p.data_parallel_shard_degree, p.data_parallel_replicate_degree
    if shard == -1:  # the leftover ranks (job_config.py:324; parallel_dims.py)
        if world is not None:
            shard = world // (replicate * tp * pp * cp)
        elif dp is not None:
            shard = dp // replicate
        else:
            r.not_modelled.append("parallelism.data_parallel_shard_degree = -1: the ranks left over; the world size "
                                  "is not in the file: give --dp (default 1)")
            shard = None
    if shard is not None:
        dp = shard * replicate
        r.set("dp", dp, "parallelism.data_parallel_*_degree")
        if shard > 1 and replicate > 1:
            r.not_modelled.append(f"HSDP (replicate {replicate} × shard {shard}): trainfit shards over all {dp} ranks "
                                  "(NB: less memory, more gather traffic than the run)")
        resharded = p.fsdp_reshard_after_forward == "always" or (p.fsdp_reshard_after_forward == "default"
                                                                  and pp == 1)  # parallelize.py:319-327
        # FSDP shards over dp_shard × cp, on whenever either is > 1 (distributed/parallel_dims.py:333-335
        # fsdp_enabled; models/llama3/infra/parallelize.py:125)
        fsdp = shard > 1 or cp > 1
        r.set("zero", (3 if resharded else 2) if fsdp else 0, "parallelism.fsdp_reshard_after_forward")
    r.set("tp", tp, "parallelism.tensor_parallel_degree")
    if tp > 1:  # torchtitan's TP is sequence-parallel (models/llama3/infra/parallelize.py:161-240 apply_tp: the
        # blocks' input and output Shard(1), the norms SequenceParallel)
        r.set("sequence_parallel", True, "parallelism.tensor_parallel_degree")
    if p.enable_async_tensor_parallel:  # (the Setup refuses it without compile, as torchtitan does)
        r.set("tp_comm_overlap", True, "parallelism.enable_async_tensor_parallel")
    r.set("pp", pp, "parallelism.pipeline_parallel_degree")
    r.set("cp", cp, "parallelism.context_parallel_degree")
    if p.expert_parallel_degree > 1:
        r.set("ep", p.expert_parallel_degree, "parallelism.expert_parallel_degree")
        r.set("etp", p.expert_tensor_parallel_degree, "parallelism.expert_tensor_parallel_degree")
    if p.expert_parallel_comm_backend == "deepep":  # ("standard": the all-to-all, trainfit's default; deepep without
        # expert parallelism is refused, as torchtitan does: models/deepseek_v3/infra/parallelize.py:101-106)
        r.set("moe_dispatcher", "deepep", "parallelism.expert_parallel_comm_backend")
    # train.py:196-215: global_batch_size a multiple of local × the data-parallel degree (asserted), the step
    # accumulating global / (local × dp) local batches (train_step's loop, :561), each pipelined when pp > 1
    accum = 1
    if t.global_batch_size > 0 and shard is not None:
        per = t.local_batch_size * shard * replicate
        if t.global_batch_size % per:
            raise SetupError(f"{_file(r)}: training.global_batch_size {t.global_batch_size} is not a multiple of "
                             f"local_batch_size {t.local_batch_size} × data-parallel degree {shard * replicate}: "
                             "torchtitan refuses it (train.py:201-209)")
        accum = t.global_batch_size // per
    if pp > 1:  # one local batch = grad_accum micro-batches of the 1F1B schedule (pipeline_parallel.py:186-199)
        if p.pipeline_parallel_schedule != "1F1B":
            r.skip("parallelism.pipeline_parallel_schedule", p.pipeline_parallel_schedule,
                   "memory and time: trainfit models 1F1B")
        micro = p.pipeline_parallel_microbatch_size
        if t.local_batch_size % micro:  # (distributed/pipeline_parallel.py:189-193 raises)
            raise SetupError(f"{_file(r)}: training.local_batch_size {t.local_batch_size} is not divisible by "
                             f"parallelism.pipeline_parallel_microbatch_size {micro}: torchtitan refuses it "
                             "(distributed/pipeline_parallel.py:189-193)")
        r.set("batch", micro, "parallelism.pipeline_parallel_microbatch_size")
        r.set("grad_accum", t.local_batch_size // micro, "training.local_batch_size")
        if accum > 1:  # a schedule per local batch, run `accum` times: not one schedule of all the micro-batches
            r.skip("training.global_batch_size", t.global_batch_size, f"time: {accum} local batches accumulated, "
                   f"each its own pipeline schedule; the step time is {accum}× the one estimated")
    else:
        r.set("batch", t.local_batch_size, "training.local_batch_size")
        if t.global_batch_size > 0 and shard is not None:
            r.set("grad_accum", accum, "training.global_batch_size")
    r.set("recompute", _recompute(ac), "activation_checkpoint.mode")
    if cfg.compile.enable:
        components = list(cfg.compile.components)
        if components == ["loss"]:
            r.set("compile_loss", True, "compile.components")
        else:
            r.set("compile", True, "compile.enable")
    if "training.steps" in keys and shard is not None:  # the budget: steps × global batch tokens (needs --gpu)
        r.set("tokens", float(t.steps * t.seq_len * (t.global_batch_size if t.global_batch_size > 0 else
                                                      t.local_batch_size * shard * replicate)), "training.steps")
    _quantize(cfg, r)


def _quantize(cfg, r: Reading) -> None:
    """model.converters (job_config.py:118) and [quantize.linear.*] (emit_torchtitan.quantize_sections' inverse)."""
    conv = list(cfg.model.converters)
    for c in conv:
        if c == "quantize.linear.float8":
            f8 = cfg.quantize.linear.float8
            r.set("low_precision", f8.recipe_name or "tensorwise", "quantize.linear.float8.recipe_name")
            if f8.enable_fsdp_float8_all_gather:
                r.set("fp8_all_gather", True, "quantize.linear.float8.enable_fsdp_float8_all_gather")
            _bf16_layers(list(f8.filter_fqns), r)
        elif c == "quantize.linear.mx":
            name = cfg.quantize.linear.mx.recipe_name
            if name in MX_RECIPES:
                r.set("low_precision", "mxfp8", "quantize.linear.mx.recipe_name")
                if MX_RECIPES[name] != "floor":
                    r.set("mx_scale", MX_RECIPES[name], "quantize.linear.mx.recipe_name")
            else:  # torchao's emulated and MXFP4 recipes (MXLinearRecipeName at v0.16.0 config.py:42-47)
                r.skip("quantize.linear.mx.recipe_name", name, "memory and time: an MX recipe trainfit does not model "
                       "(it models mxfp8_cublas and mxfp8_cublas_rceil)")
            _bf16_layers(list(cfg.quantize.linear.mx.filter_fqns), r)
        else:
            r.skip("model.converters", c, "memory and time: a converter trainfit does not model")


def _bf16_layers(fqns: list[str], r: Reading) -> None:
    """The blocks kept in bf16 ("layers.<i>.", analytic/torchao_recipes.filter_fqns): a run from block 0 is
    --bf16-first-layers, the rest (which must end at the last block: checked against the model) --bf16-last-layers."""
    idx = sorted(int(f.split(".")[1]) for f in fqns if f.startswith("layers.") and f.split(".")[1].isdigit())
    first = 0
    while first < len(idx) and idx[first] == first:
        first += 1
    rest = idx[first:]
    if first:
        r.set("bf16_first_layers", first, "filter_fqns")
    if rest:
        r.set("bf16_last_layers", len(rest), "filter_fqns")

        def ends_at_last(spec, rest=rest):
            if rest != list(range(spec.layers - len(rest), spec.layers)):
                raise SetupError(f"filter_fqns keeps blocks {rest} in bf16: trainfit models the first and last "
                                 f"blocks only (of {spec.layers})")
        r.checks.append(ends_at_last)
    for f in fqns:
        if not f.startswith("layers.") and f != "output":
            r.skip("filter_fqns", f, "more time, less low-precision memory: that module stays in bf16")


def _builds(ref: str, name: str, flavor: str) -> bool:
    """Whether model `ref` is one torchtitan builds for model `name` `flavor`: its registry flavor of that shape."""
    from ..models.resolve import load_model
    from ..plan.emit_torchtitan import torchtitan_flavor
    from ..spec import ModelSpec

    spec = load_model(ref)
    return isinstance(spec, ModelSpec) and (torchtitan_flavor(spec) or ())[:2] == (name, flavor)


def _model_ref(name: str, flavor: str, assets: str, r: Reading) -> str | None:
    """The model of a torchtitan flavor: <hf_assets_path>/config.json when downloaded, else the catalog model of the
    flavor's shape (plan.emit_torchtitan.torchtitan_flavor), the one whose hub id ends in hf_assets_path's folder
    name first."""
    from ..stacks import get_stack

    facts = get_stack("torchtitan").facts
    # the registry models trainfit models: [models]' tables and [moe_models] model
    built = {k for k, v in facts["models"].items() if isinstance(v, dict)} | set(facts["moe_models"]["model"].values())
    if name not in built:
        raise SetupError(f"{_file(r)}: model.name {name!r} (flavor {flavor}) is a torchtitan model trainfit does not "
                         f"model on --stack torchtitan (it models {', '.join(sorted(built))}); estimate its "
                         "architecture with --stack hf or megatron, e.g. `trainfit estimate MODEL --stack megatron`")
    moe = facts["moe_models"]
    if flavor in moe.get("refused_flavors", {}).get(name, ()):
        # (flavors that do not train as torchtitan 0.2.2 ships them: stacks/torchtitan.toml [moe_models])
        raise SetupError(f"{_file(r)}: model.name {name!r} flavor {flavor!r}: {moe['refused_why']}; "
                         f"{moe['refused_instead']}")
    flavors = moe.get(name)
    if isinstance(flavors, dict) and flavor not in flavors:
        raise SetupError(f"{_file(r)}: model.name {name!r} flavor {flavor!r} is not one trainfit models on --stack "
                         f"torchtitan (it models {name} {', '.join(sorted(flavors))}: stacks/torchtitan.toml "
                         "[moe_models]); use one of those flavors, or --stack hf")
    cfg = Path(assets) / "config.json"
    if cfg.is_file():
        return str(cfg)
    from ..models.resolve import catalog_entry, catalog_names, load_model
    from ..plan.emit_torchtitan import torchtitan_flavor

    tail = Path(assets).name.lower()
    hits = []
    for n in catalog_names():
        try:
            spec = load_model(n)
            found = torchtitan_flavor(spec)
        except Exception:  # noqa: BLE001  (a catalog entry another reader would refuse: not this flavor)
            continue
        if found is not None and found[:2] == (name, flavor):
            hub = str(catalog_entry(n).get("hf_id") or "").lower()
            hits.append((hub.split("/")[-1] != tail, n))
    if not hits:
        r.not_modelled.append(f"model {name} {flavor}: no catalog model has its shape; pass --model")
        return None
    return min(hits)[1]
