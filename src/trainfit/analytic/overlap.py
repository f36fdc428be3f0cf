"""Compute slowed by the collectives it overlaps (issue 14, mechanism: NCCL's SMs).

An NCCL collective runs one CTA per channel, and "NCCL CTAs won't share an SM with compute kernels" (NVIDIA/nccl#689,
quoted in #1656): while a collective is in flight the overlapped kernels get S − C of the S SMs
(data/kernels.toml `nccl_channels`), so they progress at r = (S − C)/S. For compute of W seconds (at full rate)
overlapping a collective of T seconds: during T the compute does r·T of its work, the rest runs at full rate, so
the pair takes max(T, W + min(T, W/r)·(1 − r)) — W/r when the collective outlasts the slowed compute.

NB optimistic: only the SMs are counted; the collective's HBM traffic (each byte stored and re-read, 2-3x the link
rate: NVIDIA/nccl#1428) also slows memory-bound kernels — #1428 measured an A100 GEMM at 2.08 ms vs 1.18 ms alone.
"""
from __future__ import annotations

from ..hardware import GPU
from .roofline import kernels_for


def overlapped_seconds(gpu: GPU, comm: float, compute: float) -> float:
    """Wall time of `compute` seconds of kernels overlapping a `comm`-second collective (see module doc)."""
    kn = kernels_for(gpu)
    if comm <= 0 or compute <= 0 or not kn.nccl_channels or kn.nccl_channels >= kn.sms:
        return max(comm, compute)
    lost = kn.nccl_channels / kn.sms  # 1 − r
    return max(comm, compute + min(comm, compute / (1 - lost)) * lost)


def exposed(gpu: GPU, comm: float, compute: float) -> float:
    """The seconds the pair adds beyond the compute alone (exposed communication + the compute's slowdown)."""
    return overlapped_seconds(gpu, comm, compute) - compute
