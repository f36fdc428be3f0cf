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


def projection_params(spec: ModelSpec) -> int:
    """Weights of the matmuls before SDPA (linear_params but o_proj's): those whose autocast casts a re-run holds at
    its attention, and whose gradients the attention's backward makes last."""
    return linear_params(spec) - spec.heads * spec.mla.v_head_dim * spec.hidden


def input_calls(spec: ModelSpec) -> int:
    """Linears that read the attention's input (the norm output): q_a_proj (or q_proj) and kv_a_proj_with_mqa."""
    return 2


def projections_saved(spec: ModelSpec, a: int, composite_norm: bool = False) -> float:
    """Per token, the down/up-projection path (everything before SDPA but the input casts). `a`: the activation
    (projection output) dtype's bytes.
    HF's RMSNorm (DeepseekV3RMSNorm.forward, modeling_deepseek_v3.py:46-51) keeps an fp32 copy of its input (the input
    itself when fp32), rsqrt (one fp32 per row) and the normalised tensor cast back (a); the weight product it
    returns is what the up-projection saves (a).
      q_a_layernorm: FP32·q_lora + FP32 + a·q_lora, and q_b_proj's input a·q_lora;
      kv_a_layernorm: its input is a view of kv_a_proj_with_mqa's output (kv_lora + rope wide): in fp32 the
        `.to(float32)` is a no-op and the view keeps the whole (kv_lora + rope) storage alive; otherwise a
        contiguous fp32 copy of the kv_lora part; then FP32 (rsqrt) + a·kv_lora, and kv_b_proj's input a·kv_lora.
    `composite_norm`: the norms are nn.RMSNorm (torchtitan models/deepseek_v3/model/model.py:218, :225) on torch's
    composite rms_norm (CPU; CUDA where the weight's dtype is not the input's, activations._norm_saved): the fp32
    normalised tensor in place of its cast back (the weight product, cast to the input's dtype, is the
    up-projection's input as above)."""
    m = spec.mla
    normed = FP32 if composite_norm else a
    out = 0.0
    if m.q_lora_rank:
        out += FP32 * m.q_lora_rank + FP32 + (normed + a) * m.q_lora_rank
    latent_in = FP32 * (m.kv_lora_rank + (m.qk_rope_head_dim if a == FP32 else 0))
    out += latent_in + FP32 + (normed + a) * m.kv_lora_rank
    return out


def math_saved(spec: ModelSpec, a: int) -> tuple[float, float]:
    """(per token, per token per key) of SDPA's math path and o_proj's input. The CPU build runs SDPA's math path
    for MLA: its flash kernel wants one head width for q, k and v (aten sdp_utils_cpp.cpp check_head_dim_size_cpp),
    and qk_nope + qk_rope != v_head_dim. The math path (aten attention.cpp _scaled_dot_product_attention_math)
    upcasts to fp32 and saves the scaled q and k (heads·(nope+rope) each), v (heads·v) and the fp32 softmax output
    (heads per key); o_proj saves its input, heads·v in the activation dtype. Measured: fp32 and autocast alike."""
    m, n = spec.mla, spec.heads
    return FP32 * (2 * n * m.qk_head_dim + n * m.v_head_dim) + a * n * m.v_head_dim, FP32 * n


