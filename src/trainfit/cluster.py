"""Clusters as they are built (`--cluster NAME|FILE`, no torch): the GPUs one NVLink domain joins, the node's
scale-out NICs (rails) and their rate, and whether the switches reduce (NVLS, SHARP). data/clusters.toml is the
catalog; a user's TOML file with the same fields describes their own. A GPU without --cluster runs on its usual
node: gpus.json's gpus_per_node, one NIC of its inter_node_bandwidth per GPU, NVLS where NCCL enables it.
parallel/collectives.py times every collective on it (Links.of)."""
from __future__ import annotations

import difflib
import math
import os
import tomllib
from dataclasses import dataclass, replace
from functools import lru_cache
from importlib import resources

from .errors import GPUFileError, SetupError, UnknownGPUError
from .hardware import GPU, get_gpu, refuse_unknown_fields

# field -> (what it is, an example as the file writes it); all required but sharp (false), gpus and source
FIELDS = {
    "gpus_per_node": ("GPUs in one NVLink/NVSwitch domain (a node; 72 for an NVL72 rack)", "8"),
    "nics": ("compute NICs (rails) of the node for the scale-out network", "8"),
    "nic_bandwidth": ("one NIC's rate in bytes/s, one way (400 Gb/s = 50e9)", "50e9"),
    "nvls": ("whether the NVSwitch reduces (NVLink SHARP: sm_90+ NVSwitch nodes)", "true"),
    "sharp": ("whether the network reduces across nodes (InfiniBand SHARP with NCCL's CollNet plugin)", "false"),
    "gpus": ("the catalog GPUs the node holds", '["H100-80GB"]'),
    "source": ("where the numbers come from", '"vendor datasheet"'),
    "host_memory": ("bytes of host (CPU) memory in one node: what offloaded states and pinned buffers may take",
                    "2199023255552"),
    "host_memory_source": ("where host_memory comes from", '"vendor datasheet"'),
}
OPTIONAL = ("gpus", "source", "sharp", "host_memory", "host_memory_source")


@dataclass(frozen=True)
class Cluster:
    name: str
    gpus_per_node: int
    nics: int
    nic_bandwidth: float  # bytes/s, one NIC, one way
    nvls: bool
    sharp: bool = False
    gpus: tuple[str, ...] = ()
    source: str = ""
    host_memory: float = 0.0  # bytes of host memory per node; 0: not known

    @property
    def nic_share(self) -> float:
        """One GPU's share of the node's NICs, bytes/s (GPU.inter_node_bandwidth's meaning)."""
        return self.nics * self.nic_bandwidth / self.gpus_per_node


def _validated(where: str, data: dict, name: str) -> Cluster:
    """`data`'s fields as a Cluster, each checked; a mistake is one line naming the field and the fix."""
    refuse_unknown_fields(where, data, FIELDS)
    for k in FIELDS:
        if k not in data and k not in OPTIONAL:
            raise GPUFileError(f"{where}: missing field {k!r}: add {k} = {FIELDS[k][1]} ({FIELDS[k][0]})")

    def bad(k: str, why: str) -> GPUFileError:
        return GPUFileError(f"{where}: field {k!r} {why}: set {k} = {FIELDS[k][1]} ({FIELDS[k][0]})")

    for k in ("gpus_per_node", "nics"):
        v = data[k]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise bad(k, f"must be a positive integer, got {v!r}")
    bw = data["nic_bandwidth"]
    if isinstance(bw, bool) or not isinstance(bw, (int, float)) or not math.isfinite(bw) or bw <= 0:
        raise bad("nic_bandwidth", f"must be a positive number of bytes/s, got {bw!r}")
    if bw < 1e8:
        raise bad("nic_bandwidth", f"= {bw:g} is too small for bytes/s (a value in Gb/s or GB/s?)")
    for k in ("nvls", "sharp"):
        if k in data and not isinstance(data[k], bool):
            raise bad(k, f"must be true or false, got {data[k]!r}")
    gpus = data.get("gpus", [])
    if not isinstance(gpus, list) or not all(isinstance(g, str) and g.strip() for g in gpus):
        raise bad("gpus", f"must be a list of catalog GPU names, got {gpus!r}")
    gpus = [_catalog_name(g, where) for g in gpus]
    source = data.get("source", f"user file {where}")
    if not isinstance(source, str):
        raise bad("source", f"must be text, got {source!r}")
    host = data.get("host_memory", 0)
    if isinstance(host, bool) or not isinstance(host, (int, float)) or not math.isfinite(host) or host < 0:
        raise bad("host_memory", f"must be a number of bytes >= 0, got {host!r}")
    if 0 < host < 2**30:
        raise bad("host_memory", f"= {host:g} is too small for bytes (a value in GiB or TB?)")
    return Cluster(name, data["gpus_per_node"], data["nics"], float(bw), data["nvls"], data.get("sharp", False),
                   tuple(gpus), source, float(host))


def _catalog_name(name: str, where: str) -> str:
    """A cluster's `gpus` entry as the catalog names it (an alias or another case read as get_gpu reads --gpu, so
    in_nodes_of compares it with the GPU's own name): an unknown one refused where the file is read, not when a
    --gpu is placed in its nodes."""
    try:
        return get_gpu(name).name
    except UnknownGPUError as e:
        raise GPUFileError(f"{where}: field 'gpus': {e}") from None


