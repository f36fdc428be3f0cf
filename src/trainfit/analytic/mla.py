"""What MLA attention (DeepSeek-V2/V3) saves for backward, per token, as transformers 5 runs it (no torch).

DeepseekV3Attention.forward (transformers/models/deepseek_v3/modeling_deepseek_v3.py:426-482; DeepseekV2Attention
.forward, modeling_deepseek_v2.py:367-427, is the same but for a complex-number RoPE):
  q    q_a_proj -> q_a_layernorm -> q_b_proj (q_lora_rank set) or q_proj; split into nope and rope parts;
  kv   kv_a_proj_with_mqa -> split (latent, k_rot) -> kv_a_layernorm(latent) -> kv_b_proj (expand_kv, :407-424)
       -> split into k_nope and v (views of kv_b_proj's output); k_rot (one head) expanded over the heads and copied
       with k_nope into a new key tensor of head width qk_nope + qk_rope;
  rope multiplies by cos/sin (V3) or a complex freqs_cis (V2): the products keep only those position tables, shared
       by every layer (NB: not counted, s·d_h^R·8 bytes once per step);
  SDPA on q, k (head width qk_nope + qk_rope) and v (v_head_dim), then o_proj on the merged heads.
The per-token bytes below were read off a real CPU step with torch.autograd.graph.saved_tensors_hooks on
tiny-deepseek / tiny-deepseek-v2 (fp32 and CPU autocast bf16; see tests/analytic/test_mla_activations.py).
"""
from __future__ import annotations

from ..spec import ModelSpec

FP32 = 4


def linear_params(spec: ModelSpec) -> int:
    """Weights of MLA's matmuls (what autocast casts and caches): q_a + q_b (or q_proj), kv_a, kv_b and o
    (DeepseekV3Attention.__init__, modeling_deepseek_v3.py:371-402)."""
    m, h, n = spec.mla, spec.hidden, spec.heads
    q = h * m.q_lora_rank + m.q_lora_rank * n * m.qk_head_dim if m.q_lora_rank else h * n * m.qk_head_dim
    kv = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank * n * (m.qk_nope_head_dim + m.v_head_dim)
    return q + kv + n * m.v_head_dim * h


def input_calls(spec: ModelSpec) -> int:
    """Linears that read the attention's input (the norm output): q_a_proj (or q_proj) and kv_a_proj_with_mqa."""
    return 2


def projections_saved(spec: ModelSpec, a: int) -> float:
    """Per token, the down/up-projection path (everything before SDPA but the input casts). `a`: the activation
    (projection output) dtype's bytes.
    HF's RMSNorm (DeepseekV3RMSNorm.forward, modeling_deepseek_v3.py:46-51) keeps an fp32 copy of its input (the input
    itself when fp32), rsqrt (one fp32 per row) and the normalised tensor cast back (a); the weight product it
    returns is what the up-projection saves (a).
      q_a_layernorm: FP32·q_lora + FP32 + a·q_lora, and q_b_proj's input a·q_lora;
      kv_a_layernorm: its input is a view of kv_a_proj_with_mqa's output (kv_lora + rope wide): in fp32 the
        `.to(float32)` is a no-op and the view keeps the whole (kv_lora + rope) storage alive; otherwise a
        contiguous fp32 copy of the kv_lora part; then FP32 (rsqrt) + a·kv_lora, and kv_b_proj's input a·kv_lora."""
    m = spec.mla
    out = 0.0
    if m.q_lora_rank:
        out += FP32 * m.q_lora_rank + FP32 + 2 * a * m.q_lora_rank
    latent_in = FP32 * (m.kv_lora_rank + (m.qk_rope_head_dim if a == FP32 else 0))
    out += latent_in + FP32 + 2 * a * m.kv_lora_rank
    return out


def math_saved(spec: ModelSpec, a: int) -> tuple[float, float]:
    """(per token, per token per key) of SDPA's math path and o_proj's input. The CPU build runs SDPA's math path
    for MLA: its flash kernel wants one head width for q, k and v (aten sdp_utils_cpp.cpp check_head_dim_size_cpp),
    and qk_nope + qk_rope != v_head_dim. The math path (aten attention.cpp _scaled_dot_product_attention_math)
    upcasts to fp32 and saves the scaled q and k (heads·(nope+rope) each), v (heads·v) and the fp32 softmax output
    (heads per key); o_proj saves its input, heads·v in the activation dtype. Measured: fp32 and autocast alike."""
    m, n = spec.mla, spec.heads
    return FP32 * (2 * n * m.qk_head_dim + n * m.v_head_dim) + a * n * m.v_head_dim, FP32 * n


def fused_saved(spec: ModelSpec, a: int) -> float:
    """Per token, SDPA's fused kernels on CUDA (as the trace runs them, trace/cuda_kernels.py): q and the new key
    tensor (heads·(nope+rope) each), v — a view of kv_b_proj's output, so its whole heads·(nope+v) storage — the
    output (heads·v) and an fp32 logsumexp per head; o_proj's input is `attn_output.reshape(...).contiguous()`, a
    copy (heads·v): the kernel's output is laid out (b, heads, s, v) like its query.
    NB: PyTorch's CUDA flash kernel also wants one head width (sdp_utils.cpp check_head_dim_size_flash), so a real
    bf16 step runs the memory-efficient kernel (as the trace does), which saves the same tensors with its logsumexp
    padded to a multiple of 32 rows: under-counted here by at most 31 fp32 per head per sequence."""
    m, n = spec.mla, spec.heads
    return a * (2 * n * m.qk_head_dim + n * (m.qk_nope_head_dim + m.v_head_dim) + 2 * n * m.v_head_dim) + FP32 * n
