"""`trainfit plan` searches the stacks' memory knobs (plan/knobs.py) when no plain plan fits: each plan it returns
fits by a direct estimate, and the previous level (one step less aggressive) does not."""
from __future__ import annotations

import json

from trainfit import api
from trainfit.cli.app import main
from trainfit.engines import analytic
from trainfit.models.resolve import load_model
from trainfit.plan.search import PlanQuery, search


def _fits(spec, setup, gpu) -> bool:
    return analytic(spec, setup, gpu).fit.fits


def test_long_context_finds_ulysses_where_plain_layouts_do_not_fit():
    # Llama-3.1-8B at 512k tokens on 8 H100s: the full-vocabulary logits alone are 512k × 128k fp32 = 256 GiB, so no
    # plain ZeRO layout fits; Liger's fused loss and the tiled MLP on one GPU's whole sequence do not either
    spec, gpu = load_model("llama-3.1-8b"), api.load_gpu("H100-80GB")
    r = search(spec, gpu, PlanQuery(gpus=8, seq=524288, stacks=("deepspeed",), top=3))
    assert r.stats["knobs"] == "ulysses" and r.candidates
    best = r.candidates[0].setup
    assert best.ulysses > 1 and best.liger and best.tiled_mlp is not None
    assert _fits(spec, best, gpu)
    assert not _fits(spec, best.with_(ulysses=1, batch=1), gpu)  # the kernels level alone
    assert not _fits(spec, best.with_(ulysses=1, liger=False, tiled_mlp=None, batch=1), gpu)  # plain


def test_offload_plan_is_judged_against_the_nodes_host_memory():
    # Llama-3.1-70B's bf16-master Adam states are 16 bytes a parameter (~1.1 TB): 140 GB per GPU over 8, more than an
    # H100; ZeRO-Infinity puts them in host memory, which a 512 GiB node cannot hold and a 2 TiB one can
    spec = load_model("llama-3.1-70b")
    q = PlanQuery(gpus=8, seq=8192, stacks=("deepspeed",), top=2)
    big = search(spec, api.load_gpu("H100-80GB", host_memory=2048), q)
    assert big.stats["knobs"] == "state offload" and big.candidates
    s = big.candidates[0].setup
    assert s.offload_state in ("optimizer", "params")
    assert _fits(spec, s, api.load_gpu("H100-80GB", host_memory=2048))
    assert not _fits(spec, s.with_(offload="none", batch=1), api.load_gpu("H100-80GB", host_memory=2048))
    small = search(spec, api.load_gpu("H100-80GB", host_memory=512), q)
    assert not small.candidates and "memory knobs" in small.diagnosis.message


def test_emit_deepspeed_writes_the_ulysses_degree(capsys):
    # at 128k tokens on 8 H100s the fastest plan that fits runs Liger and the tiled MLP, trainer options DeepSpeed's
    # config cannot hold; --emit searches again with the knobs it holds: Ulysses' sequence_parallel_size
    # (deepspeed 0.19.8 runtime/config.py:468-469)
    main(["plan", "llama-3.1-8b", "--gpu", "H100-80GB", "--gpus", "8", "--seq", "131072", "--stack", "deepspeed",
          "--emit", "deepspeed"])
    cfg = json.loads(capsys.readouterr().out)
    assert cfg["sequence_parallel_size"] > 1
    assert cfg["train_batch_size"] * cfg["sequence_parallel_size"] % 8 == 0
