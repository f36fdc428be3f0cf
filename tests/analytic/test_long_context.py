"""ArcticTraining's long-sequence recipe on --stack deepspeed (analytic/long_context.py), by hand: DeepSpeed-Ulysses
splits each layer's tokens over its group and exchanges q, k, v and the output with all-to-alls; the tiled loss keeps
one ~1 GiB slice of fp32 logits; ArcticTraining's checkpoint offload keeps one layer's input on the device and copies
the others synchronously. The real TiledMLP (DeepSpeed 0.19.8, CPU) is compared in the heavy tier."""
from __future__ import annotations

import math

import pytest

from trainfit import api
from trainfit.errors import SetupError
from trainfit.setup import Request, Setup

MODEL = "llama-3.2-1b"  # hidden 2048, 32 heads, 8 kv heads (head_dim 64), 16 layers, vocab 128256, MLP 8192
DS = dict(model=MODEL, stack="deepspeed", zero=3, offload="params", recompute="full", gpu="H200", batch=1)


def _est(**kw):
    return api.analytic(Request(**{**DS, **kw}))


def test_ulysses_rank_keeps_its_slice_of_each_checkpointed_input():
    """Under --recompute full a layer saves only its input: batch × seq / N × hidden bf16 values on each rank."""
    seq, h = 32768, 2048
    for n in (1, 4, 8):
        e = _est(dp=8, seq=seq, ulysses=n)
        assert e.detail.records["activation_per_layer"] == 2 * seq // n * h


def test_ulysses_costs_what_the_sequence_slice_costs_plus_its_exchanges():
    """A rank of --ulysses 8 on a 64k sequence attends 1/8 of the heads over 64k keys: the same attention FLOPs and
    saved bytes as 8k queries of every head; the all-to-alls add, per layer and direction, 4 exchanges of which each
    rank sends 7/8 of its local q, k, v and output over NVLink (one node): hand count below."""
    from trainfit.analytic.parallel.collectives import Links
    from trainfit.hardware import get_gpu

    seq, n = 65536, 8
    e = _est(dp=8, seq=seq, ulysses=n)
    st = e.detail.step_time
    local = seq // n  # tokens a rank holds outside attention
    q = local * 32 * 64 * 2  # bf16 q of all 32 heads
    kv = local * 8 * 64 * 2  # k (and v): 8 kv heads, N = kv heads: no repeat
    per_dir = (q + 2 * kv + q) * (n - 1) / n / Links.of(get_gpu("H200")).intra
    rerun = 1  # full recompute re-runs each layer's forward exchanges
    assert st.cp_comm == pytest.approx(16 * per_dir * (2 + rerun), rel=1e-9)
    # a step's tokens: the 8 ranks share one sequence (dp / N = 1 group)
    assert e.setup.tokens_per_step == seq


def test_tiled_loss_keeps_one_slice_of_logits():
    """DeepSpeed's TiledFusedLogitsLoss as ArcticTraining runs it: ceil(fp32 logits / 1 GiB) slices; a slice's
    high point is its backward: the saved log-softmax, its gradient and the logits' gradient, fp32 (12 bytes per
    logit) — beside the held hidden states. The head's saved set: the input gradient (bf16 T × h), the LM head's
    weight gradient (bf16 V × h) made in the forward, the final norm's input and rsqrt, the labels."""
    from trainfit.analytic.loss import head_and_loss
    from trainfit.analytic.precision import state_bytes

    seq, v, h = 16384, 128256, 2048
    setup = Setup(stack="deepspeed", zero=3, offload="params", dp=8, seq=seq, recompute="full", loss="tiled",
                  precision="bf16-master")
    spec = api.load_spec(MODEL)
    hb = head_and_loss(spec, setup, state_bytes(setup), seq)
    shards = math.ceil(seq * v * 4 / 2**30)  # 8 slices of 2048 rows
    rows = math.ceil(seq / shards)
    assert hb.forward_transient == 2 * h * seq + 12 * v * rows
    assert hb.backward_transient == 0
    full = head_and_loss(spec, setup.with_(loss="full"), state_bytes(setup), seq)
    assert full.saved > hb.saved > 2 * h * seq + 2 * v * h  # the log-softmax (fp32 T × V) is gone


