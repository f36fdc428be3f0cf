"""Megatron-Core's MoE layer as trainfit lists it (analytic/ops/megatron_moe.py) against counts derived by hand from
megatron-core 0.16.1 and Transformer Engine v2.9, and the alltoall dispatcher's per-layer host synchronisation
(analytic/step_time.py moe_host_syncs)."""
from dataclasses import replace

import pytest

RUN_C7 = "c7-25.11-b200-qwen3-30b-a3b-mxfp8"
RUN_GB200 = "mbridge-25.11-gb200-qwen3-30b-a3b-mxfp8"


def _run(run_id):
    from bench.targets import time_published as tp
    from bench.targets.time_runs import RUNS

    r = next(r for r in RUNS if r["id"] == run_id)
    return tp.build_spec(r), tp.build_setup(r), r


def _layer(spec, setup):
    from trainfit.analytic import compute_time as ct
    from trainfit.analytic.ops import shape_of
    from trainfit.analytic.precision import state_bytes
    from trainfit.analytic.timing import compute_dtype

    sh = shape_of(spec, setup, state_bytes(setup), compute_dtype(setup))
    fwd, bwd, _ = ct._lists(spec, setup, sh, True)
    return sh, fwd, bwd


def test_expert_kernels_one_per_local_expert():
    """Qwen3-30B-A3B at EP 8 under MXFP8: 128 / 8 = 16 local experts. TE's grouped GEMM is one cuBLAS GEMM per
    expert (cublaslt_gemm.cu:941-966) and split_quantize one MXFP8 quantise per expert (cast.cpp:143-147). Per
    micro-batch and layer, by hand: fc1 and fc2 each launch 16 forward + 16 dgrad + 16 wgrad GEMMs (96); their
    inputs (2 x 16) and output gradients (2 x 16) are quantised per expert (64); the weights (2 x 16) once per
    step, over 64 micro-batches (0.5)."""
    spec, setup, r = _run(RUN_C7)
    assert (spec.moe.num_experts, setup.ep, setup.grad_accum) == (128, 8, 64)
    _, fwd, bwd = _layer(spec, setup)
    experts = [o for o in fwd + bwd if o.name.startswith(("experts_in", "experts_out"))]
    gemms = sum(o.kernels for o in experts if o.kind == "gemm")
    casts = sum(o.kernels for o in experts if o.kind != "gemm" and not o.name.endswith(".swizzle"))
    assert gemms == 2 * 3 * 16
    assert casts == 2 * 16 + 2 * 16 + 2 * 16 / 64


def test_delayed_scaling_quantises_the_splits_in_one_kernel():
    """Delayed scaling's split_quantize is one fused multi-tensor cast-transpose (cast.cpp:117-141): 1 kernel per
    grouped operand, not 16; the GEMMs stay one per expert."""
    spec, setup, _ = _run(RUN_C7)
    _, fwd, bwd = _layer(spec, replace(setup, low_precision="delayed"))
    experts = [o for o in fwd + bwd if o.name.startswith(("experts_in", "experts_out"))]
    assert sum(o.kernels for o in experts if o.kind == "gemm") == 96
    assert sum(o.kernels for o in experts if o.kind != "gemm") == 2 + 2 + 2 / 64


def test_quantised_experts_are_padded_and_unpadded():
    """Under an fp8/fp4 recipe TEGroupedMLP pads each expert's rows (experts.py:646-653: the tokens, then the
    probabilities) and unpads the output (:761-762); each TE (un)padding call is one kernel for up to 64 splits
    (padding.cu:25 kMaxTensorsPerKernel), and its backward the reverse copy. By hand, per layer: 16 local experts
    give 2 + 1 forward and 2 + 1 backward launches; 128 local experts (EP 1) two per call. A bf16 run pads nothing
    (experts.py:646 `if self.config.fp8 or self.config.fp4`)."""
    spec, setup, _ = _run(RUN_C7)

    def launches(s):
        _, fwd, bwd = _layer(spec, s)
        pads = ("experts_pad", "experts_unpad")
        return [sum(o.kernels for o in ops if o.name.startswith(pads)) for ops in (fwd, bwd)]

    assert launches(setup) == [3, 3]
    assert launches(replace(setup, ep=1)) == [6, 6]
    assert launches(replace(setup, low_precision="none", fp8_all_gather=False)) == [0, 0]


