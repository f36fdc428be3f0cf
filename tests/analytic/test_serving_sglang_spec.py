"""--server sglang with speculative decoding (analytic/serving_sglang_spec.py). Truths: hand counts of each draft's
tensors from its config.json and SGLang 0.5.23's model files (models/llama_eagle3.py, deepseek_nextn.py), the pool
cell rule of its pool_configurator.py:259-314 worked by hand, DeepSeek-V3's published MTP size, refusals."""
from __future__ import annotations

import json
import shlex

import pytest

from trainfit import overheads
from trainfit.analytic import serving_sglang as sg
from trainfit.analytic.engine import estimate
from trainfit.errors import SetupError
from trainfit.hardware import get_gpu
from trainfit.models.resolve import load_model
from trainfit.setup import Setup

# the EAGLE-3 head for Llama-3.1-8B-Instruct (HF yuhuili/EAGLE3-LLaMA3.1-Instruct-8B config.json)
EAGLE3_CONFIG = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": 4096,
                 "intermediate_size": 14336, "num_hidden_layers": 1, "num_attention_heads": 32,
                 "num_key_value_heads": 8, "vocab_size": 128256, "draft_vocab_size": 32000,
                 "max_position_embeddings": 2048, "rms_norm_eps": 1e-05, "hidden_act": "silu",
                 "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


def _sgl(**kw) -> Setup:
    return Setup(mode="serve", server="sglang", **{"precision": "bf16", **kw})


@pytest.fixture
def eagle3(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(EAGLE3_CONFIG))
    return str(tmp_path)


