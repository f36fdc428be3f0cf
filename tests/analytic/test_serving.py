"""--mode serve (analytic/serving.py): vLLM's KV-cache capacity. Truths: hand derivations from the published
architectures, vLLM's own printed numbers (calibration C4; validation logs in bench/targets/serving_published.py), and
vLLM 0.33's argument names for --emit vllm."""
from __future__ import annotations

import shlex

import pytest

from trainfit.analytic.engine import estimate
from trainfit.analytic.inference import kv_bytes_per_token
from trainfit.analytic.params import count_params
from trainfit.analytic.serving import capture_sizes, serve_memory, weights_per_gpu
from trainfit.hardware import get_gpu
from trainfit.models.resolve import load_model
from trainfit.setup import Setup



def _serve(**kw) -> Setup:
    return Setup(mode="serve", **{"precision": "bf16", **kw})


# (model, layers, kv heads, head dim) from each published config.json: 2 (k, v) x layers x kv heads x head dim x 2 B
KV_CASES = [
    ("llama-2-7b", 32, 32, 128),  # multi-head
    ("llama-3.1-8b", 32, 8, 128),  # GQA
    ("qwen2.5-7b", 28, 4, 128),
    ("qwen3-8b", 36, 8, 128),  # explicit head_dim
    ("mixtral-8x7b", 32, 8, 128),  # MoE: attention as Mistral's
    ("gemma-2-9b", 42, 8, 256),  # head_dim 256 (not hidden / heads)
    ("phi-3-mini", 32, 32, 96),
    ("gpt2", 12, 12, 64),
    ("pythia-1b", 16, 8, 256),
]


@pytest.mark.parametrize("name,layers,kv_heads,head_dim", KV_CASES)
def test_kv_bytes_per_token_by_hand(name, layers, kv_heads, head_dim):
    assert kv_bytes_per_token(load_model(name), _serve()) == 2 * layers * kv_heads * head_dim * 2


def test_mla_caches_the_latent_on_every_rank():
    """DeepSeek-V3: (d_c + d_h^R) = 512 + 64 values per token per layer (DeepSeek-V2 paper §2.1.3), 61 layers,
    bf16: 70,272 B, whatever the TP (vLLM keeps one latent per token on every rank)."""
    spec = load_model("deepseek-v3")
    assert kv_bytes_per_token(spec, _serve()) == (512 + 64) * 61 * 2
    assert kv_bytes_per_token(spec, _serve(tp=8)) == (512 + 64) * 61 * 2


def test_tensor_parallel_splits_kv_heads_until_one_per_rank():
    spec = load_model("llama-3.1-70b")  # 80 layers, 8 kv heads of 128
    assert kv_bytes_per_token(spec, _serve(tp=4)) == 2 * 80 * 2 * 128 * 2
    assert kv_bytes_per_token(spec, _serve(tp=16)) == 2 * 80 * 1 * 128 * 2  # replicated past 8 ranks


def test_weights_match_vllms_printed_load():
    """vllm-project/vllm#10517: "Loading model weights took 14.9888 GB" (GiB) for Llama-3.1-8B-Instruct in bf16:
    8,030,261,248 parameters x 2 B plus the rotary cos/sin cache (131,072 positions x 128 x 2 B)."""
    spec = load_model("llama-3.1-8b")
    w = weights_per_gpu(spec, _serve(), count_params(spec))
    assert w == 8_030_261_248 * 2 + 131_072 * 128 * 2
    assert round(w / 2**30, 4) == 14.9888


def test_fp8_kv_doubles_the_tokens():
    spec, gpu = load_model("llama-3.1-8b"), get_gpu("H100-80GB")
    bf16, fp8 = (serve_memory(spec, _serve(max_model_len=8192, kv_dtype=d), gpu) for d in ("bf16", "fp8"))
    assert bf16.available_kv == fp8.available_kv
    assert abs(fp8.kv_blocks - 2 * bf16.kv_blocks) <= 1


def test_capture_sizes_as_vllm_lists_them():
    """config/vllm.py: [1, 2, 4] + range(8, 256, 8) + range(256, max + 1, 16), max = min(2 x max_num_seqs, 512)."""
    assert capture_sizes(1024, 8192) == tuple([1, 2, 4] + list(range(8, 256, 8)) + list(range(256, 513, 16)))
    assert capture_sizes(4, 8192) == (1, 2, 4, 8)


