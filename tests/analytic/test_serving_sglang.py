"""--mode serve --server sglang (analytic/serving_sglang.py). Truths: hand derivations from SGLang 0.5.23's source
(arg_groups/memory_hook.py, mem_cache/kv_cache_configurator.py, model_executor/pool_configurator.py) and the
published config.json of each model; a published SGLang start-up log (bench/targets/serving_published.py, out of sample);
SGLang's own argument names for --emit sglang."""
from __future__ import annotations

import shlex

import pytest

from trainfit import overheads
from trainfit.analytic import serving_sglang as sg
from trainfit.analytic.engine import estimate
from trainfit.errors import SetupError
from trainfit.hardware import get_gpu
from trainfit.models.resolve import load_model
from trainfit.setup import Setup



def _sgl(**kw) -> Setup:
    return Setup(mode="serve", server="sglang", **{"precision": "bf16", **kw})


@pytest.mark.parametrize("gpu, tp, expected", [
    # H100-80GB: nvidia-smi 81559 MiB; chunked 8192, decode max_bs 256 (tp < 4), 58 prefill capture sizes
    # reserved = 512 + 1.5 × 8192 + 1 × 1/8 × 1024 + 2 × 256 + 8 × 58 = 13904 MiB -> round(67655 / 81559, 3)
    ("H100-80GB", 1, 0.830),
    # tp 8: + 8/8 × 1024 and max_bs 512: 512 + 12288 + 1024 + 1024 + 464 = 15312 -> round(66247 / 81559, 3)
    ("H100-80GB", 8, 0.812),
    # H200: 143771 MiB, the same reserve as H100's at tp 1: round(129867 / 143771, 3)
    ("H200", 1, 0.903),
])
def test_default_mem_fraction_static_by_hand(gpu, tp, expected):
    k = sg.knobs(load_model("llama-3.1-70b"), _sgl(tp=tp), get_gpu(gpu))
    assert k.mem_fraction_static == pytest.approx(expected, abs=1e-9)


def test_prefill_capture_sizes_count():
    # 4..32 by 4 (8), 48..256 by 16 (14), 288..512 by 32 (8), 576..1024 by 64 (8), 1280..4096 by 256 (12),
    # 4608..8192 by 512 (8)
    assert len(sg.prefill_capture_sizes(8192)) == 58


