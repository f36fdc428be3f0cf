"""`--stack torchtitan` MoE models (its qwen3 and deepseek_v3 Transformers, its own MoE module): the analytic engine
against torchtitan's real code on CPU tensors (trainfit/step/torchtitan_moe.py builds them):
  * what one MoE block saves for backward, against the storages autograd's saved-tensor hooks see in torchtitan's
    own MoE module (analytic/torchtitan_moe.py moe_block);
  * the step's peak, against the measure engine's real step (c10's allocation records), under each recompute
    policy and precision torchtitan runs.
"""
from __future__ import annotations

import importlib

import pytest
import torch

try:
    for _model in ("qwen3", "deepseek_v3"):
        importlib.import_module(f"torchtitan.models.{_model}")
except Exception as e:  # pragma: no cover - depends on the environment
    pytest.skip(f"torchtitan is not importable ({type(e).__name__}: {e}); pip install 'trainfit[torchtitan]'",
                allow_module_level=True)

from trainfit.analytic import torchtitan_moe
from trainfit.analytic.engine import estimate
from trainfit.errors import EngineUnavailableError
from trainfit.models.hf_config import spec_from_config
from trainfit.setup import Setup

# tiny configs of the two families torchtitan's MoE models build (stacks/torchtitan.toml [moe_models]); 8 experts,
# top-2, so that the routed copies and their padding outweigh the rest of a block
QWEN3_MOE = {"model_type": "qwen3_moe", "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32,
             "num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": True, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 512,
             "decoder_sparse_step": 1, "mlp_only_layers": [], "max_position_embeddings": 256, "rms_norm_eps": 1e-6,
             "rope_theta": 1e6, "tie_word_embeddings": False}
# DeepSeek-V2-Lite's shape (torchtitan's deepseek_v3 16B flavor: softmax routing, no top-k normalisation, two shared
# experts, MLA without a q down-projection), every layer MoE
DEEPSEEK = {"model_type": "deepseek_v2", "hidden_size": 64, "intermediate_size": 160, "moe_intermediate_size": 32,
            "n_routed_experts": 8, "n_shared_experts": 2, "num_experts_per_tok": 2, "norm_topk_prob": False,
            "first_k_dense_replace": 0, "moe_layer_freq": 1, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 4, "kv_lora_rank": 32, "q_lora_rank": None, "qk_nope_head_dim": 16,
            "qk_rope_head_dim": 8, "v_head_dim": 16, "vocab_size": 512, "max_position_embeddings": 512,
            "rms_norm_eps": 1e-6, "rope_theta": 10000, "scoring_func": "softmax", "topk_method": "greedy",
            "n_group": 1, "topk_group": 1, "routed_scaling_factor": 1.0, "tie_word_embeddings": False,
            "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707,
                             "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096, "type": "yarn"}}
CONFIGS = {"qwen3": QWEN3_MOE, "deepseek_v3": DEEPSEEK}
B, S = 2, 128


def spec(model: str, **changes):
    return spec_from_config({**CONFIGS[model], **changes}, f"tt-tiny-{model}")


def setup(**kw) -> Setup:
    return Setup(**{"stack": "torchtitan", "batch": B, "seq": S, "device": "cpu", **kw})


def _moe_saved_bytes(sp, s: Setup) -> int:
    """Bytes of the distinct storages autograd saves inside the last block's MoE module during torchtitan's real
    forward (parameters excluded: they are not activations)."""
    from trainfit.step import torchtitan as step

    model = step.build(sp, s)
    moe = model.layers[str(sp.layers - 1)].moe
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    inside, seen = [False], {}
    moe.register_forward_pre_hook(lambda m, a: inside.__setitem__(0, True))
    moe.register_forward_hook(lambda m, a, o: inside.__setitem__(0, False))

    def pack(t):
        key = t.untyped_storage().data_ptr()
        if inside[0] and key not in params:
            seen[key] = t.untyped_storage().nbytes()
        return t

    x = torch.randint(0, sp.vocab, (B, S))
    with step.torchtitan_moe.cpu_kernels(model), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
            step.amp_context(s, "cpu"):
        model(x)
    return sum(seen.values())


@pytest.mark.parametrize("model", ["qwen3", "deepseek_v3"])
@pytest.mark.parametrize("precision", ["fp32", "amp-bf16", "bf16"])
def test_moe_block_saves_what_torchtitans_module_saves(model, precision):
    """Byte-exact: the router's fp32 scores and indices, the reorder's int64 indices, the padded rows' bf16 copies and
    intermediates of the grouped GEMMs, the experts' bf16 weight copies over fp32 weights, the combine's bmm operands
    (autocast's casts where it runs: torchtitan's maybe_enable_amp on bf16 weights too), the shared experts."""
    sp, s = spec(model), setup(precision=precision)
    per_token, fixed = torchtitan_moe.moe_block(sp, s)
    assert (per_token["linear_inputs"] + per_token["mlp"]) * B * S + fixed == _moe_saved_bytes(sp, s)


# (model, precision, recompute, tolerance): exact where the block's moments are read off the real step; the CPU
# math-path MLA attention's re-run softmax (not modelled: backward.py's NB) sets deepseek's op-SAC bf16 peak
CASES = [("qwen3", "amp-bf16", "none", 0.001), ("qwen3", "fp32", "full", 0.001), ("qwen3", "bf16", "op", 0.001),
         ("qwen3", "amp-bf16", "op", 0.001), ("deepseek_v3", "fp32", "none", 0.001),
         ("deepseek_v3", "fp32", "full", 0.001), ("deepseek_v3", "amp-bf16", "full", 0.01),
         ("deepseek_v3", "bf16", "op", 0.025)]


@pytest.mark.slow
@pytest.mark.parametrize("model,precision,recompute,tol", CASES)
def test_analytic_peak_matches_torchtitans_real_moe_step(model, precision, recompute, tol):
    from trainfit.measure import measure

    sp, s = spec(model), setup(precision=precision, recompute=recompute)
    real = measure(sp, s, steps=0, warmup=1)
    est = estimate(sp, s)
    err = (est.memory.peak - real.peak) / real.peak
    assert abs(err) <= tol, f"analytic {est.memory.peak:.0f} vs real {real.peak} ({err:+.3%})"


def test_trace_refuses_moe_in_one_line():
    from trainfit.engines import trace

    with pytest.raises(EngineUnavailableError, match="router's token counts") as e:
        trace(spec("qwen3"), setup())
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("kw", [{"ep": 2, "dp": 2, "zero": 3}, {"dp": 2, "zero": 3}])
def test_measure_refuses_parallel_moe_in_one_line(kw):
    from trainfit.step.torchtitan_moe import check

    with pytest.raises(EngineUnavailableError, match="one process") as e:
        check(spec("qwen3"), setup(**kw))
    assert "\n" not in str(e.value)


def test_cpu_kernels_are_restored():
    """The CPU stand-ins for torchtitan's histc and Triton fill live only while the step runs."""
    from torchtitan.models.moe import kernels

    from trainfit.step import torchtitan as step

    model = step.build(spec("qwen3"), setup())
    histc, fill = torch.histc, kernels.fill_indices_wrapper
    with step.torchtitan_moe.cpu_kernels(model):
        counts = torch.histc(torch.tensor([0, 1, 1, 3]), bins=4, min=0, max=4)
        assert counts.dtype == torch.int64 and counts.tolist() == [1, 2, 0, 1]
        assert torch.histc is not histc and kernels.fill_indices_wrapper is not fill
    assert torch.histc is histc and kernels.fill_indices_wrapper is fill
