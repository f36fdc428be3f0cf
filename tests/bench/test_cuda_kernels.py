"""The roofline against kernels timed on H200s (bench/gpu/cuda_kernels.py, kernel time from torch.profiler; torch
2.11.0+cu130). Ground truth of rule 1. The cuDNN attention constants (kernels.toml [generation.hopper.cudnn]) were
fitted on the first run (H200-2026-11-27-unrecorded-7-kernels.json); these tests check them on the second, another machine's
run, and check the mechanisms the step model rests on in the measured numbers themselves."""
import json

import pytest
from bench import data

VALIDATION = "H200-2026-11-27-unrecorded-8-kernels"


@pytest.fixture(scope="module")
def run():
    return data.gpu_run(VALIDATION)


@pytest.fixture(scope="module")
def h200():
    from trainfit.hardware import get_gpu

    return get_gpu("H200")


def test_sdpa_runs_cudnn_on_the_h200_and_its_fit_holds_on_another_run(run, h200):
    """torch's SDPA picked cuDNN (sdp_utils.cpp check_prefer_cudnn_attention on sm90): the default backend's kernels
    are cuDNN's, and the fitted cuDNN model predicts every measured causal call (seq 512-8192, head dims 64 and
    128, the CUDA-truth steps' shapes) within 7 %, forward and backward."""
    from trainfit.analytic.roofline import attention_seconds

    rows = [r for r in run["sdpa"] if r["backend"] == "default"]
    assert len(rows) == 14
    for r in rows:
        assert any("cudnn" in k for k in r["kernels"]), r["kernels"]
        b, h, s, d = r["shape"]
        for p in ("fwd", "bwd"):
            t = attention_seconds(h200, "sdpa", b * h, s, s, d, True, "bf16", backward=p == "bwd")
            assert abs(t / r[f"{p}_seconds"] - 1) <= 0.07, (r["shape"], p, t, r[f"{p}_seconds"])