def test_forced_balance_adds_the_noise_kernels():
    """--moe-force-balance (the benchmarks' moe_router_force_load_balancing): router.py:655-657 replaces the logits
    by RandomSTE (moe_utils.py:1110-1144): clone and normal_, two forward kernels over tokens x experts; the
    backward returns the gradient as it is (none). The routed run without it has neither."""
    spec, setup, _ = _run(RUN_C7)
    setup = replace(setup, cuda_graph_scope=None)  # (C7's recipe graphs the router: one launch for all of it)
    assert setup.moe_force_balance

    def noise(s):
        _, fwd, bwd = _layer(spec, s)
        return [sum(o.kernels for o in ops if o.name.startswith("router_random_logits")) for ops in (fwd, bwd)]

    assert noise(setup) == [2, 0]
    assert noise(replace(setup, moe_force_balance=False)) == [0, 0]


def test_expert_gemms_run_four_at_a_time():
    """TE's grouped GEMM puts expert i's cuBLAS call on compute stream i mod 4 (multi_stream.cpp:52-54,
    cublaslt_gemm.cu:941-966): 16 local experts run as 4 rounds of 4 concurrent GEMMs, 6 as a round of 4 and one of
    2, each round's tiles in waves of their own; 4 or fewer are one round, as one batched launch."""
    from trainfit.analytic import roofline
    from trainfit.analytic.compute_time import time_ops
    from trainfit.hardware import get_gpu

    spec, setup, r = _run(RUN_C7)
    _, fwd, _ = _layer(spec, setup)
    op = next(o for o in fwd if o.name == "experts_in")
    assert (op.batch, op.kernels, op.streams) == (16, 16, 4)
    gpu = get_gpu(r["gpu"])
    launch = roofline.kernels_for(gpu).launch_seconds

    def gemm(batch):
        return roofline.gemm_seconds(gpu, op.m, op.n, op.k, op.dtype, batch) - launch

    def timed(o):
        return time_ops(gpu, [o]).gemm

    assert timed(op) == pytest.approx(4 * gemm(4))
    assert timed(op._replace(batch=6, kernels=6)) == pytest.approx(gemm(4) + gemm(2))
    assert timed(op._replace(batch=4, kernels=4)) == pytest.approx(gemm(4))
    assert timed(op) > timed(op._replace(streams=0))  # one batch would pack the 16 GEMMs' tiles into full waves


def test_cuda_graphs_replace_the_router_and_preprocess_launches():
    """C7's recipe graphs the router and the dispatcher's preprocess (cuda_graph_scope moe_router, moe_preprocess:
    transformer_layer.py:961-962, moe_layer.py:255-272). By hand, per layer: the forward's pre-MLP norm (1), router
    GEMM (1), forced-balance noise (2), fused top-k (1), aux-loss scores (1) and loss (4), the preprocess's metadata
    (9) and permute (4) are 23 launches, one graph; their backward's norm (2), router dgrad and wgrad (2), top-k (1),
    aux scores (1) and loss (4), permute (1) are 11, one graph. The kernels still move the same bytes."""
    from trainfit.analytic.compute_time import time_ops
    from trainfit.hardware import get_gpu

    spec, setup, r = _run(RUN_C7)
    plain = replace(setup, cuda_graph_scope=None)
    assert setup.cuda_graph_scope == "moe_router,moe_preprocess"
    _, f0, b0 = _layer(spec, plain)
    _, f1, b1 = _layer(spec, setup)
    assert sum(o.kernels for o in f0) - sum(o.kernels for o in f1) == 23 - 1
    assert sum(o.kernels for o in b0) - sum(o.kernels for o in b1) == 11 - 1
    gpu = get_gpu(r["gpu"])
    assert time_ops(gpu, f1).memory == pytest.approx(time_ops(gpu, f0).memory)


