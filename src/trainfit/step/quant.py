"""A bitsandbytes-quantised frozen base (--quant nf4|fp4|int8), as transformers' BitsAndBytesConfig loads it.

`quantize_base` makes the model `from_pretrained(..., quantization_config=BitsAndBytesConfig(...))` returns:
- modules: transformers' own replace_with_bnb_linear (integrations/bitsandbytes.py:162-236) swaps every nn.Linear /
  Conv1D for bnb.nn.Linear4bit or Linear8bitLt, except get_keys_to_not_convert's (quantizers/base.py:39-63: tied
  weights, the last parameter's module, the output embedding: lm_head stays in the weight dtype);
- weights: the quantizers' conversion ops (Bnb4bitQuantize / Bnb8bitQuantize, integrations/bitsandbytes.py:58 and
  :123) wrap each loaded weight in Params4bit / Int8Params and `.to(device)`, which quantises it (bnb
  nn/modules.py:381-395 Params4bit._quantize -> functional.quantize_4bit; :737-748 Int8Params._quantize ->
  int8_vectorwise_quant of an fp16 copy); we quantise the randomly initialised weights the same way;
- 4-bit: blocksize 64, quant_storage uint8 (BitsAndBytesConfig defaults), double quantisation on and
  bnb_4bit_compute_dtype = the step's matmul dtype (autocast's, else the weights'), as the QLoRA recipe sets them
  (Dettmers et al. 2023 §3 "Double Quantization"; the paper's qlora.py defaults double_quant=True and the compute
  dtype to the training dtype);
- int8: llm_int8_threshold 6.0, has_fp16_weights False (BitsAndBytesConfig defaults);
- model.is_loaded_in_4bit / is_loaded_in_8bit, which peft reads to wrap these layers in its lora.Linear4bit /
  Linear8bitLt (peft lora/model.py:329-330, lora/bnb.py dispatch_bnb_4bit).
The quant state's tensors (absmax, the nested absmax and code, offset; int8's SCB row scales) are attributes, not
parameters or buffers: we also register them as non-persistent buffers of their module, so that the trace and
measure engines count them with the resident weights (adopt_resident, cpu_peak's baseline) — the checkpoint's
state_dict is unchanged.
Fake tensors (the trace engine): bnb registers fake kernels for its ops (bitsandbytes/_ops.py register_fake:
quantize_4bit, quantize_blockwise, int8_vectorwise_quant, gemm_4bit, dequantize_4bit...), so the quantisation
itself runs under FakeTensorMode; three things do not, and are done the equivalent way: Params4bit/Int8Params
cannot wrap a FakeTensor (so the packed weight is a plain frozen Parameter carrying their attributes, built by the
same functional call their _quantize makes), replace_with_bnb_linear's meta-device modules are built outside the
fake mode, and gemm_4bit's fake kernel hides the dequantised weight its real (default) kernel allocates (so its
Python implementation runs op by op: _fake_linear4bit). The layout and every allocation then match the real step
(tests/trace/test_qlora_vs_real.py).
NB: --quant int8 on fake tensors runs bnb's CPU training matmul (MatMul8bitFp: dequantise + F.linear, saves its
input; autograd/_functions.py:245-271 — bnb.matmul picks it for CPU tensors, :400-404); a CUDA step runs
MatMul8bitLt, which saves the same input plus the outlier columns (data-dependent, :186-187) and makes int8 copies
of the input in forward: a --device cuda trace of int8 under-reads by those.
`prepare_kbit` then prepares the unquantised parameters as --kbit-prep says (analytic/kbit_prep.py): peft's own
prepare_model_for_kbit_training, or the norm weights alone in fp32 as TRL's SFTTrainer leaves them.
"""
from __future__ import annotations

import contextlib
import functools
from typing import TYPE_CHECKING

import torch

from ..errors import EngineUnavailableError

if TYPE_CHECKING:  # pragma: no cover
    from ..setup import Setup

INT8_THRESHOLD = 6.0  # BitsAndBytesConfig llm_int8_threshold default (Dettmers et al. 2022 LLM.int8() §3.2)


