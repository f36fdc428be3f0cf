"""Which catalog GPUs run bf16 on tensor cores: `trainfit gpus` says it (— where not). Against NVIDIA's compute
capabilities (developer.nvidia.com/cuda-gpus): bf16 tensor cores came with Ampere, compute capability 8.0 (vLLM's
rule too: vllm/platforms/cuda.py check_if_supports_dtype refuses bfloat16 below 8.0)."""
from __future__ import annotations

from trainfit.hardware import list_gpus

COMPUTE_CAPABILITY = {  # NVIDIA's published table, by hand
    "V100-16GB": 7.0, "V100-32GB": 7.0, "T4": 7.5, "A100-40GB": 8.0, "A100-80GB": 8.0, "A10G": 8.6, "A10": 8.6,
    "RTX-3090": 8.6, "RTX-A6000": 8.6, "RTX-A5000": 8.6, "L4": 8.9, "L40S": 8.9, "RTX-4090": 8.9,
    "RTX-6000-Ada": 8.9, "H100-80GB": 9.0, "H100-PCIe": 9.0, "H100-96GB": 9.0, "H200": 9.0, "GH200": 9.0,
    "B200": 10.0, "GB200": 10.0}
NVIDIA = [g.name for g in list_gpus() if g.vendor == "nvidia"]


def test_every_nvidia_gpu_has_its_compute_capability_here():
    assert sorted(NVIDIA) == sorted(COMPUTE_CAPABILITY)


def test_gpus_says_which_have_bf16_tensor_cores(cli):
    code, out, err = cli("gpus")
    assert code == 0, err
    rows = {line.split("│")[1].strip(): line.split("│")[5].strip() for line in out.splitlines() if "│" in line}
    for name in NVIDIA:
        bf16, fp16 = (x.strip() for x in rows[name].split("/"))
        assert (bf16 != "—") == (COMPUTE_CAPABILITY[name] >= 8.0), name
        assert fp16 != "—", name  # fp16 tensor cores since Volta (7.0)