def math_rerun_live(spec: ModelSpec, *, a: int, tokens: int, seq: int, tp: int = 1, q_folded: bool) -> float:
    """Bytes SDPA's math path holds at its high point while autograd records (a checkpointed layer's re-run), one
    TP rank: aten _scaled_dot_product_attention_math (aten/src/ATen/native/transformers/attention.cpp, torch 2.13)
    keeps its locals until it returns — the fp32 upcasts of q, k and v (q, k and v themselves in fp32), the scaled
    q, the scaled transposed k (saved by the scores' matmul), the causal mask (FP32·s², once per call) — and matmul
    folds (b, n) of a q that is a transposed view of (b, s, n, d) into a contiguous copy it saves when b > 1
    (`q_folded`: torchtitan's q; transformers' query_states is a contiguous cat). Then the largest of:
      softmax  the scores and the softmax output (FP32·n·s each), and inside _safe_softmax the bool -inf test of the
               scores and its all() over each row (one byte per score, per row);
      output   `make_tuple(matmul(attn, value).to(origin), attn.to(origin))`: the softmax output, its cast (the
               arguments evaluated right to left), matmul's contiguous copy of v (a transposed view) when b > 1, the
               output in fp32 and its cast (the casts only where the inputs are not fp32);
      returned after it returns (F.scaled_dot_product_attention keeps the output alone: the probabilities' cast, the
               upcasts, the fp32 output beside its cast and the mask go), at the caller's contiguous copy of the
               output transposed back (transformers' sdpa_attention_forward, integrations/sdpa_attention.py:195;
               torchtitan's MLA forward, models/deepseek_v3/model/model.py:319-321): the saved scaled q and k, q's
               fold copy, the fp32 softmax output and v's copy (the output matmul's saved operands), the output and
               its copy (a·n·v each) — the high point in fp32, where nothing is upcast.
    Read off the traces of torchtitan's deepseek_v3 (softmax) and transformers' DeepSeek-V2 (output under 16 bits,
    returned in fp32) on CPU, the first exact against its real step (trace/kernel_scratch.py probes the kernel's own
    tensors)."""
    m, n = spec.mla, spec.heads / tp
    qk, v = m.qk_head_dim, m.v_head_dim
    low = a if a != FP32 else 0
    batched = tokens > seq
    saved = FP32 * n * qk * (2 + (q_folded and batched))
    upcast = FP32 * n * (2 * qk + v) if low else 0
    softmax = (2 * FP32 + 1) * n * seq + n
    output = (FP32 + low) * n * seq + FP32 * n * v * (1 + batched) + low * n * v
    inside = (upcast + saved + max(softmax, output)) * tokens + FP32 * seq * seq
    returned = (saved + FP32 * n * seq + FP32 * n * v * batched + 2 * a * n * v) * tokens
    return max(inside, returned)


def torchtitan_forward_held(spec: ModelSpec, *, a: int, stored: set[str], tp: int = 1) -> float:
    """Per token, one TP rank: what torchtitan's MLA forward holds as locals when it calls SDPA, beyond the tensors
    autograd saves (projections_saved, the input casts), in the projections' dtype `a` (torchtitan 0.2.2
    models/deepseek_v3/model/model.py:271-306): wq's (or wq_b's) output (q_nope a view of it) and wkv_b's (k_nope
    and v views of it) — where per-op SAC has not stored them (`stored`: op_sac_saved_matmuls' names) — the rotated
    q_pe and k_pe (apply_rotary_emb returns `type_as(x)`; its fp32 complex copies are not saved: the product saves
    only freqs_cis), and the concatenated q and k (heads·(nope+rope) each). wkv_a's output is gone: `kv` and
    `k_pe`, its only views, are rebound."""
    m, n = spec.mla, spec.heads / tp
    q_out = 0 if ({"q", "q_b"} & stored) else a * n * m.qk_head_dim
    kv_out = 0 if "kv_b" in stored else a * n * (m.qk_nope_head_dim + m.v_head_dim)
    return q_out + kv_out + a * (n + 1) * m.qk_rope_head_dim + 2 * a * n * m.qk_head_dim


def fused_saved(spec: ModelSpec, a: int) -> float:
    """Per token, SDPA's fused kernels on CUDA (as the trace runs them, trace/cuda_kernels.py): q and the new key
    tensor (heads·(nope+rope) each), v — a view of kv_b_proj's output, so its whole heads·(nope+v) storage — the
    output (heads·v, shared with o_proj's input) and an fp32 logsumexp per head. The memory-efficient kernel writes
    its output (b, s, heads, v) (torch/_meta_registrations.py:6855 `torch.empty(B, M, num_heads, Kv)`), so HF's
    `attn_output.transpose(1, 2).contiguous()` (integrations/sdpa_attention.py:195) and the reshape before o_proj
    copy nothing (read off the trace of small-deepseek_v2 on CUDA: no copy between SDPA and o_proj).
    NB: PyTorch's CUDA flash kernel also wants one head width (sdp_utils.cpp check_head_dim_size_flash), so a real
    bf16 step runs the memory-efficient kernel (as the trace does), which saves the same tensors with its logsumexp
    padded to a multiple of 32 rows: under-counted here by at most 31 fp32 per head per sequence."""
    m, n = spec.mla, spec.heads
    return a * (2 * n * m.qk_head_dim + n * (m.qk_nope_head_dim + m.v_head_dim) + n * m.v_head_dim) + FP32 * n


