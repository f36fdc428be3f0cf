"""The planner's expert-parallel search (space.SEARCHED: ep, etp): the expert layouts it tries are the ones
Megatron-Core's own rank arithmetic accepts, the busiest rank's weights are what the layout leaves it, and the plan's
--emit megatron command builds megatron.core's configs and process-group layout."""
from __future__ import annotations

import pytest

from trainfit.api import load_spec
from trainfit.hardware import get_gpu
from trainfit.plan.emit import emit
from trainfit.plan.search import PlanQuery, search
from trainfit.plan.space import Layout, Where, variants

from tests.plan.test_emit_megatron import FIELDS, _configs, _parse
from tests.plan.test_one_verdict import assert_same, estimate_of, of_estimate, verdict

GiB = 2**30


def _megatron_expert_layout(world: int, tp: int, pp: int, cp: int, ep: int, etp: int | None) -> None:
    """megatron-core 0.16.1 parallel_state.py:775-818 (initialize_model_parallel's rank generators, default order
    tp-cp-ep-dp-pp), run as it is: RuntimeError / AssertionError where Megatron refuses the expert layout."""
    from megatron.core.parallel_state import RankGenerator

    dp = world // (tp * pp * cp)
    order = "tp-cp-ep-dp-pp"
    dense = RankGenerator(tp=tp, ep=1, dp=dp, pp=pp, cp=cp, order=order, rank_offset=0)
    etp = tp if etp is None else etp
    if world % (etp * ep * pp):
        raise RuntimeError("world_size is not divisible by expert_tensor_model_pipeline_parallel size")
    expert = RankGenerator(tp=etp, ep=ep, dp=world // (etp * ep * pp), pp=pp, cp=1, order=order, rank_offset=0)
    assert dense.get_ranks("pp") == expert.get_ranks("pp")


@pytest.mark.parametrize("dp,tp,pp,cp", [(4, 2, 2, 1), (2, 4, 1, 2), (16, 1, 1, 1)])
def test_searched_expert_layouts_are_megatrons(dp, tp, pp, cp):
    """Every (ep, etp) Megatron builds for the layout (its rank generators above; ep dividing the experts,
    moe_layer.py:101; etp dividing the expert width; the expert-TP group inside an 8-GPU node, the search's own
    bound, above tp too) is searched, and nothing else."""
    spec = load_spec("mixtral-8x7b")  # 8 experts, expert MLP width 14336
    world = dp * tp * pp * cp
    got = {(v.ep, v.etp) for v in variants(spec, Layout(dp, tp, pp, cp), Where(4096, 8), {"ep", "etp"})}
    want = set()
    for ep in range(1, world + 1):
        for etp in range(1, 9):
            if spec.moe.num_experts % ep or 8 % etp or spec.moe.expert_intermediate % etp:
                continue
            try:
                _megatron_expert_layout(world, tp, pp, cp, ep, etp)
            except (RuntimeError, AssertionError):
                continue
            want.add((ep, None if etp == tp else etp))
    assert got == want
    assert any(ep > 1 for ep, _ in got)
    assert any(etp is not None and etp > tp for _, etp in got) or world // tp < 2


def test_dense_models_search_no_expert_axes():
    spec = load_spec("llama-3.1-8b")
    assert {(v.ep, v.etp) for v in variants(spec, Layout(8, 2, 1), Where(4096, 8), {"ep", "etp"})} == {(1, None)}


def test_splitting_the_experts_makes_mixtral_fit_tp2_pp2():
    """Mixtral 8x7B on 16 H100-80GB at TP 2 × PP 2 (DP 4). Hand derivation (Megatron's bf16 weights, fp32 main-grad
    buffer, fp32 main params + Adam states sharded over DP 4 by the distributed optimizer): at EP 1 a rank holds 1/4
    of the 46.7B parameters, 11.68B × (2 + 4 + 12/4) bytes = 97.9 GiB > 80 GB: no plan fits that does not split
    the experts further than tp, by expert parallelism or an expert TP above tp (under that optimizer, --zero 1;
    Megatron-FSDP's --zero 3 shards the weights too). The plan found splits the experts, and its busiest rank's
    bf16 weights are what EP × ETP leaves it: 16 layers ×
    (attention/tp + experts/(ep·etp)) + the vocab-parallel embedding (or head)/tp."""
    spec = load_spec("mixtral-8x7b")
    ep1_bytes = 46_702_792_704 / 4 * (2 + 4 + 12 / 4)
    assert ep1_bytes > 80e9
    r = search(spec, get_gpu("H100-80GB"), PlanQuery(gpus=16, seq=4096, global_batch_tokens=2**20,
                                                     stacks=("megatron",), tp=2, pp=2, top=3, zeros=(1,)))
    assert r.candidates
    for c in r.candidates:
        s = c.setup
        assert s.ep * s.expert_tp > s.tp and c.estimate.time.fits
        attention, experts, embedding = 41_943_040, 8 * 176_160_768, 32_000 * 4096  # mixtral-8x7b config.json
        hand = 2 * (16 * (attention / 2 + experts / (s.ep * s.expert_tp)) + embedding / 2)
        assert c.estimate.memory.weights == pytest.approx(hand, rel=0.01)
        # and `trainfit estimate` with the plan's settings (--ep, --etp included) answers the same verdict
        e = estimate_of("mixtral-8x7b", s, gpu="H100-80GB")
        assert e.setup == s
        assert_same(verdict(c.time.step_seconds, c.time.tokens_per_second, c.peak, c.estimate.memory.reserved,
                            c.estimate.memory.device_total, c.estimate.memory.required, c.headroom,
                            c.estimate.time.fits), of_estimate(e), f"ep {s.ep} etp {s.etp}")


def test_moe_plan_emits_megatron_expert_flags():
    """The planner's MoE candidates, emitted with --emit megatron, build TransformerConfig (its __post_init__ checks)
    with the planned expert layout, and Megatron's rank generators accept it."""
    spec = load_spec("qwen3-30b-a3b")
    r = search(spec, get_gpu("H100-80GB"), PlanQuery(gpus=16, seq=4096, global_batch_tokens=2**20,
                                                     stacks=("megatron",), tp=2, pp=1, top=20))
    assert any(c.setup.ep > 1 for c in r.candidates) and any(c.setup.etp == 1 for c in r.candidates)
    assert "--expert-tensor-parallel-size" in FIELDS and "--moe-ffn-hidden-size" in FIELDS
    for c in r.candidates:
        s = c.setup
        a = _parse(emit("megatron", s, spec, 8))
        tc, _, _ = _configs(a)
        assert (tc.expert_model_parallel_size, tc.expert_tensor_parallel_size) == (s.ep, s.expert_tp)
        assert (tc.num_moe_experts, tc.moe_ffn_hidden_size, tc.moe_router_topk) == (128, 768, 8)  # config.json
        _megatron_expert_layout(s.world_size, s.tp, s.pp, s.cp, s.ep, s.etp)


def test_nothing_fits_diagnosis_shards_the_experts():
    """Mixtral 8x7B on 2 H100s: nothing fits (46.7B × 2 bytes of bf16 weights alone are 93 GB over 2 × 80 GB with
    the fp32 main grads beside them). The diagnosis's leanest plan splits the experts over every rank of its stage
    that Megatron's expert layout allows (ep · etp = dp · cp · tp), and names it."""
    spec = load_spec("mixtral-8x7b")
    assert 46_702_792_704 * (2 + 4) / 2 > 80e9
    r = search(spec, get_gpu("H100-80GB"), PlanQuery(gpus=2, seq=4096, stacks=("megatron",)))
    assert not r.candidates
    s = r.diagnosis.leanest_setup
    assert s.ep * s.expert_tp == s.dp * s.cp * s.tp
    assert (f"ep {s.ep}, " in r.diagnosis.message) == (s.ep > 1)


@pytest.mark.parametrize("model, sets", [
    # Qwen3-30B-A3B: routed experts only, GQA attention -> the MoE recipes' sets, no MLA or shared-expert ones
    ("qwen3-30b-a3b", [None, "moe_act", "layernorm,moe_act", "layernorm,moe"]),
    # DeepSeek-V3: MLA and dense leading layers too -> every recipe set of stacks/megatron.toml [plan]
    ("deepseek-v3", [None, "moe_act", "layernorm,moe_act", "layernorm,moe", "mla_up_proj", "mla_up_proj,mlp"]),
    # a dense GQA model under Transformer Engine: its norms are fused into the linears, no MoE or MLA: the default
    ("llama-3.1-8b", [None]),
])
def test_recompute_module_sets_are_the_ones_the_model_has(model, sets):
    from trainfit.plan.space import recompute_module_sets
    assert recompute_module_sets(load_spec(model), "megatron") == sets
    assert recompute_module_sets(load_spec(model), "torchtitan") == [None]  # no --recompute-modules there


def test_plan_searches_selective_recompute_modules_and_keeps_them():
    """Each module set is a group of its own under selective (none and full have one each), and a plan that uses a
    set carries it, as `trainfit estimate --recompute-modules` takes it."""
    spec, gpu = load_spec("tiny-mixtral"), get_gpu("H100-80GB")
    q = PlanQuery(gpus=4, seq=2048, global_batch_tokens=2**16, stacks=("megatron",), top=40)
    r = search(spec, gpu, q)
    d = r.stats["stacks"]["megatron"]
    assert d["recompute_modules"] == [None, "moe_act", "layernorm,moe_act", "layernorm,moe"]
    kinds = {(c.setup.recompute, c.setup.recompute_modules) for c in r.candidates}
    assert any(m for _, m in kinds), kinds  # the top 40 of a tiny model hold every policy; some with modules
    for c in r.candidates:
        if c.setup.recompute_modules:
            assert c.setup.recompute == "selective"
            e = estimate_of("tiny-mixtral", c.setup, gpu="H100-80GB")
            assert e.setup.recompute_modules == c.setup.recompute_modules
            assert e.time.step_seconds == pytest.approx(c.time.step_seconds, rel=1e-9)


def test_torchtitan_plans_search_etp_tp_once_each():
    """torchtitan runs expert_tensor_parallel_degree 1 (its default) or tp (parallel_dims.py:58-59). The search's
    etp None is tp's degree (space._etps), which a torchtitan Setup without --etp runs as 1: etp = tp was never
    searched, and each EP layout was listed twice, as "(ep4)" and "(ep4, etp1)", with the same numbers. Now the
    layout says --etp tp there (Layout.settings), so both degrees are searched, each once, and a plan's setup is
    the one it names."""
    r = search(load_spec("qwen3-30b-a3b"), get_gpu("H100-80GB"),
               PlanQuery(gpus=16, seq=4096, global_batch_tokens=2**20, stacks=("torchtitan",), tp=2, zeros=(3,),
                         top=200))
    ep = [c.setup for c in r.candidates if c.setup.ep > 1]
    assert {s.expert_tp for s in ep} == {1, 2}
    assert {s.etp for s in ep} == {1, 2}  # said, not left to the stack's default
    runs = [(s.dp, s.pp, s.ep, s.expert_tp, s.recompute, s.batch, s.grad_accum) for s in ep]
    assert len(runs) == len(set(runs))


def test_torchtitan_plans_search_no_expert_tp_without_expert_parallelism():
    """torchtitan's expert_tensor_parallel_degree has no effect without expert parallelism (0.2.2 config/
    job_config.py:464-472): with no ep mesh the experts are tensor-parallel over the tp mesh (models/llama4/infra/
    parallelize.py:559-562, `experts_mesh = tp_mesh`). The search listed each tp > 1 layout at ep 1 twice, as
    "8×2×1 (sp)" and "8×2×1 (sp, etp1)", with the same numbers; now once, without --etp."""
    r = search(load_spec("qwen3-30b-a3b"), get_gpu("H100-80GB"),
               PlanQuery(gpus=16, seq=4096, global_batch_tokens=2**20, stacks=("torchtitan",), tp=2, zeros=(3,),
                         top=200))
    dense = [c.setup for c in r.candidates if c.setup.ep == 1]
    assert dense and all(s.etp is None for s in dense)
    runs = [(s.dp, s.pp, s.recompute, s.batch, s.grad_accum) for s in dense]
    assert len(runs) == len(set(runs))
    # Megatron's expert_tensor_parallel_size applies at ep 1 too (its experts' own TP group): still searched
    m = search(load_spec("qwen3-30b-a3b"), get_gpu("H100-80GB"),
               PlanQuery(gpus=16, seq=4096, global_batch_tokens=2**20, stacks=("megatron",), tp=2, zeros=(1,),
                         top=200))
    assert {c.setup.etp for c in m.candidates if c.setup.ep == 1} > {None}
