"""The analytic step's kernel time by kind, and inference's two passes, against the last H200 run of 2026-11-27
(bench/results/gpu/H200-2026-11-27-unrecorded-6-truth.json: torch.profiler's kernels of real steps, torch 2.11.0+cu130). Ground truth
of rule 1; issue 14/18's target for the large ops is 15 %."""
import pytest
from bench import data

RUN = data.gpu_run("H200-2026-11-27-unrecorded-6-truth")
CASES = {c["id"]: c for c in RUN["cases"]}


def _estimate(case_id: str):
    from trainfit.analytic.engine import estimate
    from trainfit.hardware import get_gpu
    from trainfit.models.resolve import load_model
    from trainfit.setup import Setup

    from bench.gpu.cuda_truth import recorded_settings  # the measured hf steps did not clip

    case = CASES[case_id]
    return estimate(load_model(case["model"]), Setup(**{"device": "cuda", **recorded_settings(case["settings"])}),
                    gpu=get_gpu("H200"))


@pytest.mark.parametrize("case", ["llama-3.1-8b-bf16", "llama-3.2-3b-amp-bf16", "qwen2.5-1.5b-amp-bf16"])
def test_kernel_time_by_kind_of_the_larger_steps(case):
    """GEMMs (hopper's measured tiles), cuDNN attention and the optimizer within 10 %, the memory-bound rest (by
    access class) within 20 % of the profiled kernels. The rest's prediction carries the part of every kernel's launch
    term that a profiled duration holds (kernels.toml kernel_floor_seconds, measured on the shortest kernels; the
    gaps between kernels are in no duration): 3b -6 %, qwen2.5-1.5b -3 %, 8b -16 % (its column reductions, slower
    than the row reductions' class it is timed at, docs/benchmarks/gpu-truth.md). With the whole 3 us launch term counted qwen's
    read +19 % once all its kernels were counted (§40), its memory term alone -17 %."""
    from trainfit.hardware import get_gpu

    from bench.gpu.cuda_truth import analytic_kinds, measured_kinds

    measured = measured_kinds(CASES[case]["measured"])
    predicted = analytic_kinds(_estimate(case).detail.step_time.as_dict(), get_gpu("H200"))
    for kind, tol in (("gemm", 0.10), ("attention", 0.10), ("optimizer", 0.10), ("other", 0.20)):
        assert abs(predicted[kind] / measured[kind] - 1) <= tol, (kind, predicted[kind], measured[kind])


@pytest.mark.parametrize("case", ["llama-3.2-1b-infer", "qwen2.5-1.5b-infer"])
def test_prefill_op_by_op_and_a_host_bound_decode(case):
    """Prefill (8 x 1,024 tokens) timed by its op list within 12 %. The decode step's kernels took under a quarter
    of its wall time (measured: the host issued them), and the model says host-bound, within 30 % (the host's
    per-kernel time varies by ~1.5x between machines: kernels.toml [host])."""
    m = CASES[case]["measured"]
    dec = m["passes"]["decode"]
    assert dec["kernel_seconds"] < 0.25 * dec["wall_seconds"]
    e = _estimate(case)
    assert abs(e.time.prefill_seconds / m["step_seconds"] - 1) <= 0.12, (e.time.prefill_seconds, m["step_seconds"])
    assert e.detail.decode.host_bound
    decode = e.setup.batch / e.time.decode_tokens_per_second
    assert abs(decode / m["decode_seconds"] - 1) <= 0.30, (decode, m["decode_seconds"])


def test_full_depth_replay_makes_the_optimizer_states_where_torch_does():
    """Reserved (issue 18's 5 %): the allocator replay of llama-3.2-1b's full-depth trace (amp, foreach AdamW),
    with torch.optim's states made in the warm-up step's optimizer phase (alloc/replay.py lazy), against the H200's
    max_memory_reserved above what the process held. With the states made at setup the replay read +6.3 % (and
    +8.5 % with fused AdamW); the extrapolated trace read −9.9 %."""
    case = "llama-3.2-1b-amp-bf16-foreach"
    from trainfit.hardware import get_gpu
    from trainfit.models.resolve import load_model
    from trainfit.overheads import allocator_held
    from trainfit.setup import Setup
    from trainfit.trace import trace_spec

    from bench.gpu.cuda_truth import recorded_settings

    c = CASES[case]
    setup = Setup(**{"device": "cuda", **recorded_settings(c["settings"])})
    tr = trace_spec(load_model(c["model"]), setup, flops=False, extrapolate=False)
    own = tr.memory.reserved - sum(allocator_held(get_gpu("H200"), setup).values())
    assert abs(own / c["measured_own"]["reserved"] - 1) <= 0.05, (own, c["measured_own"]["reserved"])
