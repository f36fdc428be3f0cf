"""Collectives as NCCL times them, and the links a group of ranks runs them on (no torch): every parallel axis times
its communication with these.

  * ring formulas (Patarasuk & Yuan 2009; NCCL "bus bandwidth"): all-reduce 2(n−1)/n · bytes / bw, reduce-scatter
    and all-gather (n−1)/n · bytes / bw each (ring_allreduce, ring_half).
  * NCCL's own cost model (src/graph/tuning.cc at v2.27.5-1, the NCCL of the torch 2.8 / 2.9 wheels; `tuning.cc:N`
    below): for each algorithm (ring, tree, NVLS, NVLS-tree, PAT) and protocol (Simple, LL128) a latency and a
    bandwidth, time = latency + bytes / algorithm bandwidth (ncclTopoGetAlgoTime, :561-577), and NCCL runs the
    fastest (Links.allreduce / Links.reduce_scatter / Links.all_gather: the least of the times).
  * links: inside a node `intra`, the ring bus bandwidth NCCL reaches on NVLink (the datasheet rate × the measured
    data/kernels.toml link_fraction); across nodes `inter`, one GPU's share of its node's NICs (gpus.json, or the
    --cluster's NICs × their rate / GPUs per node). A group with g ranks on each of its N nodes runs its NCCL
    channels over the g rails those ranks own: its node's network bandwidth is g × inter (NCCL builds one ring /
    tree channel per NIC: a data-parallel group of 8 ranks per node drives all 8 NICs, one of 1 rank per node its
    own rail only).
  * placement (ranks_per_node): tensor-parallel ranks innermost, then context, expert/data, pipeline outermost, as
    Megatron's RankGenerator order 'tp-cp-ep-dp-pp' (megatron/core/parallel_state.py:562, megatron-core 0.16.1:
    initialize_model_parallel's order default) and torchtitan's meshes ["pp", "dp_replicate", "fsdp", "tp"]
    (torchtitan/distributed/parallel_dims.py:96-98, 0.2.2: the last dimension varies fastest).
NB: the LL protocol (small messages below ~64 KiB) is not modelled: pessimistic there by tens of µs. NB: channel
counts are not modelled, so the per-channel caps of LL128 and tree (tuning.cc:172-189, 280-283) are left out:
optimistic where they bind (few channels). NB: the graph search's extra inter-node latency (graph->latencyInter,
tuning.cc:333-335) is taken as 0: optimistic by a few µs per inter-node step.
"""
from __future__ import annotations

from typing import NamedTuple

from ...hardware import GPU
from ..memo import remember_held, table
from ..roofline import kernels_for

US = 1e-6
# tuning.cc:134-137 baseLat (µs), tuning.cc:143-156 hwLat (µs) by link: {algorithm: (LL128, Simple)}
_BASE = {"tree": (14.0, 8.4), "ring": (14.0, 8.4), "nvls": (0.0, 0.0), "nvls_tree": (0.0, 0.0)}
_HW = {"nvlink": {"tree": (1.25, 4.0), "ring": (1.9, 3.4), "nvls": (0.0, 25.0), "nvls_tree": (0.0, 25.0)},
       "pci": {"tree": (1.9, 4.0), "ring": (2.5, 5.7), "nvls": (0.0, 0.0), "nvls_tree": (0.0, 0.0)},
       "net": {"tree": (8.5, 14.0), "ring": (4.0, 14.0), "nvls": (0.0, 18.0), "nvls_tree": (0.0, 14.0)}}
