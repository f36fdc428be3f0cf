"""GPU catalog: data in data/gpus.json, read with the standard library (no torch)."""
from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, replace
from functools import lru_cache
from importlib import resources

from .errors import UnknownGPUError


@dataclass(frozen=True)
class GPU:
    name: str  # canonical, e.g. "H100-80GB"
    memory: int  # bytes of device memory
    memory_bandwidth: float  # bytes/s
    peak_flops: dict[str, float]  # dense FLOP/s per dtype: fp32, tf32, bf16, fp16, fp8, int8
    power_watts: float  # board power (TDP)
    intra_node_bandwidth: float  # bytes/s per GPU, one direction (NVLink / Infinity Fabric / PCIe)
    inter_node_bandwidth: float  # bytes/s per GPU across nodes (typical NIC per GPU)
    gpus_per_node: int
    price_per_hour: float  # USD, typical on-demand cloud price; override with --price
    vendor: str = "nvidia"
    aliases: tuple[str, ...] = ()
    source: str = ""

    def flops_for(self, dtype: str) -> float:
        """Dense peak for the matmul dtype; fp32 training uses TF32 tensor cores where the GPU has them
        (PyTorch's default for cuDNN convs; matmuls need allow_tf32 — NB: optimistic for fp32 matmuls)."""
        f = self.peak_flops
        if dtype == "fp32":
            return f.get("tf32") or f["fp32"]
        if dtype in f:
            return f[dtype]
        if dtype == "bf16":  # no bf16 tensor cores (V100, T4): PyTorch emulates bf16 at about fp32 speed
            return f["fp32"]
        # fp8 / int8 without hardware support run in 16-bit; unknown dtypes get the 16-bit peak too
        return f.get("bf16") or f.get("fp16") or f["fp32"]

    def __hash__(self) -> int:  # peak_flops is a dict, so the generated hash would raise
        return hash((self.name, self.memory, self.price_per_hour))

    def with_price(self, price: float | None) -> "GPU":
        return self if price is None else replace(self, price_per_hour=price)


@lru_cache(maxsize=1)
def _catalog() -> dict[str, GPU]:
    raw = json.loads(resources.files("trainfit.data").joinpath("gpus.json").read_text())
    out = {}
    for entry in raw["gpus"]:
        entry = dict(entry)
        entry["aliases"] = tuple(entry.get("aliases", ()))
        gpu = GPU(**entry)
        if gpu.name in out:
            raise ValueError(f"gpus.json: GPU {gpu.name!r} is listed twice")
        out[gpu.name] = gpu
    return out


@lru_cache(maxsize=1)
def _index() -> dict[str, GPU]:
    """Lookup key (name or alias) -> GPU; a key naming two GPUs is a data bug."""
    index: dict[str, GPU] = {}
    for gpu in _catalog().values():
        for n in (gpu.name, *gpu.aliases):
            k = _key(n)
            if k in index and index[k] is not gpu:
                raise ValueError(f"gpus.json: {n!r} names both {index[k].name} and {gpu.name}")
            index[k] = gpu
    return index


def list_gpus() -> list[GPU]:
    return list(_catalog().values())


def _key(name: str) -> str:
    return "-".join(name.strip().lower().replace("_", " ").replace("-", " ").split())


def get_gpu(name: str) -> GPU:
    """Case-insensitive lookup by name or alias; a near miss gets a 'did you mean'."""
    index = _index()
    key = _key(name)
    if key in index:
        return index[key]
    near = difflib.get_close_matches(key, list(index), n=6, cutoff=0.5)
    names = list(dict.fromkeys(index[n].name for n in near))[:3]  # several aliases may name one GPU
    hint = f" Did you mean: {', '.join(names)}?" if names else ""
    raise UnknownGPUError(f"unknown GPU {name!r}.{hint} Run `trainfit gpus` for the list.")
