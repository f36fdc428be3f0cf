"""Multi-head latent attention's projections (DeepSeek-V2/V3) before the attention core."""
from __future__ import annotations

from ...spec import ModelSpec
from .cast import autocast_inputs
from .norm import norm_ops
from .op import Op, Shape, memory
from .rotary import rotary

def mla_projections(spec: ModelSpec, sh: Shape, proj) -> list[Op]:
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
        ops += autocast_inputs("q_b_in", T, m.q_lora_rank, 1, sh, "q_a_norm")
        proj("q_b", qk, m.q_lora_rank, qk / t, m.q_lora_rank, False, src + " q_b_proj")
    else:
        proj("q", qk, h, qk / t, h, False, src + " q_proj")
    proj("kv_a", m.kv_lora_rank + m.qk_rope_head_dim, h, m.kv_lora_rank + m.qk_rope_head_dim, h, spec.qkv_bias,
         "modeling_deepseek_v3.py:444 kv_a_proj_with_mqa")
    ops += norm_ops(spec, "kv_a_norm", T, sh, "kv_a_norm", a, m.kv_lora_rank)
    ops += autocast_inputs("kv_b_in", T, m.kv_lora_rank, 1, sh, "kv_a_norm")
    proj("kv_b", kv_up, m.kv_lora_rank, kv_up / t, m.kv_lora_rank, False, "modeling_deepseek_v3.py:418 kv_b_proj")
    ops += rotary("q", T, n * m.qk_rope_head_dim / t, sh) + rotary("k", T, m.qk_rope_head_dim, sh)
    ops += [memory("q_cat", T * qk / t * a, T * qk / t * a, "modeling_deepseek_v3.py:466 torch.cat", saves=False),
            memory("k_build", T * (n * m.qk_nope_head_dim / t + m.qk_rope_head_dim) * a, T * qk / t * a,
                "modeling_deepseek_v3.py:421-423 expand_kv copy_", saves=False)]
    return ops
