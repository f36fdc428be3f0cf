"""Bytes saved for backward by one transformer layer, per token, as the HF PyTorch kernels save them.

Structure after Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models"),
eq. 1: per layer s·b·h·(34 + 5·a·s/h) bytes for GPT-3 in fp16 with dropout. We keep their tensor-by-tensor
accounting but generalise each term to the kernels PyTorch/HF actually run, read off the saved tensors of
real CPU steps (torch.autograd.graph.saved_tensors_hooks; see tests/analytic and BENCHMARKS.md):
  * autocast keeps a low-precision cast of each linear's input per call (q, k and v each cast the same input)
    and of each weight (cached once per forward, freed in that layer's backward);
  * the residual stream stays fp32 under autocast (embeddings are not autocast), so norms save fp32;
  * HF's RMSNorm upcasts to fp32 and saves that copy, its rsqrt and the normalised output;
  * SDPA flash kernels (CUDA flash, and CPU's flash kernel) save q, k, v, the output and an fp32 logsumexp —
    linear in sequence; eager attention saves the s×s probabilities (fp32 softmax output, and its cast);
    SDPA with dropout on CPU falls back to the math path, which saves like eager.
Sizes are per token, so multiply by micro-batch × sequence (and layers).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import SetupError
from ..setup import Setup
from ..spec import ModelSpec
from .families import family_traits
from .liger import liger_on
from .long_context import tiled_mlp_on, tiled_mlp_shards
from . import gated_deltanet, kbit_prep, liger, mla, siglip, torchtitan_moe
from . import sink_attention as sinks
from .moe import moe_block
from .precision import state_bytes

FP32 = 4
INDEX = 8  # int64 token ids / labels


@dataclass(frozen=True)
class LayerActivations:
    """Saved bytes of one layer: `per_token` scales with b·s, `per_token_key` with b·s·s_k (eager), `fixed`
    does not scale with the batch (autocast weight casts; and `uncached` of it: copies autocast's cache does not hold,
    freed with the saved tensors where the layer is recomputed)."""

    per_token: float
    per_token_key: float
    fixed: float
    terms: dict  # name -> bytes per token, for the breakdown
    mlp_share: dict  # name -> of that term, the bytes per token the MLP sub-block saves (its norm, inputs, dropout)
    uncached: float = 0.0

    @property
    def weight_casts(self) -> float:
        """Of `fixed`, autocast's cached weight casts (kept to the autocast region's end, recomputed or not)."""
        return self.fixed - self.uncached

    def bytes(self, tokens: int, keys: float) -> float:
        return self.per_token * tokens + self.per_token_key * tokens * keys + self.fixed


def norm_kernel(setup: Setup) -> str:
    """The RMSNorm implementation the stack runs (stacks/*.toml [norm]): hf-rmsnorm-fp32 (HF's LlamaRMSNorm and
    its copies) or torch-rms-norm (nn.RMSNorm -> torch.rms_norm, torchtitan); liger-rms-norm under --liger (Liger's
    LigerRMSNorm replaces the family's, liger.py). LayerNorm models are unaffected."""
    return "liger-rms-norm" if liger_on(setup) else setup.stack_facts.fact("norm")


def _norm_saved(spec: ModelSpec, in_bytes: int, kernel: str = "hf-rmsnorm-fp32", device: str = "cuda") -> float:
    """Per token. LayerNorm (aten.native_layer_norm) saves its input, mean and rstd; the CPU kernel keeps the
    statistics in the input's dtype when input and weight agree (aten/src/ATen/native/layer_norm.cpp,
    param_scalar_type). NB: CUDA's kernel keeps them in fp32 (layer_norm_kernel.cu, acc_type): 4 bytes per token
    more per bf16 LayerNorm there. HF RMSNorm computes in fp32: saves an fp32 copy of the input (the input itself
    when already fp32), rsqrt(variance) and the normalised tensor cast back to the input dtype.
    torch.rms_norm (kernel "torch-rms-norm"; aten/src/ATen/native/layer_norm.cpp rms_norm_symint) runs
    aten._fused_rms_norm on CUDA when the weight has the input's dtype, whose backward
    (tools/autograd/derivatives.yaml `_fused_rms_norm`) keeps the input and result1 = rstd, one fp32 per row
    (layer_norm_kernel.cu: acc_type); on CPU (no CPU kernel: the CompositeImplicitAutograd rms_norm_composite,
    torch/_decomp/decompositions.py:1947 is the same code) it upcasts to fp32, and rsqrt and the two multiplies keep
    the fp32 upcast (the input itself when fp32), rstd and the fp32 normalised tensor the weight multiplies.
    NB: a weight whose dtype differs from the input's takes the composite path on CUDA too (not modelled: no stack
    runs it — FSDP2 gathers both in param_dtype, autocast leaves both fp32)."""
    h = spec.hidden
    if spec.norm == "rmsnorm":
        if kernel == "liger-rms-norm":  # LigerRMSNormFunction: X and one fp32 rstd per row (liger.py)
            return liger.norm_saved(h, in_bytes)
        if kernel == "torch-rms-norm":
            return in_bytes * h + FP32 if device == "cuda" else FP32 * h + FP32 + FP32 * h
        # Gemma's RMSNorm multiplies in fp32 and keeps that normalised tensor (family fact `norm_fp32`)
        return FP32 * h + FP32 + (FP32 if family_traits(spec)["norm_fp32"] else in_bytes) * h
    return in_bytes * h + 2 * in_bytes


def _composite_inner_norm(setup: Setup, amp: bool, a: int) -> bool:
    """Whether the stack's nn.RMSNorm inside attention (torchtitan's qwen3 q/k norms, deepseek_v3's MLA norms) runs
    torch's composite rms_norm on 16-bit projection outputs: on a CPU always (_norm_saved), on CUDA where the fp32
    weight meets a 16-bit input under autocast (_norm_saved's NB: the fused kernel wants one dtype)."""
    return norm_kernel(setup) == "torch-rms-norm" and (setup.device != "cuda" or (amp and a != FP32))


def cos_sin_bytes(spec: ModelSpec, setup: Setup, a: int) -> float:
    """torchtitan's qwen3 at 16-bit compute: cos and sin sliced from its fp32 rope_cache and cast to q's dtype in
    every layer (models/qwen3/model/model.py:124-125), each saved by its multiply (:129-130); 0 elsewhere."""
    if a == FP32 or not torchtitan_moe.model_fact(spec, setup, "rotary_cos_sin"):
        return 0.0
    return 2 * setup.seq / setup.cp * spec.head_dim * a


def checkpointed_arg_casts(spec: ModelSpec, setup: Setup, a: int) -> float:
    """Per block, the copies of its forward arguments that full recomputation keeps as its inputs: torchtitan's
    FSDP2 casts a block's floating-point arguments to param_dtype (MixedPrecisionPolicy cast_forward_inputs, torch
    2.13 fsdp/_fully_shard/_fsdp_state.py _pre_forward), so qwen3's fp32 rope_cache becomes a 16-bit copy per block,
    whose slices are the layer's cos and sin (the `.to` a no-op): the re-run makes no copy of them again (seen in a
    real 2-rank step on CPU)."""
    from .parallel.fsdp2 import torchtitan_fsdp  # noqa: PLC0415 (parallel imports this module's peers)

    return cos_sin_bytes(spec, setup, a) if torchtitan_fsdp(setup) else 0.0


def one_plus_weight_bytes(spec: ModelSpec, st) -> int:
    """Per norm call, not batch-scaled: NemotronLayerNorm1P passes `self.weight + 1.0` to F.layer_norm
    (modeling_nemotron.py:74-80), a new (hidden,) tensor in the weights' dtype that layer_norm saves for backward;
    0 for other norms. Its autocast branch (`_cast_if_autocast_enabled`: the input, weight + 1 and bias cast to the
    autocast dtype) asks the no-argument torch.is_autocast_enabled(), which is CUDA's: CPU autocast, and the trace's
    CUDA semantics (CPU autocast with CUDA's op lists, trace/cuda_autocast.py), leave the norm in fp32 like HF's
    other norms. NB: on a real CUDA device the norm saves its 16-bit cast and returns a 16-bit output that q, k and v
    share: both engines over-count amp-bf16 there by (4 - 2)·hidden per token per norm and two 16-bit copies of the
    normalised input per layer."""
    return int(st.weight) * spec.hidden if family_traits(spec)["norm_one_plus"] else 0


def layer_activations(spec: ModelSpec, setup: Setup, moe: bool = False, linear: bool = False) -> LayerActivations:
    """Saved-for-backward bytes of one decoder/encoder layer under `setup` (no recompute, one TP rank); `moe`: a
    layer whose MLP is the sparse MoE block (moe.py); `linear`: a Gated DeltaNet layer in place of attention
    (gated_deltanet.py).

    Assumes the kernels of the resolved attention implementation (`setup.attention_kernel`):
    'flash'/'sdpa' = flash SDPA (no s×s tensor), 'eager' = matmul + softmax.
    """
    check_trainable(spec, setup)
    st = state_bytes(setup)
    a, r = st.act, st.residual
    amp = st.autocast  # torch.autocast's per-call casts and weight cache (not under FSDP2 mixed precision)
    h, q, kv, nh = spec.hidden, spec.q_dim, spec.kv_dim, spec.heads
    i = spec.intermediate
    traits = family_traits(spec)
    _, p_attn, p_resid = spec.dropouts
    kernel = resolved_kernel(spec, setup)
    aq = FP32 if kbit_prep.fp32_attention(setup, amp) else a  # the attention's inputs (analytic/kbit_prep.py)
    mask = dropout_mask_bytes(setup, a)
    t: dict[str, float] = {}
    per_key = 0.0

    # Two norms per layer (pre-norm: before attention and MLP; post-norm: after each residual add).
    # NB: Gemma-2's extra post-norms are counted as ordinary norms (4 per layer).
    t["norms"] = spec.norms_per_layer * _norm_saved(spec, r, norm_kernel(setup), setup.device)
    if spec.parallel_residual:
        # GPT-NeoX: both norms read the layer input (modeling_gpt_neox.py GPTNeoXLayer.forward), saved once
        t["norms"] -= r * h
    # Linear inputs: the norm output (dtype r) feeds q/k/v and the MLP input projections. Without autocast one
    # tensor is saved per input; with autocast each linear saves its own cast (the input is fp32).
    qkv_calls = 1 if traits["fused_qkv"] else 3
    up_calls = (1 if traits["fused_gate_up"] else 2) if spec.gated_mlp else 1
    if spec.mla is not None:
        qkv_calls = mla.input_calls(spec)
    if linear:
        qkv_calls = 2  # in_proj_qkvz and in_proj_ba (modeling_qwen3_next.py:687-688)
    t["linear_inputs"] = ((qkv_calls + up_calls) if amp else 2) * a * h
    # Attention core.
    if linear:
        t["attention"] = gated_deltanet.saved_per_token(spec, setup)
    elif spec.mla is not None:
        # MLA (mla.py): the q/kv down- and up-projections and their norms, then SDPA with q/k wider than v
        t["attention"] = mla.projections_saved(spec, a, _composite_inner_norm(setup, amp, a))
        if kernel == "flash":
            t["attention"] += mla.fused_saved(spec, a)
        else:
            core, per_key = mla.math_saved(spec, a)
            t["attention"] += core
    elif kernel == "flash":
        t["attention"] = _flash_saved(spec, setup, aq)
        if torchtitan_moe.model_fact(spec, setup, "flex_sinks"):
            t["attention"] += torchtitan_moe.flex_sinks_saved(spec, a)
        share = masked_window_share(spec, setup)
        if share:
            t["attention"] += share * _window_repeat_saved(spec, a)
            per_key += share * a  # the window's mask in the query's dtype, (b, 1, s, s): one per token and key
    else:
        # q·kᵀ saves q and k (k repeated to all heads), probs·v saves the probabilities and v (repeated), o_proj
        # saves a contiguous copy of the merged heads. The CPU math path upcasts bf16/fp16 inputs to fp32 for
        # accuracy (aten attention.cpp: query_acc = query.to(kFloat)), under autocast or pure bf16 alike; o_proj
        # then saves the output cast back to the compute dtype.
        if kernel == "math" and aq != FP32:
            a_attn = FP32
            t["attention"] = 3 * FP32 * q + a * q
        else:
            a_attn = aq
            t["attention"] = 4 * aq * q
        if kernel == "eager" and spec.attn_sinks:
            # gpt-oss's own eager attention: a sink column, max-subtracted, softmaxed in the logits' dtype
            probs = sinks.saved_per_key(spec, st) / nh
            t["attention"] += sinks.saved_per_token(spec, st)
        elif kernel == "eager":
            # HF eager softmaxes in fp32 and casts back; the fp32 output is what softmax's backward keeps
            probs = FP32 + (a if a != FP32 and p_attn == 0 else 0)
        else:  # SDPA math path: softmax in its compute dtype, its output saved
            probs = a_attn
        if spec.attn_softcap:
            probs += a_attn  # Gemma-2 caps the scores with tanh, whose output is saved
        if p_attn > 0:
            probs += dropout_mask_bytes(setup, a_attn) + a_attn  # dropout's mask; probs·v keeps the dropped probs
        per_key = probs * nh
        share = masked_efficient_share(spec, setup, kernel)
        if share:  # those layers save as the fused kernels do, with the repeated k, v and the mask
            t["attention"] = ((1 - share) * t["attention"]
                              + share * (_flash_saved(spec, setup, a) + _window_repeat_saved(spec, a)))
            per_key = (1 - share) * per_key + share * a
    if spec.qk_norm and not linear and norm_kernel(setup) == "torch-rms-norm":
        # the stack's nn.RMSNorm over head_dim on q and k (torchtitan models/qwen3/model/model.py:172-178, :245-248):
        # torch.rms_norm per head row as _norm_saved counts it, the fused kernel's input, or the composite's fp32
        # upcast and normalised tensor; an fp32 rstd per head
        per = 2 * FP32 if _composite_inner_norm(setup, amp, a) else a
        t["attention"] += per * (q + kv) + FP32 * (nh + spec.kv_heads)
    elif spec.qk_norm and not linear:
        # q_norm, k_norm (HF Qwen3RMSNorm over head_dim, modeling_qwen3.py): per element the fp32 input copy and the
        # normalised output, per head an fp32 rsqrt
        out = FP32 if traits["norm_fp32"] else a
        t["attention"] += (FP32 + out) * (q + kv) + FP32 * (nh + spec.kv_heads)
        if liger_on(setup):  # Liger patches q_norm and k_norm (monkey_patch.py:1817: Qwen3RMSNorm): X and rstd
            t["attention"] -= (FP32 + out) * (q + kv) - a * (q + kv)
    if spec.attn_output_gate and not linear:
        # Qwen3-Next's gated attention (modeling_qwen3_next.py:299-300): `attn_output * torch.sigmoid(gate)` keeps
        # sigmoid's output and the attention output; o_proj keeps the product
        t["attention"] += 2 * a * q
    if spec.qk_l2_norm_layers:
        # Llama4TextL2Norm on q and k after rotary (modeling_llama4.py:102-113, applied at :354-356): `x.float()`,
        # pow, mean, rsqrt, mul, cast back, no weight: per element the fp32 input copy (the input itself in fp32),
        # per head an fp32 rsqrt; its output is what SDPA saves. On the RoPE layers only (share of the layers).
        share = spec.qk_l2_norm_layers / spec.layers
        t["attention"] += share * (FP32 * (q + kv) + FP32 * (nh + spec.kv_heads))
    fixed = 0.0
    mlp_inputs = up_calls
    # MLP.
    if moe:
        block, fixed = moe_block(spec, setup)
        t["linear_inputs"] += block["linear_inputs"] - (up_calls if amp else 1) * a * h
        t["mlp"] = block["mlp"]
        mlp_inputs = block["linear_inputs"] / (a * h)
    elif spec.gated_mlp:
        # gate output (saved by the activation), act(gate) and up (saved by the product), product (down_proj input);
        # Liger's LigerSiLUMulFunction saves gate and up only, recomputing silu in backward (liger.py): 3
        t["mlp"] = (3 if liger.swiglu_on(setup) else 4) * a * i
        if tiled_mlp_on(setup):
            # DeepSpeed's TiledMLP (ulysses_sp.py:1001-1020): the forward runs each slice under no_grad and saves
            # only the MLP input x (held anyway); the backward re-runs one slice with grad at a time
            # (:1047-1071): one slice's intermediates live. NB: counted with every layer's saved set, so reads
            # high without recompute by (layers − 1) slices; exact at the recomputed layer under --recompute full
            t["mlp"] /= tiled_mlp_shards(spec, setup)
            if amp:  # no per-linear casts are saved (no_grad): x itself, in the residual dtype
                t["linear_inputs"] += r * h - up_calls * a * h
                mlp_inputs = r / a
    else:
        # fc1 output saved by the activation, activation output saved by fc2 — except ReLU, whose backward uses
        # its own output (one tensor), and HF's gelu_new, a composite of pow/tanh/mul that saves four tensors.
        t["mlp"] = {"relu": 1, "gelu_new": 5, "gelu_fast": 5}.get(spec.activation, 2) * a * i
        if amp and setup.device == "cuda" and spec.activation == "gelu_new":
            # CUDA autocast runs pow in fp32 (autocast_mode.h AT_FORALL_FP32; trace/cuda_autocast.py): pow keeps an
            # fp32 copy of its input, tanh's output and 1 + tanh are fp32; 0.5·x and fc2's cast input stay 16-bit
            t["mlp"] = (3 * FP32 + 2 * a) * i
    # Dropout on the attention output and on the MLP output (Korthikanti eq. 1 counts 1-byte masks).
    if p_resid > 0:
        t["dropout"] = 2 * h * mask
    # copies outside autocast's cache: torchtitan's MoE block's (torchtitan_moe.uncached_fixed) and qwen3's rotary
    uncached = torchtitan_moe.uncached_fixed(spec, setup) if moe and torchtitan_moe.block_on(setup) else 0.0
    cos_sin = cos_sin_bytes(spec, setup, a)
    fixed += cos_sin
    uncached += cos_sin
    fixed += spec.norms_per_layer * one_plus_weight_bytes(spec, st)
    if amp:
        # autocast's cached low-precision weight copies, saved for the input gradient (not batch-scaled); MoE
        # experts run grouped_mm outside autocast (moe.py), so only the attention's weights are cast there
        mixer = (gated_deltanet.linear_params(spec) + gated_deltanet.conv_params(spec) if linear
                 else attention_linear_params(spec))
        fixed += a * (mixer + (0 if moe else linear_params_per_layer(spec) - attention_linear_params(spec)))
        if not (moe or linear):  # torchao's Float8Linear makes none of them (float8.autocast_copies_skipped)
            from .float8 import autocast_copies_skipped  # (float8 imports this module)

            fixed -= a * autocast_copies_skipped(spec, setup)
    mlp_share = {"norms": t["norms"] / 2, "linear_inputs": (mlp_inputs if amp else 1) * a * h, "mlp": t["mlp"],
                 "dropout": t.get("dropout", 0) / 2}
    return LayerActivations(sum(t.values()), per_key, fixed, t, mlp_share, uncached)


def check_trainable(spec: ModelSpec, setup: Setup) -> None:
    """Refuse what the per-layer accounting below does not model, rather than price it as standard attention:
    MLA (DeepSeek) under eager attention (matmul + softmax on q/k wider than v; not measured)."""
    if spec.mla is not None and resolved_kernel(spec, setup) == "eager":
        raise SetupError(f"{spec.name}: the analytic engine does not model MLA attention (DeepSeek) under eager "
                         "attention; use --attention sdpa or --engine trace")


def _flash_saved(spec: ModelSpec, setup: Setup, a: int) -> float:
    """Per token, what SDPA's fused kernels save: q, k, v, the output (shared with o_proj's input) and an fp32
    logsumexp — k and v with kv heads only (transformers passes enable_gqa=True without a mask,
    integrations/sdpa_attention.py:131) — plus what HF's projections keep alive around them.
    NB: the kernels' 8-16 byte RNG seed/offset tensors (512 B each in the CUDA allocator) are not counted."""
    q, kv = spec.q_dim, spec.kv_dim
    saved = a * (2 * q + 2 * kv) + FP32 * spec.heads
    # fp32 on CUDA runs the memory-efficient kernel (without GQA: with it, resolved_kernel takes the math path)
    efficient = setup.device == "cuda" and a == FP32
    fused_rotary = family_traits(spec)["fused_qkv"] and spec.positions == "rotary"
    if fused_rotary:
        # Fused qkv with rotary (Phi-3, GPT-NeoX): v is a view of the fused projection's output, so SDPA keeping v
        # keeps all of it (its q and k parts too; rotary made new q and k). Rotary's output for such a strided slice
        # is contiguous in (b, h, s, d), and the flash kernels allocate their output like the query
        # (torch/_meta_registrations.py:6122 `torch.empty_like(query)`), so `transpose(1, 2).contiguous()` before
        # o_proj copies it; the memory-efficient kernel writes (b, s, h, d) and needs no copy.
        saved += a * (q + kv)
    if fused_rotary or partial_rotary_cat(spec):
        saved += 0 if efficient else a * q
    return saved


def partial_rotary_cat(spec: ModelSpec) -> bool:
    """Partial rotary (rotary_fraction < 1) joins the rotated and the passed-through channels with torch.cat
    (modeling_nemotron.py:162-169, modeling_gpt_neox.py:130-138), a new tensor contiguous in (b, h, s, d): the flash
    kernels' output follows the query's layout, so `transpose(1, 2).contiguous()` before o_proj copies it
    (_flash_saved)."""
    return spec.positions == "rotary" and spec.mla is None and spec.rotary_fraction < 1


def masked_window_share(spec: ModelSpec, setup: Setup) -> float:
    """The share of the layers that run SDPA with an explicit mask in training: the sliding-window layers once the
    sequence reaches the window. transformers skips the mask (SDPA's is_causal) only while kv_length <
    local_attention_size (masking_utils.py:286-287 _ignore_causal_mask_sdpa); the global layers keep is_causal.
    0 without a window or below it."""
    if siglip.image_block_masks(spec, setup):  # Gemma 3 with images: every layer's mask is materialised
        return 1.0
    if torchtitan_moe.model_fact(spec, setup, "flex_sinks"):
        return 0.0  # torchtitan's gpt_oss: flex attention takes the window as a block mask (stacks/torchtitan.toml)
    window = spec.sliding_window
    if not window or setup.seq < window:
        return masked_chunk_share(spec, setup)
    return spec.sliding_layers / spec.layers + masked_chunk_share(spec, setup)


def masked_chunk_share(spec: ModelSpec, setup: Setup) -> float:
    """The share of the layers that are Llama 4's chunked-attention layers with a sequence reaching the chunk:
    create_chunked_causal_mask passes local_attention_size=attention_chunk_size to _ignore_causal_mask_sdpa
    (masking_utils.py:1355, :286-287), so from there on they run SDPA with an explicit mask and k, v repeated, as a
    sliding window does (_window_repeat_saved; the chunked mask's pattern does not change what is saved)."""
    chunk = spec.attention_chunk
    if not chunk or setup.seq < chunk:
        return 0.0
    return spec.chunked_layers / spec.layers


def masked_efficient_share(spec: ModelSpec, setup: Setup, kernel: str) -> float:
    """The share of the layers that leave the math path for the memory-efficient kernel: fp32 with GQA on CUDA
    takes the math path because transformers passes enable_gqa (resolved_kernel), but a layer with an explicit mask
    gets k and v repeated instead (integrations/sdpa_attention.py:51 use_gqa_in_sdpa, :126-127 repeat_kv), which the
    memory-efficient kernel takes (read off a trace of Llama 4's chunked layer, fp32 on CUDA semantics: q, the
    repeated k and v, the output, the logsumexp and the fp32 mask). 0 where the stack's backends leave it out."""
    if kernel != "math" or setup.device != "cuda" or spec.kv_heads >= spec.heads or spec.mla is not None:
        return 0.0
    if "efficient" not in setup.stack_facts.facts.get("attention", {}).get("sdpa_backends", ("efficient",)):
        return 0.0
    return masked_window_share(spec, setup)


def _window_repeat_saved(spec: ModelSpec, a: int) -> float:
    """Per token, what a masked SDPA call keeps beyond _flash_saved: with a mask transformers does not pass
    enable_gqa (integrations/sdpa_attention.py:51 use_gqa_in_sdpa: CUDA needs no mask) and repeats k and v to every
    query head (:126-127 repeat_kv), so the kernel saves the q-wide copies in place of k and v. (Its boolean mask is
    converted to an additive one of the query's dtype and saved beside them: the per-key term.) Read off traces of
    gemma-3-4b-text at 1 x 4096 (window 1024): -1.5 % (CUDA, amp-bf16) and -2.2 % (CPU, bf16) without this term.
    NB: on a model whose layers differ (Gemma 3: 5 local per global) the term is spread evenly over the layers."""
    return 2 * a * (spec.q_dim - spec.kv_dim)


def resolved_kernel(spec: ModelSpec, setup: Setup) -> str:
    """'flash', 'math' or 'eager'. HF's sdpa runs the flash kernel on CUDA (with dropout too) and on CPU without
    dropout; CPU SDPA with dropout falls back to the math path (torch's sdp_utils_cpp.cpp). On CUDA, fp32 runs the
    memory-efficient kernel ('flash' here: the same saved set, _flash_saved) where the stack allows it and the
    model has no GQA; a stack whose SDPA backends leave it out (stacks/*.toml [attention]: torchtitan's cuDNN, flash,
    math) or a GQA model takes the math path for fp32, which the flash and cuDNN kernels do not run.
    A sliding-window or chunked layer at a sequence reaching its window runs SDPA with a mask and k, v repeated
    (masked_window_share), which the memory-efficient kernel takes in fp32: layer_activations prices that share of
    the layers as the fused kernels (masked_efficient_share; tiny-gemma3 at 2 x 200, fp32 on CUDA: +6.65 % as math,
    -0.12 % so)."""
    kernel = setup.attention_kernel
    if torchtitan_moe.model_fact(spec, setup, "flex_sinks"):
        return "flash"  # torchtitan's gpt_oss: flex attention, which saves as the fused kernels do (flex_sinks_saved)
    # a stack whose own fused attention takes the sinks (stacks/*.toml [attention] sinks: Megatron's TE softmax_type
    # 'learnable') does not fall back to the family's eager path for them
    sinks_fused = spec.attn_sinks and setup.stack_facts.facts.get("attention", {}).get("sinks") == "fused"
    if kernel == "eager" or not (family_traits(spec)["sdpa"] or sinks_fused):
        return "eager"
    if setup.device == "cpu" and spec.dropouts[1] > 0:
        return "math"
    if setup.device == "cpu" and spec.mla is not None and spec.mla.qk_head_dim != spec.mla.v_head_dim:
        return "math"  # the CPU flash kernel wants one head width for q, k and v (mla.math_saved)
    if setup.device == "cuda" and (state_bytes(setup).act == FP32 or kbit_prep.fp32_attention(setup, state_bytes(setup).autocast)) and (
            "efficient" not in setup.stack_facts.facts.get("attention", {}).get("sdpa_backends", ("efficient",))
            or (spec.kv_heads < spec.heads and spec.mla is None)):
        # the memory-efficient kernel does not take GQA (sdp_utils.cpp use_mem_efficient_attention:
        # check_batch_size_and_num_heads_dense<false>) and transformers passes enable_gqa=True: the math path
        # (measured on an H200, torch 2.11: llama-3.2-1b fp32 kept its s×s probabilities, 4.36 GB)
        return "math"
    return "flash"


def dropout_mask_bytes(setup: Setup, elem_bytes: int) -> int:
    """CUDA's fused native_dropout keeps a 1-byte mask; the CPU path multiplies by a noise tensor of the input's
    dtype and keeps that (aten/src/ATen/native/Dropout.cpp)."""
    return 1 if setup.device == "cuda" else elem_bytes


def attention_linear_params(spec: ModelSpec) -> int:
    """Weights of the attention's matmuls: q, k, v and o (MLA: its down/up projections, mla.py)."""
    if spec.mla is not None:
        return mla.linear_params(spec)
    # Qwen3-Next's q_proj emits q and the output gate (modeling_qwen3_next.py:241-243): q_dim columns more
    gate = spec.q_dim if spec.attn_output_gate else 0
    return spec.hidden * (2 * spec.q_dim + 2 * spec.kv_dim + gate)


def linear_params_per_layer(spec: ModelSpec) -> int:
    """Weights of a dense layer's matmuls (what autocast casts): q, k, v, o and the MLP matrices."""
    return attention_linear_params(spec) + (3 if spec.gated_mlp else 2) * spec.hidden * spec.intermediate


def keys_per_token(spec: ModelSpec, seq: int) -> float:
    """Average number of keys each query attends to in the s×s matrix: eager attention materialises all
    s keys (the causal mask is added, not skipped)."""
    return float(seq)
