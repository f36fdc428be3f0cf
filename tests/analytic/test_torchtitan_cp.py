"""Context parallelism on --stack torchtitan (torch's ring attention over SDPA; analytic/parallel/torch_context.py):
per-rank activations, FSDP over dp_shard × cp, the ring's buffers and exposed exchange, derived by hand."""
from __future__ import annotations

import pytest

from trainfit.analytic.memory import train_memory
from trainfit.analytic.params import count_params
from trainfit.analytic.parallel.collectives import Links
from trainfit.analytic.parallel.torch_context import ring_backward_bytes, ring_comm_seconds
from trainfit.errors import SetupError
from trainfit.hardware import get_gpu
from trainfit.models.resolve import load_model
from trainfit.setup import Setup


@pytest.fixture(scope="module")
def llama():
    return load_model("llama-3.1-8b")


def _setup(**kw) -> Setup:
    base = dict(batch=2, seq=4096, stack="torchtitan", zero=3)
    return Setup(**{**base, **kw})


def test_full_recompute_keeps_each_blocks_local_input(llama):
    """torchtitan's full AC checkpoints each TransformerBlock: its input alone is saved, the rank's shard of the
    sequence (prepare_context_parallel_input shards the inputs over cp): b · s/cp · dim, in bf16 (FSDP2's
    param_dtype). b 2, s 4096, cp 2, dim 4096: 2 · 2048 · 4096 · 2 B = 33,554,432 B."""
    m = train_memory(llama, _setup(cp=2, recompute="full"))
    assert m.detail["activation_per_layer"] == 2 * 2048 * 4096 * 2 == 33_554_432


@pytest.mark.parametrize("recompute", ["none", "op"])
def test_a_cp_rank_saves_what_its_half_sequence_saves(llama, recompute):
    """The ring's SDPA saves the local q, k, v, output and log-sum-exp, as a plain flash SDPA of the local tokens
    does (_attention.py:658-687 returns the merged out and lse): a cp-2 rank of a 4096-token sequence saves per
    layer what a rank of a 2048-token sequence saves without CP."""
    half = train_memory(llama, _setup(seq=2048, dp=2, recompute=recompute)).detail["activation_per_layer"]
    ring = train_memory(llama, _setup(seq=4096, cp=2, recompute=recompute)).detail["activation_per_layer"]
    assert ring == half


def test_fsdp_shards_the_states_over_dp_shard_times_cp(llama):
    """FSDP's mesh is dp_shard × cp (torchtitan distributed/parallel_dims.py:137): with dp 1 and cp 4 each rank
    keeps a quarter of the fp32 parameters, gradients and both Adam moments (4 + 4 + 8 B per parameter / 4)."""
    n = count_params(llama).total
    m = train_memory(llama, _setup(dp=1, cp=4, recompute="full"))
    assert m.weights == pytest.approx(4 * n / 4, abs=8)
    assert m.gradients == pytest.approx(4 * n / 4, abs=8)
    assert m.optimizer == pytest.approx(8 * n / 4, abs=8)


def test_ring_backward_buffers_by_hand(llama):
    """One layer's ring backward (torch 2.13 _attention.py:488-656), b 1, s 8192, cp 4, tp 1: 2048 tokens a rank,
    q = 2048 · 32 heads · 128 = 8,388,608 elements, K and V = 2 · 2048 · 8 kv heads · 128 = 4,194,304:
      fp32 dQ, dK, dV accumulators        4 · (8,388,608 + 4,194,304)   = 50,331,648
      the all-gathered K/V and its flat input (4 + 1) · 4,194,304 · 2 B  = 41,943,040
      the fp32 dK/dV sent and received    2 · 4 · 4,194,304             = 33,554,432"""
    s = _setup(batch=1, seq=8192, dp=1, cp=4, recompute="op")
    assert ring_backward_bytes(llama, s, 2048, 2) == 50_331_648 + 41_943_040 + 33_554_432
    assert ring_backward_bytes(llama, _setup(batch=1, seq=8192, dp=2), 8192, 2) == 0