@lru_cache(maxsize=1)
def catalog() -> dict[str, Cluster]:
    raw = tomllib.loads(resources.files("trainfit.data").joinpath("clusters.toml").read_text())
    return {name: _validated(f"clusters.toml [{name}]", entry, name) for name, entry in raw.items()}


def is_cluster_file(name: str) -> bool:
    n = name.strip()
    return n.lower().endswith(".toml") or os.sep in n


def resolve_cluster(name: str) -> Cluster:
    """`--cluster`: a catalog name (data/clusters.toml) or the path of a TOML file with its fields; under
    references.catalog_only (the web app) a catalog name only, found without touching the file system."""
    from .references import catalog_only_rule, check_name, shown

    key = name.strip().lower()
    cat = catalog()
    if key in cat:
        return cat[key]
    near = difflib.get_close_matches(key[:64], list(cat), n=3, cutoff=0.5)
    hint = f" Did you mean: {', '.join(near)}?" if near else ""
    if catalog_only_rule() is not None or not is_cluster_file(name):
        raise SetupError(f"--cluster {shown(name.strip())}: unknown cluster; give one of {', '.join(cat)}"
                         f"{'' if catalog_only_rule() is not None else ' or a .toml file with their fields'}.{hint}")
    path = name.strip()
    check_name(path, "cluster", GPUFileError)
    where = f"cluster file {path}"
    if not os.path.isfile(path):
        raise GPUFileError(f"{where} not found: give a catalog cluster ({', '.join(cat)}) or a .toml file with "
                           f"the fields {', '.join(FIELDS)}")
    try:
        with open(path, "rb") as f:
            data = tomllib.loads(f.read().decode())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise GPUFileError(f"{where} cannot be read as TOML: {first}") from None
    return _validated(where, data, os.path.splitext(os.path.basename(path))[0])


def usual_node(gpu: GPU) -> Cluster:
    """The GPU's usual node: gpus.json's gpus_per_node GPUs, one NIC of its inter_node_bandwidth each; NVLS where
    NCCL turns it on by default (an sm_90+ NVSwitch node of more than 2 GPUs: data/overheads.toml [nccl.gpus],
    transport/nvls.cc)."""
    link = _nccl_buffers.interconnect(gpu) or {}
    nvls = "nvlinks" in link and link.get("sm", 0) >= 90 and gpu.gpus_per_node > 2
    return Cluster(f"{gpu.name} node", gpu.gpus_per_node, gpu.gpus_per_node, gpu.inter_node_bandwidth, nvls,
                   source=gpu.source)


def with_cluster(gpu: GPU, cluster: Cluster | None) -> GPU:
    """`gpu` in `cluster`'s nodes: its gpus_per_node the NVLink domain's and its inter_node_bandwidth one GPU's
    share of the node's NICs (so every reader of the two sees the cluster); a cluster that names its GPUs must
    hold this one."""
    if cluster is None:
        return gpu
    if cluster.gpus and gpu.kernels not in cluster.gpus and gpu.name not in cluster.gpus:
        raise SetupError(f"--cluster {cluster.name} holds {', '.join(cluster.gpus)}, not the {gpu.name}: pick a "
                         "cluster of that GPU or give a cluster file without `gpus`")
    return replace(gpu, gpus_per_node=cluster.gpus_per_node, inter_node_bandwidth=cluster.nic_share,
                   cluster=cluster, host_memory=int(cluster.host_memory) or gpu.host_memory)


def in_nodes_of(gpu: GPU, other: GPU) -> GPU | None:
    """`other` in the nodes `gpu` runs in (a larger GPU the advice offers): `gpu`'s cluster (with_cluster: its GPUs per
    node and NICs) and host memory (--host-memory or the cluster's), so that `--gpu OTHER` beside the same flags is
    the setup judged; None where that cluster names its GPUs and `other` is not one of them (that --gpu is refused)."""
    try:
        placed = with_cluster(other, gpu.cluster if isinstance(gpu.cluster, Cluster) else None)
    except SetupError:
        return None
    return replace(placed, host_memory=gpu.host_memory)


def larger_in_nodes(gpu: GPU) -> list[GPU]:
    """The catalog's GPUs of `gpu`'s vendor with more memory, each in `gpu`'s nodes (in_nodes_of; one the cluster does
    not hold left out), in catalog order: what the advice and plan's diagnosis offer as a larger GPU."""
    from .hardware import list_gpus

    placed = (in_nodes_of(gpu, g) for g in list_gpus() if g.memory > gpu.memory and g.vendor == gpu.vendor)
    return [g for g in placed if g is not None]


def cluster_of(gpu: GPU) -> Cluster:
    """The cluster `gpu` runs in: the one with_cluster placed it in, else its usual node."""
    return gpu.cluster if isinstance(gpu.cluster, Cluster) else usual_node(gpu)


# (imported last, as the module, not its names: nccl_buffers.py reads the overheads, which read the clusters; a function-level import costs its
# resolution on every call, and this one sits on the engine's and the planner's hot path)
from . import nccl_buffers as _nccl_buffers  # noqa: E402
