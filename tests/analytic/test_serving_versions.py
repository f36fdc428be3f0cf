"""--server ENGINE==VERSION (serving_versions) and vLLM's start-up accounting per version (analytic/serving.py),
against calibration C11 (../shared/calibration.md: Llama-3.1-8B-Instruct, one H100, vLLM V1 of 0.10+'s log format)."""
from dataclasses import replace

import pytest

from trainfit import serving_versions
from trainfit.analytic import serving
from trainfit.errors import SetupError
from trainfit.hardware import get_gpu
from trainfit.models.resolve import load_model
from trainfit.setup import BY_NAME, Setup, check_value

GiB = 2**30


def test_plain_engine_is_the_current_release_and_major_minor_names_one_release():
    assert serving_versions.parse("vllm").version == serving.VLLM_VERSION == "0.33.0"
    assert serving_versions.parse("sglang").version == "0.5.23"
    assert serving_versions.parse("vllm==0.11").version == "0.11.0"
    assert serving_versions.parse("VLLM == 0.11.0").version == "0.11.0"


@pytest.mark.parametrize("value, says", [("vllm==0.12", "0.33.0, 0.11.0"), ("tgi", "vllm, sglang"),
                                         ("vllm==", "name a version"), ("sglang==0.4.2", "0.5.23, 0.4.3.post4")])
def test_unknown_versions_are_refused_with_the_list(value, says):
    with pytest.raises(SetupError, match=says):
        check_value(BY_NAME["server"], value, "serve")


def c11(server="vllm==0.11.0"):
    """C11's run: one H100 (CUDA's total 79.18 GiB), max-model-len 16000, gpu_memory_utilization 0.9."""
    gpu = replace(get_gpu("H100-80GB"), memory=int(79.18 * GiB))
    setup = Setup(mode="serve", server=server, precision="bf16", max_model_len=16000, gpu_memory_utilization=0.9)
    return serving.serve_memory(load_model("llama-3.1-8b"), setup, gpu)


def test_sampler_peak_of_0_11_by_hand_from_its_code():
    """0.11.0 on an H100: max_num_batched_tokens 8192, max_num_seqs 1024 (arg_utils.py:1605-1614). The dummy sampler
    run over 1024 rows of 128,256 logits takes the PyTorch sort path (FlashInfer is an extra in 0.11.0); at the sort:
    bf16 logits 2 + their fp32 copy 4 (sampler.py:86) + sorted values 4 + int64 indices 8 (topk_topp_sampler.py:183)
    + SortStable.cu's int64 reverse indices 8 + cub's 3rd keys (fp32) 4 and values (int64) 8 = 38 bytes per logit;
    beside them the forward's 8192 x 4096 bf16 hidden states and the 1024 sampled rows with their rand_like."""
    sv = c11()
    assert (sv.knobs.max_num_batched_tokens, sv.knobs.max_num_seqs) == (8192, 1024)
    by_hand = 1024 * 128256 * 38 + 2 * 8192 * 4096 + 2 * 2 * 1024 * 4096
    assert sv.activations == by_hand
    # the forward's own peak (as down_proj runs: 3 x 4096 + 3 x 14336 bf16 values per token) is under it
    assert serving.forward_transient(load_model("llama-3.1-8b"), Setup(mode="serve", precision="bf16"), 8192) < by_hand
    # 0.33.0 takes FlashInfer's path: bf16 2 + fp32 copy 4 + top-k masked logits 4 + probs 4 = 14 bytes per logit
    assert c11("vllm==0.33.0").activations == 1024 * 128256 * 14 + 2 * 8192 * 4096 + 2 * 2 * 1024 * 4096


def test_c11_lines_as_vllm_logs_them():
    """C11 logs 14.99 / 4.76 / 0.13 / KV 51.38 GiB; non-torch is the constant fitted on it (servers.toml)."""
    sv = c11()
    assert sv.weights / GiB == pytest.approx(14.99, abs=0.02)
    assert sv.activations / GiB == pytest.approx(4.76, rel=0.015)  # 4.73: cub's spine and rounding not counted
    assert sv.non_torch / GiB == pytest.approx(0.13, abs=0.005)
    assert not sv.graphs_in_kv  # 0.11.0 captures its graphs after the KV cache: its -0.45 GiB is not in the budget
    assert sv.available_kv == sv.requested - sv.weights - sv.activations - sv.non_torch
    assert sv.available_kv / GiB == pytest.approx(51.38, rel=0.005)


def test_kv_cache_memory_is_taken_as_given_and_refused_under_sglang():
    """--kv-cache-memory-bytes: determine_available_memory returns it (0.11.0 gpu_worker.py:235-252); 40e9 bytes
    // (16 tokens x 131,072 bytes per token: 32 layers x 8 kv heads x 128 x K and V x 2 bytes) = 19,073 blocks."""
    gpu = get_gpu("H100-80GB")
    setup = Setup(mode="serve", server="vllm==0.11.0", precision="bf16", kv_cache_memory=40 * 10**9)
    sv = serving.serve_memory(load_model("llama-3.1-8b"), setup, gpu)
    assert sv.available_kv == 40 * 10**9
    assert sv.kv_blocks == 40 * 10**9 // (16 * 32 * 8 * 128 * 2 * 2)
    from trainfit.setup import validate
    with pytest.raises(SetupError, match="does not apply to --server sglang"):
        validate(Setup(mode="serve", server="sglang==0.5.23", precision="bf16", kv_cache_memory=10**9))


def test_an_engine_whose_free_memory_at_start_is_under_requested_does_not_start():
    """vLLM raises when the free memory at its snapshot is under total x utilization (0.11.0 gpu_worker.py:185-195):
    on an H100 the CUDA context (526.8 MiB at start, data/overheads.toml cuda_context.hopper) leaves 78.64 of
    79.18 GiB free, under 0.995 x 79.18 = 78.78 GiB, over 0.99 x 79.18 = 78.39 GiB."""
    from trainfit.analytic.engine import estimate

    gpu = get_gpu("H100-80GB")
    spec = load_model("llama-3.2-1b")
    for util, starts in ((0.99, True), (0.995, False)):
        setup = Setup(mode="serve", server="vllm==0.11.0", precision="bf16", max_model_len=4096,
                      gpu_memory_utilization=util)
        est = estimate(spec, setup, gpu=gpu)
        said = any("free memory at start" in n for n in est.notes)
        assert said != starts and est.time.fits == starts, util
