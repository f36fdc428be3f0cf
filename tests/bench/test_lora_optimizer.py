"""AdamW over LoRA's adapters (issue 18; analytic/multi_tensor.py) against H200 measurements: the launch counts the
profiles of every committed truth run show (bench/results/gpu/H200-*-truth.json, torch 2.11.0+cu130), the
optimizer's kernel time inside their real LoRA and QLoRA steps (llama-3.2-1b, rank 16 on all seven projections: 224
fp32 tensors, none over 2 chunks) — neither fitted — and the kernel run whose foreach rows the latency was fitted on
(bench/results/gpu/H200-2026-11-27-e2d374c2-kernels.json). Ground truth of rule 1."""
import pytest
from bench import data

RUNS = data.gpu_runs("truth", "H200")
LORA = ("llama-3.2-1b-lora", "llama-3.2-1b-qlora")


def _cases(ids) -> list[tuple[str, dict]]:
    out = []
    for stem, run in RUNS.items():
        out += [(stem, c) for c in run["cases"] if c["id"] in ids]
    return out


def _launches(case: dict, marker: str) -> list[int]:
    """The profile's launch count of each kernel row whose name holds `marker`."""
    return [t["count"] for t in case["measured"]["profile"]["top"] if marker in t["name"]]


def _packed(elements: float, tensors: int, depth: int, sizes=None) -> int:
    from trainfit.analytic import multi_tensor

    return sum(n for _, n in multi_tensor.pack(multi_tensor.runs_of(elements, tensors, sizes),
                                                multi_tensor.tensor_limit(depth)))


def _adapters():
    from trainfit.analytic.lora import adapter_sizes
    from trainfit.models.resolve import load_model
    from trainfit.setup import Setup

    spec = load_model("llama-3.2-1b")
    return adapter_sizes(spec, Setup(lora_rank=16), spec.layers)


def test_launches_are_the_profiles():
    """MultiTensorApply.cuh's packing gives every profile's launch count: _fused_adamw_ over the 224 adapter tensors
    7 times (36 tensors per depth-4 launch), over llama-3.2-1b's own 1.24 B parameters in 146 tensors 60 times (320
    chunks per launch), and each depth-1 foreach op over the 224 (the step counts' _foreach_add_, and in the seventh
    run clip_grad_norm_'s norm and multiply) 3 times (110 per launch). (The 2026-11-26 profiles list only their
    longest kernels: the cases without the rows are left out.)"""
    sizes = _adapters()
    fused = depth1 = 0
    for run, case in _cases(LORA):
        rows = _launches(case, "FusedOptimizerTenso")  # (names cut at 120 characters)
        assert rows in ([], [_packed(sum(sizes), len(sizes), 4, sizes)]), (run, rows)
        fused += len(rows)
        rows = _launches(case, "multi_tensor_apply_kernel<at::native::(anonymous namespace)::TensorListMetadata<")
        assert set(rows) <= {_packed(sum(sizes), len(sizes), 1, sizes)}, (run, rows)
        depth1 += len(rows)
    assert fused >= 16 and depth1 >= 14, (fused, depth1)
    for run, case in _cases(("llama-3.2-1b-fp32",)):
        assert _launches(case, "FusedOptimizerTenso") == [_packed(1_235_814_400, 146, 4)], run


def _kinds(case: dict) -> tuple[float, float]:
    """(analytic, measured) optimizer kernel seconds of a committed case, estimated as it ran."""
    from bench.gpu.cuda_truth import analytic_kinds, measured_kinds, recorded_settings
    from trainfit.analytic.engine import estimate
    from trainfit.hardware import get_gpu
    from trainfit.models.resolve import load_model
    from trainfit.setup import Setup

    e = estimate(load_model(case["model"]), Setup(**{"device": "cuda", **recorded_settings(case["settings"])}),
                 gpu=get_gpu("H200"))
    return analytic_kinds(e.detail.step_time.as_dict(), get_gpu("H200"))["optimizer"], measured_kinds(case["measured"])["optimizer"]


def test_lora_and_qlora_optimizer_inside_the_real_steps():
    """Every truth run's LoRA and QLoRA optimizer (7 fused launches of 11-45 CTAs, + clip_grad_norm_ in the seventh)
    within 15 %. The measured kernels agree within 2 % over the nine runs on nine machines; the model reads -6 ...
    -12 %: the fused kernel's loop has more arithmetic per element than the foreach kernels its latency was fitted
    on (its own launches read -9 %), and the step counts' _foreach_add_ (~4.5 us) is not modelled. Timed as bytes at
    the streaming bandwidth, as before issue 18, they read -53 ... -61 %."""
    for run, case in _cases(LORA):
        predicted, measured = _kinds(case)
        assert abs(predicted / measured - 1) <= 0.15, (run, case["id"], predicted, measured)


def test_full_model_optimizer_unchanged_by_the_latency_floor():
    """The optimizer of every other training case of the nine runs (fused, foreach, a master's casts, torchtitan's
    clip; 1.1-8 B parameters in full 320-chunk launches, where bytes at the streaming bandwidth still bound) within
    10 % (they read +1 ... +8.4 %, as before the floor)."""
    ids = {c["id"] for run in RUNS.values() for c in run["cases"]
           if c["id"] not in LORA and c["measured"].get("kinds", {}).get("optimizer")}
    cases = _cases(ids)
    assert len(cases) >= 100
    for run, case in cases:
        predicted, measured = _kinds(case)
        assert abs(predicted / measured - 1) <= 0.10, (run, case["id"], predicted, measured)


@pytest.fixture(scope="module")
def eighth() -> dict:
    return data.gpu_run("H200-2026-11-27-e2d374c2-kernels")


def test_foreach_kernels_over_the_adapters(eighth):
    """The kernel run the latency was fitted on (bench/gpu/fit_multi_tensor.py; in-sample, a guard on the fit): foreach
    AdamW's kernels whose arithmetic is multiplies and adds, over the rank-16 and rank-64 adapters, each within 10 %
    (the fit's residuals: -6.5 ... +1.9 %)."""
    from bench.gpu.fit_multi_tensor import errors, lora_rows
    from trainfit.hardware import get_gpu

    rows = lora_rows(eighth, "foreach")
    assert {r["rank"] for r in rows} == {16, 64}
    found = errors(get_gpu("H200"), rows, None, True)
    assert len(found) == 6
    assert all(abs(e) <= 0.10 for e in found.values()), found
