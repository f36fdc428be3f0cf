"""The analytic engine against the trace engine for every model family in the catalog: peaks within 1%.

The trace runs the real transformers model on fake tensors and records every allocation (exact against real CPU
steps, tests/trace), so any gap here is a term the closed form misses. Each family is a catalog config shrunk to
2 layers, hidden 128, 4 heads, vocabulary 1000 (its structural flags kept: GQA ratio, fused projections, biases,
norms, tied embeddings, MoE routing, dropout), trained with batch 2 × 128 tokens — where every part of the step
(states, activations, the loss's logits, the optimizer's temporaries) weighs a few percent or more, so a missing
term shows. The families come from the catalog files: a new family is covered when its config lands there.

CPU semantics depend on the CPU: where oneDNN has a 16-bit matmul path (AVX-512, AVX2-VNNI-2, unless
ONEDNN_MAX_CPU_ISA caps it) the trace's probe counts the scratch each bf16 matmul allocates inside the op, and the
analytic engine counts the same by its mechanism (analytic/onednn.py; the matmuls where the peak can fall:
inference._prefill_gemms, backward._down_backward_gemms, backward._rerun_down_gemm). The same cases, same tolerance,
on every CPU: CI runs this file on its machine's own ISA and again with ONEDNN_MAX_CPU_ISA=AVX2 (.ci/run).
"""
from __future__ import annotations

import json
from importlib import resources

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from trainfit.analytic.engine import estimate  # noqa: E402
from trainfit.models.hf_config import spec_from_config  # noqa: E402
from trainfit.setup import Setup  # noqa: E402
from trainfit.trace import trace_spec  # noqa: E402

TOLERANCE = 0.01
HIDDEN, HEADS, HEAD_DIM, WIDTH, VOCAB, LAYERS, POSITIONS = 128, 4, 32, 256, 1000, 2, 256
PRECISIONS = ("fp32", "amp-bf16", "bf16", "bf16-master")
RECOMPUTE = ("none", "full")
INFER_PRECISIONS = ("fp32", "bf16", "amp-bf16")


def catalog_configs() -> dict[str, dict]:
    """One catalog config per model_type: a published model's where there is one (its flags are the family's)."""
    out: dict[str, tuple[bool, str, dict]] = {}
    for f in sorted(resources.files("trainfit.models.catalog").iterdir(), key=lambda p: p.name):
        if not f.name.endswith(".json"):
            continue
        cfg = json.loads(f.read_text())
        tiny = f.name.startswith("tiny-")
        mt = cfg["model_type"]
        if mt not in out or (out[mt][0] and not tiny):
            out[mt] = (tiny, f.name, cfg)
    return {mt: cfg for mt, (_, _, cfg) in sorted(out.items())}


def _set(cfg: dict, keys: tuple[str, ...], value) -> None:
    """Set the first of `keys` the config uses (the family's own name for it), or the first one."""
    cfg[next((k for k in keys if k in cfg), keys[0])] = value


