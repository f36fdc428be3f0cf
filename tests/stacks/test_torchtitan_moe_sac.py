"""torchtitan's MoE block under its per-op SAC, run on CPU: what it stores is what recompute.op_sac_saved_matmuls
says. The real torchtitan 0.2.2 MoE module (models/moe/moe.py) with the deepseek_v3 save list
(models/deepseek_v3/infra/parallelize.py:33-48) and the stack's own SAC wrapper and defaults
(distributed/activation_checkpoint.py _apply_op_sac; config/job_config.py:661-663 forces the router gate's mm to
recompute). Two CUDA-only pieces take their CPU equivalents: torch.histc over int64 (no CPU kernel; the counts are
the same through a float copy) and generate_permute_indices' Triton kernel (its reference path, use_cpu=True,
models/moe/kernels.py:197)."""
from __future__ import annotations

import functools

import pytest

from trainfit.analytic.recompute import op_sac_saved_matmuls
from trainfit.models.resolve import load_model
from trainfit.setup import Setup

B, S = 2, 256
MOE_MATMULS = ("router", "shared_gate", "shared_up", "shared_down")


def test_the_moe_module_stores_the_shared_experts_first_and_last_projections(monkeypatch):
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchtitan")
    from torchtitan.config import ActivationCheckpoint
    from torchtitan.distributed.activation_checkpoint import _apply_op_sac
    from torchtitan.models.deepseek_v3.infra.parallelize import _op_sac_save_list
    from torchtitan.models.moe import kernels, utils
    from torchtitan.models.moe.moe import MoE, MoEArgs

    from trainfit.measure.cpu_peak import cpu_peak

    histc = torch.histc
    monkeypatch.setattr(torch, "histc", lambda x, *a, **k: histc(x.float(), *a, **k).to(x.dtype))
    monkeypatch.setattr(utils, "generate_permute_indices",
                        functools.partial(kernels.generate_permute_indices, use_cpu=True))

    spec = load_model("tiny-deepseek-v2")  # softmax router, 2 shared experts: the 16B flavor's MoE, small
    m = spec.moe
    h = spec.hidden
    args = MoEArgs(num_experts=m.num_experts, num_shared_experts=m.shared_intermediate // m.expert_intermediate,
                   top_k=m.top_k, score_func="softmax", route_norm=False, score_before_experts=False)
    torch.manual_seed(0)
    moe = MoE(args, dim=h, hidden_dim=m.expert_intermediate).to(torch.bfloat16)
    with torch.no_grad():
        moe.init_weights(0.02, torch.device("cpu"))
    moe = moe.to(torch.bfloat16)
    moe.expert_bias = moe.expert_bias.float()  # the load-balancing bias buffer stays fp32 on the GPU too
    # base_fqn "moe": the default force-recompute fqn "moe.router.gate" matches as in a block (layers.N.moe)
    sac = _apply_op_sac(moe, ActivationCheckpoint(mode="selective", selective_ac_option="op"), base_fqn="moe",
                        op_sac_save_list=_op_sac_save_list)
    x = torch.randn(B, S, h, dtype=torch.bfloat16)
    for _ in range(2):
        sac(x.clone().requires_grad_(True)).float().sum().backward()

    def step(phase):
        phase("forward")
        inp = x.clone().requires_grad_(True)
        out = sac(inp)
        phase("forward_end")
        del inp  # the checkpoint holds it
        out.float().sum().backward()

    peak, _ = cpu_peak(step, 0)
    kept = peak.live_at("forward_end") - peak.live_at("forward")
    setup = Setup(stack="torchtitan", recompute="op", batch=B, seq=S, precision="bf16")
    stored = [(name, out) for name, out, _, _ in op_sac_saved_matmuls(spec, setup) if name in MOE_MATMULS]
    # the router is forced to recompute, so the shared experts' w1 (gate) and w2 (down) are the 1st and 3rd counted
    # (tiny-deepseek-v2's MLA has 4 matmuls before them: the block's count has the same parity)
    assert [n for n, _ in stored] == ["shared_gate", "shared_down"]
    # the held input, the module's output and the stored matmul outputs, bf16; beyond them only a few small
    # tensors (the per-expert counts, offsets: < 16 B per token here)
    expected = 2 * (h + h + sum(out for _, out in stored)) * B * S
    assert expected <= kept < expected + 16 * B * S


def test_mla_stores_its_first_and_third_matmuls(monkeypatch):
    """torchtitan 0.2.2's MLA (models/deepseek_v3/model/model.py Attention, q_lora_rank 0 as the 16B flavor) under
    the same SAC: wq (1st) and wkv_b (3rd) are stored, wkv_a and wo recomputed. On CPU the attention kernel
    (aten._scaled_dot_product_flash_attention_for_cpu) is not on the save list, so only the matmuls count."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchtitan")
    from torchtitan.config import ActivationCheckpoint
    from torchtitan.distributed.activation_checkpoint import _apply_op_sac
    from torchtitan.models.deepseek_v3.infra.parallelize import _op_sac_save_list
    from torchtitan.models.deepseek_v3.model.args import DeepSeekV3ModelArgs
    from torchtitan.models.deepseek_v3.model.model import Attention, precompute_freqs_cis

    from trainfit.measure.cpu_peak import cpu_peak

    spec = load_model("tiny-deepseek-v2")
    m = spec.mla
    h = spec.hidden
    args = DeepSeekV3ModelArgs(dim=h, n_heads=spec.heads, q_lora_rank=0, kv_lora_rank=m.kv_lora_rank,
                               qk_nope_head_dim=m.qk_nope_head_dim, qk_rope_head_dim=m.qk_rope_head_dim,
                               v_head_dim=m.v_head_dim, max_seq_len=S, attn_type="sdpa")
    torch.manual_seed(0)
    attn = Attention(args).to(torch.bfloat16)
    freqs = precompute_freqs_cis(args)
    sac = _apply_op_sac(attn, ActivationCheckpoint(mode="selective", selective_ac_option="op"),
                        base_fqn="attention", op_sac_save_list=_op_sac_save_list)
    x = torch.randn(B, S, h, dtype=torch.bfloat16)
    for _ in range(2):
        sac(x.clone().requires_grad_(True), freqs, None).float().sum().backward()

    def step(phase):
        phase("forward")
        inp = x.clone().requires_grad_(True)
        out = sac(inp, freqs, None)
        phase("forward_end")
        del inp
        out.float().sum().backward()

    peak, _ = cpu_peak(step, 0)
    kept = peak.live_at("forward_end") - peak.live_at("forward")
    setup = Setup(stack="torchtitan", recompute="op", batch=B, seq=S, precision="bf16")
    stored = [(name, out) for name, out, _, _ in op_sac_saved_matmuls(spec, setup) if name not in MOE_MATMULS]
    assert [n for n, _ in stored] == ["q", "kv_b"]
    expected = 2 * (h + h + sum(out for _, out in stored)) * B * S  # input, output, stored outputs (bf16)
    assert expected <= kept < expected + 16 * B * S
