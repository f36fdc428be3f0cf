"""The settings of a run read from the live objects a trainer holds before its first step: the model (a transformers
model's config, a peft adapter, gradient checkpointing, the weights' dtype), the optimizer (its class and the
hyper-parameters that change memory) and the precision. The trainer-specific parts (TrainingArguments, accelerate's
state, torchtitan's job config) are in hf.py and torchtitan.py; they all end in `request` here."""
from __future__ import annotations

from ..errors import ConfigError, SetupError
from ..setup import Request


# -- the optimizer -----------------------------------------------------------------------------------------------
def unwrap_optimizer(optimizer):
    """The optimizer a wrapper holds: accelerate's AcceleratedOptimizer (the HF Trainer's self.optimizer), a torch
    Optimizer itself that keeps the real one as `.optimizer` (accelerate 1.15 optimizer.py:38)."""
    while hasattr(optimizer, "optimizer") and (type(optimizer).__name__ == "AcceleratedOptimizer"
                                               or not hasattr(optimizer, "param_groups")):
        optimizer = optimizer.optimizer
    return optimizer


def _torch_impl(defaults: dict, device: str) -> str:
    """The kernel torch runs for an optimizer built with fused/foreach left at None: foreach when every parameter is
    on a device with foreach kernels (CUDA), else the for-loop (torch/optim/optimizer.py:161-186
    _default_to_fused_or_foreach)."""
    if defaults.get("fused"):
        return "fused"
    if defaults.get("foreach") is None:
        return "foreach" if device == "cuda" else "for-loop"
    return "foreach" if defaults["foreach"] else "for-loop"


def optimizer_settings(optimizer, device: str) -> dict:
    """{optimizer, optimizer_impl} of a live optimizer; one line for one whose states trainfit does not model."""
    opt = unwrap_optimizer(optimizer)
    cls, module = type(opt).__name__, type(opt).__module__
    defaults = getattr(opt, "defaults", {}) or {}
    if defaults.get("amsgrad"):  # (torch/optim/adamw.py: amsgrad keeps max_exp_avg_sq, a third state)
        raise SetupError(f"{cls}(amsgrad=True) keeps a third state (max_exp_avg_sq) that trainfit does not model; "
                         "build it with amsgrad=False")
    if module.startswith("bitsandbytes"):
        # bitsandbytes 0.50 optim/optimizer.py:120-135: Optimizer2State/1State keep args.optim_bits and is_paged
        bits, paged = getattr(getattr(opt, "args", None), "optim_bits", 32), bool(getattr(opt, "is_paged", False))
        if "Lion" in cls and bits == 32 and not paged:
            return {"optimizer": "lion"}
        if "Adam" in cls and bits == 8:
            return {"optimizer": "paged-adamw-8bit" if paged else "adamw-8bit"}
        if "Adam" in cls and paged:
            return {"optimizer": "paged-adamw"}
        raise SetupError(f"bitsandbytes' {cls} ({bits}-bit, {'paged' if paged else 'not paged'}) is not modelled: "
                         "trainfit models AdamW8bit, PagedAdamW8bit, PagedAdamW and Lion (32-bit)")
    if module.startswith("torchao"):  # torchao 0.18 optim/adam.py:309-405
        names = {"AdamW8bit": "adamw-torchao-8bit", "AdamW4bit": "adamw-torchao-4bit", "AdamWFp8": "adamw-torchao-fp8"}
        if cls in names:
            return {"optimizer": names[cls]}
        raise SetupError(f"torchao's {cls} is not modelled: trainfit models {', '.join(names)}")
    if cls == "Adafactor":  # torch.optim.Adafactor or transformers.optimization.Adafactor (factored second moment)
        return {"optimizer": "adafactor"}
    if cls in ("AdamW", "Adam"):
        return {"optimizer": cls.lower(), "optimizer_impl": _torch_impl(defaults, device)}
    if cls == "SGD":  # torch/optim/sgd.py: a momentum_buffer per parameter only when momentum != 0
        return {"optimizer": "momentum" if defaults.get("momentum") else "sgd",
                "optimizer_impl": _torch_impl(defaults, device)}
    raise SetupError(f"optimizer {module}.{cls} is not modelled: trainfit models torch's AdamW, Adam, SGD and "
                     "Adafactor, bitsandbytes' 8-bit/paged AdamW and Lion, torchao's low-bit AdamW")