def test_block_scales_are_swizzled_before_each_gemm():
    """TE v2.9 swizzles both operands' MXFP8 scales before each GEMM call (gemm.cpp:233-240; grouped: one
    multi-tensor kernel per operand list, :484-491). Per layer of C7, by hand: forward linear_qkv and linear_proj
    (2 calls; q, k, v are one TE linear) and fc1, fc2 (2 grouped calls): 8 launches; backward dgrad and wgrad of
    each: 16. The grouped form swizzles MXFP8 only (util.cpp:103-105: NVFP4 4 + 8, the dense ones); per-tensor fp8
    has no block scales (none)."""
    spec, setup, _ = _run(RUN_C7)

    def swz(s):
        _, fwd, bwd = _layer(spec, s)
        return [sum(o.kernels for o in ops if o.name.endswith(".swizzle")) for ops in (fwd, bwd)]

    assert swz(setup) == [8, 16]
    assert swz(replace(setup, low_precision="nvfp4")) == [4, 8]
    assert swz(replace(setup, low_precision="tensorwise")) == [0, 0]


def test_only_megatron_runs_its_block():
    """The dispatcher's kernels are Megatron's: the same model under --stack hf keeps transformers' block."""
    spec, setup, _ = _run(RUN_C7)
    sh, fwd, _ = _layer(spec, setup)
    assert sh.moe_block == "megatron" and any(o.name == "dispatch_metadata" for o in fwd)
    hf = replace(setup, stack="hf", low_precision="none", fp8_all_gather=False, ep=1, zero=0,
                 moe_force_balance=False, cuda_graph_scope=None, grad_reduce_in_bf16=False, loss_fusion="none")
    sh, fwd, _ = _layer(spec, hf)
    assert sh.moe_block == "transformers" and not any(o.name == "dispatch_metadata" for o in fwd)


def test_dispatcher_sync_exposes_the_forward_issue_time():
    """GB200, MBS 4: with the per-layer synchronisation (token_dispatcher.py:897-899) the forward, host-bound on its
    own, cannot hide behind the backward's GPU time, so more host time is exposed than the whole step's issue time
    less its whole GPU time (what the host's lead would leave without the syncs)."""
    from trainfit.analytic.step_time import host_seconds_per_kernel, layout_step_time
    from trainfit.hardware import get_gpu

    spec, setup, r = _run(RUN_GB200)
    tm = layout_step_time(spec, setup, get_gpu(r["gpu"]))
    gpu_timeline = tm.step_seconds - tm.host_issue
    without_syncs = max(0.0, tm.kernels * host_seconds_per_kernel() - gpu_timeline)
    assert tm.host_issue > without_syncs + 0.01 * tm.step_seconds


def test_gpt_oss_activation_and_fc2_bias_kernels_by_hand():
    """gpt-oss-120b on 64 H100 (PP 4, EP 8: 128 / 8 = 16 local experts), recompute modules layernorm, moe_act.
    weighted_bias_quick_geglu_impl (megatron-core 0.16.1 fusions/fused_bias_geglu.py:424-434) runs, before its fused
    kernel, the two halves' clamps and their cat, and makes its linear offset a device tensor (a blocking copy, the
    host waiting for the stream: host_queue.DRAIN_OPS); moe_act re-runs all four in the backward. Backward by
    derivatives.yaml: the glu half's clamp le + zero + where, the linear half's ge, le, logical_and_, zero, where, the
    chunk's cat: 9 kernels. _apply_bias (experts.py:609-626) per expert t + b·p: backward the .to() once, then per
    expert a cast, grad·p and its sum, the bias grad's cast, grad·b and its sum: 6 · 16 + 1 = 97 kernels."""
    from trainfit.analytic import megatron_recompute
    from trainfit.analytic.host_queue import DRAIN_OPS

    spec, setup, r = _run("mbridge-26.04.01-h100-80gb-gpt-oss-120b-bf16")
    assert (spec.moe.num_experts, setup.ep, setup.recompute_modules) == (128, 8, "layernorm,moe_act")
    _, fwd, bwd = _layer(spec, setup)
    names = [o.name for o in fwd]
    prelude = ["experts_act_clamp_glu", "experts_act_clamp_linear", "experts_act_cat", "experts_act_offset"]
    at = names.index("experts_act")
    assert names[at - 4:at] == prelude and DRAIN_OPS & set(names) == {"experts_act_offset"}
    assert sum(o.kernels for o in bwd if o.name.startswith(("experts_act_clamp", "experts_act_chunk",
                                                             "experts_act_cat"))) == 9
    assert sum(o.kernels for o in bwd if o.name.startswith("experts_out_bias")) == 6 * 16 + 1
    rerun = [o.name for o in megatron_recompute.rerun_ops(spec, setup, fwd)]
    assert set(prelude) <= set(rerun)


