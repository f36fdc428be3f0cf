"""Fixtures shared by the whole suite."""
import os
import sys

import pytest

# Under pytest-xdist (the README's `-n 2`) each worker runs torch on its share of the cores, cpu_count // workers
# threads, as the measure engine gives each rank of a multi-process step (trainfit/measure/distributed.py). Left
# alone, every worker runs OpenMP on all the cores: 2 workers x 2 threads on this 2-core machine, and OpenMP's threads
# spin-wait on each other across processes (tests/trace/test_qlora_vs_real.py + test_lora_vs_real.py on 2 workers
# here, runs interleaved: 38.4 / 36.8 s wall and 65 / 64 s of CPU with 1 thread each, 40.3 / 41.8 s and 72 / 74 s
# with 2; NB: measured beside another job's load, the gain on an idle machine may differ). xdist sets the count
# before it loads conftest
# (xdist/remote.py:418); the variable is set before torch loads OpenMP, and oneDNN's per-thread scratch (analytic/
# onednn.py cpu_threads) reads the same variable, so the engines and the real steps agree on the thread count.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0)
if _WORKERS > 1 and not os.environ.get("OMP_NUM_THREADS") and not os.environ.get("MKL_NUM_THREADS"):
    os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // _WORKERS))
    if "torch" in sys.modules:  # a plugin imported torch first: its OpenMP read the environment already
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# tqdm's monitor thread (started by the first progress bar: torch.compile's, transformers') outlives its bar, and the
# planner forks only a process with no other thread (plan/parallel.py forkable): tests/plan/test_parallel_search.py
# skipped in a worker after such a test. tqdm's documented switch, monitor_interval = 0, starts none.
try:
    import tqdm

    tqdm.tqdm.monitor_interval = 0
except ImportError:  # pragma: no cover
    pass


@pytest.fixture
def cli(capsys):
    """Run `trainfit ARGS...` in-process as a user would: returns (exit code, stdout, stderr)."""
    from trainfit.cli import main

    def run(*args):
        with pytest.raises(SystemExit) as e:
            main(list(args))
            raise SystemExit(0)
        out = capsys.readouterr()
        return e.value.code or 0, out.out, out.err

    return run


