"""CUDA autocast's fp32 lists in a CUDA-semantics trace (trace/cuda_autocast.py).

Truth: aten/src/ATen/autocast_mode.h (AT_FORALL_FP32: pow, layer_norm, ...; AT_FORALL_FP32_SET_OPT_DTYPE: softmax,
sum, ...; AT_FORALL_LOWER_PRECISION_FP: mm, linear, ...), which CUDA autocast applies and CPU autocast does not, and
an H200 measurement (bench/results/gpu/H200-2026-11-26-unrecorded-2-truth.json: gpt2 amp-bf16 at 2 x 1024 held 458 MiB more than a
CPU-autocast trace predicted; the trace with these lists is within 0.75 %).
"""
import torch
import torch.nn.functional as F

from trainfit.trace.cuda_autocast import CudaAutocastLists


def _dtypes():
    x = torch.randn(4, 8, dtype=torch.bfloat16)
    w = torch.randn(8, 8, dtype=torch.float32)
    return {"pow": torch.pow(x, 3.0).dtype, "pow_method": x.pow(2).dtype, "layer_norm": F.layer_norm(x, (8,)).dtype,
            "softmax": F.softmax(x, dim=-1).dtype, "sum": x.sum().dtype, "tanh": torch.tanh(x).dtype,
            "linear": F.linear(x.float(), w).dtype}


def test_cpu_autocast_alone_keeps_bf16():
    with torch.autocast("cpu", dtype=torch.bfloat16):
        d = _dtypes()
    assert d["pow"] == d["layer_norm"] == d["softmax"] == d["sum"] == torch.bfloat16


def test_cuda_lists_run_the_fp32_ops_in_fp32():
    with CudaAutocastLists(), torch.autocast("cpu", dtype=torch.bfloat16):
        d = _dtypes()
    fp32 = {k for k, v in d.items() if v == torch.float32}
    # AT_FORALL_FP32 (pow, layer_norm) and AT_FORALL_FP32_SET_OPT_DTYPE (softmax, sum) in fp32; tanh is on no list
    # (stays bf16); linear is on the lower-precision list (bf16 from an fp32 input)
    assert fp32 == {"pow", "pow_method", "layer_norm", "softmax", "sum"}
    assert d["tanh"] == d["linear"] == torch.bfloat16


def test_cuda_lists_do_nothing_without_autocast():
    with CudaAutocastLists():
        d = _dtypes()
    assert d["pow"] == d["softmax"] == d["sum"] == torch.bfloat16 and d["linear"] == torch.float32


def test_an_explicit_dtype_is_kept():
    x = torch.randn(4, 8, dtype=torch.bfloat16)
    with CudaAutocastLists(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert F.softmax(x, dim=-1, dtype=torch.float64).dtype == torch.float64
