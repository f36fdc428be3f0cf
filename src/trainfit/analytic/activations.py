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

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from ..setup import Setup
from ..spec import ModelSpec
from .precision import state_bytes

FP32 = 4
INDEX = 8  # int64 token ids / labels


@lru_cache(maxsize=1)
def _families() -> dict:
    return json.loads(resources.files("trainfit.data").joinpath("families.json").read_text())


def family_traits(spec: ModelSpec) -> dict:
    fam = _families()
    out = dict(fam["default"])
    out.update(fam.get(spec.family, {}))
    return out


def dropouts(spec: ModelSpec) -> tuple[float, float, float]:
    """(embedding, attention-probabilities, residual) dropout probabilities from the config."""
    traits = family_traits(spec)
    out = []
    for key, default in zip(traits["dropout_keys"], traits["dropout_defaults"]):
        value = spec.config.get(key) if key else None
        out.append(float(default if value is None else value))
    return tuple(out)  # type: ignore[return-value]


@dataclass(frozen=True)
class LayerActivations:
    """Saved bytes of one layer: `per_token` scales with b·s, `per_token_key` with b·s·s_k (eager), `fixed`
    does not scale with the batch (autocast weight casts)."""

    per_token: float
    per_token_key: float
    fixed: float
    terms: dict  # name -> bytes per token, for the breakdown

    def bytes(self, tokens: int, keys: float) -> float:
        return self.per_token * tokens + self.per_token_key * tokens * keys + self.fixed


def _norm_saved(spec: ModelSpec, in_bytes: int) -> float:
    """Per token. LayerNorm (aten.native_layer_norm) saves its input, mean and rstd (fp32).
    HF RMSNorm computes in fp32: saves an fp32 copy of the input (the input itself when already fp32),
    rsqrt(variance) and the normalised tensor cast back to the input dtype."""
    h = spec.hidden
    if spec.norm == "rmsnorm":
        # Gemma's RMSNorm multiplies in fp32 and keeps that normalised tensor (family fact `norm_fp32`)
        return FP32 * h + FP32 + (FP32 if family_traits(spec)["norm_fp32"] else in_bytes) * h
    return in_bytes * h + 2 * FP32


