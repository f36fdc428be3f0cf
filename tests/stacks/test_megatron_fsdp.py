"""Megatron-FSDP (`--stack megatron --zero 2/3`) against hand derivations from megatron-core 0.16.1's buffers:
param_and_grad_buffer.py:1848-1866 (optim_grads: main weights and grads distributed; optim_grads_params: the 16-bit
model weights too), :2004-2031 (fp32 main weights, fp32 main grads under grad_reduce_in_fp32), :256 (40M-element
buckets without FSDP units), :1874-1887 (two units' buffers in flight); mcore_fsdp_adapter.py:95-99 (each
TransformerLayer one unit under optim_grads_params)."""
from __future__ import annotations

import pytest

from trainfit.analytic.parallel.megatron import megatron_model_states
from trainfit.analytic.parallel.pipeline import Stage
from trainfit.analytic.params import count_params
from trainfit.analytic.step_time import layout_step_time
from trainfit.errors import SetupError
from trainfit.hardware import get_gpu
from trainfit.models.hf_config import spec_from_config
from trainfit.models.resolve import load_model
from trainfit.setup import Setup, validate

H, V, P, L, D = 256, 1000, 2048, 2, 8


def gpt():
    return spec_from_config({
        "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": H, "n_head": 4, "n_layer": L,
        "vocab_size": V, "n_positions": P, "n_inner": 4 * H, "activation_function": "gelu",
        "tie_word_embeddings": True}, "gpt")


# GPT-2 by hand: per layer c_attn 3h² + 3h, c_proj h² + h, c_fc 4h² + 4h, mlp c_proj 4h² + h, two LayerNorms 2h each;
# outside the layers the (tied) word embedding, the learned positions and the final LayerNorm
LAYER = 12 * H * H + 13 * H
OUTSIDE = V * H + P * H + 2 * H
N = L * LAYER + OUTSIDE


def states(zero, precision="bf16-master"):
    spec = gpt()
    s = Setup(stack="megatron", precision=precision, batch=1, seq=512, dp=D, zero=zero)
    return megatron_model_states(spec, count_params(spec), s, Stage(0, L, True, True, 1))


def test_optim_grads_shards_grads_main_weights_and_states_not_weights():
    ms = states(2)
    # bf16 weights whole, fp32 main grads / fp32 main weights / Adam's two fp32 moments each 1/dp
    assert (ms.weights, ms.gradients, ms.master, ms.optimizer) == pytest.approx((2 * N, 4 * N / D, 4 * N / D,
                                                                                 8 * N / D))
    # the unsharded fp32 gradient buckets in flight: two, each of the whole model here (< 40M elements)
    assert ms.comm == pytest.approx(2 * N * 4)


def test_optim_grads_params_shards_weights_and_gathers_two_layers_and_the_rest():
    ms = states(3)
    assert (ms.weights, ms.gradients, ms.master, ms.optimizer) == pytest.approx((2 * N / D, 4 * N / D, 4 * N / D,
                                                                                 8 * N / D))
    # two TransformerLayer units gathered (bf16 weights + fp32 gradient bucket), the embedding / final norm (outside
    # any unit) gathered from forward to backward beside their own shard
    assert ms.comm == pytest.approx(2 * LAYER * (2 + 4) + OUTSIDE * 2 * (1 - 1 / D))


def test_megatron_fsdp_totals_against_zero_paper_bytes():
    """Rajbhandari et al. 2020 §5.1 with Megatron's fp32 gradients: ZeRO-2 2 + 16/d and ZeRO-3 18/d bytes per
    parameter of model states (buffers aside)."""
    for zero, per_param in ((2, 2 + 16 / D), (3, 18 / D)):
        ms = states(zero)
        assert (ms.weights + ms.gradients + ms.master + ms.optimizer) / N == pytest.approx(per_param)
    # --fp16 reduces in fp16: the paper's own mixed-precision Adam, 16/d under ZeRO-3 (2 + 2 + 12 bytes, Rajbhandari
    # §5.1), and the fp32 copies of the 16-bit gradient shard the fp32 main weights step on (update_main_grads,
    # param_and_grad_buffer.py:2646-2649): 4/d more, alive in the optimizer step only (grad_copy_bytes) — Megatron's
    # own fp16 table's 20 bytes (docs distrib_optimizer), all sharded
    ms = states(3, "fp16-master")
    assert (ms.weights + ms.gradients + ms.master + ms.optimizer) / N == pytest.approx(20 / D)


