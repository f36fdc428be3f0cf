"""One transformer layer's forward kernels, composed from the per-kind cost functions. A family chooses its blocks
by data (LayerRecipe, from its families.json row and its ModelSpec): where the norm sits, how q/k/v are projected,
which MLP it runs; each kind's variant (norm, rotary, activation) is picked by its own registry from the spec and
the stack's facts (Shape)."""
from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Callable, NamedTuple

from ...spec import ModelSpec
from ..families import family_traits
from ..unmodelled import check_modelled
from .activation import activation, activation_out_bytes, liger_swiglu
from .attention import (attention_core, grad_layout, output_gate, output_gate_split, qkv_split,
                        ungrouped_kernel)
from .cast import WEIGHT_CASTS, autocast_inputs, weight_casts
from .gated_deltanet import RULE, linear_mixer
from .te_casts import te_casts
from .mamba2 import SCAN, block_norm, mamba_mixer
from .mla import mla_projections
from .megatron_moe import megatron_moe_block
from .moe import moe_block
from .torchtitan_moe import torchtitan_moe_block
from .norm import NORMS, norm_ops
from .op import DOWNCAST, Op, Shape, bwd_kernel, gemm, memory
from .residual import residual
from .rotary import rope_casts, rotary
from .torchao_casts import quantise


class LayerRecipe(NamedTuple):
    """The blocks a family's layer is made of (families.json: fused_qkv, fused_gate_up, post_norm; ModelSpec: mla,
    gated_mlp, linear_attn, whether this layer's MLP is the sparse block and whether it is a linear-attention one)."""

    norm: str  # "pre" (the block's input normalised) | "post" (BERT: LayerNorm after the residual add)
    qkv: str  # "separate" (q, k, v projections) | "fused" (one qkv projection) | "mla" (DeepSeek's latent paths)
    mlp: str  # "gated" | "gated-fused" (one gate_up projection) | "plain" (fc1, act, fc2) | "moe"
    mixer: str = "attention"  # "attention" | "gated-deltanet" (Qwen3-Next's linear layers, ops/gated_deltanet.py)


def recipe(spec: ModelSpec, moe: bool, linear: bool = False) -> LayerRecipe:
    """`linear`: the layer is one of the spec's Gated DeltaNet layers (spec.linear_attn)."""
    traits = family_traits(spec)
    qkv = "mla" if spec.mla is not None else "fused" if traits["fused_qkv"] else "separate"
    gated = "gated-fused" if traits["fused_gate_up"] else "gated"
    mlp = "moe" if moe else gated if spec.gated_mlp else "plain"
    mixer = "gated-deltanet" if linear and spec.linear_attn is not None else "attention"
    return LayerRecipe("post" if traits["post_norm"] else "pre", qkv, mlp, mixer)


Projection = Callable[..., Op]


