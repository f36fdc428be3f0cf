"""Compute slowed by the collectives it overlaps (issue 14, mechanism: NCCL's SMs).

An NCCL collective runs one CTA per channel, and "NCCL CTAs won't share an SM with compute kernels" (NVIDIA/nccl#689,
quoted in #1656): while a collective is in flight the overlapped kernels get S − C of the S SMs
(C = the channels of NCCL's topology search, trainfit/nccl_buffers.py; none for GPUs it does not model, such as AMD's:
NB optimistic there), so they progress at r = (S − C)/S. For compute of W seconds (at full rate)
overlapping a collective of T seconds: during T the compute does r·T of its work, the rest runs at full rate, so
the pair takes max(T, W + min(T, W/r)·(1 − r)) — W/r when the collective outlasts the slowed compute.

The collective also moves HBM traffic: every byte it receives is stored and read back, "at least 2x" the link rate
(sjeaugey, NVIDIA/nccl#1428), so memory-bound kernels see HBM − 2·link of the achieved bandwidth. With a share m of
the compute memory-bound, its rate while overlapped is r = 1 / ((1 − m)/r_sm + m/r_hbm).
NB optimistic: 2x (not #1428's 3x with user-buffer copies), and the GEMMs' own HBM reads are not slowed; #1428
measured an A100 GEMM at 2.08 ms overlapped vs 1.18 ms alone, far more than this model's slowdown.

A communication library that is not an NCCL collective names its own SMs (`sms`): DeepEP's and HybridEP's dispatch
and combine kernels run on the SMs Megatron sets for them (parallel/expert.py exchange_sms).
"""
from __future__ import annotations

from ..hardware import GPU
from ..nccl_buffers import interconnect, ring_channels
from .roofline import kernels_for


def nccl_sms(gpu: GPU) -> int:
    """The SMs an NCCL collective holds on `gpu`: one per channel of its topology search (0 where not modelled)."""
    link = interconnect(gpu)
    return ring_channels(link) if link else 0


def _rate(gpu: GPU, mem_share: float, link_bw: float, sms: int | None = None) -> float:
    """Progress rate of the overlapped compute (1 = unslowed), see module doc. sms: the SMs the communication holds
    (None: an NCCL collective's channels)."""
    kn = kernels_for(gpu)
    channels = nccl_sms(gpu) if sms is None else sms
    r_sm = 1 - channels / kn.sms if 0 < channels < kn.sms else 1.0
    hbm = gpu.memory_bandwidth * kn.hbm_fraction
    r_hbm = max(1 - 2 * link_bw / hbm, 0.1) if link_bw > 0 else 1.0  # NB: floor 0.1 keeps a saturated HBM finite
    return 1 / ((1 - mem_share) / r_sm + mem_share / r_hbm)


def overlapped_seconds(gpu: GPU, comm: float, compute: float, mem_share: float = 0.0, link_bw: float = 0.0,
                       sms: int | None = None) -> float:
    """Wall time of `compute` seconds of kernels (`mem_share` of them memory-bound) overlapping a `comm`-second
    collective running at `link_bw` B/s on `sms` SMs (None: NCCL's channels; see module doc)."""
    if comm <= 0 or compute <= 0:
        return max(comm, compute)
    r = _rate(gpu, mem_share, link_bw, sms)
    return max(comm, compute + min(comm, compute / r) * (1 - r))


def exposed(gpu: GPU, comm: float, compute: float, mem_share: float = 0.0, link_bw: float = 0.0,
            sms: int | None = None) -> float:
    """The seconds the pair adds beyond the compute alone (exposed communication + the compute's slowdown)."""
    return overlapped_seconds(gpu, comm, compute, mem_share, link_bw, sms) - compute
