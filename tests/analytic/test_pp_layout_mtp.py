"""Megatron's pipeline layout strings (--pp-split "Et*4|(t*4|)*14,tmL", setup/pp_layout.py) and MTP layers
(--mtp-layers, analytic/mtp.py): the split against megatron-core's own PipelineParallelLayerLayout, the refusals, the
MTP stage's parameters and time."""
from __future__ import annotations

import pytest

from trainfit.analytic.mtp import mtp_layers, stage_mtp
from trainfit.analytic.parallel.pipeline import split, stages
from trainfit.errors import SetupError
from trainfit.models.resolve import load_model
from trainfit.setup import Setup
from trainfit.setup.pp_layout import parse

# Megatron-Bridge's DeepSeek-V3 layout for PP 16 (recipes/deepseek/h100/deepseek_v3.py:58 at 067f987d): the
# embedding and 4 layers, 14 stages of 4, then one layer with the MTP layer and the loss
DSV3_PP16 = "Et*4|(t*4|)*14,tmL"
MG = dict(stack="megatron", precision="bf16-master", seq=4096, batch=1, tp=2, ep=8, etp=1, dp=4, zero=1,
          sequence_parallel=True, grad_accum=64)


def test_layout_matches_megatron_core():
    """Per-rank decoder and MTP layers as megatron-core 0.16.1's PipelineParallelLayerLayout counts them."""
    mc = pytest.importorskip("megatron.core.transformer.pipeline_parallel_layer_layout")
    from megatron.core.transformer.enums import LayerType

    for text, pp in ((DSV3_PP16, 16), ("Et*4|(t*4|)*14,tmL", 8), ("Et*3|(tt|)*29,m|L", 8)):
        ref = mc.PipelineParallelLayerLayout(text, pp)
        ours = parse(text)
        assert ours.vpp(pp) == ref.virtual_pipeline_model_parallel_size
        for kind, mine in ((LayerType.decoder, ours.decoder_layers(pp)), (LayerType.mtp, ours.mtp_layers(pp))):
            assert mine == [sum(st.count(kind) for st in ref.layout[r]) for r in range(pp)], (text, kind)


def test_split_and_mtp_stage():
    spec = load_model("deepseek-v3")
    assert spec.mtp_layers == 1 and split(61, 16, DSV3_PP16) == (4, 4, 1)
    s = Setup(**MG, pp=16, pp_split=DSV3_PP16)
    assert mtp_layers(spec, s) == 1 and stage_mtp(spec, s) == (0, 0, 1)
    assert [(st.layers, st.mtp) for st in stages(spec, s)] == [(4, 0), (1, 1)]  # (the middle ranks as the first)
    # the default layout (no string): every MTP layer on the last stage (multi_token_prediction.py:480-487)
    assert stage_mtp(spec, Setup(**MG, pp=4, pp_split="first:16,last:13")) == (0, 0, 1)


def test_refusals():
    from trainfit.analytic.layout import validate_layout

    spec = load_model("deepseek-v3")
    with pytest.raises(SetupError, match="set --vpp 2"):
        validate_layout(spec, Setup(**MG, pp=8, pp_split=DSV3_PP16))
    with pytest.raises(SetupError, match="places 60 decoder layers"):
        validate_layout(spec, Setup(**MG, pp=16, pp_split="Et*4|(t*4|)*14,mL"))
    with pytest.raises(SetupError, match="the run has 0"):
        validate_layout(spec, Setup(**MG, pp=16, pp_split=DSV3_PP16, mtp_layers=0))
    with pytest.raises(SetupError, match="not a layout character"):
        Setup(**MG, pp=16, pp_split="Ex*4|L")
    with pytest.raises(SetupError, match="does not train multi-token-prediction"):
        Setup(stack="torchtitan", mtp_layers=1)
    assert mtp_layers(spec, Setup(stack="torchtitan")) == 0  # transformers' DeepSeek-V3 drops the MTP modules


def test_mtp_stage_params_and_time():
    """The last stage's MTP layer: eh_proj (2h x h over TP), three RMSNorms, one MoE layer (its experts over EP) and
    the word embedding that stage builds (gpt_model.py:149-150): the rank's dense parameters grow by exactly these,
    counted by hand from DeepSeek-V3's config."""
    from trainfit.analytic.memory import Stage
    from trainfit.analytic.params import count_params
    from trainfit.analytic.parallel.megatron import rank_params

    spec = load_model("deepseek-v3")
    pc = count_params(spec)
    s = Setup(**MG, pp=16, pp_split=DSV3_PP16)
    without = rank_params(spec, pc, s, Stage(15, 1, False, True, 1, 0))
    with_mtp = rank_params(spec, pc, s, Stage(15, 1, False, True, 1, 1))
    h, v, t = 7168, 129280, 2
    # one MoE layer's non-expert part per TP rank, hand-counted: MLA (q_a 7168x1536, q_b 1536x128·192, kv_a
    # 7168x(512+64), kv_b 512x128·256, o 128·128x7168) and the shared expert (3 x 7168 x 2048) over TP, the router
    # (256 x 7168, divided by TP as rank_params does: its NB), norms replicated (2 x 7168 + q_a 1536 + kv_a 512)
    mla = 7168 * 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 * 128 * 256 + 128 * 128 * 7168
    shared = 3 * 7168 * 2048
    layer = (mla + shared + 256 * 7168) / t + 2 * 7168 + 1536 + 512
    expected = 3 * h + 2 * h * h / t + layer + v * h / t
    assert with_mtp[0] - without[0] == pytest.approx(expected, rel=1e-3)
    # its routed experts: 256 x 3 x 7168 x 2048 over ep 8 x etp 1
    assert with_mtp[1] - without[1] == pytest.approx(256 * 3 * 7168 * 2048 / 8, rel=1e-6)


def test_mtp_layers_count_in_the_step_flops():
    """Each MTP layer adds, per token, its forward and backward (3x): eh_proj (2h x h), one MoE layer with its top-8
    routed experts, the shared expert and the router, the output layer once more and the attention core at the
    sequence's causal mean; Megatron's own count has the eh_proj and the logits' (mtp_num_layers + 1) terms
    (megatron/training/training.py num_floating_point_operations). Hand-counted from DeepSeek-V3's config."""
    from trainfit.api import estimate

    seq = 2048
    kw = dict(stack="megatron", precision="bf16-master", seq=seq, ep=8, dp=8, zero=1)
    per_token = [estimate("deepseek-v3", mtp_layers=n, **kw).flops.per_token for n in (0, 1, 2)]
    h, v, expert = 7168, 129280, 3 * 7168 * 2048
    mla = 7168 * 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 * 128 * 256 + 128 * 128 * 7168
    matmuls = 2 * h * h + mla + 8 * expert + 256 * h + expert + v * h
    core = 2 * (128 * 192 + 128 * 128) * (seq + 1) / 2  # q·kᵀ over the 192-wide heads, probs·v over the 128-wide
    layer = 3 * (2 * matmuls + core)
    # (rel 1e-5: the attention's q_a / kv_a RMSNorm weights, 2,048, ride with its matmuls as in the decoder layers)
    assert per_token[1] - per_token[0] == pytest.approx(layer, rel=1e-5)
    assert per_token[2] - per_token[0] == pytest.approx(2 * layer, rel=1e-5)