def layer_forward(spec: ModelSpec, sh: Shape, moe: bool = False, linear: bool = False, block: str = "") -> list[Op]:
    """The forward kernels of one transformer layer on one rank, in order; `moe`: its MLP is the sparse block;
    `linear`: a Gated DeltaNet layer in place of attention (Qwen3-Next's linear layers); `block`: of a hybrid stack
    (spec.hybrid), the kind of its one-mixer block (HYBRID_BLOCKS)."""
    check_modelled(spec)
    rc = recipe(spec, moe, linear)
    ops: list[Op] = []

    def proj(name: str, n_full: int, k_full: int, n: float, k: float, bias: bool, src: str) -> Op:
        """A projection of the rank's T tokens (n of n_full output columns, k of k_full inputs), appended to the
        layer with its fp8 casts where torchao converts it (torchtitan module_filter_fn: both dims multiples of 16)."""
        fp8 = (sh.float8 or bool(sh.te)) and n_full % 16 == 0 and k_full % 16 == 0
        g = gemm(name, sh.tokens, n, k, sh, src, bias=bias, fp8=fp8)
        if sh.tp > 1:
            g = g._replace(tp_split="col" if n < n_full else "row" if k < k_full else "")
        shared = bool(ops) and ops[-1].kind == "gemm" and (ops[-1].m, ops[-1].k) == (g.m, g.k)
        if fp8 and sh.te:  # Megatron's fused linear_qkv / linear_fc1 quantise their shared input once (te_casts)
            ops.extend(te_casts(g, sh, shared_input=shared))
        elif fp8:  # torchao's recipe: its casts and GEMM dtype (torchao_recipes.py; tensorwise: gemm.fp8_casts)
            casts, g = quantise(g, sh, shared)
            ops.extend(casts)
        ops.append(g)
        return g

    if spec.hybrid is not None:
        return _hybrid_block(spec, sh, rc, block, ops, proj)
    # attention sub-block
    if rc.norm == "pre":
        ops += norm_ops(spec, "attn_norm", sh.norm_tokens, sh, "attn_in")
    MIXERS[rc.mixer](spec, sh, rc, ops, proj)
    ops += _sandwich_norm(spec, "attn_post_norm", sh, "attn_out")
    ops += residual("attn", sh.norm_tokens * spec.hidden, spec.dropouts[2], sh, "attn_out",
                    "modeling_llama.py:306 residual add")
    if rc.norm == "post":
        ops += norm_ops(spec, "attn_norm", sh.norm_tokens, sh, "attn_out")
    # MLP sub-block
    if rc.norm == "pre":
        ops += norm_ops(spec, "mlp_norm", sh.norm_tokens, sh, "attn_out")
    MLPS[rc.mlp](spec, sh, ops, proj)
    ops += _sandwich_norm(spec, "mlp_post_norm", sh, "mlp_out")
    ops += residual("mlp", sh.norm_tokens * spec.hidden, spec.dropouts[2], sh, "mlp_out",
                    "modeling_llama.py:312 residual add")
    if rc.norm == "post":
        ops += norm_ops(spec, "mlp_norm", sh.norm_tokens, sh, "mlp_out")
    # (the experts' grouped GEMMs run outside autocast, moe.py; the delta rule's matmuls multiply activations)
    return weight_casts(WEIGHT_CASTS, [o for o in ops if not o.name.startswith(("experts", RULE))], sh) + ops


def _hybrid_block(spec: ModelSpec, sh: Shape, rc: LayerRecipe, block: str, ops: list[Op],
                  proj: Projection) -> list[Op]:
    """One block of a hybrid stack (Nemotron-H, modeling_nemotron_h.py:960-994 NemotronHBlock.forward): its RMSNorm
    (ops/mamba2.block_norm), one mixer (a Mamba-2 mixer, attention without positions, or the plain MLP) and the
    residual add; the weights' autocast casts, the scan's matmuls aside (they multiply activations)."""
    if block not in HYBRID_BLOCKS:
        raise ValueError(f"{spec.name}: a hybrid stack's layer is one block: block= one of {sorted(HYBRID_BLOCKS)}")
    ops += block_norm(spec, "block_norm", sh, "attn_in")
    HYBRID_BLOCKS[block](spec, sh, rc, ops, proj)
    ops += residual("block", sh.norm_tokens * spec.hidden, 0.0, sh, "attn_out",
                    "modeling_nemotron_h.py:991 residual add")
    return weight_casts(WEIGHT_CASTS, [o for o in ops if not o.name.startswith(SCAN)], sh) + ops


def _sandwich_norm(spec: ModelSpec, name: str, sh: Shape, group: str) -> list[Op]:
    """Gemma-2/3's norms of the attention's and the MLP's outputs before their residual adds (norms_per_layer 4:
    post_attention_layernorm, post_feedforward_layernorm, modeling_gemma2.py:317-326, modeling_gemma3.py:393-401):
    they read the projections' outputs, in the activation dtype; none for other families."""
    if spec.norms_per_layer != 4:
        return []
    return norm_ops(spec, name, sh.norm_tokens, sh, group, sh.act, in_bytes=sh.act)


