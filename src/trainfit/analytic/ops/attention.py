"""Cost functions of the attention core and of the copies around it: the core op (SDPA's kernels, HF's eager
attention, SDPA's math path), the eager path's layout copies and repeat_kv, Gemma-2's soft-capping, and the
gradients that come back head-major."""
from __future__ import annotations

from ...spec import ModelSpec
from ..packing import attention_rows
from .op import BROADCAST, Op, Shape, attention_dtype, bwd_kernel, memory, no_kernel
from .residual import dropout
from .ring_merge import ring_merge_ops
from .sinks import sink_ops

def grad_layout(name: str, tokens: float, width: float, sh: Shape) -> list[Op]:
    """A projection viewed as heads (`q_proj(x).view(b, s, heads, d).transpose(1, 2)`) whose gradient comes back
    head-major ([b, heads, s, d] contiguous: rotate_half's slice_backward zeros, a bmm's output) cannot be viewed
    back as [b, s, heads·d]: view's backward reshapes it with one transpose copy (the H200 profiles' copy_ of
    [2, 1024, heads, 64], one per layer for q and for k under SDPA; for q and v in GPT-2's eager attention; q, k and
    v in llama's eager and math-path steps). No forward kernel. Compiled, inductor plans the layouts itself (left
    out)."""
    if sh.compile:
        return []
    x = tokens * width * sh.act
    return [memory(f"{name}.grad_layout", 0, 0, "autograd view backward (reshape copy)", saves=False, kernels=0,
                bwd_ops=(bwd_kernel(f"{name}.grad_layout", x, x, "transpose"),))]

def qkv_split(tokens: float, q: float, kv: float, sh: Shape) -> list[Op]:
    """A fused q/k/v projection split into three views (GPT-2's `c_attn(x).split(...)`, modeling_gpt2.py:187): no
    forward kernel; split's backward concatenates the three gradients (derivatives.yaml split_backward: cat), one
    kernel (the H200 gpt2 profiles: one CatArrayBatchedCopy per layer). NB: GPT-NeoX's chunk and Phi-3's slices are
    taken as the same one kernel. Compiled, left out (inductor writes the gradients into one buffer)."""
    if sh.compile:
        return []
    x = tokens * (q + 2 * kv) * sh.act
    return [memory("qkv_split", 0, 0, "modeling_gpt2.py:187 split", saves=False, kernels=0,
                bwd_ops=(bwd_kernel("qkv_split.backward", x, x),))]


def eager_operand_copies(tokens: float, q: float, kv: float, sh: Shape) -> list[Op]:
    """HF's eager_attention_forward (modeling_gpt2.py:55-73, modeling_llama.py:180-202), and SDPA's math path
    (attention.cpp _scaled_dot_product_attention_math), multiply heads-strided views with torch.matmul, which folds
    batch and heads into one bmm batch: a view of [b, s, heads, d] storage cannot fold, so matmul's reshape copies it
    (aten LinearAlgebra.cpp _matmul_impl: expand + reshape): q always (a projection view, or rotary's output in that
    layout), k and v unless repeat_kv already made them contiguous (GQA). Their backward is a view (none). The H200
    profiles: per layer 2 [2, 12, 1024, 64] and 1 [2, 12, 64, 1024] forward copies in gpt2 eager, 1 [2, 32, 1024,
    64] in llama eager and in llama fp32's math path (GQA). Compiled, left out (grad_layout)."""
    if sh.compile:
        return []
    n = (q + (0 if kv < q else 2 * kv)) * tokens * sh.act
    return [memory("attn_operand_copies", n, n, "torch.matmul reshape copies", saves=False, kernels=1 if kv < q else 3,
                bwd_ops=(no_kernel("attn_operand_copies.backward"),), access="transpose")]


def eager_output_copy(tokens: float, q: float, sh: Shape) -> list[Op]:
    """The eager attention's output, [b, heads, s, d] from the bmm, transposed back and made contiguous
    (`attn_output.transpose(1, 2).contiguous()`, modeling_llama.py:200; GPT-2 :224 `.reshape(...).contiguous()`):
    one copy; in backward the gradient, [b, s, heads, d] viewed head-major, is copied again by matmul's
    _unsafe_view backward (a reshape); HF's SDPA wrapper does the same to the math path's output
    (integrations/sdpa_attention.py `attn_output.transpose(1, 2).contiguous()`). The H200 profiles: one forward [2,
    1024, heads, 64] and one backward [2, heads, 1024, 64] copy per layer in both eager steps and the math path.
    Compiled, left out (grad_layout)."""
    if sh.compile:
        return []
    x = tokens * q * sh.act
    return [memory("attn_output_copy", x, x, "eager attention output transpose + contiguous", saves=False,
                access="transpose")]

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


def core_kernel(sh: Shape) -> str:
    """The attention kernel an SDPA call runs: a 16-bit flash call through torch's SDPA runs what torch picks on the
    GPU (roofline.runnable "sdpa"); else the Shape's resolved kernel."""
    return "sdpa" if sh.attention == "flash" and sh.sdpa else sh.attention


