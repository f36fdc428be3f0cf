"""Cost functions of rotary position embeddings, one per stack's implementation (stacks/*.toml [rotary])."""
from __future__ import annotations

from ..activations import FP32
from .op import BROADCAST, DOWNCAST, UPCAST, Op, Shape, bwd_kernel, grad_cast, memory, no_kernel


def rotary(name: str, tokens: float, width: float, sh: Shape) -> list[Op]:
    """Rotary on q or k (`width` features): the cost function of the stack's implementation (ROTARY, keyed by
    stacks/*.toml [rotary])."""
    return (liger_rotary if sh.liger else ROTARY[sh.rope])(name, tokens * width, sh)


def fused_rotary(name: str, x: float, sh: Shape) -> list[Op]:
    """Megatron-core: one fused kernel (fused_apply_rotary_pos_emb)."""
    a = sh.act
    return [memory(f"{name}.rope", x * a, x * a, "megatron fused_apply_rotary_pos_emb", "rope", saves=False)]


def megatron_unfused_rotary(name: str, x: float, sh: Shape) -> list[Op]:
    """Megatron-core's unfused rotary (rope_utils.py:92-126 _apply_rotary_pos_emb_bshd, the fallback of a scaled
    YaRN: stacks/megatron.toml [rotary] scaled): cos and sin of the [s, d] angles, each times mscale and cast to q's
    dtype (6 small kernels, their bytes left out: NB under by 2·s·d·(8 + 2) bytes against the x-sized kernels);
    rotate_half's neg of one half and cat (:75-89); t·cos, rotate_half(t)·sin, their sum; the cat with the empty
    pass-through part (a copy). Backward (tools/autograd/derivatives.yaml): the cats' and the add's views and
    pass-throughs, each product's one multiply, neg's, the chunk's halves concatenated back (split_backward), t's two
    gradients summed, and the slice t[..., :rot_dim] scattered back into zeros (slice_backward: a fill and a copy)."""
    a = sh.act
    src = "megatron-core 0.16.1 models/common/embeddings/rope_utils.py:92-126"

    def k(n: str, r: float, w: float, kernels: int = 1) -> Op:
        return bwd_kernel(f"{name}.rope_{n}", r, w, kernels=kernels)
    return [memory(f"{name}.rope_tables", 0, 0, src + " (cos/sin · mscale, .to)", "rope", saves=False, grad=False,
                   kernels=6),
            memory(f"{name}.rope_neg", x * a / 2, x * a / 2, src, "rope", (x * a, 0), saves=False, **BROADCAST),
            memory(f"{name}.rope_cat", x * a, x * a, src, "rope", (0, 0), saves=False, bwd_ops=(
                k("chunk.backward", x * a, x * a),), **BROADCAST),
            memory(f"{name}.rope_cos", x * a, x * a, src, "rope", (0, 0), saves=False, **BROADCAST),
            memory(f"{name}.rope_sin", x * a, x * a, src, "rope", (0, 0), saves=False, **BROADCAST),
            memory(f"{name}.rope_add", 2 * x * a, x * a, src, "rope", (0, 0), saves=False, bwd_ops=(
                k("grad_sum", 2 * x * a, x * a), k("slice_backward", x * a, 2 * x * a, kernels=2))),
            memory(f"{name}.rope_out", x * a, x * a, src, "rope", (0, x * a), saves=False,
                   bwd_ops=(no_kernel(f"{name}.rope_out.backward"),))]


def complex_rotary(name: str, x: float, sh: Shape) -> list[Op]:
    """torchtitan (llama3 model.py:164-169): cast to fp32, complex mul, cast back."""
    a = sh.act
    src = "torchtitan llama3 model.py:164-169"
    # the complex product's backward is grad·conj(freqs) (FunctionsManual.cpp mul_tensor_backward `grad *
    # other.conj()`), the conjugate materialised first (conj_kernel_cuda: 2 per layer in the H200 torchtitan
    # profile, beside the 4 complex muls; NB its bytes, the [s, d/2] table's, left out)
    cmul_bwd = (bwd_kernel(f"{name}.rope_conj", 0, 0),
                bwd_kernel(f"{name}.rope_cmul.backward", x * FP32, x * FP32, "strided"))
    return [memory(f"{name}.rope_fp32", x * a, x * FP32, src, "rope", (x * a, 0), saves=False, **UPCAST),
            memory(f"{name}.rope_cmul", x * FP32, x * FP32, src, "rope", (0, 0), saves=False, bwd_ops=cmul_bwd,
                   **BROADCAST),
            memory(f"{name}.rope_cast", x * FP32, x * a, src, "rope", (0, x * a), saves=False, **DOWNCAST)]