# tuning.cc:553-559 treeCorrectionFactor (LL128, Simple rows) by log2(bytes / 64), 64 B to 256 MiB
_TREE_CORRECTION = {
    "ll128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0),
    "simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9)}
NET_OVERHEAD_US = 1.0  # getNetOverhead (tuning.cc:204-209): 1 µs on Intel hosts (2 on AMD: NB optimistic there)


def ring_allreduce(n: int, nbytes: float, bw: float) -> float:
    return 0.0 if n <= 1 else 2 * (n - 1) / n * nbytes / bw


def ring_half(n: int, nbytes: float, bw: float) -> float:
    """Reduce-scatter or all-gather of a tensor of `nbytes` (full size) over n ranks."""
    return 0.0 if n <= 1 else (n - 1) / n * nbytes / bw


def ranks_per_node(stride: int, size: int, gpus_per_node: int) -> int:
    """How many of a group's `size` ranks share a node, the group's ranks `stride` apart in the global order (the
    product of the sizes of the axes placed inside it, see the module doc): all of them while stride × size fits in
    a node, one where the stride already spans a node."""
    if size <= 1:
        return 1
    return max(1, min(size, gpus_per_node // max(1, stride)))


_LINKS = table()  # Links.of's memo: id(gpu) -> ((gpu,), its Links)


def _log2i(x: int) -> int:
    return max(0, int(x).bit_length() - 1)  # tuning.cc's log2i: floor(log2 x)


class Links(NamedTuple):
    """The bandwidths (bytes/s) a rank's collectives run at, inside and across nodes, and what NCCL may run there.
    intra: NVLink per GPU after link_fraction; inter: one NIC per GPU (the GPU's share of the node's NICs)."""

    intra: float
    inter: float
    gpus_per_node: int
    link: str = "nvlink"    # what joins a node's GPUs in NCCL's latency table: "nvlink" or "pci"
    sm: int = 0             # compute capability × 10 (0: unknown); the ring plateau is 1.9 below sm_80, else 1.4
    ll128: bool = False     # LL128 enabled (tuning.cc:457-471: NVLink inside the node, one GPU generation)
    nvls: bool = False      # NVLink SHARP in the NVLink domain (sm_90+ NVSwitch with multicast)
    sharp: bool = False     # in-network reduction across nodes (CollNet / NVLS with the SHARP plugin)

    @classmethod
    def of(cls, gpu: GPU) -> "Links":
        """`gpu`'s links; memoised on the GPU object (a GPU never changes once built: frozen), not on its equality,
        which leaves out its cluster (GPU.cluster: compare=False); the entry holds the GPU, so its id is not reused
        while it lives. Cleared with the op-list memos (compute_time.clear_memos)."""
        return remember_held(_LINKS, id(gpu), (gpu,), lambda: cls._of(gpu), limit=64)  # a process sees a few GPUs

    @classmethod
    def _of(cls, gpu: GPU) -> "Links":
        c = _cluster.cluster_of(gpu)
        link = _nccl_buffers.interconnect(gpu) or {}
        # NB: Infinity Fabric (AMD: RCCL, whose tuning is its own) and GPUs NCCL's topology is not modelled for
        # (data/overheads.toml [nccl.gpus]) but whose cluster has NVLS are timed with NVLink's latencies
        nvlink = "nvlinks" in link or (not link and (gpu.vendor == "amd" or c.nvls))
        return cls(gpu.intra_node_bandwidth * kernels_for(gpu).link_fraction, gpu.inter_node_bandwidth,
                   gpu.gpus_per_node, "nvlink" if nvlink else "pci", int(link.get("sm", 0)),
                   "nvlinks" in link, c.nvls, c.sharp)

    def within_node(self, span: int) -> bool:
        """Whether a group spanning `span` consecutive ranks sits in one node."""
        return span <= self.gpus_per_node

    def over(self, span: int) -> float:
        """The point-to-point bandwidth of a group spanning `span` consecutive ranks (pipeline sends, ring
        attention: one peer at a time, so one rail)."""
        return self.intra if self.within_node(span) else self.inter

    def bus(self, n: int, per_node: int) -> float:
        """The ring's bus bandwidth of a group of n ranks, `per_node` of them on each node (tuning.cc:266, 276:
        channels × bwIntra on one node, × bwInter across nodes; a channel per rail, g rails per node)."""
        g = max(1, min(per_node, n))
        return self.intra if g >= n else min(self.intra, g * self.inter)

    def _choices(self, coll: str, n: int, g: int, nbytes: float):
        """(algorithm, protocol, seconds) for each algorithm NCCL may run `coll` with (tuning.cc:249-381)."""
        nodes = -(-n // g)
        protos = ("ll128", "simple") if self.ll128 else ("simple",)
        net = g * self.inter
        steps = 2 * (n - 1) if coll == "allreduce" else n - 1  # tuning.cc:250-252
        out = []
        for p in protos:
            k = 0 if p == "ll128" else 1
            # ring (tuning.cc:266, 276, 279-280, 323, 337-356; plateau :570-573)
            bus = self.bus(n, g) * (0.92 if p == "ll128" else 1.0)
            alg = bus * n / steps
            intra_lat = _HW[self.link]["ring"][k]
            inter_steps = 0 if nodes == 1 else (2 * (nodes - 1) if coll == "allreduce" else nodes - 1)
            if nodes > 1:
                intra_lat = max(intra_lat, NET_OVERHEAD_US * (3 if p == "simple" else 1))
            inter_lat = _HW["net"]["tree" if g == 1 else "ring"][k]  # ppn 1: the tree's network latency (:332)
            lat = _BASE["ring"][k] + (steps - inter_steps) * intra_lat + inter_steps * inter_lat
            if p == "simple" and nodes > 1 and coll == "allreduce":
                lat *= 1.9 if 0 < self.sm < 80 else 1.4
            out.append(("ring", p, lat * US + nbytes / alg))
            if coll == "allreduce":
                # tree (tuning.cc:266, 281, 283, 325, 357-361; size correction :568-569): each byte goes up and down
                # the tree (algorithm bandwidth = bus / 2); two nodes: each node's NICs carry it once each way
                up = self.intra if nodes == 1 else min(self.intra, (2 if nodes == 2 else 1) * net)
                bus = up * 0.92 * ((7 / 9 if nodes == 1 else 120 / 128) if p == "ll128" else 1.0)
                log = _log2i(int(nbytes) >> 6)
                corr = _TREE_CORRECTION[p][log] if 0 <= log < 23 and nbytes >= 64 else 1.0
                lat = _BASE["tree"][k] + 2 * ((g - 1) * _HW[self.link]["tree"][k]
                                              + _log2i(nodes) * _HW["net"]["tree"][k])
                out.append(("tree", p, lat * US + nbytes / (bus * 0.5 * corr)))
        if self.nvls and g > 2 and self.link == "nvlink":
            # NVLS (tuning.cc:267-275, 324, 367-371, 442-448): the NVSwitch reduces; all-reduce only (its
            # all-gather / reduce-scatter ties the ring's bandwidth, :272). One node, or across nodes with SHARP;
            # else NVLS-tree: the node's heads run a tree over the network (half its NICs past two nodes)
            if coll == "allreduce":
                if nodes == 1 or self.sharp:
                    bw = self.intra if nodes == 1 else min(self.intra, net)
                    lat = _HW["nvlink"]["nvls"][1] + (_HW["net"]["nvls"][1] if nodes > 1 else 0.0)
                    out.append(("nvls", "simple", lat * US + nbytes / (bw * 5 / 6)))
                else:
                    bw = min(self.intra, net if nodes <= 2 else net / 2)
                    lat = _HW["nvlink"]["nvls_tree"][1] + 2 * _log2i(nodes) * _HW["net"]["nvls_tree"][1]
                    out.append(("nvls_tree", "simple", lat * US + nbytes / (bw * 5 / 6)))
        if coll != "allreduce" and g == 1 and nodes > 1:
            # PAT (tuning.cc:191-199, 285, 372-377): all-gather / reduce-scatter with one GPU per node
            lat = 8 + _log2i(nodes) * _HW["net"]["tree"][1] / 3.5 + n * 2.8
            out.append(("pat", "simple", lat * US + nbytes * (n - 1) / n / (self.bus(n, g) * 0.75)))
        return out

    def best(self, coll: str, n: int, per_node: int, nbytes: float, calls: int = 1) -> tuple[str, str, float]:
        """(algorithm, protocol, seconds) NCCL picks for `coll` ("allreduce", "reduce_scatter", "all_gather") of
        `nbytes` (the full tensor) over n ranks, `per_node` of them on each node: the fastest (tuning.cc:561-577).
        `calls`: the bytes go in that many equal collectives (buckets, FSDP units), each paying its latency."""
        if n <= 1 or nbytes <= 0:
            return ("none", "none", 0.0)
        g, calls = max(1, min(per_node, n)), max(1, int(calls))
        algo, proto, t = min(self._choices(coll, n, g, float(nbytes) / calls), key=lambda c: c[2])
        return algo, proto, t * calls

    def allreduce(self, n: int, per_node: int, nbytes: float, calls: int = 1) -> float:
        return self.best("allreduce", n, per_node, nbytes, calls)[2]

    def reduce_scatter(self, n: int, per_node: int, nbytes: float, calls: int = 1) -> float:
        """Reduce-scatter of a tensor of `nbytes` (full size) over n ranks."""
        return self.best("reduce_scatter", n, per_node, nbytes, calls)[2]

    def all_gather(self, n: int, per_node: int, nbytes: float, calls: int = 1) -> float:
        """All-gather into a tensor of `nbytes` (full size) over n ranks."""
        return self.best("all_gather", n, per_node, nbytes, calls)[2]


def busbw(links: Links, coll: str, n: int, per_node: int, nbytes: float) -> float:
    """nccl-tests' bus bandwidth of the collective NCCL picks (nccl-tests doc/PERFORMANCE.md: algbw × 2(n−1)/n for
    all-reduce, × (n−1)/n for all-gather / reduce-scatter), bytes/s."""
    t = links.best(coll, n, per_node, nbytes)[2]
    factor = 2 * (n - 1) / n if coll == "allreduce" else (n - 1) / n
    return 0.0 if t <= 0 else nbytes / t * factor


# (imported last, as the module, not its names: cluster.py and nccl_buffers.py sit above the analytic package; a function-level import costs its
# resolution on every call, and this one sits on the engine's and the planner's hot path)
from ... import cluster as _cluster, nccl_buffers as _nccl_buffers  # noqa: E402
