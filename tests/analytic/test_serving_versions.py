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


@pytest.mark.parametrize("value, says", [("vllm==0.12", "0.33.0, 0.19.0, 0.14.1, 0.11.0"), ("tgi", "vllm, sglang"),
                                         ("vllm==", "name a version"), ("sglang==0.4.2", "0.5.23, 0.4.4, 0.4.3.post4, 0.4.1")])
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


def _serve(server, gpu, model, **kw):
    setup = Setup(mode="serve", server=server, precision="bf16", **kw)
    return serving.serve_memory(load_model(model), setup, get_gpu(gpu))


def test_0_19_triton_sampler_by_hand_from_its_code():
    """0.19.0, gpt-oss-20b on an A100-80GB: the A100 is kept off the 70 GiB tier (arg_utils.py:2053) -> 2048 batched
    tokens, 256 sequences. 256 rows >= 8 take apply_top_k_top_p_triton (topk_topp_sampler.py:251): bf16 logits 2 +
    fp32 copy 4 + softmax 4 + random_sample's q 4 = 14 bytes per logit of 201,088, and the kernel's cached buffer of
    min(next_power_of_2(min(108 SMs, 256)), 108) = 108 rows x 201,088 fp32 (topk_topp_triton.py:1011-1018); beside
    them the forward's 2048 x 2880 bf16 output and the 256 rows with their rand_like."""
    sv = _serve("vllm==0.19.0", "A100-80GB", "gpt-oss-20b", max_model_len=131072, gpu_memory_utilization=0.65)
    assert (sv.knobs.max_num_batched_tokens, sv.knobs.max_num_seqs) == (2048, 256)
    assert sv.activations == 256 * 201088 * 14 + 108 * 201088 * 4 + 2 * (2048 + 2 * 256) * 2880
    # below 8 rows the PyTorch sort (38 bytes per logit), and no buffer
    assert serving.sampler_path("0.19.0", 7) == "torch-sort" and serving.sampler_path("0.19.0", 8) == "triton"
    k = replace(sv.knobs, max_num_seqs=4)
    spec = load_model("gpt-oss-20b")
    got = serving.sampler_transient(spec, Setup(mode="serve", server="vllm==0.19.0", precision="bf16"), k)
    assert got == 4 * 201088 * 38 + 2 * (2048 + 2 * 4) * 2880
    # the buffer's rows: a power of two under the SM count, else the SM count (132 on an H100)
    assert serving.triton_buffer_bytes(40, 1000, 132) == 64 * 1000 * 4
    assert serving.triton_buffer_bytes(100, 1000, 132) == 128 * 1000 * 4
    assert serving.triton_buffer_bytes(1024, 1000, 132) == 132 * 1000 * 4


def test_0_8_takes_every_non_torch_byte_and_holds_only_the_sampled_rows():
    """0.8.5 (and 0.8.4, the same code), Llama-3.1-8B on one L40S (44.5 GiB: under 70 -> 2048 / 256): available =
    total x 0.9 - torch's allocated peak - (total - free - torch allocated) (v1/worker/gpu_worker.py:177-210): beside
    0.11.0's lazily loaded kernels, the CUDA context and cuBLAS's workspace (4096 KiB x 2 + 16 KiB x 8 off sm_90,
    CublasHandlePool.cpp). Its dummy sampler run holds only the 256 sampled rows (gpu_model_runner.py:1508-1509, no
    rand_like): 256 x 128,256 x 38 bytes at the sort + 256 x 4096 bf16."""
    from trainfit import overheads

    old = _serve("vllm==0.8.5", "L40S", "llama-3.1-8b", max_model_len=32768)
    new = _serve("vllm==0.11.0", "L40S", "llama-3.1-8b", max_model_len=32768)
    assert (old.knobs.max_num_batched_tokens, old.knobs.max_num_seqs) == (2048, 256)
    assert old.activations == 256 * 128256 * 38 + 2 * 256 * 4096
    assert new.activations - old.activations == 2 * (2048 + 256) * 4096  # 0.11.0 keeps the forward's output, rand_like
    assert old.non_torch - new.non_torch == overheads.cuda_context(get_gpu("L40S")) + 4096 * 1024 * 2 + 16 * 1024 * 8
    assert old.available_kv == old.requested - old.weights - old.activations - old.non_torch
    assert not old.graphs_in_kv