def test_gpt_oss_clamps_save_a_second_fc1_wide_tensor_as_megatron_does_on_cpu():
    """megatron-core 0.16.1's own weighted_bias_quick_geglu_impl run on CPU under saved_tensors_hooks: with gpt-oss's
    clamp (7.0) it saves fc1's output (the clamps' inputs) and the clamped cat (the fused kernel's input), 2i wide
    each; without, fc1's output alone. The analytic per-token expert term (megatron_activations._moe_terms) differs by
    exactly that per routed copy; under moe_act both sit inside the checkpointed activation and go."""
    torch = pytest.importorskip("torch")
    geglu = pytest.importorskip("megatron.core.fusions.fused_bias_geglu")
    from trainfit.analytic.megatron_activations import _moe_terms
    from trainfit.analytic.megatron_recompute import dropped

    spec, setup, _ = _run("mbridge-26.04.01-h100-80gb-gpt-oss-120b-bf16")
    m, rows = spec.moe, 8
    i = m.expert_intermediate

    def saved(clamp):
        fc1 = torch.randn(rows, 2 * i, dtype=torch.bfloat16, requires_grad=True) * 1.0
        probs = torch.rand(rows, 1, requires_grad=True)
        seen = {}

        def pack(t):
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            geglu.weighted_bias_quick_geglu_impl(fc1, None, probs, False, 1.0, clamp)
        return sum(seen.values())
    per_copy = (saved(m.swiglu_limit) - saved(None)) / rows
    assert per_copy == 2 * i * 2  # bf16
    plain = replace(spec, moe=replace(m, swiglu_limit=0.0))
    a = 2
    assert (_moe_terms(spec, setup, a)["expert_hidden"] - _moe_terms(plain, setup, a)["expert_hidden"]) \
        == m.top_k * per_copy
    split = {"expert_hidden": _moe_terms(spec, setup, a)["expert_hidden"]}
    kept = dropped(spec, setup, True, a, 0.0, {}, split)[1]["expert_hidden"]
    assert kept == m.top_k * a * 2 * i  # moe_act: fc1's output, the checkpoint's input, alone


def test_gpt_oss_yarn_scale_takes_megatrons_unfused_rotary():
    """Megatron-Bridge builds gpt-oss with YaRN factor 32 and yarn_mscale None: the concentration factor is
    0.1·ln 32 + 1 (yarn_rotary_pos_embedding.py:252-271), which TE's fused RoPE cannot take (rope_utils.py:279-284):
    q and k each run the unfused rotary, by hand 6 small table kernels + neg, cat, two muls, add, cat forward, and
    backward two muls, neg, the chunk's cat, the gradient sum and slice_backward's fill and copy (7). A Llama on the
    same stack keeps the one fused kernel each way."""
    import math

    spec, setup, _ = _run("mbridge-26.04.01-h100-80gb-gpt-oss-120b-bf16")
    assert spec.rope_attention_factor == pytest.approx(0.1 * math.log(32) + 1)
    sh, fwd, bwd = _layer(spec, setup)
    assert sh.rope == "megatron-unfused"
    for t in ("q", "k"):
        assert sum(o.kernels for o in fwd if o.name.startswith(f"{t}.rope")) == 6 + 6
        assert sum(o.kernels for o in bwd if o.name.startswith(f"{t}.rope")) == 7
    llama, lsetup, _ = _run("mbridge-25.11-b200-qwen3-235b-a22b-mxfp8")
    assert llama.rope_attention_factor == 1.0 and _layer(llama, lsetup)[0].rope == "fused"


