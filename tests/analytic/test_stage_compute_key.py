"""The op lists' time memo (compute_time.cached_stage_compute) keys on the spec and the setup themselves: a model
fact the lists read (here GPT-2's dropouts, which add the dropout kernels) is a spec field, so two specs that differ
in it never share an entry. Fast (no torch)."""
from __future__ import annotations

from dataclasses import replace

from trainfit.analytic import compute_time
from trainfit.analytic.params import count_params
from trainfit.analytic.precision import state_bytes
from trainfit.api import load_spec
from trainfit.errors import SetupError
from trainfit.hardware import get_gpu
from trainfit.setup import Setup


def test_the_spec_identity_covers_its_kernel_facts():
    spec = load_spec("gpt2")
    quiet = replace(spec, dropouts=(0.0, 0.0, 0.0))
    assert spec.dropouts == (0.1, 0.1, 0.1)  # GPT2Config's defaults (configuration_gpt2.py:84-86)
    assert quiet != spec and replace(quiet) == quiet and hash(replace(quiet)) == hash(quiet)
    s, gpu = Setup(seq=1024, batch=4), get_gpu("H100-80GB")
    st, pc, layers = state_bytes(s), count_params(spec), (spec.layers,) * 3
    compute_time._CACHE.clear()
    a = compute_time.cached_stage_compute(spec, s, gpu, st, pc, layers)
    b = compute_time.cached_stage_compute(quiet, s, gpu, st, pc, layers)
    assert b.total.kernels < a.total.kernels  # no dropout kernels: not the first entry read back
    assert b == compute_time.stage_compute(quiet, s, gpu, st, pc, layers)


def fresh(*args):
    """stage_compute with nothing memoised (its layers' and ends' lists built and timed again)."""
    compute_time.clear_memos()
    return compute_time.stage_compute(*args)


def test_the_key_leaves_out_only_what_the_op_lists_never_read():
    """The memo keys every setup at dp 1, ZeRO 0, no --overlap-param-gather (compute_time.NOT_IN_OP_LISTS):
    stage_compute run on the setup itself and on that key setup, with the setup's own state bytes, times the same
    lists — at every ZeRO stage of each stack, FSDP2's mixed precision (torchtitan, hf at ZeRO 2/3 under amp-bf16)
    and MoE layers included."""
    from trainfit.plan.search import planned_setup

    gpu = get_gpu("H100-80GB")
    cases = [("llama-3.2-1b", "hf", "amp-bf16", {}), ("llama-3.2-1b", "torchtitan", "amp-bf16", {"tp": 2}),
             ("llama-3.2-1b", "deepspeed", "bf16-master", {}),
             ("qwen3-30b-a3b", "megatron", "bf16-master", {"ep": 4, "tp": 2, "sequence_parallel": True})]
    checked = set()
    for name, stack, prec, kw in cases:
        spec = load_spec(name)
        pc = count_params(spec)
        for zero in (0, 1, 2, 3):
            try:
                # Megatron's --overlap-param-gather (the planner's switch at ZeRO >= 1) schedules the DP exchange only
                gather = {"overlap_param_gather": True} if stack == "megatron" and zero else {}
                s = planned_setup(spec, seq=2048, batch=2, grad_accum=2, dp=4, zero=zero, stack=stack,
                                  precision=prec, **kw, **gather)
            except SetupError:
                continue  # a stage the stack does not run
            key = compute_time.op_list_setup(s)
            assert (key.dp, key.zero, key.overlap_param_gather) == (1, 0, False) and key != s
            st, layers = state_bytes(s), (spec.layers,) * 3
            assert fresh(spec, key, gpu, st, pc, layers) == fresh(spec, s, gpu, st, pc, layers)
            checked.add((stack, zero, st.param > 0))
    # every stack ran at least two stages, and FSDP2's param dtype was among them (torchtitan and hf ZeRO-3)
    assert {x for x, *_ in checked} == {"hf", "torchtitan", "deepspeed", "megatron"}
    assert ("torchtitan", 3, True) in checked and ("hf", 3, True) in checked and ("megatron", 0, False) in checked


