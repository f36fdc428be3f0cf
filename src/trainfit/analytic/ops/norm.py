"""Cost functions of a norm: one fused kernel (LayerNorm; torch.rms_norm on CUDA), or HF's eager RMSNorm."""
from __future__ import annotations

from ...spec import ModelSpec
from ..activations import FP32
from ..families import family_traits
from .op import BROADCAST, DOWNCAST, REDUCE, UPCAST, Op, Shape, bwd_kernel, column_sum_launches, memory, no_kernel

def norm_ops(spec: ModelSpec, name: str, tokens: float, sh: Shape, group: str, out_bytes: int | None = None,
             width: int | None = None, in_bytes: int | None = None) -> list[Op]:
    """One norm over `tokens` rows of `width` (the hidden size): the cost function of the norm the model and the
    stack run (NORMS). `out_bytes`: the output's dtype, the residual stream's unless given (weight·x keeps the
    input's dtype; fp32 weights keep fp32). `in_bytes`: the input's dtype, the residual stream's unless given (a
    norm of a projection's output reads the activation dtype: Qwen3's and Gemma 3's q/k norms, Gemma's post-norms)."""
    kind = sh.norm if spec.norm == "rmsnorm" else "layernorm"
    out = sh.residual if out_bytes is None else out_bytes
    return NORMS[kind](spec, name, tokens, width or spec.hidden, sh, group, out,
                       sh.residual if in_bytes is None else in_bytes)


def fused_norm(spec: ModelSpec, name: str, tokens: float, h: int, sh: Shape, group: str, out: int,
               r: int) -> list[Op]:
    """LayerNorm (aten native_layer_norm) or torch.rms_norm on CUDA (aten._fused_rms_norm): one kernel reading x and
    writing y and the fp32 row statistics."""
    x, n = tokens * h, tokens  # r: the input's dtype (norm_ops)
    src = "aten native_layer_norm" if spec.norm != "rmsnorm" else "aten._fused_rms_norm (torch.rms_norm)"
    # backward: the input gradient, then the weight's (and bias') gradients in one kernel (aten/src/ATen/native/
    # cuda/layer_norm_kernel.cu: layer_norm_grad_input_kernel_vectorized, LaunchGammaBetaBackwardCUDAKernel's
    # GammaBetaBackwardCUDAKernelTemplate; torch.rms_norm's backward the same kernels with rms_norm=true): 2, as
    # the H200 profiles count (25 of each in gpt2's step, 45 in torchtitan's). NB: above 65,536 rows with a
    # narrow width it adds a .sum(0) per gradient (partial sums per block)
    return [memory(name, x * r, x * out + 2 * FP32 * n, src, group, (x * r, x * sh.act), bwd=2)]


def hf_rms_norm(spec: ModelSpec, name: str, tokens: float, h: int, sh: Shape, group: str, out: int,
                r: int, zero_centred: bool | None = None) -> list[Op]:
    """HF's RMSNorm (modeling_llama.py:61-66), six kernels in eager: [to fp32], pow, mean, rsqrt(+eps), mul, [to
    input dtype], weight mul — each a pass over the row in fp32. `zero_centred`: the family's fp32 (1 + weight)
    (families.json norm_zero_centred) unless given (Qwen3-Next's gated norm is Llama's: False)."""
    x, n = tokens * h, tokens  # r: the input's dtype (norm_ops)
    src = "modeling_llama.py:61-66 LlamaRMSNorm"
    # Backward kernels (tools/autograd/derivatives.yaml, FunctionsManual.cpp), each its own pass in eager:
    #   weight·y -> grad·w [broadcast], grad·y, Σ over the tokens (the weight's gradient) (3)
    #   a dtype cast -> a cast back (1)
    #   x·r -> grad·r [broadcast], grad·x, Σ over the row (r's gradient) (3)
    #   rsqrt -> -0.5·grad·y³ (3, [T, 1]);  x + eps -> none;  mean -> grad / h, expanded (1)
    #   pow(x, 2) -> grad·(2·x.pow(1)) (FunctionsManual.cpp pow_backward): x.pow(1) is a copy (Pow.cpp
    #     pow_Tensor_Scalar_out `out.copy_(base)`, a same-dtype contiguous copy: cudaMemcpyAsync, the profile's
    #     "Memcpy DtoD", one per norm), 2·, grad· (3), then x's two gradients summed (1)
    # The H200 llama-3.1-8b bf16 profile has each (per norm: 3 same-shape muls, 2 broadcast muls, 2 sums, a div, a
    # mul by 2, an add; docs/benchmarks/gpu-truth.md; the copy under aten::copy_). The weight's sum over the tokens
    # also zeroes its semaphores (column_sum_launches). NB: the column sum runs at the row reduction's rate
    # (reduce): optimistic.
    x4, n4, hw = x * FP32, n * FP32, h * sh.weight
    ops = []
    if r != FP32:
        ops.append(memory(f"{name}.to_fp32", x * r, x * FP32, src, group, (x * r, 0), saves=False, **UPCAST))
    ops += [memory(f"{name}.pow", x4, x4, src, group, (0, 0), bwd_ops=(
                bwd_kernel(f"{name}.pow.backward_copy", x4, x4), bwd_kernel(f"{name}.pow.backward", x4, x4),
                bwd_kernel(f"{name}.pow.backward_mul", 2 * x4, x4),
                bwd_kernel(f"{name}.grad_sum", 2 * x4, x4))),
            memory(f"{name}.mean", x4, n4, src, group, (0, 0), bwd_ops=(
                bwd_kernel(f"{name}.mean.backward", n4, x4, "strided"),), **REDUCE),
            memory(f"{name}.rsqrt", n4, n4, src, group, (0, 0), kernels=2, bwd=3),
            memory(f"{name}.mul", x4 + n4, x4, src, group, (0 if r != FP32 else x * r, 0), bwd_ops=(
                bwd_kernel(f"{name}.mul.backward", x4 + n4, x4, "strided"),
                bwd_kernel(f"{name}.mul.backward_r", 2 * x4, x4),
                bwd_kernel(f"{name}.mul.backward_sum", x4, n4, "reduce")),
                **BROADCAST)]
    if r != FP32:
        ops.append(memory(f"{name}.to_dtype", x4, x * r, src, group, (0, 0), saves=False, **DOWNCAST))
    traits = family_traits(spec)
    own = zero_centred is None  # the family's own norm; a given value describes another (Qwen3-Next's gated norm)
    if own and traits["norm_fp32"]:
        out = FP32  # Gemma: x.float() * (1 + weight.float()) (modeling_gemma.py GemmaRMSNorm); gpt-oss: weight * x
    if traits["norm_zero_centred"] if own else zero_centred:
        ops += zero_centred_weight(name, h, sh, src)
    y = x * max(r, out)  # the normalised input as the weight multiplies it
    # fused: the compiled norm writes its output in the dtype the next matmul reads (the autocast cast folded in)
    ops.append(memory(f"{name}.weight", y, x * out, src, group, (0, x * sh.act), bwd_ops=(
        bwd_kernel(f"{name}.weight.backward", x * out + hw, y, "strided"),
        bwd_kernel(f"{name}.weight.backward_w", x * out + y, x * out),
        bwd_kernel(f"{name}.weight.grad", x * out, hw, "reduce", column_sum_launches(n))),
        **BROADCAST))
    return ops


