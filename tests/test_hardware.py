"""The GPU catalog: loading, lookups, and spot checks against published datasheet figures.

The expected numbers below are written out by hand from the vendors' datasheets (dense = sparse / 2
for NVIDIA tensor-core figures), not read back from gpus.json, so they check the data independently.
"""
import dataclasses
import json
from importlib import resources

import pytest

from trainfit.errors import TrainfitError, UnknownGPUError
from trainfit.hardware import GPU, _key, get_gpu, list_gpus

GiB = 2**30
MiB = 2**20
KNOWN_DTYPES = {"fp32", "tf32", "bf16", "fp16", "fp8", "int8", "mxfp8", "fp6", "fp4"}


def rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


# ---------------------------------------------------------------------------------------------- catalog


def test_json_has_every_field_and_notes():
    raw = json.loads(resources.files("trainfit.data").joinpath("gpus.json").read_text())
    assert isinstance(raw["notes"], str) and "dense" in raw["notes"].lower()
    # the file's memory is nvidia-smi's total; GPU.memory is CUDA's (cuda_memory, with its own source); a catalog
    # GPU's kernel data is its own (kernels defaults to its name)
    # (cluster: the nodes a run places it in, --cluster; no file field)
    fields = {f.name for f in dataclasses.fields(GPU)} - {"smi_memory", "kernels", "tdp_watts", "cluster", "host_memory"}
    for entry in raw["gpus"]:
        assert set(entry) - {"cuda_memory", "cuda_memory_source"} == fields, entry.get("name")
        assert isinstance(entry["aliases"], list)
        if entry["vendor"] == "nvidia":  # CUDA sees nvidia-smi's total less the driver's reserve (15.9 MiB to 1.1 GiB)
            assert 15 * MiB <= entry["memory"] - entry["cuda_memory"] <= 1103 * MiB, entry["name"]
            assert entry["cuda_memory_source"], entry["name"]


def test_catalog_loads_with_enough_entries():
    gpus = list_gpus()
    assert len(gpus) >= 15
    assert all(isinstance(g, GPU) for g in gpus)


@pytest.mark.parametrize("gpu", list_gpus(), ids=lambda g: g.name)
def test_entry_is_sane(gpu: GPU):
    assert isinstance(gpu.memory, int) and gpu.memory > 1 * GiB
    assert gpu.memory_bandwidth > 1e11
    assert gpu.power_watts > 0
    assert gpu.price_per_hour > 0
    assert gpu.intra_node_bandwidth > 0 and gpu.inter_node_bandwidth > 0
    assert gpu.intra_node_bandwidth >= gpu.inter_node_bandwidth  # inside a node is never slower
    assert isinstance(gpu.gpus_per_node, int) and gpu.gpus_per_node >= 1
    assert gpu.source.strip()
    assert gpu.vendor in ("nvidia", "amd")
    assert isinstance(gpu.aliases, tuple)
    # flop figures: known dtypes only, in FLOP/s (not TFLOP/s), fp32 always present
    assert set(gpu.peak_flops) <= KNOWN_DTYPES
    assert "fp32" in gpu.peak_flops
    assert all(v > 1e12 for v in gpu.peak_flops.values())
    # 16-bit tensor peaks are at least the fp32 peak, and 8-bit at least the 16-bit one
    half = gpu.peak_flops.get("bf16") or gpu.peak_flops["fp16"]
    assert half >= gpu.peak_flops["fp32"]
    for eight in ("fp8", "int8"):
        if eight in gpu.peak_flops:
            assert gpu.peak_flops[eight] >= half
    # block-scaled MX fp8 runs at the fp8 tensor-core rate; 6- and 4-bit at least that
    if "mxfp8" in gpu.peak_flops:
        assert gpu.peak_flops["mxfp8"] == gpu.peak_flops["fp8"]
    for low in ("fp6", "fp4"):
        if low in gpu.peak_flops:
            assert gpu.peak_flops[low] >= gpu.peak_flops["fp8"]