def compute_dtype(setup: "Setup") -> torch.dtype:
    """bnb_4bit_compute_dtype: the dtype the step's matmuls run in (autocast's, else the weights')."""
    from .build import autocast_dtype, param_dtype

    return autocast_dtype(setup) or param_dtype(setup)


def bnb_config(setup: "Setup"):
    from transformers import BitsAndBytesConfig

    if setup.quant == "int8":
        return BitsAndBytesConfig(load_in_8bit=True, llm_int8_threshold=INT8_THRESHOLD)
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=setup.quant, bnb_4bit_use_double_quant=True,
                              bnb_4bit_compute_dtype=compute_dtype(setup), bnb_4bit_quant_storage=torch.uint8)


def quantize_base(model: torch.nn.Module, setup: "Setup") -> torch.nn.Module:
    """`model` with its Linear layers quantised by bitsandbytes (module docstring); unchanged without --quant."""
    if not setup.quant:
        return model
    try:
        import bitsandbytes as bnb
    except ImportError as e:
        raise EngineUnavailableError("--quant runs bitsandbytes' own layers: pip install 'trainfit[bnb]'") from e
    from torch._subclasses.fake_tensor import is_fake, unset_fake_temporarily
    from transformers.integrations.bitsandbytes import replace_with_bnb_linear
    from transformers.pytorch_utils import Conv1D
    from transformers.quantizers.base import get_keys_to_not_convert

    # as from_pretrained's bitsandbytes quantizer (quantizers/base.py:260-281 get_modules_to_not_convert): the default
    # skips and the model's _keep_in_fp32_modules (T5's `wo`, modeling_t5.py:542, whose forward casts its input to
    # wo's weight dtype)
    skip = get_keys_to_not_convert(model) + list(getattr(model, "_keep_in_fp32_modules", None) or ())
    old = {n: m for n, m in model.named_modules() if isinstance(m, Conv1D) or type(m) is torch.nn.Linear}
    fake = any(is_fake(m.weight) for m in old.values())
    if fake and setup.dora:
        raise EngineUnavailableError("--dora with --quant: peft dequantises the base for DoRA's weight norm only "
                                     "through bitsandbytes' Params4bit (peft utils/integrations.py "
                                     "dequantize_bnb_weight), which cannot wrap fake tensors; use --engine analytic "
                                     "or measure")
    # the new modules are built on the meta device (replace_with_bnb_linear); Params4bit/Int8Params cannot wrap a
    # FakeTensor (Tensor._make_subclass refuses an already-wrapped tensor), so build them on real meta tensors
    with unset_fake_temporarily() if fake else contextlib.nullcontext():
        replace_with_bnb_linear(model, modules_to_not_convert=skip, quantization_config=bnb_config(setup))
        # double quantisation's 8-bit code: bnb computes it once per process and caches it (functional.py:653-655
        # quantize_blockwise, name2qmap["dynamic"]) from Python values fake tensors cannot read: seed that cache
        names = bnb.functional.name2qmap
        if "dynamic" not in names:
            names["dynamic"] = bnb.functional.create_dynamic_map()
    for name, module in model.named_modules():
        if not isinstance(module, (bnb.nn.Linear4bit, bnb.nn.Linear8bitLt)):
            continue
        src = old.pop(name)
        w = src.weight.detach()
        if issubclass(module.source_cls, Conv1D):  # integrations/bitsandbytes.py:54-55
            w = w.T
        if isinstance(module, bnb.nn.Linear4bit):
            _fill_4bit(module, w, fake)
        else:
            _fill_int8(module, w, fake)
        module.bias = None if src.bias is None else torch.nn.Parameter(src.bias.detach(), requires_grad=False)
        module.requires_grad_(False)
    setattr(model, "is_loaded_in_8bit" if setup.quant == "int8" else "is_loaded_in_4bit", True)
    return model


