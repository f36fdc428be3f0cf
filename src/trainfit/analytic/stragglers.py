"""The slowest GPU sets the pace of a synchronous step (issue 14, mechanism: chip-to-chip clock spread).

GPUs of one SKU do not run at one speed: under sustained tensor-core load a board reaches its power cap and its
power management lowers the SM clock, by how much depends on the chip's leakage and cooling (manufacturing
variability). Sinha et al., "Not All GPUs Are Created Equal: Characterizing Variability in Large-Scale,
Accelerator-Rich Systems", SC22 (arXiv 2208.11035): 8 % average (max 22 %) performance variation between GPUs of
one SKU in five clusters, greatest for compute-bound kernels, outliers up to 1.5x slower than the median GPU.

A data-, tensor- or pipeline-parallel step synchronises every rank at each collective, and a chip's speed persists
from one collective to the next, so the whole job runs at its slowest GPU's pace. With the chips' compute rates
spread normally with coefficient of variation σ around the rate the kernel model predicts (the mean chip), the
slowest of N runs the compute-bound kernels (GEMMs, attention) E[max of N] · σ slower: Blom's approximation
E[max_N] ≈ Φ⁻¹((N − 0.375) / (N + 0.25)) (Blom 1958, the expected order statistics of a normal sample): 0 for one
GPU, 1.43 for 8, 3.03 for 512, 3.96 for 16,384 (NB: +4 % over the exact value at 2, within 1 % from 10 on).

σ (kernels.toml [cluster] compute_spread) is measured on the measured H200s, not taken from Sinha et al.: their metric
is a spread over whole clusters, not a coefficient of variation. The kernel model sits at those chips' mean (the
llama-3.1-8b step's GEMMs: 118.9 ms predicted, 119.3 ms the six chips' mean).
NB: memory-bound kernels are not slowed (the HBM clock is not power-managed: between two of the H200s the same
GEMMs differed by 4-8 %, the memory-bound kernels by < 1 %); a normal tail is optimistic where a cluster keeps its
1.5x outliers in service, pessimistic where operators drain slow nodes; the bubble and the exposed communication
are not re-timed around the slower compute.
"""
from __future__ import annotations

from functools import lru_cache
from statistics import NormalDist

from .roofline import cluster_table


@lru_cache(maxsize=256)
def expected_max(n: int) -> float:
    """E[max of n standard normal draws] by Blom's approximation (0 for n = 1)."""
    if n <= 1:
        return 0.0
    return NormalDist().inv_cdf((n - 0.375) / (n + 0.25))


def slowest_gpu_factor(world: int) -> float:
    """How much longer the slowest of `world` synchronised GPUs takes over the compute-bound kernels than the mean
    chip: σ · E[max of world] (module doc)."""
    return float(cluster_table()["compute_spread"]) * expected_max(world)