def liger_rms_norm(spec: ModelSpec, name: str, tokens: float, h: int, sh: Shape, group: str, out: int,
                   r: int) -> list[Op]:
    """Liger's LigerRMSNormFunction (ops/rms_norm.py at liger-kernel 0.8.5; analytic/liger.py): one Triton kernel
    reads x and the weight and writes y in x's dtype and one fp32 rstd per row (:462-466); its backward one kernel
    reads dy, x, rstd and the weight and writes dx over dy (:555-556) and per-SM fp32 partial weight gradients
    (:544), then their sum (:622). NB: the partials' bytes (SMs × h × 4) are left out; y is written in x's dtype
    whatever `out` asks (Y = torch.empty(dtype=X.dtype))."""
    x, n, hw = tokens * h, tokens, h * sh.weight
    src = "liger ops/rms_norm.py:629-676 LigerRMSNormFunction"
    return [memory(name, x * r + hw, x * r + n * FP32, src, group, (x * r, x * r), bwd_ops=(
        bwd_kernel(f"{name}.liger.backward", 2 * x * r + n * FP32 + hw, x * r, "reduce"),
        bwd_kernel(f"{name}.liger.dw_sum", 0, hw, "reduce")))]


def l2_norm(spec: ModelSpec, name: str, tokens: float, h: int, sh: Shape, group: str, out: int,
            r: int) -> list[Op]:
    """Llama4TextL2Norm (modeling_llama4.py:102-113): HF's RMSNorm kernels without the weight multiply (`x.float()`,
    pow, mean, rsqrt(+eps), mul, `type_as(x)`)."""
    ops = hf_rms_norm(spec, name, tokens, h, sh, group, out, r)
    assert ops[-1].name == f"{name}.weight"
    return ops[:-1]


def zero_centred_weight(name: str, h: int, sh: Shape, src: str) -> list[Op]:
    """A zero-centred norm's factor `1.0 + self.weight.float()` (modeling_gemma.py GemmaRMSNorm,
    modeling_qwen3_next.py:139): the weight's cast to fp32 (none where it is fp32; its backward casts the weight's
    gradient back) and the add, per call; h elements."""
    w = sh.weight
    cast = [memory(f"{name}.weight.to_fp32", h * w, h * FP32, src, saves=False, **UPCAST)] if w != FP32 else []
    # the add passes its gradient on (no kernel)
    return cast + [memory(f"{name}.one_plus", h * FP32, h * FP32, src, bwd_ops=(no_kernel(f"{name}.one_plus"),))]


# the norm kernels by kind: LayerNorm, or the RMSNorm the stack runs (stacks/*.toml [norm])
NORMS = {"layernorm": fused_norm, "torch-rms-norm": fused_norm, "hf-rmsnorm-fp32": hf_rms_norm,
         # Megatron-core's RMSNorm on a GPU: Transformer Engine's fused kernel (TENorm, or the norm inside
         # TELayerNormColumnParallelLinear: one forward kernel writing y and the fp32 rstd, one backward kernel plus
         # the weight's gradient; TE v2.9 transformer_engine/common/normalization/rmsnorm/, megatron-core 0.16.1
         # extensions/transformer_engine.py TENorm). NB: under an fp8 recipe TE writes the norm's output already
         # quantised, so ops/te_casts.py's separate cast of that input over-reads by one pass
         "fused-norm": fused_norm,
         "l2": l2_norm,  # Llama 4's weightless q/k norm (not a model's `norm`: ops/layer.py calls it by name)
         "liger-rms-norm": liger_rms_norm}  # --liger (analytic/liger.py)