def complex_rope(spec: ModelSpec) -> bool:
    """DeepSeek-V2 rotates with complex numbers (modeling_deepseek_v2.py:259-272 apply_rotary_emb: the product of
    complex64 views, `.type_as(xq)` back); V3 with real cos/sin tables (modeling_deepseek_v3.py:285-307, 310-343)."""
    return spec.family == "deepseek_v2"


def rotated_bytes(spec: ModelSpec, a: int, r: int) -> int:
    """Bytes per element of transformers' rotated q_rot and k_rot: V2 keeps the projections' `a` (`.type_as(xq)`),
    V3's `q * cos` promotes to cos's dtype, the hidden states' `r` (fp32 under autocast) (complex_rope)."""
    return a if complex_rope(spec) else max(a, r)


def sdpa_query_copy(spec: ModelSpec, *, a: int, r: int, autocast: bool, tp: int = 1) -> float:
    """Per token, one TP rank: under autocast SDPA (on autocast's lower-precision list) casts a query that rotary
    promoted to fp32 (query_states = cat(q_pass, q_rot), V3) back to `a`; the copy lives until SDPA returns."""
    query = max(a, rotated_bytes(spec, a, r))
    return a * spec.heads / tp * spec.mla.qk_head_dim if autocast and query != a else 0.0


def transformers_forward_held(spec: ModelSpec, *, a: int, r: int, tp: int = 1) -> float:
    """Per token, one TP rank: what transformers' MLA forward holds when it calls SDPA (prefill_attention's list:
    q_states, compressed_kv, the rotated q_rot in its promoted dtype, query_states, kv_b_proj's output, the new
    key_states). `r`: the hidden states' (cos/sin's) dtype."""
    m, n = spec.mla, spec.heads / tp
    qk, rope = m.qk_head_dim, m.qk_rope_head_dim
    rot = rotated_bytes(spec, a, r)
    query = max(a, rot)
    return (a * n * qk + a * (m.kv_lora_rank + rope) + rot * n * rope + query * n * qk
            + a * n * (m.qk_nope_head_dim + m.v_head_dim) + a * n * qk)


def prefill_attention(spec: ModelSpec, *, a: int, r: int, kernel: str, seq: int, tokens: int, tp: int,
                      autocast: bool, o_cast: float) -> float:
    """Bytes live inside one MLA attention at its prefill high point (no grad), beside the layer's input and the
    caches; read off traced prefills of small-deepseek_v2/v3 (trace/ with the aten op of each allocation).
    `a`: the projections' output dtype, `r`: the hidden states' (cos/sin's) dtype, `o_cast`: the o_proj weight's
    autocast copy (made at its call).

    Held by DeepseekV3Attention.forward (modeling_deepseek_v3.py:427-476; V2 :368-418) through SDPA, per token:
      q_states (q_proj / q_b_proj's output, a·n·qk: q_pass is a view of it), compressed_kv (kv_a_proj_with_mqa's
      output, a·(kv_lora + rope): the latent is normalised into the cache, k_rot rotated into it), the rotated
      q_rot (n·rope: V2 `.type_as(xq)` keeps a; V3 `q * cos` promotes to cos's dtype, r: fp32 under autocast),
      query_states = torch.cat((q_pass, q_rot)) (n·qk in the promoted dtype), and expand_kv's kv_b_proj output
      (a·n·(nope + v), value_states a view of it) and the new key_states (a·n·qk, new_empty + two copy_, :407-424).
    SDPA (torch 2.13):
      'math' (CPU, q/k wider than v: activations.resolved_kernel): aten _scaled_dot_product_attention_math
        upcasts q, k, v to fp32 when they are not (FP32·n·(2qk + v)), scales q then k (n·qk each), builds the
        causal mask (FP32·s², once per call: ones/tril/where), then three moments: at the scores' bmm (scaled q, k,
        scores n·s), at the softmax (scaled q, the masked scores, softmax) and at the output bmm (scaled q,
        softmax and its cast back to a when a is not fp32, v's contiguous clone when batch and seq exceed 1,
        output n·v).
      'flash' (CUDA memory-efficient kernel): the output a·n·v with the fp32 logsumexp (n per token), then o_proj
        reads the output as is (sdpa_attention.py:195's contiguous() is a no-op on the kernel's (b, s, n, v)
        layout; NB: the logsumexp is padded to 32 rows, under-counted by at most 31·n fp32 per sequence, and the
        kernel's two int64 philox scalars are left out) and writes a·h, beside its autocast weight copy.
      'eager' (--attention eager): HF eager_attention_forward's q·kᵀ and scaled scores (a·n·s each), fp32 softmax
        and its cast back (NB: not traced; priced like the math path's softmax moment without the fp32 upcasts).
    Under autocast SDPA casts a query that rotary promoted to fp32 back to a (a·n·qk)."""
    m = spec.mla
    n = spec.heads / tp
    qk, v = m.qk_head_dim, m.v_head_dim
    query = max(a, rotated_bytes(spec, a, r))
    held = transformers_forward_held(spec, a=a, r=r, tp=tp) * tokens
    # SDPA's autocast copy of a query rotary promoted to fp32, freed when SDPA returns
    q_copy = sdpa_query_copy(spec, a=a, r=r, autocast=autocast, tp=tp) * tokens
    sdpa_in = a if autocast else query
    low = sdpa_in if sdpa_in != FP32 else 0  # the casts back to the inputs' dtype
    if kernel == "flash":
        return held + a * n * v * tokens + max(q_copy + FP32 * n * tokens, a * spec.hidden * tokens + o_cast)
    held += q_copy
    if kernel == "eager":
        return held + (2 * a * n * seq + (FP32 + low) * n * seq) * tokens + FP32 * seq * seq
    upcast = FP32 * n * (2 * qk + v) if sdpa_in != FP32 else 0
    # v (a view of kv_b_proj's output) enters the second bmm as a (b·n, s, v) view when b or s is 1, else as a
    # clone: (b, n) do not merge (stride s·n·(nope + v) vs n·(nope + v))
    v_clone = n * v if tokens > seq > 1 else 0
    scores = FP32 * (2 * n * qk + n * seq)
    softmax = FP32 * (n * qk + 2 * n * seq)  # the scores freed as the masked copy replaces them
    output = FP32 * (n * qk + n * seq + n * v + v_clone) + low * n * seq
    return held + (upcast + max(scores, softmax, output)) * tokens + FP32 * seq * seq