def _attention(spec: ModelSpec, sh: Shape, rc: LayerRecipe, ops: list[Op], proj: Projection) -> None:
    """Appends to `ops` the q/k/v projections (by rc.qkv), q/k norms, rotary, the attention core and o_proj. The
    blocks append to the layer's one list, as `proj` does, because the order is what torch.compile's fusion groups
    see (`derived.compiled`)."""
    h, t, T = spec.hidden, sh.tp, sh.tokens
    q, kv = spec.q_dim / t, spec.kv_dim / t
    calls = {"separate": 3, "fused": 1, "mla": 2}[rc.qkv]  # (MLA: q_a_proj or q_proj, and kv_a_proj_with_mqa)
    if rc.qkv != "mla" and masked_sdpa(spec, sh):  # k, v repeated for the mask: no grouped heads (chunk_mask_ops)
        sh = replace(sh, attention=ungrouped_kernel(sh))
    ops += autocast_inputs("attn_in", T, h, calls, sh, "attn_in")
    head_k: float = spec.head_dim
    if rc.qkv == "mla":
        ops += mla_projections(spec, sh, proj)
        # q·kᵀ contracts the qk head width, p·v the v head width: Op.flops' 4·k is 2·(qk + v) with k their mean
        head_k = (spec.mla.qk_head_dim + spec.mla.v_head_dim) / 2
    elif rc.qkv == "fused":
        proj("qkv", spec.q_dim + 2 * spec.kv_dim, h, q + 2 * kv, h, spec.qkv_bias,
             "fused qkv (gpt2 c_attn, neox, phi3)")
        ops += qkv_split(T, q, kv, sh)
    else:
        gate = 2 if spec.attn_output_gate else 1  # q_proj also writes the output gate (modeling_qwen3_next.py:241)
        for name, full, n in (("q", gate * spec.q_dim, gate * q), ("k", spec.kv_dim, kv), ("v", spec.kv_dim, kv)):
            proj(name, full, h, n, h, spec.qkv_bias, "modeling_llama.py:243 q/k/v_proj")
        ops += output_gate_split(T, q, sh) if spec.attn_output_gate else []
    if rc.qkv != "mla":
        sh = rope_shape(spec, sh)
        rotary_hf = spec.positions == "rotary" and sh.rope == "cos-sin"
        unfused = sh.attention == "eager" and sh.rope == "cos-sin"  # HF eager / SDPA math: torch.matmul's folds
        if rotary_hf or unfused:  # gradients that come back head-major (grad_layout)
            ops += grad_layout("q", T, q, sh) + (grad_layout("k", T, kv, sh) if rotary_hf else [])
            ops += grad_layout("v", T, kv, sh) if unfused else []
        if spec.qk_norm:  # q_norm / k_norm over head_dim of the projections' outputs (modeling_qwen3.py:236-237,
            # modeling_gemma3.py:331-332)
            ops += norm_ops(spec, "q_norm", T * q / spec.head_dim, sh, "qk_norm", sh.act, spec.head_dim, sh.act)
            ops += norm_ops(spec, "k_norm", T * kv / spec.head_dim, sh, "qk_norm", sh.act, spec.head_dim, sh.act)
        if spec.positions == "rotary":
            ops += rotary("q", T, q, sh) + rotary("k", T, kv, sh)
            ops += rope_casts("q", T, q, sh) + rope_casts("k", T, kv, sh)
        if spec.qk_l2_norm_layers:  # Llama4TextL2Norm on the rotated q and k (modeling_llama4.py:354-356)
            ops += NORMS["l2"](spec, "q_l2", T * q / spec.head_dim, spec.head_dim, sh, "qk_norm", sh.act, sh.act)
            ops += NORMS["l2"](spec, "k_l2", T * kv / spec.head_dim, spec.head_dim, sh, "qk_norm", sh.act, sh.act)
    ops += chunk_mask_ops(spec, sh, q, kv)
    ops += attention_core(spec, sh, q, kv, head_k, spec.dropouts[1])
    ops += output_gate(T, q, sh) if spec.attn_output_gate else []
    if rc.qkv == "mla":  # o_proj reads heads·v_head_dim (modeling_deepseek_v3.py:398-402)
        o_in = spec.heads * spec.mla.v_head_dim
        proj("o", h, o_in, h, o_in / t, spec.out_bias, "modeling_deepseek_v3.py:481 o_proj")
    else:
        proj("o", h, spec.q_dim, h, q, spec.out_bias, "modeling_llama.py:269 o_proj")