def ungrouped_kernel(sh: Shape) -> str:
    """The kernel of an SDPA call whose k and v are not grouped (repeated to every head for an explicit mask, or a
    vision tower's): where the language model takes SDPA's math path for grouped heads in fp32 (analytic/
    activations.py resolved_kernel: the memory-efficient kernel does not take GQA), the memory-efficient kernel
    (resolved_kernel's masked_window_share likewise); HF's eager attention stays eager; else the Shape's."""
    return "efficient" if sh.attention == "eager" and not sh.hf_eager else sh.attention


def attention_core(spec: ModelSpec, sh: Shape, q: float, kv: float, head_k: float, p_attn: float) -> list[Op]:
    """The attention core over the rank's q (`q` features) and k/v (`kv`) and what runs beside it: repeat_kv and the
    eager path's operand copies, Gemma-2's soft-capping, the core op (SDPA's kernel, HF's eager attention or SDPA's
    math path), dropout on the eager probabilities, the eager output copy."""
    T, a = sh.tokens, sh.act
    # HF's attention over torch.matmul: its own eager_attention_forward, or SDPA's math path (the same folds)
    unfused = sh.attention == "eager" and sh.rope == "cos-sin" and spec.mla is None
    bh = sh.batch * spec.heads / sh.tp
    ops: list[Op] = []
    if sh.attention == "eager" and kv < q:  # repeat_kv: expand + reshape copies k and v to every head (:168)
        # backward: expand's, a sum over the repeats, for each (the H200 llama eager profile: 2 copy_ and 2 sum of
        # [2, 8, 4, 1024, 64] per layer)
        ops.append(memory("repeat_kv", 2 * T * kv * a, 2 * T * q * a, "modeling_llama.py:168 repeat_kv", saves=False,
                          kernels=2, **BROADCAST))
    if unfused:
        ops += eager_operand_copies(T, q, kv, sh)
    if sh.attention == "eager" and spec.attn_softcap:  # Gemma-2: scores / cap, tanh, * cap (modeling_gemma2.py)
        s2 = bh * (sh.seq / sh.cp) * sh.seq * a
        ops += [memory(f"softcap{j}", s2, s2, "modeling_gemma2.py attn_logit_softcapping") for j in range(3)]
    kernel = core_kernel(sh)
    fwd_k, bwd_k = (1, -1) if sh.attention != "eager" else (
        eager_kernels(sh.act, sh.eager_mask) if sh.hf_eager else math_kernels(spec.causal))  # scores: q's dtype
    queries, keys, rows = attention_rows(sh)  # (the row, or its packed documents: analytic/packing.py)
    ops.append(Op("attention", "attention", attention_dtype(sh), queries, keys, head_k, bh * rows, causal=spec.causal,
                  kernel=kernel, kernels=fwd_k, bwd_kernels=bwd_k, mask=sh.eager_mask,
                  dropout=p_attn > 0 and sh.attention != "eager", gqa=kv < q and spec.mla is None,
                  window=sh.window if sh.attention != "eager" else 0,
                  source="SDPA / eager_attention_forward (flash: p_attn dropout in the kernel)"))
    ops += ring_merge_ops(sh, q, kv)  # --cp: torch's ring merges its steps in fp32 (ops/ring_merge.py)
    if sh.attention == "eager" and spec.attn_sinks:  # gpt-oss's sink column (sinks.py)
        ops += sink_ops(bh, sh.seq / sh.cp, sh.seq, sh)
    if sh.attention == "eager" and p_attn > 0:  # eager_attention_forward :67 dropout on the probabilities
        ops += dropout("attn_probs_dropout", bh * (sh.seq / sh.cp) * sh.seq, sh, "")
    if unfused:
        ops += eager_output_copy(T, q, sh)
    return ops


def output_gate_split(tokens: float, q: float, sh: Shape) -> list[Op]:
    """Qwen3-Next's gated attention (modeling_qwen3_next.py:274-277): q_proj writes q and the gate interleaved per
    head, torch.chunk splits them (views) and the gate's reshape copies its strided half; the chunk's backward
    concatenates the two halves' gradients (split_backward: cat)."""
    x = tokens * q * sh.act
    return [memory("output_gate.copy", x, x, "modeling_qwen3_next.py:277 gate.reshape", saves=False, bwd_ops=(
        bwd_kernel("output_gate.chunk_backward", 2 * x, 2 * x),))]


def output_gate(tokens: float, q: float, sh: Shape) -> list[Op]:
    """attn_output * sigmoid(gate) (modeling_qwen3_next.py:301): the sigmoid, then the product, in the activation
    dtype; the product's backward is two products (grad·sigmoid, grad·attn), the sigmoid's one kernel."""
    x = tokens * q * sh.act
    src = "modeling_qwen3_next.py:301 output gate"
    return [memory("output_gate.sigmoid", x, x, src),
            memory("output_gate.mul", 2 * x, x, src, bwd_ops=(
                bwd_kernel("output_gate.mul.backward", 2 * x, x), bwd_kernel("output_gate.mul.backward_gate", 2 * x, x)))]
