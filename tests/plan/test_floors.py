"""The search's bound memo (plan/floors.py) shares one step_floor among a layout's ZeRO stages of the same state bytes:
step_floor run on the setup at each ZeRO stage gives one bound per state bytes (its compute, TP/PP/CP/EP exchanges,
bubble and stragglers read no ZeRO setting; FSDP2's mixed precision, on at hf's ZeRO 2/3 under amp-bf16, changes the
state bytes, which the key holds), and the memo hands back step_floor's own value. Fast (no torch)."""
from __future__ import annotations

from trainfit.analytic import compute_time
from trainfit.analytic.params import count_params
from trainfit.analytic.precision import state_bytes
from trainfit.analytic.step_time import step_floor
from trainfit.api import load_spec
from trainfit.errors import SetupError
from trainfit.hardware import get_gpu
from trainfit.plan.floors import Floors, tokens_bound
from trainfit.plan.search import planned_setup


def test_the_bound_is_the_same_at_every_zero_stage():
    gpu = get_gpu("H100-80GB")
    cases = [("qwen3-30b-a3b", "megatron", "bf16-master", dict(tp=2, ep=4, sequence_parallel=True,
                                                                tp_comm_overlap=True, pp=2, grad_accum=4)),
             ("llama-3.2-1b", "hf", "amp-bf16", {}), ("llama-3.2-1b", "torchtitan", "amp-bf16", {"tp": 2}),
             ("llama-3.2-1b", "deepspeed", "bf16-master", {})]
    for name, stack, prec, kw in cases:
        spec = load_spec(name)
        pc = count_params(spec)
        floors = Floors(spec, gpu, pc)
        bounds: dict = {}
        runs = 0
        for zero in (0, 1, 2, 3):
            try:
                gather = {"overlap_param_gather": True} if stack == "megatron" and zero else {}  # (plan_switches)
                s = planned_setup(spec, seq=2048, batch=2, dp=4, zero=zero, stack=stack, precision=prec,
                                  **{"grad_accum": 2, **kw, **gather})
            except SetupError:
                continue  # a stage the stack does not run
            runs += 1
            compute_time.clear_memos()
            fresh = step_floor(spec, s, gpu, pc, state_bytes(s))
            assert floors(s, state_bytes(s)) == fresh
            bounds.setdefault(state_bytes(s), set()).add(fresh)
        assert sum(map(len, bounds.values())) == len(bounds), (name, stack, bounds)
        if stack == "megatron":  # its four stages keep the same state bytes: one bound for all of them
            assert runs == 4 and len(bounds) == 1


def test_the_bound_without_exchanges_is_below_every_dispatcher_and_schedule():
    """Floors.without_exchanges, the one bound a group's TIMED assignments share at a micro-batch (plan/search.py):
    step_floor with the expert exchanges left out, at or below the floor (and so the step time) of every dispatcher
    and --overlap-moe-comm the stack runs there — and strictly below them where there is an exchange to leave out."""
    from trainfit.analytic.step_time import layout_step_time

    gpu, spec = get_gpu("H100-80GB"), load_spec("qwen3-30b-a3b")
    pc = count_params(spec)
    floors = Floors(spec, gpu, pc)
    for lay in (dict(dp=16, ep=16), dict(dp=8, tp=2, ep=8, sequence_parallel=True),
                dict(dp=8, pp=2, vpp=2, ep=8, grad_accum=8)):
        lay = {"grad_accum": 4, **lay}
        base = planned_setup(spec, seq=4096, batch=2, stack="megatron", precision="bf16-master", zero=1,
                             recompute="selective", **lay)
        shared = floors.without_exchanges(base, state_bytes(base))
        ran = 0
        for how in (None, "allgather", "deepep", "hybridep"):
            for overlap in (False, True):
                try:
                    s = base.with_(moe_dispatcher=how, overlap_moe_comm=overlap)
                except SetupError:
                    continue  # (Megatron overlaps the alltoall and flex dispatchers only)
                ran += 1
                own = step_floor(spec, s, gpu, pc, state_bytes(s))
                assert shared < own <= layout_step_time(spec, s, gpu, None, pc).step_seconds, (lay, how, overlap)
        assert ran == 7, lay


