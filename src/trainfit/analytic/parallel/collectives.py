"""Ring collectives and the link a group of ranks runs them on (no torch): every parallel axis times its
communication with these.

  * ring collectives (Patarasuk & Yuan 2009; NCCL "bus bandwidth"): all-reduce 2(n−1)/n · bytes / bw,
    reduce-scatter and all-gather (n−1)/n · bytes / bw each.
  * links: inside a node the NVLink rate × the bus-bandwidth fraction NCCL reaches (data/kernels.toml
    link_fraction: protocol overhead), across nodes the per-GPU inter-node bandwidth (one NIC per GPU, as in
    DGX/HGX nodes). Placement: tensor-parallel ranks innermost, then pipeline, then data parallel (tp × pp packed
    into nodes first); a group whose ranks all sit in one node (its span: the consecutive ranks it covers, each
    axis names its own) uses the intra-node link, otherwise the inter-node one.
NB: latency terms (α in the α-β model) are ignored: optimistic for very large rings and small messages.
"""
from __future__ import annotations

from typing import NamedTuple

from ...hardware import GPU
from ..roofline import kernels_for


def ring_allreduce(n: int, nbytes: float, bw: float) -> float:
    return 0.0 if n <= 1 else 2 * (n - 1) / n * nbytes / bw


def ring_half(n: int, nbytes: float, bw: float) -> float:
    """Reduce-scatter or all-gather of a tensor of `nbytes` (full size) over n ranks."""
    return 0.0 if n <= 1 else (n - 1) / n * nbytes / bw


class Links(NamedTuple):
    """The bandwidths (bytes/s) a rank's collectives run at, inside and across nodes."""

    intra: float
    inter: float
    gpus_per_node: int

    @classmethod
    def of(cls, gpu: GPU) -> "Links":
        return cls(gpu.intra_node_bandwidth * kernels_for(gpu).link_fraction, gpu.inter_node_bandwidth,
                   gpu.gpus_per_node)

    def within_node(self, span: int) -> bool:
        """Whether a group spanning `span` consecutive ranks sits in one node."""
        return span <= self.gpus_per_node

    def over(self, span: int) -> float:
        """The bandwidth of a group spanning `span` consecutive ranks."""
        return self.intra if self.within_node(span) else self.inter
