"""ModelSpec: the architecture facts every engine needs, as plain data (no torch).

One ModelSpec describes a transformer (decoder or encoder, dense or MoE). It is built from an HF
config.json by `trainfit.models.hf_config`, never by hand, so that parameter counts match the
transformers model built from the same config exactly (tests/models check this on the meta device).
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class MoESpec:
    """Mixture-of-experts MLP (Mixtral, Qwen-MoE): each token goes to `top_k` of `num_experts`."""

    num_experts: int
    top_k: int
    expert_intermediate: int
    shared_intermediate: int = 0  # Qwen-MoE's always-on shared expert (0: none)
    shared_gate: bool = False  # Qwen-MoE's sigmoid gate on the shared expert (hidden -> 1)
    sparse_layers: int | None = None  # how many layers are MoE (None: all); the rest use `intermediate`
    # DeepSeek: the router is sigmoid-scored with a per-expert e_score_correction_bias buffer (V3) or softmax (V2)
    router_scoring: str = "softmax"  # gpt-oss: "topk_softmax" (softmax over the k top logits, in their dtype)
    norm_topk: bool = False  # the router renormalises its top-k weights (Mixtral always; config norm_topk_prob)
    topk_method: str = "greedy"  # DeepSeek-V2: config topk_method (greedy, group_limited_greedy); V3: noaux_tc
    # group-limited routing (DeepSeek-V2 group_limited_greedy, V3 always): the experts in `route_groups` equal groups,
    # each token's top_k taken among the experts of its best `route_group_topk` groups (0: not limited)
    route_groups: int = 0
    route_group_topk: int = 0
    # DeepSeek-V3's routed_scaling_factor: the routed experts' top-k weights multiplied by it (DeepseekV3MoE.route_tokens
    # _to_experts; configuration_deepseek_v3.py:91, default 2.5); 1.0: none. Numerics only: no memory or time
    routed_scaling: float = 1.0
    # Llama 4 (modeling_llama4.py Llama4TextMoe): every expert runs every token, its input pre-multiplied by the
    # token's router score (0 off the top-k) — one batched bmm over all experts, no dispatch
    experts_every_token: bool = False
    # Llama 4's interleave (interleave_moe_layer_step, configuration_llama4.py): layer i is MoE iff
    # i % layer_step == layer_step - 1 (Maverick: 2, dense layers first); 0: where the MoE layers sit is not recorded
    layer_step: int = 0
    # DeepSeek's first_k_dense_replace (DecoderLayer: MoE iff layer_idx >= it): the dense layers, `sparse_layers`'
    # complement, come first; 0: where they sit is not recorded (or there are none)
    first_dense: int = 0
    # gpt-oss (modeling_gpt_oss.py GptOssTopKRouter, GptOssExperts): the router Linear has a bias (E,) and every
    # expert a gate_up bias (2I,) and a down bias (H,)
    router_bias: bool = False
    expert_bias: bool = False
    # gpt-oss GptOssExperts._apply_gate: the clamped SwiGLU on interleaved gate/up columns, gate clamped above at
    # `swiglu_limit`, up to [-limit, limit], out = (up + 1) * gate * sigmoid(alpha * gate) (0.0: a plain SwiGLU)
    swiglu_limit: float = 0.0
    # the checkpoint stores the experts' matrices in MXFP4 (config quantization_config.quant_method "mxfp4": gpt-oss's
    # published checkpoints; attention, router, embeddings and head stay bf16, modules_to_not_convert): what a serving
    # engine loads (analytic/serving.py expert_weight_bytes); training and HF inference build the bf16 model
    experts_mxfp4: bool = False
    # the router's load-balancing loss coefficient the config gives (DeepSeek's aux_loss_alpha, the others'
    # router_aux_loss_coef); None: not given. Where a stack takes it from the model (stacks/megatron.toml [moe]
    # aux_loss_from_config): whether the loss runs and the coefficient written (analytic/ops/shape.py aux_loss_coeff)
    aux_loss_coeff: float | None = None


@dataclass(frozen=True)
class GatedDeltaNetSpec:
    """Gated DeltaNet linear-attention layers (Qwen3-Next, transformers models/qwen3_next/modeling_qwen3_next.py
    Qwen3NextGatedDeltaNet): in_proj_qkvz + in_proj_ba, a depthwise causal conv1d of `conv_kernel` over q, k, v, the
    gated delta rule with a per-sequence (value_heads, key_head_dim, value_head_dim) recurrent state, a gated
    RMSNorm over value_head_dim and out_proj. `layers` of the model's layers use it in place of attention."""

    layers: int
    key_heads: int  # linear_num_key_heads
    value_heads: int  # linear_num_value_heads
    key_head_dim: int  # linear_key_head_dim
    value_head_dim: int  # linear_value_head_dim
    conv_kernel: int  # linear_conv_kernel_dim
    last: int = -1  # the index of the last linear layer (-1: the model's last layer)

    @property
    def key_dim(self) -> int:
        return self.key_heads * self.key_head_dim

    @property
    def value_dim(self) -> int:
        return self.value_heads * self.value_head_dim

    @property
    def conv_dim(self) -> int:
        """The conv1d's channels: q, k and v (Qwen3NextGatedDeltaNet.conv_dim = key_dim * 2 + value_dim)."""
        return 2 * self.key_dim + self.value_dim

    @property
    def recurrent_state(self) -> int:
        """Values of one sequence's recurrent state (the delta rule's (value_heads, key_head_dim, value_head_dim)
        matrix per head: transformers' Qwen3NextGatedDeltaNet last_recurrent_state; vLLM's
        gated_delta_net_state_shape holds (value_heads, value_head_dim, key_head_dim), the same count)."""
        return self.value_heads * self.key_head_dim * self.value_head_dim