def test_16_bit_grad_buffer_copies_live_in_the_optimizer_step_only():
    """--grad-reduce-in-bf16 under Megatron-FSDP: a bf16 main-grad shard (2/d bytes a parameter), cast to fp32 for
    the step (4/d: update_main_grads `optimizer_grad.to(param.dtype)` on the fp32 main weight, param_and_grad_buffer.py:
    2646-2649) and dropped by zero_grad (:2470-2480): those copies are the optimizer phase's, not resident."""
    from trainfit.analytic.memory import train_memory

    def mem(bf16_reduce):
        s = Setup(stack="megatron", precision="bf16-master", batch=1, seq=512, dp=D, zero=3, attention="flash",
                  grad_reduce_in_bf16=bf16_reduce)
        return train_memory(gpt(), s)

    fp32_buf, bf16_buf = mem(False), mem(True)
    assert bf16_buf.gradients == pytest.approx(fp32_buf.gradients / 2)
    # the grad copies: N/d fp32 elements (the rank's shard of the whole model: one stage), the optimizer step's only
    assert bf16_buf.detail["optimizer_temporaries"] - fp32_buf.detail["optimizer_temporaries"] == pytest.approx(
        4 * N / D, abs=4 * 64)


def test_per_micro_batch_collectives():
    """optim_grads_params gathers every unit in each micro-batch's forward and backward and reduce-scatters its
    gradients (megatron_fsdp.py:966-1000): its traffic grows with the micro-batches; the distributed optimizer's
    (--zero 1) is once per step; optim_grads reduce-scatters each micro-batch, gathers once."""
    spec, gpu = load_model("llama-3.1-8b"), get_gpu("H100-80GB")

    def total(zero, m):
        s = Setup(stack="megatron", precision="bf16-master", batch=1, seq=4096, dp=8, zero=zero, grad_accum=m,
                  attention="flash")
        return layout_step_time(spec, s, gpu).dp_comm_total

    assert total(1, 4) == pytest.approx(total(1, 2))
    assert total(3, 4) == pytest.approx(2 * total(3, 2))
    rs = (total(2, 4) - total(2, 2)) / 2  # one micro-batch's reduce-scatter
    assert total(2, 2) - 2 * rs == pytest.approx(total(1, 2) - rs)  # the one all-gather of the updated weights


def test_zero_3_on_megatron_is_accepted_and_needs_dp():
    validate(Setup(stack="megatron", precision="bf16-master", dp=8, zero=3))
    with pytest.raises(SetupError, match="--dp"):
        validate(Setup(stack="megatron", precision="bf16-master", zero=3))


def test_params_owned_per_rank():
    """optim_grads_params leaves each rank its 1/dp shard of the parameters' storage; optim_grads all of them."""
    from trainfit.analytic.memory import train_memory

    for zero, owned in ((2, N), (3, N / D)):
        s = Setup(stack="megatron", precision="bf16-master", batch=1, seq=512, dp=D, zero=zero, attention="flash")
        assert train_memory(gpt(), s).params == pytest.approx(owned, abs=1)


def test_optim_grads_params_reduce_scatters_the_fp32_main_grads():
    """Each micro-batch under optim_grads_params all-gathers the bf16 weights twice (forward and backward) and
    reduce-scatters the main-grad buffer, fp32 under --bf16 (param_and_grad_buffer.py:2030 dtype float32 if
    grad_reduce_in_fp32; Megatron-LM core_v0.16.1 arguments.py:711-724), bf16 with --grad-reduce-in-bf16: 2·2 + 4 = 8
    against 2·2 + 2 = 6 bytes a parameter on the wire, a ratio of 4/3 (NB: NCCL's per-call latency, a few hundred
    calls of microseconds against ~0.1 s of bytes, pulls it below by < 1 %)."""
    spec, gpu = load_model("llama-3.1-8b"), get_gpu("H100-80GB")

    def total(bf16_reduce):
        s = Setup(stack="megatron", precision="bf16-master", batch=1, seq=4096, dp=8, zero=3,
                  grad_reduce_in_bf16=bf16_reduce, attention="flash")
        return layout_step_time(spec, s, gpu).dp_comm_total

    assert total(False) / total(True) == pytest.approx(8 / 6, rel=1e-2)


def test_per_tensor_fp8_params_are_one_uint8_copy():
    """--low-precision tensorwise --fp8-all-gather under optim_grads_params: Megatron-FSDP's model weight buffer holds
    the fp8 parameters' uint8 data (param_and_grad_buffer.py:1940-1947 at 0.16.1, :1811-1817 at 0.15), no transpose
    buffer for per-tensor fp8 (:1951-1961, MXFP8 only) and no kept transpose cache (keep_fp8_transpose_cache False:
    megatron_fsdp.py drops it after each module). GPT-2's TE linears by hand: c_attn 3h², c_proj h², c_fc 4h², mlp
    c_proj 4h² = 12h² weights a layer (their biases, the norms and everything outside the units stay bf16): 1 byte
    each in the shard and in the two gathered units, against 2 in bf16."""
    from trainfit.analytic.memory import train_memory

    q = 12 * H * H

    def mem(**kw):
        s = Setup(stack="megatron", precision="bf16-master", batch=1, seq=512, dp=D, zero=3, attention="flash", **kw)
        return train_memory(gpt(), s)

    bf16, fp8 = mem(), mem(low_precision="tensorwise", fp8_all_gather=True)
    assert bf16.weights - fp8.weights == pytest.approx(L * q / D, abs=2)
    assert bf16.comm_buffers - fp8.comm_buffers == pytest.approx(2 * q, abs=2)