def _pool_tokens(gpu, weights, cell, fraction=0.83):
    """max_total_num_tokens by hand: (free at start × fraction − weights) // cell (tp 1: the context only)."""
    pre = gpu.memory - overheads.cuda_context(gpu)
    return int((pre * fraction - weights) // cell)


# Llama-3.1-8B bf16 + its fp32 rotary cache + the 2 MiB small-pool segment its 65 norm weights (8 KiB each) share
# (its matrices are whole numbers of 2 MiB: test_serving_sglang.test_llama_8b_token_pool_by_hand)
TARGET_WEIGHTS = 8_030_261_248 * 2 + 131072 * 128 * 4 + (2 << 20) - 65 * 8192


def test_standalone_draft_by_hand():
    """Llama-3.2-1B beside Llama-3.1-8B (--draft-model alone: STANDALONE). Draft weights: 1,235,814,400 params × 2 B
    (tied embedding) + its fp32 rotary cache 131,072 × 64 × 4 B = 2,505,183,232 B. Cell: SGLang adds the draft's 16
    layers at the TARGET's per-layer size: 131,072 + int(131,072 × 16 / 32) = 196,608 B per token."""
    gpu = get_gpu("H100-80GB")
    sv = sg.serve_memory(load_model("llama-3.1-8b"), _sgl(draft_model="llama-3.2-1b"), gpu)
    assert sv.draft.algorithm == "standalone" and sv.draft.layers == 16
    assert sv.draft.weights == 1_235_814_400 * 2 + 131072 * 64 * 4 == 2_505_183_232
    assert sv.kv_bytes_per_token == 196_608
    assert sv.weights == TARGET_WEIGHTS + 2_505_183_232
    assert sv.kv_tokens == _pool_tokens(gpu, sv.weights, 196_608)
    assert (sv.draft.steps, sv.draft.topk, sv.draft.draft_tokens) == (3, 1, 4)  # STANDALONE's auto choice


def test_eagle3_head_by_hand(eagle3):
    """The EAGLE-3 head: one Llama layer (q 4096², k and v 2 × 4096 × 1024, o 4096², MLP 3 × 4096 × 14336, two
    norms = 218,112,000), its q/k/v reading 2h (+ 4096 × 6144 = 25,165,824), fc 3 × 4096² = 50,331,648, its own
    head of 32,000 rows × 4096 = 131,072,000, the final norm 4096: 424,685,568 params × 2 B, + the fp32 rotary cache
    2048 × 128 × 4 B; the embedding is the target's. Cell: 131,072 + int(131,072 / 32) = 135,168. Llama under
    EAGLE-3: 5 steps, top-k 4, 8 draft tokens; the verify graphs capture 256 × 8 = 2048 tokens: the head's output
    2048 × (4096 + 128,256) × 2 B = 542,113,792 (over the forward's 2048 × 55,296 × 2) + the fp32 logits buffer
    2048 × 128,256 × 4 = 1,050,673,152 + 58 prefill sizes × 8 MiB = 2,079,326,208 B."""
    gpu = get_gpu("H100-80GB")
    sv = sg.serve_memory(load_model("llama-3.1-8b"), _sgl(draft_model=eagle3, speculative_algorithm="eagle3"), gpu)
    params = 218_112_000 + 25_165_824 + 50_331_648 + 131_072_000 + 4096
    assert params == 424_685_568
    assert sv.draft.weights == params * 2 + 2048 * 128 * 4
    assert sv.kv_bytes_per_token == 135_168
    assert sv.kv_tokens == _pool_tokens(gpu, TARGET_WEIGHTS + sv.draft.weights, 135_168)
    assert (sv.draft.steps, sv.draft.topk, sv.draft.draft_tokens) == (5, 4, 8)
    assert sv.cuda_graphs == 542_113_792 + 1_050_673_152 + 58 * 8 * 2**20 == 2_079_326_208


def test_deepseek_nextn_matches_the_published_mtp_size():
    """DeepSeek-V3's MTP module: "11.5B unique parameters" beside the shared embedding and head (DeepSeek-V3
    README, model weights section). trainfit's NEXTN draft at tp 1 in bf16 / 2 B: within 2 %. Cell: the latent
    (512 + 64) × 61 × 2 = 70,272 + int(70,272 / 61) = 71,424 B per token."""
    spec = load_model("deepseek-v3")
    sv = sg.serve_memory(spec, _sgl(tp=8, quant="fp8", speculative_algorithm="nextn"), get_gpu("H200"))
    assert sv.kv_bytes_per_token == 70_272 + 1_152
    from trainfit.analytic import serving_sglang_spec as sp
    from trainfit.analytic.params import count_params

    whole = sp.draft(spec, _sgl(speculative_algorithm="nextn"), count_params(spec))
    assert whole.layers == 1 and abs(whole.weights / 2 / 11.5e9 - 1) < 0.02


def test_refusals_exit_2(capsys, eagle3):
    from trainfit.cli import main

    base = ["estimate", "llama-3.1-8b", "--mode", "serve", "--gpu", "H100-80GB"]
    for extra, match in ((["--server", "sglang", "--speculative-algorithm", "nextn"], "num_nextn_predict_layers"),
                         (["--server", "sglang", "--speculative-algorithm", "eagle"], "needs its draft head"),
                         (["--server", "sglang", "--speculative-algorithm", "nextn", "--draft-model", eagle3],
                          "drop --draft-model"),
                         (["--speculative-algorithm", "eagle3", "--draft-model", eagle3], "--server vllm"),
                         (["--server", "sglang", "--draft-model", "qwen2.5-0.5b"], "vocabulary")):
        with pytest.raises(SystemExit) as e:
            main(base + extra)
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2 and len(err.splitlines()) == 1 and match in err, err


def test_emit_carries_the_draft(eagle3):
    from trainfit.plan.emit_sglang import sglang_command

    spec, setup = load_model("llama-3.1-8b"), _sgl(draft_model=eagle3, speculative_algorithm="eagle3")
    est = estimate(spec, setup, gpu=get_gpu("H100-80GB"))
    argv = shlex.split(sglang_command("llama-3.1-8b", setup, est.detail.serving))
    # SGLang 0.5.23's flags (arg_groups/fields/spec.py:31-70) and its builtin algorithm name, upper case
    assert argv[argv.index("--speculative-algorithm") + 1] == "EAGLE3"
    assert argv[argv.index("--speculative-draft-model-path") + 1] == eagle3
    assert [argv[argv.index(f) + 1] for f in ("--speculative-num-steps", "--speculative-eagle-topk",
                                              "--speculative-num-draft-tokens")] == ["5", "4", "8"]
    assert any("speculative eagle3" in n for n in est.notes)
