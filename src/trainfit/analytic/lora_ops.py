"""The kernels a LoRA/DoRA/QLoRA step runs (--lora-rank, --dora, --quant), from the full fine-tuning op list.

- Frozen base weights: a Linear whose weight has requires_grad False gets no weight-gradient GEMM — autograd's
  addmm/mm backward computes only the inputs that need grad (torch/csrc/autograd/FunctionsManual.cpp mm_mat2_backward
  runs under `if (grad_input_mask[1])`): every base projection and the LM head keep forward + dgrad only, and the
  frozen embedding's backward (its gradient scatter) is not run.
- Adapters (Hu et al. 2021 eq. 3, h = W0 x + B A x): per adapted projection lora_A (d_in -> r) and lora_B (r -> d_out),
  each forward, dgrad and wgrad, in the compute dtype (under autocast F.linear runs in bf16 whatever the adapters'
  dtype, torch/amp/autocast_mode.py lower_precision_fp ops). Without autocast, peft's fp32 adapters beside a 16-bit
  base (--lora-dtype fp32) run on the input cast to fp32 (peft lora/layer.py Linear.forward `x = self._cast_input_dtype(
  x, lora_A.weight.dtype)`): fp32 GEMMs at the CUDA cores' rate (PyTorch leaves TF32 off for matmuls), as the H200
  profile shows (sm80_xmma_gemm_f32f32 ... ffma kernels, bench/results/gpu/H200-2026-11-26-unrecorded-2-truth.json llama-3.2-1b-lora),
  timed as cuBLAS's SIMT kernels where measured (roofline._simt_gemm_seconds).
- DoRA (Liu et al. 2024 eq. 5; peft tuners/lora/dora.py get_weight_norm): each forward forms W0 + scale·B·A
  (a d_out × d_in × r GEMM) and its row norms (reads the d_out × d_in result), peft under torch.no_grad.
- QLoRA (bitsandbytes MatMul4Bit, autograd/_functions.py): each frozen 4-bit matmul dequantises its weight to the
  compute dtype in forward and again for the input gradient (reads 0.5 B + the block scales, writes 2 B per weight).
"""
from __future__ import annotations

from ..setup import Setup
from ..spec import ModelSpec
from .activations import FP32
from .lora import targets
from .ops import Op, Shape, bwd_kernel, gemm, memory
from .ops.gated_deltanet import RULE
from .quant import BLOCK, linear_bytes

# ops.py projection names -> the HF module names peft targets (analytic/lora.py linears)
MODULE = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj", "gate": "gate_proj", "up": "up_proj",
          "down": "down_proj", "qkv": "qkv_proj", "gate_up": "gate_up_proj", "fc1": "fc1", "fc2": "fc2"}


def frozen(ops: list[Op]) -> list[Op]:
    """The same kernels with every GEMM's weight frozen (no wgrad); the Gated DeltaNet rule's matmuls multiply
    activations (ops/gated_deltanet.py RULE) and keep both gradients."""
    return [op._replace(wgrad=False) if op.kind == "gemm" and not op.name.startswith(RULE) else op for op in ops]


def layer_forward(spec: ModelSpec, setup: Setup, sh: Shape, ops: list[Op]) -> list[Op]:
    """One layer's forward under LoRA: frozen projections, each adapted one followed by its adapters' kernels."""
    adapted = targets(spec, setup)
    r, T = setup.lora_rank, sh.tokens
    out: list[Op] = []
    for op in frozen(ops):
        if op.kind == "gemm" and setup.quant and not op.name.startswith(RULE):
            out.append(_dequant(op.name + ".dequant", setup, sh, op, "(MatMul4Bit forward)"))
        out.append(op)
        name = MODULE.get(op.name)
        if op.kind != "gemm" or name not in adapted:
            continue
        d_in, d_out = op.k, op.n
        casts = setup.lora_dtype == "fp32" and not sh.autocast and sh.act != FP32
        dtype = "fp32" if casts else sh.dtype  # fp32 adapters on a 16-bit base run fp32 GEMMs (docstring)
        out.append(gemm(op.name + ".lora_A", T, r, d_in, sh, "peft lora/layer.py Linear.forward lora_A")
                   ._replace(dtype=dtype))
        out.append(gemm(op.name + ".lora_B", T, d_out, r, sh, "peft lora/layer.py Linear.forward lora_B")
                   ._replace(dtype=dtype))
        out += _adapter_elementwise(op.name, T, d_in, d_out, sh, casts, setup.quant)
        if setup.dora:
            # under torch.no_grad (peft dora.py): no backward kernels
            out.append(gemm(op.name + ".dora_BA", d_out, d_in, r, sh, "peft dora.py get_weight_norm: B @ A",
                             wgrad=False)._replace(grad=False))
            out.append(memory(op.name + ".dora_norm", 2 * d_out * d_in * sh.act, d_out * 4,
                           "peft dora.py: weight + scale * BA, row norms", saves=False, grad=False))
    return out


