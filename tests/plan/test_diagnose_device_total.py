"""'Nothing fits' judges the suggested GPU count as the search does: on the device total, the NCCL buffers of the
suggested layout's communicators included (issue 13), so `--gpus N` from the diagnosis does fit. Fast (no torch)."""
from __future__ import annotations

import json
from dataclasses import replace

from trainfit.api import load_spec
from trainfit.hardware import get_gpu
from trainfit.plan.search import PlanQuery, search

MiB = 2**20


def test_suggested_gpu_count_fits_with_its_nccl_buffers():
    spec = load_spec("llama-3.2-1b")
    # an A100 cut to 11.3 GiB: the leanest 2-GPU plan (tp 2, full recompute, micro-batch 1) holds 10.19 GiB of
    # tensors as the allocator keeps them; + the CUDA context (400 MiB, overheads.toml's default: the A100 is in
    # no generation's list) + two cuBLAS workspaces (sm_80: 4096 KiB x 2 + 16 KiB x 8 each) = 10.63 GiB fits the
    # 11.3 GiB less --reserve 0.5 GiB = 10.8 GiB; the tp group's NCCL buffers do not: on NVLink A100s (12 x 20 GB/s = 240:
    # 6 ring channels at 40 GB/s, doubled twice = 24; NCCL graph/search.cc, connect.cc) a pair of ranks holds one
    # receiving and one sending connection per channel, each 6 MiB with P2P read (transport/p2p.cc: ncclRecvMem
    # 4096 + LL 8*512*8*16 + LL128 120*640*8*8, and ncclSendMem 4096 + SIMPLE 4 MiB, rounded up to 2 MiB).
    recv = 4096 + 8 * 512 * 8 * 16 + 120 * 640 * 8 * 8
    send = 4096 + 4 * MiB
    up = lambda b: -(-b // (2 * MiB)) * 2 * MiB  # noqa: E731
    nccl_tp2 = 24 * (up(recv) + up(send))
    assert nccl_tp2 == 288 * MiB
    gpu = replace(get_gpu("A100-80GB"), memory=int(11.3 * 1024) * MiB)
    two = search(spec, gpu, PlanQuery(gpus=2, seq=2048, reserve=0.5, knobs=()))  # plain layouts only
    assert not two.candidates  # the search: no 2-GPU plan fits
    one = search(spec, gpu, PlanQuery(gpus=1, seq=2048, reserve=0.5))
    d = one.diagnosis
    assert not one.candidates and d.reason == "memory"
    assert d.min_gpus == 4, d.suggestions  # not 2, which peak + context + workspace alone would suggest
    assert search(spec, gpu, PlanQuery(gpus=d.min_gpus, seq=2048, reserve=0.5)).candidates
    # the 1-GPU leanest plan's device total is what the message reports
    assert d.leanest_device_total > 10.8 * 1024 * MiB and "device total" in d.message


def test_nothing_fits_offers_only_a_gpu_the_cluster_holds(cli):
    """The diagnosis's larger GPUs sit in --cluster's nodes: dgx-h100 holds H100-80GBs only, so it names none (it
    offered GH200, H100-96GB, H200, B200, each of which `--cluster dgx-h100` refuses); without the cluster it does."""
    argv = ["plan", "qwen3-30b-a3b", "--gpu", "H100-80GB", "--gpus", "7", "--stack", "megatron", "--seq", "4096"]
    code, out, err = cli(*argv, "--json")
    assert code == 0, err
    assert any(s.startswith("--gpu ") for s in json.loads(out)["nothing_fits"]["suggestions"])
    code, out, err = cli(*argv, "--cluster", "dgx-h100", "--json")
    assert code == 0, err
    said = json.loads(out)["nothing_fits"]["suggestions"]
    assert said and not [s for s in said if s.startswith("--gpu ")]