@pytest.mark.heavy
def test_against_megatron_moe_layer_on_cpu():
    """megatron-core's real MoELayer (alltoall dispatcher, 4 experts, top-2; tests/analytic/megatron_moe_cpu.py)
    dispatches one matmul per expert per linear and pass, and synchronises the host once in the forward, never in
    the backward: the op list's GEMM launches of the same layer (router + fc1 + fc2 per expert; dgrad and wgrad of
    each) and the stack's host_sync fact agree. (SequentialMLP on CPU, TEGroupedMLP on GPU: both one GEMM per
    expert, experts.py and TE's cublaslt_gemm.cu:941-966.)"""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from trainfit.analytic.step_time import moe_host_syncs

    script = Path(__file__).with_name("megatron_moe_cpu.py")
    out = subprocess.run([sys.executable, str(script), "4", "2"], capture_output=True, text=True, timeout=300,
                         check=True).stdout.strip().splitlines()[-1]
    real = json.loads(out)
    spec, setup, _ = _run(RUN_C7)
    spec = replace(spec, moe=replace(spec.moe, num_experts=4, top_k=2))
    # (the CPU layer runs eager: C7's CUDA graphs of the router and preprocess, which launch no kernel of their own
    # in the op list, are not there)
    setup = replace(setup, ep=1, low_precision="none", fp8_all_gather=False, cuda_graph_scope=None)
    _, fwd, bwd = _layer(spec, setup)
    moe = ("router", "experts_in", "experts_out")
    assert sum(o.kernels for o in fwd if o.kind == "gemm" and o.name in moe) == real["mm_forward"] == 9
    assert sum(o.kernels for o in bwd if o.kind == "gemm" and o.name.split(".")[0] in moe) == real["mm_backward"]
    assert moe_host_syncs(spec, setup) and (real["syncs_forward"], real["syncs_backward"]) == (1, 0)


@pytest.mark.heavy
def test_routed_copy_saves_one_hidden_wide_tensor_on_cpu():
    """megatron-core's real MoELayer on CPU (tests/analytic/megatron_moe_cpu.py saved: 64 tokens, fp32, 4 experts,
    alltoall dispatcher): the bytes autograd saves, measured at hidden 64 and 128 for top-2 and top-3. The growth with
    the hidden size, per token, is (hidden-wide tensors per token) + k x (per routed copy); its change from top-2 to
    top-3 is the per-copy count: 1, fc1's input (the combine keeps no fc2 output: the probabilities are applied in
    the experts, token_dispatcher.py:833-840 unpermutes without them). The analytic layer's routed h-wide bytes
    per copy (megatron_activations._moe_terms) are that one tensor."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from trainfit.analytic.megatron_activations import layer_terms
    from trainfit.models.resolve import load_model
    from trainfit.setup import Setup

    script = Path(__file__).with_name("megatron_moe_cpu.py")
    tokens, h1, h2, fp32 = 64, 64, 128, 4
    per_token = {}
    for k in (2, 3):
        out = subprocess.run([sys.executable, str(script), "saved", "4", str(k), str(h1), str(h2)],
                             capture_output=True, text=True, timeout=300, check=True).stdout.strip().splitlines()[-1]
        b = json.loads(out)
        per_token[k] = (b[str(h2)] - b[str(h1)]) / ((h2 - h1) * tokens * fp32)
    assert per_token[3] - per_token[2] == pytest.approx(1.0)  # h-wide tensors per routed copy
    assert per_token[2] == pytest.approx(1.0 + 2 * 1.0)  # + the router's input, one per token
    spec = load_model("tiny-mixtral")
    setup = Setup(stack="megatron", precision="bf16-master", dp=4, ep=2, moe_imbalance=1.0)
    terms = layer_terms(spec, setup, moe=True)
    assert terms.split["expert_tokens"] / (spec.moe.top_k * 2 * spec.hidden) == pytest.approx(1.0)


def test_cuda_graph_scope_is_checked():
    """One line for what Megatron refuses (moe_preprocess without moe_router: transformer_config.py:1747-1750), an
    unknown scope, and a stack that does not run Megatron's graphs."""
    from trainfit.errors import SetupError
    from trainfit.setup import Setup

    for bad, words in (("moe_preprocess", "add moe_router"), ("mlp", "not a modelled"),
                       ("moe_router,moe_router", "twice")):
        with pytest.raises(SetupError, match=words):
            Setup(stack="megatron", precision="bf16-master", dp=8, ep=8, cuda_graph_scope=bad)
    with pytest.raises(SetupError, match="--cuda-graph-scope is not run by --stack hf"):
        Setup(stack="hf", precision="bf16", cuda_graph_scope="attn")


