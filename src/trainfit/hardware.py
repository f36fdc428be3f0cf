"""GPU catalog: data in data/gpus.json, read with the standard library (no torch); and GPUs users describe in a
JSON or TOML file with the catalog's fields (`--gpu my_gpu.toml`)."""
from __future__ import annotations

import difflib
import json
import math
import os
import tomllib
from dataclasses import dataclass, field, replace
from functools import lru_cache
from importlib import resources

from .errors import GPUFileError, UnknownGPUError


@dataclass(frozen=True)
class GPU:
    name: str  # canonical, e.g. "H100-80GB"
    # bytes CUDA can allocate in: cudaMemGetInfo's total (torch.cuda.mem_get_info()[1]), nvidia-smi's memory.total
    # less the framebuffer the driver keeps back (data/gpus.json cuda_memory); fits and serving pools are judged on it
    memory: int
    memory_bandwidth: float  # bytes/s
    peak_flops: dict[str, float]  # dense FLOP/s per dtype: fp32, tf32, bf16, fp16, fp8, int8, mxfp8, fp6, fp4
    power_watts: float  # board power (TDP); a run's --power-limit replaces it (with_power_limit)
    intra_node_bandwidth: float  # bytes/s per GPU, one direction (NVLink / Infinity Fabric / PCIe)
    inter_node_bandwidth: float  # bytes/s per GPU across nodes (typical NIC per GPU)
    gpus_per_node: int
    price_per_hour: float  # USD, typical on-demand cloud price; override with --price
    vendor: str = "nvidia"
    aliases: tuple[str, ...] = ()
    source: str = ""
    smi_memory: int = 0  # nvidia-smi's memory.total in bytes (0: as memory); SGLang sizes its defaults from it
    # the catalog GPU whose measured kernel data the time model uses (data/kernels.toml [gpu."NAME"]: SM count,
    # generation, achieved matmul/HBM/attention fractions); a catalog GPU's is its own name ("": the same)
    kernels: str = ""
    # the board's own power (TDP) at which its datasheet peaks hold, before a run's --power-limit lowered
    # power_watts (0: power_watts); roofline.power_clock scales the compute rates by the two's clocks
    tdp_watts: float = 0.0
    # the cluster.Cluster it runs in (--cluster: cluster.with_cluster); None: its usual node (cluster.usual_node)
    cluster: object = field(default=None, compare=False, repr=False)
    # bytes of host memory in the node the GPU sits in (its cluster's host_memory, or --host-memory); 0: not known,
    # the host memory an offloading step needs is then reported but not judged
    host_memory: int = 0

    def __post_init__(self):
        if not self.smi_memory:
            object.__setattr__(self, "smi_memory", self.memory)
        if not self.tdp_watts:
            object.__setattr__(self, "tdp_watts", self.power_watts)
        if not self.kernels:
            object.__setattr__(self, "kernels", self.name)

    def flops_for(self, dtype: str) -> float:
        """Dense peak for the matmul dtype: 'fp32' the CUDA cores' rate (PyTorch's default for matmuls), 'tf32' the
        TF32 tensor cores where the GPU has them (allow_tf32; cuDNN convolutions' default)."""
        f = self.peak_flops
        if dtype == "tf32":
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

    def with_power_limit(self, watts: float | None) -> "GPU":
        """The same GPU capped at `watts` of board power (--power-limit, nvidia-smi -pl / amd-smi's power cap): it
        replaces power_watts (tdp_watts keeps the board's), so the compute fractions fall by roofline.power_clock
        and the energy is the cap's. The cap's range is analytic.energy.check_power_limit's (api.load_gpu runs it)."""
        return self if watts is None else replace(self, power_watts=float(watts))

    def with_host_memory(self, gib: float | None) -> "GPU":
        """The same GPU in a node of `gib` GiB of host memory (--host-memory), replacing its cluster's."""
        return self if gib is None else replace(self, host_memory=int(round(gib * 2**30)))

    def with_memory(self, gib: float | None) -> "GPU":
        """The same GPU holding `gib` GiB as CUDA reports it (--gpu-memory: a MIG slice, a capped or unlisted variant,
        or the total_gpu_memory vLLM logs). NB: nvidia-smi's total is taken as the same (SGLang's defaults read it)."""
        if gib is None:
            return self
        b = int(round(gib * 2**30))
        return replace(self, memory=b, smi_memory=b)


