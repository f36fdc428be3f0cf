"""NCCL's cost model (analytic/parallel/collectives.py) against published nccl-tests bus bandwidths per topology.

    python -m bench run nccl_published          # the validation table, writes bench/results/nccl.md

Validation only (calibration.md: no constant is fitted on these, and none is a test gate). Each row is an
all_reduce_perf bus bandwidth at large messages (8 GiB unless said) published for a node type, a node count and the
GPUs per node, beside the bus bandwidth of the algorithm our model picks for the same group (collectives.busbw).
The nodes are the catalog's clusters (data/clusters.toml), or the row's own where its NICs differ.
"""
from __future__ import annotations

import statistics

from bench.data import results_dir
from bench.figures import record
from trainfit.analytic.parallel.collectives import Links, busbw
from trainfit.cluster import Cluster, resolve_cluster, with_cluster
from trainfit.hardware import get_gpu

ABOUT = {"summary": "NCCL cost model vs published nccl-tests bus bandwidths per topology", "minutes": 0.1,
         "quick": None}

NT = "https://github.com/NVIDIA/nccl-tests/issues/"
NC = "https://github.com/NVIDIA/nccl/issues/"
GIB = 2**30
# a HGX A100 with 4 ConnectX-6 200 Gb/s for its 8 GPUs (nccl-tests #100's nodes)
HGX_A100_4NIC = Cluster("hgx-a100-4nic", 8, 4, 25e9, False, gpus=("A100-80GB",), source=f"{NT}100")

# (id, GPU, cluster, nodes, GPUs per node, published busbw GB/s, source, what the source says)
POINTS = [
    ("h100-1node", "H100-80GB", "dgx-h100", 1, 8, 476.0, f"{NT}290",
     "AddyLaddy (NVIDIA): single H100 node with NVLink SHARP, 476 GB/s 'in the expected range for H100'"),
    ("h100-hgx-1node", "H100-80GB", "dgx-h100", 1, 8, 480.0, f"{NT}309",
     "Dell XE9680 (8x H100, 8x CX7 400 Gb/s), NCCL 2.26.2, after tuning: each single node 480 GB/s"),
    ("h100-hgx-2node", "H100-80GB", "dgx-h100", 2, 8, 470.0, f"{NT}309",
     "same nodes: 2 nodes, 16 GPU-NIC pairs, 470 GB/s (NVLS-tree on 2 nodes)"),
    ("h100-hgx-4node", "H100-80GB", "dgx-h100", 4, 8, 365.84, f"{NT}309",
     "same nodes: 4 nodes, 32 GPU-NIC pairs, max busbw 365.84 GB/s"),
    ("h100-ring-8nic", "H100-80GB", "dgx-h100", 8, 8, 396.0, f"{NT}319",
     "AddyLaddy (NVIDIA): ~48 GB/s per CX7 at 400 Gb/s, 'aggregated to achieve up to ~396GB/s with the RING "
     "protocol' (node count not stated; predicted at 8)"),
    ("h100-one-ndr-nic", "H100-80GB", "dgx-h100", 8, 1, 47.0, f"{NT}290",
     "AddyLaddy (NVIDIA): 'For NDR @ 400Gbps you should see 46-48GB/s per NIC' (one GPU per node here; 8 nodes)"),
    ("a100-dgx-multinode", "A100-80GB", "dgx-a100", 8, 8, 192.0, f"{NC}812",
     "AddyLaddy (NVIDIA): 'On an Nvidia DGX-A100 system we have 8x200Gbit/s IB cards and we measure 192GB/s "
     "AllReduce BusBW' (node count not stated; predicted at 8)"),
    ("a100-one-hdr-nic", "A100-80GB", "dgx-a100", 8, 1, 24.0, f"{NT}119",
     "sjeaugey (NVIDIA): 'We usually consider 24GB/s is the peak performance per 200G NIC' (one GPU per node; 8 "
     "nodes)"),
    ("a100-hgx-4nic-2node", "A100-80GB", HGX_A100_4NIC, 2, 8, 91.0, f"{NT}100",
     "2x HGX A100 with 4x CX6 200 Gb/s each, all_reduce_perf 1G-8G: 91 GB/s busbw (NCCL of Jan 2022)"),
]


def predict(gpu: str, cluster, nodes: int, per_node: int, nbytes: float = 8 * GIB) -> tuple[float, str]:
    """(bus bandwidth in GB/s, algorithm/protocol) our model gives the all-reduce of `nbytes`."""
    c = cluster if isinstance(cluster, Cluster) else resolve_cluster(cluster)
    links = Links.of(with_cluster(get_gpu(gpu), c))
    n = nodes * per_node
    algo, proto, _ = links.best("allreduce", n, per_node, nbytes)
    return busbw(links, "allreduce", n, per_node, nbytes) / 1e9, f"{algo}/{proto}"


def rows() -> list[dict]:
    out = []
    for pid, gpu, cluster, nodes, per_node, pub, src, what in POINTS:
        pred, algo = predict(gpu, cluster, nodes, per_node)
        name = cluster.name if isinstance(cluster, Cluster) else cluster
        out.append(dict(id=pid, gpu=gpu, cluster=name, nodes=nodes, per_node=per_node, published=pub,
                        predicted=pred, algorithm=algo, error=pred / pub - 1, source=src, what=what))
    return out


def table(rs: list[dict]) -> str:
    lines = ["| point | GPU | nodes (cluster) | ranks/node | published busbw | predicted busbw | algorithm | error |"
             " source |", "| --- | --- | --- | ---: | ---: | ---: | --- | ---: | --- |"]
    for r in rs:
        lines.append(f"| {r['id']} | {r['gpu']} | {r['nodes']} ({r['cluster']}) | {r['per_node']} | "
                     f"{r['published']:g} GB/s | {r['predicted']:.0f} GB/s | {r['algorithm']} | {r['error']:+.1%} | "
                     f"{r['source']}: {r['what']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    rs = rows()
    errs = [abs(r["error"]) for r in rs]
    worst = max(rs, key=lambda r: abs(r["error"]))
    text = ["# NCCL all-reduce bus bandwidth vs published nccl-tests (validation only)", "",
            "Model: analytic/parallel/collectives.py (NCCL src/graph/tuning.cc at v2.27.5-1; the algorithm NCCL's "
            "tuner would pick). Error = predicted / published busbw − 1 (positive: predicted faster). Nothing is "
            "fitted here.", "", table(rs), "",
            f"{len(rs)} points · median |error| {statistics.median(errs):.1%} · worst {worst['error']:+.1%} "
            f"({worst['id']})", ""]
    out = "\n".join(text)
    print(out)
    (results_dir() / "nccl.md").write_text(out)
    record("nccl_published", "NCCL cost model vs published nccl-tests bus bandwidths", None,
           f"{len(rs)} points: median |error| {statistics.median(errs):.1%}, worst {worst['error']:+.1%}",
           {r["id"]: round(r["error"], 4) for r in rs}, "published",
           rows=[{"table": "published", "runs": "nccl-tests all_reduce_perf bus bandwidths (NVIDIA/nccl-tests and "
                  "NVIDIA/nccl issues)", "kind": "validation", "n": len(rs),
                  "median |error|": f"{statistics.median(errs):.1%}", "worst": f"{worst['error']:+.1%}"}])


if __name__ == "__main__":
    main()
