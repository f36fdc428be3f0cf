"""bench/gpu/cuda_truth.py (issue 18) is ready for the day a GPU is at hand: its dry run executes the same harness on CPU
semantics and writes the results files; on CPU the measured step is the truth, so the trace must match it."""
from __future__ import annotations

import json
import re

from bench.gpu import cuda_truth


def test_kernel_names_sorted_by_kind():
    assert cuda_truth.kind_of("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64") == "gemm"
    assert cuda_truth.kind_of("ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_64x3_tn") == "gemm"
    assert cuda_truth.kind_of("void flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<...>") == "attention"
    assert cuda_truth.kind_of("void at::native::vectorized_elementwise_kernel<4, ...>") == "other"
    assert cuda_truth.kind_of("aten::addmm") == "gemm"


def test_dry_run_writes_results_and_the_trace_matches_the_cpu_step(tmp_path):
    assert cuda_truth.main(["--dry-run", "--only", "tiny-llama-fp32", "--out", str(tmp_path)]) == 0
    (js,) = tmp_path.glob("*-none-truth-dry-run.json")
    data = json.loads(js.read_text())
    (row,) = data["cases"]
    assert data["dry_run"] and row["id"] == "tiny-llama-fp32"
    assert abs(row["errors"]["trace_peak"]) <= 0.005 and abs(row["errors"]["analytic_peak"]) <= 0.03
    assert sum(row["measured"]["kinds"].values()) > 0  # the profiler path ran
    # the whole op list is recorded (the host-issue count is checked against it): tiny-llama's 4 layers x 7
    # projections + the LM head are 29 linears, each one matmul forward and two backward (input and weight grads)
    ops = row["measured"]["profile"]["aten_ops"]
    assert ops.get("aten::mm", 0) == 3 * (4 * 7 + 1)
    assert not list(tmp_path.glob("*.md"))  # the table is printed on demand, not written beside the run
    table = cuda_truth.render_file(js)
    assert table.count("| tiny-llama-fp32 |") == 1 and re.search(r"\d{4}-\d{2}-\d{2}", table)
    # the step's clipping is recorded beside its settings (the HF Trainer's max_grad_norm, run by the hf step)
    assert row["settings"]["max_grad_norm"] == 1.0


def test_committed_hf_cases_replay_without_clipping():
    """The runs committed before the hf step clipped (no max_grad_norm in their settings) ran hf training steps
    without clipping; torchtitan's step always clipped, and inference has no optimizer step."""
    assert cuda_truth.recorded_settings({"batch": 2, "precision": "bf16", "lora_rank": 16}) == \
        {"batch": 2, "precision": "bf16", "lora_rank": 16, "max_grad_norm": 0.0}
    for settings in ({"precision": "amp-bf16", "stack": "torchtitan"}, {"precision": "bf16", "mode": "infer"},
                     {"precision": "amp-bf16", "max_grad_norm": 1.0}):
        assert cuda_truth.recorded_settings(settings) == settings


def test_the_device_totals_line_sets_the_catalog_beside_what_the_device_reports():
    """An H100 under driver 565.57.01 (thamada/gls captures): deviceQuery 85,045,477,376 B, nvidia-smi 81,559 MiB;
    the catalog's CUDA total is a CUDA 13.0 driver's 85,017,755,648 B: (85,017,755,648 − 85,045,477,376) /
    85,045,477,376 = −0.03 %; a process that holds 400 MiB before any case has a 400.0 MiB context at start (the
    catalog's: 526.8 MiB, measured on an H200)."""
    from trainfit.hardware import get_gpu

    total = 85_045_477_376
    line, blank = cuda_truth.totals_lines({"cuda_total": total, "cuda_free": total - 400 * 2**20,
                                           "nvml_total": 81559 * 2**20}, get_gpu("H100-80GB"))
    assert "85,045,477,376 B (catalog 85,017,755,648: -0.03%)" in line and blank == ""
    assert "context at start 400.0 MiB (catalog 526.8 MiB; after a step 782.8)" in line
    assert "catalog's nvidia-smi 85,520,809,984: +0.00%" in line
    assert cuda_truth.totals_lines({}, get_gpu("H100-80GB")) == []  # CPU: nothing to compare
