"""The node's host memory (--host-memory, a cluster's host_memory): what an offloading step keeps there, judged."""
from __future__ import annotations

import pytest

import trainfit
from trainfit.analytic.params import count_params
from trainfit.errors import SetupError
from trainfit.models.resolve import load_model

GiB = 2**30
RUN = dict(stack="deepspeed", zero=3, offload="params", optimizer="adamw", precision="bf16-master", batch=1, seq=512,
           gpu="H200")


def test_overflowing_host_memory_does_not_fit():
    """ZeRO-Infinity on one H200 keeps 20 bytes per parameter on the host (fp32 partition 4, AdamW 8, fp32 gradient
    4, bf16 gradient partition 2, bf16 parameters 2: stage3.py:333, :791, :906, :1158, :1338): 8.03e9 × 20 = 149.6
    GiB, over a 64 GiB node by 85.6 GiB, though the device has room."""
    psi = count_params(load_model("llama-3.1-8b")).total
    e = trainfit.estimate("llama-3.1-8b", host_memory=64, **RUN)
    assert e.fit.host_required == pytest.approx(20 * psi, rel=1e-6)
    assert e.fit.host_capacity == 64 * GiB
    assert e.fit.headroom > 0 and not e.fit.fits and not e.time.fits
    line = next(n for n in e.notes if n.startswith("does not fit in host memory"))
    assert "85.58 GiB over" in line
    assert trainfit.estimate("llama-3.1-8b", host_memory=256, **RUN).fit.fits


def test_the_cluster_gives_the_node_and_its_ranks_share_it():
    """dgx-h200: 2 TiB per node (32 × 64 GiB DIMMs, data/clusters.toml); 8 ranks of --dp 8 on one node keep 8 × the
    rank's 20Ψ/8 = 20Ψ there."""
    psi = count_params(load_model("llama-3.1-8b")).total
    e = trainfit.estimate("llama-3.1-8b", cluster="dgx-h200", **{**RUN, "zero": 3}, dp=8)
    assert e.fit.host_capacity == 2048 * GiB
    assert e.fit.host_required == pytest.approx(20 * psi, rel=1e-3)
    assert e.fit.fits
    # without a node capacity the host bytes are reported, not judged
    assert trainfit.estimate("llama-3.1-8b", **RUN).fit.host_capacity is None


@pytest.mark.parametrize("kw, says", [({"host_memory": 64, "gpu": None}, "needs --gpu"),
                                      ({"host_memory": 0}, "host-memory")])
def test_bad_host_memory_is_one_line(kw, says):
    with pytest.raises(SetupError, match=says):
        trainfit.estimate("llama-3.1-8b", **{**RUN, **kw})


def test_host_memory_that_nothing_reads_is_named():
    """--host-memory on a step that keeps nothing in host memory and fits: nothing judges it (fit_rule.host_verdict
    judges only what the step keeps there; the advice's offloads are judged only when it does not fit), so the
    estimate says so rather than ignoring it. An offloading step, or one that does not fit, reads it: no note."""
    from trainfit.api import HOST_MEMORY_UNREAD

    plain = dict(batch=1, seq=512, gpu="H100-80GB", host_memory=512)
    e = trainfit.estimate("llama-3.2-1b", **plain)
    assert e.fit.fits and e.fit.host_required is None and HOST_MEMORY_UNREAD in e.notes
    assert HOST_MEMORY_UNREAD not in trainfit.estimate("llama-3.2-1b", **plain, offload="activations").notes
    short = trainfit.estimate("llama-3.1-8b", **{**plain, "gpu": "L4"})  # (the advice's offloads read it)
    assert not short.fit.fits and HOST_MEMORY_UNREAD not in short.notes
    assert HOST_MEMORY_UNREAD not in trainfit.estimate("llama-3.2-1b", **{**plain, "host_memory": None}).notes


@pytest.mark.parametrize("engine, judges", [("trace", "--engine trace judges the device only"),
                                            ("measure", "--engine measure judges the step it runs on this machine")])
def test_host_memory_is_refused_by_the_engines_that_never_read_it(cli, engine, judges):
    """The trace and measure engines judge no host memory (fit_rule.host_verdict runs in the analytic engine only; the
    trace's Fit is the allocator replay's, fit_rule.with_fit) and their estimates get no advice (the trace has no
    Timing; a measured step ran): --host-memory is refused before any engine runs, in the library and the CLI, even
    with --offload. Under --engine all the analytic estimate reads it (test above)."""
    with pytest.raises(SetupError, match=judges):
        trainfit.estimate("gpt2", engine=engine, gpu="H100-80GB", host_memory=512)
    for extra in ((), ("--offload", "optimizer", "--zero", "2", "--dp", "2")):
        code, out, err = cli("estimate", "gpt2", "--gpu", "H100-80GB", "--engine", engine, "--host-memory", "512",
                             *extra)
        assert code == 2 and out == "" and "Traceback" not in err and len(err.strip().splitlines()) == 1
        assert err.startswith("error: --host-memory is read by the analytic engine") and judges in err
        assert err.strip().endswith("use --engine analytic or all, or drop it")
