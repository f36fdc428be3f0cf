"""--tf32: fp32 matmuls on TF32 tensor cores. PyTorch leaves them off (torch.backends.cuda.matmul.allow_tf32 =
False since 1.12), so fp32 GEMMs run at the CUDA cores' rate unless asked (measured on an H200: llama-3.2-1b fp32's
GEMMs took 318 ms, 0.75 of the fp32 peak; bench/results/gpu/H200-2026-11-26-unrecorded-2-truth.json)."""
import pytest

from trainfit.analytic.engine import estimate
from trainfit.errors import SetupError
from trainfit.hardware import get_gpu
from trainfit.models.resolve import load_model
from trainfit.setup import Setup, validate


def test_tf32_runs_the_gemms_at_the_tensor_core_rate():
    # pythia-1b: no GQA, so fp32 attention is the fused memory-efficient kernel and the gemm term is the projections
    # alone (a GQA model's fp32 attention takes SDPA's math path, whose batched GEMMs are bound by their bytes)
    spec, gpu = load_model("pythia-1b"), get_gpu("H100-80GB")
    off = estimate(spec, Setup(batch=4, seq=2048, precision="fp32"), gpu).detail.step_time.compute_terms["gemm"]
    on = estimate(spec, Setup(batch=4, seq=2048, precision="fp32", tf32=True), gpu).detail.step_time.compute_terms["gemm"]
    # the datasheet ratio of the two peaks (gpus.json: 494.7 / 66.9 = 7.4), less what wave quantisation and the
    # small GEMMs' memory time keep equal in both
    ratio = gpu.peak_flops["tf32"] / gpu.peak_flops["fp32"]
    assert 0.8 * ratio < off / on <= ratio


def test_tf32_without_fp32_matmuls_is_refused():
    with pytest.raises(SetupError, match="--tf32"):
        validate(Setup(precision="bf16", tf32=True))