@dataclass(frozen=True)
class MLASpec:
    """Multi-head Latent Attention (DeepSeek-V2 paper, arXiv:2405.04434 §2.1): k and v are rebuilt per head from a
    shared kv_lora_rank latent; the RoPE part of the key (qk_rope_head_dim) is one head shared by all heads."""

    q_lora_rank: int  # query down-projection width (0: V2-Lite, a plain q_proj)
    kv_lora_rank: int  # d_c: the compressed latent that the KV cache keeps
    qk_nope_head_dim: int  # per-head q/k width without positions
    qk_rope_head_dim: int  # d_h^R: decoupled RoPE width (q per head, k shared)
    v_head_dim: int

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


@dataclass(frozen=True)
class HybridSpec:
    """A hybrid stack of single-mixer blocks (Nemotron-H, transformers models/nemotron_h/modeling_nemotron_h.py
    NemotronHBlock: one RMSNorm, then one mixer: a Mamba-2 layer, an attention layer or an MLP layer, then the residual
    add). `ModelSpec.layers` counts all blocks; attention fields of the spec describe the attention blocks, `intermediate`
    and `activation` the MLP blocks."""

    mamba_layers: int
    attention_layers: int
    mlp_layers: int
    # one Mamba-2 mixer (NemotronHMamba2Mixer.__init__, :398-448): ssm_heads heads of ssm_head_dim channels
    # (intermediate = ssm_heads * ssm_head_dim), a state of d_state per head channel, B and C shared across
    # n_groups head groups, a depthwise causal conv of conv_kernel taps over x, B and C
    ssm_heads: int
    ssm_head_dim: int
    d_state: int
    n_groups: int
    conv_kernel: int
    conv_bias: bool = True  # use_conv_bias: the conv1d has a bias
    proj_bias: bool = False  # use_bias: in_proj and out_proj have biases
    chunk_size: int = 128  # the chunked scan's chunk length (torch_forward)
    # the block kinds first to last ("mamba", "attention", "mlp"; NemotronHConfig.layers_block_type): where each
    # kind's last block sits sets the cache the prefill holds at its high point (analytic/hybrid_inference.py)
    pattern: tuple[str, ...] = ()

    @property
    def ssm_inner(self) -> int:
        """The mixer's inner width (NemotronHMamba2Mixer.intermediate_size = mamba_num_heads * mamba_head_dim)."""
        return self.ssm_heads * self.ssm_head_dim

    @property
    def conv_dim(self) -> int:
        """The channels the conv runs over: x, B and C (NemotronHMamba2Mixer.conv_dim, :417)."""
        return self.ssm_inner + 2 * self.n_groups * self.d_state

    @property
    def ssm_state(self) -> int:
        """Values of one sequence's SSM state: (ssm_heads, ssm_head_dim, d_state) (mamba2_chunk_scan's final state,
        modeling_nemotron_h.py:592-603; vLLM's mamba2_state_shape temporal state)."""
        return self.ssm_heads * self.ssm_head_dim * self.d_state


