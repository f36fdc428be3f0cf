"""count_params(spec).total == numel of the transformers model built from the same config.

Independent truth: transformers' own modeling code, instantiated on the meta device (no memory, no
weights, no download). Every catalog model is checked, plus small hand-written configs that exercise
the quirks the catalog does not (biases, defaults that differ by model type, OPT projections,
sparse-step MoE, ...). Published totals are checked too, against the source named in the catalog.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainfit.analytic.params import count_params
from trainfit.errors import ConfigError
from trainfit.models.hf_config import spec_from_config
from trainfit.models.resolve import CATALOG_DIR

torch = pytest.importorskip("torch", reason="the exactness check builds the transformers model (pip install trainfit[torch])")
transformers = pytest.importorskip("transformers", reason="the exactness check needs transformers")

CATALOG_FILES = sorted(CATALOG_DIR.glob("*.json"))
ENCODERS = {"bert", "roberta"}
SEQ2SEQ = {"t5", "mt5", "bart"}  # encoder-decoder: AutoModelForSeq2SeqLM (T5ForConditionalGeneration, BartFor...)


def _catalog(path: Path) -> tuple[dict, dict]:
    data = json.loads(path.read_text())
    meta = data.pop("_trainfit")
    return data, meta


def hf_numel(config: dict) -> int:
    """Parameters of the transformers *ForCausalLM / *ForMaskedLM built on the meta device
    (parameters() yields tied weights once)."""
    transformers.logging.set_verbosity_error()
    kwargs = {k: v for k, v in config.items() if k not in ("model_type", "_trainfit")}
    cfg = transformers.AutoConfig.for_model(config["model_type"], **kwargs)
    auto = (transformers.AutoModelForImageTextToText if "vision_config" in config else  # a VLM: tower + LM
            transformers.AutoModelForMaskedLM if config["model_type"] in ENCODERS else
            transformers.AutoModelForSeq2SeqLM if config["model_type"] in SEQ2SEQ else
            transformers.AutoModelForSpeechSeq2Seq if config["model_type"] == "whisper" else
            transformers.AutoModelForCausalLM)
    with torch.device("meta"):
        model = auto.from_config(cfg)
    return sum(p.numel() for p in model.parameters())


def test_catalog_is_big_enough():
    names = {_catalog(p)[1]["name"] for p in CATALOG_FILES}
    required = {
        "bert-base", "bert-large", "roberta-base", "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "gpt-3-175b",
        "llama-1-65b", "llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b",
        "llama-3.2-1b", "mistral-7b", "mixtral-8x7b", "qwen2.5-7b", "qwen2.5-72b", "qwen3-8b", "gemma-2-9b",
        "phi-3-mini", "pythia-1b", "opt-1.3b", "qwen1.5-moe-a2.7b",
    }
    assert required <= names
    assert len(names) >= 24


@pytest.mark.parametrize("path", CATALOG_FILES, ids=[p.stem for p in CATALOG_FILES])
def test_catalog_total_matches_transformers(path):
    config, meta = _catalog(path)
    counts = count_params(spec_from_config(config, meta["name"]))
    assert counts.total == hf_numel(config)


@pytest.mark.parametrize("path", CATALOG_FILES, ids=[p.stem for p in CATALOG_FILES])
def test_catalog_total_matches_published(path):
    config, meta = _catalog(path)
    published = meta.get("params_published")
    if published is None:
        pytest.skip(f"{meta['name']}: no published total")
    tol = meta.get("params_published_tol", 0.02)
    total = count_params(spec_from_config(config, meta["name"])).total
    assert abs(total / published - 1) <= tol, f"{meta['name']}: {total:,} vs published {published:,} ({meta['source']})"
    active_published = meta.get("active_published")
    if active_published is not None:
        active = count_params(spec_from_config(config, meta["name"])).active
        assert abs(active / active_published - 1) <= 0.02, meta["source"]


def test_mixtral_active_is_12_9b():
    # mistral.ai/news/mixtral-of-experts: "46.7B total parameters but only uses 12.9B parameters per token"
    config, meta = _catalog(CATALOG_DIR / "mixtral-8x7b.json")
    c = count_params(spec_from_config(config, meta["name"]))
    assert abs(c.active / 12.9e9 - 1) < 0.01
    assert abs(c.total / 46.7e9 - 1) < 0.01
    assert c.moe_layers == 32 and c.dense_layers == 0
    assert c.expert == 3 * 4096 * 14336


def test_breakdown_adds_up_and_dense_active_is_total():
    for path in CATALOG_FILES:
        config, meta = _catalog(path)
        spec = spec_from_config(config, meta["name"])
        c = count_params(spec)
        per_layers = (spec.layers * (c.attention + c.norms) + c.dense_layers * c.mlp + c.moe_layers * c.moe_mlp
                      + c.linear_layers * (c.linear_attention - c.attention))  # Qwen3-Next's Gated DeltaNet layers
        if spec.hybrid is not None:  # one norm + one mixer per block (Nemotron-H)
            h = spec.hybrid
            per_layers = (spec.layers * c.norms + h.attention_layers * c.attention + h.mlp_layers * c.mlp
                          + h.mamba_layers * c.mamba)
        # (encoder-decoder models: per_layers are the encoder's blocks, the decoder's are in second_stack; a VLM's
        # vision tower in vision; Mllama's cross-attention norms and gates in cross_extras)
        assert c.total == c.embedding + per_layers + c.final + c.lm_head + c.second_stack + c.vision + c.cross_extras
        assert c.dense_layers + c.moe_layers == spec.layers
        if not spec.is_moe:
            assert c.active == c.total and c.moe_mlp == 0 and c.expert == 0


def test_hand_derivation_nemotron_h_8b():
    # Hand derivation from modeling_nemotron_h.py (not the code under test): pattern of 24 M, 4 *, 24 -; a Mamba-2
    # mixer of inner 128*64 = 8192 and conv_dim 8192 + 2*8*128 = 10240: in_proj 4096 x (8192 + 10240 + 128), conv1d
    # 10240*4 + bias 10240, dt_bias/A_log/D 3*128, gated norm 8192, out_proj 8192 x 4096; attention q/o 4096 x 4096,
    # k/v 4096 x 1024, no biases; MLP up/down 4096 x 21504; one RMSNorm per block, norm_f, untied 131072-row tables.
    config, meta = _catalog(CATALOG_DIR / "nemotron-h-8b.json")
    mamba = 4096 * 18560 + 10240 * 5 + 3 * 128 + 8192 + 8192 * 4096
    attention = 2 * 4096 * 4096 + 2 * 4096 * 1024
    mlp = 2 * 4096 * 21504
    expected = 24 * mamba + 4 * attention + 24 * mlp + 52 * 4096 + 4096 + 2 * 131072 * 4096
    c = count_params(spec_from_config(config, meta["name"]))
    assert (c.mamba, c.total) == (mamba, expected)


@pytest.mark.parametrize("stack,weight_bytes", [("hf", 4), ("megatron", 2)])  # amp-bf16's fp32 / bf16-master's bf16
@pytest.mark.parametrize("name", ["tiny-qwen3-next", "qwen3-next-80b-a3b"])
def test_one_gpu_holds_every_parameter_of_a_gated_deltanet_model(name, stack, weight_bytes):
    # One GPU (no tp/pp/ep/ZeRO) holds the whole model: transformers' own numel, Gated DeltaNet layers included
    # (their mixer outweighs the attention it replaces: 232,379,136 parameters were missing from the 80B's rank)
    from trainfit.api import estimate

    config, _ = _catalog(CATALOG_DIR / f"{name}.json")
    est = estimate(name, stack=stack)
    assert est.params_per_rank == est.params == hf_numel(config)
    assert est.memory.weights == weight_bytes * hf_numel(config)


@pytest.mark.parametrize("name", ["tiny-nemotron-h", "nemotron-h-8b"])
def test_megatron_rank_holds_every_parameter_of_a_hybrid_model(name):
    # One rank of Megatron's parameter layout (parallel/megatron.py rank_params) at tp = pp = 1 holds the whole
    # Mamba-2/attention/MLP stack: transformers' own numel (nemotron-h-8b's rank had counted every block as
    # attention + MLP: 12.4B of 8.1B). (The estimate refuses the model's training on --stack megatron: its memory
    # model has no Mamba-2 layers, tests/plan/test_not_modelled.py.)
    from trainfit.analytic.parallel.megatron import rank_params
    from trainfit.analytic.parallel.pipeline import stages
    from trainfit.api import load_spec
    from trainfit.setup import Setup

    config, _ = _catalog(CATALOG_DIR / f"{name}.json")
    spec = load_spec(name)
    (stage,) = stages(spec, Setup(stack="megatron", precision="bf16-master"))
    dense, expert = rank_params(spec, count_params(spec), Setup(stack="megatron", precision="bf16-master"), stage)
    assert dense + expert == hf_numel(config)


@pytest.mark.parametrize("name", ["qwen2.5-vl-3b", "qwen3-vl-2b", "gemma-3-4b", "llama-3.2-11b-vision"])
def test_megatron_rank_holds_a_vlms_image_encoder(name):
    # One GPU under --stack megatron holds the whole vision-language model, tower included: transformers' own numel
    # of *ForConditionalGeneration (qwen2.5-vl-3b's rank had 3,085,938,688 of 3,754,622,976: no tower)
    from trainfit.api import estimate

    config, _ = _catalog(CATALOG_DIR / f"{name}.json")
    est = estimate(name, stack="megatron")
    assert est.params_per_rank == est.params == hf_numel(config)
    assert est.memory.weights == 2 * hf_numel(config)


def test_hand_derivation_llama_2_7b():
    # Hand derivation (not the code under test): 32 layers of 4*4096^2 attention + 3*4096*11008 SwiGLU
    # + 2 RMSNorms, untied 32000-row embedding and lm_head, final RMSNorm.
    config, meta = _catalog(CATALOG_DIR / "llama-2-7b.json")
    layer = 4 * 4096**2 + 3 * 4096 * 11008 + 2 * 4096
    assert count_params(spec_from_config(config, "x")).total == 32 * layer + 2 * 32000 * 4096 + 4096 == 6_738_415_616


# Small configs exercising quirks the catalog leaves untouched. Each is checked against transformers.
TINY = dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_size=96,
            vocab_size=211, max_position_embeddings=64)
QUIRKS = {
    "llama-biases-tied-headdim": dict(TINY, model_type="llama", attention_bias=True, mlp_bias=True,
                                      tie_word_embeddings=True, head_dim=24, num_key_value_heads=2,
                                      rope_scaling={"rope_type": "linear", "factor": 2.0}),
    "mistral-headdim": dict(TINY, model_type="mistral", head_dim=8, num_key_value_heads=1, sliding_window=16),
    "qwen2-sliding-tied": dict(TINY, model_type="qwen2", use_sliding_window=True, sliding_window=16,
                               max_window_layers=1, tie_word_embeddings=True, num_key_value_heads=2),
    "qwen3-default-head-dim": dict(TINY, model_type="qwen3", num_key_value_heads=2),  # Qwen3Config head_dim=128
    "qwen3-attention-bias": dict(TINY, model_type="qwen3", head_dim=16, attention_bias=True, num_key_value_heads=4),
    # Qwen3Config: num_key_value_heads = 32 and head_dim = 128 when absent (not heads, not hidden/heads)
    "qwen3-absent-kv": dict(TINY, model_type="qwen3", num_attention_heads=32),
    "gemma-defaults": dict(TINY, model_type="gemma", num_attention_heads=16),  # head_dim 256, kv 16, tied
    "gemma-untied-bias": dict(TINY, model_type="gemma", head_dim=16, tie_word_embeddings=False, attention_bias=True,
                              num_key_value_heads=1),
    "gemma2-defaults": dict(TINY, model_type="gemma2"),  # head_dim 256, kv 4, tied
    "phi3-gqa": dict(TINY, model_type="phi3", num_key_value_heads=2, pad_token_id=None, eos_token_id=None),
    "mistral-absent-kv": dict(TINY, model_type="mistral", num_attention_heads=8),  # MistralConfig kv = 8
    "gpt2-n-inner-untied": dict(model_type="gpt2", n_embd=64, n_layer=2, n_head=4, n_inner=80, n_positions=32,
                                vocab_size=211, tie_word_embeddings=False),
    "neox-no-bias-serial-tied": dict(TINY, model_type="gpt_neox", attention_bias=False,
                                     use_parallel_residual=False, tie_word_embeddings=True),
    "opt-proj-postnorm": dict(TINY, model_type="opt", ffn_dim=96, word_embed_proj_dim=32, do_layer_norm_before=False),
    "opt-no-affine-no-bias": dict(TINY, model_type="opt", ffn_dim=96, enable_bias=False,
                                  layer_norm_elementwise_affine=False, tie_word_embeddings=False),
    "bert-untied": dict(TINY, model_type="bert", tie_word_embeddings=False, type_vocab_size=3),
    "roberta-pad0": dict(TINY, model_type="roberta", pad_token_id=0, type_vocab_size=1),
    "mixtral-headdim": dict(TINY, model_type="mixtral", num_local_experts=4, num_experts_per_tok=2, head_dim=8,
                            num_key_value_heads=2),
    # Llama 4: MoE every 3rd layer from interleave_moe_layer_step (no moe_layers list), dense layers
    # intermediate_size_mlp wide, biased attention, no qk-norm weights
    "llama4-interleave-bias": dict(TINY, model_type="llama4_text", head_dim=16, num_key_value_heads=2,
                                   interleave_moe_layer_step=3, num_hidden_layers=5, intermediate_size_mlp=80,
                                   num_local_experts=3, attention_bias=True),
    # gpt-oss: GptOssConfig defaults for head_dim (64), kv heads (8), experts (128, top-4) and layer_types (3 layers:
    # sliding, full, sliding); no attention biases (sinks, router and expert biases stay)
    "gpt-oss-defaults-no-attn-bias": dict(TINY, model_type="gpt_oss", num_attention_heads=8, attention_bias=False),
    # Nemotron-H: in/out_proj biases (use_bias), no conv bias, MLP biases, legacy block names; attention_bias is
    # ignored by NemotronHAttention (q/k/v/o bias=False)
    "nemotron-h-biases": dict(TINY, model_type="nemotron_h", layers_block_type=["mamba", "attention", "mlp", "mamba"],
                              mamba_num_heads=8, mamba_head_dim=16, ssm_state_size=8, n_groups=4, use_bias=True,
                              use_conv_bias=False, mlp_bias=True, attention_bias=True, num_key_value_heads=2,
                              head_dim=16),
    "qwen2moe-sparse-step": dict(TINY, model_type="qwen2_moe", num_experts=6, num_experts_per_tok=2,
                                 moe_intermediate_size=24, shared_expert_intermediate_size=40,
                                 decoder_sparse_step=2, mlp_only_layers=[3], num_hidden_layers=5,
                                 num_key_value_heads=4),
    "qwen2moe-no-qkv-bias": dict(TINY, model_type="qwen2_moe", num_experts=4, num_experts_per_tok=1,
                                 moe_intermediate_size=24, shared_expert_intermediate_size=32, qkv_bias=False,
                                 mlp_only_layers=[0], num_key_value_heads=2),
    "qwen3moe-dense-layer": dict(TINY, model_type="qwen3_moe", num_experts=8, num_experts_per_tok=2,
                                 moe_intermediate_size=16, mlp_only_layers=[0], num_key_value_heads=2),
    # T5 v1.0 (relu, the decoder output scaled) with a decoder deeper than the encoder and 16 relative buckets, set
    # through the T5Config aliases (hidden_size, num_hidden_layers, num_attention_heads, head_dim)
    "t5-relu-deeper-decoder": dict(TINY, model_type="t5", head_dim=24, d_ff=96, num_decoder_layers=5,
                                   relative_attention_num_buckets=16, decoder_start_token_id=0),
    # mT5: MT5Config's own defaults (vocab 250112, d_ff 1024, 8 layers, 6 heads, gated-gelu) where the config is silent
    "mt5-defaults": dict(model_type="mt5", d_model=48, d_kv=8, decoder_start_token_id=0),
    # Whisper: a 3-block decoder with its own heads and MLP width, 16 mel bins, 32 + 24 positions, untied proj_out
    "whisper-untied-decoder-widths": dict(model_type="whisper", d_model=64, encoder_layers=2, decoder_layers=3,
                                          encoder_attention_heads=4, decoder_attention_heads=2, encoder_ffn_dim=128,
                                          decoder_ffn_dim=96, vocab_size=211, num_mel_bins=16,
                                          max_source_positions=32, max_target_positions=24, tie_word_embeddings=False,
                                          pad_token_id=1, bos_token_id=1, eos_token_id=1, decoder_start_token_id=2),
    # BART: a decoder with its own heads and MLP width, untied lm_head, 3 encoder and 2 decoder blocks
    "bart-decoder-widths-untied": dict(model_type="bart", d_model=64, encoder_layers=3, decoder_layers=2,
                                       encoder_attention_heads=4, decoder_attention_heads=2, encoder_ffn_dim=96,
                                       decoder_ffn_dim=80, vocab_size=211, max_position_embeddings=64,
                                       tie_word_embeddings=False),
}


@pytest.mark.parametrize("name", sorted(QUIRKS))
def test_quirk_total_matches_transformers(name):
    config = QUIRKS[name]
    assert count_params(spec_from_config(config, name)).total == hf_numel(config)


def test_quirk_spec_fields():
    s = spec_from_config(QUIRKS["qwen3-default-head-dim"], "q")
    assert s.head_dim == 128 and s.qk_norm
    assert spec_from_config(QUIRKS["qwen3-absent-kv"], "q").kv_heads == 32
    assert spec_from_config(QUIRKS["mistral-absent-kv"], "m").kv_heads == 8
    assert spec_from_config(QUIRKS["gemma2-defaults"], "g").kv_heads == 4
    assert spec_from_config(QUIRKS["gemma-defaults"], "g").head_dim == 256
    assert spec_from_config(QUIRKS["gemma-defaults"], "g").tied_embeddings
    s = spec_from_config(QUIRKS["qwen2moe-sparse-step"], "m")
    assert s.moe.sparse_layers == 1  # layers 1 and 3 are on the step; 3 is mlp-only
    c = count_params(s)
    assert (c.moe_layers, c.dense_layers) == (1, 4)
    s = spec_from_config(QUIRKS["opt-proj-postnorm"], "o")
    assert s.embed_proj_dim == 32 and not s.final_norm and s.position_offset == 2
    s = spec_from_config(QUIRKS["qwen2-sliding-tied"], "q")
    assert s.sliding_window == 16 and s.sliding_window_layers == 2
    config, _ = _catalog(CATALOG_DIR / "gemma-2-9b.json")
    s = spec_from_config(config, "g")
    assert s.norms_per_layer == 4 and s.sliding_window == 4096 and s.sliding_window_layers == 21
    s = spec_from_config(QUIRKS["gpt-oss-defaults-no-attn-bias"], "o")
    assert (s.head_dim, s.kv_heads, s.moe.num_experts, s.moe.top_k) == (64, 8, 128, 4)
    assert s.sliding_window == 128 and s.sliding_window_layers == 2 and s.attn_sinks and not s.qkv_bias
    config, _ = _catalog(CATALOG_DIR / "gpt-oss-120b.json")
    s = spec_from_config(config, "g")
    assert s.sliding_window == 128 and s.sliding_window_layers == 18 and s.moe.swiglu_limit == 7.0


def test_catalog_spec_fields():
    def spec(name):
        config, _ = _catalog(CATALOG_DIR / f"{name}.json")
        return spec_from_config(config, name)

    s = spec("bert-base")
    assert not s.causal and s.embedding_norm and s.mlm_transform and s.lm_head_bias and s.type_vocab == 2
    assert s.positions == "learned" and s.tied_embeddings and not s.final_norm
    s = spec("roberta-base")
    assert s.max_positions == 512 and s.position_offset == 2 and s.type_vocab == 1
    s = spec("gpt2")
    assert s.positions == "learned" and s.tied_embeddings and s.intermediate == 3072 and not s.gated_mlp
    s = spec("pythia-1b")
    assert s.parallel_residual and not s.tied_embeddings and s.positions == "rotary"
    s = spec("opt-1.3b")
    assert s.position_offset == 2 and s.activation == "relu" and s.embed_proj_dim == 0
    s = spec("llama-3.1-8b")
    assert (s.kv_heads, s.head_dim, s.norm, s.gated_mlp, s.dtype) == (8, 128, "rmsnorm", True, "bfloat16")
    s = spec("llama-3.2-1b")
    assert s.tied_embeddings and s.head_dim == 64
    s = spec("qwen2.5-7b")
    assert s.qkv_bias and not s.out_bias and s.sliding_window is None
    s = spec("qwen3-8b")
    assert s.qk_norm and s.head_dim == 128
    s = spec("mistral-7b")
    assert s.sliding_window == 4096 and s.sliding_window_layers is None
    s = spec("qwen1.5-moe-a2.7b")
    assert s.moe.num_experts == 60 and s.moe.top_k == 4 and s.moe.shared_intermediate == 5632 and s.moe.shared_gate
    assert s.moe.expert_intermediate == 1408 and s.moe.sparse_layers is None
    s = spec("gpt-3-175b")
    assert (s.hidden, s.layers, s.heads, s.max_positions, s.vocab) == (12288, 96, 96, 2048, 50257)


def test_nemotron_h_block_counts_and_moe_refusal():
    # Nemotron-Nano-9B-v2's pattern M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M-: 27 M, 4 *, 25 -
    config, meta = _catalog(CATALOG_DIR / "nemotron-nano-9b-v2.json")
    h = spec_from_config(config, meta["name"]).hybrid
    assert (h.mamba_layers, h.attention_layers, h.mlp_layers) == (27, 4, 25)
    assert (h.ssm_inner, h.conv_dim, h.d_state, h.n_groups, h.conv_kernel) == (10240, 12288, 128, 8, 4)
    # the kinds in order (the inference cache before each kind's last block depends on it): M - M - M - M M
    assert h.pattern[:8] == ("mamba", "mlp", "mamba", "mlp", "mamba", "mlp", "mamba", "mamba") and len(h.pattern) == 56
    # the same blocks as a layers_block_type list (legacy names), and NemotronHConfig's defaults for the Mamba fields
    s = spec_from_config(dict(TINY, model_type="nemotron_h", layers_block_type=["mamba", "attention", "mlp"]), "n")
    assert (s.layers, s.hybrid.mamba_layers, s.hybrid.ssm_heads, s.hybrid.ssm_head_dim, s.head_dim) == (3, 1, 128, 64, 128)
    with pytest.raises(ConfigError, match="MoE blocks"):
        spec_from_config(dict(TINY, model_type="nemotron_h", hybrid_override_pattern="ME*"), "n")


def test_t5_small_by_hand():
    # Hand derivation (not the code under test), t5-small (d 512, d_ff 2048, 8 heads x 64, 6 + 6 blocks, vocab 32128,
    # relu): shared embedding (lm_head tied); encoder block 4*512^2 attention + 2*512*2048 MLP + 2 RMSNorm weights,
    # decoder block + cross-attention 4*512^2 + its norm; 32 buckets x 8 heads in each stack's first block; two final
    # norms. 60,506,624 is what transformers' T5ForConditionalGeneration (google-t5/t5-small) reports.
    config, _ = _catalog(CATALOG_DIR / "t5-small.json")
    d, attn, mlp = 512, 4 * 512**2, 2 * 512 * 2048
    encoder = 6 * (attn + mlp + 2 * d) + d
    decoder = 6 * (2 * attn + mlp + 3 * d) + d
    total = 32128 * d + encoder + decoder + 2 * 32 * 8
    counts = count_params(spec_from_config(config, "x"))
    assert counts.total == total == 60_506_624
    assert counts.second_stack == decoder + 32 * 8 + 32 * 8  # the decoder stack and the encoder's relative bias


def test_hand_derivation_llama_3_2_11b_vision_extras():
    # Hand derivation from modeling_mllama.py (not the code under test): embed_tokens has 128256 + 8 rows of 4096;
    # each of the 8 cross-attention layers adds q_norm and k_norm (head_dim 128 each) and two 1-element tanh gates;
    # the tower's tile position table is (8 + 1) rows of 4 x ((560 / 14)^2 + 1) x 1280 values
    config, meta = _catalog(CATALOG_DIR / "llama-3.2-11b-vision.json")
    c = count_params(spec_from_config(config, meta["name"]))
    assert c.embedding == 128264 * 4096 and c.cross_extras == 8 * (2 * 128 + 2)
    assert c.vision > 9 * 4 * 1601 * 1280