@pytest.mark.parametrize("i", range(3))
def test_published_start_up_logs(i):
    """C4 (calibration) within 3 %, the validation logs within 5 % (bench/targets/serving_published.py)."""
    from bench.targets import serving_published as mod
    case, blocks, err = mod.rows()[i]
    assert abs(err) <= (0.03 if case.kind == "calibration" else 0.05), (case.label, blocks, case.published_blocks)


def test_json_reports_the_engines_numbers():
    est = estimate(load_model("llama-3.1-8b"), _serve(max_model_len=8192), gpu=get_gpu("H100-80GB"))
    sv = est.detail.serving
    assert sv.kv_tokens == sv.kv_blocks * 16  # 8192 is a whole number of blocks
    assert sv.max_concurrent_sequences == pytest.approx(sv.kv_tokens / 8192, abs=0.01)
    assert est.time.fits and est.memory.device_total <= get_gpu("H100-80GB").memory


def test_too_long_a_context_does_not_start():
    est = estimate(load_model("llama-3.1-70b"), _serve(tp=2, max_model_len=131072), gpu=get_gpu("L4"))
    assert not est.time.fits


# vLLM 0.33.0 engine/arg_utils.py EngineArgs fields (line): the flags --emit vllm may print
VLLM_FLAGS = {"--dtype": 517, "--kv-cache-dtype": 518, "--max-model-len": 520, "--pipeline-parallel-size": 535,
              "--tensor-parallel-size": 548, "--block-size": 597, "--gpu-memory-utilization": 614,
              "--max-num-batched-tokens": 616, "--max-num-seqs": 622, "--quantization": 640, "--enforce-eager": 648,
              "--speculative-config": 732}
VLLM_CHOICES = {"--dtype": {"auto", "half", "float16", "bfloat16", "float", "float32"},
                "--kv-cache-dtype": {"auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2"},
                "--quantization": {"awq", "fp8", "gptq"}}  # config/cache.py CacheDType; quantization/__init__.py


@pytest.mark.parametrize("kw", [dict(tp=4, max_model_len=32768), dict(tp=2, kv_dtype="fp8", quant="fp8",
                                                                       enforce_eager=True),
                                dict(tp=4, max_model_len=8192, draft_model="llama-3.2-1b")])
def test_emit_vllm_uses_vllms_flags(kw):
    from trainfit.plan.emit_vllm import vllm_command

    spec = load_model("llama-3.1-70b")
    setup = _serve(**kw)
    est = estimate(spec, setup, gpu=get_gpu("H100-80GB"))
    argv = shlex.split(vllm_command("llama-3.1-70b", setup, est.detail.serving))
    assert argv[:3] == ["vllm", "serve", "meta-llama/Llama-3.1-70B"]
    flags = [a for a in argv[3:] if a.startswith("--")]
    assert set(flags) <= set(VLLM_FLAGS)
    for flag, allowed in VLLM_CHOICES.items():
        if flag in argv:
            assert argv[argv.index(flag) + 1] in allowed
    assert argv[argv.index("--max-num-seqs") + 1] == str(est.detail.serving.knobs["max_num_seqs"])


@pytest.mark.parametrize("server,kv,written", [("vllm==0.10.1", "bf16", None), ("vllm==0.8.5", "bf16", None),
                                               ("vllm==0.10.1", "fp8", "fp8"), ("vllm", "fp16", "float16")])
def test_emit_vllm_writes_a_kv_dtype_only_where_it_is_not_the_models(server, kv, written):
    """A bf16 KV cache on a bf16 model is vLLM's default "auto": 0.10.1 and 0.8.5 know no "bfloat16" (their
    config CacheDType: auto, fp8, fp8_e4m3, fp8_e5m2[, fp8_inc]), so writing it made a command they reject."""
    from trainfit.plan.emit_vllm import vllm_command

    spec = load_model("llama-3.1-8b")
    setup = _serve(kv_dtype=kv, server=server, max_model_len=8192)
    argv = shlex.split(vllm_command("llama-3.1-8b", setup, estimate(spec, setup, gpu=get_gpu("H100-80GB")).detail.serving))
    assert (argv[argv.index("--kv-cache-dtype") + 1] if "--kv-cache-dtype" in argv else None) == written