def shrink(cfg: dict) -> dict:
    """The family's config at test size: dimensions replaced, structural flags (biases, norms, tying, fused
    projections, dropout, routing) kept."""
    c = {k: v for k, v in cfg.items() if k != "_trainfit"}
    if isinstance(c.get("text_config"), dict):  # a language model nested in a VLM's config (Qwen3-VL): shrunk there
        return {**c, "text_config": shrink(c["text_config"])}
    heads = cfg.get("num_attention_heads", cfg.get("n_head"))
    _set(c, ("hidden_size", "n_embd"), HIDDEN)
    _set(c, ("num_hidden_layers", "n_layer"), LAYERS)
    _set(c, ("num_attention_heads", "n_head"), HEADS)
    if "decoder_attention_heads" in c:  # BART: the decoder's own heads (HEADS divides HIDDEN; 12 does not)
        c["decoder_attention_heads"] = HEADS
    kv = cfg.get("num_key_value_heads")
    if kv is not None:
        c["num_key_value_heads"] = HEADS if kv == heads else max(1, HEADS // 2)  # MHA stays MHA, GQA/MQA → 2
    if "head_dim" in c or c["model_type"] in ("qwen3", "qwen3_moe", "gemma", "gemma2"):
        c["head_dim"] = HEAD_DIM  # families whose default head_dim is not hidden / heads
    for k in ("intermediate_size", "ffn_dim", "n_inner", "intermediate_size_mlp"):
        if c.get(k) is not None:
            c[k] = WIDTH
    if "word_embed_proj_dim" in c and cfg["word_embed_proj_dim"] != cfg.get("hidden_size"):
        c["word_embed_proj_dim"] = HIDDEN // 2  # OPT-350m's projected embeddings
    elif "word_embed_proj_dim" in c:
        c["word_embed_proj_dim"] = HIDDEN
    c["vocab_size"] = VOCAB
    offset = (c.get("pad_token_id") or 0) + 1 if c["model_type"] == "roberta" else 0
    for k in ("max_position_embeddings", "n_positions", "n_ctx", "original_max_position_embeddings"):
        if k in c:
            c[k] = POSITIONS + (offset if k == "max_position_embeddings" else 0)
    for k, v in (("num_local_experts", 4), ("num_experts", 4), ("num_experts_per_tok", 2),
                 ("moe_intermediate_size", WIDTH // 4), ("shared_expert_intermediate_size", WIDTH // 2)):
        if k in c:
            c[k] = v
    if c.get("rope_scaling"):
        c["rope_scaling"] = None
    if isinstance(c.get("no_rope_layers"), list):
        c["no_rope_layers"] = [1, 0]  # Llama 4: one RoPE (chunked) layer and one NoPE (full attention) layer
    if c.get("attention_chunk_size"):
        c["attention_chunk_size"] = 64  # chunks that act within the test's 128 tokens
    if "max_window_layers" in c:
        c["max_window_layers"] = LAYERS
    if isinstance(c.get("layer_types"), list):
        c["layer_types"] = c["layer_types"][:LAYERS]
    if isinstance(c.get("cross_attention_layers"), list):
        c["cross_attention_layers"] = [LAYERS - 1]  # Mllama: a self-attention and a cross-attention layer
    if "full_attention_interval" in c:
        # Qwen3-Next: a Gated DeltaNet layer and a gated full-attention layer (the published 3:1 would make both of the
        # 2 layers linear, and a cache of linear layers only has no sequence length for generate), 2 key heads and 4
        # value heads (the published 1:2 grouping) of HEAD_DIM
        c.update(full_attention_interval=2, linear_num_key_heads=2, linear_num_value_heads=4,
                 linear_key_head_dim=HEAD_DIM, linear_value_head_dim=HEAD_DIM)
    if "hybrid_override_pattern" in c:
        # Nemotron-H: a Mamba-2 block and an attention block (the pattern sets the layer count), 8 Mamba heads
        c.update(hybrid_override_pattern="M*", mamba_num_heads=8)
    for k in ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id"):
        v = c.get(k)
        if isinstance(v, int) and v >= VOCAB:
            c[k] = 1
        elif isinstance(v, list):
            c[k] = [x if x < VOCAB else 1 for x in v]
    return c


CONFIGS = catalog_configs()
# the DeepSeek families last: each family's setups rotate with its index, so appending keeps the others' cases
# (families added later go after them, in the order they came: inserting one in alphabetical order would move the
# setups of every family after it)
ADDED_LATER = ("nemotron", "gemma3_text", "nemotron_h", "qwen3_next", "gpt_oss", "llama4_text")
FAMILIES = (sorted((f for f in CONFIGS if f not in ADDED_LATER), key=lambda f: f.startswith("deepseek"))
            + [f for f in ADDED_LATER if f in CONFIGS])


def setups(index: int) -> list[Setup]:
    """A few setups per family: every precision × recompute pair once, half on each device (which half rotates
    with the family), the optimizer alternating; and inference on both devices."""
    out = []
    pairs = [(p, r) for p in PRECISIONS for r in RECOMPUTE]
    for i, (precision, recompute) in enumerate(pairs):
        out.append(Setup(batch=2, seq=128, precision=precision, recompute=recompute,
                         optimizer="adamw" if (i // 2 + index) % 2 == 0 else "sgd",
                         device="cpu" if (i + index) % 2 == 0 else "cuda"))
    for j, device in enumerate(("cpu", "cuda")):
        out.append(Setup(batch=2, seq=128, precision=INFER_PRECISIONS[(index + j) % 3], device=device, mode="infer"))
    return out


def _id(family: str, s: Setup) -> str:
    if s.mode == "infer":
        return f"{family}-infer-{s.precision}-{s.device}"
    return f"{family}-{s.precision}-{s.recompute}-{s.optimizer}-{s.device}"


# Cases whose gap is a term the analytic engine does not have yet: (id) -> what is missing. strict: an xfail that
# starts passing fails the run, so a fixed term retires its entry.
KNOWN_GAPS: dict[str, str] = {
    "roberta-bf16-full-adamw-cuda": (
        "CUDA allocator rounding and Adam's step scalars: the trace rounds every allocation up to 512 B "
        "(trace/recorder.py cuda_rounded), which at hidden 128 in bf16 doubles each of RoBERTa's ~40 bias/norm "
        "vectors, their gradients and Adam states; and the HF stack's fused AdamW keeps each parameter's `step` on "
        "the device (torch/optim/adam.py:168-175: on the CPU only when neither fused nor capturable), 512 B each "
        "there — the analytic engine counts exact bytes and no step tensors (-1.04%; nil at real sizes)"),
}

# MLA (DeepSeek) at the same 1 % (its 3 %, issue 16's target, retired: every case within 0.3 % once the re-run's
# math-path moment and the fused SDPA backward's output gradient were priced), though the shrunk configs keep the
# published MLA widths (q_lora 1536, kv_lora 512 beside hidden 128) and 2 layers of which one is dense, so the q/kv
# down-projections and the dense/MoE mix weigh far more than at real sizes.

# Open, not in the default cases since nemotron moved to the end of the matrix: fp32 with full recompute on CUDA
# semantics, where SDPA with GQA takes the math path (activations.resolved_kernel), reads -3.4 %: the re-run layer's
# attention backward holds the (b·heads, s, s) fp32 scores and probabilities and k/v repeated to every head, which the
# recompute moments price as the flash kernel's q, k, v and output (the prefill's are priced: inference
# _math_sdpa_prefill).

try:  # the CPU's 16-bit oneDNN matmul path (off under ONEDNN_MAX_CPU_ISA=AVX2; test_vlm_analytic.py reads it)
    import torch as _torch
    _ONEDNN_BF16 = bool(_torch.ops.mkldnn._is_mkldnn_bf16_supported())
except (AttributeError, RuntimeError):
    _ONEDNN_BF16 = False

# Families checked in a file of their own (a tower beside the language model, its own shrunk sizes and image
# counts), left out of the matrix so that the others keep their setups
OWN_FILE: dict[str, str] = {"qwen2_5_vl": "tests/analytic/test_vlm_analytic.py",
                            "gemma3": "tests/analytic/test_vlm_analytic.py",
                            "qwen3_vl": "tests/analytic/test_vlm_analytic.py",
                            "mllama": "tests/analytic/test_mllama_analytic.py",
                            # inference (two stacks, two caches); training in test_encoder_decoder_training.py
                            "t5": "tests/analytic/test_encoder_decoder_analytic.py",
                            "mt5": "tests/analytic/test_encoder_decoder_analytic.py",
                            # inference (encdec_absolute.py; before: -3.0 % and -5.6 % with one-stack terms);
                            # training in test_encoder_decoder_training.py
                            "bart": "tests/analytic/test_encoder_decoder_analytic.py",
                            "whisper": "tests/analytic/test_encoder_decoder_analytic.py"}


def default_run(index: int, s: Setup) -> bool:
    """The half of a family's training setups the default run checks (the other half is in the heavy tier, to keep
    the run under 10 minutes): each precision once, recompute alternating with it, so that both optimizers and both
    devices stay in; every inference setup."""
    if s.mode == "infer":
        return True
    return (PRECISIONS.index(s.precision) + RECOMPUTE.index(s.recompute) + index) % 2 == 0


# default cases that run their path again in another default test, at 10 s or more here (pure bf16 on the CPU): to the
# heavy tier, with the test that keeps the path
COVERED_ELSEWHERE = {"nemotron_h-bf16-full-sgd-cpu": "tests/analytic/test_hybrid_inference.py "
                                                     "test_training_past_one_chunk_within_1_percent_of_the_trace"
                                                     "[small-bf16-full-cpu] (Nemotron-H, bf16, full recompute, CPU)"}

CASES = []
# (a family in its own file takes no index: the others' setups stay as they were)
for _i, _family in enumerate(f for f in FAMILIES if f not in OWN_FILE):
    for _s in setups(_i):
        _case = _id(_family, _s)
        _marks = [pytest.mark.xfail(reason=KNOWN_GAPS[_case], strict=True)] if _case in KNOWN_GAPS else []
        if (not default_run(_i, _s) or _case in COVERED_ELSEWHERE) and _case not in KNOWN_GAPS:
            _marks.append(pytest.mark.heavy)  # (a named gap stays in the default run)
        CASES.append(pytest.param(_family, _s, id=_case, marks=_marks))


def test_every_catalog_family_is_covered():
    shrunk = {mt: spec_from_config(shrink(cfg), f"small-{mt}") for mt, cfg in CONFIGS.items()}
    assert set(shrunk) == {json.loads(f.read_text())["model_type"]
                           for f in resources.files("trainfit.models.catalog").iterdir() if f.name.endswith(".json")}
    for mt, spec in shrunk.items():
        assert (spec.hidden, spec.layers, spec.vocab) == (HIDDEN, LAYERS, VOCAB), mt


def assert_analytic_near_trace(spec, setup, label: str, tolerance: float) -> None:
    """The analytic peak within `tolerance` of the traced one; the message shows both breakdowns at the peak."""
    traced = trace_spec(spec, setup, flops=False).memory
    predicted = estimate(spec, setup).memory
    gap = (predicted.peak - traced.peak) / traced.peak
    assert abs(gap) <= tolerance, (
        f"{label}: analytic {predicted.peak} ({predicted.peak_phase}) vs trace {traced.peak} ({traced.peak_phase}): "
        f"{gap:+.2%}; analytic at peak {predicted.at_peak}, trace at peak {traced.at_peak}")


@pytest.mark.slow
@pytest.mark.parametrize("family,setup", CASES)
def test_analytic_peak_within_1_percent_of_the_trace(family, setup):
    spec = spec_from_config(shrink(CONFIGS[family]), f"small-{family}")
    assert_analytic_near_trace(spec, setup, family, TOLERANCE)


def test_full_recompute_under_cuda_autocast_lists():
    """A CUDA-semantics trace recomputes a checkpointed layer under the forward's CUDA autocast lists (step/standard.py
    _forward_function_modes): GPT-2's tanh-GELU pow runs in fp32 in both, so checkpoint's check of the recomputed
    tensors passes (before: CheckpointError, fp32 saved and bf16 recomputed: `trainfit estimate gpt2 --engine trace
    --recompute full` crashed) and the analytic peak (at the loss, in the backward) is the trace's within 1 %.
    NB: on the shrunk config the recompute is the peak and the analytic engine reads -6.3 %: the re-run GELU's fp32
    copies under CUDA autocast are not among analytic/recompute.py's moments."""
    from trainfit.models.resolve import load_model

    setup = Setup(batch=2, seq=1024, precision="amp-bf16", recompute="full", optimizer="adamw", device="cuda")
    assert_analytic_near_trace(load_model("gpt2"), setup, "gpt2", TOLERANCE)


@pytest.mark.slow
@pytest.mark.parametrize("precision,device,mode", [("bf16", "cpu", "train"), ("amp-bf16", "cuda", "train"),
                                                   ("fp32", "cuda", "train"), ("bf16", "cpu", "infer")])
def test_sliding_layers_past_their_window(precision, device, mode):
    """A sequence past the window: transformers' sliding layers run SDPA with an explicit mask and k, v repeated to
    every head (activations.masked_window_share); the matrix's 128 tokens stay inside every catalog window. Gemma 3
    (3 local layers, 1 global) with a 64-token window at 2 x 200; without the term training read -2.3 % (CPU) and
    -1.7 % (CUDA), with Adam. fp32 on CUDA (GQA: the math path unmasked, the memory-efficient kernel masked,
    activations.masked_efficient_share) read +6.65 % with the window's layers priced as math."""
    from trainfit.models.resolve import load_model

    spec = load_model("tiny-gemma3")
    spec = spec_from_config({**spec.config, "sliding_window": 64}, "tiny-gemma3-window-64")
    assert spec.sliding_window_layers == 3
    setup = Setup(batch=2, seq=200, precision=precision, device=device, mode=mode,
                  **({} if mode == "infer" else {"optimizer": "adamw"}))
    assert_analytic_near_trace(spec, setup, "gemma3_text", TOLERANCE)


@pytest.mark.slow
@pytest.mark.parametrize("precision,recompute,device", [("bf16", "none", "cuda"), ("amp-bf16", "full", "cpu")])
def test_gpt_oss_attention_at_a_long_sequence(precision, recompute, device):
    """gpt-oss's eager attention with sinks (analytic/sink_attention.py) past the matrix's 128 tokens, where its s×s
    tensors set the peak: without recompute inside the last layer's forward (the masked scores and the max-subtracted
    logits beside the saved softmax output: forward_moments), with full recompute inside the re-run's (backward.py).
    The shrunk config at 1 x 2048; without these moments the analytic peak read -9.1 % (bf16) and -24.8 %
    (amp-bf16, full recompute)."""
    spec = spec_from_config(shrink(CONFIGS["gpt_oss"]), "small-gpt_oss")
    setup = Setup(batch=1, seq=2048, precision=precision, recompute=recompute, device=device, optimizer="sgd")
    assert_analytic_near_trace(spec, setup, "gpt_oss", TOLERANCE)


@pytest.mark.slow
@pytest.mark.parametrize("precision,device,mode,recompute", [
    ("bf16", "cpu", "train", "none"), ("amp-bf16", "cuda", "train", "none"), ("fp32", "cuda", "train", "full"),
    ("bf16", "cpu", "infer", "none")])
def test_llama4_scout_shape(precision, device, mode, recompute):
    """The matrix takes Llama 4's first catalog config, Maverick's (use_qk_norm false, dense and MoE layers
    interleaved); Scout's has every layer MoE and Llama4TextL2Norm on q and k of its RoPE layers (activations.py's
    L2 term, moe_every_expert.py's moments with no dense layer between). Shrunk as the matrix shrinks: one chunked
    RoPE layer with the L2 norm, one NoPE layer, both MoE. Without the L2 term training read -1.03 % (bf16, CPU),
    -0.69 % (amp-bf16, CUDA), -0.65 % (fp32 full recompute, CUDA)."""
    cfg = json.loads((resources.files("trainfit.models.catalog") / "llama-4-scout.json").read_text())
    spec = spec_from_config(shrink(cfg), "small-llama-4-scout")
    assert (spec.qk_l2_norm_layers, spec.moe.sparse_layers, spec.chunked_layers) == (1, None, 1)
    setup = Setup(batch=2, seq=128, precision=precision, device=device, mode=mode,
                  **({} if mode == "infer" else {"optimizer": "adamw", "recompute": recompute}))
    assert_analytic_near_trace(spec, setup, "llama4_text (Scout)", TOLERANCE)


@pytest.mark.slow
@pytest.mark.heavy  # (4 s: the matrix's small amp-bf16 full-recompute case checks the same moments by default)
def test_llama4_scout_full_recompute_under_autocast_at_a_real_size():
    """Llama 4 Scout at its published widths (2 layers) under amp-bf16 with full recompute, 1 x 4096 on CUDA
    semantics: the backward high point is the end of the MoE layer's re-run forward (checkpoint's early stop, the
    re-run's unsaved locals beside its saved set: moe_every_expert.every_expert_moments). Pricing the experts' product
    rule alone read +1.58 %."""
    from trainfit.models.resolve import load_model
    from trainfit.trace.extrapolate import with_layers

    spec = with_layers(load_model("llama-4-scout"), 2)
    setup = Setup(batch=1, seq=4096, precision="amp-bf16", recompute="full", optimizer="adamw", device="cuda")
    assert_analytic_near_trace(spec, setup, "llama-4-scout (2 layers)", TOLERANCE)


@pytest.mark.heavy
@pytest.mark.parametrize("family,precision,device", [
    ("deepseek_v3", "bf16", "cuda"), ("nemotron", "bf16", "cpu"), ("nemotron", "amp-bf16", "cpu"),
    ("bert", "amp-bf16", "cpu"), ("bert", "amp-bf16", "cuda"), ("gpt_neox", "amp-bf16", "cpu"),
    ("llama", "amp-bf16", "cpu")])
def test_prefill_moments_at_a_larger_batch(family, precision, device):
    """Prefill moments that the matrix's 2 x 128 hides and 8 x 200 shows (the analytic peak before these terms):
    MLA's q_a_layernorm fp32 upcast of the q LoRA (mla.q_norm_prefill; -20.1 %), relu²'s three intermediate-wide
    tensors (inference._mlp_live; -13.9 % bf16, -9 % amp-bf16), a post-norm layer's closing add and LayerNorm beside
    the held MLP activation and the MLM head's fp32 LayerNorm output under CUDA autocast (inference._post_norm_add;
    -8.2 % CPU, -10.6 % CUDA), and a fused-qkv rotary layer inside SDPA with its autocast casts and the CPU flash
    kernel's buffers (inference._fused_rotary_sdpa, cpu_flash.py; -8.5 %), and inside a Llama-style rotary under CPU
    autocast, with the mixed-dtype mul's fp32 copy (inference._rotary_moment; -2.2 %)."""
    spec = spec_from_config(shrink(CONFIGS[family]), f"small-{family}")
    setup = Setup(batch=8, seq=200, precision=precision, device=device, mode="infer")
    assert_analytic_near_trace(spec, setup, family, TOLERANCE)


@pytest.mark.parametrize("family,precision,optimizer", [
    ("deepseek_v2", "fp32", "adamw"), ("deepseek_v2", "fp32", "sgd"), ("deepseek_v2", "amp-bf16", "adamw"),
    ("deepseek_v2", "amp-bf16", "sgd"), ("deepseek_v3", "fp32", "sgd"), ("deepseek_v3", "bf16", "sgd"),
    ("deepseek_v3", "amp-bf16", "sgd")])
def test_transformers_mla_rerun_on_cpu(family, precision, optimizer):
    """transformers' DeepSeek with full recompute on CPU, read off the trace with each allocation's aten op.
    DeepSeek-V2 peaks in a re-run layer's math-path MLA attention (backward._mla_math_rerun_moment): in fp32 at the
    output's contiguous copy once SDPA returns (mla.math_rerun_live `returned`), the attention norm's input and
    compressed_kv counted once; under autocast with the projections' weight casts, the latent norm's fp32 output and
    the MLP output's gradient cast. Before: +0.42 % / +0.78 % (fp32, AdamW / SGD), -2.90 % / -5.16 % (amp-bf16).
    DeepSeek-V3 under autocast peaks there too, with its rotated k_rot in fp32 and SDPA's bf16 copy of the query
    rotary promoted to fp32 (mla.sdpa_query_copy; before -0.59 %); in fp32 and bf16 in its q norm's backward, beside
    kv_a_proj's input gradient (backward._q_norm_moment; before -0.28 % / -0.22 %)."""
    spec = spec_from_config(shrink(CONFIGS[family]), f"small-{family}")
    setup = Setup(batch=2, seq=128, precision=precision, recompute="full", optimizer=optimizer, device="cpu")
    assert_analytic_near_trace(spec, setup, family, 0.0005)