def test_names_unique_and_aliases_do_not_collide():
    owner: dict[str, str] = {}
    for gpu in list_gpus():
        for n in (gpu.name, *gpu.aliases):
            k = _key(n)
            assert owner.setdefault(k, gpu.name) == gpu.name, f"{n!r} names {owner[k]} and {gpu.name}"


# ---------------------------------------------------------------------------------------------- lookups


@pytest.mark.parametrize(
    "query, name",
    [
        ("H100-80GB", "H100-80GB"),
        ("h100", "H100-80GB"),
        ("H100-SXM", "H100-80GB"),
        ("h100_sxm", "H100-80GB"),
        ("NVIDIA H100 80GB HBM3", "H100-80GB"),  # torch.cuda.get_device_name
        ("a100", "A100-80GB"),
        ("A100-40GB", "A100-40GB"),
        ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
        ("4090", "RTX-4090"),
        ("rtx 4090", "RTX-4090"),
        ("Tesla T4", "T4"),
        ("v100", "V100-16GB"),
        ("l40s", "L40S"),
        ("mi300x", "MI300X"),
        ("AMD Instinct MI250X", "MI250X-GCD"),
        ("  H200 ", "H200"),
    ],
)
def test_lookup_by_name_alias_any_case(query, name):
    assert get_gpu(query).name == name


def test_every_name_and_alias_resolves_to_itself():
    for gpu in list_gpus():
        for n in (gpu.name, *gpu.aliases):
            assert get_gpu(n) is gpu
            assert get_gpu(n.upper()) is gpu
            assert get_gpu(n.lower()) is gpu


def test_near_miss_suggests():
    with pytest.raises(UnknownGPUError) as err:
        get_gpu("H100-80G")
    msg = str(err.value)
    assert "Did you mean" in msg and "H100-80GB" in msg
    assert msg.count("H100-80GB") == 1  # aliases of one GPU are not listed several times
    assert isinstance(err.value, TrainfitError)


def test_unknown_without_match_has_no_suggestion():
    with pytest.raises(UnknownGPUError) as err:
        get_gpu("zzzzzzzz-qqqq")
    assert "Did you mean" not in str(err.value)


# ---------------------------------------------------------------------------- published datasheet facts


def test_h100_sxm_datasheet():
    h = get_gpu("H100-80GB")
    assert rel(h.peak_flops["bf16"], 989.4e12) < 0.01  # 1,979 TFLOP/s with sparsity
    assert rel(h.peak_flops["fp16"], 989.4e12) < 0.01
    assert rel(h.peak_flops["fp8"], 1978.9e12) < 0.01
    assert rel(h.peak_flops["tf32"], 494.7e12) < 0.01
    assert rel(h.peak_flops["fp32"], 66.9e12) < 0.01
    assert rel(h.memory_bandwidth, 3.35e12) < 0.01
    assert h.power_watts == 700
    assert h.smi_memory == 81559 * MiB  # nvidia-smi: 81559MiB
    assert h.memory == 85017755648  # deviceQuery: 81079 MBytes (85017755648 bytes)
    assert rel(h.intra_node_bandwidth, 450e9) < 0.01  # NVLink4: 900 GB/s both directions
    assert h.gpus_per_node == 8
    assert h.peak_flops["bf16"] / h.peak_flops["fp32"] > 10  # tensor cores vs CUDA cores


def test_a100_datasheet():
    a80, a40 = get_gpu("A100-80GB"), get_gpu("A100-40GB")
    for a in (a80, a40):
        assert rel(a.peak_flops["bf16"], 312e12) < 0.01
        assert rel(a.peak_flops["tf32"], 156e12) < 0.01
        assert rel(a.peak_flops["fp32"], 19.5e12) < 0.01
        assert "fp8" not in a.peak_flops  # Ampere has no fp8
        assert a.power_watts == 400
        assert rel(a.intra_node_bandwidth, 300e9) < 0.01
    assert rel(a80.memory_bandwidth, 2.039e12) < 0.01
    assert rel(a40.memory_bandwidth, 1.555e12) < 0.01
    assert a40.smi_memory == 40960 * MiB and a40.memory == 42_405_855_232  # Modal's torch total_memory
    assert 79 * GiB < a80.memory <= 80 * GiB


