"""`--stack megatron` in the analytic engine against independent sources:

* Megatron-Core's own docs table (docs.nvidia.com/megatron-core/developer-guide/latest/api-guide/dist_optimizer.html,
  "theoretical number of bytes per parameter"): fp16 params & fp16 grads 20 vs 4 + 16/d; bf16 params & fp32 grads
  18 vs 6 + 12/d; fp32 params & fp32 grads 16 vs 8 + 8/d;
* Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", Table 2 (activation
  memory per transformer layer), written out below as the paper prints it;
* megatron-core 0.16.1 itself where a piece runs on CPU (TransformerConfig's defaults).
"""
from __future__ import annotations

import pytest

from trainfit.analytic.megatron_activations import layer_terms
from trainfit.analytic.parallel.megatron import megatron_model_states
from trainfit.analytic.parallel.pipeline import Stage
from trainfit.analytic.params import count_params
from trainfit.models.hf_config import spec_from_config
from trainfit.setup import Setup

S, B, H, A, L = 2048, 4, 6144, 64, 48  # Korthikanti's 22B GPT (calibration.md C3)


def gpt(h=H, heads=A, layers=L, vocab=51200, dropout=0.1):
    return spec_from_config({
        "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": h, "n_head": heads, "n_layer": layers,
        "vocab_size": vocab, "n_positions": 2048, "n_inner": 4 * h, "activation_function": "gelu",
        "resid_pdrop": dropout, "attn_pdrop": dropout, "embd_pdrop": dropout, "tie_word_embeddings": True}, "gpt")


def mg(**kw) -> Setup:
    kw.setdefault("precision", "bf16-master")
    return Setup(stack="megatron", batch=B, seq=S, **kw)


# -- model states: Megatron's distributed-optimizer table --------------------------------------------------------
DOC_TABLE = {  # precision: (non-distributed, (constant, per-d)) bytes per parameter
    "fp16-master": (20, (4, 16)),
    "bf16-master": (18, (6, 12)),
    "fp32": (16, (8, 8)),
}


@pytest.mark.parametrize("precision", sorted(DOC_TABLE))
@pytest.mark.parametrize("d", [2, 8])
def test_bytes_per_param_match_megatron_docs(precision, d):
    spec = gpt(h=256, heads=4, layers=2, vocab=1000)
    pc = count_params(spec)
    stage = Stage(0, spec.layers, True, True, 1)
    plain, (const, per_d) = DOC_TABLE[precision]
    for zero, expected in ((0, plain), (1, const + per_d / d)):
        ms = megatron_model_states(spec, pc, mg(precision=precision, dp=d, zero=zero), stage)
        n = ms.weights / (2 if precision != "fp32" else 4)
        total = ms.weights + ms.gradients + ms.master + ms.optimizer + ms.comm
        assert total / n == pytest.approx(expected), (precision, zero, d)


@pytest.mark.parametrize("d", [2, 8])
def test_grad_reduce_in_bf16_is_the_docs_16_bit_grads_row(d):
    """--grad-reduce-in-bf16 (Megatron-LM arguments.py:720-721): bf16 params with bf16 grads are the docs table's
    16-bit params & 16-bit grads row: 2 (weights) + 2 (grad buffer) + (4 fp32 main params + 4 fp32 grad copies + 8
    Adam)/d = 4 + 16/d, 20 without the distributed optimizer (vs bf16 & fp32 grads: 6 + 12/d, 18)."""
    spec = gpt(h=256, heads=4, layers=2, vocab=1000)
    pc = count_params(spec)
    stage = Stage(0, spec.layers, True, True, 1)
    for zero, expected in ((0, 20), (1, 4 + 16 / d)):
        ms = megatron_model_states(spec, pc, mg(dp=d, zero=zero, grad_reduce_in_bf16=True), stage)
        assert (ms.weights + ms.gradients + ms.master + ms.optimizer) / (ms.weights / 2) == pytest.approx(expected)


def test_fp32_grad_copies_live_in_the_optimizer_step_only():
    """16-bit grads: the distributed optimizer's fp32 copies of its shard of them (distrib_optimizer.py:2419) are made
    by the step and set to None by the next step's optimizer.zero_grad() before its forward (Megatron-LM
    training.py:1619). By hand, n parameters over d = 4 ranks: the forward's peak holds the fp32 main params, 4n/d,
    of the table's 8n/d master bytes; the optimizer phase 4n/d more than the forward's resident states."""
    from trainfit import estimate
    d = 4
    kw = dict(stack="megatron", precision="bf16-master", dp=d, zero=1, batch=1, seq=256, grad_reduce_in_bf16=True)
    m = estimate("gpt2", **kw).memory
    n = m.weights / 2
    assert m.master_weights == pytest.approx(8 * n / d)
    assert m.at_peak["master_weights"] == pytest.approx(4 * n / d)
    fp32 = estimate("gpt2", **{**kw, "grad_reduce_in_bf16": False}).memory  # fp32 grads: no copies, 4n/d master
    assert fp32.at_peak["master_weights"] == pytest.approx(4 * n / d)
    step = m.phases["optimizer_step"]
    states = m.weights + m.gradients + m.master_weights + m.optimizer_states  # every state, the copies included
    assert step >= states