@dataclass(frozen=True)
class VisionTowerSpec:
    """The image encoder of a vision-language model, beside its language model's ModelSpec (transformers
    models/qwen2_5_vl/modeling_qwen2_5_vl.py Qwen2_5_VisionTransformerPretrainedModel, :386-489): a Conv3d patch
    embedding (kernel = stride = temporal_patch x patch x patch), `depth` pre-RMSNorm blocks (attention over the
    image's patches with a bias-ful qkv and proj, windowed except at `full_attention_blocks`; a gated MLP with biases)
    and the merger (RMSNorm, then merge x merge neighbouring patches concatenated, Linear, GELU, Linear to the language
    model's width). One image is a (image / patch)^2 patch sequence for the tower and (image / (patch * merge))^2
    tokens in the language model's sequence, in place of as many image placeholder tokens.

    Why a spec of its own: the tower's activations are set by the image size, not by --seq, and its widths are its
    own (vision_config); the language model keeps its ModelSpec, so every formula about the text stack reads the
    same fields as for a text-only model."""

    family: str  # the VLM's model_type (qwen2_5_vl, qwen3_vl, gemma3)
    depth: int
    hidden: int
    heads: int
    intermediate: int
    out_hidden: int  # the merger's output width (the language model's hidden size)
    patch: int
    temporal_patch: int  # a still image is repeated temporal_patch times (one temporal patch)
    merge: int  # spatial_merge_size: merge x merge patches become one language-model token
    window: int  # window_size in pixels (window attention over window / patch patches a side; 0: none)
    full_attention_blocks: tuple[int, ...]  # fullatt_block_indexes: blocks attending over the whole image
    in_channels: int = 3
    image_token_id: int = 0  # the placeholder id the image's tokens take in input_ids
    image_size: int = 448  # pixels per side when --image-size is not given
    # Qwen3-VL (modeling_qwen3_vl.py Qwen3VLVisionModel, :625-725): LayerNorms (weight + bias) for RMSNorms, a plain
    # GELU MLP (linear_fc1, linear_fc2, biases) for the gated one, a biased patch Conv3d, a learned position table
    # of `position_embeddings` rows resampled bilinearly to each image's grid, no windows (window 0: every block
    # attends over the whole image), and a merger after each of `deepstack_blocks` whose output is added to the
    # image tokens' hidden states at the first language-model layers
    norm: str = "rmsnorm"
    gated_mlp: bool = True
    patch_bias: bool = False
    position_embeddings: int = 0
    deepstack_blocks: tuple[int, ...] = ()
    # Gemma 3 (modeling_gemma3.py Gemma3MultiModalProjector :635-668, models/siglip SiglipVisionTransformer): a SigLIP
    # tower at one fixed image size (its position table has a row per patch: other sizes are refused), a final
    # LayerNorm, and a projector instead of a merger: merge x merge average pooling, an RMSNorm (weight only) and
    # a bias-free (hidden, out_hidden) projection
    fixed_size: bool = False
    projector: str = "merger"  # "merger" (Qwen), "pool" (Gemma 3) or "cross" (Mllama)
    # Mllama (models/mllama/modeling_mllama.py MllamaVisionModel, MllamaTextModel; models/mllama.py): each image is
    # `max_tiles` tiles of image_size pixels (the processor pads every image to max_tiles), a class token per tile,
    # `depth` local LayerNorm/GELU layers then `global_layers` tanh-gated ones over all of an image's tiles, the
    # outputs of `intermediate_layers` concatenated to the last (the multi_modal_projector maps the concatenation to
    # the language model's width); the language model reads the image tokens only through the cross-attention
    # layers at `cross_layers` (K/V projected from them), one <|image|> token per image in its sequence.
    global_layers: int = 0
    max_tiles: int = 0
    intermediate_layers: tuple[int, ...] = ()
    aspect_ratios: tuple[tuple[int, int], ...] = ()  # supported_aspect_ratios (tile rows, tile columns)
    cross_layers: tuple[int, ...] = ()

    @property
    def full_blocks(self) -> int:
        """The blocks attending over the whole image: those of `full_attention_blocks` below `depth` (each once), every
        block without windows. Counted from the index list, not by testing each block (a depth of 10**9)."""
        if not self.window:
            return self.depth
        return sum(1 for j in set(self.full_attention_blocks) if 0 <= j < self.depth)

    @property
    def tile(self) -> int:
        """The pixels one language-model token covers per side (patch x merge; the processor resizes to its
        multiples: Qwen2VLImageProcessor smart_resize, factor patch_size * merge_size)."""
        return self.patch * self.merge

    @property
    def patch_values(self) -> int:
        """Values in one patch: in_channels x temporal_patch x patch^2 (a row of the processor's flattened
        pixel_values; the patch embedding's contraction). Gemma 3's SigLIP Conv2d: temporal_patch 1."""
        return self.in_channels * self.temporal_patch * self.patch ** 2

    def patches(self, image_size: int) -> int:
        """The tower's sequence for one square image: (image / patch)^2 patches (grid_t = 1 for a still image);
        Mllama: max_tiles tiles of (tile / patch)^2 patches + a class token, whatever the image's size (the processor
        pads to max_tiles tiles)."""
        if self.max_tiles:
            return self.max_tiles * self.tile_tokens
        return (image_size // self.patch) ** 2

    def tokens(self, image_size: int) -> int:
        """The image's tokens in the language model's sequence: (image / (patch * merge))^2; Mllama: its one
        <|image|> token (the vision tokens enter through cross-attention)."""
        if self.max_tiles:
            return 1
        return (image_size // self.tile) ** 2

    @property
    def tile_tokens(self) -> int:
        """Mllama: one tile's tokens, (image_size / patch)^2 patches + the class token (MllamaVisionModel.num_patches,
        modeling_mllama.py:834)."""
        return (self.image_size // self.patch) ** 2 + 1


@dataclass(frozen=True)
class EncoderDecoderSpec:
    """The facts an encoder-decoder model (T5 / Flan-T5, transformers models/t5/modeling_t5.py; BART,
    models/bart/modeling_bart.py) adds to a ModelSpec.

    Why beside ModelSpec rather than a second ModelSpec: T5's two stacks share every width (T5Config d_model, d_kv,
    num_heads, d_ff, feed_forward_proj, the vocabulary and the shared embedding, configuration_t5.py:43-55), so the
    ModelSpec fields describe both stacks' layers and `ModelSpec.layers` counts the ENCODER's blocks; what differs is
    only the decoder's depth, its cross-attention and the relative position bias, held here (BART: also the decoder's
    own heads and MLP width, when its config gives others). Analytic modules read
    these fields, never the raw config."""

    decoder_layers: int  # num_decoder_layers (T5Config.__post_init__: num_layers when absent)
    # T5Attention.relative_attention_bias = Embedding(num_buckets, n_heads) in the FIRST block of each stack only
    # (T5Stack.__init__: has_relative_attention_bias=bool(i == 0)); its bias is shared by the later blocks. 0: none
    # (BART: learned absolute positions, a table per stack: ModelSpec.positions "learned")
    relative_buckets: int = 32
    relative_max_distance: int = 128
    # T5 v1.0 multiplies the decoder output by d_model**-0.5 before lm_head; v1.1 / Flan-T5 (tie_word_embeddings:
    # false in their config.json) do not (configuration_t5.py:81, modeling_t5.py:1047-1048)
    scale_decoder_outputs: bool = True
    # BART's decoder may have its own heads and MLP width (decoder_attention_heads, decoder_ffn_dim; BartDecoderLayer
    # :311-341); 0: the encoder's (ModelSpec.heads, ModelSpec.intermediate). T5's stacks always share them.
    decoder_heads: int = 0
    decoder_intermediate: int = 0
    # Whisper (models/whisper/modeling_whisper.py): an audio encoder (WhisperEncoder :544-580: conv1 num_mel_bins ->
    # d_model and conv2 d_model -> d_model, kernel 3, the second of stride 2, over 2 x max_source_positions mel
    # frames; ModelSpec.max_positions = max_source_positions), its decoder's own learned table of
    # max_target_positions rows, k_proj without a bias (WhisperAttention :281), and no `shared` table: the decoder's
    # embed_tokens is the only one (tied to proj_out). 0 / True / True: a token encoder (T5, BART).
    mel_bins: int = 0
    decoder_positions: int = 0
    k_bias: bool = True
    shared_embedding: bool = True
    # BART's and Whisper's dropout on the MLP's activation (activation_dropout, configuration_bart.py:62,
    # configuration_whisper.py:143; BartEncoderLayer.forward :299); T5 has none (its dropout_rate: ModelSpec.dropouts)
    activation_dropout: float = 0.0

    def mel_frames(self, positions: int) -> int:
        """The log-mel frames an audio encoder reads for `positions` encoder positions (what --seq counts for
        Whisper): conv2's stride 2 halves the frames (modeling_whisper.py WhisperEncoder :571-572, forward :611: the
        input must hold max_source_positions x conv1.stride x conv2.stride frames). 0 for a token encoder."""
        return 2 * positions if self.mel_bins else 0


@dataclass(frozen=True)
class ModelSpec:
    name: str
    family: str  # HF model_type: llama, gpt2, bert, mixtral, ...
    causal: bool  # decoder (causal attention) vs encoder (bidirectional)
    hidden: int
    layers: int
    heads: int
    kv_heads: int  # == heads for MHA, 1 for MQA, in between for GQA
    head_dim: int  # explicit in some configs (Gemma: 256 with hidden 3072 / 16 heads)
    intermediate: int  # dense MLP width
    vocab: int
    max_positions: int
    gated_mlp: bool  # SwiGLU/GeGLU: gate, up, down (3 matrices) vs up, down (2)
    activation: str = "gelu"
    norm: str = "layernorm"  # "layernorm" (weight + bias) or "rmsnorm" (weight only)
    positions: str = "rotary"  # "rotary", "learned", or "none"
    tied_embeddings: bool = False  # the LM head reuses the word embeddings (never for classifier heads)
    parallel_residual: bool = False  # GPT-NeoX / Phi-2 style: attn and MLP read the same input
    qkv_bias: bool = False
    out_bias: bool = False  # attention output projection bias
    mlp_bias: bool = False
    norm_bias: bool = True  # LayerNorm has a bias; RMSNorm never does
    norms_per_layer: int = 2  # Gemma-2: 4 (pre/post attention, pre/post feed-forward)
    qk_norm: bool = False  # Qwen3: RMSNorm over head_dim on q and k
    final_norm: bool = True
    embedding_norm: bool = False  # BERT: LayerNorm after the embeddings
    type_vocab: int = 0  # BERT token-type embeddings
    position_offset: int = 0  # OPT's learned positions have 2 extra rows
    lm_head_bias: bool = False  # BERT's MLM decoder bias
    mlm_transform: bool = False  # BERT's MLM head: dense + activation + LayerNorm before the decoder
    embed_proj_dim: int = 0  # OPT-350m: word embeddings in a smaller dim with project_in/out (0: none)
    sliding_window: int | None = None  # Mistral/Gemma-2 local attention window (affects KV cache bound)
    sliding_window_layers: int | None = None  # how many layers use the window (None: all); Gemma-2: every other
    sliding_lead: int = 0  # sliding (or chunked) layers before the first full-attention one (Gemma 2, gpt-oss: 1;
    # Gemma 3: 5; Llama 4: 3)
    # Llama 4 (modeling_llama4.py, configuration_llama4.py __post_init__): the "chunked_attention" layers attend
    # within fixed chunks of `attention_chunk` tokens (a local window that restarts at every chunk boundary)
    attention_chunk: int | None = None
    chunked_layers: int = 0  # how many layers are chunked (the RoPE layers)
    nope_layers: int = 0  # layers without rotary positions (no_rope_layers zeros; full attention)
    qk_l2_norm_layers: int = 0  # layers whose q and k pass Llama4TextL2Norm (no weight; use_qk_norm on RoPE layers)
    # where the NoPE layers sit: layer i has no RoPE iff (i + 1) % nope_every == 0 (Llama 4's no_rope_layer_interval
    # pattern); 0: not recorded (or no NoPE layer)
    nope_every: int = 0
    # gpt-oss (modeling_gpt_oss.py GptOssAttention.sinks, eager_attention_forward): a learned logit per head, one
    # more score column softmaxed with the row and then dropped; a (heads,) parameter per layer
    attn_sinks: bool = False
    # Qwen3-Next (modeling_qwen3_next.py Qwen3NextAttention): q_proj emits q and a same-width output gate, the
    # attention output multiplied by sigmoid(gate) before o_proj
    attn_output_gate: bool = False
    # Qwen3-Next's Gated DeltaNet layers (None: every layer is softmax attention)
    linear_attn: GatedDeltaNetSpec | None = None
    attn_temperature: bool = False  # NoPE layers scale q by log1p(floor((pos+1)/floor_scale))*attn_scale+1
    norm_affine: bool = True  # False: norms have no weight/bias (OPT layer_norm_elementwise_affine=False)
    dtype: str = ""  # the checkpoint's dtype from config.json (torch_dtype/dtype), "" when not given
    moe: MoESpec | None = None
    # encoder-decoder models (T5): `layers` is the encoder's depth, the decoder's and the cross-attention are here
    encdec: EncoderDecoderSpec | None = None
    hybrid: HybridSpec | None = None  # Nemotron-H: Mamba-2, attention and MLP blocks (None: every layer attention+MLP)
    # MLA attention (DeepSeek); head_dim is then the q/k head width (nope + rope) and kv_heads == heads
    mla: MLASpec | None = None
    # the task head the model is built with (trainfit.heads): causal-lm, masked-lm, seq-cls, token-cls; "" = the
    # family's LM head (hand-built specs). hf_config reads it from the config's `architectures`; hf_config.with_head
    # changes it.
    head: str = ""
    num_labels: int = 2  # classifier heads' outputs (config num_labels / id2label; transformers' default 2)
    # Kernel facts from the config, resolved once by hf_config with transformers' defaults (the defaults here are
    # those of a config that does not set them). The analytic formulas read these, never `config`, so the spec's
    # equality and hash (a cache key: compute_time.cached_stage_compute) cover every config value they use.
    dropouts: tuple[float, float, float] = (0.0, 0.0, 0.0)  # (embedding, attention probabilities, residual) p
    attn_softcap: float = 0.0  # Gemma-2 attn_logit_softcapping: tanh caps the attention scores (0: none)
    final_softcap: float = 0.0  # Gemma-2 final_logit_softcapping: tanh caps the logits (0: none)
    rotary_fraction: float = 1.0  # share of head_dim that rotary rotates (partial_rotary_factor, GPT-NeoX rotary_pct)
    rope_attention_factor: float = 1.0  # YaRN's concentration factor on cos and sin (hf_config.yarn_attention_factor)
    mtp_layers: int = 0  # DeepSeek-V3 multi-token-prediction modules (num_nextn_predict_layers)
    classifier_dropout: float = 0.1  # the seq-cls / token-cls head's dropout p
    token_cls_bias: bool = True  # the token-cls head's output layer has a bias (token_classification_bias)
    architectures: tuple[str, ...] = ()  # the config's `architectures` (the classes its checkpoint was saved from)
    # a vision-language model's image encoder (None: a text model); the other fields describe its language model
    vision: VisionTowerSpec | None = None
    draft_vocab: int = 0  # an EAGLE-3 draft's own head rows (draft_vocab_size; 0: the vocabulary)
    # the checkpoint's own weight format, where its config's quantization_config names one a serving engine loads
    # as stored and trainfit models (vocab.SERVE_QUANTS: awq, gptq, fp8); None: 16-bit (or a format not modelled)
    checkpoint_quant: str | None = None
    source: str = ""  # where the config came from (catalog file, path, hub id)
    # the raw HF config, for the engines that build the transformers model from it (trace, measure); not compared
    config: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def task_head(self) -> str:
        """The head, with the family's LM head for a hand-built spec that names none."""
        return self.head or ("causal-lm" if self.causal else "masked-lm")

    @property
    def is_moe(self) -> bool:
        return self.moe is not None

    @property
    def moe_layers(self) -> int:
        """How many layers run the sparse MoE block (MoESpec.sparse_layers; None there: all of them); 0 if dense."""
        if self.moe is None:
            return 0
        return self.layers if self.moe.sparse_layers is None else self.moe.sparse_layers

    @property
    def moe_share(self) -> float:
        """The share of the layers that run the sparse MoE block (moe_layers / layers; ParamCounts.moe_layers is
        the same count); 0.0 if dense."""
        return self.moe_layers / self.layers if self.moe is not None else 0.0

    @property
    def sliding_layers(self) -> int:
        """How many layers attend over a sliding window (sliding_window_layers; None there: all of them); 0 without
        a window."""
        if not self.sliding_window:
            return 0
        return self.layers if self.sliding_window_layers is None else self.sliding_window_layers

    def position_limit(self, mode: str) -> int:
        """The longest --seq within max_position_embeddings (0: none given). A causal model's decode step writes
        position `seq` (HF generate), so inference needs one position more (not an encoder-decoder's: --seq is its
        encoder's, which never decodes)."""
        return max(self.max_positions - (1 if mode == "infer" and self.causal and self.encdec is None else 0), 0)

    def longest_sequence(self, mode: str) -> int | None:
        """The longest --seq the model's learned position table allows (None: no table, e.g. rotary, which runs
        past max_position_embeddings, extrapolating)."""
        return self.position_limit(mode) if self.positions == "learned" else None


@dataclass(frozen=True)
class VisionSpec:
    """An image classifier (trainfit.models.vision builds it from an HF config.json): a CNN (ResNet, ConvNeXt) or a
    ViT. ModelSpec describes token models (vocabulary, sequence, attention heads); an image model's activations
    are set by the image size and its stages' widths, so it has its own spec. Plain data (no torch)."""

    name: str
    family: str  # HF model_type: resnet, convnext, vit
    image_size: int  # the config's (pixels per side); --image-size overrides it per run
    channels: int  # input channels (num_channels, 3)
    num_labels: int  # classifier outputs (num_labels / id2label; ImageNet 1000)
    widths: tuple[int, ...]  # resnet/convnext: hidden_sizes per stage; vit: (hidden_size,)
    depths: tuple[int, ...]  # layers per stage (vit: (num_hidden_layers,))
    stem: int = 0  # resnet: embedding_size (the 7x7 stem's channels); convnext/vit: 0
    patch: int = 0  # convnext: the patchify stem's kernel = stride; vit: patch_size
    layer_type: str = ""  # resnet: basic or bottleneck
    downsample_in_first_stage: bool = False  # resnet
    downsample_in_bottleneck: bool = False  # resnet: stride on the first 1x1 (v1) instead of the 3x3 (v1.5)
    layer_scale: bool = True  # convnext: layer_scale_init_value > 0 adds a per-channel gamma
    heads: int = 0  # vit
    intermediate: int = 0  # vit MLP width
    qkv_bias: bool = True  # vit
    activation: str = "relu"
    source: str = ""
    config: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def is_cnn(self) -> bool:
        return self.family in ("resnet", "convnext")

    def tokens(self, image_size: int) -> int:
        """ViT's sequence: (image / patch)^2 patches + the [CLS] token (modeling_vit.py ViTEmbeddings)."""
        return (image_size // self.patch) ** 2 + 1 if self.family == "vit" else 0