def test_a_draft_models_weights_and_kv_share_the_pool():
    """--draft-model llama-3.2-1b beside llama-3.1-70b at tp 4: the draft's KV per token is added to every block
    (16 layers x 8/4 kv heads x 64 x 2 x 2 B = 8,192 B), its weights come out of the budget."""
    spec, gpu = load_model("llama-3.1-70b"), get_gpu("H100-80GB")
    plain = serve_memory(spec, _serve(tp=4, max_model_len=8192), gpu)
    spec_dec = serve_memory(spec, _serve(tp=4, max_model_len=8192, draft_model="llama-3.2-1b"), gpu)
    assert spec_dec.kv_bytes_per_token - plain.kv_bytes_per_token == 16 * 2 * 64 * 2 * 2
    draft = load_model("llama-3.2-1b")
    assert spec_dec.weights - plain.weights == pytest.approx(weights_per_gpu(draft, _serve(tp=4), count_params(draft)), abs=1)
    assert spec_dec.kv_tokens < plain.kv_tokens


def test_a_draft_with_another_vocabulary_is_refused():
    from trainfit.errors import SetupError

    with pytest.raises(SetupError, match="tokenizer"):
        serve_memory(load_model("llama-3.1-8b"), _serve(draft_model="qwen2.5-0.5b"), get_gpu("H100-80GB"))


def test_a_sliding_window_caps_the_blocks_a_request_holds():
    """Mistral-7B (window 4,096, every layer) on an A100 (vLLM's 2,048 batched tokens, async scheduling: 2 batches
    in flight): a request keeps min(4095 + 2 x 2048, 32768) = 8,191 tokens = 512 blocks, + 1 for the window's
    unaligned start; its capacity in 32,768-token sequences is blocks / 513, not blocks / 2,048."""
    sv = serve_memory(load_model("mistral-7b"), _serve(), get_gpu("A100-80GB"))
    assert sv.knobs.max_model_len == 32768 and sv.knobs.max_num_batched_tokens == 2048
    assert sv.max_concurrent_sequences == pytest.approx(sv.kv_blocks / 513)


def test_alternating_sliding_layers_share_one_pool():
    """Gemma-2-9B: 21 full + 21 sliding (window 4,096) layers, two cache groups of 21 sharing one pool, so a block is
    16 tokens of 21 layers' k and v (8 kv heads x 256 x 2 B) and an 8,192-token request holds 512 full-group blocks +
    min(4095 + 2 x 2048, 8192) / 16 + 1 = 513 sliding-group blocks (A100 defaults: 2,048 batched tokens)."""
    sv = serve_memory(load_model("gemma-2-9b"), _serve(), get_gpu("A100-80GB"))
    assert sv.kv_pool == sv.kv_blocks * 16 * 21 * 2 * 8 * 256 * 2
    assert sv.max_concurrent_sequences == pytest.approx(sv.kv_blocks / (512 + 513))


def test_five_local_layers_per_global_one_pool():
    """Gemma-3-1B: 4 full + 22 sliding (window 512) layers. vLLM's hybrid allocator (serving.cache_groups) groups by
    the smaller count, 4 (22 is not under 1.5 x 4): 1 full group and ceil(22 / 4) = 6 sliding groups (the last padded)
    of 4 layers sharing one pool, so a block is 16 tokens of 4 layers' k and v (1 kv head x 256 x 2 B); a 32,768-token
    request holds 2,048 full-group blocks + 6 x (ceil(min(511 + 2 x 2048, 32768) / 16) + 1) = 6 x 289 sliding-group
    blocks (A100 defaults: 2,048 batched tokens, 2 batches in flight)."""
    sv = serve_memory(load_model("gemma-3-1b"), _serve(max_model_len=32768), get_gpu("A100-80GB"))
    assert sv.knobs.max_model_len == 32768 and sv.knobs.max_num_batched_tokens == 2048
    assert sv.kv_pool == sv.kv_blocks * 16 * 4 * 2 * 1 * 256 * 2
    assert sv.blocks_per_request == 2048 + 6 * 289
    assert sv.max_concurrent_sequences == pytest.approx(sv.kv_blocks / (2048 + 6 * 289))


def test_gpt_oss_sliding_layers_hold_the_window():
    """gpt-oss-20b (layer_types: 12 sliding layers of window 128, 12 full; 8 kv heads x 64): two cache groups of 12
    sharing one pool, a block 16 tokens of 12 layers' k and v (8 x 64 x 2 B), and a 131,072-token request holds
    131072 / 16 = 8,192 full-group blocks + ceil(min(127 + 2 x 8192, 131072) / 16) + 1 = 1,033 sliding-group blocks
    (H100 defaults: 8,192 batched tokens)."""
    sv = serve_memory(load_model("gpt-oss-20b"), _serve(), get_gpu("H100-80GB"))
    assert sv.knobs.max_model_len == 131072 and sv.knobs.max_num_batched_tokens == 8192
    assert sv.kv_pool == sv.kv_blocks * 16 * 12 * 2 * 8 * 64 * 2
    assert sv.max_concurrent_sequences == pytest.approx(sv.kv_blocks / (8192 + 1033))