def layer_activations(spec: ModelSpec, setup: Setup, mlp_width: int | None = None, experts_per_token: int = 1) -> LayerActivations:
    """Saved-for-backward bytes of one decoder/encoder layer under `setup` (no recompute, one TP rank).

    Assumes the kernels of the resolved attention implementation (`setup.attention_kernel`):
    'flash'/'sdpa' = flash SDPA (no s×s tensor), 'eager' = matmul + softmax.
    """
    st = state_bytes(setup)
    a, r = st.act, st.residual
    amp = setup.precision.startswith("amp")
    h, q, kv, nh = spec.hidden, spec.q_dim, spec.kv_dim, spec.heads
    i = mlp_width if mlp_width is not None else spec.intermediate
    traits = family_traits(spec)
    _, p_attn, p_resid = dropouts(spec)
    kernel = resolved_kernel(spec, setup)
    mask = dropout_mask_bytes(setup, a)
    t: dict[str, float] = {}
    per_key = 0.0

    # Two norms per layer (pre-norm: before attention and MLP; post-norm: after each residual add).
    # NB: Gemma-2's extra post-norms are counted as ordinary norms (4 per layer).
    t["norms"] = spec.norms_per_layer * _norm_saved(spec, r)
    # Linear inputs: the norm output (dtype r) feeds q/k/v and the MLP input projections. Without autocast one
    # tensor is saved per input; with autocast each linear saves its own cast (the input is fp32).
    qkv_calls = 1 if traits["fused_qkv"] else 3
    up_calls = (1 if traits["fused_gate_up"] else 2) if spec.gated_mlp else 1
    if amp:
        t["linear_inputs"] = (qkv_calls + up_calls * experts_per_token) * a * h
    else:
        t["linear_inputs"] = (1 + experts_per_token) * a * h
    # Attention core.
    if kernel == "flash":
        # q, k, v (kv heads only: SDPA's enable_gqa), output (shared with o_proj's input), logsumexp (fp32).
        t["attention"] = a * (2 * q + 2 * kv) + FP32 * nh
    else:
        # q·kᵀ saves q and k (k repeated to all heads), probs·v saves the probabilities and v (repeated), o_proj
        # saves a contiguous copy of the merged heads. The CPU math path upcasts bf16/fp16 inputs to fp32 for
        # accuracy (aten attention.cpp: query_acc = query.to(kFloat)), under autocast or pure bf16 alike; o_proj
        # then saves the output cast back to the compute dtype.
        if kernel == "math" and a != FP32:
            a_attn = FP32
            t["attention"] = 3 * FP32 * q + a * q
        else:
            a_attn = a
            t["attention"] = 4 * a * q
        if kernel == "eager":
            # HF eager softmaxes in fp32 and casts back; the fp32 output is what softmax's backward keeps
            probs = FP32 + (a if a != FP32 and p_attn == 0 else 0)
        else:  # SDPA math path: softmax in its compute dtype, its output saved
            probs = a_attn
        if spec.config.get("attn_logit_softcapping", traits.get("softcap_default")):
            probs += a_attn  # Gemma-2 caps the scores with tanh, whose output is saved
        if p_attn > 0:
            probs += dropout_mask_bytes(setup, a_attn) + a_attn  # dropout's mask; probs·v keeps the dropped probs
        per_key = probs * nh
    if spec.qk_norm:
        t["attention"] += _norm_saved(spec, a) * (q + kv) / h  # q_norm, k_norm over head_dim, on each head
    # MLP.
    if spec.gated_mlp:
        # gate output (saved by the activation), act(gate) and up (saved by the product), product (down_proj input)
        t["mlp"] = 4 * a * i * experts_per_token
    else:
        # fc1 output saved by the activation, activation output saved by fc2 — except ReLU, whose backward uses
        # its own output (one tensor), and HF's gelu_new, a composite of pow/tanh/mul that saves four tensors.
        t["mlp"] = {"relu": 1, "gelu_new": 5, "gelu_fast": 5}.get(spec.activation, 2) * a * i
    # Dropout on the attention output and on the MLP output (Korthikanti eq. 1 counts 1-byte masks).
    if p_resid > 0:
        t["dropout"] = 2 * h * mask
    fixed = 0.0
    if amp:
        # autocast's cached low-precision weight copies, saved for the input gradient (not batch-scaled).
        fixed = a * linear_params_per_layer(spec, mlp_width=i)
    return LayerActivations(sum(t.values()), per_key, fixed, t)


def resolved_kernel(spec: ModelSpec, setup: Setup) -> str:
    """'flash', 'math' or 'eager'. HF's sdpa runs the flash kernel on CUDA (with dropout too) and on CPU without
    dropout; CPU SDPA with dropout falls back to the math path (torch's sdp_utils_cpp.cpp)."""
    kernel = setup.attention_kernel
    if kernel == "eager" or not family_traits(spec)["sdpa"]:
        return "eager"
    if setup.device == "cpu" and dropouts(spec)[1] > 0:
        return "math"
    return "flash"


def dropout_mask_bytes(setup: Setup, elem_bytes: int) -> int:
    """CUDA's fused native_dropout keeps a 1-byte mask; the CPU path multiplies by a noise tensor of the input's
    dtype and keeps that (aten/src/ATen/native/Dropout.cpp)."""
    return 1 if setup.device == "cuda" else elem_bytes


def linear_params_per_layer(spec: ModelSpec, mlp_width: int | None = None) -> int:
    """Weights of the layer's matmuls (what autocast casts): q, k, v, o and the MLP matrices."""
    i = mlp_width if mlp_width is not None else spec.intermediate
    attn = spec.hidden * (2 * spec.q_dim + 2 * spec.kv_dim)
    mlp = (3 if spec.gated_mlp else 2) * spec.hidden * i
    return attn + mlp


def keys_per_token(spec: ModelSpec, seq: int) -> float:
    """Average number of keys each query attends to in the s×s matrix: eager attention materialises all
    s keys (the causal mask is added, not skipped)."""
    return float(seq)