def rope_shape(spec: ModelSpec, sh: Shape) -> Shape:
    """The shape with the rotary kind the model runs: Llama 4's apply_rotary_emb is complex fp32 arithmetic
    (modeling_llama4.py:219-226: `xq.float()` viewed as complex, times freqs_cis, viewed as real, `type_as(xq)`),
    torchtitan's kernels (ROTARY "complex-buffer"), whatever the stack (families.json rotary_complex); others keep
    the stack's. NB: the op list's layer is a RoPE layer (3 of 4 in Scout and Maverick): its rotary and L2 norm are
    counted on the NoPE layers too, whose temperature scaling of q (a multiply and a cast) is not listed."""
    if family_traits(spec).get("rotary_complex") and sh.rope == "cos-sin":
        return replace(sh, rope="complex-buffer")
    return sh


def masked_sdpa(spec: ModelSpec, sh: Shape) -> bool:
    """Whether the layer's SDPA gets an explicit mask: Llama 4's chunked layer once the sequence reaches the chunk,
    or every layer of Gemma 3 with images over several tokens (Shape.masked)."""
    chunk = spec.attention_chunk
    return (bool(chunk) and sh.seq >= chunk and bool(spec.chunked_layers)) or (sh.masked and not sh.decode)


def chunk_mask_ops(spec: ModelSpec, sh: Shape, q: float, kv: float) -> list[Op]:
    """Llama 4's chunked layer once the sequence reaches the chunk (analytic/activations.masked_chunk_share): SDPA
    gets an explicit mask, so transformers repeats k and v to every query head (integrations/sdpa_attention.py:51,
    :126-127 repeat_kv: an expand and a reshape's copy each; their backward sums the heads back) and SDPA turns the
    boolean (b, 1, s, s) mask into an additive one of the query's dtype (one `where`). The op list's layer is a RoPE
    (chunked) layer (rope_shape's NB). None without a chunk or below it. Gemma 3 with images (Shape.masked) the same
    in every layer of a pass over several tokens (its image-block masks; k and v repeated where heads are grouped)."""
    if not masked_sdpa(spec, sh):
        return []
    T, a = sh.tokens, sh.act
    src = "integrations/sdpa_attention.py:126-127 repeat_kv"
    # k as HF's rotary leaves it: in the wider of the activations and the stream (ops/rotary.py rope_casts), so
    # under autocast the repeat copies fp32 and the attention's cast of k reads the repeated heads (n_rep x the bytes
    # rope_casts lists on k itself: the rest here, in the same kernel)
    o = max(a, sh.residual) if sh.rope == "cos-sin" and spec.positions == "rotary" and not sh.liger else a
    ops = [memory(f"{name}_repeat", T * kv * b, T * q * b, src, "attention", saves=False, bwd_ops=(
        bwd_kernel(f"{name}_repeat.backward", T * q * b, T * kv * b, "reduce"),))
        for name, b in (("k", o), ("v", a)) if kv < q]
    if kv < q and o != a:
        x = T * (q - kv)
        ops.append(memory("k_repeat.attn_cast", x * o, x * a, "torch.autocast (attention inputs, after repeat_kv)",
                          "attention", saves=False, kernels=0, **DOWNCAST))
    mask = sh.batch * sh.seq * sh.seq
    ops.append(memory("chunk_mask", mask, mask * a, "SDPA's boolean mask made additive (at::where)", "attention",
                      saves=False, grad=False))
    return ops