def test_a_layers_lists_do_not_read_the_recompute_policy():
    """One memo entry of a layer's forward and backward (compute_time._timed_layer, keyed at --recompute none) serves
    every policy: built afresh under each policy, each stage's forward and backward are the same, only the recompute
    differs (none: nothing; full: the layers' forward again; selective, op: a part of it)."""
    from trainfit.plan.search import planned_setup

    gpu = get_gpu("H100-80GB")
    for name, stack, policies, kw in (
            ("qwen3-30b-a3b", "megatron", ("none", "selective", "full", "block:2"), {"ep": 4, "pp": 2, "grad_accum": 4}),
            ("llama-3.2-1b", "torchtitan", ("none", "op", "full"), {"compile": True})):
        spec = load_spec(name)
        pc = count_params(spec)
        got = {}
        for rec in policies:
            s = planned_setup(spec, seq=2048, batch=2, dp=4, stack=stack, recompute=rec, **kw)
            got[rec] = fresh(spec, s, gpu, state_bytes(s), pc, (spec.layers // s.pp,) * 3)
        none = got["none"]
        assert none.recompute.seconds == 0
        for rec, sc in got.items():
            assert (sc.forward, sc.backward, sc.attention_forward) == (none.forward, none.backward,
                                                                       none.attention_forward), rec
        # full: every layer re-runs its forward (the stage's forward has the embedding or the head besides)
        part = got["selective" if stack == "megatron" else "op"].recompute.seconds
        assert 0 < part < got["full"].recompute.seconds < none.forward.seconds


def test_the_lists_do_not_read_the_virtual_pipeline_but_under_block_recompute():
    """The memo keys --vpp at 1 except under block:N (compute_time.op_list_setup): stage_compute run afresh at each
    --vpp gives the same times under the other policies, and different ones under block:N, whose checkpointed layers
    are counted per model chunk (ops/derived.py checkpointed_layers)."""
    from trainfit.plan.search import planned_setup

    gpu, spec = get_gpu("H100-80GB"), load_spec("qwen3-30b-a3b")
    pc, layers = count_params(spec), (spec.layers // 2,) * 3
    for rec in ("none", "selective", "full", "block:4"):
        got = []
        for vpp in (2, 3, 4):
            s = planned_setup(spec, seq=2048, batch=2, dp=4, ep=4, pp=2, vpp=vpp, grad_accum=4, stack="megatron",
                              recompute=rec)
            key = compute_time.op_list_setup(s)
            assert key.vpp == (vpp if rec == "block:4" else 1)
            got.append(fresh(spec, s, gpu, state_bytes(s), pc, layers))
        assert (got[0] == got[1] == got[2]) is (rec != "block:4"), rec


def test_the_layers_lists_shared_by_recompute_policies_time_each_policy_as_alone():
    """stage_compute memoises its layers' lists on the setup with the recompute policy fixed (compute_time._LISTS):
    each policy and module set read after the others equals it computed with every memo emptied first."""
    from trainfit.plan.search import planned_setup

    gpu, spec = get_gpu("H100-80GB"), load_spec("qwen3-30b-a3b")
    pc, layers = count_params(spec), (spec.layers // 2,) * 3
    policies = [dict(recompute="none"), dict(recompute="full"), dict(recompute="selective"),
                dict(recompute="selective", recompute_modules="layernorm,moe_act")]
    setups = [planned_setup(spec, seq=2048, batch=2, grad_accum=4, dp=4, ep=4, pp=2, stack="megatron", **p)
              for p in policies]
    compute_time.clear_memos()
    warm = [compute_time.stage_compute(spec, s, gpu, state_bytes(s), pc, layers) for s in setups]
    assert len({w.recompute for w in warm}) == len(policies)  # each policy its own re-run
    for s, got in zip(setups, warm):
        assert got == fresh(spec, s, gpu, state_bytes(s), pc, layers)


def test_the_lists_do_not_read_the_moe_dispatcher():
    """The memo keys the MoE dispatcher (and its SMs) at the default (compute_time.NOT_IN_OP_LISTS): its exchanges
    are step_time's, so stage_compute run afresh under each dispatcher times the same lists — with and without the
    combined 1F1B schedule (--overlap-moe-comm, which the lists do read: its phases)."""
    from trainfit.plan.search import planned_setup

    gpu, spec = get_gpu("H100-80GB"), load_spec("qwen3-30b-a3b")
    pc, layers = count_params(spec), (spec.layers,) * 3
    for overlap in (False, True):
        got = []
        for how, sms in ((None, None), ("allgather", None), ("deepep", None), ("deepep", 32), ("hybridep", None)):
            if overlap and how == "allgather":
                continue  # (Megatron overlaps the alltoall and flex dispatchers only)
            s = planned_setup(spec, seq=2048, batch=2, dp=8, ep=8, grad_accum=4, stack="megatron",
                              moe_dispatcher=how, moe_dispatcher_sms=sms, overlap_moe_comm=overlap)
            key = compute_time.op_list_setup(s)
            assert (key.moe_dispatcher, key.moe_dispatcher_sms, key.overlap_moe_comm) == (None, None, overlap)
            got.append(fresh(spec, s, gpu, state_bytes(s), pc, layers))
        assert all(g == got[0] for g in got), overlap
        assert bool(got[0].combined_phases) is overlap  # (the schedule is read: not keyed away)


def test_a_dense_layer_is_timed_without_the_moe_fields():
    """_timed_layer keys a dense layer on its Shape with the MoE block's fields at their defaults (ops/shape.py
    without_moe): DeepSeek-V3's dense first layers, built fresh from the setup's own Shape at TP 2, EP 8, ETP 1 with a
    busiest-rank load, time and list the same as from the defaulted Shape — and its MoE layers do differ."""
    from trainfit.analytic.ops.shape import shape_of, without_moe

    spec, gpu = load_spec("deepseek-v3"), get_gpu("H100-80GB")
    s = Setup(stack="megatron", precision="bf16-master", seq=4096, batch=2, dp=16, tp=2, ep=8, etp=1,
              sequence_parallel=True)
    sh = shape_of(spec, s, state_bytes(s), "bf16")
    assert (sh.ep, sh.expert_tp, sh.moe_block) == (8, 1, "megatron") and without_moe(sh) != sh
    got = {}
    for shape in (sh, without_moe(sh)):
        for moe in (False, True):
            compute_time.clear_memos()
            fwd, tf, tb, *_ = compute_time._time_layer(spec, s, gpu, shape, moe, False, "")
            got[shape is sh, moe] = ([o.name for o in fwd], tf, tb)
    assert got[True, False] == got[False, False]
    assert got[True, True] != got[False, True]


def test_op_seconds_is_time_ops_of_each_op_to_the_bit():
    """compute_time.op_seconds (host_queue's per-kernel stream) equals time_ops(gpu, [op]).seconds for every op of an
    MoE layer's forward and backward, GEMMs, attention (fused and eager) and memory ops alike."""
    from trainfit.analytic import compute_time
    from trainfit.analytic.ops import shape_of
    from trainfit.analytic.precision import state_bytes
    from trainfit.analytic.timing import compute_dtype
    from trainfit.api import load_spec
    from trainfit.hardware import get_gpu
    from trainfit.plan.search import planned_setup

    spec = load_spec("qwen3-30b-a3b")
    kinds = set()
    for attention in ("flash", "eager"):
        setup = planned_setup(spec, stack="megatron", tp=2, dp=4, ep=4, sequence_parallel=True, batch=2, seq=2048,
                              precision="bf16-master", attention=attention)
        sh = shape_of(spec, setup, state_bytes(setup), compute_dtype(setup))
        fwd, bwd, _ = compute_time._layer_lists(spec, setup, sh, True)
        for gpu in (get_gpu("H100-80GB"), get_gpu("MI300X")):
            ops = fwd + bwd
            assert compute_time.op_seconds(gpu, ops) == [compute_time.time_ops(gpu, [o]).seconds for o in ops]
            kinds |= {o.kind for o in ops}
    assert {"gemm", "attention"} <= kinds and len(kinds) >= 3
