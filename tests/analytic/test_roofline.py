"""Roofline kernel times (analytic/roofline.py) against hand derivations and published measurements.

Every expected number below is written from its source, not read from data/kernels.toml."""
import json
from dataclasses import replace
from importlib import resources

import pytest

from trainfit.analytic.roofline import (attention_seconds, gemm_efficiency, gemm_seconds, gemm_waves, kernels_for,
                                        memory_seconds, unfused_attention)
from trainfit.hardware import get_gpu, list_gpus
from bench import data

A100 = get_gpu("A100-80GB")
H100 = get_gpu("H100-80GB")


def test_every_catalog_gpu_has_cited_kernel_data():
    names = [g["name"] for g in json.loads(resources.files("trainfit.data").joinpath("gpus.json").read_text())["gpus"]]
    assert len(names) == len(list_gpus())
    for gpu in list_gpus():
        kn = kernels_for(gpu)
        assert kn is kernels_for(replace(gpu, name="renamed")), gpu.name  # its own entry, found by GPU.kernels
        assert kn.sms > 0 and 0 < kn.hbm_fraction <= 1 and kn.launch_seconds >= 0
        assert all(0 < f <= 1 for f in kn.matmul_fraction.values())
        assert all(0 < f <= 1 for f in kn.attention.values())


def test_wave_quantisation_hand_count_on_a100():
    # NVIDIA Matrix Multiplication Background guide §3.2 (wave quantization): A100 has 108 SMs and runs one 256x128 tile
    # per SM per wave. An output of 256 x (109*128) is 1 x 109 tiles: 108 in the first wave, 1 in a second.
    kn = kernels_for(A100)
    m, n = 256, 109 * 128
    assert gemm_waves(kn, m, n) == (109, 2)
    assert gemm_efficiency(kn, m, n) == pytest.approx(109 / 216)
    # With the 256x128 tile alone the 109-tile GEMM would take two full waves (2x the 108-tile one). cuBLAS instead
    # picks the fastest of its tiles (guide: 256x128 ... 64x64). Hand table for A100 bf16, per-SM rates: MAMF
    # 271.2 TFLOP/s / 108 = 2.511 TFLOP/s; a Tm x Tn tile reads (Tm+Tn)*2 B from L2 per 2*Tm*Tn FLOPs, and the L2
    # delivers 5400 GB/s / 108 = 50 GB/s per SM (te42kyfo/gpu-benches gpu-l2-cache/a100_80.txt), so 128x64 is capped
    # at 50e9 * 2*128*64/(192*2) = 2.133 TFLOP/s (0.850 of the MAMF); 128x128, 256x64 are not capped; 64x64 at 0.637.
    #   256x128: 109 tiles -> 2 waves x 32768 = 65536   128x128 / 256x64: 218 tiles -> 3 waves x 16384 = 49152
    #   128x64 / 64x128: 436 tiles -> 5 waves x 8192 / 0.850 = 48210   64x64: 872 tiles -> 9 x 4096 / 0.637 = 57870
    # (units: tile-element x k-steps at the MAMF rate). Best: 128x64, 48210 / 32768 = 1.471 x the 108-tile GEMM.
    k = 65536
    ratio = gemm_seconds(A100, m, n, k, "bf16") / gemm_seconds(A100, m, 108 * 128, k, "bf16")
    assert ratio == pytest.approx(48210 / 32768, rel=0.01)


def test_tile_quantisation_pads_edge_tiles():
    # m = 257 needs two 256-row tiles, the second holding one useful row: 257/512 of the tile area is useful
    kn = kernels_for(A100)
    assert gemm_efficiency(kn, 257, 128) == pytest.approx(257 * 128 / (108 * 256 * 128))  # 2 tiles, 1 wave of 108 SMs