def _cuda_memory_as_memory(entry: dict) -> dict:
    """A file's fields (gpus.json or a user's) as GPU's: the file's memory is nvidia-smi's total, its cuda_memory
    (default: the same) what CUDA sees, which GPU.memory holds."""
    entry = dict(entry)
    entry["smi_memory"] = entry["memory"]
    entry["memory"] = entry.pop("cuda_memory", entry["memory"])
    return entry


def file_entry(gpu: GPU) -> dict:
    """`gpu` as a GPU file (and data/gpus.json) writes it: memory is nvidia-smi's total, cuda_memory CUDA's, and
    kernels the catalog GPU whose kernel data it is timed with; load_gpu_file reads it back as the same GPU."""
    return {"name": gpu.name, "memory": gpu.smi_memory, "cuda_memory": gpu.memory, "kernels": gpu.kernels,
            "memory_bandwidth": gpu.memory_bandwidth, "peak_flops": dict(gpu.peak_flops),
            "power_watts": gpu.power_watts, "intra_node_bandwidth": gpu.intra_node_bandwidth,
            "inter_node_bandwidth": gpu.inter_node_bandwidth, "gpus_per_node": gpu.gpus_per_node,
            "price_per_hour": gpu.price_per_hour, "vendor": gpu.vendor, "aliases": list(gpu.aliases),
            "source": gpu.source}


@lru_cache(maxsize=1)
def _catalog() -> dict[str, GPU]:
    raw = json.loads(resources.files("trainfit.data").joinpath("gpus.json").read_text())
    out = {}
    for entry in raw["gpus"]:
        entry = dict(entry)
        entry["aliases"] = tuple(entry.get("aliases", ()))
        cuda_source = entry.pop("cuda_memory_source", None)
        if cuda_source:
            entry["source"] += f" CUDA's total: {cuda_source}."
        gpu = GPU(**_cuda_memory_as_memory(entry))
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
    raise UnknownGPUError(f"unknown GPU {name!r}.{_close_hint(key)} Run `trainfit gpus` for the list.")


def _close_hint(key: str) -> str:
    from .references import NAME_MAX

    index = _index()
    near = difflib.get_close_matches(key[:NAME_MAX], list(index), n=6, cutoff=0.5)  # (a huge key: difflib is slow)
    names = list(dict.fromkeys(index[n].name for n in near))[:3]  # several aliases may name one GPU
    return f" Did you mean: {', '.join(names)}?" if names else ""


# -- GPUs from a user's file ----------------------------------------------------------------------------------
# mxfp8: the block-scaled (MX, one e8m0 scale per 32 values) fp8 tensor-core rate where the chip has one (Blackwell,
# CDNA4); fp6 / fp4: the 6- and 4-bit (MX/NV) rates, dense
FLOP_DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8", "int8", "mxfp8", "fp6", "fp4")
# field -> (what it is, an example value written as in the file); required unless in OPTIONAL
FILE_FIELDS = {
    "name": ("a label for reports", "MyGPU-64GB"),
    "memory": ("device memory in bytes, as the driver reports it: nvidia-smi MiB x 2^20", 68719476736),
    "cuda_memory": ("bytes CUDA reports as the total, torch.cuda.mem_get_info()[1]: nvidia-smi's less the driver's "
                    "reserve (default: memory)", 68182605824),
    "kernels": ("the catalog GPU whose measured kernel data the step time uses: its SM count, generation and "
                "achieved matmul/HBM/attention fractions (data/kernels.toml); pick the catalog GPU of the same chip",
                "H100-80GB"),
    "memory_bandwidth": ("bytes/s, datasheet peak", 2.0e12),
    "peak_flops": ("dense FLOP/s per dtype, fp32 required; keys fp32, tf32, bf16, fp16, fp8, int8, mxfp8, "
                   "fp6, fp4",
                   {"fp32": 60e12, "bf16": 800e12}),
    "power_watts": ("board power in W", 700),
    "intra_node_bandwidth": ("bytes/s per GPU, one direction, inside a node: NVLink/PCIe", 450e9),
    "inter_node_bandwidth": ("bytes/s per GPU, one direction, across nodes: the NIC", 50e9),
    "gpus_per_node": ("GPUs per server", 8),
    "price_per_hour": ("USD per GPU-hour", 2.5),
    "vendor": ("nvidia or amd", "nvidia"),
    "aliases": ("other names", ["MyGPU"]),
    "source": ("where the numbers come from", "vendor datasheet"),
}
OPTIONAL = ("name", "vendor", "aliases", "source", "cuda_memory")
# Below these the number is in the wrong unit (GB instead of bytes, TFLOP/s instead of FLOP/s): a real GPU has
# more than 64 MiB, 1 GB/s and 1 GFLOP/s.
_UNIT_FLOOR = {"memory": 2**26, "cuda_memory": 2**26, "memory_bandwidth": 1e9, "intra_node_bandwidth": 1e8,
               "inter_node_bandwidth": 1e8}