def test_other_datasheet_facts():
    t4 = get_gpu("T4")
    assert rel(t4.peak_flops["fp16"], 65e12) < 0.01
    assert rel(t4.peak_flops["fp32"], 8.1e12) < 0.01
    assert rel(t4.memory_bandwidth, 320e9) < 0.01 and t4.power_watts == 70
    v = get_gpu("V100-16GB")
    assert rel(v.peak_flops["fp16"], 125e12) < 0.01 and rel(v.memory_bandwidth, 900e9) < 0.01
    assert "bf16" not in v.peak_flops and "tf32" not in v.peak_flops
    h200 = get_gpu("H200")
    assert rel(h200.memory_bandwidth, 4.8e12) < 0.01 and 139 * GiB < h200.memory < 142 * GiB
    assert rel(get_gpu("L4").peak_flops["bf16"], 121e12) < 0.01
    assert rel(get_gpu("L4").memory_bandwidth, 300e9) < 0.01
    assert rel(get_gpu("RTX-4090").memory_bandwidth, 1008e9) < 0.01
    assert rel(get_gpu("MI300X").peak_flops["bf16"], 1307.4e12) < 0.01
    assert rel(get_gpu("MI300X").memory_bandwidth, 5.3e12) < 0.01
    b200 = get_gpu("B200")
    assert rel(b200.peak_flops["bf16"], 2.25e15) < 0.01 and rel(b200.memory_bandwidth, 8e12) < 0.01
    assert rel(b200.peak_flops["fp4"], 9e15) < 0.01  # HGX B200: FP4 144 PFLOP/s sparse / 8 GPUs / 2
    # GB200 NVL72 datasheet, per GPU: FP16 360 PFLOP/s sparse / 72 / 2, FP4 1,440 / 72 / 2, 576 TB/s / 72
    gb = get_gpu("GB200-NVL72")
    assert rel(gb.peak_flops["bf16"], 2.5e15) < 0.01 and rel(gb.peak_flops["fp4"], 10e15) < 0.01
    assert rel(gb.memory_bandwidth, 8e12) < 0.01 and gb.gpus_per_node == 72 and gb.power_watts == 1200
    assert rel(gb.intra_node_bandwidth, 900e9) < 0.01  # NVLink5 1.8 TB/s both ways
    # MI325X: the MI300X's compute with 256 GB at 6 TB/s; MI355X (CDNA4, 256 CUs at 2.4 GHz): 4096 dense 16-bit
    # FLOP/CU/clock -> 2.52 PFLOP/s, fp8 twice, MXFP4 four times; 288 GB at 8 TB/s, 1400 W
    m325 = get_gpu("MI325X")
    assert m325.peak_flops == get_gpu("MI300X").peak_flops and rel(m325.memory_bandwidth, 6e12) < 0.01
    m355 = get_gpu("MI355X")
    assert rel(m355.peak_flops["bf16"], 256 * 4096 * 2.4e9) < 0.01
    assert rel(m355.peak_flops["fp8"], 2 * 256 * 4096 * 2.4e9) < 0.01
    assert rel(m355.peak_flops["fp4"], 4 * 256 * 4096 * 2.4e9) < 0.01
    assert rel(m355.memory_bandwidth, 8e12) < 0.01 and m355.power_watts == 1400 and 287 * GiB < m355.memory


def test_memory_is_in_bytes_and_ordered():
    # 24 GB consumer cards hold less than a 40 GB A100, which holds less than an 80 GB H100 ...
    order = ["T4", "RTX-4090", "A100-40GB", "H100-80GB", "H200", "MI300X"]
    mems = [get_gpu(n).memory for n in order]
    assert mems == sorted(mems)
    assert get_gpu("H100-PCIe").peak_flops["bf16"] < get_gpu("H100-80GB").peak_flops["bf16"]


# ---------------------------------------------------------------------------------------------- methods