def test_llama_8b_token_pool_by_hand():
    """cell = 8 kv heads × (128 + 128) × 32 layers × 2 B = 131072 B; weights = 8,030,261,248 params × 2 B + the
    rotary cache in fp32 (131072 positions × 128 × 4 B: SGLang keeps it fp32 on CUDA) + what the caching allocator
    holds beyond them: every matrix is a whole number of 2 MiB (qkv 6144 × 4096 × 2 B = 48 MiB, o 32, gate_up 224,
    down 112, embedding and head 1002 MiB each), and the 65 norm weights (8 KiB each) share one 2 MiB small-pool
    segment: 2 MiB − 65 × 8192 B; pool = free at start × 0.83 − weights."""
    spec, gpu = load_model("llama-3.1-8b"), get_gpu("H100-80GB")
    sv = sg.serve_memory(spec, _sgl(), gpu)
    assert sv.kv_bytes_per_token == 8 * 256 * 32 * 2 == 131072
    assert sv.weights == 8_030_261_248 * 2 + 131072 * 128 * 4 + (2 << 20) - 65 * 8192
    pre = gpu.memory - overheads.cuda_context(gpu)  # tp 1: no communicator
    assert sv.kv_tokens == int((pre * 0.83 - sv.weights) // 131072)
    # scheduler's max_running_requests: min(max(min(tokens / 131072 × 512, 4096), 2048), tokens // 2)
    assert sv.max_running_requests == 2048
    assert sv.max_concurrent_sequences == pytest.approx(sv.kv_tokens / 131072)


def test_tp_past_the_kv_heads_keeps_one_head_per_rank():
    spec = load_model("llama-3.1-70b")  # 8 kv heads, 80 layers
    assert sg.cell_size(spec, _sgl(tp=16), "bf16") == 1 * 256 * 80 * 2
    assert sg.cell_size(spec, _sgl(tp=4), "fp8") == 2 * 256 * 80 * 1


def test_mla_caches_the_latent():
    spec = load_model("deepseek-v3")  # kv_lora_rank 512 + qk_rope_head_dim 64, 61 layers
    assert sg.cell_size(spec, _sgl(tp=8), "bf16") == (512 + 64) * 61 * 2


def test_published_sglang_logs():
    """Published SGLang start-up logs (bench/targets/serving_published.py, out of sample, never fitted). Each log's K size
    is #tokens × the cell's K half (the cell is exact); where the log prints its free memory at start and its
    weights, the formula on those two terms gives its token count within rounding (0.05 %: the logs print GiB to
    2 decimals), and trainfit's weights term is the log's "mem usage": QwQ-32B's 15.54 GB within its printing (the
    caching allocator's segments, analytic/serving_segments.py), Llama-3.1-8B's within 0.1 GiB (0.07-0.09 under,
    not explained). Trainfit's own terms within 5 % (the issue's target) except: Qwen3-235B-A22B-FP8 within 10 %
    (its log prints neither term: docs/benchmarks/serving.md) and QwQ-32B within 10 %, whose whole error is the free memory
    at start (+0.26 GiB, docs/benchmarks/fit-rule.md: NCCL counted by the L4s' PCIe topology, 96 MiB per communicator, two
    in SGLang 0.4.3.post4; its log's distributed init took 0.13 GB, trainfit's 0.19 GiB, NB over; what is left has
    the direction of cudaMemGetInfo's total below the catalog's nvidia-smi figure): with the log's free memory,
    trainfit's weights give its count within 0.1 %."""
    from bench.targets import serving_published as script
    rows = script.sglang_rows()
    assert len(rows) >= 4
    for case, sv, err in rows:
        assert round(case.published_tokens * sv.kv_bytes_per_token / 2 / 2**30, 2) == case.published_k_gib
        if case.published_pre_gib is not None:
            own = script.log_terms_tokens(case, sv.kv_bytes_per_token)
            assert abs(own - case.published_tokens) / case.published_tokens < 5e-4
            assert abs(sv.weights / 2**30 - case.published_weights_gib) < 0.1, case.label
        bound = {"qwen3-30b-a3b": 0.10, "qwen2.5-32b": 0.10}.get(case.base, 0.05)
        assert abs(err) < bound, case.label
    qwen3 = rows[0][1]
    assert qwen3.kv_bytes_per_token == 94 * 1 * 256 * 2  # 4 kv heads over tp 4
    qwq_case, qwq, _ = rows[3]
    assert abs(qwq.weights / 2**30 - qwq_case.published_weights_gib) < 0.005
    with_log_pre = int((qwq_case.published_pre_gib * 2**30 * qwq_case.mem_fraction_static - qwq.weights)
                       // qwq.kv_bytes_per_token)
    assert abs(with_log_pre - qwq_case.published_tokens) / qwq_case.published_tokens < 1e-3
    # its distributed init: two communicators of 4 L4s by the P2P rule, 2 x 4 channels x 24 MiB = 0.1875 GiB, over
    # the log's 0.13 GB (NB: that VM's NCCL found fewer channels or no peer access)
    assert script.dist_init_bytes(qwq_case) == 2 * 4 * 24 * 2**20 and qwq_case.published_dist_gib == 0.13


def test_settings_of_the_other_server_are_refused():
    for kw in (dict(gpu_memory_utilization=0.9), dict(block_size=32), dict(max_num_seqs=64),
               dict(max_num_batched_tokens=4096)):
        with pytest.raises(SetupError, match="does not apply to --server sglang"):
            _sgl(**kw)
    with pytest.raises(SetupError, match="--mem-fraction-static does not apply to --server vllm"):
        Setup(mode="serve", precision="bf16", mem_fraction_static=0.8)
    with pytest.raises(SetupError, match="--speculative-algorithm does not apply to --server vllm"):
        Setup(mode="serve", precision="bf16", speculative_algorithm="eagle", draft_model="llama-3.2-1b")
    with pytest.raises(SetupError, match="applies to serve only"):
        Setup(mode="infer", precision="bf16", mem_fraction_static=0.8)
    with pytest.raises(SetupError, match="SGLang's KV dtypes"):
        _sgl(kv_dtype="fp16")


def test_cli_refusal_is_one_line_exit_2(capsys):
    from trainfit.cli import main

    for argv in (["estimate", "llama-3.1-8b", "--mode", "serve", "--server", "sglang", "--gpu", "H100-80GB",
                  "--gpu-memory-utilization", "0.9"],
                 ["estimate", "llama-3.1-8b", "--mode", "serve", "--gpu", "H100-80GB", "--emit", "sglang"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2 and len(err.splitlines()) == 1, err


# SGLang 0.5.23's flags (sglang/srt/arg_groups/fields/: model.py model_path, context_length, dtype, quantization,
# kv_cache_dtype; parallel.py tp_size, pp_size; schedule.py mem_fraction_static, chunked_prefill_size, page_size;
# exec_.py cuda_graph_max_bs_decode, disable_decode_cuda_graph, disable_prefill_cuda_graph; spec.py:31-70
# speculative_algorithm, speculative_draft_model_path, speculative_num_steps, speculative_eagle_topk,
# speculative_num_draft_tokens; each flag is the field with dashes, arg_groups/arg_utils.py:290)
SGLANG_FLAGS = ("--model-path", "--context-length", "--dtype", "--quantization", "--kv-cache-dtype", "--tp-size",
                "--pp-size", "--mem-fraction-static", "--chunked-prefill-size", "--page-size",
                "--cuda-graph-max-bs-decode", "--disable-decode-cuda-graph", "--disable-prefill-cuda-graph",
                "--speculative-algorithm", "--speculative-draft-model-path", "--speculative-num-steps",
                "--speculative-eagle-topk", "--speculative-num-draft-tokens")
SGLANG_CHOICES = {"--kv-cache-dtype": ("auto", "fp8_e5m2", "fp8_e4m3", "mxfp8", "bf16", "bfloat16"),
                  "--dtype": ("auto", "half", "float16", "bfloat16", "float", "float32"),
                  "--speculative-algorithm": ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE")}  # fields/spec.py:31-34
EMIT_CASES = [dict(), dict(tp=2, kv_dtype="fp8", quant="fp8", max_model_len=32768),
              dict(enforce_eager=True, mem_fraction_static=0.85), dict(draft_model="llama-3.2-1b")]


def _emit(kw):
    from trainfit.plan.emit_sglang import sglang_command

    spec = load_model("llama-3.1-8b")
    setup = _sgl(**kw)
    est = estimate(spec, setup, gpu=get_gpu("H100-80GB"))
    return est, shlex.split(sglang_command("llama-3.1-8b", setup, est.detail.serving))


@pytest.mark.parametrize("kw", EMIT_CASES)
def test_emit_sglang_uses_sglangs_flags(kw):
    est, argv = _emit(kw)
    assert argv[:5] == ["python", "-m", "sglang.launch_server", "--model-path", "meta-llama/Llama-3.1-8B"]
    assert set(a for a in argv[3:] if a.startswith("--")) <= set(SGLANG_FLAGS)
    for flag, allowed in SGLANG_CHOICES.items():
        if flag in argv:
            assert argv[argv.index(flag) + 1] in allowed
    assert float(argv[argv.index("--mem-fraction-static") + 1]) == est.detail.serving.knobs["mem_fraction_static"]


@pytest.mark.parametrize("kw", EMIT_CASES)
def test_emit_sglang_parses_with_sglangs_own_parser(kw):
    """Where sglang is importable (its server_args imports on CPU), its own argparse parser reads the command."""
    pytest.importorskip("sglang.srt.server_args")
    import argparse

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    est, argv = _emit(kw)
    ns = parser.parse_args(argv[3:])
    sv = est.detail.serving
    assert ns.mem_fraction_static == sv.knobs["mem_fraction_static"] and ns.context_length == sv.max_model_len
    assert ns.tp_size == kw.get("tp", 1)


@pytest.mark.parametrize("version", ["0.4.1", "0.4.3.post4", "0.4.4"])
def test_emit_sglang_is_refused_for_a_release_without_its_flags(version, capsys):
    """--emit sglang writes 0.5.23's flags; the 0.4.x wheels' srt/server_args.py have no --pp-size nor
    --cuda-graph-max-bs-decode (0.4.1 and 0.4.3.post4 no --page-size), so their launch_server would reject the
    command. Before: printed with exit 0. Refused in one line, the plan's summary not printed either."""
    from trainfit.cli import main

    for argv in (["estimate", "llama-3.1-8b", "--mode", "serve", "--gpu", "H100-80GB", "--max-model-len", "8192"],
                 ["plan", "llama-3.1-8b", "--mode", "serve", "--gpu", "H100-80GB", "--concurrency", "8",
                  "--max-model-len", "8192"]):
        with pytest.raises(SystemExit) as e:
            main(argv + ["--server", f"sglang=={version}", "--emit", "sglang"])
        out, err = capsys.readouterr()
        assert e.value.code == 2 and not out and len(err.strip().splitlines()) == 1, (out, err)
        assert f"SGLang {version}'s parser has no --pp-size" in err


def test_headroom_terms_by_hand():
    """Llama-3.1-8B on an H100-80GB at SGLang's defaults (chunk 8192, decode graphs up to batch 256, 58 prefill
    sizes; max_running_requests 2048), hidden 4096, intermediate 14336, vocab 128,256, bf16:
      chunk forward, as down_proj runs: 8192 × (3 × 4096 + 3 × 14336) × 2 B             =   905,969,664
      logits of min(2048, 8192) rows beside the chunk's hidden states: 8192 × 4096 × 2 B
          + 2048 × 128,256 × (2 B head output + 4 B fp32 copy; softmax in place)          = 1,643,118,592  (the peak)
      decode graphs' pool at batch 256: the head output 256 × 4096 × 2 + 256 × 128,256 × 2 = 67,764,224
          (over the forward's 256 × 55,296 × 2 = 28,311,552), + the fp32 logits buffer 256 × 128,256 × 4
          = 131,334,144, + 58 prefill sizes × 8 MiB = 486,539,264                         =   685,637,632"""
    gpu = get_gpu("H100-80GB")
    sv = sg.serve_memory(load_model("llama-3.1-8b"), _sgl(), gpu)
    assert sv.activations == 8192 * 4096 * 2 + 2048 * 128256 * 6 == 1_643_118_592
    assert sv.cuda_graphs == 67_764_224 + 131_334_144 + 58 * 8 * 2**20 == 685_637_632
    assert sv.remainder_short == 0  # 13.5 GiB outside 0.83
    est = estimate(load_model("llama-3.1-8b"), _sgl(), gpu=gpu)
    m = est.memory
    assert m.activations == sv.activations and m.temporaries == sv.cuda_graphs
    # the device total: the context (tp 1: no NCCL) + the fraction's share used + the headroom's tenants
    assert m.device_total - overheads.cuda_context(gpu) - (sv.weights + sv.kv_pool + sv.activations + sv.cuda_graphs) \
        < 64 * 2**20  # the caching allocator's rounding of the segments
    assert est.time.fits


def test_a_fraction_that_leaves_too_little_is_a_warning_with_the_number():
    """Free at start: CUDA's total on an H100 (deviceQuery 85,017,755,648 B) − the context at start, 552,402,944 B
    (measured on an H200, bench/results/gpu/H200-2026-11-27-unrecorded-11-context.json) = 84,465,352,704 B. At 0.98 the headroom is
    0.02 × that = 1,689,307,054 B, under the activations and graphs' 1,643,118,592 + 685,637,632 = 2,328,756,224 B
    by 639,449,170 B (609.83 MiB); the largest fraction that leaves them room: 1 − 2,328,756,224 / 84,465,352,704
    = 0.97243 -> 0.972."""
    gpu = get_gpu("H100-80GB")
    sv = sg.serve_memory(load_model("llama-3.1-8b"), _sgl(mem_fraction_static=0.98), gpu)
    assert sv.pre_model_load == 85_017_755_648 - 552_402_944
    assert abs(sv.remainder_short - 639_449_170) <= 1
    assert sv.largest_fraction() == 0.972
    est = estimate(load_model("llama-3.1-8b"), _sgl(mem_fraction_static=0.98), gpu=gpu)
    warning, = [n for n in est.notes if n.startswith("warning:")]
    assert "609.83 MiB short" in warning and "--mem-fraction-static 0.972" in warning
    assert not est.time.fits
    assert not [n for n in estimate(load_model("llama-3.1-8b"), _sgl(mem_fraction_static=0.972), gpu=gpu).notes
                if n.startswith("warning:")]


def test_enforce_eager_has_no_graphs():
    sv = sg.serve_memory(load_model("llama-3.1-8b"), _sgl(enforce_eager=True), get_gpu("H100-80GB"))
    assert sv.cuda_graphs == 0


@pytest.mark.parametrize("gpu, tp, expected", [
    # SGLang 0.4.3.post4 (server_args.py:203-232, by hand): the fraction by tp alone; below 25,000 MiB of
    # nvidia-smi (an L4's 23,034) chunked prefill 2048 and decode graphs to 8 (tp < 4) or 80; else 8192 / 160
    ("L4", 4, (0.85, 2048, 80)), ("L4", 1, (0.88, 2048, 8)), ("H100-80GB", 8, (0.81, 8192, 160)),
    ("H100-80GB", 2, (0.87, 8192, 160)),
])
@pytest.mark.parametrize("version", ["0.4.1", "0.4.3.post4", "0.4.4"])
def test_sglang_0_4_defaults_by_hand(gpu, tp, expected, version):
    k = sg.knobs(load_model("qwen2.5-32b"), Setup(mode="serve", server=f"sglang=={version}", precision="bf16",
                                                  tp=tp), get_gpu(gpu))
    assert (k.mem_fraction_static, k.chunked_prefill_size, k.cuda_graph_max_bs) == expected
    assert k.prefill_graph_sizes == 0 and k.version == version  # 0.4.x captures decode batches only


def test_published_logs_ran_their_release_default_fraction():
    """Three published start-up logs state their SGLang release and ran its default mem_fraction_static
    (bench/targets/serving_published.py): 0.4.1 and 0.4.4 on one H100 and 0.4.3.post4 on 4 L4s."""
    from bench.targets import serving_published as script
    for version, base in (("0.4.1", "llama-3.1-8b"), ("0.4.4", "llama-3.1-8b"), ("0.4.3.post4", "qwen2.5-32b")):
        case = next(c for c in script.SGLANG_CASES if c.base == base and version in c.label)
        k = sg.knobs(load_model(base), Setup(mode="serve", server=f"sglang=={version}", precision="bf16",
                                             tp=case.tp), get_gpu(case.gpu))
        assert k.mem_fraction_static == case.mem_fraction_static, case.label


def test_sglang_0_4_3_pool_at_its_default_is_the_published_l4_log():
    """The llms-in-clouds 0.4.3.post4 start-up (bench/targets/serving_published.py: QwQ-32B on 4 L4s, the fraction
    not given) logs #tokens 46611: with the release's default (0.85 at tp 4) the token count is the one the row
    computes at its stated fraction, and plain --server sglang (0.5.23's reserve rule) gives another."""
    from bench.targets import serving_published as script
    case = next(c for c in script.SGLANG_CASES if c.base == "qwen2.5-32b")
    spec, gpu = load_model(case.base), get_gpu(case.gpu)
    old = sg.serve_memory(spec, Setup(mode="serve", server="sglang==0.4.3.post4", precision="bf16", tp=4), gpu)
    stated = sg.serve_memory(spec, Setup(mode="serve", server="sglang==0.4.3.post4", precision="bf16", tp=4,
                                         mem_fraction_static=case.mem_fraction_static), gpu)
    assert old.kv_tokens == stated.kv_tokens
    assert abs(old.kv_tokens - case.published_tokens) / case.published_tokens < 0.10
    # 0.5.23's reserve rule (memory_hook.py:296-328) gives this L4 0.658: 15.54 GiB of weights exceed 0.658 x 21.56
    assert sg.knobs(spec, _sgl(tp=4), gpu).mem_fraction_static < 0.7
    assert old.sizing().version == "0.4.3.post4"


def test_a_patch_version_not_listed_is_refused():
    """sglang==0.4.3 is not the listed 0.4.3.post4 (its fixes may move what it holds): refused, naming the listed
    ones; a major.minor (0.5) stands for its one listed release."""
    with pytest.raises(SetupError, match="trainfit models sglang .*0.4.3.post4"):
        Setup(mode="serve", server="sglang==0.4.3", precision="bf16")
    assert Setup(mode="serve", server="sglang==0.5", precision="bf16").server == "sglang==0.5"


def test_the_activations_row_is_vllms_profile_run_only(cli):
    """vLLM measures its activations in a profile run (gpu_model_runner profile_run); SGLang runs none (its pool is a
    static fraction, mem_cache/kv_cache_configurator.py _profile_available_bytes): its row was 'profile-run peak'
    too. Each server's table names its own quantity."""
    rows = {}
    for server in ("vllm", "sglang"):
        code, out, err = cli("estimate", "llama-3.1-8b", "--mode", "serve", "--server", server, "--gpu", "H100-80GB")
        assert code == 0, err
        rows[server] = [line.split("│")[1].strip() for line in out.splitlines() if line.count("│") == 3]
    assert "profile-run peak (activations)" in rows["vllm"]
    assert "activations (largest transient)" in rows["sglang"]
    assert not any("profile" in r for r in rows["sglang"])
