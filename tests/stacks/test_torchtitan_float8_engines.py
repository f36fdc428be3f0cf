"""--low-precision on --stack torchtitan in the trace and measure engines (trainfit/step/torchtitan_lowp.py): torchao's
Float8Linear as torchtitan's Float8LinearConverter applies it, checked against independent sources:
  * the real step on CPU tensors (real fp8 GEMMs: torch._scaled_mm runs on CPU), its peak from c10's allocation
    records (trainfit.measure), for each recipe, precision and recompute policy; and 2 torchrun+gloo ranks of FSDP2;
  * a hand count: under autocast nn.Linear keeps a bf16 copy of each weight for backward, Float8Linear none (it
    casts the fp32 weight to fp8 itself: torchao float8/float8_linear.py:256-272).
"""
from __future__ import annotations

import importlib

import pytest

try:
    importlib.import_module("torchao.float8")
    importlib.import_module("torchtitan.models.llama3")
except Exception as e:  # pragma: no cover - depends on the environment
    pytest.skip(f"torchtitan and torchao are needed ({type(e).__name__}: {e})", allow_module_level=True)

from trainfit import engines
from trainfit.errors import EngineUnavailableError
from trainfit.models.hf_config import spec_from_config
from trainfit.setup import Setup

# dim 64, FFN 176, GQA 4/2 heads: every projection's dims are multiples of 16, so all seven are converted
TINY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 256}
TOL = 0.005  # DESIGN.md §5


def spec(layers: int = 4):
    return spec_from_config({**TINY, "num_hidden_layers": layers}, f"tt-f8-{layers}")


def setup(**kw) -> Setup:
    return Setup(**{"stack": "torchtitan", "batch": 2, "seq": 128, "device": "cpu", "low_precision": "tensorwise",
                    **kw})


@pytest.fixture
def float8_recipes(monkeypatch):
    """The Float8Linear recipes the step runs, as stacks/torchtitan.toml will list them beside tensorwise."""
    from trainfit.stacks import get_stack
    from trainfit.step.torchtitan_lowp import FLOAT8

    monkeypatch.setitem(get_stack("torchtitan").facts["low_precision"], "recipes", list(FLOAT8))


# -- refusals, one line each -------------------------------------------------------------------------------
def test_what_the_engines_cannot_run_is_refused_in_one_line(float8_recipes):
    with pytest.raises(EngineUnavailableError) as e:
        engines.trace(spec(), setup(low_precision="rowwise_with_gw_hp", precision="amp-bf16"))
    assert "CUDA autocast only" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("recipe,words", [("mxfp8", "SM100"), ("nvfp4", "no NVFP4")])
def test_mx_and_nvfp4_are_refused_with_the_reason(recipe, words):
    from trainfit.step.torchtitan_lowp import check

    with pytest.raises(EngineUnavailableError) as e:
        check(_unchecked(recipe))
    assert words in str(e.value) and "\n" not in str(e.value)


def _unchecked(recipe: str):
    """The fields `check` reads, with a recipe stacks/torchtitan.toml does not list (Setup refuses it first for the
    user, naming the stacks that run it)."""
    from types import SimpleNamespace

    return SimpleNamespace(low_precision=recipe, device="cpu", fp8_all_gather=False)


def test_the_converter_swaps_what_module_filter_fn_keeps():
    """torchtitan's filter: the stack's "output" plus --bf16-first/last-layers blocks (with a trailing dot, so that
    layers.1 does not also keep layers.10 in bf16)."""
    from trainfit.step.torchtitan import build

    model = build(spec(layers=4), setup(bf16_first_layers=1, bf16_last_layers=1), device="meta", fake=True)
    kinds = {name: type(m).__name__ for name, m in model.named_modules() if name.endswith(("wq", "w2", "output"))}
    assert kinds["output"] == "Linear"
    assert [kinds[f"layers.{i}.attention.wq"] for i in range(4)] == ["Linear", "Float8Linear", "Float8Linear",
                                                                       "Linear"]
    assert kinds["layers.2.feed_forward.w2"] == "Float8Linear"


# -- the trace against the real CPU step -------------------------------------------------------------------
def _vs_real(s: Setup):
    from trainfit.measure import measure
    from trainfit.trace.engine import trace_spec

    est = trace_spec(spec(), s, extrapolate=False)
    real = measure(spec(), s, steps=0, warmup=1)
    err = (est.memory.peak - real.peak) / real.peak
    assert abs(err) <= TOL, f"trace {est.memory.peak} vs real {real.peak} ({err:+.3%})"
    assert abs(est.memory.activations - real.activations) <= TOL * real.activations
    return est