def test_large_square_bf16_gemm_reaches_published_mamf_on_a100():
    # stas00/ml-engineering compute/accelerator/README.md, MAMF table (BF16): NVIDIA A100 SXM 271.2 TFLOPS
    # (mamf-finder.py, torch 2.6.0+cu126). 8192^3 is a large, well-quantised square GEMM.
    n = 8192
    tflops = 2 * n**3 / gemm_seconds(A100, n, n, n, "bf16") / 1e12
    assert tflops == pytest.approx(271.2, rel=0.01)


def test_tiny_k_gemm_is_timed_by_its_bytes():
    # C[8192, 8192] = A[8192, 8] @ B[8, 8192] in bf16: 2*8192*8192*8 = 1.07 GFLOP (~4 µs at 271 TFLOP/s) but it
    # writes 8192*8192*2 = 134.2 MB (+ 0.26 MB read). openfabric-systems/simllm PR #109 measured the A100 HBM roof
    # first-party at 1818.21 GB/s: 134.5 MB / 1818.21 GB/s = 74.0 µs.
    nbytes = (8192 * 8 * 2 + 8192 * 8192) * 2
    expected = nbytes / 1818.21e9
    assert gemm_seconds(A100, 8192, 8192, 8, "bf16") == pytest.approx(expected, rel=0.10)


def test_decode_shaped_gemm_is_near_its_weight_read():
    # One token row group (m = 16) through a 4096 x 4096 bf16 weight: 33.7 MB to read, 2.1 GFLOP. At the measured
    # A100 HBM roof (simllm PR #109, 1818.21 GB/s) that is 18.5 µs; the 64x64 tile (the smallest cuBLAS tile, the
    # guide's list) pads m = 16 to 64, so the compute bound is 4x the useful FLOPs: 64 tiles, one wave, each
    # 2*64*64*4096 FLOP at 0.637 x 2.511 TFLOP/s = 21.0 µs (+ 3 µs launch). NB: cuBLAS's GEMV-like kernels for
    # tiny m do better than a padded tile; the model may be up to ~30 % above the weight read.
    nbytes = (16 * 4096 * 2 + 4096 * 4096) * 2
    t = gemm_seconds(A100, 16, 4096, 4096, "bf16")
    assert nbytes / 1818.21e9 < t < 1.35 * nbytes / 1818.21e9


def test_memory_bound_op_at_measured_a100_bandwidth():
    # simllm PR #109: A100 HBM roof 1818.21 GB/s (89.17 % of 2039). A 1 GiB read + 1 GiB write copy:
    nbytes = 2 * 2**30
    assert memory_seconds(A100, nbytes, kernels=1) == pytest.approx(nbytes / 1818.21e9, rel=0.05)


# Dao-AILab/flash-attention PR #2688 (2026-06, benchmarks/benchmark_flash_attention.py, FlashAttention-2; the script's
# setting: batch x seqlen = 16k tokens, hidden 2048, head dim 64 -> 32 heads, bf16, non-causal), forward. NB: the PR
# does not name the GPU; ~310 TFLOP/s at 8k is FA2 on a Hopper part (FA3 paper: FA2 reaches ~35 % of H100 SXM).
FA2_H100_D64_FWD = {512: 252.49, 1024: 294.78, 2048: 308.09, 4096: 311.97, 8192: 310.20}


@pytest.mark.parametrize("seqlen, published", sorted(FA2_H100_D64_FWD.items()))
def test_flash2_forward_by_sequence_length(seqlen, published):
    batch, heads, d = 16384 // seqlen, 32, 64
    flops = 4 * batch * heads * seqlen * seqlen * d  # the script's flops(): 4 * b * s^2 * h * d
    t = attention_seconds(H100, "flash", batch * heads, seqlen, seqlen, d, False, "bf16", backward=False)
    assert flops / t / 1e12 == pytest.approx(published, rel=0.15)


