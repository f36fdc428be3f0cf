"""bench/targets/time_runs.py, the published-throughput validation set: every run loads, builds a valid Setup on a catalog
GPU, cites its source, and only the calibration runs C1–C3, C5–C8 are marked in sample. Numbers are checked against
the sources themselves (published parameter counts, published MFU), never against trainfit's own formulas."""
from __future__ import annotations


import pytest


from bench.targets.time_runs import (LOWP_CALIBRATION, LOWP_VALIDATION, MPT, MPT_VOCAB, RUNS,  # noqa: E402
                                     SKIPPED, gpus, published_step)

from trainfit.errors import SetupError  # noqa: E402
from trainfit.hardware import get_gpu  # noqa: E402
from trainfit.setup import Setup  # noqa: E402


def test_ids_unique_and_enough_runs():
    ids = [r["id"] for r in RUNS]
    assert len(ids) == len(set(ids))
    assert sum(not r.get("in_sample") for r in RUNS) >= 25  # issue 14: at least 25 out-of-sample runs


@pytest.mark.parametrize("run", RUNS, ids=lambda r: r["id"])
def test_run_is_complete_and_valid(run):
    for key in ("id", "source", "gpu", "model", "setup", "unit", "notes"):
        assert run[key], f"{run['id']}: empty {key}"
    assert "http" in run["source"] or "arxiv" in run["source"]
    assert run["published"] > 0
    get_gpu(run["gpu"])  # a catalog GPU (raises otherwise)
    try:
        Setup(**run["setup"])  # validates every field and their combination
    except SetupError:  # a low-precision run this checkout refuses: its table reports it as not expressible
        assert run in LOWP_CALIBRATION + LOWP_VALIDATION, run["id"]
    assert published_step(run) > 0


def test_in_sample_only_calibration():
    for r in RUNS:
        is_cal = r["id"].startswith(("c1-", "c2-", "c3-", "c5-", "c6-", "c7-", "c8-"))
        assert bool(r.get("in_sample")) == is_cal, r["id"]
        if is_cal:
            assert "calibration.md" in r["source"] or "C2 of calibration.md" in r["notes"]


def test_generations_and_sizes_span_the_issue():
    gens = {r["gpu"].split("-")[0] for r in RUNS if not r.get("in_sample")}
    assert {"V100", "A100", "H100"} <= gens
    assert any(r["model"] == "llama-3.1-405b" for r in RUNS)
    assert any(isinstance(r["model"], dict) and r["model"]["n_embd"] == 768 for r in RUNS)  # 125M
    assert any(r["model"] == "bert-large" for r in RUNS)  # an encoder
    assert SKIPPED and all(why for _, why in SKIPPED)


def _mpt_params(h, layers, seq):
    # Hand count of a GPT-2-architecture block stack (llm-foundry MPT with biases and learned positions):
    # per layer Wqkv 3h² + out h² + up 4h² + down 4h², biases 3h + h + 4h + h, two LayerNorms 2·2h;
    # final LayerNorm 2h; tied token embedding V·h; positions seq·h.
    return layers * (12 * h * h + 13 * h) + 2 * h + MPT_VOCAB * h + seq * h


def test_mpt_dims_match_published_param_counts():
    # llm-foundry's README prints NumParams per row: an independent check of the MPT dims written in time_runs.py
    for r in RUNS:
        if "published_params" in r:
            m = r["model"]
            size = r["id"].split("-")[1]
            assert (m["n_embd"], m["n_layer"], m["n_head"]) == MPT[size]
            assert _mpt_params(m["n_embd"], m["n_layer"], r["setup"]["seq"]) == r["published_params"], r["id"]


def test_published_step_conversions_against_the_sources():
    by = {r["id"]: r for r in RUNS}
    # llm-foundry 7b, 8 × A100-80GB: GlobalBatchSize (T) 196608 at Throughput (T/s) 37130 -> 5.295 s
    assert published_step(by["llmf-7b-s2048-8xA100-80GB"]) == pytest.approx(196608 / 37130, rel=2e-3)
    # Its published MFU 64.23 % with the README's formula (3·2N + 3·4·l·h·s per token, A100 bf16 peak 312 TFLOP/s)
    r = by["llmf-7b-s2048-8xA100-80GB"]
    n, l, h, s = r["published_params"], 32, 4096, 2048
    mfu = (6 * n + 12 * l * h * s) * r["published"] / 312e12
    assert mfu == pytest.approx(0.6423, rel=5e-3)
    # and on H100 (70b, 512 GPUs: MFU 41.25 %, H100 SXM bf16 dense peak 989.4 TFLOP/s)
    r = by["llmf-70b-s2048-512xH100-80GB"]
    mfu = (6 * r["published_params"] + 12 * 80 * 8192 * 2048) * r["published"] / 989.4e12
    assert mfu == pytest.approx(0.4125, rel=5e-3)
    # Narayanan Table 2: 153 TFLOP/s on 384 GPUs; their §5.1 training-time example gives the same order (eq. 3)
    t = published_step(by["narayanan-gpt3-175b-384"])
    assert t == pytest.approx(96 * 1536 * 2048 * 96 * 12288**2 * (1 + 2048 / (6 * 12288) + 51200 / (16 * 96 * 12288))
                              / (153e12 * 384), rel=1e-9)
    # Llama 3: 430 TFLOP/s/GPU with 43 % MFU published -> the FLOP count implies a 989-1000 TFLOP/s peak (H100 bf16)
    assert 430 / 0.43 == pytest.approx(get_gpu("H100-80GB").flops_for("bf16") / 1e12, rel=0.02)
    # DeepLearningExamples: 8 GPUs × 64 sequences / 1305.6 sequences/s, no accumulation
    # (test_dle_bert_benchmark_did_not_accumulate)
    assert published_step(by["dle-bert-large-V100-32GB-amp-fp16-b64-s128"]) == pytest.approx(8 * 64 / 1305.6)
    assert gpus(by["c3-1T-full"]) == 512


