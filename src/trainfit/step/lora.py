"""LoRA/DoRA adapters on the built transformers model (--lora-rank, --lora-targets, --dora), as peft builds them.

`apply_lora` wraps the model with peft's own `get_peft_model(model, LoraConfig(...))`, so the trace and measure
engines run peft's real lora.Linear forward: the base weights stay in the precision's weight dtype with
requires_grad False; the adapters (lora_A, lora_B, DoRA's magnitude) are the only trainable parameters (the
optimizer takes requires_grad parameters only, trainfit.step.standard._params). Choices that affect memory:
- lora_alpha = 2·r: alpha only scales the adapter output (peft lora/layer.py `scaling = lora_alpha / r`), no memory;
- lora_dropout = 0.0: peft then uses nn.Identity, so no dropout mask and no dropped copy of the input is saved
  (peft lora/layer.py update_layer: `nn.Dropout(p) if p > 0 else nn.Identity()`);
- peft's default autocast_adapter_dtype=True keeps bf16/fp16 adapters in fp32 (peft mapping_func.py:110,
  tuners_utils.py _cast_adapter_dtype), and lora.Linear casts its input to the adapter dtype
  (lora/layer.py Linear.forward: `x = self._cast_input_dtype(x, lora_A.weight.dtype)`).
- --lora-dtype weight casts the adapters to the policy's weight dtype after the wrap (torchtune's bf16 adapters);
- --quant: the base is quantised by bitsandbytes before the wrap (trainfit.step.quant), and peft then builds its
  lora.Linear4bit / Linear8bitLt around those layers (lora/bnb.py), whose forward adds `result.clone()`.
- gradient checkpointing: transformers' activation_checkpointing_enable calls enable_input_require_grads for
  input_ids models (modeling_utils.py:3181-3189), as peft does (peft_model.py:722-735), so that the frozen
  embedding's output requires grad; trainfit.step.standard.enable_recompute runs after this wrap, as the HF
  Trainer calls activation_checkpointing_enable on the (Peft)model it is given (trainer.py:1510-1511).
"""
from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import torch

from ..errors import SetupError
from ..setup import lora_target_names
from .fake_moves import fake_safe_module_moves
from .quant import prepare_kbit, quantize_base

if TYPE_CHECKING:  # pragma: no cover
    from ..setup import Setup


def linear_names(model: torch.nn.Module) -> list[str]:
    """The distinct leaf names of the model's Linear / Conv1D modules except the output head (what all-linear
    selects: peft tuners_utils.py:2445-2469 _maybe_include_all_linear_layers)."""
    from transformers.pytorch_utils import Conv1D

    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    names = {name.rsplit(".", 1)[-1] for name, m in model.named_modules()
             if isinstance(m, (torch.nn.Linear, Conv1D)) and m is not head}
    return sorted(names)


def attention_names(model: torch.nn.Module) -> list[str]:
    """Leaf names of the Linear / Conv1D modules inside the attention blocks (class name ending in Attention)."""
    from transformers.pytorch_utils import Conv1D

    out = set()
    for m in model.modules():
        if type(m).__name__.endswith("Attention"):
            out |= {n.rsplit(".", 1)[-1] for n, c in m.named_modules() if isinstance(c, (torch.nn.Linear, Conv1D))}
    return sorted(out)


def target_modules(model: torch.nn.Module, setup: "Setup"):
    """peft's target_modules for --lora-targets: "all-linear", the attention projections, or the names given
    (unknown names refused with the model's Linear names)."""
    if setup.lora_targets == "all-linear":
        return "all-linear"
    available = linear_names(model)
    names = attention_names(model) if setup.lora_targets == "attention" else list(lora_target_names(setup.lora_targets))
    unknown = [n for n in names if n not in available]
    if unknown or not names:
        raise SetupError(f"--lora-targets: {', '.join(unknown) or setup.lora_targets} not a Linear module of this "
                         f"model; its Linear modules: {', '.join(available)}")
    return names


def apply_lora(model: torch.nn.Module, setup: "Setup") -> torch.nn.Module:
    """The PeftModel of `model` with --lora-rank adapters (module docstring), or `model` when the rank is 0."""
    if not setup.lora_rank:
        return model
    from peft import LoraConfig, get_peft_model

    r = setup.lora_rank
    targets = target_modules(model, setup)  # named from the unquantised model: bnb layers are Linear subclasses
    model = prepare_kbit(quantize_base(model, setup), setup)  # --quant: the bitsandbytes base peft wraps, prepared
    config = LoraConfig(r=r, lora_alpha=2 * r, lora_dropout=0.0, target_modules=targets,
                        use_dora=setup.dora, bias="none")
    with fake_safe_module_moves(), warnings.catch_warnings():
        # peft 0.21.2 peft_model.py:184 reads transformers' deprecated is_gradient_checkpointing, which transformers
        # 5.24 warns of (modeling_utils.py:3312): their hand-over, not the user's to act on
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        model = get_peft_model(model, config)
    if setup.lora_dtype == "weight":
        from .build import param_dtype  # build imports this module

        _cast_trainable(model, param_dtype(setup))
    return model


def _cast_trainable(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """--lora-dtype weight: the adapters in the weights' dtype, as torchtune builds its whole LoRA model under
    the training dtype (recipes/lora_finetune_single_device.py `with training.set_default_dtype(self._dtype)`).
    peft's autocast_adapter_dtype=False does not reach this for a bitsandbytes base, whose uint8/int8 weight dtype
    peft does not copy (tuners_utils.py:2182-2186 casts to floating dtypes only), so we
    reassign each trainable parameter (fake-safe, as fake_moves.fake_safe_module_moves)."""
    for owner in model.modules():
        for name, p in list(owner.named_parameters(recurse=False)):
            if p.requires_grad and p.dtype != dtype:
                setattr(owner, name, torch.nn.Parameter(p.detach().to(dtype), True))
