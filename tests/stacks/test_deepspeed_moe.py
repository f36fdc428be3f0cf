"""--stack deepspeed on an MoE model (its expert parallelism, AutoEP: tests/stacks/test_deepspeed_autoep.py): ZeRO-3's
gathered parameters (analytic/parallel/zero3_replay.py) against hand counts of transformers' modules and against
DeepSpeed's own coordinator on 2 CPU ranks (bench/targets/deepspeed_moe_cpu.py)."""
from __future__ import annotations

import pytest

from trainfit import stacks
from trainfit.analytic.params import count_params
from trainfit.analytic.parallel import zero3_replay
from trainfit.analytic.parallel.deepspeed import gathered_numel
from trainfit.models.resolve import load_model

# tiny-mixtral (catalog): hidden 256, intermediate 512, 4 experts, 2 layers, 8 heads x 32, 2 kv heads, vocab 2000,
# untied: by hand from transformers 5.24 modeling_mixtral.py
H, I, E, V, LAYERS = 256, 512, 4, 2000, 2
EXPERTS = E * 2 * I * H + E * H * I  # MixtralExperts.gate_up_proj (E, 2I, H) + down_proj (E, H, I)
ROUTER = E * H  # MixtralTopKRouter.weight (E, H)
TABLE = V * H  # embed_tokens, and lm_head (untied)
SMALL = {"stage3_max_reuse_distance": 0, "stage3_prefetch_bucket_size": 0, "stage3_param_persistence_threshold": 1000}


def _spec():
    spec = load_model("tiny-mixtral")
    return spec, count_params(spec)


def test_small_model_stays_gathered_whole_at_the_turn():
    """DeepSpeed's defaults keep a parameter gathered when it is used again within 1e9 elements of the trace: every
    partitioned parameter of a 4.5M-parameter model is (q/k/v/o, 65,536 elements at most, the router and the norms are
    at or under the 100,000-element persistence threshold: kept whole, not gathered). Measured by the coordinator
    probe: 4,169,728 on both ranks (bench/results/deepspeed_moe_cpu.md)."""
    spec, pc = _spec()
    assert gathered_numel(spec, pc, False, stacks.get_stack("deepspeed")) == 2 * TABLE + LAYERS * EXPERTS


def test_moe_block_is_gathered_whole_as_a_leaf():
    """No reuse distance and no prefetch: the most gathered at once is one module's own parameters. DeepSpeed makes
    MixtralSparseMoeBlock a leaf by default, so the router and every expert at once (measured: 1,573,888)."""
    spec, pc = _spec()
    assert gathered_numel(spec, pc, False, stacks.get_stack("deepspeed"), **SMALL) == ROUTER + EXPERTS


def test_experts_are_gathered_whole_without_a_leaf_too():
    """Without the leaf flag the experts module is still gathered whole: transformers keeps all experts in two 3-D
    parameters (not transformers 4's per-expert modules, of which only the routed ones would be fetched)."""
    spec, pc = _spec()
    model = zero3_replay.hf_model(spec, pc, leaf_moe=False)
    assert zero3_replay.replay(model, False, 1000, 0, 10**9, 0) == EXPERTS


def test_leaf_families_are_deepspeeds_default_classes():
    """stacks/deepspeed.toml [leaf_module] against DeepSpeed's own list (leaf_module_config.py:11-15)."""
    import ast
    import importlib.util
    from pathlib import Path

    found = importlib.util.find_spec("deepspeed")  # read, not imported (importing deepspeed takes seconds)
    if found is None:
        pytest.skip("deepspeed is not installed")
    source = Path(found.origin).parent / "runtime" / "zero" / "leaf_module_config.py"
    classes = next(ast.literal_eval(n.value) for n in ast.parse(source.read_text()).body
                   if isinstance(n, ast.AnnAssign) and getattr(n.target, "id", "") == "DEFAULT_LEAF_MODULE_CLASSES")
    families = {c.split(".")[2] for c in classes}  # transformers.models.<model_type>.modeling_<model_type>.<Class>
    assert families == set(stacks.get_stack("deepspeed").fact("leaf_module", "families"))


@pytest.mark.dist
@pytest.mark.slow
@pytest.mark.heavy  # ~12 s a DeepSpeed launch, eight of them
def test_replay_matches_deepspeeds_coordinator():
    """The most elements gathered at once in DeepSpeed's real ZeRO-3 step (2 CPU ranks), at its defaults and at knobs
    scaled so the tiny model is in a large one's regime (prefetch capped by max-live, reuse distance cut): equal,
    element for element."""
    pytest.importorskip("deepspeed")
    from bench.targets import deepspeed_cpu as ds
    from bench.targets import deepspeed_moe_cpu as moe

    spec, setup = ds.case("tiny-mixtral", 3, "bf16-master")
    for knobs, leaf in moe.CASES:
        ranks = moe.gather_probe(spec, setup, moe.probe_knobs(knobs, leaf))
        measured = max(r["gathered_max"] for r in ranks)
        assert moe.replayed(spec, knobs, leaf) == measured, (knobs, leaf, measured)
    # gpt-oss's and DeepSeek's blocks are no leaves; gpt-oss's expert biases are parameters of their own (persistent at
    # these knobs), DeepSeek's MLA is five modules with two persistent norms
    for model in moe.FAMILIES:
        spec, setup = ds.case(model, 3, "bf16-master")
        measured = max(r["gathered_max"] for r in moe.gather_probe(spec, setup, moe.FAMILY_KNOBS))
        assert moe.replayed(spec, moe.FAMILY_KNOBS, False) == measured, model


@pytest.mark.dist
@pytest.mark.slow
@pytest.mark.heavy  # ~12 s a DeepSpeed launch
def test_zero3_moe_step_on_cpu_matches_analytic():
    """tiny-mixtral under DeepSpeed's ZeRO-3 (the --emit deepspeed config), 2 CPU ranks: the peak within 2 %."""
    pytest.importorskip("deepspeed")
    from bench.targets import deepspeed_cpu as ds

    spec, setup = ds.case("tiny-mixtral", 3, "bf16-master")
    est = ds.analytic(spec, setup)
    ranks = ds.measure(spec, setup)
    assert est.peak == pytest.approx(max(r["peak"] for r in ranks), rel=0.02)
