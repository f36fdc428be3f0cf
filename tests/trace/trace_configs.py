"""Tiny HF configs (2 layers, hidden 64, vocab 1000) of several families, for real-vs-trace checks."""
from trainfit.models.hf_config import spec_from_config

_COMMON = {"vocab_size": 1000, "max_position_embeddings": 128}

CONFIGS = {
    "gpt2": {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 1000, "n_positions": 128},
    "llama": {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "intermediate_size": 128, **_COMMON},
    "qwen2": {"model_type": "qwen2", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "intermediate_size": 128, **_COMMON},
    "gpt_neox": {"model_type": "gpt_neox", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                 "intermediate_size": 256, "rotary_pct": 0.25, **_COMMON},
    "phi3": {"model_type": "phi3", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 4, "intermediate_size": 128, "pad_token_id": 0,
             "original_max_position_embeddings": 128, **_COMMON},
    "gemma2": {"model_type": "gemma2", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
               "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128, "sliding_window": 16, **_COMMON},
    # Gemma 3: a local layer (window 16, shorter than the test sequences) and a global one; q/k norms, 4 norms
    "gemma3_text": {"model_type": "gemma3_text", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                    "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128, "sliding_window": 16,
                    "layer_types": ["sliding_attention", "full_attention"], **_COMMON},
    # MoE: transformers' grouped_mm experts (static shapes; see trainfit/trace/fake_overrides.py)
    "mixtral": {"model_type": "mixtral", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "intermediate_size": 128, "num_local_experts": 4, "num_experts_per_tok": 2,
                **_COMMON},
    "qwen2_moe": {"model_type": "qwen2_moe", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                  "num_key_value_heads": 2, "intermediate_size": 128, "num_experts": 4, "num_experts_per_tok": 2,
                  "moe_intermediate_size": 32, "shared_expert_intermediate_size": 64, **_COMMON},
    # relu2 MLP, LayerNorm1P, partial rotary (NemotronConfig's default partial_rotary_factor 0.5)
    "nemotron": {"model_type": "nemotron", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                 "num_key_value_heads": 2, "intermediate_size": 128, **_COMMON},
    # Llama 4: dense/MoE and RoPE-chunked/NoPE layers alternating, L2 q/k norm, all-experts bmm MoE with a shared
    # expert; a 16-token chunk and floor_scale 8 so that chunking and the temperature scaling act at these lengths
    "llama4_text": {"model_type": "llama4_text", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                    "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 64, "intermediate_size_mlp": 128,
                    "num_local_experts": 4, "num_experts_per_tok": 1, "interleave_moe_layer_step": 2,
                    "no_rope_layer_interval": 2, "attention_chunk_size": 16, "floor_scale": 8, **_COMMON},
    # gpt-oss: sliding (16-token window, acting at these lengths) and full layers, attention sinks in eager attention,
    # q/k/v/o, router and expert biases, the clamped SwiGLU experts; GptOssConfig's default YaRN rope scaling
    "gpt_oss": {"model_type": "gpt_oss", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 64, "num_local_experts": 4,
                "num_experts_per_tok": 2, "sliding_window": 16, **_COMMON},
    # Nemotron-H: Mamba-2 (the torch chunked scan: no mamba-ssm / causal-conv1d kernels on CPU; 16-token chunks so
    # that the test lengths span several), attention without positions, a relu2 MLP; one norm per block
    "nemotron_h": {"model_type": "nemotron_h", "hidden_size": 64, "hybrid_override_pattern": "M*-M",
                   "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128,
                   "mamba_num_heads": 8, "mamba_head_dim": 16, "ssm_state_size": 16, "n_groups": 2,
                   "chunk_size": 16, **_COMMON},
    # Qwen3-Next: a Gated DeltaNet layer (transformers' torch fallbacks of the conv1d and the chunked delta rule,
    # without flash-linear-attention / causal-conv1d) and a gated full-attention layer, Qwen-MoE with a shared expert
    "qwen3_next": {"model_type": "qwen3_next", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                   "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128, "linear_num_key_heads": 2,
                   "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 8,
                   "full_attention_interval": 2, "num_experts": 4, "num_experts_per_tok": 2,
                   "moe_intermediate_size": 32, "shared_expert_intermediate_size": 48, **_COMMON},
    # Qwen2.5-VL: the vision tower (2 blocks: a windowed one and a full-attention one; a 56-pixel window, 2x2 merged
    # tokens, so that a 112-pixel image spans 4 windows) and a Qwen2 language model; placeholder ids inside the
    # vocabulary
    "qwen2_5_vl": {"model_type": "qwen2_5_vl", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                   "num_key_value_heads": 2, "intermediate_size": 128, "image_token_id": 999, "video_token_id": 998,
                   "vision_start_token_id": 997, "vision_end_token_id": 996, "bos_token_id": 1, "eos_token_id": 2,
                   "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},
                   "vision_config": {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
                                     "out_hidden_size": 64, "patch_size": 14, "spatial_merge_size": 2,
                                     "temporal_patch_size": 2, "window_size": 56, "fullatt_block_indexes": [1]},
                   **_COMMON},
    # Qwen3-VL: a 3-block tower (LayerNorms, a GELU MLP, an 8 x 8 learned position table resampled to the image's
    # grid, deepstack mergers after blocks 0 and 1 added to the image tokens of the first two language-model layers)
    # and a Qwen3 language model nested in text_config
    "qwen3_vl": {"model_type": "qwen3_vl", "image_token_id": 999, "video_token_id": 998, "vision_start_token_id": 997,
                 "vision_end_token_id": 996,
                 "text_config": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                                 "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128,
                                 "bos_token_id": 1, "eos_token_id": 2,
                                 "rope_scaling": {"rope_type": "default", "mrope_section": [2, 3, 3],
                                                  "mrope_interleaved": True}, **_COMMON},
                 "vision_config": {"depth": 3, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
                                   "out_hidden_size": 64, "patch_size": 16, "spatial_merge_size": 2,
                                   "temporal_patch_size": 2, "num_position_embeddings": 64,
                                   "deepstack_visual_indexes": [0, 1]}},
    # Gemma 3 with images: a 2-layer SigLIP tower at 56 px (4 x 4 patches of 14 px pooled 2 x 2 into 4 tokens an
    # image) and a gemma3_text language model (a sliding and a full layer)
    "gemma3": {"model_type": "gemma3", "image_token_index": 999, "boi_token_index": 997, "eoi_token_index": 996,
               "mm_tokens_per_image": 4,
               "text_config": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                               "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128, "sliding_window": 16,
                               "layer_types": ["sliding_attention", "full_attention"], "bos_token_id": 2,
                               "eos_token_id": 1, "pad_token_id": 0, **_COMMON},
               "vision_config": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                                 "num_attention_heads": 2, "image_size": 56, "patch_size": 14,
                                 "vision_use_head": False}},
    # T5 v1.1 / Flan-T5 (encoder-decoder): 2 encoder and 3 decoder blocks, gated-gelu, the relative position bias
    # (8 buckets, max distance 16: both the exact and the logarithmic buckets act at these lengths), untied config
    # (no decoder-output scaling)
    "t5": {"model_type": "t5", "d_model": 64, "d_kv": 16, "num_heads": 4, "num_layers": 2, "num_decoder_layers": 3,
           "d_ff": 128, "feed_forward_proj": "gated-gelu", "relative_attention_num_buckets": 8,
           "relative_attention_max_distance": 16, "tie_word_embeddings": False, "decoder_start_token_id": 0,
           "vocab_size": 1000},
    # mT5: MT5ForConditionalGeneration (T5 v1.1 with MT5Config's defaults; no decoder-output scaling)
    "mt5": {"model_type": "mt5", "d_model": 64, "d_kv": 16, "num_heads": 4, "num_layers": 2, "num_decoder_layers": 2,
            "d_ff": 128, "relative_attention_num_buckets": 8, "relative_attention_max_distance": 16,
            "vocab_size": 1000},
    # BART (encoder-decoder, post-norm, learned positions per stack, biases everywhere): 2 encoder and 3 decoder
    # blocks, attention and residual dropout
    "bart": {"model_type": "bart", "d_model": 64, "encoder_layers": 2, "decoder_layers": 3,
             "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 128,
             "decoder_ffn_dim": 128, "attention_dropout": 0.1, **_COMMON},
    # Whisper (audio encoder-decoder): 16 mel bins, 64 encoder positions (128 frames; the tests' --seq is 64), a
    # 32-position decoder, k_proj without a bias; 2 + 2 blocks
    "whisper": {"model_type": "whisper", "d_model": 64, "encoder_layers": 2, "decoder_layers": 2,
                "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 128,
                "decoder_ffn_dim": 128, "vocab_size": 1000, "num_mel_bins": 16, "max_source_positions": 64,
                "max_target_positions": 32, "pad_token_id": 1, "bos_token_id": 1, "eos_token_id": 1,
                "decoder_start_token_id": 2},
    # Llama 3.2 Vision: a self-attention and a cross-attention layer; a tower of 2 local + 1 global layers over
    # 56-pixel tiles (4 x 4 patches + the class token, padded to 24), its layer 0's output concatenated to the last
    "mllama": {"model_type": "mllama", "image_token_index": 1000,
               "text_config": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                               "num_key_value_heads": 2, "intermediate_size": 128, "cross_attention_layers": [1],
                               "vocab_size": 1000, "max_position_embeddings": 128, "pad_token_id": 0},
               "vision_config": {"hidden_size": 32, "num_hidden_layers": 2, "num_global_layers": 1,
                                 "attention_heads": 2, "intermediate_size": 64, "image_size": 56, "patch_size": 14,
                                 "intermediate_layers_indices": [0], "vision_output_dim": 64}},
    "bert": {"model_type": "bert", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
             "intermediate_size": 128, "type_vocab_size": 2, **_COMMON},
}


def tiny_spec(family: str, layers: int = 2):
    cfg = dict(CONFIGS[family])
    key = "n_layer" if family == "gpt2" else "num_hidden_layers"
    if "text_config" in cfg:  # a nested language model (Qwen3-VL)
        cfg["text_config"] = {**cfg["text_config"], "num_hidden_layers": layers}
    elif "hybrid_override_pattern" not in cfg and "num_decoder_layers" not in cfg and "decoder_layers" not in cfg:
        # (a hybrid stack's pattern, an encoder-decoder's own two depths set its layers)
        cfg[key] = layers
    return spec_from_config(cfg, name=f"tiny-{family}")


# the decoder (target) length of the encoder-decoder families' cases (shorter than the encoder's --seq)
TARGET_SEQ = {"t5": 16, "mt5": 16, "bart": 16, "whisper": 16}