def test_mxfp4_backend_by_version_and_gpu_weights_by_hand():
    """gpt-oss-120b (36 MoE layers of 128 experts, H = I = 2880, biased): 0.11.0 and 0.10.1 run Marlin on an H100
    (I padded to 2944, H to 3072: 4.25 bits each); 0.14.1 and 0.19.0 find the bundled triton_kernels on SM90 (Triton:
    2880 is a multiple of 64, no padding; the loaded scales kept beside the swizzled ones, 0.5 + 2/32 bytes; the
    biases made fp32, + 2 bytes each of 128 x (2 x 2880 + 2880)); on an A100 0.14.1 runs Marlin again."""
    kw = dict(max_model_len=8192)
    marlin = _serve("vllm==0.11.0", "H100-80GB", "gpt-oss-120b", **kw).weights
    assert _serve("vllm==0.10.1", "H100-80GB", "gpt-oss-120b", **kw).weights == marlin
    triton = _serve("vllm==0.14.1", "H100-80GB", "gpt-oss-120b", **kw).weights
    assert _serve("vllm==0.19.0", "H100-80GB", "gpt-oss-120b", **kw).weights == triton
    elements = 128 * 3 * 2880 * 2880
    per_layer = elements * ((0.5 + 1 / 32) * 2944 / 2880 * 3072 / 2880 - (0.5 + 2 / 32)) - 128 * 3 * 2880 * 2
    assert marlin - triton == pytest.approx(36 * per_layer, abs=2)
    a100 = dict(gpu_memory_utilization=0.9, **kw)
    assert _serve("vllm==0.14.1", "A100-80GB", "gpt-oss-120b", **a100).weights == \
        _serve("vllm==0.11.0", "A100-80GB", "gpt-oss-120b", **a100).weights


def test_default_limits_by_version_on_an_a100():
    """0.8.5 gives every GPU of 70 GiB or more 8192 / 1024, A100s included (arg_utils.py:1596-1609); 0.10.1 onward skip
    A100s ("a100" not in device_name, 0.10.1 :1638) -> 2048 / 256; "vllm==0.8" names 0.8.5."""
    gpu = get_gpu("A100-80GB")
    assert serving.default_limits(gpu, "0.8.5") == (8192, 1024)
    for version in ("0.10.1", "0.14.1", "0.19.0", "0.11.0"):
        assert serving.default_limits(gpu, version) == (2048, 256), version
    assert serving.default_limits(get_gpu("H100-80GB"), "0.8.5") == (8192, 1024)
    assert serving_versions.parse("vllm==0.8").version == "0.8.5"


def test_capture_sizes_and_graph_modes_by_version():
    """0.8.5's V1 captures 1, 2, 4 and every 8 to 512 whatever max_num_seqs (config.py:4032-4046: 67 sizes, the
    reason one sequence did not avoid the log's capture OOM), piecewise only; 0.10.1 and 0.11.0 every 8 up to
    min(2 x max_num_seqs, 512) (0.10.1 scheduler.py:239-244), 0.10.1 piecewise only; 0.14.1 / 0.19.0 every 16 from 256 and 512 on
    Blackwell too (0.19.0 config/vllm.py:1383-1441), FULL_AND_PIECEWISE."""
    spec = load_model("llama-3.1-8b")

    def k(server, gpu="H100-80GB", **kw):
        return serving.knobs(spec, Setup(mode="serve", server=server, precision="bf16", **kw), get_gpu(gpu))

    eights = (1, 2, 4) + tuple(range(8, 513, 8))
    assert k("vllm==0.8.5", max_num_seqs=1).capture_sizes == eights and len(eights) == 67
    assert k("vllm==0.8.5", max_num_seqs=1, max_num_batched_tokens=100).capture_sizes == eights[:15]  # to 96
    assert k("vllm==0.10.1").capture_sizes == eights
    assert k("vllm==0.11.0", "B200").capture_sizes == eights  # 0.11.0 too (config/__init__.py:588-608), no 1024
    assert k("vllm==0.10.1", max_num_seqs=100).capture_sizes == (1, 2, 4) + tuple(range(8, 201, 8))
    sixteen = (1, 2, 4) + tuple(range(8, 256, 8)) + tuple(range(256, 513, 16))
    assert k("vllm==0.19.0", "B200").capture_sizes == sixteen
    assert len(k("vllm==0.33.0", "B200").capture_sizes) > len(sixteen)  # 0.33.0: to 1024 on Blackwell
    setup = Setup(mode="serve", server="vllm==0.8.5", precision="bf16", max_num_seqs=1)
    kk = k("vllm==0.8.5", max_num_seqs=1)
    assert serving.cuda_graph_bytes(spec, setup, kk) == serving.forward_transient(spec, setup, 512) + 66 * 2**20