def test_the_bound_with_nothing_recomputed_is_below_every_policy():
    """Floors.below_every_policy, the bound every recompute group of a layout shares at a split (plan/search.py
    COARSE entries): at or below the bound without exchanges of each policy and module set the stacks run there (and
    so below each one's own floor), with TP (and its overlap), pipelines, CP, experts and a TE recipe — strictly
    below where the policy re-runs anything."""
    gpu = get_gpu("H100-80GB")
    cases = [("qwen3-30b-a3b", "megatron", dict(tp=2, ep=4, sequence_parallel=True, tp_comm_overlap=True, pp=2,
                                                 grad_accum=4)),
             ("qwen3-30b-a3b", "megatron", dict(ep=4, grad_accum=2, overlap_moe_comm=True)),
             ("llama-3.1-8b", "megatron", dict(tp=4, cp=2, sequence_parallel=True, pp=2, vpp=2, grad_accum=4,
                                               low_precision="tensorwise", fp8_all_gather=True, zero=1)),
             ("llama-3.2-1b", "torchtitan", dict(tp=2, grad_accum=2)),
             ("llama-3.2-1b", "hf", {})]
    policies = {"megatron": ["none", "full", "uniform:2", "block:2", *(("selective", m) for m in (
                    None, "core_attn", "layernorm,moe_act", "mlp", "moe", "layernorm,core_attn,mlp"))],
                "torchtitan": ["none", "op", "full", "layer:2"], "hf": ["none", "selective", "full"]}
    for name, stack, kw in cases:
        spec = load_spec(name)
        floors = Floors(spec, gpu, count_params(spec))
        prec = "amp-bf16" if stack in ("hf", "torchtitan") else "bf16-master"
        ran = strict = 0
        for policy in policies[stack]:
            rec, mods = policy if isinstance(policy, tuple) else (policy, None)
            try:
                s = planned_setup(spec, seq=4096, batch=2, dp=4, stack=stack, precision=prec, recompute=rec,
                                  **({"recompute_modules": mods} if mods else {}), **kw)
            except SetupError:
                continue  # (a module the model has not, or a policy the layout refuses)
            ran += 1
            st = state_bytes(s)
            shared, own = floors.below_every_policy(s, st), floors.without_exchanges(s, st)
            assert shared <= own <= floors(s, st), (name, stack, policy)
            strict += shared < own
        assert ran >= 2 and strict >= 1, (name, stack, ran, strict)


def test_the_bound_from_the_layers_is_below_the_shared_one():
    """Floors.of_layers, every split's first bound (plan/search.py LAYERS entries): at or below below_every_policy's
    (the stage's own lists, ends, MTP and collectives) on the layouts the planner searches — even and uneven
    pipelines (Megatron's first:N,last:M), interleaving, TP with its overlap, CP, experts, MTP layers, a TE recipe,
    a tied head with and without a pipeline — and within 15 % of it (a bound that loose prunes nothing); None under
    --efficiency (the flat override) and where the stage is not its layers × one layer (bf16 first/last layers)."""
    gpu = get_gpu("H100-80GB")
    cases = [("qwen3-30b-a3b", "megatron", dict(tp=2, ep=4, sequence_parallel=True, tp_comm_overlap=True, pp=2,
                                                 grad_accum=4)),
             ("deepseek-v3", "megatron", dict(ep=8, pp=16, pp_split="first:3,last:2", grad_accum=32, dp=64)),
             ("deepseek-v3", "megatron", dict(ep=8, pp=8, vpp=2, pp_split="first:7,last:6", grad_accum=16, dp=16,
                                              tp=8, sequence_parallel=True)),
             ("llama-3.1-8b", "megatron", dict(tp=4, cp=2, sequence_parallel=True, pp=2, vpp=2, grad_accum=4,
                                               low_precision="tensorwise", fp8_all_gather=True, zero=1)),
             ("llama-3.2-1b", "torchtitan", dict(tp=2, grad_accum=2)), ("llama-3.2-1b", "torchtitan", dict(pp=2)),
             ("llama-3.2-1b", "hf", {})]
    for name, stack, kw in cases:
        spec = load_spec(name)
        floors = Floors(spec, gpu, count_params(spec))
        prec = "amp-bf16" if stack in ("hf", "torchtitan") else "bf16-master"
        s = planned_setup(spec, seq=4096, batch=2, stack=stack, precision=prec, **{"dp": 4, **kw})
        st = state_bytes(s)
        first, shared = floors.of_layers(s, st), floors.below_every_policy(s, st)
        assert first is not None and 0.85 * shared < first <= shared, (name, kw, first, shared)
    s = planned_setup(load_spec("llama-3.1-8b"), seq=4096, stack="megatron", precision="bf16-master", pp=2,
                      low_precision="tensorwise", bf16_first_layers=1)
    assert Floors(load_spec("llama-3.1-8b"), gpu, count_params(load_spec("llama-3.1-8b"))).of_layers(
        s, state_bytes(s)) is None
    spec = load_spec("llama-3.2-1b")
    flat = Floors(spec, gpu, count_params(spec), efficiency=0.4)
    s = planned_setup(spec, seq=4096)
    assert flat.of_layers(s, state_bytes(s)) is None