@pytest.mark.parametrize("etp", [1, 2])
def test_expert_and_router_shapes_follow_the_sequence_parallel_dispatch(etp):
    """Qwen3-30B-A3B (128 experts, top-8, hidden 2048, expert width 768) on TP 2 with sequence parallelism, EP 8,
    4,096 tokens, balanced: a rank holds 2,048 of them (moe_layer.py:379-383 runs MoE with TP only under sequence
    parallelism). By hand from megatron-core 0.16.1's alltoall dispatcher: the router (router.py:79-101) and the
    permute (token_dispatcher.py:637) read the rank's 2,048 tokens; after the all-to-all the expert-TP group gathers
    what its etp ranks received (:691-701), so each of the 128 / 8 = 16 local experts runs 2,048 · etp · 8 / 16 rows
    at 768 / etp of the width (TEGroupedMLP, experts.py:670, 748): the same FLOPs whatever etp."""
    from trainfit.api import load_spec
    from trainfit.setup import Setup

    spec = load_spec("qwen3-30b-a3b")
    assert (spec.moe.num_experts, spec.moe.top_k, spec.hidden, spec.moe.expert_intermediate) == (128, 8, 2048, 768)
    setup = Setup(stack="megatron", precision="bf16-master", seq=4096, tp=2, dp=8, ep=8, etp=etp,
                  sequence_parallel=True, moe_imbalance=1.0)
    _, fwd, _ = _layer(spec, setup)
    ops = {o.name: o for o in fwd}
    assert (ops["router"].m, ops["router"].n, ops["router"].k) == (2048, 128, 2048)
    assert ops["permute"].writes == 2048 * 8 * (2048 * 2 + 4)
    rows = 2048 * etp * 8 / 16
    assert (ops["experts_in"].m, ops["experts_in"].n, ops["experts_in"].k) == (rows, 2 * 768 / etp, 2048)
    assert (ops["experts_out"].m, ops["experts_out"].n, ops["experts_out"].k) == (rows, 2048, 768 / etp)


def test_expert_tp_gathers_other_ranks_sequences_without_tensor_parallelism():
    """TP 1, ETP 4 (Megatron allows expert_tensor_parallel_size != tensor_model_parallel_size): the four expert-TP
    ranks hold four different sequences (no sequence parallelism at tp 1), and the alltoall dispatcher gathers what
    they received over the expert-TP group whatever the sequence parallelism (megatron-core 0.16.1
    token_dispatcher.py:72-76 tp_group = expt_tp, :691-701 `if self.tp_size > 1: gather_from_sequence_parallel_region`):
    each of Qwen3-30B-A3B's 128 / 8 = 16 local experts runs 4,096 · 4 · 8 / 16 rows at 768 / 4 of the width, the
    same FLOPs as ETP 1. Before, the rows stayed 4,096 · 8 / 16 at 1/4 of the width (a quarter of the expert FLOPs:
    MFU above 100 %)."""
    from trainfit.api import load_spec
    from trainfit.setup import Setup

    spec = load_spec("qwen3-30b-a3b")
    per_rank = {}
    for etp in (1, 4):
        setup = Setup(stack="megatron", precision="bf16-master", seq=4096, dp=32, ep=8, etp=etp, moe_imbalance=1.0)
        _, fwd, _ = _layer(spec, setup)
        ops = {o.name: o for o in fwd}
        rows = 4096 * etp * 8 / 16
        assert (ops["experts_in"].m, ops["experts_in"].n, ops["experts_in"].k) == (rows, 2 * 768 / etp, 2048)
        assert (ops["experts_out"].m, ops["experts_out"].n, ops["experts_out"].k) == (rows, 2048, 768 / etp)
        per_rank[etp] = sum(2 * o.m * o.n * o.k * o.batch for o in fwd
                            if o.kind == "gemm" and o.name.startswith("experts_"))
    assert per_rank[4] == pytest.approx(per_rank[1])