def test_ring_hides_all_but_the_last_gradient_hop(llama):
    """With attention far longer than every exchange, the all-gathers and all but one dK/dV hop hide behind the
    ring's SDPA steps; the last hop is waited after the loop (_attention.py:646): per layer 2048 tokens' fp32 K and V
    gradients, 4,194,304 · 4 B, at NVLink's point-to-point rate (a cp group of 4 ranks in one node)."""
    s = _setup(batch=1, seq=8192, dp=1, cp=4, recompute="op")
    links = Links.of(get_gpu("h100-sxm"))
    got = ring_comm_seconds(llama, s, links, 2048, 2, 32, attention_forward=1e3, rerun=0.0)
    assert got == pytest.approx(32 * 4_194_304 * 4 / links.intra, rel=1e-12)
    # with no compute to hide behind, more is exposed: the forward and backward all-gathers and every hop
    assert ring_comm_seconds(llama, s, links, 2048, 2, 32, attention_forward=0.0, rerun=0.0) > 4 * got


@pytest.mark.parametrize("kw, words", [
    (dict(cp=2, dp=2, zero=0), "applies FSDP over dp_shard × cp"),
    (dict(cp=2, precision="fp32"), "math kernel"),
    (dict(cp=2, tp=2, seq=4100), "divisible by tp × 2 × cp"),
])
def test_cp_refusals_say_what_to_do(kw, words):
    with pytest.raises(SetupError, match=words) as e:
        _setup(**kw)
    assert "\n" not in str(e.value)


def test_one_process_engines_refuse_cp(llama):
    from trainfit import engines

    s = _setup(batch=1, seq=256, cp=2, device="cpu")
    for run in (engines.trace, engines.measure):
        with pytest.raises(SetupError, match="--cp"):
            run(llama, s)


def test_ring_merge_bytes_by_hand(llama):
    """torch's fp32 merge around the ring's SDPA steps (ops/ring_merge.py), llama-3.1-8b, b 1, s 8192, cp 2: 4096
    tokens a rank, O = 4096 · 4096 = 16,777,216 output elements, K = 4096 · 2 · 1024 = 8,388,608 K+V elements, bf16:
      forward: first output to fp32 (2O read, 4O written), one merge step (2O + 8O + 4O + 8O read; 4O · 4 written),
               the result back to bf16 (4O, 2O): reads 28 O, writes 22 O;
      backward: fp32 zeros (4O + 4K written), per step (2) the dQ and dK/dV accumulations (6O + 6K read, 4O + 4K
               written) and the fp32 dK/dV copy (4K, 4K), the casts back (4O + 4K read, 2O + 2K written):
               reads 16 O + 24 K, writes 14 O + 22 K."""
    from trainfit.analytic.ops import Shape, backward, layer_forward

    o, k = 16_777_216, 8_388_608
    fwd = [op for op in layer_forward(llama, Shape(batch=1, seq=8192, cp=2, cp_merge=True)) if op.name == "ring_merge"]
    assert [(op.reads, op.writes) for op in fwd] == [(28 * o, 22 * o)]
    bwd = backward(fwd)
    assert [(op.reads, op.writes) for op in bwd] == [(16 * o + 24 * k, 14 * o + 22 * k)]
    # Megatron's ring (TE) merges inside its own kernels: no such ops on --stack megatron, nor without CP
    assert not [op for op in layer_forward(llama, Shape(batch=1, seq=8192, cp=2)) if op.name == "ring_merge"]
    from trainfit.analytic.ops.shape import shape_of
    from trainfit.analytic.precision import state_bytes

    mg = Setup(batch=1, seq=8192, stack="megatron", cp=2, precision="bf16-master")
    assert not shape_of(llama, mg, state_bytes(mg), "bf16").cp_merge
    tt = _setup(batch=1, seq=8192, cp=2, recompute="op")
    assert shape_of(llama, tt, state_bytes(tt), "bf16").cp_merge
