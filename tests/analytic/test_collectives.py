"""NCCL's cost model (analytic/parallel/collectives.py), each time derived by hand from src/graph/tuning.cc at
v2.27.5-1: baseLat (:134-137), hwLat (:143-156), the bandwidth refinements (:266-327), the latencies (:337-377) and
ncclTopoGetAlgoTime (:561-577). Sizes are 1 GiB unless said: large enough that the tree's size correction is 1."""
import pytest

from trainfit.analytic.parallel.collectives import Links, busbw, ranks_per_node
from trainfit.cluster import resolve_cluster, with_cluster
from trainfit.hardware import get_gpu

GIB = 2**30
A100 = Links.of(with_cluster(get_gpu("A100-80GB"), resolve_cluster("dgx-a100")))
H100 = Links.of(with_cluster(get_gpu("H100-80GB"), resolve_cluster("dgx-h100")))


def test_the_links_are_the_clusters():
    # DGX A100: NVLink 300 GB/s x link_fraction 0.69 (kernels.toml); 8 NICs of 200 Gb/s = 25 GB/s per GPU
    assert A100.intra == pytest.approx(300e9 * 0.69)
    assert A100.inter == 25e9 and A100.gpus_per_node == 8 and not A100.nvls
    assert H100.nvls and H100.ll128 and H100.inter == 50e9


def test_placement_puts_tp_innermost():
    assert ranks_per_node(1, 8, 8) == 8      # a tp group of 8: one node
    assert ranks_per_node(8, 16, 8) == 1     # dp over tp 8: one rank per node, its own rail
    assert ranks_per_node(2, 16, 8) == 4     # dp over tp 2: 4 ranks of each node
    assert ranks_per_node(1, 1, 8) == 1


def test_ring_over_all_rails_of_two_dgx_a100():
    # 16 ranks, 8 a node: ring bus = min(NVLink 207, 8 NICs x 25 = 200) GB/s. Simple latency: 8.4 base + (30 - 2)
    # intra steps x max(3.4, 1 x 3 net overhead) + 2 inter steps x 14 = 131.6 µs, x 1.4 (multi-node plateau).
    # LL128 (0.92 of the bus) and the tree (2 x bytes at 0.92 x 207) are slower at 1 GiB.
    algo, proto, t = A100.best("allreduce", 16, 8, GIB)
    assert (algo, proto) == ("ring", "simple")
    assert t == pytest.approx(131.6e-6 * 1.4 + 2 * 15 / 16 * GIB / 200e9)
    assert busbw(A100, "allreduce", 16, 8, 8 * GIB) == pytest.approx(200e9, rel=0.01)


def test_one_rank_per_node_has_one_rail():
    # tp 8 inside each node: the dp group of 8 has a rank per node, so its ring runs over one NIC (50 GB/s);
    # latency 8.4 + 14 inter steps x 14 (ppn 1: the tree's network latency) = 204.4 µs, x 1.4
    algo, proto, t = H100.best("allreduce", 8, 1, GIB)
    assert (algo, proto) == ("ring", "simple")
    assert t == pytest.approx(204.4e-6 * 1.4 + 2 * 7 / 8 * GIB / 50e9)
    # the same 8 ranks in one node run NVLS: 25 µs + bytes / (5/6 x NVLink 450 x 0.822)
    algo, _, inside = H100.best("allreduce", 8, 8, GIB)
    assert algo == "nvls"
    assert inside == pytest.approx(25e-6 + GIB / (450e9 * 0.822 * 5 / 6))


def test_pat_gathers_with_one_gpu_a_node():
    # all-gather of 1 MiB over 64 nodes, one rank each: PAT 8 + log2(64) x 14 / 3.5 + 64 x 2.8 = 211.2 µs, at 0.75 of
    # the rail; the ring pays 8.4 + 63 x 14 µs (Simple) or 14 + 63 x 8.5 (LL128)
    algo, _, t = H100.best("all_gather", 64, 1, 2**20)
    assert algo == "pat"
    assert t == pytest.approx(211.2e-6 + 63 / 64 * 2**20 / (0.75 * 50e9))


def test_nvls_tree_across_nodes_without_sharp():
    # 32 ranks on 4 H100 nodes: NVLS-tree at 5/6 x min(NVLink, the node's 8 NICs / 2) and latency
    # 25 + 2 x log2(4) x 14 µs; the ring at 400 GB/s (min(370, 400) = 370) is faster at 1 GiB
    t_tree = 81e-6 + GIB / (5 / 6 * 200e9)
    t_ring = (8.4 + (62 - 6) * 3.4 + 6 * 14) * 1.4e-6 + 2 * 31 / 32 * GIB / (450e9 * 0.822)
    algo, _, t = H100.best("allreduce", 32, 8, GIB)
    assert (algo, t) == ("ring", pytest.approx(t_ring))
    assert t < t_tree
    sharp = H100._replace(sharp=True)  # with SHARP: NVLS over the network at 5/6 x min(NVLink, 400 GB/s)
    assert sharp.best("allreduce", 32, 8, GIB) == ("nvls", "simple", pytest.approx(43e-6 + GIB / (5 / 6 * 369.9e9)))