def test_megatron_flops_unit_against_c8s_published_pair():
    """shared/calibration.md C8 publishes both its step time (24.2 s) and Megatron-LM's logged 200 TFLOP/s per GPU:
    the unit's FLOP count (Megatron-LM training.py transformer_flops) turns the one into the other."""
    from bench.targets.time_runs import C8_RUN, MOE_ROUTING_PAIRS

    assert published_step(dict(C8_RUN, published=200, unit="TFLOP/s/GPU (Megatron-LM)")) == pytest.approx(24.2,
                                                                                                           rel=0.005)
    # the long-context pairs: one layout each, run force-balanced and dropless (MOE_ZOO lines 35-38)
    for forced, dropless in zip(MOE_ROUTING_PAIRS[::2], MOE_ROUTING_PAIRS[1::2]):
        assert forced["setup"] == dict(dropless["setup"], moe_force_balance=True)
        assert gpus(forced) == 256 and forced["setup"]["grad_accum"] * forced["setup"]["dp"] == 256


# DeepLearningExamples BERT README (3d3ff3e1; the pre-training tables' 1- and 8-GPU rows, DGX-1 V100, sequences/s):
# (GPU memory, precision, micro-batch per GPU, seq) -> (1 GPU, 8 GPUs)
DLE_WEAK_SCALING = {
    ("16G", "fp32", 8, 128): (33.36, 245.12), ("16G", "mixed", 16, 128): (125.44, 919.04),
    ("16G", "fp32", 2, 512): (7.56, 56.16), ("16G", "mixed", 4, 512): (26.64, 194.56),
    ("32G", "fp32", 32, 128): (40.32, 309.76), ("32G", "mixed", 64, 128): (171.52, 1305.6),
    ("32G", "fp32", 4, 512): (8.36, 62.72), ("32G", "mixed", 8, 512): (30.08, 231.68),
}


def test_dle_bert_benchmark_did_not_accumulate():
    """Why the DLE pre-training rows run grad_accum 1 (bench/targets/time_runs.py DLE_BERT): with 128-1024 micro-batches per
    gradient all-reduce, 8 GPUs would take at most ~0.2 ms longer per micro-batch than one (an all-reduce of BERT-
    large's 335M fp32 gradients, 2·7/8·1.34 GB at the 150 GB/s NVLink line rate of gpus.json: 15.6 ms, spread over 128
    micro-batches: 0.12 ms). The README's own 1-GPU rows show 10-33 ms per micro-batch: one all-reduce each."""
    # seconds per micro-batch = micro-batch / (sequences/s per GPU); extra = 8 GPUs' minus 1 GPU's, in ms
    extra = {k: (k[2] / (eight / 8) - k[2] / one) * 1e3 for k, (one, eight) in DLE_WEAK_SCALING.items()}
    assert min(extra.values()) > 10  # ms per micro-batch, in every row
    # fp32 gradients are twice the bytes of the fp16 ones the mixed-precision runs all-reduce: on each machine the
    # fp32 rows pay more per micro-batch than the mixed-precision rows at the same sequence length
    for mem in ("16G", "32G"):
        for seq in (128, 512):
            fp32 = next(v for k, v in extra.items() if k[:2] == (mem, "fp32") and k[3] == seq)
            mixed = next(v for k, v in extra.items() if k[:2] == (mem, "mixed") and k[3] == seq)
            assert fp32 > 1.3 * mixed


def test_c6_power_limit_is_the_fit_of_its_bf16_row():
    """C6 says "power limited B200" without the limit; time_runs keeps the limit fitted on C6's bf16 row. The fit is
    redone from the published throughput (bisection through time_published's public path): a model change that
    moves it more than 2 % means time_runs' _AO_POWER_LIMIT must be refitted
    (`python -m bench run power_clock_published --fit`)."""
    from bench.targets.power_clock_published import fit_c6_limit
    watts, err_at_kept = fit_c6_limit()
    kept = next(r for r in RUNS if r["id"] == "c6-torchao-b200-8b-bf16")["power_limit"]
    assert abs(watts / kept - 1) < 0.02 and abs(err_at_kept) < 0.02
    assert all(r.get("power_limit") == kept for r in RUNS if r["gpu"] == "B200" and "torchao" in r["id"])