def test_short_sequences_reach_less_than_long_ones():
    # FA2 Fig. 4-6 / PR #2688 above: 512 tokens reach ~81 % of the 8k rate (252.49 / 310.20); the model must show the
    # drop by its mechanism (few key blocks per query tile + one pipeline-fill step each)
    def rate(s):
        b, h, d = 16384 // s, 32, 64
        return 4 * b * h * s * s * d / attention_seconds(H100, "flash", b * h, s, s, d, False, "bf16", False)
    assert rate(512) / rate(8192) == pytest.approx(252.49 / 310.20, abs=0.08)


def test_eager_attention_pays_for_the_score_tensor():
    # Eager (unfused) attention writes the s x s score tensor and softmax reads and writes it again: for b*h = 32,
    # s = 4096 in bf16 that is 3 x 32 x 4096^2 x 2 B = 3.2 GB, ~1.8 ms at the A100's measured 1818 GB/s (simllm
    # PR #109) — far more than the 2 x 4 x 32 x 4096^2 x 128 = 0.55 TFLOP of its two GEMMs at 271 TFLOP/s (2.0 ms
    # at MAMF ... of which a fused kernel skips the traffic). The eager forward must take at least the traffic time.
    bh, s, d = 32, 4096, 128
    traffic = 3 * bh * s * s * 2 / 1818.21e9
    gemms = 4 * bh * s * s * d / 271.2e12
    eager = attention_seconds(A100, "eager", bh, s, s, d, False, "bf16", False)
    assert eager == pytest.approx(traffic + gemms, rel=0.15)
    assert eager > attention_seconds(A100, "flash", bh, s, s, d, False, "bf16", False)


def test_hf_eager_attention_elementwise_against_the_h200_profile():
    """HF's eager attention under autocast (llama-3.2-1b, b2 s1024, 32 heads of 64: S is 64 x 1024 x 1024): the
    committed H200 profile (bench/results/gpu/H200-2026-11-27-unrecorded-9-truth.json, rule 1) times its score-sized kernels —
    the scaling's two muls, the broadcast mask add that promotes S to fp32, softmax and its backward — CUDA's
    softmax backward first forms grad·output, an S x S fp32 mul (SoftMax.cu softmax_backward_cuda_out; the CPU
    kernel has no such op, so the CPU trace of the same step lacks it) — and the three [2, 32, 1024, 1024] casts —
    at 22.3 ms over 16 layers (19.3 ms before the mul was known). The roofline's memory-bound part of the chain
    (unfused_attention) must read them within 10 %; the SDPA-math model it replaces for HF eager read 3.3 ms."""

    case = next(c for c in data.gpu_run("H200-2026-11-27-unrecorded-9-truth")["cases"] if c["id"] == "llama-3.2-1b-amp-bf16-eager")
    scores = "[2, 32, 1024, 1024]"
    measured = sum(k["seconds"] for k in case["measured"]["profile"]["aten_kernels"]
                   if k["shapes"].startswith(f"[{scores}") and k["op"] in (
                       "aten::mul", "aten::add", "aten::_softmax", "aten::_softmax_backward_data", "aten::copy_"))
    h200 = get_gpu("H200")
    elementwise = sum(unfused_attention(h200, 64, 1024, 1024, 64, True, "bf16", bwd, mask=4)[1]
                      for bwd in (False, True))
    assert measured == pytest.approx(0.0223, abs=0.0005)
    assert 16 * elementwise == pytest.approx(measured, rel=0.10)


def test_a_renamed_gpu_keeps_its_chips_kernel_data():
    # GPU.kernels names the catalog GPU whose kernel data it is timed with, not its label (a GPU file's name was
    # timed as one SM before): A100 SXM4 has 108 SMs (NVIDIA A100 whitepaper, Table 3)
    custom = replace(A100, name="MyGPU-64GB")
    assert custom.kernels == "A100-80GB" and kernels_for(custom).sms == 108
    assert gemm_seconds(custom, 1024, 1024, 1024, "bf16") == gemm_seconds(A100, 1024, 1024, 1024, "bf16")