def test_checkpoint_offload_moves_all_but_the_running_layer_synchronously():
    """ArcticTraining's CheckpointFunction copies each checkpointed layer's input to the host before the layer
    runs and back at its backward, on the compute stream: 15 of 16 inputs on the host, both copies exposed."""
    seq, h = 32768, 2048
    e = _est(dp=1, zero=0, offload="activations", seq=seq, gpu="H200")
    per_layer = 2 * seq * h
    assert e.detail.host_memory == 15 * per_layer
    from trainfit.analytic.roofline import kernels_for
    from trainfit.hardware import get_gpu

    link = kernels_for(get_gpu("H200")).host_link
    assert e.detail.step_time.host_copies == pytest.approx(2 * 15 * per_layer / link)


@pytest.mark.parametrize("kw,words", [
    (dict(ulysses=2, dp=2, stack="torchtitan"), "--stack hf or deepspeed"),
    (dict(ulysses=4, dp=2, stack="deepspeed"), "multiple of 4"),
    (dict(ulysses=2, dp=2, stack="deepspeed", seq=4095), "not a multiple of 2"),
    (dict(ulysses=2, dp=2, stack="deepspeed", attention="eager"), "eager"),
    (dict(ulysses=2, dp=2, stack="hf"), "--precision bf16-master"),
    (dict(tiled_mlp=4, stack="megatron"), "--stack hf or deepspeed"),
    (dict(loss="tiled", stack="torchtitan"), "--stack hf or deepspeed"),
    (dict(offload="activations", stack="deepspeed", recompute="none"), "--recompute full"),
])
def test_refusals(kw, words):
    with pytest.raises(SetupError, match=words):
        Setup(**kw)


def test_hf_runs_ulysses_through_its_deepspeed_integration():
    s = Setup(stack="hf", precision="bf16-master", zero=3, dp=4, ulysses=4, seq=4096)
    assert s.tokens_per_step == 4096


def test_model_limits_refused():
    with pytest.raises(SetupError, match="does not divide the 32 attention heads"):
        _est(dp=6, seq=6144, ulysses=3)
    with pytest.raises(SetupError, match="gated MLP"):
        api.analytic(Request(model="gpt2", stack="deepspeed", zero=3, dp=2, tiled_mlp=2))


def test_other_engines_refuse_in_one_line():
    from trainfit.engines import measure, trace

    spec = api.load_spec("tiny-llama")
    for engine in (trace, measure):
        with pytest.raises(SetupError, match="--engine analytic"):
            engine(spec, Setup(tiled_mlp=2, device="cpu", batch=1, seq=8))


def test_deepspeed_config_counts_data_parallel_groups_not_ranks():
    """DeepSpeed checks train_batch_size against world / sequence_parallel_size (runtime/config.py:461-469): 16
    ranks in groups of 8 are 2 data-parallel replicas; the tiled kernels are ArcticTraining's options, not keys."""
    from trainfit.plan.emit_deepspeed import supports
    from trainfit.stacks.deepspeed_config import ds_config

    s = Setup(stack="deepspeed", zero=3, dp=16, ulysses=8, seq=8192, batch=1, grad_accum=2, precision="bf16-master")
    cfg = ds_config(s)
    assert cfg["train_batch_size"] == 1 * 2 * 2 and cfg["sequence_parallel_size"] == 8
    assert "ArcticTraining" in supports(s.with_(tiled_mlp=0))


