"""NCCL's device memory per rank for one communicator, by the GPU's interconnect (issues 13, 17; no torch).

What NCCL v2.21.5 does at ncclCommInitRank (data/overheads.toml [nccl] cites each file:line; v2.26 / v2.27 unchanged):
- channels: the ring search on the GPU's link bandwidth (`ring_channels`), doubled twice; the tree takes the same;
- connections: every channel connects the ring (receive from the previous rank, send to the next) and the tree, a
  chain within a node (init.cc:1256-1274); a (channel, peer) pair is connected once (transport.cc:46-55), so where
  the chain follows the ring a middle rank receives from 2 peers and sends to 2 (1 and 1 for a pair of ranks);
- bytes: the P2P transport's receiver holds ncclRecvMem + LL + LL128 + SIMPLE, its sender ncclSendMem, each rounded
  up to 2 MiB (p2p.cc:354-357, :419-422); with P2P read (NVLink, sm_80) SIMPLE sits on the sender instead;
- NVLS (sm_90+ NVSwitch nodes, > 2 GPUs, unless the stack turns it off): 16 channels x 2 x (1 MiB + 2 MiB) per head,
  one head per GPU (nvls.cc:310-314).
NB: the chain is taken to follow the ring's order (NCCL's two searches on a flat NVSwitch or PCIe node give the same
order); end ranks of the chain hold less (the figure is the busiest rank's). NB: channels and connections as on one
node; a communicator across nodes adds network connections and NVLS trees (not modelled, direction unknown). NB: send /
recv (pipeline stages) connect p2p channels on their first use (init.cc:1344-1360 only for NVB paths), on top of the
ring and tree every communicator connects at init: not counted (under). NB: NCCL >= 2.22 with cuMem on connects an
algorithm on its first use (NCCL_RUNTIME_CONNECT): until the stack has run both ring and tree, over-counts.
"""
from __future__ import annotations

import math
from functools import lru_cache

from .hardware import GPU


def _conf() -> dict:
    return _overheads.data()["nccl"]


def interconnect(gpu: GPU) -> dict | None:
    """overheads.toml [nccl.gpus]: {"nvlinks", "sm"} for NVSwitch boards, {"pcie", "sm"} for PCIe cards; None for a
    GPU NCCL's search is not modelled for (AMD: RCCL). By GPU.kernels: the catalog GPU a GPU file names."""
    return _link_of(gpu.kernels)


def _link_of(kernels: str) -> dict | None:
    """interconnect's entry, by the name of the GPU's kernel data."""
    return _conf()["gpus"].get(kernels)


def link_bw(link: dict) -> float:
    """The GPU's link bandwidth in NCCL's topology (GB/s): NVLink links x the per-link figure of its SM generation
    (graph/topo.h), or a PCIe x16 link's width x rate / 80 (graph/topo.cc:459)."""
    n = _conf()
    if "nvlinks" in link:
        gen = "sm100" if link["sm"] >= 100 else "sm90" if link["sm"] >= 90 else "sm80" if link["sm"] >= 80 else "sm70"
        return link["nvlinks"] * n["nvlink_bw"][gen]
    return n["pcie_x16_bw"][link["pcie"]]


def ring_channels(link: dict) -> int:
    """The channels a communicator runs collectives on (comm->nChannels), from graph/search.cc ncclTopoCompute on a
    flat node (each GPU has one link, to the NVSwitch or its PCIe parent, and a ring channel at speed s loads it
    with s): first pass from the fastest speed the link allows, keeping the largest channels x speed; then
    ncclTopoDupChannels and ncclTopoPostset's doublings. The second pass (raising the speed at the same channel
    count) does not change the count."""
    n = _conf()
    sm, total = link["sm"], link_bw(link)
    speeds = n["speeds_sm100"] if sm >= 100 else n["speeds_sm90"] if sm >= 90 else n["speeds"]
    cap = n["ring_search_channels"]
    i = next((k for k, s in enumerate(speeds) if s <= total), len(speeds) - 1)
    best_c, best_s = 0, 0.0
    while True:
        c = min(int(math.floor(total / speeds[i] + 1e-9)), cap)
        if c * speeds[i] > best_c * best_s:
            best_c, best_s = c, speeds[i]
        if best_c * best_s >= total - 1e-9 or i + 1 >= len(speeds) or (
                best_c and speeds[i + 1] / best_s <= n["speed_ratio"]):
            break
        i += 1
    c = best_c
    if best_s >= n["dup_min_bw"] and not (sm > 80 and best_s < n["dup_sm90_bw"] and c > n["dup_sm90_channels"]):
        c = min(2 * c, cap)  # ncclTopoDupChannels (graph->maxChannels = 16 for the ring)
    return min(2 * c, n["max_channels"])  # ncclTopoPostset


