"""The node's host memory (--host-memory, a cluster's host_memory): what an offloading step keeps there, judged."""
from __future__ import annotations

import json

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


@pytest.mark.parametrize("engine, flags, judges", [
    ("trace", ("--host-memory", "512"), "--engine trace judges the step's memory on the GPU"),
    ("trace", ("--tokens", "1B", "--mfu", "0.4", "--power-limit", "500"), "--engine trace judges the step's memory"),
    ("measure", ("--host-memory", "512"), "--engine measure runs the step on this machine's --device"),
    ("measure", ("--reserve", "2"), "--engine measure runs the step on this machine's --device")])
def test_the_engines_refuse_the_run_settings_they_never_read(cli, engine, flags, judges):
    """The trace and measure engines judge no host memory (fit_rule.host_verdict runs in the analytic engine only; the
    trace's Fit is the allocator replay's, fit_rule.with_fit) and their estimates get no advice (the trace has no
    Timing; a measured step ran); the trace has no step time (so no budget, --mfu or power cap) and the measure engine
    runs on this machine's --device, not the catalog GPU --gpu names (api.UNREAD_BY): each such setting is refused
    before any engine runs, in the library and the CLI, even with --offload, naming every one given. Under --engine
    all the analytic estimate reads them (test above; --tokens: the budget)."""
    names = flags[::2]
    with pytest.raises(SetupError, match=judges):
        trainfit.estimate("gpt2", engine=engine, gpu="H100-80GB", host_memory=512)
    for extra in ((), ("--offload", "optimizer", "--zero", "2", "--dp", "2")):
        code, out, err = cli("estimate", "gpt2", "--gpu", "H100-80GB", "--engine", engine, *flags, *extra)
        assert code == 2 and out == "" and "Traceback" not in err and len(err.strip().splitlines()) == 1
        assert err.startswith(f"error: {judges}") and err.strip().endswith(
            "use --engine analytic or all (the analytic engine reads " + ("it), or drop it" if len(names) == 1 and
                                                                          engine == "trace" else "them), or drop them"))
        # every setting given is named (the measure engine's --gpu too: it reads no catalog GPU)
        assert all(n in err for n in names) and (engine == "trace") != ("--gpu" in err)
    code, out, _ = cli("estimate", "gpt2", "--gpu", "H100-80GB", "--engine", "all", "--batch", "1", "--seq", "64",
                       "--tokens", "1B", "--json")
    assert code == 0 and json.loads(out)["estimates"][0]["time"]["train_tokens"] == 1e9  # (the analytic reads it)


def test_compare_and_report_name_a_host_memory_nothing_reads(cli):
    """`trainfit compare` shows no advice, so --host-memory is read only where the training step keeps something in
    host memory (torchao's CPUOffloadOptimizer here): otherwise its training estimate carries the note and the command
    prints it. The HTML report's estimate carries estimate's note (api.host_memory_noted) unless --gpus adds a plan,
    whose offloads read it."""
    from trainfit.api import HOST_MEMORY_UNREAD, HOST_MEMORY_UNREAD_COMPARE, Request
    from trainfit.report.html import build_report

    plain = dict(batch=1, seq=64, gpu="H100-80GB", host_memory=512)
    rows = trainfit.compare("gpt2", **plain)
    assert HOST_MEMORY_UNREAD_COMPARE in next(iter(rows.values())).notes
    assert HOST_MEMORY_UNREAD_COMPARE not in next(iter(trainfit.compare("gpt2", **plain, offload="optimizer")
                                                       .values())).notes
    assert HOST_MEMORY_UNREAD_COMPARE not in next(iter(trainfit.compare("gpt2", **{**plain, "host_memory": None})
                                                       .values())).notes
    code, out, _ = cli("compare", "gpt2", "--gpu", "H100-80GB", "--batch", "1", "--seq", "64", "--host-memory", "512")
    assert code == 0 and out.strip().endswith("· " + HOST_MEMORY_UNREAD_COMPARE)
    req = Request("gpt2", batch=1, seq=64, gpu="H100-80GB", host_memory=512)
    assert HOST_MEMORY_UNREAD in build_report(req, trace=False)
    assert HOST_MEMORY_UNREAD not in build_report(req, gpus=2, trace=False)


def test_plan_names_a_host_memory_no_offload_was_searched_against(cli):
    """plan searches the offloads (the last memory-knob levels, judged against the node's host memory) only where
    nothing fits plainly: where plans fit, --host-memory judged nothing and the plan's notes say so."""
    from trainfit.api import HOST_MEMORY_UNREAD_PLAN

    args = ("plan", "gpt2", "--gpu", "H100-80GB", "--gpus", "2", "--seq", "1024", "--json")
    code, out, _ = cli(*args, "--host-memory", "64")
    assert code == 0 and json.loads(out)["candidates"] and HOST_MEMORY_UNREAD_PLAN in json.loads(out)["notes"]
    code, out, _ = cli(*args)
    assert code == 0 and HOST_MEMORY_UNREAD_PLAN not in json.loads(out)["notes"]