@pytest.mark.heavy
def test_tiled_mlp_saved_slice_matches_deepspeeds_tiled_mlp():
    """DeepSpeed's own TiledMLP on CPU: its forward saves only x; its backward re-runs one slice at a time, whose
    saved tensors (gate output, act output, up output, product: 4 × rows × intermediate, plus the slice of x) are the
    slice the analytic layer keeps (t["mlp"] / shards per token)."""
    import torch
    from deepspeed.runtime.sequence_parallel.ulysses_sp import TiledMLP

    from trainfit.analytic.activations import layer_activations

    torch.manual_seed(0)
    h, i, seq, shards = 64, 176, 512, 4

    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj = torch.nn.Linear(h, i, bias=False, dtype=torch.bfloat16)
            self.up_proj = torch.nn.Linear(h, i, bias=False, dtype=torch.bfloat16)
            self.down_proj = torch.nn.Linear(i, h, bias=False, dtype=torch.bfloat16)

        def forward(self, x):
            return self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))

    mlp = MLP()
    x = torch.randn(1, seq, h, dtype=torch.bfloat16, requires_grad=True)
    saved: list[list[int]] = [[]]

    def pack(t):
        saved[-1].append(t.untyped_storage().data_ptr() if t.numel() else 0)
        saved[-1].append(t.numel() * t.element_size())
        return t

    def fn(self, xs):
        saved.append([])  # one recorded set per slice run
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            return self.forward(xs)

    out = TiledMLP.apply(fn, mlp, x, shards, [p for p in mlp.parameters()])
    out.sum().backward()

    weights = {p.untyped_storage().data_ptr() for p in mlp.parameters()}  # saved by the linears, not new memory

    def unique_bytes(rec):
        return sum(b for ptr, b in dict(zip(rec[0::2], rec[1::2])).items() if ptr not in weights)

    per_slice = [unique_bytes(r) for r in saved[1:] if r]  # the backward's re-runs with grad
    assert len(per_slice) == shards
    rows = seq // shards
    slice_x = rows * h * 2
    spec = api.load_spec(MODEL)
    # the analytic term for this shape: 4 bf16 values per intermediate element per token, over the slices
    setup = Setup(stack="deepspeed", zero=3, dp=2, seq=seq, tiled_mlp=shards, precision="bf16-master")
    la = layer_activations(spec, setup)
    assert la.terms["mlp"] == 4 * 2 * spec.intermediate / shards
    assert max(per_slice) - slice_x == 4 * 2 * i * rows


@pytest.mark.heavy
def test_ulysses_exchanges_and_saved_set_match_deepspeeds_on_two_cpu_ranks():
    """DeepSpeed's UlyssesSPAttentionHF around transformers' SDPA on 2 gloo ranks (bench/targets/ulysses_cpu.py):
    each rank hands its all-to-alls q, k, v and the output (forward) and their gradients (backward), the bytes
    long_context.a2a_bytes counts; and the attention it runs on heads / 2 over the whole sequence saves exactly
    what the same attention saves on the rank's half of the sequence with every head: the shape the analytic
    engine prices it at (ops/attention.py queries seq / n, activations at rank_tokens)."""
    from types import SimpleNamespace

    from bench.targets.ulysses_cpu import ulysses_probe
    from trainfit.analytic.long_context import a2a_bytes

    heads, kv, d, seq = 8, 2, 16, 256
    ranks = ulysses_probe(heads, kv, d, seq, ranks=2)
    spec = SimpleNamespace(head_dim=d, kv_heads=kv, q_dim=heads * d)
    q, rest = a2a_bytes(spec, SimpleNamespace(ulysses=2, batch=1, seq=seq), 4)  # fp32 on the CPU ranks
    for r in ranks:
        assert r["a2a_forward"] == r["a2a_backward"] == q + rest
        assert r["saved"] == r["saved_slice_all_heads"]