def test_every_command_answers_serve_mode_in_one_line(capsys):
    """The HTML report builds for a serving setup (no batch sweep: a serving engine has no batch); the engines
    that run steps refuse it in one line, naming the command that answers."""
    from trainfit.cli import main
    from trainfit.report.html import build_report
    from trainfit.setup import Request

    page = build_report(Request(model="llama-3.1-8b", mode="serve", gpu="H100-80GB", max_model_len=8192), trace=None)
    assert "serving · vllm" in page and "Sweep over" not in page
    for argv in (["timeline", "llama-3.1-8b", "--mode", "serve", "--gpu", "H100-80GB"],
                 ["measure", "tiny-llama", "--mode", "serve"],
                 ["estimate", "llama-3.1-8b", "--mode", "serve", "--gpu", "H100-80GB", "--engine", "trace"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2 and len(err.splitlines()) == 1 and "trainfit estimate --mode serve" in err, err


@pytest.mark.parametrize("name,layers,experts,card_gib", [("gpt-oss-20b", 24, 32, 12.8), ("gpt-oss-120b", 36, 128, 60.8)])
def test_gpt_oss_mxfp4_experts_by_hand(name, layers, experts, card_gib):
    """gpt-oss's published checkpoint keeps its experts in MXFP4 (config quantization_config: quant_method mxfp4, the
    attention, router, embeddings and head not converted), which vLLM loads as stored: per expert gate_up (2I x H) and
    down (H x I) at 4 bits plus one e8m0 byte per 32 values (mxfp4.py create_weights: uint8 (E, 2I, H/2) and scales
    (E, 2I, H/32)), the biases bf16; the rest bf16. Written out from the config (hidden 2880, expert width 2880, 64 q
    heads and 8 kv heads of 64, vocabulary 201,088, 131,072 positions) and set beside the checkpoint sizes of OpenAI's
    model card (arXiv:2508.10925, Table 1: 12.8 GiB and 60.8 GiB)."""
    h, i, q, kv, vocab = 2880, 2880, 64 * 64, 8 * 64, 201088
    mxfp4 = 0.5 + 1 / 32
    experts_per_layer = experts * (3 * i * h * mxfp4 + (2 * i + h) * 2)
    attention = (h * (2 * q + 2 * kv) + q + 2 * kv + h + 64) * 2  # q/k/v/o, their biases, the 64 sinks
    router = (experts * h + experts) * 2
    norms = 2 * h * 2
    hand = (layers * (experts_per_layer + attention + router + norms)
            + 2 * vocab * h * 2 + h * 2  # embeddings and the untied head, the final norm
            + 131072 * 64 * 2)  # the rotary cos/sin cache (weights_per_gpu)
    spec = load_model(name)
    assert spec.moe.experts_mxfp4
    got = weights_per_gpu(spec, _serve(), count_params(spec))
    assert got == pytest.approx(hand, rel=1e-12)
    assert got / 2**30 == pytest.approx(card_gib, abs=0.05)


def test_report_names_the_experts_format_loaded():
    """The serving header and JSON name the routed experts' MXFP4 where the engine loads the checkpoint's own
    (gpt-oss: the weights above are 4.25-bit experts, not the bf16 the policy names), under vLLM and SGLang alike;
    not under --quant (another format asked for) nor for a model stored in bf16."""
    from trainfit.report.terminal import setup_line

    def served(name, **kw):
        return estimate(load_model(name), Setup(mode="serve", precision="bf16", **kw), gpu=get_gpu("H100-80GB"))

    for server in ("vllm", "sglang"):
        e = served("gpt-oss-20b", server=server)
        assert e.detail.serving.as_dict()["experts_format"] == "mxfp4"
        assert "bf16 weights (routed experts MXFP4, as stored)" in setup_line(e)
    for e in (served("gpt-oss-20b", quant="fp8"), served("qwen3-30b-a3b")):
        assert e.detail.serving.experts_format is None and "MXFP4" not in setup_line(e)


def test_gpt_oss_marlin_pads_the_experts():
    """vLLM 0.11.0 as its wheel installs runs MXFP4 experts through Marlin (no flashinfer, no triton_kernels), whose
    create_weights pads I to a multiple of 128 and H to 256 (mxfp4.py:189-204): gpt-oss-120b's experts are then
    128 x 3 x 2944 x 3072 x (1/2 + 1/32) bytes a layer where the checkpoint holds 2880 x 2880 — by hand, beside the
    unpadded total; the published Marlin start-up of vllm-project/vllm#23278 (vLLM 0.10.1 on an H100, its log:
    "Using Marlin ... Model loading took 65.9651 GiB") within 0.1 GiB."""
    spec = load_model("gpt-oss-120b")
    pc = count_params(spec)
    plain = weights_per_gpu(spec, _serve(server="vllm==0.33.0"), pc)
    marlin = weights_per_gpu(spec, _serve(server="vllm==0.11.0"), pc)
    mxfp4 = 0.5 + 1 / 32
    grown = 36 * 128 * 3 * (2944 * 3072 - 2880 * 2880) * mxfp4
    assert marlin - plain == pytest.approx(grown, rel=1e-12)
    assert marlin / 2**30 == pytest.approx(65.9651, abs=0.1)
    assert weights_per_gpu(spec, _serve(server="sglang"), pc) == plain  # SGLang's layout is not vLLM's Marlin


def test_block_size_is_one_vllm_takes():
    """vLLM's --block-size choices (config BlockSize): 7 was taken and gave 456,977 tokens in 65,284 blocks of 7."""
    from trainfit.errors import SetupError

    with pytest.raises(SetupError, match="--block-size 7 is not supported; choose one of: 1, 8, 16, 32, 64, 128, 256"):
        Setup(mode="serve", precision="bf16", block_size=7)


def test_kv_cache_memory_note_says_what_the_fraction_still_does():
    """Beside --kv-cache-memory-bytes the footer does not size the cache from total × fraction (vLLM takes the bytes
    as given; the fraction only sets the free memory its start-up asks for)."""
    from trainfit.api import analytic
    from trainfit.setup import Request

    e = analytic(Request(model="llama-3.1-8b", mode="serve", gpu="H100-80GB", kv_cache_memory=10**10,
                         gpu_memory_utilization=0.5))
    first = next(n for n in e.notes if n.startswith("vLLM "))
    assert "requested = total" not in first and "taken as given" in first and "start-up" in first
    assert e.detail.serving.kv_blocks * 16 * e.detail.serving.kv_bytes_per_token <= 10**10


def test_a_fixed_kv_cache_too_small_for_one_request_is_told_to_grow_not_the_fraction():
    """1.5 GB of KV at 128 KiB a token (Llama-3.1-8B bf16: 32 layers x 2 x 8 heads x 128 x 2 B) is 11,444 tokens,
    under one 131,072-token request: vLLM raises. The fraction does not size a given cache, so the advice names
    --kv-cache-memory, not --gpu-memory-utilization."""
    from trainfit.api import analytic
    from trainfit.setup import Request

    e = analytic(Request(model="llama-3.1-8b", mode="serve", gpu="H100-80GB", kv_cache_memory=1_500_000_000))
    note = next(n for n in e.notes if n.startswith("does not start"))
    assert "raise --kv-cache-memory" in note and "--gpu-memory-utilization" not in note
    assert "raise --gpu-memory-utilization" in next(
        n for n in analytic(Request(model="llama-3.1-8b", mode="serve", gpu="L4")).notes
        if n.startswith("does not start"))

def test_requests_longer_than_the_model_length_are_not_timed():
    """512 + 512-token requests against --max-model-len 600: the server refuses them, so no throughput is reported
    (it was, at 1,024-token requests), and a note says why."""
    from trainfit.api import analytic
    from trainfit.setup import Request

    e = analytic(Request(model="llama-3.1-8b", mode="serve", gpu="H100-80GB", max_model_len=600))
    assert e.time.tokens_per_second == 0 and any("longer than the model length, 600" in n for n in e.notes)
    ok = analytic(Request(model="llama-3.1-8b", mode="serve", gpu="H100-80GB", max_model_len=600, prompt_len=300,
                          completion_len=300))
    assert ok.time.tokens_per_second > 0


def test_kv_tokens_line_says_when_vllms_count_is_whole_requests(capsys):
    """vLLM counts the pool in whole max-model-len requests: at --max-model-len 1 that is one token a block, and the
    table says so beside the blocks' token slots (blocks x 16)."""
    from trainfit.cli.app import main

    main(["estimate", "tiny-llama", "--mode", "serve", "--gpu", "H100-80GB", "--max-model-len", "1"])
    import re

    words = " ".join(capsys.readouterr().out.replace("│", " ").split())  # (a narrow console wraps the cell)
    blocks = int(re.search(r"tokens in ([\d,]+) blocks of 16", words).group(1).replace(",", ""))
    assert f"as whole 1-token requests; {blocks * 16:,} token slots" in words