def is_gpu_file(name: str) -> bool:
    """`--gpu` names a file when it ends in .json/.toml, holds a path separator, or (where files may be read: not
    under references.catalog_only) is the path of an existing file."""
    from .references import catalog_only_rule

    n = name.strip()
    if n.lower().endswith((".json", ".toml")) or os.sep in n:
        return True
    return catalog_only_rule() is None and os.path.isfile(n)


def refuse_unknown_fields(where: str, data: dict, fields) -> None:
    """A user file's first unknown field, in one line with the nearest known name (or the list of them)."""
    unknown = sorted(set(data) - set(fields))
    if unknown:
        near = difflib.get_close_matches(unknown[0], list(fields), n=1)
        hint = f" (did you mean {near[0]}?)" if near else f"; the fields are: {', '.join(fields)}"
        raise GPUFileError(f"{where}: unknown field {unknown[0]!r}{hint}")


def load_gpu_file(path: str) -> GPU:
    """A GPU described in a JSON or TOML file with the catalog's fields (data/gpus.json), validated field by field;
    any mistake is one line naming the field and the fix. The one place a GPU reference reaches the file system:
    refused under references.catalog_only."""
    from .references import catalog_only_rule, check_name, not_a_file

    path = path.strip()
    if catalog_only_rule() is not None:
        return resolve_gpu(path)  # the catalog, or the rule's one line
    check_name(path, "gpu", GPUFileError)
    where = f"GPU file {path}"
    toml = path.lower().endswith(".toml")
    why = not_a_file(path)
    if why:
        raise GPUFileError(f"GPU file {why}: give a catalog name (see `trainfit gpus`) or a .json/.toml file with "
                           "the catalog's fields")
    try:
        with open(path, "rb") as f:
            raw = f.read()
        data = tomllib.loads(raw.decode()) if toml else json.loads(raw)
    except (OSError, UnicodeDecodeError, ValueError) as e:  # tomllib.TOMLDecodeError and JSONDecodeError are ValueErrors
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise GPUFileError(f"{where} cannot be read as {'TOML' if toml else 'JSON'}: "
                           f"{first}") from None
    if not isinstance(data, dict):
        raise GPUFileError(f"{where} must hold one object (table) of GPU fields, not a {type(data).__name__}")
    refuse_unknown_fields(where, data, FILE_FIELDS)
    for k in FILE_FIELDS:
        if k not in data and k not in OPTIONAL:
            raise GPUFileError(f"{where}: missing field {k!r}: add {_example(k, toml)} ({FILE_FIELDS[k][0]})")
    entry = {k: _check_field(where, k, data[k], toml) for k in FILE_FIELDS if k in data}
    entry.setdefault("name", os.path.splitext(os.path.basename(path))[0])
    entry.setdefault("source", f"user file {path}")
    entry["aliases"] = tuple(entry.get("aliases", ()))
    entry = _cuda_memory_as_memory(entry)
    if entry["memory"] > entry["smi_memory"]:
        raise GPUFileError(f"{where}: cuda_memory ({entry['memory']}) exceeds memory ({entry['smi_memory']}): CUDA "
                           "sees nvidia-smi's total less the driver's reserve; swap them or drop cuda_memory")
    return GPU(**entry)


