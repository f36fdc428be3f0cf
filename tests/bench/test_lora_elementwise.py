"""LoRA's elementwise kernels against the H200 profile of a real step (bench/results/gpu/H200-2026-11-27-unrecorded-10-truth.json,
llama-3.2-1b, rank 16 on all seven projections, fp32 adapters on a bf16 base; torch.profiler kernel time). Ground
truth of rule 1. peft's Linear.forward casts x up to fp32, scales the product, adds it to the bf16 result (a mixed
add: fp32 out) and casts the sum back (analytic/lora_ops.py _adapter_elementwise); each kernel class of the profile
is compared with the ops the model gives it. The extra kernels are the LoRA step's over the same model's bf16 step."""
import pytest
from bench import data

RUN = data.gpu_run("H200-2026-11-27-unrecorded-10-truth")
CASES = {c["id"]: c for c in RUN["cases"]}


def _measured(case: str, marker: str) -> tuple[int, float]:
    """(calls, seconds) of the profile's kernels whose name holds `marker`."""
    rows = [t for t in CASES[case]["measured"]["profile"]["top"] if marker in t["name"]]
    return sum(t["count"] for t in rows), sum(t["seconds"] for t in rows)


def _ops(case: str):
    """(layers, forward ops, backward ops) of one layer of a committed case's step, as the analytic engine lists them."""
    from trainfit.analytic import compute_time
    from trainfit.analytic.ops import shape_of
    from trainfit.analytic.precision import state_bytes
    from trainfit.analytic.timing import compute_dtype
    from trainfit.models.resolve import load_model
    from trainfit.setup import Setup

    spec = load_model(CASES[case]["model"])
    setup = Setup(device="cuda", **CASES[case]["settings"])
    sh = shape_of(spec, setup, state_bytes(setup), compute_dtype(setup))
    fwd, bwd, _ = compute_time._lists(spec, setup, sh, False)
    return spec.layers, fwd, bwd


def _model(suffixes: tuple[str, ...], case: str = "llama-3.2-1b-lora") -> tuple[int, float]:
    """(kernels, seconds) of the step's memory ops named with `suffixes`, forward and backward, all layers."""
    from trainfit.analytic import roofline
    from trainfit.hardware import get_gpu

    layers, fwd, bwd = _ops(case)
    ops = [o for o in fwd + bwd if o.kind == "memory" and o.name.endswith(suffixes)]
    return (layers * sum(o.kernels for o in ops),
            layers * sum(roofline.memory_seconds(get_gpu("H200"), o.nbytes, 0, o.access) for o in ops))


@pytest.mark.parametrize("marker, suffixes, tol", [
    # the mixed add result(bf16) + product(fp32): TensorIterator's unvectorised loop
    ("unrolled_elementwise_kernel<at::native::CUDAFunctor_add<float>", (".lora_add",), 0.25),
    # the product's scaling, forward and backward (fp32, vectorised)
    ("AUnaryFunctor<float, float, float", (".lora_scale", ".lora_scale.backward"), 0.15),
])
def test_adapter_kernels_match_the_profile(marker, suffixes, tol):
    calls, seconds = _measured("llama-3.2-1b-lora", marker)
    base_calls, base_seconds = _measured("llama-3.2-1b-bf16", marker)
    kernels, predicted = _model(suffixes)
    assert abs(kernels - (calls - base_calls)) <= 0.05 * kernels, (kernels, calls, base_calls)
    assert abs(predicted / (seconds - base_seconds) - 1) <= tol, (predicted, seconds - base_seconds)


def test_adapter_casts_match_the_profile():
    """x's up-cast and the gradient's up-cast (direct_copy_kernel_cuda, unvectorised), and the three down-casts
    (bfloat16_copy_kernel_cuda: the sum's, the add's gradient's, x's gradient's): 2 and 3 per adapter, each class
    within 15 % of the profile's extra time (the memory term alone was -51 % before these were counted)."""
    for marker, suffixes, per_adapter in (
            ("unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda", (".lora_in_cast",
                                                                                ".lora_out_cast.backward"), 2),
            ("bfloat16_copy_kernel_cuda", (".lora_out_cast", ".lora_add.backward", ".lora_in_cast.backward"), 3)):
        calls, seconds = _measured("llama-3.2-1b-lora", marker)
        base_calls, base_seconds = _measured("llama-3.2-1b-bf16", marker)
        kernels, predicted = _model(suffixes)
        assert kernels == per_adapter * 7 * 16
        assert abs(kernels - (calls - base_calls)) <= 0.05 * kernels, (kernels, calls - base_calls)
        assert abs(predicted / (seconds - base_seconds) - 1) <= 0.15, (marker, predicted, seconds - base_seconds)


def test_qlora_dequantisation_and_peft_bnb_adapters():
    """QLoRA (nf4 with double quantisation, as trainfit's step loads it): each frozen weight is dequantised in the
    forward and again for the input gradient, each time three kernels (the 8-bit block scales decoded, their offset
    added, the 4-bit weights decoded: kDequantizeBlockwise<float>, an fp32 add, kDequantizeBlockwise<bf16>). peft's
    bitsandbytes layer clones the base's output and adds the product after casting it (lora/bnb.py:513-565): no
    mixed-dtype add, one Memcpy DtoD per adapter. Kernel counts within 5 % of the profile's; the dequantisation's
    time within 25 % (in part in sample: the 4-bit decode's rate, kernels.toml access dequant4, was measured on this
    profile; the two small kernels take 2 us each, a floor the memory term does not have: -20 %)."""
    marks = ("kDequantizeBlockwise<", "elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::"
             "CUDAFunctor_add<float>")  # the decodes and the scales' offset add (the LoRA step has no such add)
    assert _measured("llama-3.2-1b-lora", marks[1])[0] == 0
    calls = sum(_measured("llama-3.2-1b-qlora", m)[0] for m in marks)
    seconds = sum(_measured("llama-3.2-1b-qlora", m)[1] for m in marks)
    kernels, predicted = _model((".dequant", ".dequant_bwd"), "llama-3.2-1b-qlora")
    assert abs(kernels - calls) <= 0.05 * calls, (kernels, calls)
    assert abs(predicted / seconds - 1) <= 0.25, (predicted, seconds)
    clones = _model((".lora_clone",), "llama-3.2-1b-qlora")[0]
    memcpy = _measured("llama-3.2-1b-qlora", "Memcpy DtoD")[0] - _measured("llama-3.2-1b-lora", "Memcpy DtoD")[0]
    assert clones == memcpy, (clones, memcpy)
    assert _measured("llama-3.2-1b-qlora", "unrolled_elementwise_kernel<at::native::CUDAFunctor_add<float>")[0] == 0
    assert not any(o.name.endswith(".lora_add") and o.access == "upcast" for o in _ops("llama-3.2-1b-qlora")[1])