SRC = "peft lora/layer.py Linear.forward"


def _adapter_elementwise(name: str, T: float, d_in: float, d_out: float, sh: Shape, casts: bool,
                         quant: str | None = None) -> list[Op]:
    """One adapter's elementwise kernels beside its GEMMs, each with its backward's (Op.bwd_ops; listed after the
    GEMMs: the order does not time), and x's two gradients summed (the base's and the adapter's). peft 0.21:
      plain Linear (lora/layer.py:1089-1113): x cast to the adapters' dtype, result + lora_B(lora_A(x)) * scaling,
        then, for fp32 adapters on a 16-bit base, result.to(torch_result_dtype) — a mixed add (16-bit + fp32 ->
        fp32) first;
      bitsandbytes Linear4bit (lora/bnb.py:513-565): result.clone() (a copy, "as per Tim Dettmers"), then the
        product scaled, cast to the result's dtype, and added; Linear8bitLt (:237-282) the same without the clone.
    Backward by autograd's rules (tools/autograd/derivatives.yaml): a mul by a constant scales the gradient; an add
    passes it on, cast to each input's dtype; a cast's is the cast back; a clone's is none. TensorIterator runs a
    mixed-dtype add and each 16 -> 32-bit cast as its unvectorised dynamic-cast loop (kernels.toml access upcast;
    the H200 LoRA profile: unrolled_elementwise_kernel<CUDAFunctor_add<float>> 112 calls, 3.2 ms). The adapter's
    own dropout (lora_dropout, default 0: nn.Identity) is not counted."""
    a, o, i = sh.act, T * d_out, T * d_in
    w = FP32 if casts else a  # the product's dtype

    def ew(n: str, r: float, wr: float, acc: str = "vector", bwd: tuple = ()) -> Op:
        return memory(f"{name}.{n}", r, wr, SRC, saves=False, grad=bool(bwd), access=acc, bwd_ops=bwd)

    def k(n: str, r: float, wr: float, acc: str = "vector") -> Op:
        return bwd_kernel(f"{name}.{n}", r, wr, acc)

    # x cast to the adapters' fp32 (unvectorised); its backward casts x's gradient back to 16-bit
    out = [ew("lora_in_cast", i * a, i * FP32, "upcast", (k("lora_in_cast.backward", i * FP32, i * a),))] \
        if casts else []
    if quant in ("nf4", "fp4"):
        out.append(ew("lora_clone", o * a, o * a))
    # the scale's backward, and (listed with it) x's base and adapter gradients summed
    out.append(ew("lora_scale", o * w, o * w, bwd=(k("lora_scale.backward", o * w, o * w),
                                                  k("lora_grad_sum", 2 * i * a, i * a))))
    out_cast = ew("lora_out_cast", o * FP32, o * a, bwd=(k("lora_out_cast.backward", o * a, o * FP32, "upcast"),))
    if quant:  # the product cast to the result's dtype, then a same-dtype add (its backward: no kernel)
        out += [out_cast] if casts else []
        out.append(ew("lora_add", 2 * o * a, o * a))
    else:  # the add, then the sum cast back; the add's backward casts the result's gradient to its dtype
        out.append(ew("lora_add", o * (a + w), o * w, "upcast" if casts else "vector",
                      (k("lora_add.backward", o * w, o * a),) if casts else ()))
        out += [out_cast] if casts else []
    return out


def dequant_backward(setup: Setup, sh: Shape, ops: list[Op]) -> list[Op]:
    """QLoRA's backward dequantises each frozen weight again for the input gradient."""
    if not setup.quant:
        return []
    return [_dequant(op.name + ".dequant_bwd", setup, sh, op, "(MatMul4Bit.backward, for grad_A)")
            for op in ops if op.kind == "gemm" and ".lora_" not in op.name and ".dora" not in op.name
            and not op.name.startswith(RULE)]


def _dequant(name: str, setup: Setup, sh: Shape, op: Op, where: str) -> Op:
    """One frozen weight dequantised to the compute dtype. 4-bit with double quantisation (trainfit's step: step/
    quant.py bnb_4bit_use_double_quant=True) first decodes the 8-bit block scales (bitsandbytes functional.py
    dequantize_4bit: dequantize_blockwise(absmax), then absmax += offset) — 3 kernels, as the H200 QLoRA profile
    has (kDequantizeBlockwise<float>, an fp32 add, kDequantizeBlockwise<bf16>: 221 of each); LLM.int8 one."""
    packed, state = linear_bytes(setup, int(op.k), int(op.n))
    n = op.n * op.k
    if setup.quant == "int8":
        return memory(name, packed + state, n * sh.act, f"bitsandbytes int8 dequant {where}", saves=False, grad=False)
    scales = FP32 * n / BLOCK  # the decoded block scales: written, read and rewritten by the add, read again
    return memory(name, packed + state + 2 * scales, n * sh.act + 2 * scales,
               f"bitsandbytes dequantize_4bit {where}", saves=False, grad=False, kernels=3, access="dequant4")
