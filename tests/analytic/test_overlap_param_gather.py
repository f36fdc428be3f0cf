"""Megatron's --overlap-param-gather (parallel/zero.py dp_comm): the distributed optimizer's parameter all-gather
hidden behind the next step's first forward instead of run whole after optimizer.step() (megatron-core 0.16.1
distributed_data_parallel.py:384-417, distrib_optimizer.py:2611-2617). Checked against the byte counts of the two
collectives, not the time model restated."""
from __future__ import annotations

import pytest

import trainfit
from trainfit.errors import SetupError

# Llama-3.1-8B on 64 H100s (8 nodes), the distributed optimizer over DP 64, fp32 gradient reduce (Megatron's --bf16
# default), 4 sequences of 8192 per rank: a forward of seconds against a gather of tenths
RUN = dict(gpu="H100-80GB", stack="megatron", dp=64, zero=1, batch=4, seq=8192, grad_accum=2,
           precision="bf16-master", recompute="full")


def _step(**kw):
    return trainfit.estimate("llama-3.1-8b", **{**RUN, **kw}).detail.step_time


def test_hidden_gather_saves_the_all_gather_the_byte_counts_give():
    """Without the overlap the step waits for the reduce-scatter's exposed part and the whole all-gather; with it the
    all-gather hides behind the first forward. The gradients go out in fp32 (4 bytes a parameter) and the parameters
    come back in bf16 (2 bytes), over the same ranks and links, so the all-gather is a third of the collectives'
    total, bandwidth-bound. The step saves at most that third, less what overlapping costs: the first bucket's
    gather, and the forward's memory-bound kernels slowed by the collective's own HBM traffic (overlap.py) — under
    a third of it here (NB: each collective's latency is not split by bytes: a fraction of a percent)."""
    off, on = _step(), _step(overlap_param_gather=True)
    assert off.dp_comm_total == pytest.approx(on.dp_comm_total)
    gather = off.dp_comm_total / 3
    assert 0.67 * gather < off.step_seconds - on.step_seconds <= 1.01 * gather


def test_megatron_fsdp_gathers_per_layer_either_way():
    """Under Megatron-FSDP (--zero 3) every layer's gather is already prefetched behind the compute (dp_comm's
    per-micro-batch term): the flag, which Megatron accepts there too (arguments.py:597-599), changes no term."""
    assert _step(zero=3, overlap_param_gather=True).step_seconds == _step(zero=3).step_seconds


def test_refused_without_the_distributed_optimizer():
    """Megatron-LM core_v0.16.1 arguments.py:597-599: only with the distributed optimizer or Megatron-FSDP."""
    with pytest.raises(SetupError, match="--overlap-param-gather .* needs --zero 1"):
        trainfit.estimate("llama-3.1-8b", **dict(RUN, zero=0), overlap_param_gather=True)


def test_planned_megatron_layouts_gather_behind_the_forward_and_emit_it():
    """plan runs it where Megatron-Bridge does (data parallelism over the distributed optimizer), and the Megatron
    command it writes carries it with the --overlap-grad-reduce Megatron-LM requires beside it (arguments.py:600-601)."""
    from trainfit.api import load_spec
    from trainfit.hardware import get_gpu
    from trainfit.plan import emit_megatron
    from trainfit.plan.search import PlanQuery, search

    spec = load_spec("llama-3.1-8b")
    r = search(spec, get_gpu("H100-80GB"), PlanQuery(gpus=16, seq=4096, global_batch_tokens=2**20,
                                                     stacks=("megatron",), zeros=(1,), top=3))
    assert r.candidates
    for c in r.candidates:
        s = c.setup
        assert s.overlap_param_gather == (s.dp * s.cp > 1)
        flags = emit_megatron.args(s, spec)
        assert ("--overlap-param-gather" in flags) == s.overlap_param_gather
        assert "--overlap-grad-reduce" in flags