def q_norm_prefill(spec: ModelSpec, *, a: int, tokens: int) -> float:
    """Bytes live inside q_a_layernorm at its high point (no grad), beside the layer's input and the caches of the
    layers before it (this layer's is written later, at cache.update): 0 without a q LoRA (q_proj). The attention
    runs q_a_proj, then q_a_layernorm, before anything else (modeling_deepseek_v3.py:438-441; V2 the same), and
    DeepseekV3RMSNorm.forward (:47-52) upcasts its q_lora-wide input to fp32 (`.to(torch.float32)`, a copy unless
    the input is fp32), holds `variance` and its rsqrt (one fp32 each per token) and multiplies into a new fp32
    tensor before the old one is rebound: q_a_proj's output (a), the fp32 copy and the product (the fp32 input's
    pow(2) at the same size where there is no copy). Where q_lora_rank outweighs the heads' q and k (the shrunk
    configs: 1536 against 4·192) this tops the SDPA moment (traced small-deepseek_v3 bf16 prefill on CUDA
    semantics at 8 x 200: the peak at this mul). q_a_proj is not split across tensor-parallel ranks (vLLM's
    ReplicatedLinear for q_a_proj in vllm/model_executor/models/deepseek_v2.py)."""
    rank = spec.mla.q_lora_rank
    if not rank:
        return 0.0
    copy = FP32 if a != FP32 else 0
    return ((a + copy + FP32) * rank + 2 * FP32) * tokens


def decode_math_per_key(spec: ModelSpec, *, a: int, tp: int) -> float:
    """Bytes per cached token (one sequence, one TP rank) that SDPA's math path ('math': CPU, q/k wider than v) adds
    at a decode step's high point, beside expand_kv's k and v over the cache (inference.mla_decompressed): as in
    `prefill_attention`, aten _scaled_dot_product_attention_math upcasts k and v to fp32 when they are not
    (FP32·n·(qk + v); the one-token q's upcast is negligible), scales k (FP32·n·qk, transposed for the scores' bmm)
    and makes the one-row scores (FP32·n) — read off the traced decode of small-deepseek_v3 in bf16 on the CPU at
    8 x 200, at the scores' bmm. No causal mask at one query row."""
    m = spec.mla
    n = spec.heads / tp
    upcast = FP32 * n * (m.qk_head_dim + m.v_head_dim) if a != FP32 else 0
    return upcast + FP32 * n * m.qk_head_dim + FP32 * n