def _fill_4bit(module, w: torch.Tensor, fake: bool) -> None:
    """Params4bit(w, **meta_param.__dict__).to(device), as Bnb4bitQuantize does; on fake tensors the same
    functional.quantize_4bit call Params4bit._quantize makes (bnb nn/modules.py:381-395), its result kept in a
    plain frozen Parameter carrying Params4bit's attributes (same bytes, same quant state)."""
    import bitsandbytes as bnb

    meta = dict(module.weight.__dict__)  # blocksize, quant_type, compress_statistics, quant_storage, module
    if not fake:
        module.weight = bnb.nn.Params4bit(w, requires_grad=False, **meta).to(w.device)
    else:
        packed, state = bnb.functional.quantize_4bit(
            w.contiguous(), blocksize=meta["blocksize"], compress_statistics=meta["compress_statistics"],
            quant_type=meta["quant_type"], quant_storage=meta["quant_storage"])
        p = torch.nn.Parameter(packed, requires_grad=False)
        for k, v in meta.items():
            setattr(p, k, v)
        p.quant_state, p.bnb_quantized, module.quant_state = state, True, state
        module.weight = p
        module.__class__ = _fake_linear4bit()
    state = module.weight.quant_state
    _register(module, "absmax", state.absmax)
    _register(module, "code", state.code)
    if state.nested:
        _register(module, "offset", state.offset)
        _register(module, "nested_absmax", state.state2.absmax)
        _register(module, "nested_code", state.state2.code)


def _fill_int8(module, w: torch.Tensor, fake: bool) -> None:
    """Int8Params(w.to("cpu"), has_fp16_weights=False).to(device), as Bnb8bitQuantize does; on fake tensors the
    same int8_vectorwise_quant of an fp16 copy Int8Params._quantize makes (bnb nn/modules.py:737-748)."""
    import bitsandbytes as bnb

    if not fake:
        module.weight = bnb.nn.Int8Params(w.to("cpu"), requires_grad=False, has_fp16_weights=False).to(w.device)
    else:
        cb, scb, _ = bnb.functional.int8_vectorwise_quant(w.contiguous().to(torch.float16))
        p = torch.nn.Parameter(cb, requires_grad=False)
        p.CB, p.SCB, p.has_fp16_weights = cb, scb, False
        module.weight = p
    _register(module, "SCB", module.weight.SCB)


def _register(module: torch.nn.Module, name: str, t: torch.Tensor) -> None:
    module.register_buffer(f"quant_{name}", t, persistent=False)


@functools.cache
def _fake_linear4bit():  # built on first use: bitsandbytes is an optional import
    import bitsandbytes as bnb
    from bitsandbytes.backends.default.ops import _gemm_4bit_default_impl

    class FakeLinear4bit(bnb.nn.Linear4bit):
        """Linear4bit on fake tensors. bitsandbytes::gemm_4bit has only a default kernel (backends/default/ops.py
        :323-345; backends/cuda registers none): it dequantises the nested absmax (fp32, + offset) and the whole
        weight to the input dtype, then F.linear. Its registered fake kernel returns the output alone, so the
        recorder would miss those temporaries: here MatMul4Bit's forward calls that Python implementation op by
        op (the same ops the real kernel runs), every other line being bnb's own."""

        def forward(self, x):
            packet = torch.ops.bitsandbytes.gemm_4bit
            packet.default = _gemm_4bit_default_impl
            try:
                return super().forward(x)
            finally:
                del packet.default  # back to the OpOverload (OpOverloadPacket.__getattr__ re-resolves it)

    return FakeLinear4bit


def prepare_kbit(model: torch.nn.Module, setup: "Setup") -> torch.nn.Module:
    """`model` (quantised) prepared as --kbit-prep says (analytic/kbit_prep.py): "peft" runs peft's own
    prepare_model_for_kbit_training (peft 0.21.2 utils/other.py:158-259: every fp16/bf16 parameter not a Params4bit
    to fp32), without its gradient checkpointing (use_gradient_checkpointing=False: --recompute sets that, as for
    any model); "norms" casts the norm weights only (trl v0.25.0 models/utils.py:488-497, the same
    `param.data = param.data.to(torch.float32)`)."""
    from ..analytic.kbit_prep import preparation

    prep = preparation(setup)
    if prep == "peft":
        from peft import prepare_model_for_kbit_training

        return prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    if prep == "norms":
        for name, p in model.named_parameters():
            if p.dtype in (torch.float16, torch.bfloat16) and "norm" in name.lower():
                p.data = p.data.to(torch.float32)
    return model
