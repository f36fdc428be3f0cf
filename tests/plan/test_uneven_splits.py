"""Megatron's first:N,last:M pipeline splits in the planner's space (plan/space.py balanced_ends), checked against
megatron-core's own TransformerConfig checks and its get_num_layers_to_build: DeepSeek-V3's 61 layers divide by no
power of two (nor do 61 + 2), so on 1,024 GPUs it pipelines only through such a split."""
from __future__ import annotations

import json
import warnings

import pytest
from typer.testing import CliRunner

from trainfit.analytic.parallel.pipeline import split
from trainfit.api import load_spec
from trainfit.cli import app
from trainfit.plan.space import Layout, Where, balanced_ends, layouts, variants

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")


def megatron_layers(layers: int, pp: int, first: int, last: int) -> tuple[int, ...] | None:
    """Each pipeline rank's decoder layers as megatron-core builds them, or None where its config refuses the split."""
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    from megatron.core.transformer.transformer_config import TransformerConfig

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            cfg = TransformerConfig(num_layers=layers, pipeline_model_parallel_size=pp, hidden_size=64,
                                    num_attention_heads=4, pipeline_dtype=torch.bfloat16,
                                    num_layers_in_first_pipeline_stage=first, num_layers_in_last_pipeline_stage=last)
        except ValueError:
            return None
        return tuple(get_num_layers_to_build(cfg, pp_rank=r) for r in range(pp))


@pytest.mark.parametrize("layers,pp", [(61, 16), (61, 8), (61, 4), (61, 2), (27, 4), (126, 16), (32, 3)])
def test_the_splits_are_megatrons_with_the_lightest_heaviest_stage(layers, pp):
    """Every (N, M) megatron-core accepts, by brute force: the searched ones are exactly those whose heaviest rank
    holds the fewest layers, and trainfit's stage split is megatron's per-rank count."""
    accepted = {(n, m): got for n in range(1, layers) for m in range(1, layers)
                if (got := megatron_layers(layers, pp, n, m)) is not None}
    least = min(max(got) for got in accepted.values())
    want = {f"first:{n},last:{m}" for (n, m), got in accepted.items() if max(got) == least}
    assert set(balanced_ends(layers, pp)) == want and want
    for how in want:
        n, m = (int(p.split(":")[1]) for p in how.split(","))
        first, middle, last = split(layers, pp, how)
        assert (first, *([middle] * (pp - 2)), last) == accepted[n, m]


@pytest.mark.parametrize("first,last,pp,says", [
    (7, 7, 2, "hold 14 of the 32 layers and --pp 2 has no other stage for the other 18"),
    (16, 16, 3, "hold all 32 layers and leave the 1 other stage of --pp 3 empty"),
    (None, 32, 3, "the last stage holds all 32 layers and leaves the 2 other stages of --pp 3 empty"),
    (8, 9, 4, "the 15 remaining layers do not split evenly over the 2 other stages of --pp 4"),
    (5, None, 3, "the 27 remaining layers do not split evenly over the 2 other stages of --pp 3"),
    (6, 8, 4, None), (None, 12, 2, None), (4, None, 3, None)])
def test_a_split_megatron_refuses_is_refused_with_its_reason(first, last, pp, says):
    """Megatron-core's own TransformerConfig decides: trainfit refuses the first/last splits it refuses, each with
    what is wrong, and takes the ones it takes at its per-rank counts."""
    from trainfit.errors import SetupError

    how = ",".join(f"{k}:{n}" for k, n in (("first", first), ("last", last)) if n is not None)
    got = megatron_layers(32, pp, first, last)
    if got is None:
        assert says is not None
        with pytest.raises(SetupError, match=says):
            split(32, pp, how)
    else:
        assert says is None
        f, middle, la = split(32, pp, how)
        assert (f, *([middle] * (pp - 2)), la) == got


def test_more_layers_on_the_ends_than_the_model_has_is_refused():
    # megatron-core 0.16's config passes first:40 on a 32-layer model at pp 2 (its -8 middle layers divide the one
    # middle stage); no rank could build them: refused here
    from trainfit.errors import SetupError

    with pytest.raises(SetupError, match="the first stage holds 40 layers, more than the model's 32"):
        split(32, 2, "first:40")


def test_deepseek_v3_pipelines_on_a_power_of_two():
    # 61 layers on pp 16: 14 middle stages of 4, the 5 left on the ends (megatron_layers(61, 16, 2, 3) above);
    # pp 2 has no middle stage, and still takes every interleaving depth that splits both ends (only 1 here)
    spec = load_spec("deepseek-v3")
    got = {(v.pp_split, v.vpp) for v in variants(spec, Layout(64, 1, 16), Where(4096, 8), {"pp_split", "vpp"})}
    assert got == {(f"first:{n},last:{5 - n}", 1) for n in range(1, 5)}
    assert {v.pp_split for v in variants(spec, Layout(512, 1, 2), Where(4096, 8), {"pp_split", "vpp"})} == \
        {"first:30,last:31", "first:31,last:30"}
    assert {lay.pp for lay in layouts(spec, 1024, 8, uneven=True)} == {1, 2, 4, 8, 16, 32}
    assert {lay.pp for lay in layouts(spec, 1024, 8)} == {1}  # (a stack without uneven splits)


def test_a_split_that_repeats_even_or_embedding_loss_is_searched_once():
    # Llama 3.1 405B, 126 layers on pp 16: first:7,last:7 builds embedding-loss's 7 / 8 x 14 / 7 (Llama 3 §3.3.2)
    spec = load_spec("llama-3.1-405b")
    got = [v.pp_split for v in variants(spec, Layout(8, 8, 16), Where(8192, 8), {"pp_split"})]
    assert got == ["embedding-loss", "first:6,last:8", "first:8,last:6"]
    # Qwen3-30B-A3B's 48 layers on pp 2 (no middle stage): first:24,last:24 is even's; embedding-loss (24 / 24 decoder
    # layers, but chunks of 25 with the embedding and the loss: --vpp 5, 25) stays its own
    got = {v.pp_split for v in variants(load_spec("qwen3-30b-a3b"), Layout(8, 1, 2), Where(4096, 8), {"pp_split"})}
    assert got == {"even", "embedding-loss"}


def test_plan_with_a_fixed_pp_the_layers_do_not_divide():
    # DeepSeek-V2-Lite's 27 layers on --pp 4: neither 27 nor 29 divides by 4, so only Megatron's uneven split runs
    # it (a fixed --pp was refused before the planner searched these splits); every plan's split is one megatron takes
    r = CliRunner().invoke(app, ["plan", "deepseek-v2-lite", "--stack", "megatron", "--gpus", "16", "--pp", "4",
                                 "--gpu", "H100-80GB", "--seq", "4096", "--global-batch-tokens", "1M", "--json"])
    assert r.exit_code == 0, r.output
    cands = json.loads(r.stdout)["candidates"]
    assert cands
    for c in cands:
        s = c["setup"]
        n, m = (int(p.split(":")[1]) for p in s["pp_split"].split(","))
        assert megatron_layers(27, 4, n, m) is not None