def test_the_splits_floors_are_each_splits_own():
    """Floors.of_splits bounds a layout's splits together (step_time.layer_floors: the key, the stages and the links
    worked out once, each split's layer parts looked up at its own micro-batch and, under a TE recipe, accumulation):
    each bound is tokens_bound of layer_floor run on that split's own setup from empty memos."""
    from trainfit.analytic.step_time import layer_floor

    gpu = get_gpu("H100-80GB")
    cases = [("qwen3-30b-a3b", "megatron", dict(tp=2, ep=4, sequence_parallel=True, pp=2, grad_accum=4)),
             ("llama-3.1-8b", "megatron", dict(tp=2, sequence_parallel=True, pp=2, vpp=2, grad_accum=4,
                                               low_precision="tensorwise", fp8_all_gather=True, zero=1)),
             ("llama-3.2-1b", "torchtitan", dict(tp=2, grad_accum=2))]
    for name, stack, kw in cases:
        spec = load_spec(name)
        pc = count_params(spec)
        prec = "amp-bf16" if stack == "torchtitan" else "bf16-master"
        s = planned_setup(spec, seq=4096, batch=1, stack=stack, precision=prec, **{"dp": 4, **kw})
        st = state_bytes(s)
        splits = [(1, 8), (2, 4), (4, 2), (3, 4)]  # (accumulations 8, 4, 2: under the TE recipe each its own casts)
        compute_time.clear_memos()
        got = Floors(spec, gpu, pc).of_splits(s, st, splits)
        for (neg, b, accum, layers), (sb, sa) in zip(got, splits):
            x = s.with_micro_batches(sb, sa)
            compute_time.clear_memos()
            assert (b, accum, layers) == (sb, sa, True)
            assert -neg == tokens_bound(x, layer_floor(spec, x, gpu, pc, st)), (name, b, accum)


def test_a_whole_layer_policy_bounds_with_its_re_run():
    """Under a policy that re-runs whole layers (full, layer:N, uniform:N, block:N) a split's first bound adds each
    stage's checkpointed layers' re-run (Floors.of_splits with `rerun`: step_time.layer_floors): still at or below the
    policy's own floor without the expert exchanges (Floors.without_exchanges, which stage_compute's recompute term
    is part of), and above the bound without a re-run (below_every_policy's side): the groups of those policies
    enter the search with it. Selective's stays the bound without a re-run."""
    gpu = get_gpu("H100-80GB")
    cases = [("deepseek-v3", "megatron", "full", dict(ep=8, pp=16, pp_split="first:3,last:2", grad_accum=32, dp=64)),
             ("qwen3-30b-a3b", "megatron", "full", dict(tp=2, ep=4, sequence_parallel=True, pp=2, vpp=2,
                                                        grad_accum=4)),
             ("llama-3.1-8b", "megatron", "uniform:2", dict(tp=2, sequence_parallel=True, pp=2, grad_accum=4)),
             ("llama-3.1-8b", "megatron", "block:3", dict(pp=4, vpp=2, grad_accum=8)),
             ("llama-3.2-1b", "torchtitan", "layer:2", dict(tp=2, grad_accum=2)),
             ("llama-3.2-1b", "hf", "full", {})]
    for name, stack, policy, kw in cases:
        spec = load_spec(name)
        floors = Floors(spec, gpu, count_params(spec))
        prec = "amp-bf16" if stack in ("hf", "torchtitan") else "bf16-master"
        s = planned_setup(spec, seq=4096, batch=2, stack=stack, precision=prec, recompute=policy, **{"dp": 4, **kw})
        st = state_bytes(s)
        split = [(s.batch, s.grad_accum)]
        with_rerun = -floors.of_splits(s, st, split, rerun=True)[0][0]
        without = -floors.of_splits(s, st, split)[0][0]
        own = floors.without_exchanges(s, st)
        assert tokens_bound(s, own) <= with_rerun < without, (name, policy, own, with_rerun, without)
    s = planned_setup(load_spec("llama-3.1-8b"), seq=4096, stack="megatron", precision="bf16-master",
                      recompute="selective", dp=4)
    floors = Floors(load_spec("llama-3.1-8b"), gpu, count_params(load_spec("llama-3.1-8b")))
    st = state_bytes(s)
    assert floors.of_splits(s, st, [(1, 1)], rerun=True) == floors.of_splits(s, st, [(1, 1)])
