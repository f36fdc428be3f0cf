"""Which catalog GPUs run bf16 on tensor cores: `trainfit gpus` says it (— where not), and an estimate whose matmuls
run in bf16 on one that has none warns. Against NVIDIA's compute capabilities (developer.nvidia.com/cuda-gpus): bf16
tensor cores came with Ampere, compute capability 8.0 (vLLM's rule too: vllm/platforms/cuda.py
check_if_supports_dtype refuses bfloat16 below 8.0)."""
from __future__ import annotations

import pytest

from trainfit import api
from trainfit.hardware import list_gpus

COMPUTE_CAPABILITY = {  # NVIDIA's published table, by hand
    "V100-16GB": 7.0, "V100-32GB": 7.0, "T4": 7.5, "A100-40GB": 8.0, "A100-80GB": 8.0, "A10G": 8.6, "A10": 8.6,
    "RTX-3090": 8.6, "RTX-A6000": 8.6, "RTX-A5000": 8.6, "L4": 8.9, "L40S": 8.9, "RTX-4090": 8.9,
    "RTX-6000-Ada": 8.9, "H100-80GB": 9.0, "H100-PCIe": 9.0, "H100-96GB": 9.0, "H200": 9.0, "GH200": 9.0,
    "B200": 10.0, "GB200": 10.0}
NVIDIA = [g.name for g in list_gpus() if g.vendor == "nvidia"]


def test_every_nvidia_gpu_has_its_compute_capability_here():
    assert sorted(NVIDIA) == sorted(COMPUTE_CAPABILITY)


def test_gpus_says_which_have_bf16_tensor_cores(cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # one table row per line, whatever the width the run inherits
    code, out, err = cli("gpus")
    assert code == 0, err
    rows = {line.split("│")[1].strip(): line.split("│")[5].strip() for line in out.splitlines() if "│" in line}
    for name in NVIDIA:
        bf16, fp16 = (x.strip() for x in rows[name].split("/"))
        assert (bf16 != "—") == (COMPUTE_CAPABILITY[name] >= 8.0), name
        assert fp16 != "—", name  # fp16 tensor cores since Volta (7.0)


@pytest.mark.parametrize("mode,precision", [("train", "amp-bf16"), ("train", "bf16"), ("infer", "bf16"),
                                            ("serve", "bf16")])
@pytest.mark.parametrize("gpu", ["V100-32GB", "T4", "A100-40GB", "L4"])
def test_bf16_on_a_gpu_without_its_tensor_cores_warns(mode, precision, gpu):
    seq = {"serve": {}, "infer": {"seq": 512}}.get(mode, {"seq": 512, "recompute": "full"})
    e = api.analytic(api.Request(model="llama-3.2-1b", mode=mode, precision=precision, gpu=gpu, **seq))
    warned = [n for n in e.notes if n.startswith(f"warning: the {gpu} has no bf16 tensor cores")]
    assert bool(warned) == (COMPUTE_CAPABILITY[gpu] < 8.0)
    fp16 = {"train": "amp-fp16"}.get(mode, "fp16")
    e = api.analytic(api.Request(model="llama-3.2-1b", mode=mode, precision=fp16, gpu=gpu, **seq))
    assert not any("bf16 tensor cores" in n for n in e.notes)


def test_the_warning_reaches_the_cli_and_a_vision_model(cli):
    code, out, err = cli("estimate", "resnet-50", "--batch", "8", "--gpu", "T4")
    assert code == 0, err
    assert "warning: the T4 has no bf16 tensor cores" in out and "SDPA" not in out  # a CNN runs no attention
    code, out, err = cli("estimate", "resnet-50", "--batch", "8", "--gpu", "T4", "--precision", "amp-fp16")
    assert code == 0 and "bf16 tensor cores" not in out
    code, out, err = cli("estimate", "tiny-llama", "--seq", "64", "--engine", "all", "--gpu", "V100-16GB")
    assert code == 0, err
    assert "warning: the V100-16GB has no bf16 tensor cores" in out  # beside the side-by-side table