def test_memory_efficient_kernel_fit_holds_on_another_chip(run, h200):
    """The memory-efficient kernel's constants (kernels.toml [generation.hopper.efficient]) were fitted on the fifth
    run (bench/gpu/fit_attention.py); on the second, another chip's, every one of its 28 measured calls (14 causal bf16
    shapes, forward and backward, the kernel's own time) is within 9 % and the median within 2 %. The defaults it
    replaced (half of FlashAttention-2's published fractions) read the backward up to +55 % slow."""
    from bench.gpu.fit_attention import main_kernel_seconds
    from trainfit.analytic.roofline import attention_seconds

    errs = []
    for r in run["sdpa"]:
        if r["backend"] != "efficient" or "error" in r:
            continue
        assert any("cutlassF" in k for k in r["fwd_kernels"]), r["fwd_kernels"]
        b, h, s, d = r["shape"]
        for bwd in (False, True):
            t = attention_seconds(h200, "efficient", b * h, s, s, d, True, "bf16", backward=bwd)
            errs.append(t / main_kernel_seconds(r, bwd) - 1)
    assert len(errs) == 28
    assert max(abs(e) for e in errs) <= 0.09
    assert sorted(abs(e) for e in errs)[len(errs) // 2] <= 0.02


def test_cudnn_is_faster_than_flashattention2_where_it_was_measured(run):
    """The reason torch made it the default on sm90: at long sequence the measured cuDNN kernel beats torch's own
    FlashAttention-2 by > 1.5x at head dim 128 (and the model times FA2 for the runs that pinned it: --attention
    flash2)."""
    by = {(r["backend"], tuple(r["shape"])): r for r in run["sdpa"] if "error" not in r}
    for shape in ((2, 16, 8192, 128), (4, 16, 4096, 128)):
        assert by[("cudnn", shape)]["fwd_tflops"] > 1.5 * by[("flash", shape)]["fwd_tflops"]


def test_a_vocabulary_not_a_multiple_of_8_runs_the_unaligned_gemm(run, h200):
    """GPT-2's 50,257-word head: cuBLAS ran sm75-era align1 kernels at < 15 % of the bf16 peak (TMA needs 16-byte
    rows), the 768-wide layers beside it > 35 %; the model's unaligned fraction puts the head's forward and input
    gradient within 25 %."""
    from trainfit.analytic.roofline import gemm_seconds

    head = {r["pass"]: r for r in run["gemm"] if r["model"] == "gpt2" and r["layer"] == "lm_head"}
    peak = h200.flops_for("bf16") / 1e12
    assert all("align1" in r["kernel"] and r["tflops"] < 0.15 * peak for r in head.values())
    assert all(r["tflops"] > 0.35 * peak for r in run["gemm"] if r["model"] == "gpt2" and r["layer"] == "c_fc")
    for p in ("fwd", "dgrad"):
        assert abs(gemm_seconds(h200, *head[p]["mnk"], "bf16") / head[p]["seconds"] - 1) <= 0.25, p


def test_gemms_of_five_models_within_the_issue_target(run):
    """Issue 14's 15 % for large ops: the median over the 75 measured GEMMs (forward, input and weight gradients of
    every linear layer of five models at 2,048 tokens) is within 8 %."""
    from bench.gpu.kernels_replay import replay

    errs = [abs(e) for _, e in replay(run)["gemm"]]
    assert len(errs) == 75
    assert sorted(errs)[len(errs) // 2] <= 0.08


def test_memory_bound_ops_by_access_class_beyond_l2(run, h200):
    """At 2,048 x 8,192 (operands beyond the H200's 50 MB L2) each access class predicts its op within 15 %: the
    upcast's unvectorised loop, the broadcast multiply, the head-major copy, the vectorised ops. (The committed
    run's add_bf16 added a tensor to itself, which HBM reads once: left out; cuda_kernels.py now adds two.)"""
    from bench.gpu.kernels_replay import replay

    rows = {label: e for label, e in replay(run)["step_ops"]
            if "2048x8192" in label and "softmax" not in label and "add_bf16" not in label}
    assert len(rows) == 6
    assert all(abs(e) <= 0.15 for e in rows.values()), rows


def test_dry_run_writes_the_kernel_results(tmp_path):
    from bench.gpu import cuda_kernels

    assert cuda_kernels.main(["--dry-run", "--only", "host", "--out", str(tmp_path)]) == 0
    (js,) = tmp_path.glob("*-none-kernels-dry-run*.json")
    host = json.loads(js.read_text())["host"]
    assert host["add"]["kernels_per_call"] == 1 and host["add"]["host_seconds_per_call"] > 0


def test_dry_run_of_the_sustained_gemm(tmp_path):
    """The sustained section (one GEMM back to back, its rate per window) runs end to end on CPU; on a GPU its
    windows also carry NVML's SM clock, power and temperature."""
    from bench.gpu import cuda_kernels

    assert cuda_kernels.main(["--dry-run", "--only", "sustained", "--out", str(tmp_path)]) == 0
    (js,) = tmp_path.glob("*-none-kernels-dry-run*.json")
    out = json.loads(js.read_text())["sustained"]
    assert out["n"] == 128 and out["windows"] and all(w["tflops"] > 0 for w in out["windows"])
    assert "sm_mhz" not in out["windows"][0]  # no NVML on CPU


def test_dry_run_of_the_lora_gemms(tmp_path):
    """The lora section times the six thin GEMMs of an adapter pair on each of the model's distinct (out, in) linear
    shapes per rank: tiny-llama, rank 4, fp32 on CPU; each row's (m, n, k) has the rank in it."""
    from bench.gpu import cuda_kernels

    assert cuda_kernels.main(["--dry-run", "--only", "lora", "--out", str(tmp_path)]) == 0
    (js,) = tmp_path.glob("*-none-kernels-dry-run*.json")
    rows = json.loads(js.read_text())["lora"]
    shapes = {(n, k) for _, n, k in cuda_kernels.linear_shapes("tiny-llama")}
    assert len(rows) == 6 * len(shapes)
    assert all(4 in r["mnk"] and r["seconds"] > 0 and r["predicted_seconds"] > 0 for r in rows)


def test_memory_efficient_constants_are_the_fit_of_the_committed_run(h200):
    """kernels.toml [generation.hopper.efficient] is what `python -m bench run fit_attention
    bench/results/gpu/H200-2026-11-27-unrecorded-9-kernels.json --fill 0` prints: the constants are reproducible from the data."""
    from bench.gpu.fit_attention import _rows, fit
    from trainfit.analytic.roofline import kernels_for

    run = data.gpu_run("H200-2026-11-27-unrecorded-9-kernels")
    c = kernels_for(h200).fitted["efficient"]
    assert c.fill == 0
    rows = _rows(run, "efficient")
    for i, d in enumerate(c.head_dims):
        for bwd in (False, True):
            frac, fixed = fit([r for r in rows if r["shape"][3] == d], h200, bwd, 0)
            assert frac == pytest.approx((c.backward if bwd else c.forward)[i], abs=6e-4)
            assert fixed == pytest.approx((c.backward_fixed if bwd else c.forward_fixed)[i], abs=6e-8)


# (kernels.toml variant, SDPA backend, dtype, dropout, fit_attention's fill / backward passes / tile)
VARIANTS = [("fp32", "efficient", "fp32", False, 0, 0.0, None),
            ("dropout", "efficient", "bf16", True, 0, 0.0, None),
            ("fp32_dropout", "efficient", "fp32", True, 0, 0.0, None),
            ("dropout", "cudnn", "bf16", True, 2, 14.0, (64, 64))]


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: f"{v[1]}-{v[0]}")
def test_fp32_and_dropout_builds_fitted_on_one_chip_hold_on_another(h200, variant):
    """The memory-efficient kernel built for fp32 and/or dropout, and cuDNN's with dropout, were fitted on the eighth
    kernel run's sdpa_variants (kernels.toml [generation.hopper.<kernel>.<variant>]); the seventh ran on another chip:
    each call's kernel time (forward and backward, 6 causal shapes incl. GPT-2's 2 x 12 x 1024 x 64) within 14 % (the
    worst: cuDNN's dropout forward at seq 512, +13 %), the median within 2.5 %. Before these fits fp32 read +50 ... +106 % (the bf16 fractions at the 3xTF32 peak) and
    cuDNN's dropout forward up to +58 % (a per-score draw at GPT-2's per-call rate)."""
    from bench.gpu.fit_attention import _rows, main_kernel_seconds
    from trainfit.analytic.roofline import attention_seconds

    name, backend, dtype, dropout, *_ = variant
    run = data.gpu_run("H200-2026-11-27-79777263-kernels")
    errs = []
    for r in _rows(run, backend, dtype, dropout):
        b, h, s, d = r["shape"]
        for bwd in (False, True):
            t = attention_seconds(h200, "sdpa" if backend == "cudnn" else backend, b * h, s, s, d, True, dtype,
                                  backward=bwd, dropout=dropout)
            errs.append(t / main_kernel_seconds(r, bwd) - 1)
    assert len(errs) >= 12
    assert max(abs(e) for e in errs) <= 0.14, errs
    assert sorted(abs(e) for e in errs)[len(errs) // 2] <= 0.025, errs


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: f"{v[1]}-{v[0]}")
def test_fp32_and_dropout_constants_are_the_fit_of_the_committed_run(h200, variant):
    """kernels.toml's variants are what bench/gpu/fit_attention.py prints on H200-2026-11-27-e2d374c2-kernels.json (the
    commands in kernels.toml): reproducible from the data."""
    from bench.gpu.fit_attention import _rows, fit
    from trainfit.analytic.roofline import kernels_for

    name, backend, dtype, dropout, fill, passes, tile = variant
    run = data.gpu_run("H200-2026-11-27-e2d374c2-kernels")
    c = kernels_for(h200).fitted[backend].variant(dtype, dropout)
    rows = _rows(run, backend, dtype, dropout)
    for i, d in enumerate(c.head_dims):
        for bwd in (False, True):
            frac, fixed = fit([r for r in rows if r["shape"][3] == d], h200, bwd, fill, backend, passes, tile)
            assert frac == pytest.approx((c.backward if bwd else c.forward)[i], abs=6e-4)
            assert fixed == pytest.approx((c.backward_fixed if bwd else c.forward_fixed)[i], abs=6e-8)


def test_dry_run_of_the_sustained_training_step(tmp_path):
    """The sustained_step section (real training steps back to back, each one's time beside the engine's prediction)
    runs end to end on CPU with a tiny model: every step timed, the prediction and its GEMM share recorded."""
    from bench.gpu import cuda_kernels

    assert cuda_kernels.main(["--dry-run", "--only", "sustained_step", "--out", str(tmp_path)]) == 0
    (js,) = tmp_path.glob("*-none-kernels-dry-run*.json")
    (case,) = json.loads(js.read_text())["sustained_step"]
    assert case["steps"] and all(r["step_seconds"] > 0 for r in case["steps"])
    assert case["predicted_step_seconds"] > 0 and 0 < case["predicted_gemm_share"] < 1
    assert "sm_mhz" not in case["steps"][0]  # no NVML on CPU