def _example(k: str, toml: bool) -> str:
    """`k = value` as the file's own syntax writes it (TOML or JSON)."""
    v = FILE_FIELDS[k][1]
    if not toml:
        return f"{json.dumps(k)}: {json.dumps(v)}"
    if isinstance(v, dict):
        return f"{k} = {{{', '.join(f'{d} = {x:g}' for d, x in v.items())}}}"
    return f"{k} = {json.dumps(v) if not isinstance(v, float) else f'{v:g}'}"


def _check_field(where: str, k: str, v, toml: bool):
    what = FILE_FIELDS[k][0]

    def bad(why: str):
        return GPUFileError(f"{where}: field {k!r} {why}: set {_example(k, toml)} ({what})")

    if k in ("name", "vendor", "source"):
        if not isinstance(v, str) or not v.strip():
            raise bad(f"must be non-empty text, got {v!r}")
        if k == "vendor" and v not in ("nvidia", "amd"):
            raise bad(f"must be nvidia or amd, got {v!r}")
        return v.strip()
    if k == "kernels":
        if not isinstance(v, str) or not v.strip():
            raise bad(f"must be a catalog GPU's name, got {v!r}")
        try:
            return get_gpu(v).name
        except UnknownGPUError as e:
            raise bad(f"names no catalog GPU ({e})") from None
    if k == "aliases":
        if not isinstance(v, list) or not all(isinstance(a, str) and a.strip() for a in v):
            raise bad(f"must be a list of names, got {v!r}")
        return v
    if k == "peak_flops":
        if not isinstance(v, dict) or not v:
            raise bad(f"must be a table of dtype -> FLOP/s, got {v!r}")
        for dt, x in v.items():
            if dt not in FLOP_DTYPES:
                raise bad(f"has unknown dtype {dt!r} (known: {', '.join(FLOP_DTYPES)})")
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x <= 0:
                raise bad(f"{dt} must be a positive number of FLOP/s, got {x!r}")
            if x < 1e9:
                raise bad(f"{dt} = {x:g} is in TFLOP/s or similar, not FLOP/s")
        if "fp32" not in v:
            raise bad("needs fp32 (the fallback for every dtype without a faster path)")
        return {dt: float(x) for dt, x in v.items()}
    if k == "gpus_per_node":
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise bad(f"must be a positive integer, got {v!r}")
        return v
    # plain positive numbers
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 \
            or (v == 0 and k != "price_per_hour"):
        raise bad(f"must be a {'non-negative' if k == 'price_per_hour' else 'positive'} number, got {v!r}")
    if k in _UNIT_FLOOR and v < _UNIT_FLOOR[k]:
        raise bad(f"= {v:g} is too small for "
                  f"{'bytes (a value in GB?)' if k.endswith('memory') else 'bytes/s (a value in GB/s?)'}")
    if k in ("memory", "cuda_memory"):
        if isinstance(v, float) and not v.is_integer():
            raise bad(f"must be a whole number of bytes, got {v!r}")
        return int(v)
    return float(v) if k != "power_watts" else v


def resolve_gpu(name: str) -> GPU:
    """`--gpu`: a catalog name or alias, or the path of a JSON/TOML file describing the GPU; under
    references.catalog_only a catalog name or alias only, found without touching the file system."""
    from .references import catalog_only_rule, check_name, shown

    rule = catalog_only_rule()
    if rule is None:
        check_name(name.strip(), "gpu", UnknownGPUError)  # a NUL, a name too long: one line, not an OSError
        return load_gpu_file(name) if is_gpu_file(name) else get_gpu(name)
    key = _key(name)
    if key not in _index():
        raise UnknownGPUError(f"gpu {shown(name.strip())}: unknown GPU; {rule.gpus}.{_close_hint(key)}")
    return _index()[key]