def _gated_mlp(spec: ModelSpec, sh: Shape, ops: list[Op], proj: Projection, fused: bool = False) -> None:
    """down(act(gate(x))·up(x)) (modeling_llama.py:164); `fused`: Phi-3's gate_up_proj, one projection."""
    h, T, i, a = spec.hidden, sh.tokens, spec.intermediate / sh.tp, sh.act
    ops += autocast_inputs("mlp_in", T, h, 1 if fused else 2, sh, "attn_out")
    if fused:
        proj("gate_up", 2 * spec.intermediate, h, 2 * i, h, spec.mlp_bias, "phi3 gate_up_proj")
    else:
        proj("gate", spec.intermediate, h, i, h, spec.mlp_bias, "modeling_llama.py:164 gate_proj")
        proj("up", spec.intermediate, h, i, h, spec.mlp_bias, "modeling_llama.py:164 up_proj")
    if sh.liger_swiglu:  # Liger's SwiGLU: one kernel each way (ops/activation.py liger_swiglu)
        ops += liger_swiglu("act", T * i, sh)
        proj("down", h, spec.intermediate, h, i, spec.mlp_bias, "modeling_llama.py:164 down_proj")
        return
    ops += activation(spec, "act", T * i, sh, "act")
    x = T * i * a
    ops.append(memory("act_mul", 2 * x, x, "modeling_llama.py:164 act(gate)·up", "act", (0, x), bwd_ops=(
        # mul's backward (derivatives.yaml): grad·up and grad·act(gate), each reading the gradient
        bwd_kernel("act_mul.backward", 2 * x, x), bwd_kernel("act_mul.backward_up", 2 * x, x))))
    proj("down", h, spec.intermediate, h, i, spec.mlp_bias, "modeling_llama.py:164 down_proj")


def _plain_mlp(spec: ModelSpec, sh: Shape, ops: list[Op], proj: Projection) -> None:
    """fc2(act(fc1(x))) (modeling_gpt2.py:239-241)."""
    h, T, i = spec.hidden, sh.tokens, spec.intermediate / sh.tp
    ops += autocast_inputs("mlp_in", T, h, 1, sh, "attn_out")
    proj("fc1", spec.intermediate, h, i, h, spec.mlp_bias, "modeling_gpt2.py:239 c_fc")
    ops += activation(spec, "act", T * i, sh, "act")
    if activation_out_bytes(spec, sh) != sh.act:  # gelu_new's fp32 output, cast back for c_proj
        ops += autocast_inputs("fc2_in", T, i, 1, sh, "act")
    proj("fc2", h, spec.intermediate, h, i, spec.mlp_bias, "modeling_gpt2.py:241 c_proj")


# the sparse MoE block by the stack's [moe] block fact (Shape.moe_block)
MOE_BLOCKS = {"transformers": moe_block, "megatron": megatron_moe_block, "torchtitan-moe": torchtitan_moe_block}


def _moe_mlp(spec: ModelSpec, sh: Shape, ops: list[Op], proj: Projection) -> None:
    ops += MOE_BLOCKS[sh.moe_block](spec, sh)


def _linear_mixer(spec: ModelSpec, sh: Shape, rc: LayerRecipe, ops: list[Op], proj: Projection) -> None:
    linear_mixer(spec, sh, ops, proj)


# the token mixers by LayerRecipe.mixer
MIXERS: dict[str, Callable[[ModelSpec, Shape, LayerRecipe, list[Op], Projection], None]] = {
    "attention": _attention, "gated-deltanet": _linear_mixer}

# a hybrid stack's blocks by kind (HybridSpec.pattern)
HYBRID_BLOCKS: dict[str, Callable[[ModelSpec, Shape, LayerRecipe, list[Op], Projection], None]] = {
    "mamba": lambda spec, sh, rc, ops, proj: mamba_mixer(spec, sh, ops, proj), "attention": _attention,
    "mlp": lambda spec, sh, rc, ops, proj: _plain_mlp(spec, sh, ops, proj)}

# the MLP blocks by LayerRecipe.mlp
MLPS: dict[str, Callable[[ModelSpec, Shape, list[Op], Projection], None]] = {
    "gated": _gated_mlp, "gated-fused": partial(_gated_mlp, fused=True), "plain": _plain_mlp, "moe": _moe_mlp}
