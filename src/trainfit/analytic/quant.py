"""A bitsandbytes-quantised frozen base (--quant nf4|fp4|int8, QLoRA) as trainfit/step/quant.py builds it (no torch):
the bytes of the packed weights and their quant state, and the dequantised copy each frozen matmul makes.

Quantised: every Linear of the decoder layers (transformers replace_with_bnb_linear; the LM head and the
embedding are skipped, quantizers/base.py:39-63 get_keys_to_not_convert) — all 7 of a Llama block, whichever
of them carry adapters. Per Linear of n = out·in weights, bitsandbytes 0.50 functional.quantize_4bit
(functional.py:925-960) with blocksize 64 and double quantisation (Dettmers et al. 2023, QLoRA §3):
- packed weight: two 4-bit codes per uint8, ceil(n/2) bytes (the op's output ((n+1)//2, 1));
- absmax, one per block of 64: with double quantisation 8-bit (quantize_blockwise of absmax − mean, uint8,
  one byte per block) + its own fp32 absmax per 256 blocks + the fp32 offset (the mean, a 0-d tensor);
- the 16-entry fp32 code of the 4-bit type (get_4bit_type, a new tensor per call) and a copy of the 256-entry
  fp32 dynamic map of the nested quantisation (functional.py:676 `code.to(A.device, copy=True)`), per Linear.
Dettmers et al. 2023 §3 count the same thing as 4 + 8/64 + 32/(64·256) ≈ 4.127 bits per parameter.
int8 (LLM.int8, Dettmers et al. 2022): one int8 per weight (CB) and one fp32 scale per output row (SCB)
(functional.int8_vectorwise_quant, Int8Params._quantize nn/modules.py:737-748).

Dequantised copy: bitsandbytes::gemm_4bit has a single (default) kernel on every device
(backends/default/ops.py:323-345): forward dequantises the nested absmax to fp32 (+ the offset: a second fp32
copy) and the whole weight to the input dtype, then F.linear; MatMul4Bit saves only the packed weight
(autograd/_functions.py:357-358 `ctx.tensors = (None, B)`) and its backward dequantises it again for the input
gradient (:383-384). So beside the saved set each frozen matmul holds n elements in the compute dtype plus its
fp32 absmax, freed when the matmul returns: a temporary of the largest Linear, never saved.
int8: bnb's training matmul dequantises CB·SCB/127 to the input dtype in forward and again in backward
(autograd/_functions.py:264 MatMul8bitFp, :292 the backward of both), and saves its input A (ctx.A; MatMul8bitLt
also: ctx.tensors = (CAt, subA, A), :186-187): unlike a 16-bit frozen Linear, every int8 Linear keeps its input
(lora.layer_saved_delta). NB: on CUDA MatMul8bitLt also keeps the outlier columns subA (a few per token, data-
dependent): an under-estimate.
A bitsandbytes Linear returns its input's dtype (nn/modules.py:626,637): fp32 where its input is an fp32 norm output
(every --kbit-prep; also amp-*, whose norm weights are fp32, which `check` refuses): analytic/kbit_prep.py.
"""
from __future__ import annotations

from math import ceil

from ..errors import SetupError
from ..setup import Setup
from ..spec import ModelSpec
from .activations import FP32
from .precision import state_bytes

BLOCK = 64  # bnb Params4bit blocksize default (nn/modules.py:230-231)
NESTED_BLOCK = 256  # quantize_4bit's nested quantize_blockwise(..., blocksize=256) (functional.py:940)
CODE_4BIT = 16  # entries of the nf4/fp4 code (functional.py get_4bit_type)
CODE_8BIT = 256  # entries of the dynamic map (functional.py create_dynamic_map)


def check(setup: Setup) -> None:
    """Under autocast the analytic engine models a quantised base with full recompute only: against the trace its
    peak is within 0.02 % there (tiny Llama on CPU, llama-3.2-1b with CUDA semantics), and 7 % / 29 % over without
    (the saved set of the quantised layers under autocast, not modelled)."""
    if state_bytes(setup).autocast and setup.recompute != "full":
        raise SetupError(f"--quant with --precision {setup.precision} is modelled with --recompute full (peft's "
                         "prepare_model_for_kbit_training turns it on); without it use --precision bf16 or "
                         "--engine trace")


def linear_bytes(setup: Setup, inp: int, out: int) -> tuple[int, int]:
    """(packed weight, quant state) bytes of one quantised Linear (module docstring)."""
    n = inp * out
    if setup.quant == "int8":
        return n, FP32 * out
    blocks = ceil(n / BLOCK)
    state = blocks + FP32 * ceil(blocks / NESTED_BLOCK) + FP32 + FP32 * (CODE_4BIT + CODE_8BIT)
    return ceil(n / 2), state


def layer_linears(spec: ModelSpec) -> list[tuple[int, int]]:
    """(in, out) of each quantised Linear of one layer."""
    from .lora import linears

    return [(i, o) for i, o, _ in linears(spec).values()]


def base_bytes(spec: ModelSpec, setup: Setup) -> tuple[float, float, int]:
    """(packed weights + quant state bytes, the 16-bit bytes they replace, parameters quantised) of the model."""
    st = state_bytes(setup)
    ns = layer_linears(spec)
    packed = sum(sum(linear_bytes(setup, i, o)) for i, o in ns)
    n = sum(i * o for i, o in ns)
    return spec.layers * packed, spec.layers * st.weight * n, spec.layers * n


def codes_bytes(spec: ModelSpec, setup: Setup) -> float:
    """Bytes of the model's packed weights alone (no quant state): the part FSDP shards (lora.quant_delta)."""
    return spec.layers * sum(linear_bytes(setup, i, o)[0] for i, o in layer_linears(spec))


def dequant_transient(spec: ModelSpec, setup: Setup) -> float:
    """Bytes a frozen quantised matmul holds beside its output: the largest Linear dequantised to the compute
    dtype, with its fp32 absmax (4-bit; forward: + the offset-added copy) or int8's fp32 row scales / 127."""
    st = state_bytes(setup)
    i, o = max(layer_linears(spec), key=lambda d: d[0] * d[1])
    if setup.quant == "int8":  # dequantised to its input's dtype: fp32 after an fp32 norm (analytic/kbit_prep.py)
        from .kbit_prep import fp32_frozen_outputs

        return (FP32 if fp32_frozen_outputs(setup, st.autocast) else st.act) * i * o + FP32 * o
    return st.act * i * o + 2 * FP32 * ceil(i * o / BLOCK)