def _layer_moments(seq: int, **kw):
    """The backward moments of one Llama-3.2-1B layer on --stack deepspeed under full recomputation (bf16, CUDA,
    flash attention), in the order backward.layer_moments makes them: the down projection's, the activation's,
    the flash kernel's, the end of the re-run forward."""
    from trainfit.analytic.activations import keys_per_token, layer_activations
    from trainfit.analytic.params import count_params
    from trainfit.analytic.precision import state_bytes
    from trainfit.analytic.recompute import layer_memory

    spec = api.load_spec(MODEL)
    setup = Setup(stack="deepspeed", zero=3, dp=2, seq=seq, recompute="full", precision="bf16-master",
                  attention="flash", **kw)
    lm = layer_memory(spec, setup, count_params(spec), state_bytes(setup), seq, keys_per_token(spec, seq))
    return [m.extra for m in lm.moments], sum(layer_activations(spec, setup).mlp_share.values())


def test_tiled_mlp_backward_holds_the_input_gradient_and_one_slice():
    """DeepSpeed's TiledMLP.backward (ulysses_sp.py TiledMLP): x_grad = zeros_like(x), the whole MLP input's
    gradient (bf16 T × h, the size of the residual gradient the re-run's end holds), then one slice's re-run with
    grad at a time: the down projection's input gradient is one slice's (T / N × intermediate), the SwiGLU product
    rule's two likewise. Hand count against the end-of-re-run moment (incoming gradient + residual)."""
    seq, i, n = 65536, 8192, 32  # auto slices: ceil(65536 / 2048) = 32
    (down, act, _flash, end), _ = _layer_moments(seq, tiled_mlp=0)
    assert down - end == pytest.approx(2 * i * seq / n, rel=1e-9)
    assert act - end == pytest.approx(2 * 2 * i * seq / n, rel=1e-9)
    # without tiling the same moments hold the whole sequence's MLP-width gradients
    (down_full, _, _, end_full), _ = _layer_moments(seq)
    assert down_full - end_full == pytest.approx(2 * (i - 2048) * seq, rel=1e-9)


def test_flash_backward_holds_fa2s_scratch():
    """FlashAttention-2's mha_bwd (flash_api.cpp), per token for Llama-3.2-1B (32 heads of 64, 8 kv heads), bf16:
    dout and dq (2 × 2 × 2048), dk and dv (2 × 2 × 512), the fp32 dq accumulator (4 × 2048), the fp32 softmax_d
    (4 × 32 heads), and under GQA dk and dv expanded to the 32 query heads (2 × 2 × 2048): 26,752 bytes. By then the
    MLP sub-block's saved tensors are freed; against the end of the re-run forward (which holds the residual, bf16
    T × h, instead)."""
    seq = 65536
    (_, _, flash, end), mlp_saved = _layer_moments(seq, tiled_mlp=0)
    fa2 = 2 * 2 * 2048 + 2 * 2 * 512 + 4 * 2048 + 4 * 32 + 2 * 2 * 2048
    assert flash - end == pytest.approx((fa2 - mlp_saved - 2 * 2048) * seq, rel=1e-9)


def test_checkpoint_offload_holds_the_rerun_output_through_the_layers_backward():
    """ArcticTraining's CheckpointFunctionWithCPUOffload is the reentrant checkpoint: its backward keeps the re-run
    layer's `outputs` through torch.autograd.backward (monkey_patches.py:142, :156): one bf16 T × h more at the
    layer's backward than torch's non-reentrant checkpoint (--offload activations elsewhere keeps none)."""
    from trainfit.analytic.long_context import rerun_output

    spec, seq = api.load_spec(MODEL), 32768
    kw = dict(stack="deepspeed", zero=3, seq=seq, recompute="full", precision="bf16-master")
    assert rerun_output(spec, Setup(**kw, offload="activations+params"), 2, seq) == 2 * 2048 * seq
    assert rerun_output(spec, Setup(**kw, offload="params"), 2, seq) == 0