def optimizer_groups(optimizer, model) -> list[list[int]] | None:
    """The live optimizer's param groups as positions in model.parameters(), in the optimizer's own order: the
    trace engine steps the same groups (trace/user.py). The HF Trainer's create_optimizer makes two, the parameters
    with weight decay then those without (biases and norms; transformers 5.24 trainer.py:1272-1286, named by
    get_decay_parameter_names, :1408-1418), so its for-loop AdamW reaches lm_head right after the last layer's
    down_proj, not after the final norm. None when the optimizer holds a tensor that is not one of the model's
    parameters (the model's own order is traced then)."""
    if optimizer is None:
        return None
    where = {id(p): i for i, p in enumerate(model.parameters())}
    groups = [[where.get(id(p)) for p in g["params"]] for g in unwrap_optimizer(optimizer).param_groups]
    if any(i is None for g in groups for i in g):
        return None
    return [g for g in groups if g]


# -- the precision -----------------------------------------------------------------------------------------------
def precision_of(weights: str, autocast: str | None) -> str:
    """trainfit's --precision of weights in `weights` ("fp32", "bf16", "fp16") under an autocast dtype (None: off):
    fp32 weights under autocast are amp-bf16/amp-fp16 (HF Trainer bf16=True/fp16=True, accelerate's
    mixed_precision), 16-bit weights are trained as they are (bf16)."""
    if autocast not in (None, "bf16", "fp16"):
        raise SetupError(f"autocast to {autocast} is not modelled: bf16, fp16 or none")
    if weights == "fp32":
        return {None: "fp32", "bf16": "amp-bf16", "fp16": "amp-fp16"}[autocast]
    if weights == "bf16" and autocast in (None, "bf16"):
        return "bf16"
    raise SetupError(f"{weights} weights under {autocast or 'no'} autocast are not modelled: train fp32 weights "
                     "(with bf16/fp16 autocast) or bf16 weights")


DTYPES = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16"}


# -- the model ---------------------------------------------------------------------------------------------------
def base_model(model):
    """The transformers model under a peft wrapper (PeftModel.get_base_model) or a DDP/FSDP wrapper (`.module`)."""
    while hasattr(model, "module") and type(model).__name__ in ("DistributedDataParallel", "FullyShardedDataParallel"):
        model = model.module
    if hasattr(model, "get_base_model") and hasattr(model, "peft_config"):
        model = model.get_base_model()
    return model


def model_spec(model):
    """trainfit's ModelSpec of a live transformers model (its config, with its own class as the architecture, so the
    head is the one trained); None for a module without a config trainfit reads (the trace engine runs it)."""
    from ..models.resolve import spec_from_config

    base = base_model(model)
    config = getattr(base, "config", None)
    if config is None or not hasattr(config, "to_dict"):
        return None
    data = {**config.to_dict(), "architectures": [type(base).__name__]}
    try:
        return spec_from_config(data, getattr(config, "name_or_path", "") or type(base).__name__, source="live model")
    except ConfigError:
        return None


def model_settings(model) -> dict:
    """device, the weights' dtype, gradient checkpointing and LoRA of a live model."""
    params = [p for p in model.parameters()]
    if not params:
        raise SetupError(f"{type(model).__name__} has no parameters: nothing to train")
    out = {"device": "cuda" if params[0].device.type == "cuda" else "cpu"}
    if params[0].device.type not in ("cuda", "cpu"):
        raise SetupError(f"the model is on {params[0].device.type}: trainfit models CUDA GPUs and the CPU")
    trainable = [p for p in params if p.requires_grad]
    float_dtypes = [str(p.dtype) for p in params if p.is_floating_point()]
    weights = max(set(float_dtypes), key=float_dtypes.count) if float_dtypes else "torch.float32"
    out["weights"] = DTYPES.get(weights, weights)
    base = base_model(model)
    # transformers 5.24 modeling_utils.py:3301-3305: any module with gradient_checkpointing set (one per layer stack)
    if any(getattr(m, "gradient_checkpointing", False) is True for m in base.modules()):
        out["recompute"] = "full"
    peft_config = getattr(model, "peft_config", None)
    if isinstance(peft_config, dict) and peft_config:
        out.update(lora_settings(model, peft_config, trainable))
    return out