# The default run's budget (README: under 10 minutes on 2 cores). These cases run a path another default test or a
# bench already checks, at 7 s or more each on a 2-core machine: the heavy tier (`python -m pytest -m heavy`) keeps
# them. Each names what keeps its path in the default run.
HEAVY_BY_BUDGET: dict[str, str] = {
    "tests/stacks/test_torchtitan_engines.py::test_two_rank_trace_matches_each_measured_rank":
        "real two-rank torchrun steps (README: multi-rank steps are heavy); the one-process real-step cases stay",
    "tests/stacks/test_deepspeed.py::test_zero2_bf16_step_on_cpu_matches_analytic":
        "DeepSpeed's real ZeRO engine: `python -m bench run deepspeed_cpu` runs ZeRO 0-3 × 2 precisions",
    "tests/stacks/test_megatron_cpu.py::test_megatron_cpu_tp1_bf16":
        "Megatron-Core's real step: `python -m bench run megatron_cpu` runs every case",
    "tests/analytic/test_compile_float8.py::test_compiled_torchtitan_block_saves_what_the_partitioner_model_says"
    "[none-False]": "a cold-cache torch.compile (README: compile steps are heavy); its analytic side stays in "
                    "test_compiled_op_sac_drops_only_the_down_projection_output",
    "tests/trace/test_depth_records.py::test_full_depth_records_replay_as_the_full_trace[llama-accum2-foreach]":
        "the replay path: its [llama] case",
    "tests/trace/test_depth_records.py::test_full_depth_records_replay_as_the_full_trace[llama-recompute]":
        "the replay path: its [llama] case",
    "tests/bench/test_h200_kernel_kinds.py::test_full_depth_replay_makes_the_optimizer_states_where_torch_does":
        "the full-depth replay: tests/trace/test_depth_records.py [llama]",
    "tests/analytic/test_model_states.py::test_params_per_rank_is_the_distributed_traces_shard[hf-1]":
        "the distributed trace's shards: its [hf-3] and [torchtitan-2] cases",
    "tests/analytic/test_encoder_decoder_analytic.py::test_prefill_flops_are_the_traced_ones":
        "encoder-decoder prefill FLOPs against the trace: test_bart_and_whisper_prefill_decode_and_flops_against_the_trace",
    "tests/trace/test_extrapolate.py::test_extrapolation_equals_full_trace[qwen2-bf16-full-adamw-1]":
        "layer extrapolation: the file's other cases",
    "tests/trace/test_extrapolate.py::test_extrapolation_equals_full_trace[mixtral-fp32-none-adamw-1]":
        "layer extrapolation: the file's other cases",
    # layer op lists of families whose kernels another family's case lists: llama, mistral's sliding window in
    # gemma2, gemma's in gemma2/gemma3_text, MLA in deepseek_v3, qwen3's q/k norms in qwen3_moe
    "tests/analytic/test_ops_vs_trace.py::test_layer_kernels_match_the_op_list[qwen2]": "llama's case",
    "tests/analytic/test_ops_vs_trace.py::test_layer_kernels_match_the_op_list[mistral]": "llama's and gemma2's",
    "tests/analytic/test_ops_vs_trace.py::test_layer_kernels_match_the_op_list[gemma]": "gemma2's and gemma3_text's",
    "tests/analytic/test_ops_vs_trace.py::test_layer_kernels_match_the_op_list[deepseek_v2]": "deepseek_v3's",
    "tests/analytic/test_ops_vs_trace.py::test_layer_kernels_match_the_op_list[qwen3]": "qwen3_moe's",
    "tests/analytic/test_vlm_analytic.py::test_training_peak_within_1_percent_of_the_trace[fp32-cuda-1-none-adamw]":
        "the VLM training peak: the other precisions' cases",
    "tests/analytic/test_vlm_analytic.py::test_training_peak_within_1_percent_of_the_trace[bf16-cuda-2-none-adamw]":
        "the VLM training peak: the other precisions' cases",
    "tests/analytic/test_encoder_decoder_analytic.py::test_inference_peak_within_1_percent_of_the_trace"
    "[t5-bf16-cuda-2048-16]": "T5 inference: its 128-128 cases",
    "tests/analytic/test_encoder_decoder_analytic.py::test_inference_peak_within_1_percent_of_the_trace"
    "[t5-fp32-cuda-16-2048]": "T5 inference: its 128-128 cases",
    "tests/analytic/test_hybrid_inference.py::test_training_past_one_chunk_within_1_percent_of_the_trace"
    "[small-fp32-none-cuda]": "training past one chunk: its CPU cases",
    "tests/analytic/test_hybrid_inference.py::test_training_past_one_chunk_within_1_percent_of_the_trace"
    "[tiny-nemotron-h-amp-bf16-none-cuda]": "training past one chunk: its CPU cases",
    "tests/trace/test_trace_vs_real.py::test_trace_peak_equals_real_peak[bart-amp-bf16-full-adamw-2-32]":
        "encoder-decoder training against a real step: the t5 and whisper cases",
    "tests/report/test_html_report.py::test_report_at_the_default_sequence_of_a_model_with_learned_positions"
    "[gpt2-1024]": "the same path at tiny-gpt2's 512 positions",
    "tests/measure/test_infer.py::test_kv_cache_by_hand[fp16-2]": "the 16-bit cache: its bf16 case",
    "tests/measure/test_infer.py::test_kv_cache_by_hand[fp32-4]": "its bf16 and amp-bf16 cases",
}


@pytest.hookimpl(tryfirst=True)  # before the -m 'not heavy' selection reads the marks
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid in HEAVY_BY_BUDGET:
            item.add_marker(pytest.mark.heavy)