def _align(nbytes: int) -> int:
    a = _conf()["ipc_align_bytes"]
    return -(-nbytes // a) * a


def channel_bytes(link: dict, ranks: int) -> int:
    """One channel's P2P buffers on the busiest rank: receiving connections x (ncclRecvMem + the FIFOs it holds) +
    sending connections x (ncclSendMem + the FIFO it holds), each rounded up to CUDA_IPC_MIN."""
    n = _conf()
    peers = 1 if ranks == 2 else 2
    read = "nvlinks" in link and link["sm"] == 80  # P2P read: NVLink between sm_80 GPUs (graph/paths.cc:337-341)
    recv = n["recv_mem_bytes"] + n["ll_bytes"] + n["ll128_bytes"] + (0 if read else n["simple_bytes"])
    send = n["send_mem_bytes"] + (n["simple_bytes"] if read else 0)
    return peers * (_align(recv) + _align(send))


def nvls_bytes(link: dict, local_ranks: int) -> int:
    """NVLS buffers one rank binds (transport/nvls.cc:310-314) where NCCL enables NVLS: an NVSwitch node of sm_90+
    with more than 2 of the communicator's GPUs (:241); one head per such GPU. NB: the driver rounds it up to its
    multicast granularity (nvls.cc:59-61; not counted, under)."""
    n = _conf()
    if "nvlinks" not in link or link["sm"] < 90 or local_ranks <= 2:
        return 0
    per_channel = n["nvls_chunk_bytes"] * n["nvls_steps"] + n["nvls_mem_align_bytes"]
    return n["nvls_channels"] * 2 * per_channel * local_ranks


def communicator_bytes(gpu: GPU, ranks: int, nvls_local: int | None = None) -> int:
    """Device bytes one rank holds for a communicator of `ranks` ranks on `gpu`s: channels x channel_bytes, + NVLS
    over `nvls_local` of its GPUs on one node (None: all `ranks`, one node; 0: NVLS off).
    NB: PCIe cards are counted with the P2P transport (NCCL's choice wherever the driver allows peer access,
    graph/paths.cc:278-302); where it does not (many VMs, GeForce cards) NCCL uses SHM, whose FIFOs are in host
    memory: over-counts there. NB: GPUs without an [nccl.gpus] entry (AMD: RCCL's own search) get MAXCHANNELS on
    the P2P rule (direction unknown). Memoised on what it reads of the GPU (its kernel data's name, which
    interconnect looks up): the planner asks per layout group, the estimate per communicator."""
    return _communicator_bytes(gpu.kernels, ranks, nvls_local)


@lru_cache(maxsize=1024, typed=True)
def _communicator_bytes(kernels: str, ranks: int, nvls_local: int | None) -> int:
    if ranks < 2:
        return 0
    link = _link_of(kernels)
    if link is None:
        return _conf()["max_channels"] * channel_bytes({"pcie": "gen4", "sm": 0}, ranks)
    local = ranks if nvls_local is None else nvls_local
    return ring_channels(link) * channel_bytes(link, ranks) + nvls_bytes(link, local)


# (imported last, as the module, not its names: overheads imports this module; a function-level import costs its
# resolution on every call, and this one sits on the engine's and the planner's hot path)
from . import overheads as _overheads  # noqa: E402