@pytest.mark.parametrize("kw, match", [(dict(stack="torchtitan", precision="amp-bf16"), "no such option"),
                                       (dict(stack="megatron", precision="fp16-master"), "already have the param")])
def test_grad_reduce_in_bf16_refused_where_it_changes_nothing(kw, match):
    from trainfit import estimate
    from trainfit.errors import SetupError
    with pytest.raises(SetupError, match=match):
        estimate("gpt2", **kw, grad_reduce_in_bf16=True)


def test_distributed_optimizer_shards_over_dp_times_cp():
    spec = gpt(h=256, heads=4, layers=2, vocab=1000)
    pc = count_params(spec)
    stage = Stage(0, spec.layers, True, True, 1)
    a = megatron_model_states(spec, pc, mg(dp=8, zero=1), stage)
    b = megatron_model_states(spec, pc, Setup(stack="megatron", precision="bf16-master", batch=B, seq=S, dp=2, cp=4,
                                              zero=1), stage)
    assert a.optimizer == pytest.approx(b.optimizer) and a.weights == b.weights


# -- activations per layer: Korthikanti Table 2 -------------------------------------------------------------------
T = 8
TABLE2 = {  # (tp, sequence_parallel, recompute) -> bytes per layer, as printed in the paper's Table 2
    (1, False, "none"): S * B * H * (34 + 5 * A * S / H),
    (T, False, "none"): S * B * H * (10 + 24 / T + 5 * A * S / (H * T)),
    (T, True, "none"): S * B * H / T * (34 + 5 * A * S / H),
    (T, False, "selective"): S * B * H * (10 + 24 / T),
    (T, True, "selective"): S * B * H * 34 / T,
    (T, False, "full"): 2 * S * B * H,
    (T, True, "full"): 2 * S * B * H / T,
}


@pytest.mark.parametrize("tp,sp,rc", sorted(TABLE2))
def test_layer_activations_match_korthikanti_table2(tp, sp, rc):
    from trainfit.analytic.memory import train_memory
    spec = gpt()
    setup = mg(tp=tp, sequence_parallel=sp, recompute=rc, attention="eager")
    per_layer = train_memory(spec, setup).detail["activation_per_layer"]
    # the paper counts the big tensors; TE's norms also keep fp32 statistics per token (mu, rsigma: 16 bytes per
    # token per layer, named 'norm_statistics'), which the paper leaves out
    stats = 0 if rc == "full" else layer_terms(spec, setup).replicated["norm_statistics"] * S * B / (tp if sp else 1)
    assert per_layer - stats == pytest.approx(TABLE2[(tp, sp, rc)], abs=1)
    assert stats < 1e-3 * TABLE2[(tp, sp, rc)]


def test_flash_keeps_no_scores_and_selective_drops_the_lse():
    spec = gpt()
    flash = layer_terms(spec, mg(tp=T, attention="flash"))
    assert flash.scores == 0 and "softmax_lse" in flash.split
    assert "softmax_lse" not in layer_terms(spec, mg(tp=T, attention="flash", recompute="selective")).split


def test_megatron_dropout_defaults_are_what_the_paper_counts():
    """TransformerConfig's hidden/attention dropout defaults (0.1) are the dropout Korthikanti's 34 counts."""
    tc = pytest.importorskip("megatron.core.transformer.transformer_config")
    fields = tc.TransformerConfig.__dataclass_fields__
    assert fields["hidden_dropout"].default > 0 and fields["attention_dropout"].default > 0


def test_uniform_and_block_recompute_order():
    from trainfit.analytic.memory import train_memory
    spec = gpt(layers=8)
    acts = {rc: train_memory(spec, mg(tp=T, sequence_parallel=True, recompute=rc)).activations
            for rc in ("none", "full", "uniform:2", "block:4", "block:8")}
    assert acts["uniform:2"] < acts["full"] < acts["block:4"] < acts["none"]
    assert acts["block:8"] == pytest.approx(acts["full"], rel=0.01)


def test_context_parallel_divides_activations():
    from trainfit.analytic.memory import train_memory
    spec = gpt(layers=4)
    one = train_memory(spec, mg(tp=2, dp=2)).detail["activation_per_layer"]
    two = train_memory(spec, mg(tp=2, cp=2)).detail["activation_per_layer"]
    assert two == pytest.approx(one / 2, rel=1e-3)


def test_recompute_flops_follow_korthikanti_section_4_2():
    """Full recompute re-runs every layer's forward, selective only the attention core (Korthikanti §4.2), block:N
    the N checkpointed layers."""
    from trainfit.analytic.flops import recompute_per_token
    spec = gpt(layers=8)
    f = lambda rc: recompute_per_token(spec, mg(tp=T, recompute=rc, attention="eager"), 8, 10.0, 3.0)
    assert (f("full"), f("uniform:2"), f("selective"), f("block:3"), f("none")) == (80.0, 80.0, 24.0, 30.0, 0.0)
