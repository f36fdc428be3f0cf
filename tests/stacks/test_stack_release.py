"""--stack-release (trainfit/stacks/release.py, stacks/torchtitan.toml [releases]): a published run modelled with the
facts of the checkout it ran, against hand derivations and calibration C5/C6 (shared/calibration.md: torchao's
torchtitan Llama-3-8B tables, FSDP 8, local batch 1, seq 8192, compile, per-op SAC; peak reserved 47.65 GiB on H100
with torchtitan of 2025-03, 33.71 GiB on B200 with torchtitan 6fc499f6f of 2025-08)."""
import pytest

import trainfit
from trainfit.errors import SetupError
from trainfit.setup import Setup
from trainfit.stacks import get_stack
from trainfit.stacks.release import ABOUT, releases

GIB = 2**30
TOKENS, VOCAB, HIDDEN, HEADS, LAYERS = 8192, 128256, 4096, 32, 32  # Llama-3.1-8B, one sequence per GPU
C5, C6 = 47.65, 33.71  # bf16 rows, GiB of torchtitan's max reserved


def job(gpu: str, release: str | None = None):
    return trainfit.estimate("llama-3.1-8b", stack="torchtitan", stack_release=release, recompute="op", dp=8, zero=3,
                             batch=1, seq=TOKENS, compile=True, gpu=gpu).memory


def test_an_unknown_release_is_refused_in_one_line_naming_the_known_ones():
    with pytest.raises(SetupError) as e:
        Setup(stack="torchtitan", stack_release="2019-01")
    msg = str(e.value)
    assert "2025-03" in msg and "2025-08-sm100" in msg and "\n" not in msg


def test_a_release_changes_only_the_fields_it_names_and_says_where_it_was_read():
    pinned = get_stack("torchtitan")
    for name, table in releases(pinned).items():
        assert all(table.get(k) for k in ABOUT)  # the commit, what changed, the file:line
        old = get_stack("torchtitan", name)
        for key, fields in pinned.facts.items():
            if key == "releases":
                continue
            changed = table.get(key, {})
            assert old.facts[key] == {**fields, **changed}


def test_the_2025_03_release_holds_what_its_loss_and_fsdp_groups_hold():
    """Hand derivation at the loss backward (the step's peak on both). The loss: eager holds log_softmax's fp32
    output (saved), the fp32 gradient nll_loss_backward makes and the fp32 one log_softmax_backward makes, 12 bytes
    per logit; the compiled loss the bf16 logits (saved), two fp32 statistics per row and the bf16 gradient, 4 per
    logit + 8 per row. FSDP: the root group (embedding, norm, output) stays unsharded from the forward, and the last
    block is not resharded after it, where the pinned groups hold only [norm, output] there: the bf16 embedding and
    one bf16 block more."""
    eager, compiled = job("H100-96GB", "2025-03"), job("H100-96GB")
    block = 2 * HIDDEN * (HIDDEN + 1024) + 3 * HIDDEN * 14336 + 2 * HIDDEN  # wq wo, wk wv, w1 w2 w3, two norms
    assert eager.peak - compiled.peak == TOKENS * (8 * VOCAB - 8) + 2 * (VOCAB * HIDDEN + block)


def test_the_sm100_release_recomputes_the_attention_op_sac_did_not_list():
    """torchtitan 6fc499f6f on B200 ran cuDNN attention, not on its save list: each block's bf16 output and fp32
    log-sum-exp per head are recomputed, not saved (the compiled block's saved set is measured on CPU in
    tests/analytic/test_compile_float8.py)."""
    pinned, release = job("B200"), job("B200", "2025-08-sm100")
    assert pinned.peak - release.peak == LAYERS * TOKENS * (2 * HIDDEN + 4 * HEADS)


def test_c5_and_c6_reserved_follow_the_releases_they_ran():
    """Each release moves its run's reserved toward the published figure (the pinned facts give 42.0 -> 38.3 GiB
    on both GPUs: 11.9 % under C5, 13.6 % over C6); both rows then read 1.7-2.5 GiB high. NB (docs/stacks.md): on
    the compute stream's cached blocks, which the analytic engine counts 3.5 GiB above the allocator simulator on
    the eager step at this size."""
    for gpu, release, published in (("H100-96GB", "2025-03", C5), ("B200", "2025-08-sm100", C6)):
        pinned, old = job(gpu).reserved / GIB, job(gpu, release).reserved / GIB
        assert abs(old - published) < abs(pinned - published)
    h100, b200 = job("H100-96GB", "2025-03").reserved / GIB, job("B200", "2025-08-sm100").reserved / GIB
    assert 0 < h100 / C5 - 1 < 0.05 and 0 < b200 / C6 - 1 < 0.08


def test_the_trace_and_measure_engines_refuse_a_release_they_do_not_run():
    from trainfit import engines
    from trainfit.models.resolve import load_model

    setup = Setup(stack="torchtitan", stack_release="2025-03", device="cpu", seq=64)
    for run in (engines.trace, engines.measure):
        with pytest.raises(SetupError) as e:
            run(load_model("tiny-llama"), setup)
        assert "--engine analytic" in str(e.value) and "\n" not in str(e.value)