def test_flops_for_fp32_is_the_cuda_cores_rate_and_tf32_the_tensor_cores():
    # PyTorch leaves TF32 off for matmuls (torch.backends.cuda.matmul.allow_tf32 = False): fp32 at the fp32 rate
    # (measured on an H200: llama-3.2-1b fp32's GEMMs at 0.75 of the fp32 peak); --tf32 asks for the tensor cores
    h = get_gpu("H100-80GB")
    assert h.flops_for("fp32") == h.peak_flops["fp32"] and h.flops_for("tf32") == h.peak_flops["tf32"]
    assert h.flops_for("bf16") == h.peak_flops["bf16"]
    assert h.flops_for("fp8") == h.peak_flops["fp8"]
    v = get_gpu("V100-16GB")
    assert v.flops_for("fp32") == v.flops_for("tf32") == v.peak_flops["fp32"] == pytest.approx(15.7e12)
    assert v.flops_for("fp16") == v.peak_flops["fp16"]


def test_flops_for_fallbacks():
    a = get_gpu("A100-80GB")
    assert a.flops_for("fp8") == a.peak_flops["bf16"]  # no fp8 on Ampere: runs in 16-bit
    v = get_gpu("V100-16GB")
    assert v.flops_for("bf16") == v.peak_flops["fp32"]  # no bf16 tensor cores: emulated
    assert v.flops_for("int8") == v.peak_flops["fp16"]


def test_with_price_overrides():
    h = get_gpu("H100-80GB")
    h3 = h.with_price(3.0)
    assert h3.price_per_hour == 3.0
    assert h3.name == h.name and h3.memory == h.memory and h3.peak_flops == h.peak_flops
    assert h.with_price(None) is h
    assert get_gpu("H100-80GB") == h  # the catalog is not mutated
    assert h.with_price(7.5).price_per_hour == 7.5


def test_gpu_is_hashable():
    h = get_gpu("H100-80GB")
    assert len({h, get_gpu("h100"), h.with_price(1.0)}) == 2


# ---------------------------------------------------------------------------------------------- H100 96 GB


def test_h100_96gb_matches_the_torchtitan_benchmark_and_the_sxm_datasheet():
    """torchtitan benchmarks/llama3_h100_202412_torchtitan.md ("Hardware"): 96 GB HBM2e at 2.4 TB/s, 500 W power
    limit, 8 GPUs per host on NVLink, 400 Gb/s RDMA per GPU; peak = the H100 SXM datasheet's dense bf16 989.4
    TFLOP/s (its footnote 2: the true peak of this part is unknown, between SXM and NVL)."""
    g = get_gpu("H100-96GB")
    assert g.memory_bandwidth == 2.4e12 and g.power_watts == 500
    assert g.gpus_per_node == 8 and g.inter_node_bandwidth == 400e9 / 8
    assert rel(g.peak_flops["bf16"], 989.4e12) < 0.001 and rel(g.peak_flops["fp8"], 1978.9e12) < 0.001
    assert g.peak_flops == get_gpu("H100-80GB").peak_flops  # the same SXM figures, by the entry's stated assumption
    # NB-assumed driver total: 97871 MiB, between 95 GiB and the 96 GiB of HBM
    assert g.smi_memory == 97871 * MiB and 95 * GiB < g.memory < 96 * GiB
    assert get_gpu("h100-96gb-hbm2e") is g and "NB" in g.source and "llama3_h100_202412" in g.source


# ---------------------------------------------------------------------------------------------- user GPU files

MY_GPU = {"name": "MyGPU-64GB", "memory": 64 * GiB, "memory_bandwidth": 2.0e12,
          "peak_flops": {"fp32": 60e12, "bf16": 800e12}, "power_watts": 600, "intra_node_bandwidth": 450e9,
          "inter_node_bandwidth": 50e9, "gpus_per_node": 8, "price_per_hour": 2.5, "kernels": "H100-80GB"}


def _toml(d: dict) -> str:
    out = []
    for k, v in d.items():
        if isinstance(v, dict):
            out.append(f"{k} = {{{', '.join(f'{a} = {b!r}' for a, b in v.items())}}}")
        else:
            out.append(f"{k} = {json.dumps(v)}")
    return "\n".join(out) + "\n"