@pytest.mark.heavy  # ~20 s cold (the real step under the profiler): the heavy tier's first case
def test_tensorwise_trace_matches_the_real_cpu_step():
    est = _vs_real(setup(precision="bf16", recompute="op"))
    # the fp8 copies are the wrapper's inner tensors, recorded as temporaries (never weights)
    assert est.memory.weights == engines.trace(spec(), setup(low_precision="none", precision="bf16",
                                                              recompute="op")).memory.weights


CASES = [(lp, p, r) for lp in ("tensorwise", "rowwise", "rowwise_with_gw_hp") for p in ("fp32", "amp-bf16", "bf16")
         for r in ("none", "op") if not (lp == "rowwise_with_gw_hp" and p == "amp-bf16")]


@pytest.mark.heavy  # 16 real steps (~2 min)
@pytest.mark.parametrize("recipe,precision,recompute", CASES)
def test_every_recipe_matches_the_real_cpu_step(float8_recipes, recipe, precision, recompute):
    _vs_real(setup(low_precision=recipe, precision=precision, recompute=recompute))


@pytest.mark.heavy  # a torchrun launch of 2 gloo ranks (~1 min)
@pytest.mark.dist
def test_fsdp2_rank_matches_each_measured_rank():
    import torch.distributed as dist

    from trainfit.measure.distributed import measure_distributed_many
    from trainfit.trace.distributed import trace_distributed

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is needed for the 2-process CPU run")
    setups = [setup(dp=2, zero=3, recompute=r, fp8_all_gather=ag) for r in ("none", "op") for ag in (False, True)]
    # FSDP2 over gloo: a collective's buffer is freed when gloo's worker thread completes it, so one more group's
    # gathered [norm, output] bf16 parameters can still be alive at a measured peak (seen here: +65,660 B on one
    # rank with the fp8 all-gather); the trace cannot time that race (test_torchtitan_engines.py _two_ranks)
    race = (TINY["vocab_size"] * TINY["hidden_size"] + TINY["hidden_size"]) * 2
    for s, ranks in zip(setups, measure_distributed_many(spec(), setups, 2, steps=0, warmup=2)):
        traced = trace_distributed(spec(), s).memory.peak
        assert all(-TOL * r.peak <= r.peak - traced <= TOL * r.peak + race for r in ranks), (
            s.recompute, s.fp8_all_gather, traced, [r.peak for r in ranks])


# -- a GPU's autocast, by hand -----------------------------------------------------------------------------
def test_cuda_trace_float8linear_keeps_no_bf16_weight_copies():
    """One rank under autocast on a GPU: nn.Linear saves autocast's cached bf16 copy of its weight for backward;
    Float8Linear casts its input to the autocast dtype and the fp32 weight straight to fp8, saving the input and the
    fp32 parameter. With the inputs saved in bf16 either way, the saved bytes differ by exactly the bf16 copies of
    the converted weights: 2 bytes per parameter of the seven projections."""
    s = spec(layers=2)
    kw = dict(device="cuda", precision="amp-bf16", recompute="none")
    plain = engines.trace(s, setup(low_precision="none", **kw), extrapolate=False, flops=False).memory.activations
    fp8 = engines.trace(s, setup(**kw), extrapolate=False, flops=False).memory.activations
    h, kv, f = s.hidden, s.kv_heads * s.head_dim, s.intermediate
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * f  # wq, wo; wk, wv; w1, w2, w3
    assert plain - fp8 == 2 * per_layer * s.layers


def test_analytic_counts_no_autocast_copies_of_the_converted_weights():
    """The analytic engine's saved bytes drop by what the trace's do (the test above): under amp-bf16 on one rank,
    Float8Linear's weights have no autocast bf16 copy."""
    s = spec(layers=2)
    kw = dict(device="cuda", precision="amp-bf16", recompute="none")
    traced = [engines.trace(s, setup(low_precision=lp, **kw), extrapolate=False, flops=False).memory.activations
              for lp in ("none", "tensorwise")]
    analytic = [engines.analytic(s, setup(low_precision=lp, **kw)).memory.activations
                for lp in ("none", "tensorwise")]
    assert analytic[0] - analytic[1] == traced[0] - traced[1]


def test_measure_refuses_compile_it_does_not_apply():
    """trainfit's torchtitan step builds the model without torchtitan's apply_compile: --compile is refused in one
    line rather than measured eager."""
    from trainfit.errors import EngineUnavailableError

    with pytest.raises(EngineUnavailableError, match="--compile") as e:
        engines.measure(spec(layers=2), setup(low_precision="none", device="cpu", compile=True))
    assert "\n" not in str(e.value)
