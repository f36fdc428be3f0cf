"""The kernels one training step runs on one pipeline-stage rank, as an op list the roofline times (issue 14).

One list, parameterised by the spec and the setup (not one per stack): a layer's forward, its backward derived
from it, and the embedding / head / loss around the layers. Each op is a GEMM (m, n, k, batch), an attention core
(batch·heads, s_q, s_kv, head_dim) or a memory-bound kernel (bytes read and written). The rank holds
T = b·s/cp tokens (context parallelism), 1/t of every projection's columns (Megatron column/row parallel, Shoeybi
et al. 2019 §3) and, with sequence parallelism, 1/t of the tokens in the norm / residual / dropout region
(Korthikanti et al. 2022 §4.2.2).

Sources, transformers 5.x in the venv (models/<family>/modeling_<family>.py):
  llama  modeling_llama.py: RMSNorm :61-66 (fp32 upcast, pow, mean, rsqrt, mul, cast back, weight mul), q/k/v
         :243, rotary :127-148 (q·cos + rotate_half(q)·sin; rotate_half = neg + cat :119-123), repeat_kv :168 (eager
         with GQA), o_proj :269, residual adds :306/:312, MLP :164 (down(act(gate(x))·up(x))), embed :370, final
         norm :402, lm_head :468; loss/loss_utils.py:61 `logits.float()` then cross_entropy (log_softmax + nll).
  gpt2   modeling_gpt2.py: fused c_attn :185, c_proj :223 + resid_dropout :224, MLP c_fc/act/c_proj/dropout
         :239-242, ln_1 :273 / ln_2 :304, wte/wpe :567/:574 (biased Conv1D: addmm, bias in the GEMM epilogue).
  neox   modeling_gpt_neox.py: fused query_key_value :195, dense_h_to_4h + GeLU :45; parallel residual (two norms of
         one input, two adds: the same op count as sequential). bert/opt/phi3/gemma/qwen: the same blocks with
         their families.json facts (fused projections, dropout, post-norm).
  MoE    integrations/moe.py grouped_mm experts (:355-412), router modeling_mixtral.py:105-107 (linear, fp32
         softmax, topk); experts are grouped GEMMs of T·top_k/E tokens each (balanced routing: NB the busiest
         expert sets a real kernel's time).
  torchtitan llama3 (models/llama3/model/model.py): nn.RMSNorm (fused torch.rms_norm on CUDA), rotary in fp32
         complex arithmetic :164-169 (cast up, complex mul, cast back), w2(silu(w1 x)·w3 x) :343; loss
         components/loss.py:20-27 (`pred.float()`, cross_entropy). Megatron-core: fused rotary and fused
         vocab-parallel cross-entropy — NB timed with the HF kernel counts (over-reads Megatron's memory ops).
Backward of a GEMM (m, n, k): dgrad (m, k, n) + wgrad (k, n, m) — 2× the forward FLOPs (Narayanan et al. 2021
§5.1); biased linears add the bias-gradient reduction (a read of dY). Backward of an elementwise kernel reads dY
and, when its derivative depends on its input, that input, and writes dX: reads = writes_fwd + reads_fwd,
writes = reads_fwd (NB: exact for unary ops, an upper bound for ops with constant operands).
torch.compile (inductor) fuses each chain of elementwise kernels between two matmuls into one kernel that reads
the chain's inputs and writes its outputs once (`group`): the op's fused_reads / fused_writes.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple

from ..heads import CLASSIFIERS, layout
from ..setup import Setup
from ..spec import ModelSpec
from .activations import FP32, INDEX, norm_kernel, resolved_kernel
from .families import family_traits
from .precision import StateBytes

SIZE = {"bf16": 2, "fp16": 2, "fp32": 4, "tf32": 4, "fp8": 1}
# weight formats whose GEMMs run quantised while attention runs on the 16-bit activations: bitsandbytes' LLM.int8
# (int8 matmuls inside Linear8bitLt, fp16 everywhere else) and fp8 weights (vLLM's fp8 linear methods; attention in
# the model dtype unless the KV cache is fp8). NB: timed at the fp16 rate, the bf16 one on every GPU with bf16 cores.
QUANTISED_GEMMS = ("int8", "fp8")


def attention_dtype(sh: "Shape") -> str:
    """The dtype attention's matmuls run in: the step's matmul dtype, or fp16 beside quantised GEMMs."""
    return "fp16" if sh.dtype in QUANTISED_GEMMS else sh.dtype


class Op(NamedTuple):
    """One kernel call. gemm: C[m,n] = A[m,k]·B[k,n], `batch` of them; attention: batch = b·heads, m = s_q,
    n = s_kv, k = head_dim; memory: `reads` + `writes` bytes over `kernels` launches. (A NamedTuple: the planner
    builds thousands, and dataclasses.replace is ~20× slower than _replace.)"""

    name: str
    kind: str  # "gemm" | "attention" | "memory"
    dtype: str
    m: float = 0.0
    n: float = 0.0
    k: float = 0.0
    batch: float = 1.0
    causal: bool = False
    kernel: str = ""  # attention kernel: flash, efficient, eager
    reads: float = 0.0
    writes: float = 0.0
    kernels: int = 1
    saves_input: bool = True  # memory: its backward reads its input
    wgrad: bool = True  # gemm: B is a trained weight
    bias: bool = False  # gemm: a bias added in the epilogue (its gradient is a reduction of dY)
    group: str = ""  # memory: the fusion group under torch.compile
    fused_reads: float = 0.0  # memory: bytes that still cross HBM when its group is one kernel
    fused_writes: float = 0.0
    backward: bool = False  # attention: the backward kernel
    grad: bool = True  # memory: has a backward kernel (False: fp8 casts, whose backward fp8_backward_extra lists)
    source: str = ""
    bwd_kernels: int = -1  # memory: kernels its autograd backward launches (-1: as many as the forward)
    # memory: how the kernel reaches memory (roofline.memory_seconds): "vector" (contiguous, vectorised loads),
    # "upcast" (16 -> 32-bit conversion), "strided" (a broadcast or gathered operand), "transpose" (a layout copy)
    access: str = "vector"
    bwd_access: str = ""  # its backward kernel's access ("" = the same)
    mask: int = 0  # attention, HF eager: bytes per element of its additive causal mask (0: none; roofline.unfused_attention)
    dropout: bool = False  # attention: dropout on the probabilities inside the fused kernel (roofline.fused_dropout_seconds)
    gqa: bool = False  # attention: k and v shared by groups of query heads (fewer kv heads)
    # memory: its backward's kernels spelled out (derivatives.yaml), where the generic rule (`backward`: read the
    # output's gradient and the saved input, write the input's gradient, once) under-counts a multi-kernel formula
    bwd_ops: tuple = ()

    @property
    def flops(self) -> float:
        if self.kind == "gemm":
            return 2 * self.m * self.n * self.k * self.batch
        if self.kind == "attention":
            # q·kᵀ and p·v, 2 FLOPs per MAC each; causal: the (s+1)/2 keys a query sees on average (flops.py)
            keys = (self.n + 1) / 2 if self.causal else self.n
            return 4 * self.batch * self.m * keys * self.k * (2.5 if self.backward else 1.0)
        return 0.0

    @property
    def nbytes(self) -> float:
        return self.reads + self.writes


@dataclass(frozen=True)
class Shape:
    """What the op shapes of one micro-batch on one rank depend on (hashable: the planner caches on it)."""

    batch: int
    seq: int
    cp: int = 1
    tp: int = 1
    sp: bool = False
    dtype: str = "bf16"  # the matmuls' dtype (timing.compute_dtype)
    act: int = 2  # bytes of an activation (StateBytes.act)
    residual: int = 2  # bytes of the residual stream (fp32 under autocast)
    weight: int = 2  # bytes of a weight as stored (autocast casts it per forward)
    grad: int = 2  # bytes of a weight gradient
    autocast: bool = False
    attention: str = "flash"  # resolved kernel: flash, efficient, eager
    norm: str = "hf-rmsnorm-fp32"  # stacks/*.toml [norm]
    rope: str = "cos-sin"  # stacks/*.toml [rotary]: "cos-sin" (HF), "complex-buffer" (torchtitan), "fused" (Megatron)
    loss_upcast: bool = True
    ep: int = 1
    compile: bool = False
    float8: bool = False
    fused_elementwise: bool = False  # fused bias-GeLU and bias-dropout-add kernels (stacks/*.toml [fused_elementwise])
    sdpa: bool = False  # the stack calls torch's scaled_dot_product_attention (stacks/*.toml [attention])
    # HF's eager_attention_forward adds a float causal mask made in the embeddings' output dtype, the parameters'
    # (stacks/*.toml [attention] eager_mask: transformers masking_utils.py:965, :615-617): its bytes; 0 else
    eager_mask: int = 0
    # transformers' own eager_attention_forward (attention="eager", or a family without SDPA), not SDPA's math path
    hf_eager: bool = False
    # the loss pads and shifts its labels itself (stacks/*.toml [loss] labels = "shifted-copy": ForCausalLMLoss)
    shifted_labels: bool = False

    @property
    def tokens(self) -> float:
        return self.batch * self.seq / self.cp

    @property
    def norm_tokens(self) -> float:
        return self.tokens / (self.tp if self.sp else 1)


def shape_of(spec: ModelSpec, setup: Setup, st: StateBytes, dtype: str) -> Shape:
    """The Shape of `setup` (a Setup or the planner's light _Cfg)."""
    from .compile_effects import not_modelled

    facts = setup.stack_facts.facts
    kernel = resolved_kernel(spec, setup)
    rope = setup.stack_facts.fact("rotary")
    hf_eager = kernel == "eager" and rope == "cos-sin"  # (before SDPA's math path is timed as eager below)
    if kernel == "math":
        kernel = "eager"  # SDPA's math path: bmm + softmax, as eager
    elif kernel == "flash" and st.act == FP32:
        kernel = "efficient"  # fp32 runs the memory-efficient kernel (activations._flash_saved)
    elif kernel == "flash" and setup.attention_kernel == "triton":
        kernel = "triton"  # FlashAttention in Triton: flash's saved set, its own speed (kernels.toml [derived])
    compiled = bool(getattr(setup, "compile", False)) and not not_modelled(spec, setup)
    return Shape(setup.batch, setup.seq, setup.cp, setup.tp, bool(setup.sequence_parallel), dtype, int(st.act),
                 int(st.residual), int(st.param or st.weight), int(st.grad), bool(st.autocast), kernel,
                 norm_kernel(setup) if spec.norm == "rmsnorm" else "layernorm", rope,
                 bool(family_traits(spec)["loss_upcast"]), setup.ep, compiled, bool(getattr(setup, "float8", False)),
                 facts.get("fused_elementwise", {}).get("value", False),
                 "sdpa_backends" in facts.get("attention", {}) and setup.attention_kernel != "flash2",
                 int(st.param or st.weight) if (kernel == "eager" and facts.get("attention", {}).get("eager_mask")
                                                and spec.causal) else 0,
                 hf_eager,
                 facts.get("loss", {}).get("labels") == "shifted-copy")


# --- building blocks ----------------------------------------------------------------------------------------------

def _gemm(name: str, m: float, n: float, k: float, sh: Shape, src: str, bias: bool = False, batch: float = 1,
          wgrad: bool = True, fp8: bool = False) -> Op:
    return Op(name, "gemm", "fp8" if fp8 else sh.dtype, m, n, k, batch, wgrad=wgrad, bias=bias, source=src)


def _ew(name: str, reads: float, writes: float, src: str, group: str = "", fused: tuple[float, float] | None = None,
        saves: bool = True, kernels: int = 1, grad: bool = True, bwd: int = -1, access: str = "vector",
        bwd_access: str = "", bwd_ops: tuple = ()) -> Op:
    fr, fw = (reads, writes) if fused is None else fused
    return Op(name, "memory", "", reads=reads, writes=writes, kernels=kernels, saves_input=saves, group=group,
              fused_reads=fr, fused_writes=fw, grad=grad, source=src, bwd_kernels=bwd, access=access,
              bwd_access=bwd_access, bwd_ops=bwd_ops)


def _kernel(name: str, reads: float, writes: float, access: str = "vector", kernels: int = 1) -> Op:
    """One backward kernel of an op's bwd_ops (its fused bytes: the op's, set by `backward`)."""
    return Op(name, "memory", "", reads=reads, writes=writes, access=access, kernels=kernels)


def _no_kernel(name: str) -> Op:
    """A backward that launches nothing and moves nothing: an add passes its gradient on to both operands
    (tools/autograd/derivatives.yaml add: `self: grad`, `other: maybe_multiply(grad, alpha)`)."""
    return Op(name, "memory", "", kernels=0)


def _grad_cast(name: str, x: float, src_bytes: int, dst_bytes: int) -> tuple[Op, ...]:
    """Autograd casts a gradient to its input's dtype when an op's output dtype differs from that input's (type
    promotion, e.g. a 16-bit tensor times an fp32 one): torch/csrc/autograd/engine.cpp validate_outputs
    `grad = grad.to(metadata.dtype)`, one copy of x elements; none when the dtypes agree."""
    if src_bytes == dst_bytes:
        return ()
    return (_kernel(name, x * src_bytes, x * dst_bytes, "vector" if dst_bytes < src_bytes else "upcast"),)


def _add_backward(name: str, x: float, sum_bytes: int, operand_bytes: int) -> tuple[Op, ...]:
    """An add's backward toward one operand: nothing (the gradient is passed on, _no_kernel) or, when the operand is
    narrower than the sum (type promotion), the cast of the gradient to it (_grad_cast)."""
    return _grad_cast(f"{name}.grad_cast", x, sum_bytes, operand_bytes) or (_no_kernel(f"{name}.backward"),)


def column_sum_launches(rows: float) -> int:
    """Launches of a sum over `rows` rows of a row-major tensor (a weight's or bias's gradient summed over the
    tokens): its reduce_kernel, and a cudaMemsetAsync of the semaphores when the rows are split across thread blocks
    (torch aten/src/ATen/native/cuda/Reduce.cuh gpu_reduce_kernel: `if (config.should_global_reduce())
    ... cudaMemsetAsync(semaphores...)`; the profiler counts the memset beside the kernels). setReduceConfig, for a
    reduction over a non-contiguous dimension: 4-wide output vectors, 512 / 4 = 128 threads, 32 lanes along the
    outputs and block_height 4 along the rows, which split across the warps (rows >= 64); the rows go to several
    blocks (a global reduction) when each thread is still left >= max_values_per_thread = 256 of them.
    NB: assumes >= 128 outputs (a full 32-lane block of 4-wide vectors) and an output grid within the GPU's resident
    blocks (true for any width below ~10^5 on a GPU with >= 80 SMs)."""
    return 2 if -(-rows // 4) >= 256 else 1


# Access classes of casts: torch converts fp32 -> bf16 in a vectorised kernel (bfloat16_copy_kernel_cuda) but a
# 16 -> 32-bit upcast in the generic dynamic-cast loop (unrolled_elementwise_kernel<direct_copy_kernel_cuda>, no
# vector loads): aten/src/ATen/native/cuda/Copy.cu, CUDALoops.cuh; both names in the H200 profiles. A cast's
# backward is the cast the other way, of its output's gradient alone (saves=False: it never reads its input).
DOWNCAST = {"access": "vector", "bwd_access": "upcast"}
UPCAST = {"access": "upcast", "bwd_access": "vector"}
# A broadcast operand (a [T, 1] or [h] factor) has a zero stride, so TensorIterator runs the strided
# elementwise_kernel with per-element offsets instead of a vectorised one (CUDALoops.cuh gpu_kernel_impl)
BROADCAST = {"access": "strided"}
# a row reduction (mean, softmax): reduce_kernel / the softmax kernels, below streaming bandwidth
REDUCE = {"access": "reduce"}


def norm_ops(spec: ModelSpec, name: str, tokens: float, sh: Shape, group: str, out_bytes: int | None = None,
             width: int | None = None) -> list[Op]:
    """One norm over `tokens` rows of `hidden`. Fused kernels (LayerNorm; torch.rms_norm on CUDA) read x and write y
    once; HF's RMSNorm (modeling_llama.py:61-66) is six kernels in eager: [to fp32], pow, mean, rsqrt(+eps), mul,
    [to input dtype], weight mul — each a pass over the row in fp32."""
    h, r = width or spec.hidden, sh.residual
    out = sh.residual if out_bytes is None else out_bytes  # weight·x: the input's dtype (fp32 weights keep fp32)
    x, n = tokens * h, tokens
    if spec.norm != "rmsnorm" or sh.norm == "torch-rms-norm":
        src = "aten native_layer_norm" if spec.norm != "rmsnorm" else "aten._fused_rms_norm (torch.rms_norm)"
        # backward: the input gradient, then the weight's (and bias') gradients in one kernel (aten/src/ATen/native/
        # cuda/layer_norm_kernel.cu: layer_norm_grad_input_kernel_vectorized, LaunchGammaBetaBackwardCUDAKernel's
        # GammaBetaBackwardCUDAKernelTemplate; torch.rms_norm's backward the same kernels with rms_norm=true): 2, as
        # the H200 profiles count (25 of each in gpt2's step, 45 in torchtitan's). NB: above 65,536 rows with a
        # narrow width it adds a .sum(0) per gradient (partial sums per block)
        return [_ew(name, x * r, x * out + 2 * FP32 * n, src, group, (x * r, x * sh.act), bwd=2)]
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
    # mul by 2, an add; docs/benchmarks/gpu-truth.md; the copy under aten::copy_). The weight's sum over the tokens also zeroes
    # its semaphores (column_sum_launches). NB: the column sum runs at the row reduction's rate (reduce): optimistic.
    x4, n4, hw = x * FP32, n * FP32, h * sh.weight
    ops = []
    if r != FP32:
        ops.append(_ew(f"{name}.to_fp32", x * r, x * FP32, src, group, (x * r, 0), saves=False, **UPCAST))
    ops += [_ew(f"{name}.pow", x4, x4, src, group, (0, 0), bwd_ops=(
                _kernel(f"{name}.pow.backward_copy", x4, x4), _kernel(f"{name}.pow.backward", x4, x4),
                _kernel(f"{name}.pow.backward_mul", 2 * x4, x4),
                _kernel(f"{name}.grad_sum", 2 * x4, x4))),
            _ew(f"{name}.mean", x4, n4, src, group, (0, 0), bwd_ops=(
                _kernel(f"{name}.mean.backward", n4, x4, "strided"),), **REDUCE),
            _ew(f"{name}.rsqrt", n4, n4, src, group, (0, 0), kernels=2, bwd=3),
            _ew(f"{name}.mul", x4 + n4, x4, src, group, (0 if r != FP32 else x * r, 0), bwd_ops=(
                _kernel(f"{name}.mul.backward", x4 + n4, x4, "strided"),
                _kernel(f"{name}.mul.backward_r", 2 * x4, x4), _kernel(f"{name}.mul.backward_sum", x4, n4, "reduce")),
                **BROADCAST)]
    if r != FP32:
        ops.append(_ew(f"{name}.to_dtype", x4, x * r, src, group, (0, 0), saves=False, **DOWNCAST))
    if family_traits(spec)["norm_fp32"]:
        out = FP32  # Gemma: x.float() * (1 + weight.float()) (modeling_gemma.py GemmaRMSNorm)
    y = x * max(r, out)  # the normalised input as the weight multiplies it
    # fused: the compiled norm writes its output in the dtype the next matmul reads (the autocast cast folded in)
    ops.append(_ew(f"{name}.weight", y, x * out, src, group, (0, x * sh.act), bwd_ops=(
        _kernel(f"{name}.weight.backward", x * out + hw, y, "strided"),
        _kernel(f"{name}.weight.backward_w", x * out + y, x * out),
        _kernel(f"{name}.weight.grad", x * out, hw, "reduce", column_sum_launches(n))),
        **BROADCAST))
    return ops


def _casts(name: str, tokens: float, width: float, calls: int, sh: Shape, group: str) -> list[Op]:
    """torch.autocast casts a linear's fp32 input to the compute dtype per call (q, k and v each cast the same
    input); compiled, the norm writes the low-precision tensor once (norm_ops)."""
    if not sh.autocast or sh.act == FP32:
        return []
    x = tokens * width
    return [_ew(f"{name}.autocast{j}", x * FP32, x * sh.act, "torch.autocast (linear inputs)", group, (0, 0),
                saves=False, **DOWNCAST) for j in range(calls)]


def _rope(name: str, tokens: float, width: float, sh: Shape) -> list[Op]:
    """Rotary on q or k (`width` features). HF (modeling_llama.py:119-148): neg + cat (rotate_half), two muls, one
    add. torchtitan (model.py:164-169): cast to fp32, complex mul, cast back. Megatron: one fused kernel."""
    x, a = tokens * width, sh.act
    if sh.rope == "fused":
        return [_ew(f"{name}.rope", x * a, x * a, "megatron fused_apply_rotary_pos_emb", "rope", saves=False)]
    if sh.rope == "complex-buffer":
        src = "torchtitan llama3 model.py:164-169"
        # the complex product's backward is grad·conj(freqs) (FunctionsManual.cpp mul_tensor_backward `grad *
        # other.conj()`), the conjugate materialised first (conj_kernel_cuda: 2 per layer in the H200 torchtitan
        # profile, beside the 4 complex muls; NB its bytes, the [s, d/2] table's, left out)
        cmul_bwd = (_kernel(f"{name}.rope_conj", 0, 0),
                    _kernel(f"{name}.rope_cmul.backward", x * FP32, x * FP32, "strided"))
        return [_ew(f"{name}.rope_fp32", x * a, x * FP32, src, "rope", (x * a, 0), saves=False, **UPCAST),
                _ew(f"{name}.rope_cmul", x * FP32, x * FP32, src, "rope", (0, 0), saves=False, bwd_ops=cmul_bwd,
                    **BROADCAST),
                _ew(f"{name}.rope_cast", x * FP32, x * a, src, "rope", (0, x * a), saves=False, **DOWNCAST)]
    src = "modeling_llama.py:119-148"
    # cos and sin come in the hidden states' dtype (LlamaRotaryEmbedding.forward :116 `cos.to(dtype=x.dtype)`, x the
    # embeddings' output: fp32 under autocast), so q·cos, rotate_half(q)·sin and their sum are in the wider of the two
    # by type promotion (fp32 under autocast: the attention casts them back, `_rope_casts`)
    o = max(a, sh.residual)
    # backward: the add passes its gradient on (no kernel), the cos/sin products one each, each cast back to the
    # 16-bit q when promoted (_grad_cast), cat's halves are views but rotate_half's two input slices each make zeros +
    # a copy (slice_backward), then x's three gradients are summed (2)
    # the halves are strided slices; cos and sin ([1, s, d]) broadcast over batch and heads
    return [_ew(f"{name}.rope_neg", x * a / 2, x * a / 2, src, "rope", (x * a, 0), saves=False, **BROADCAST),
            _ew(f"{name}.rope_cat", x * a, x * a, src, "rope", (0, 0), saves=False, bwd=6, **BROADCAST),
            _ew(f"{name}.rope_cos", x * a, x * o, src, "rope", (0, 0), saves=False, bwd_ops=(
                _kernel(f"{name}.rope_cos.backward", x * o, x * o, "strided"),
                *_grad_cast(f"{name}.rope_cos.grad_cast", x, o, a)), **BROADCAST),
            _ew(f"{name}.rope_sin", x * a, x * o, src, "rope", (0, 0), saves=False, bwd_ops=(
                _kernel(f"{name}.rope_sin.backward", x * o, x * o, "strided"),
                *_grad_cast(f"{name}.rope_sin.grad_cast", x, o, a)), **BROADCAST),
            _ew(f"{name}.rope_add", 2 * x * o, x * o, src, "rope", (0, x * a), saves=False,
                bwd_ops=(_no_kernel(f"{name}.rope_add.backward"),))]


def _rope_casts(name: str, tokens: float, width: float, sh: Shape) -> list[Op]:
    """Under autocast the HF rotary output is fp32 (_rope), so the attention's autocast casts q and k back to the
    compute dtype (torch's autocast lower-precision list: scaled_dot_product_attention, matmul), and its backward
    the gradient up again. NB: eager attention with GQA casts k after repeat_kv (n_rep x the bytes); timed here
    on k itself."""
    o = max(sh.act, sh.residual)
    if sh.rope != "cos-sin" or o == sh.act:
        return []
    x = tokens * width
    return [_ew(f"{name}.attn_cast", x * o, x * sh.act, "torch.autocast (attention inputs)", "rope", (0, 0),
                saves=False, **DOWNCAST)]


def _grad_layout(name: str, tokens: float, width: float, sh: Shape) -> list[Op]:
    """A projection viewed as heads (`q_proj(x).view(b, s, heads, d).transpose(1, 2)`) whose gradient comes back
    head-major ([b, heads, s, d] contiguous: rotate_half's slice_backward zeros, a bmm's output) cannot be viewed
    back as [b, s, heads·d]: view's backward reshapes it with one transpose copy (the H200 profiles' copy_ of
    [2, 1024, heads, 64], one per layer for q and for k under SDPA; for q and v in GPT-2's eager attention; q, k and
    v in llama's eager and math-path steps). No forward kernel. Compiled, inductor plans the layouts itself (left
    out)."""
    if sh.compile:
        return []
    x = tokens * width * sh.act
    return [_ew(f"{name}.grad_layout", 0, 0, "autograd view backward (reshape copy)", saves=False, kernels=0,
                bwd_ops=(_kernel(f"{name}.grad_layout", x, x, "transpose"),))]


def _activation(spec: ModelSpec, name: str, x: float, sh: Shape, group: str) -> list[Op]:
    """The MLP activation over x elements: one kernel (SiLU, GeLU, ReLU), or HF's composite gelu_new (_gelu_new) /
    gelu_fast (activations.py FastGELUActivation; NB: counted as 8 kernels with one backward kernel each, not
    profiled)."""
    a = sh.act
    if spec.activation == "gelu_new" and not sh.fused_elementwise:
        return _gelu_new(name, x, sh, group)
    # (Megatron-core: one fused bias-GeLU kernel, megatron/core/fusions/fused_bias_gelu.py)
    passes = 8 if spec.activation == "gelu_fast" and not sh.fused_elementwise else 1
    return [_ew(f"{name}.{spec.activation}{j}", x * a * (2 if j in (2, 5, 6, 7) and passes > 1 else 1), x * a,
                "transformers activations.py", group, (x * a if j == 0 else 0, x * a if j == passes - 1 else 0))
            for j in range(passes)]


def activation_out_bytes(spec: ModelSpec, sh: Shape) -> int:
    """Bytes per element of the MLP activation's output: fp32 for HF's gelu_new under autocast (_gelu_new_out), so
    the next linear casts it back; else the activations'."""
    return _gelu_new_out(sh) if spec.activation == "gelu_new" and not sh.fused_elementwise else sh.act


def _gelu_new_out(sh: Shape) -> int:
    """gelu_new's pow runs in fp32 under autocast (torch's autocast fp32 op list, aten/src/ATen/autocast_mode.cpp
    `KERNEL_CUDA(pow, Tensor_Scalar, fp32)`) and type promotion carries fp32 through its sum and product."""
    return FP32 if sh.autocast else sh.act


def _gelu_new(name: str, x: float, sh: Shape, group: str) -> list[Op]:
    """HF's NewGELUActivation (transformers 5.24 activations.py:65-66) `0.5 * input * (1.0 + torch.tanh(
    math.sqrt(2.0 / math.pi) * (input + 0.044715 * torch.pow(input, 3.0))))`, eager: A = 0.5·x, then x³, 0.044715·,
    x + ·, √(2/π)·, tanh, 1 + ·, A·B: 8 kernels; under autocast x is first cast up for pow (activation_out_bytes)
    and everything after pow, the output too, is fp32 (u bytes).
    Backward (tools/autograd/derivatives.yaml): A·B's two muls (grad·B, grad·A), tanh_backward, the three
    constant muls' one each, pow_backward's three (x.pow(2), 3·, grad·: FunctionsManual.cpp pow_backward), the two
    adds none; then x's three gradients (through A, the sum and pow) summed: 2 adds; 11. Under autocast also the
    casts of the fp32 gradients to the 16-bit operands (A's from A·B, x's from x + ·: engine.cpp validate_outputs)
    and pow's input cast back: 3 (14). The H200 gpt2 amp profile: per layer 4 mul(TT), 7 mul(·scalar), 2 pow, tanh,
    tanh_backward, 2 add_ and 4 [2, 1024, 3072] copies beside the forward's add(TT) and add(1 + ·)."""
    a, u = sh.act, _gelu_new_out(sh)
    src = "transformers activations.py:65-66 NewGELUActivation"
    xa, xu = x * a, x * u

    def k(n, r, w, kernels=1):
        return _kernel(f"{name}.gelu_new.{n}", r, w, kernels=kernels)
    # (name, reads, writes, backward kernels); x's three gradients are summed after A's, the last backward
    fwd = [("half", xa, xa, (k("half.backward", xa, xa), k("grad_sum", 4 * xa, 2 * xa, kernels=2)))]
    if u != a:  # autocast: x cast up for pow; its backward casts pow's gradient back
        fwd.append(("pow_cast", xa, xu, (k("pow_cast.backward", xu, xa),)))
    fwd += [("pow", xu, xu, (k("pow.backward_pow", xu, xu), k("pow.backward_scale", xu, xu),
                             k("pow.backward", 2 * xu, xu))),
            ("cube_scale", xu, xu, (k("cube_scale.backward", xu, xu),)),
            ("inner_add", xa + xu, xu, _add_backward(f"{name}.gelu_new.inner_add", x, u, a)),
            ("inner_scale", xu, xu, (k("inner_scale.backward", xu, xu),)),
            ("tanh", xu, xu, (k("tanh.backward", 2 * xu, xu),)),
            ("one_plus", xu, xu, _add_backward(f"{name}.gelu_new.one_plus", x, u, u)),
            ("product", xa + xu, xu, (k("product.backward_a", 2 * xu, xu), k("product.backward_b", xa + xu, xu),
                                      *_grad_cast(f"{name}.gelu_new.product.grad_cast", x, u, a)))]
    last = len(fwd) - 1
    # compiled: one kernel reads x and writes the output (the first op's read, the last op's write)
    return [_ew(f"{name}.gelu_new.{n}", r, w, src, group, (xa if j == 0 else 0, xa if j == last else 0), bwd_ops=b)
            for j, (n, r, w, b) in enumerate(fwd)]


def _dropout(name: str, x: float, sh: Shape, group: str) -> list[Op]:
    """CUDA native_dropout: reads x, writes y and a 1-byte mask (activations.dropout_mask_bytes)."""
    a = sh.act
    return [_ew(name, x * a, x * (a + 1), "aten native_dropout", group, (0, x), saves=False)]


def _residual(name: str, x: float, p: float, sh: Shape, group: str, src: str) -> list[Op]:
    """[dropout on the branch output,] then the residual add (reads the branch and the stream, writes the stream);
    Megatron-core fuses the two (megatron/core/fusions/fused_bias_dropout.py bias_dropout_add: one kernel). The add's
    backward passes the stream's gradient on to both, cast to the branch's dtype where it is narrower (autocast:
    a 16-bit branch on the fp32 stream, _add_backward; the H200 profiles' two [2, 1024, h] copies per layer)."""
    a, r = sh.act, sh.residual
    if p > 0 and sh.fused_elementwise:
        return [_ew(f"{name}_bias_dropout_add", x * (r + a), x * (r + 1), "megatron fused_bias_dropout.py", group,
                    saves=False)]
    drop = _dropout(f"{name}_dropout", x, sh, group) if p > 0 else []
    return drop + [_ew(f"{name}_residual", x * (r + a), x * r, src, group, saves=False,
                       bwd_ops=_add_backward(f"{name}_residual", x, r, a))]


def _fp8(linear: Op, sh: Shape) -> list[Op]:
    """torchao Float8Linear (float8/float8_linear.py, tensorwise dynamic scaling): before the fp8 GEMM each operand
    gets an amax reduction and a scaled cast to fp8 (input: T·k, weight: k·n). Compiled, amax and cast stay two
    passes (the amax must finish before the cast), so fused == eager bytes."""
    a, w = sh.act, sh.weight
    x, wt = linear.m * linear.k * linear.batch, linear.k * linear.n * linear.batch
    src = "torchao float8 tensorwise scaling (amax + cast)"
    return [_ew(f"{linear.name}.amax_x", x * a, FP32, src, grad=False),
            _ew(f"{linear.name}.cast_x", x * a, x, src, grad=False),
            _ew(f"{linear.name}.amax_w", wt * w, FP32, src, grad=False),
            _ew(f"{linear.name}.cast_w", wt * w, wt, src, grad=False)]


# --- one layer ------------------------------------------------------------------------------------------------------

def layer_forward(spec: ModelSpec, sh: Shape, moe: bool = False) -> list[Op]:
    """The forward kernels of one transformer layer on one rank, in order; `moe`: its MLP is the sparse block."""
    traits = family_traits(spec)
    h, t, a = spec.hidden, sh.tp, sh.act
    T, Tn = sh.tokens, sh.norm_tokens
    q, kv = spec.q_dim / t, spec.kv_dim / t
    _, p_attn, p_resid = spec.dropouts
    ops: list[Op] = []

    def proj(name: str, n_full: int, k_full: int, n: float, k: float, bias: bool, src: str) -> Op:
        fp8 = sh.float8 and n_full % 16 == 0 and k_full % 16 == 0  # torchtitan module_filter_fn
        g = _gemm(name, T, n, k, sh, src, bias=bias, fp8=fp8)
        if fp8:
            ops.extend(_fp8(g, sh))
        ops.append(g)
        return g

    pre = "post" if traits["post_norm"] else "pre"
    # attention sub-block
    if pre == "pre":
        ops += norm_ops(spec, "attn_norm", Tn, sh, "attn_in")
    qkv_calls = 1 if traits["fused_qkv"] else 3
    if spec.mla is not None:
        qkv_calls = 2  # q_a_proj (or q_proj) and kv_a_proj_with_mqa read the norm output
    ops += _casts("attn_in", T, h, qkv_calls, sh, "attn_in")
    src = "modeling_llama.py:243 q/k/v_proj"
    head_k = spec.head_dim
    if spec.mla is not None:
        ops += _mla_projections(spec, sh, proj)
        # q·kᵀ contracts the qk head width, p·v the v head width: Op.flops' 4·k is 2·(qk + v) with k their mean
        head_k = (spec.mla.qk_head_dim + spec.mla.v_head_dim) / 2
    elif traits["fused_qkv"]:
        proj("qkv", spec.q_dim + 2 * spec.kv_dim, h, q + 2 * kv, h, spec.qkv_bias,
             "fused qkv (gpt2 c_attn, neox, phi3)")
        ops += _qkv_split(T, q, kv, sh)
    else:
        for name, full, n in (("q", spec.q_dim, q), ("k", spec.kv_dim, kv), ("v", spec.kv_dim, kv)):
            proj(name, full, h, n, h, spec.qkv_bias, src)
    rotary = spec.positions == "rotary" and spec.mla is None and sh.rope == "cos-sin"
    # HF's attention over torch.matmul: its own eager_attention_forward, or SDPA's math path (the same folds)
    unfused = sh.attention == "eager" and sh.rope == "cos-sin" and spec.mla is None
    if spec.mla is None and (rotary or unfused):  # gradients that come back head-major (_grad_layout)
        ops += _grad_layout("q", T, q, sh) + (_grad_layout("k", T, kv, sh) if rotary else [])
        ops += _grad_layout("v", T, kv, sh) if unfused else []
    if spec.mla is not None:
        pass
    elif spec.qk_norm:  # Qwen3 q_norm / k_norm over head_dim (modeling_qwen3.py)
        ops += norm_ops(spec, "q_norm", T * q / spec.head_dim, sh, "qk_norm", a, spec.head_dim)
        ops += norm_ops(spec, "k_norm", T * kv / spec.head_dim, sh, "qk_norm", a, spec.head_dim)
    if spec.positions == "rotary" and spec.mla is None:
        ops += _rope("q", T, q, sh) + _rope("k", T, kv, sh) + _rope_casts("q", T, q, sh) + _rope_casts("k", T, kv, sh)
    bh = sh.batch * spec.heads / t
    if sh.attention == "eager" and kv < q:  # repeat_kv: expand + reshape copies k and v to every head (:168)
        # backward: expand's, a sum over the repeats, for each (the H200 llama eager profile: 2 copy_ and 2 sum of
        # [2, 8, 4, 1024, 64] per layer)
        ops.append(_ew("repeat_kv", 2 * T * kv * a, 2 * T * q * a, "modeling_llama.py:168 repeat_kv", saves=False,
                       kernels=2, **BROADCAST))
    if unfused:
        ops += _eager_operand_copies(T, q, kv, sh)
    if sh.attention == "eager" and spec.attn_softcap:  # Gemma-2: scores / cap, tanh, * cap (modeling_gemma2.py)
        s2 = bh * (sh.seq / sh.cp) * sh.seq * a
        ops += [_ew(f"softcap{j}", s2, s2, "modeling_gemma2.py attn_logit_softcapping") for j in range(3)]
    # a 16-bit flash call through torch's SDPA runs what torch picks on the GPU (roofline.runnable "sdpa")
    kernel = "sdpa" if sh.attention == "flash" and sh.sdpa else sh.attention
    fwd_k, bwd_k = (1, -1) if sh.attention != "eager" else (
        eager_kernels(sh.act, sh.eager_mask) if sh.hf_eager else math_kernels(spec.causal))  # scores: q's dtype
    ops.append(Op("attention", "attention", attention_dtype(sh), sh.seq / sh.cp, sh.seq, head_k, bh, causal=spec.causal,
                  kernel=kernel, kernels=fwd_k, bwd_kernels=bwd_k, mask=sh.eager_mask,
                  dropout=p_attn > 0 and sh.attention != "eager", gqa=kv < q and spec.mla is None,
                  source="SDPA / eager_attention_forward (flash: p_attn dropout in the kernel)"))
    if sh.attention == "eager" and p_attn > 0:  # eager_attention_forward :67 dropout on the probabilities
        ops += _dropout("attn_probs_dropout", bh * (sh.seq / sh.cp) * sh.seq, sh, "")
    if unfused:
        ops += _eager_output_copy(T, q, sh)
    if spec.mla is not None:  # o_proj reads heads·v_head_dim (modeling_deepseek_v3.py:398-402)
        o_in = spec.heads * spec.mla.v_head_dim
        proj("o", h, o_in, h, o_in / t, spec.out_bias, "modeling_deepseek_v3.py:481 o_proj")
    else:
        proj("o", h, spec.q_dim, h, q, spec.out_bias, "modeling_llama.py:269 o_proj")
    ops += _residual("attn", Tn * h, p_resid, sh, "attn_out", "modeling_llama.py:306 residual add")
    if pre == "post":
        ops += norm_ops(spec, "attn_norm", Tn, sh, "attn_out")
    # MLP sub-block
    if pre == "pre":
        ops += norm_ops(spec, "mlp_norm", Tn, sh, "attn_out")
    i = spec.intermediate / t
    if moe:
        ops += _moe(spec, sh)
    elif spec.gated_mlp:
        ops += _casts("mlp_in", T, h, 1 if traits["fused_gate_up"] else 2, sh, "attn_out")
        if traits["fused_gate_up"]:
            proj("gate_up", 2 * spec.intermediate, h, 2 * i, h, spec.mlp_bias, "phi3 gate_up_proj")
        else:
            proj("gate", spec.intermediate, h, i, h, spec.mlp_bias, "modeling_llama.py:164 gate_proj")
            proj("up", spec.intermediate, h, i, h, spec.mlp_bias, "modeling_llama.py:164 up_proj")
        ops += _activation(spec, "act", T * i, sh, "act")
        x = T * i * a
        ops.append(_ew("act_mul", 2 * x, x, "modeling_llama.py:164 act(gate)·up", "act", (0, x), bwd_ops=(
            # mul's backward (derivatives.yaml): grad·up and grad·act(gate), each reading the gradient
            _kernel("act_mul.backward", 2 * x, x), _kernel("act_mul.backward_up", 2 * x, x))))
        proj("down", h, spec.intermediate, h, i, spec.mlp_bias, "modeling_llama.py:164 down_proj")
    else:
        ops += _casts("mlp_in", T, h, 1, sh, "attn_out")
        proj("fc1", spec.intermediate, h, i, h, spec.mlp_bias, "modeling_gpt2.py:239 c_fc")
        ops += _activation(spec, "act", T * i, sh, "act")
        if activation_out_bytes(spec, sh) == FP32:  # gelu_new's fp32 output, cast back for c_proj
            ops += _casts("fc2_in", T, i, 1, sh, "act")
        proj("fc2", h, spec.intermediate, h, i, spec.mlp_bias, "modeling_gpt2.py:241 c_proj")
    ops += _residual("mlp", Tn * h, p_resid, sh, "mlp_out", "modeling_llama.py:312 residual add")
    if pre == "post":
        ops += norm_ops(spec, "mlp_norm", Tn, sh, "mlp_out")
    return _weight_casts("weight_casts", [o for o in ops if not o.name.startswith("experts")], sh) + ops


def _weight_casts(name: str, ops: list[Op], sh: Shape) -> list[Op]:
    """Autocast's weight cache: each weight of an autocast matmul, and its bias, cast once per forward (torch/amp
    autocast_mode.cpp cached_cast: leaf tensors that require grad), each cast's backward casting the gradient back.
    The projections' weights, not the MoE experts' (grouped_mm runs outside autocast, moe.py). The H200 gpt2 amp
    profile: per layer 8 weight and 8 bias copies (4 of each shape, forward and backward)."""
    if not sh.autocast or sh.act == FP32:
        return []
    gemms = [o for o in ops if o.kind == "gemm"]
    n = sum(o.n * o.k * o.batch for o in gemms) + sum(o.n * o.batch for o in gemms if o.bias)
    return [_ew(name, n * sh.weight, n * sh.act, "torch.autocast weight cast cache", "", saves=False,
                kernels=len(gemms) + sum(1 for o in gemms if o.bias), **DOWNCAST)]


def _qkv_split(tokens: float, q: float, kv: float, sh: Shape) -> list[Op]:
    """A fused q/k/v projection split into three views (GPT-2's `c_attn(x).split(...)`, modeling_gpt2.py:187): no
    forward kernel; split's backward concatenates the three gradients (derivatives.yaml split_backward: cat), one
    kernel (the H200 gpt2 profiles: one CatArrayBatchedCopy per layer). NB: GPT-NeoX's chunk and Phi-3's slices are
    taken as the same one kernel. Compiled, left out (inductor writes the gradients into one buffer)."""
    if sh.compile:
        return []
    x = tokens * (q + 2 * kv) * sh.act
    return [_ew("qkv_split", 0, 0, "modeling_gpt2.py:187 split", saves=False, kernels=0,
                bwd_ops=(_kernel("qkv_split.backward", x, x),))]


def _eager_operand_copies(tokens: float, q: float, kv: float, sh: Shape) -> list[Op]:
    """HF's eager_attention_forward (modeling_gpt2.py:55-73, modeling_llama.py:180-202), and SDPA's math path
    (attention.cpp _scaled_dot_product_attention_math), multiply heads-strided views with torch.matmul, which folds
    batch and heads into one bmm batch: a view of [b, s, heads, d] storage cannot fold, so matmul's reshape copies it
    (aten LinearAlgebra.cpp _matmul_impl: expand + reshape): q always (a projection view, or rotary's output in that
    layout), k and v unless repeat_kv already made them contiguous (GQA). Their backward is a view (none). The H200
    profiles: per layer 2 [2, 12, 1024, 64] and 1 [2, 12, 64, 1024] forward copies in gpt2 eager, 1 [2, 32, 1024,
    64] in llama eager and in llama fp32's math path (GQA). Compiled, left out (_grad_layout)."""
    if sh.compile:
        return []
    n = (q + (0 if kv < q else 2 * kv)) * tokens * sh.act
    return [_ew("attn_operand_copies", n, n, "torch.matmul reshape copies", saves=False, kernels=1 if kv < q else 3,
                bwd_ops=(_no_kernel("attn_operand_copies.backward"),), access="transpose")]


def _eager_output_copy(tokens: float, q: float, sh: Shape) -> list[Op]:
    """The eager attention's output, [b, heads, s, d] from the bmm, transposed back and made contiguous
    (`attn_output.transpose(1, 2).contiguous()`, modeling_llama.py:200; GPT-2 :224 `.reshape(...).contiguous()`):
    one copy; in backward the gradient, [b, s, heads, d] viewed head-major, is copied again by matmul's
    _unsafe_view backward (a reshape); HF's SDPA wrapper does the same to the math path's output
    (integrations/sdpa_attention.py `attn_output.transpose(1, 2).contiguous()`). The H200 profiles: one forward [2,
    1024, heads, 64] and one backward [2, heads, 1024, 64] copy per layer in both eager steps and the math path.
    Compiled, left out (_grad_layout)."""
    if sh.compile:
        return []
    x = tokens * q * sh.act
    return [_ew("attn_output_copy", x, x, "eager attention output transpose + contiguous", saves=False,
                access="transpose")]


def _mla_projections(spec: ModelSpec, sh: Shape, proj) -> list[Op]:
    """MLA's q and kv paths before SDPA (DeepseekV3Attention.forward, modeling_deepseek_v3.py:436-470): q_a_proj ->
    q_a_layernorm -> q_b_proj (or q_proj), kv_a_proj_with_mqa -> kv_a_layernorm -> kv_b_proj, RoPE on q's rope part
    (every head) and on the one shared k_rot, and the copies building q (cat) and k (expand_kv's new_empty + 2
    copy_). Under TP the down-projections are replicated and the up-projections split by heads (vLLM
    deepseek_v2.py: ReplicatedLinear q_a_proj / kv_a_proj_with_mqa, ColumnParallelLinear q_b_proj / kv_b_proj)."""
    m, h, t, a, n = spec.mla, spec.hidden, sh.tp, sh.act, spec.heads
    T = sh.tokens
    ops: list[Op] = []
    qk, kv_up = n * m.qk_head_dim, n * (m.qk_nope_head_dim + m.v_head_dim)
    src = "modeling_deepseek_v3.py:437-440"
    if m.q_lora_rank:
        proj("q_a", m.q_lora_rank, h, m.q_lora_rank, h, spec.qkv_bias, src + " q_a_proj")
        ops += norm_ops(spec, "q_a_norm", T, sh, "q_a_norm", a, m.q_lora_rank)
        ops += _casts("q_b_in", T, m.q_lora_rank, 1, sh, "q_a_norm")
        proj("q_b", qk, m.q_lora_rank, qk / t, m.q_lora_rank, False, src + " q_b_proj")
    else:
        proj("q", qk, h, qk / t, h, False, src + " q_proj")
    proj("kv_a", m.kv_lora_rank + m.qk_rope_head_dim, h, m.kv_lora_rank + m.qk_rope_head_dim, h, spec.qkv_bias,
         "modeling_deepseek_v3.py:444 kv_a_proj_with_mqa")
    ops += norm_ops(spec, "kv_a_norm", T, sh, "kv_a_norm", a, m.kv_lora_rank)
    ops += _casts("kv_b_in", T, m.kv_lora_rank, 1, sh, "kv_a_norm")
    proj("kv_b", kv_up, m.kv_lora_rank, kv_up / t, m.kv_lora_rank, False, "modeling_deepseek_v3.py:418 kv_b_proj")
    ops += _rope("q", T, n * m.qk_rope_head_dim / t, sh) + _rope("k", T, m.qk_rope_head_dim, sh)
    ops += [_ew("q_cat", T * qk / t * a, T * qk / t * a, "modeling_deepseek_v3.py:466 torch.cat", saves=False),
            _ew("k_build", T * (n * m.qk_nope_head_dim / t + m.qk_rope_head_dim) * a, T * qk / t * a,
                "modeling_deepseek_v3.py:421-423 expand_kv copy_", saves=False)]
    return ops


def _moe(spec: ModelSpec, sh: Shape) -> list[Op]:
    """The sparse MoE block (integrations/moe.py grouped_mm experts; router modeling_mixtral.py:105-107). With
    --ep the rank runs E/ep experts on the T·top_k routed copies it receives (balanced)."""
    m = spec.moe
    h, t, a = spec.hidden, sh.tp, sh.act
    T, e, k = sh.tokens, m.num_experts, m.top_k
    i = m.expert_intermediate / t
    local = max(1, e // sh.ep)
    per_expert = T * k / local
    src = "transformers integrations/moe.py grouped_mm experts"
    ops = _casts("router_in", T, h, 1, sh, "attn_out")
    ops.append(_gemm("router", T, e, h, sh, "modeling_mixtral.py:105 router linear"))
    ops += [_ew("router_softmax", T * e * a, T * e * FP32, "modeling_mixtral.py:106 softmax(fp32)", "router"),
            _ew("router_topk", T * e * FP32, T * k * (FP32 + INDEX), "modeling_mixtral.py:107 topk", "router",
                saves=False),
            _ew("dispatch", T * k * h * a + T * k * INDEX, T * k * h * a, src + " (hidden[perm // k])", saves=False)]
    gate = 2 if spec.gated_mlp else 1
    # grouped_mm is not autocast-enabled: transformers casts the input to the weights' dtype (moe.py:379), so under
    # autocast the experts run in the fp32 master weights' dtype (NB: TF32 peak where the GPU has it)
    ex = replace(sh, dtype="fp32") if sh.autocast else sh
    ops.append(_gemm("experts_in", per_expert, gate * i, h, ex, src + " grouped_mm gate_up", batch=local))
    ops += _activation(spec, "experts_act", T * k * i, sh, "experts_act")
    if spec.gated_mlp:
        ops.append(_ew("experts_mul", 2 * T * k * i * a, T * k * i * a, src, "experts_act", (0, T * k * i * a)))
    ops.append(_gemm("experts_out", per_expert, h, i, ex, src + " grouped_mm down", batch=local))
    ops += [_ew("routing_weight", T * k * h * a + T * k * FP32, T * k * h * a, src + " · routing weight", "combine"),
            _ew("combine", T * k * h * a + T * k * INDEX, T * h * a, src + " (out[inv_perm], sum over k)", "combine",
                saves=False)]
    if m.shared_intermediate:  # Qwen-MoE shared expert: a gated MLP scaled by sigmoid(gate(x)) (modeling_qwen2_moe.py)
        s = m.shared_intermediate / t
        ops += [_gemm("shared_gate", T, s, h, sh, "modeling_qwen2_moe.py shared_expert"),
                _gemm("shared_up", T, s, h, sh, "modeling_qwen2_moe.py shared_expert")]
        ops += _activation(spec, "shared_act", T * s, sh, "shared_act")
        ops.append(_ew("shared_mul", 2 * T * s * a, T * s * a, "modeling_qwen2_moe.py shared_expert", "shared_act",
                       (0, T * s * a)))
        ops.append(_gemm("shared_down", T, h, s, sh, "modeling_qwen2_moe.py shared_expert"))
        if m.shared_gate:
            ops += [_gemm("shared_expert_gate", T, 1, h, sh, "modeling_qwen2_moe.py shared_expert_gate"),
                    _ew("shared_scale", 2 * T * h * a, T * h * a, "modeling_qwen2_moe.py sigmoid gate", "combine")]
    return ops


# --- embedding, head and loss ------------------------------------------------------------------------------------

def embedding_forward(spec: ModelSpec, sh: Shape) -> list[Op]:
    """The first stage's input: the token gather (and learned positions, BERT's token types and LayerNorm, Gemma's
    √h scale, embedding dropout). NB: OPT-350m's project_in GEMM is not listed (as in flops.py). The gather's
    backward is embedding_dense_backward (embedding_backward), no elementwise kernel."""
    h, T, r = spec.embed_proj_dim or spec.hidden, sh.tokens, sh.residual
    w = sh.weight
    ops = [_ew("embed", T * h * w + T * INDEX, T * h * r, "modeling_llama.py:370 embed_tokens (gather)", "embed",
               saves=False, grad=False)]
    if spec.positions == "learned":
        # GPT-2 (modeling_gpt2.py:567-575): wpe gathers the [1, s] position ids' rows, then a broadcast add; the
        # add's backward passes the gradient to the tokens' rows and sums it over the batch for the positions'
        # (sum_to_size: a column sum over b rows), whose table then takes embedding_dense_backward (embedding_backward)
        s, b = sh.seq / sh.cp, sh.batch
        ops.append(_ew("embed_positions", s * h * (w + r) + s * INDEX + T * h * r, (s + T) * h * r,
                       "modeling_gpt2.py:574 wpe + add", "embed", saves=False, kernels=2, bwd_ops=(
                           _kernel("embed_positions.grad_sum", T * h * r, s * h * r, "reduce",
                                   column_sum_launches(b)),)))
    if spec.type_vocab:
        ops.append(_ew("embed_types", T * h * (w + r), T * h * r, "modeling_bert.py token_type_embeddings + add",
                       "embed", saves=False))
    if spec.family.startswith("gemma"):
        ops.append(_ew("embed_scale", T * h * r, T * h * r, "modeling_gemma.py normalizer", "embed", saves=False))
    if spec.embedding_norm:
        ops += norm_ops(spec, "embed_norm", T, sh, "embed")
    if spec.dropouts[0] > 0:
        ops += _dropout("embed_dropout", T * h, sh, "embed")
    return ops


# embedding_dense_backward_cuda's direct path (aten/src/ATen/native/cuda/Embedding.cu: `if (num_indices <= 3072 &&
# !scale_grad_by_freq)`: at::zeros + one embedding_backward_feature_kernel); above it, the indices are sorted first
EMBEDDING_DIRECT_MAX = 3072


def embedding_backward(spec: ModelSpec, sh: Shape, tied: bool = False) -> list[Op]:
    """embedding_dense_backward of the token table (and of GPT-2's position table): a zeroed V/t × h gradient (a fill
    kernel), then, for up to EMBEDDING_DIRECT_MAX indices, one kernel summing the T rows of dY into it (the H200
    profiles: one fill + one embedding_backward_feature_kernel per table); above, the indices radix-sorted (cub) and
    embedding_backward_cuda_kernel's segment sums (NB: counted 3 + 1 kernels, not profiled). `tied`: the LM head
    shares the table (tied_embeddings, one stage), so its two gradients meet in autograd's InputBuffer::add
    (torch/csrc/autograd/input_buffer.cpp): one add_ over V/t × h (the H200 gpt2 profiles: add_ of [50257, 768])."""
    h, T = spec.embed_proj_dim or spec.hidden, sh.tokens
    ops = _embedding_grad("embed", spec.vocab / sh.tp, T, h, sh)
    if spec.positions == "learned":
        ops += _embedding_grad("embed_positions", spec.max_positions + spec.position_offset, sh.seq / sh.cp, h, sh)
    if tied:
        x = spec.vocab / sh.tp * h * sh.grad
        ops.append(_ew("embed.tied_grad_sum", 2 * x, x, "autograd InputBuffer::add (tied LM head)", saves=False))
    return ops


def _embedding_grad(name: str, rows: float, indices: float, h: float, sh: Shape) -> list[Op]:
    """One table's embedding_dense_backward (embedding_backward): rows × h zeroed, `indices` rows of dY summed in."""
    src = "aten embedding_dense_backward (Embedding.cu)"
    ops = [_ew(f"{name}.grad_zero", 0, rows * h * sh.grad, src, saves=False)]
    if indices > EMBEDDING_DIRECT_MAX:
        ops.append(_ew(f"{name}.grad_sort", 2 * indices * INDEX, 2 * indices * INDEX, src, saves=False, kernels=3))
    return ops + [_ew(f"{name}.grad_scatter", indices * h * (sh.residual + sh.grad), indices * h * sh.grad, src,
                      saves=False)]


def head_forward(spec: ModelSpec, sh: Shape, logits_rows: float | None = None) -> list[Op]:
    """The last stage's final norm, task head (trainfit.heads) and loss. The LM loss: HF's ForCausalLMLoss and
    torchtitan's cross_entropy_loss upcast the T × V/t logits to fp32 (loss_utils.py:61, loss.py:23) and run
    log_softmax (two reading passes: max/sum, then write) + nll_loss; compiled, one kernel reads the logits.
    `logits_rows` (generation): the LM head runs on those rows only (transformers' logits_to_keep: the norm sees
    every token, the head the last one per sequence) and there is no loss."""
    h, t, a = spec.hidden, sh.tp, sh.act
    T, Tn = sh.tokens, sh.norm_tokens
    ops = norm_ops(spec, "final_norm", Tn, sh, "final") if spec.final_norm else []
    head = layout(spec)
    if head.kind in CLASSIFIERS:
        rows = sh.batch if head.rows == "first" else T
        ops += _casts("head_in", rows, head.in_dim, 1, sh, "final")
        if head.pooler:
            ops.append(_gemm("pooler", rows, h, h, sh, "modeling_bert.py BertPooler dense", bias=True))
        ops.append(_gemm("classifier", rows, head.width, head.in_dim, sh, "heads.py classifier", bias=head.out_bias))
        return _weight_casts("head.weight_casts", ops, sh) + ops
    if spec.mlm_transform:
        ops += _casts("mlm_in", T, h, 1, sh, "final")
        ops.append(_gemm("mlm_dense", T, h, h, sh, "modeling_bert.py BertPredictionHeadTransform", bias=True))
        ops += _activation(spec, "mlm_act", T * h, sh, "mlm")
        ops += norm_ops(spec, "mlm_norm", T, sh, "mlm", a)
    he = spec.embed_proj_dim or h
    v = spec.vocab / t
    if logits_rows is not None:
        T = logits_rows
    ops += _casts("lm_head_in", T, he, 1, sh, "final")
    head_gemm = _gemm("lm_head", T, v, he, sh, "modeling_llama.py:468 lm_head", bias=spec.lm_head_bias)
    ops += _weight_casts("head.weight_casts", [o for o in ops if o.kind == "gemm"] + [head_gemm], sh) + [head_gemm]
    x = T * v
    if spec.final_softcap:
        ops += [_ew(f"logit_softcap{j}", x * a, x * a, "modeling_gemma2.py final_logit_softcapping", "loss", (0, 0))
                for j in range(3)]
    if logits_rows is not None:
        return ops
    lb = FP32 if (sh.loss_upcast or sh.autocast or a == FP32) else a
    src = "loss_utils.py:61 logits.float() + cross_entropy"
    if lb != a:
        ops.append(_ew("logits_fp32", x * a, x * lb, src, "loss", (0, 0), saves=False, **UPCAST))
    # fused, the loss kernel reads the logits and keeps two fp32 numbers per row (max, log-sum-exp); its backward
    # reads the logits again and writes their gradient (compile_effects.compiled_head)
    ops += [_ew("log_softmax", 2 * x * lb, x * lb, src, "loss", (x * a, 2 * FP32 * T), kernels=1, **REDUCE),
            _ew("nll_loss", T * (lb + INDEX), FP32, src, "loss", (0, 0), saves=False)]
    return _shifted_labels(sh) + ops + [_loss_scale()]


def _shifted_labels(sh: Shape) -> list[Op]:
    """ForCausalLMLoss pads the labels by one and copies the shifted view (loss_utils.py:65-66
    `nn.functional.pad(labels, (0, 1), value=ignore_index)`, `labels[..., 1:].contiguous()`): constant_pad_nd fills
    the padded tensor and copies the labels in (aten PadNd.cpp constant_pad_nd: `output.fill_(value)`,
    `c_output.copy_(self)`), then the contiguous copy: 3 small kernels, no backward."""
    if not sh.shifted_labels or sh.compile:  # (compiled, inside the model's graph)
        return []
    n = sh.tokens * INDEX
    return [_ew("labels_shift", 2 * n, 3 * n, "loss_utils.py:65-66 pad + shift", saves=False, kernels=3, grad=False)]


def _loss_scale() -> Op:
    """The step scales the loss by a divisor (trainfit's hf step `model(**b).loss / n`, step/standard.py:181, as the
    HF Trainer divides by the accumulation steps; torchtitan train.py:530-542 `/ global_valid_tokens`): one div of a
    scalar, and its backward one (grad / n)."""
    return _ew("loss_scale", FP32, FP32, "step loss / n", saves=False)


def head_backward_extra(spec: ModelSpec, sh: Shape) -> list[Op]:
    """loss.backward()'s seed, a ones_like of the scalar loss (torch/csrc/autograd/autograd.cpp _make_grads
    `at::ones_like(output)`); nll_loss's backward writes a zeroed T × V/t gradient before scattering -1 (aten
    nll_loss_backward)."""
    seed = _ew("loss.seed", 0, FP32, "autograd _make_grads ones_like", saves=False)
    if layout(spec).kind in CLASSIFIERS:
        return [seed]
    lb = FP32 if (sh.loss_upcast or sh.autocast or sh.act == FP32) else sh.act
    x = sh.tokens * spec.vocab / sh.tp
    return [seed, _ew("nll_loss.grad", 0, x * lb, "aten nll_loss_backward (zeros + scatter)", "loss", (0, 0),
                      saves=False)]


# --- derived lists ---------------------------------------------------------------------------------------------------

def backward(ops: list[Op]) -> list[Op]:
    """The backward kernels of a forward list, in reverse order: GEMM dgrad (m, k, n) and wgrad (k, n, m); attention's
    backward kernel; the elementwise rule of the module docstring."""
    out: list[Op] = []
    for op in reversed(ops):
        if op.kind == "gemm" and op.grad:  # (a GEMM run under no_grad has no backward: DoRA's weight norm)
            out.append(op._replace(name=op.name + ".dgrad", m=op.m, n=op.k, k=op.n))
            if op.wgrad:
                out.append(op._replace(name=op.name + ".wgrad", m=op.k, n=op.n, k=op.m))
            if op.bias:  # db = Σ_tokens dY: one read of dY, a column sum (its semaphores' memset: column_sum_launches)
                dy = op.m * op.n * op.batch * SIZE.get(op.dtype, 2)
                out.append(_ew(op.name + ".bias_grad", dy, op.n * FP32, "autograd bias gradient", saves=False,
                               kernels=column_sum_launches(op.m)))
        elif op.kind == "attention":
            k = op.bwd_kernels if op.bwd_kernels >= 0 else ATTENTION_BWD_KERNELS.get(op.kernel, 1)
            out.append(op._replace(name=op.name + ".backward", backward=True, kernels=k))
        elif op.kind != "gemm" and op.grad:
            reads = op.writes + (op.reads if op.saves_input else 0.0)
            fr = op.fused_writes + (op.fused_reads if op.saves_input else 0.0)
            if op.bwd_ops:  # its kernels as spelled out; compiled, they fuse to the generic rule's HBM bytes
                out += [b._replace(group=op.group, fused_reads=fr if j == 0 else 0.0,
                                   fused_writes=op.fused_reads if j == 0 else 0.0, source=op.source)
                        for j, b in enumerate(op.bwd_ops)]
                continue
            k = op.kernels if op.bwd_kernels < 0 else op.bwd_kernels
            out.append(op._replace(name=op.name + ".backward", reads=reads, writes=op.reads, fused_reads=fr,
                                   fused_writes=op.fused_reads, kernels=k, access=op.bwd_access or op.access,
                                   bwd_access=""))
    return out


# Kernels of one attention backward: the flash kernel's pre-pass (dot(dO, O)), its dq/dk/dv kernel and the dq
# conversion (flash-attention csrc flash_bwd_launch_template.h run_flash_bwd_seqk_parallel: compute_dot_do_o,
# flash_bwd_dq_dk_dv_loop_seqk_parallel, convert_dQ); the memory-efficient kernel's fp32 call five: delta = dO·O
# summed over the head width and made contiguous (mul, sum, copy), its workspace zeroed, the cutlass fmha backward
# (aten/src/ATen/native/transformers/cuda/attention_backward.cu _efficient_attention_backward: `(grad_out.to(
# at::kFloat) * out.to(at::kFloat)).sum(-1).transpose(-2, -1).contiguous()`, `workspace.zero_()`; the H200 gpt2
# fp32 profile: one each per layer). NB: on
# an H200 with torch 2.11 SDPA ran cuDNN's kernel, 5 per backward (bprop, dot_do_o, 2 reduce_head, convert_dq).
# Eager (SDPA's math path): p·v's two GEMMs, softmax's backward (two kernels: SOFTMAX_BWD_KERNELS), the mask's and
# the scaling's, q·kᵀ's two GEMMs (8); HF's eager_attention_forward: eager_kernels.
# CUDA's softmax backward first forms grad·output, then runs the softmax-backward kernel on it (aten/src/ATen/native/
# cuda/SoftMax.cu softmax_backward_cuda_out: `Tensor tmp = grad * output; host_softmax_backward<...>(tmp, ...)`):
# the H200 eager profiles' fp32 mul of [2, heads, 1024, 1024] beside each softmax_warp_backward
SOFTMAX_BWD_KERNELS = 2
ATTENTION_BWD_KERNELS = {"flash": 3, "sdpa": 3, "efficient": 5, "eager": 6 + SOFTMAX_BWD_KERNELS}


def math_kernels(causal: bool) -> tuple[int, int]:
    """(forward, backward) launches of SDPA's math path (aten/src/ATen/native/transformers/attention.cpp
    _scaled_dot_product_attention_math): q·√scale, kᵀ·√scale, q·kᵀ, [causal: the [L, S] mask made per call — ones,
    tril, convert_boolean_attn_mask's `at::where(mask, 0.0, at::scalar_tensor(-inf, cuda))` (a fill and the where)
    — and attn.add_(mask)], _safe_softmax (softmax, a -inf scalar tensor, the -inf test, all, a zero scalar tensor,
    where), p·v; backward: p·v's two GEMMs, softmax's (derivatives.yaml _safe_softmax: _softmax_backward_data; the
    add_ passes the gradient on), the two scalings', q·kᵀ's two GEMMs. The H200 llama-3.2-1b fp32 profile (GQA: the
    math path): per layer 2 mul·scalar, 1 ones + tril, 2 where, 3 scalar fills, add_, softmax, isneginf, all."""
    return 10 + (5 if causal else 0), ATTENTION_BWD_KERNELS["eager"]


def eager_kernels(scores: int, mask: int) -> tuple[int, int]:
    """(forward, backward) launches of HF's eager attention (modeling_llama.py:193-199; roofline.unfused_attention has
    their bytes): q·kᵀ, the scaling, the mask add, [an upcast to fp32 when the sum is 16-bit], softmax in fp32,
    [its cast to the query's dtype], p·v; backward: p·v's two GEMMs, [the cast's], softmax's (2), [the upcast's],
    [the add's cast back to the scores' dtype when the mask promoted them], the scaling's, q·kᵀ's two GEMMs."""
    if not mask:
        return 6, ATTENTION_BWD_KERNELS["eager"]
    summed = max(scores, mask)
    up, down, promoted = int(summed < 4), int(scores < 4), int(summed != scores)
    return 5 + up + down, 5 + SOFTMAX_BWD_KERNELS + up + down + promoted


def grad_accumulations(spec: ModelSpec, sh: Shape) -> list[Op]:
    """Backward-only kernels of one layer: autograd sums the gradients of a tensor used k times with k - 1 adds
    (torch/csrc/autograd/input_buffer.cpp InputBuffer::add): the residual stream read by each norm and its residual
    add (2), the attention input read by q, k and v (2; 0 when fused), the MLP input read by gate and up (1)."""
    traits = family_traits(spec)
    x = sh.norm_tokens * spec.hidden * sh.residual
    n = 2 + (0 if traits["fused_qkv"] or spec.mla is not None else 2)
    n += 1 if spec.gated_mlp and not traits["fused_gate_up"] and spec.moe is None else 0
    if sh.compile:
        return []  # the compiled backward sums inside its fused kernels
    return [_ew("grad_accumulate", 2 * x * n, x * n, "autograd InputBuffer::add", saves=False, kernels=n)]


def compiled(ops: list[Op]) -> list[Op]:
    """torch.compile's view of a list: each run of consecutive memory ops sharing a group becomes one kernel moving
    only the bytes that cross HBM (fused_reads + fused_writes); ungrouped memory ops keep their own bytes. A fused
    kernel is Inductor's generated Triton, with vector loads whatever the casts and broadcasts inside it (NB)."""
    out: list[Op] = []
    for op in ops:
        if op.kind != "memory":
            out.append(op)
            continue
        prev = out[-1] if out else None
        if op.group and prev is not None and prev.kind == "memory" and prev.group == op.group:
            out[-1] = prev._replace(reads=prev.reads + op.fused_reads, writes=prev.writes + op.fused_writes,
                                    kernels=1, access="vector")
        elif op.group:
            out.append(op._replace(name=op.group, reads=op.fused_reads, writes=op.fused_writes, kernels=1,
                                   access="vector"))
        else:
            out.append(op)
    return out


def recomputed(spec: ModelSpec, setup: Setup, forward: list[Op]) -> list[Op]:
    """What ONE checkpointed layer re-runs in its backward under the setup's per-layer policy (flops.py
    recompute_per_token, op by op): full / layer:N / uniform / block — the whole forward; selective — the attention
    core (Korthikanti et al. 2022 §4.2); op — everything but the matmuls and SDPA whose outputs torchtitan's per-op
    SAC stores (recompute.op_sac_saved_matmuls, op_sac_stores_sdpa)."""
    from .recompute import op_sac_saved_matmuls, op_sac_stores_sdpa

    pol = setup.recompute.split(":", 1)[0]
    if pol == "selective":
        return [o for o in forward
                if o.kind == "attention" or o.name.startswith(("softcap", "repeat_kv", "attn_probs"))]
    if pol == "op":
        saved = {name for name, *_ in op_sac_saved_matmuls(spec, setup)}
        sdpa = op_sac_stores_sdpa(spec, setup)
        keep = []
        for o in forward:
            base = o.name.split(".", 1)[0]
            if o.kind == "gemm" and o.name in saved:
                continue
            if o.kind == "memory" and base in saved and o.name.endswith((".amax_x", ".cast_x")):
                continue  # the saved matmul's own fp8 input casts are not re-run either (NB: the weight's are)
            if o.kind == "attention" and sdpa:
                continue
            keep.append(o)
        return keep
    if pol in ("full", "layer", "uniform", "block"):
        return list(forward)
    return []


def checkpointed_layers(setup: Setup, layers: int) -> int:
    """Of a stage's `layers`, how many re-run (part of) their forward (flops.recompute_per_token's counts)."""
    r = setup.recompute
    if r in ("full", "selective", "op") or r.startswith("uniform:"):
        return layers
    if r.startswith("layer:"):
        return layers // setup.layers_every
    if r.startswith("block:"):
        return min(setup.recompute_layers, layers // setup.vpp) * setup.vpp
    return 0


def fp8_backward_extra(ops: list[Op], sh: Shape) -> list[Op]:
    """Float8Linear's backward (float8_linear.py:113-195): dY's amax and fp8 cast, and the transposed fp8 copies the
    two backward GEMMs read (dYᵀ, xᵀ; the weight's cast re-used)."""
    out = []
    for op in ops:
        if op.kind == "gemm" and op.dtype == "fp8":
            dy, x = op.m * op.n * op.batch, op.m * op.k * op.batch
            src = "torchao float8_linear.py:113-195 backward casts"
            out += [_ew(f"{op.name}.amax_dy", dy * sh.act, FP32, src, saves=False),
                    _ew(f"{op.name}.cast_dy", dy * sh.act, 2 * dy, src, saves=False),
                    _ew(f"{op.name}.cast_xT", x * sh.act, x, src, saves=False)]
    return out