def lora_settings(model, peft_config: dict, trainable) -> dict:
    """--lora-rank, --lora-targets, --dora, --lora-dtype and --quant of a peft LoRA model (peft 0.21 LoraConfig: r,
    target_modules, use_dora; the base's quantization_config: bitsandbytes' load_in_4bit/8bit, bnb_4bit_quant_type)."""
    if len(peft_config) != 1:
        raise SetupError(f"the model has {len(peft_config)} peft adapters; trainfit models one LoRA adapter")
    (cfg,) = peft_config.values()
    if str(getattr(cfg, "peft_type", "")).split(".")[-1] != "LORA":
        kind = getattr(cfg, "peft_type", type(cfg).__name__)
        raise SetupError(f"peft's {kind} is not modelled: trainfit models LoRA")
    if getattr(cfg, "rank_pattern", None):
        raise SetupError("a LoRA rank_pattern (ranks per module) is not modelled: one rank r for every target")
    targets = cfg.target_modules
    targets = targets if isinstance(targets, str) else target_names(base_model(model), targets)
    out = {"lora_rank": int(cfg.r), "lora_targets": targets, "dora": bool(getattr(cfg, "use_dora", False))}
    lora = [p for p in trainable if p.is_floating_point()]
    out["lora_dtype"] = "fp32" if lora and all(str(p.dtype) == "torch.float32" for p in lora) else "weight"
    quant = getattr(getattr(base_model(model), "config", None), "quantization_config", None)
    if quant is not None:
        q = quant if isinstance(quant, dict) else quant.to_dict()
        if q.get("load_in_4bit"):
            out["quant"] = q.get("bnb_4bit_quant_type", "fp4")
        elif q.get("load_in_8bit"):
            out["quant"] = "int8"
        else:
            raise SetupError(f"a base quantised with {q.get('quant_method')} is not modelled: trainfit models "
                             "bitsandbytes' nf4, fp4 and int8")
    return out


def target_names(base, targets) -> str:
    """--lora-targets of peft's target_modules: module names, or the full names peft resolves all-linear to (peft 0.21
    tuners_utils: the injected modules' qualified names), as their last components when every module of those names
    has an adapter; LoRA on some layers only is refused."""
    leaves = sorted({t.rsplit(".", 1)[-1] for t in targets})
    if all("." not in t for t in targets):
        return ",".join(leaves)
    for leaf in leaves:
        every = {n for n, _ in base.named_modules() if n.rsplit(".", 1)[-1] == leaf and hasattr(_, "lora_A")}
        named = {t for t in targets if t.rsplit(".", 1)[-1] == leaf}
        if not named >= {n.split("base_model.model.", 1)[-1] for n in every}:
            raise SetupError(f"LoRA on some of the {leaf} layers only is not modelled: target every layer's {leaf}")
    return ",".join(leaves)


def batch_shape(batch) -> tuple[int, int]:
    """(sequences, tokens) of a micro-batch: its input_ids (or the first 2-D tensor in it)."""
    import torch

    fields = batch if isinstance(batch, dict) else {"input": batch}
    first = fields.get("input_ids")
    if first is None:
        first = next((v for v in fields.values() if isinstance(v, torch.Tensor) and v.dim() >= 2), None)
    if first is None or first.dim() < 2:
        raise SetupError("the batch has no input_ids (sequences x tokens): pass batch_shape=(batch, seq)")
    return int(first.shape[0]), int(first.shape[1])


def request(model, optimizer, shape: tuple[int, int], autocast: str | None, run: dict, spec=None) -> Request:
    """The Request of a live run: the model's and the optimizer's settings, the batch shape and `run` (the trainer's
    own: grad_accum, max_grad_norm, dp, zero, stack, recompute, gpu...)."""
    found = model_settings(model)
    weights = found.pop("weights")
    settings = {**found, **(optimizer_settings(optimizer, found["device"]) if optimizer is not None else {}),
                **{k: v for k, v in run.items() if v is not None}}
    settings.setdefault("precision", precision_of(weights, autocast))
    name = spec.name if spec is not None else type(base_model(model)).__name__
    return Request(model=name, batch=shape[0], seq=shape[1], **settings)