def test_max_num_batched_tokens_below_max_num_seqs_is_refused_or_caps_the_default(capsys):
    """vLLM raises when max_num_batched_tokens < max_num_seqs (0.33.0 config/scheduler.py:331-336, 0.8.5 config.py:
    2033-2037); a default max_num_seqs is min(it, max_num_batched_tokens) from 0.10.1 (0.33.0 engine/arg_utils.py:
    3232-3234), 0.8.5 keeps its 1024 and raises. Before: estimated (and emitted) as given, with 1024 sequences."""
    from trainfit.cli import main

    base = ["estimate", "llama-3.1-8b", "--mode", "serve", "--gpu", "H100-80GB", "--max-model-len", "8192"]
    for extra, says in ((["--max-num-seqs", "2000", "--max-num-batched-tokens", "1024"],
                         "must be greater than or equal to max_num_seqs (2000)"),
                        (["--max-num-batched-tokens", "100", "--server", "vllm==0.8.5"],
                         "--max-num-seqs 1024 (the default)")):
        with pytest.raises(SystemExit) as e:
            main(base + extra)
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2 and len(err.splitlines()) == 1 and says in err, err
    main(base + ["--max-num-batched-tokens", "100", "--emit", "vllm"])
    assert "--max-num-batched-tokens 100 --max-num-seqs 100 " in capsys.readouterr().out


@pytest.mark.parametrize("version", ["0.10.1", "0.8.5"])
def test_kv_cache_memory_is_refused_by_a_release_without_the_flag(version, capsys):
    """--kv-cache-memory-bytes came in 0.11.0 (engine/arg_utils.py:358, :766); 0.10.1's and 0.8.5's wheels have no
    kv_cache_memory_bytes (their serve parsers' options: data/serve_flags.json). Before: the KV cache was taken as
    given, and --emit vllm wrote the flag."""
    from trainfit.cli import main

    with pytest.raises(SystemExit) as e:
        main(["estimate", "llama-3.1-8b", "--mode", "serve", "--gpu", "H100-80GB", "--server", f"vllm=={version}",
              "--kv-cache-memory", "20G", "--emit", "vllm"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1, err
    assert f"vLLM {version}'s `vllm serve` has no --kv-cache-memory-bytes" in err, err
    assert "vLLM 0.11.0, 0.14.1, 0.19.0, 0.33.0 have it" in err, err


@pytest.mark.parametrize("version,batched", [("0.33.0", 5120), ("0.19.0", 5120), ("0.14.1", 5120),
                                             ("0.11.0", 8192), ("0.10.1", 8192)])
def test_a_default_batch_is_capped_at_max_num_seqs_times_max_model_len_from_014(version, batched):
    """`--max-num-seqs 1 --max-model-len 5120` on an H100 (vllm#33155's command): from 0.14.1 EngineArgs caps a default
    max_num_batched_tokens at max_num_seqs x max_model_len = 5120 (0.33.0 engine/arg_utils.py:3218-3224) where 0.11.0
    and 0.10.1 keep the tier's 8192 (their SchedulerConfig's cap runs only when EngineArgs left it None, which on a GPU
    it does not). The profile run's batch, and with it the activation peak, follows."""
    from trainfit.analytic.serving import knobs
    from trainfit.hardware import get_gpu
    from trainfit.models.resolve import load_model
    from trainfit.setup import Setup

    k = knobs(load_model("llama-3.1-8b"), Setup(mode="serve", precision="bf16", server=f"vllm=={version}",
                                                max_num_seqs=1, max_model_len=5120), get_gpu("H100-80GB"))
    assert (k.max_num_batched_tokens, k.max_num_seqs) == (batched, 1)
    given = knobs(load_model("llama-3.1-8b"), Setup(mode="serve", precision="bf16", server=f"vllm=={version}",
                                                    max_num_seqs=1, max_model_len=5120, max_num_batched_tokens=8192),
                  get_gpu("H100-80GB"))
    assert given.max_num_batched_tokens == 8192  # a given one is kept


@pytest.mark.parametrize("version", [v for v in serving_versions.versions("sglang") if v != "0.5.23"])
def test_pp_is_refused_by_an_sglang_release_without_pipeline_parallelism(version, capsys):
    """SGLang's pipeline parallelism (--pp-size) came with sgl-project/sglang#5724 (opened 2025-04-24), after the
    0.4.x releases listed; --emit sglang refuses their command for that reason (plan/emit_sglang.py: "no --pp-size").
    Before: the estimate split the layers over --pp 2 stages (half the KV cell per GPU) for an engine that cannot."""
    from trainfit.cli import main

    base = ["estimate", "llama-3.1-8b", "--mode", "serve", "--gpu", "H100-80GB", "--max-model-len", "8192",
            "--server", f"sglang=={version}"]
    with pytest.raises(SystemExit) as e:  # the other command's own word on this release's flags
        main(base + ["--emit", "sglang"])
    assert e.value.code == 2 and "no --pp-size" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(base + ["--pp", "2"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1, err
    assert f"--pp 2: SGLang {version} has no pipeline parallelism" in err and "0.5.23 has it" in err, err
    main(base + ["--tp", "2", "--json"])  # the release's own parallelism still estimates
    capsys.readouterr()