@pytest.mark.parametrize("fmt", ["json", "toml"])
def test_user_gpu_file_round_trip(tmp_path, fmt):
    """A GPU file with the catalog's fields gives back exactly those numbers, and the catalog entry written out
    as a file is the catalog entry again (the same reader rules as data/gpus.json)."""
    from trainfit.hardware import load_gpu_file, resolve_gpu

    path = tmp_path / f"mine.{fmt}"
    path.write_text(json.dumps(MY_GPU) if fmt == "json" else _toml(MY_GPU))
    g = resolve_gpu(str(path))
    assert (g.name, g.memory, g.memory_bandwidth, g.peak_flops, g.power_watts, g.gpus_per_node, g.price_per_hour) == (
        "MyGPU-64GB", 64 * GiB, 2.0e12, {"fp32": 60e12, "bf16": 800e12}, 600, 8, 2.5)
    assert g.flops_for("bf16") == 800e12 and g.flops_for("fp8") == 800e12  # fallbacks as for catalog GPUs
    h = get_gpu("H100-80GB")
    entry = {f.name: getattr(h, f.name) for f in dataclasses.fields(GPU)} | {"aliases": list(h.aliases)}
    entry |= {"memory": h.smi_memory, "cuda_memory": entry.pop("smi_memory") and h.memory}
    entry.pop("tdp_watts")  # the board's own power, a file's power_watts
    entry.pop("cluster")  # the nodes a run places it in (--cluster), not the GPU's
    entry.pop("host_memory")  # the node's (--host-memory, a cluster's), not the GPU's
    again = tmp_path / "h100.json"
    again.write_text(json.dumps(entry))
    assert load_gpu_file(str(again)) == h and load_gpu_file(str(again)).aliases == h.aliases


@pytest.mark.parametrize("change, words", [
    ({"memory": None}, ["missing field 'memory'", "add", "68719476736"]),
    ({"memory": 64}, ["'memory'", "GB", "bytes"]),
    ({"memory_bandwidth": "fast"}, ["'memory_bandwidth'", "positive number"]),
    ({"peak_flops": {"bf16": 800e12}}, ["'peak_flops'", "fp32"]),
    ({"peak_flops": {"fp32": 60, "bf16": 800}}, ["'peak_flops'", "TFLOP/s"]),
    ({"peak_flops": {"fp32": 60e12, "fp64": 1e13}}, ["'peak_flops'", "fp64"]),
    ({"gpus_per_node": 0}, ["'gpus_per_node'", "positive integer"]),
    ({"power_watts": float("nan")}, ["'power_watts'"]),
    ({"vendor": "intel"}, ["'vendor'", "nvidia or amd"]),
    ({"memroy": 1}, ["unknown field 'memroy'", "did you mean memory"]),
])
def test_user_gpu_file_errors_name_the_field_and_the_fix(tmp_path, cli, change, words):
    d = {k: v for k, v in {**MY_GPU, **change}.items() if v is not None}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(d))
    code, out, err = cli("estimate", "llama-3.2-1b", "--gpu", str(path))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err and all(w in err for w in words), err


def test_user_gpu_file_unreadable_or_absent(tmp_path, cli):
    bad = tmp_path / "x.toml"
    bad.write_text("memory = [")
    for path, words in ((bad, ["cannot be read as TOML"]), (tmp_path / "none.json", ["no such file", "trainfit gpus"])):
        code, _, err = cli("estimate", "llama-3.2-1b", "--gpu", str(path))
        assert code == 2 and len(err.strip().splitlines()) == 1 and all(w in err for w in words), err
    (tmp_path / "list.json").write_text("[1, 2]")
    code, _, err = cli("estimate", "llama-3.2-1b", "--gpu", str(tmp_path / "list.json"))
    assert code == 2 and "one object" in err


def test_with_memory_overrides_only_the_memory():
    h = get_gpu("H100-80GB")
    h40 = h.with_memory(40)
    assert h40.memory == 40 * GiB and h40.peak_flops == h.peak_flops and h40.name == h.name
    assert h40.smi_memory == 40 * GiB  # --gpu-memory states CUDA's total; nvidia-smi's is taken as the same
    assert h.with_memory(None) is h and get_gpu("H100-80GB").smi_memory == 81559 * MiB