def test_a_kernel_the_gpu_cannot_run_falls_back_like_sdpa():
    # FlashAttention-3 is Hopper-only (FA3 paper §1); on an A100 PyTorch SDPA runs FlashAttention-2 instead
    args = (512, 4096, 4096, 128, True, "bf16", False)
    assert attention_seconds(A100, "flash3", *args) == attention_seconds(A100, "flash", *args)


# Dao-AILab/flash-attention #1589 ("benchmark is low on B200", flash_attn 2.7.4.post1, torch 2.8.0.dev+cu128), the
# same script and setting (16k tokens, 32 heads of 64), FlashAttention-2 forward. The 16k point (379.44) is the
# long-sequence fraction in kernels.toml; the short ones below are checked against the sequence mechanism.
FA2_B200_D64_FWD = {512: 308.40, 1024: 359.30, 2048: 380.99}


@pytest.mark.parametrize("seqlen, published", sorted(FA2_B200_D64_FWD.items()))
def test_flash2_forward_short_sequences_on_b200(seqlen, published):
    b200 = get_gpu("B200")
    batch, heads, d = 16384 // seqlen, 32, 64
    t = attention_seconds(b200, "flash", batch * heads, seqlen, seqlen, d, False, "bf16", backward=False)
    assert 4 * batch * heads * seqlen * seqlen * d / t / 1e12 == pytest.approx(published, rel=0.15)


@pytest.mark.parametrize("seqlen", [2048, 4096, 8192, 16384])
@pytest.mark.parametrize("causal", [False, True])
def test_flash_in_triton_against_flash2_on_a100(seqlen, causal):
    # FA2 §4.1's benchmark setting (A100 80GB SXM4, 16k tokens per batch, hidden 2048, head dim 128 -> 16 heads):
    # "FlashAttention-2 is around 1.3-1.5x faster than FlashAttention in Triton in the forward pass and around 2x
    # faster in the backward pass". The Triton kernel's own 128 x 128 tiles (flash_attn_triton.py) against FA2's
    # 128 x 64 keep the ratio a mechanism, not the constant restated.
    bh = (16384 // seqlen) * 16
    args = (bh, seqlen, seqlen, 128, causal, "bf16")
    fwd = attention_seconds(A100, "triton", *args, False) / attention_seconds(A100, "flash", *args, False)
    bwd = attention_seconds(A100, "triton", *args, True) / attention_seconds(A100, "flash", *args, True)
    assert 1.3 <= fwd <= 1.55
    assert 1.8 <= bwd <= 2.25


def test_a_wgrad_reads_the_rows_of_its_operands_not_the_tokens():
    """A linear layer's weight gradient dW[out, in] = dY[tokens, out]^T @ x[tokens, in]: its operands' rows (the
    strides a TMA descriptor needs in 16-byte multiples) are out and in; the tokens are the reduction. 1,220 tokens
    (a Qwen3-VL sample: 1,024 text + 196 image) are no more unaligned than 1,224, so the wgrad takes their share of
    the time (it was timed on the unaligned kernels, ~6x slower, and a 2-sample step came out faster than 1)."""
    from trainfit import estimate
    from trainfit.analytic.compute_time import time_ops
    from trainfit.analytic.ops import backward
    from trainfit.analytic.ops.op import Op

    def wgrad(tokens):  # qwen3-vl-32b's MLP up projection: (tokens, 25,600, 5,120)
        (w,) = [o for o in backward([Op("up", "gemm", "bf16", m=tokens, n=25600, k=5120)]) if o.name == "up.wgrad"]
        return time_ops(H100, [w]).seconds

    assert 1220 / 1224 * 0.98 < wgrad(1220) / wgrad(1224) <= 1.0
    one, two = (estimate("qwen3-vl-32b", batch=b, seq=1024, gpu="H100-80GB").detail.step_time for b in (1, 2))
    assert two.step_seconds > one.step_seconds
    assert 1.7 < two.compute_terms["gemm"] / one.compute_terms["gemm"] <= 2.0