def hf_rotary(name: str, x: float, sh: Shape) -> list[Op]:
    """HF (modeling_llama.py:119-148): neg + cat (rotate_half), two muls, one add."""
    a = sh.act
    src = "modeling_llama.py:119-148"
    # cos and sin come in the hidden states' dtype (LlamaRotaryEmbedding.forward :116 `cos.to(dtype=x.dtype)`, x the
    # embeddings' output: fp32 under autocast), so q·cos, rotate_half(q)·sin and their sum are in the wider of the two
    # by type promotion (fp32 under autocast: the attention casts them back, `rope_casts`)
    o = max(a, sh.residual)
    # backward: the add passes its gradient on (no kernel), the cos/sin products one each, each cast back to the
    # 16-bit q when promoted (grad_cast), cat's halves are views but rotate_half's two input slices each make zeros +
    # a copy (slice_backward), then x's three gradients are summed (2)
    # the halves are strided slices; cos and sin ([1, s, d]) broadcast over batch and heads
    return [memory(f"{name}.rope_neg", x * a / 2, x * a / 2, src, "rope", (x * a, 0), saves=False, **BROADCAST),
            memory(f"{name}.rope_cat", x * a, x * a, src, "rope", (0, 0), saves=False, bwd=6, **BROADCAST),
            memory(f"{name}.rope_cos", x * a, x * o, src, "rope", (0, 0), saves=False, bwd_ops=(
                bwd_kernel(f"{name}.rope_cos.backward", x * o, x * o, "strided"),
                *grad_cast(f"{name}.rope_cos.grad_cast", x, o, a)), **BROADCAST),
            memory(f"{name}.rope_sin", x * a, x * o, src, "rope", (0, 0), saves=False, bwd_ops=(
                bwd_kernel(f"{name}.rope_sin.backward", x * o, x * o, "strided"),
                *grad_cast(f"{name}.rope_sin.grad_cast", x, o, a)), **BROADCAST),
            memory(f"{name}.rope_add", 2 * x * o, x * o, src, "rope", (0, x * a), saves=False,
                bwd_ops=(no_kernel(f"{name}.rope_add.backward"),))]


def liger_rotary(name: str, x: float, sh: Shape) -> list[Op]:
    """Liger's LigerRopeFunction (ops/rope.py at liger-kernel 0.8.5; analytic/liger.py): one Triton kernel rotates q
    and k in place in their dtype (:97-111; one launch for both, :173: listed on q), its backward the same kernel on
    dq and dk. NB: cos and sin's reads (one [s, d] row per token) are left out: under by 2·head_dim/(q + k width)
    of its bytes."""
    a = sh.act
    n = 1 if name == "q" else 0
    return [memory(f"{name}.liger_rope", x * a, x * a, "liger ops/rope.py:279-289 LigerRopeFunction", "rope",
                   saves=False, kernels=n, bwd_ops=(bwd_kernel(f"{name}.liger_rope.backward", x * a, x * a, kernels=n),))]


def rope_casts(name: str, tokens: float, width: float, sh: Shape) -> list[Op]:
    """Under autocast the HF rotary output is fp32 (rotary), so the attention's autocast casts q and k back to the
    compute dtype (torch's autocast lower-precision list: scaled_dot_product_attention, matmul), and its backward
    the gradient up again. NB: eager attention with GQA casts k after repeat_kv (n_rep x the bytes); timed here
    on k itself."""
    o = max(sh.act, sh.residual)
    if sh.rope != "cos-sin" or o == sh.act or sh.liger:  # (Liger's kernel keeps q's dtype)
        return []
    x = tokens * width
    return [memory(f"{name}{ATTN_CAST}", x * o, x * sh.act, "torch.autocast (attention inputs)", "rope", (0, 0),
                saves=False, **DOWNCAST)]


ATTN_CAST = ".attn_cast"  # rope_casts' op names: "q.attn_cast", "k.attn_cast"


# rotary implementations by stacks/*.toml [rotary]
ROTARY = {"fused": fused_rotary, "complex-buffer": complex_rotary, "cos-sin": hf_rotary,
          "megatron-unfused": megatron_unfused_rotary}
