"""Exact parameter counts from a ModelSpec (pure arithmetic; no torch).

`count_params(spec).total` equals `sum(p.numel() for p in model.parameters())` of the transformers
class of the spec's task head (`*ForCausalLM`, `*ForMaskedLM`, `*ForSequenceClassification`,
`*ForTokenClassification`; trainfit.heads) built from the same config.json; tied weights are
counted once, as `parameters()` does. tests/models/test_params_exact.py checks every catalog model
against the model built on the meta device, tests/analytic/test_heads.py every head.
"""
from __future__ import annotations

from dataclasses import dataclass

from trainfit.heads import CLASSIFIERS, layout
from trainfit.models.mllama import cross_layer_extras, extra_embedding_rows
from trainfit.models.vlm import tower_params
from trainfit.spec import ModelSpec


@dataclass(frozen=True)
class ParamCounts:
    embedding: int  # token + position + token-type embeddings, embedding norm, OPT project_in/out
    attention: int  # one layer's attention (q,k,v,o + biases + qk norms)
    mlp: int  # one DENSE layer's MLP
    moe_mlp: int  # one MoE layer's MLP: all experts + router + shared expert (+gate); 0 if dense
    norms: int  # one layer's norms
    dense_layers: int  # how many layers use `mlp`
    moe_layers: int  # how many layers use `moe_mlp`
    final: int  # final norm + MLM transform (classifiers: + BERT's pooler / RoBERTa's classification dense)
    lm_head: int  # the output layer: LM head, 0 when tied (+ decoder bias for BERT); classifiers: classifier/score
    total: int  # == sum of numel() of the transformers *ForCausalLM / *ForMaskedLM model
    active: int  # params touched per token (MoE: top_k experts + shared + router); == total for dense
    expert: int = 0  # params of one routed expert
    mamba: int = 0  # one Mamba-2 mixer of a hybrid stack (spec.hybrid); 0 otherwise
    linear_attention: int = 0  # one Gated DeltaNet layer's token mixer (Qwen3-Next), in place of `attention`
    linear_layers: int = 0  # how many layers use `linear_attention`
    vision: int = 0  # a vision-language model's image encoder (spec.vision: models/vlm.py tower_params), in `total`
    # layer parameters outside the uniform per-layer counts: Mllama's cross-attention q/k norms and gates, in `total`
    cross_extras: int = 0
    cross_attention: int = 0  # one decoder layer's cross-attention + its norm (encoder-decoder models); 0 otherwise
    decoder_layers: int = 0  # encoder-decoder models: the decoder's blocks (`dense_layers` are the encoder's)
    # encoder-decoder models: the decoder stack whole (its blocks, final norm, position table / relative bias, own
    # embedding table when untied) and the encoder's relative bias: what the per-layer fields (the encoder's blocks),
    # `embedding`, `final` (the encoder's final norm) and `lm_head` leave out; 0 otherwise
    second_stack: int = 0

    @property
    def per_layer_dense(self) -> int:
        """Attention + dense MLP + norms of one dense layer."""
        return self.attention + self.mlp + self.norms

    @property
    def per_layer_moe(self) -> int:
        """Attention + MoE MLP (all experts) + norms of one MoE layer."""
        return self.attention + self.moe_mlp + self.norms

    @property
    def non_embedding(self) -> int:
        """Total minus the embedding tables (the usual 'non-embedding parameters'; lm_head excluded)."""
        return self.total - self.embedding - self.lm_head


def norm_params(spec: ModelSpec, dim: int) -> int:
    """One norm over `dim` features: LayerNorm weight + bias, RMSNorm weight only (torch.nn.LayerNorm,
    HF *RMSNorm); none when not elementwise-affine (OPT layer_norm_elementwise_affine=False)."""
    if not spec.norm_affine:
        return 0
    return dim * (2 if spec.norm == "layernorm" and spec.norm_bias else 1)


def linear(n_in: int, n_out: int, bias: bool) -> int:
    """torch.nn.Linear / HF Conv1D: weight n_in*n_out (+ bias n_out)."""
    return n_in * n_out + (n_out if bias else 0)


def mlp_params(hidden: int, inner: int, gated: bool, bias: bool) -> int:
    """Gated (SwiGLU/GeGLU, HF modeling_llama: gate_proj, up_proj, down_proj; Phi-3 fuses gate_up_proj)
    or plain (GPT-2 c_fc/c_proj, NeoX dense_h_to_4h/dense_4h_to_h, OPT fc1/fc2, BERT intermediate/output)."""
    n_up = 2 if gated else 1
    return n_up * linear(hidden, inner, bias) + linear(inner, hidden, bias)


def mla_params(spec: ModelSpec) -> int:
    """One MLA attention (HF modeling_deepseek_v3.py DeepseekV3Attention.__init__, same in deepseek_v2):
    q_a_proj (h -> q_lora, bias=attention_bias) + q_a_layernorm + q_b_proj (q_lora -> heads*(nope+rope)), or q_proj
    (h -> heads*(nope+rope)) when q_lora_rank is null; kv_a_proj_with_mqa (h -> kv_lora + rope, bias=attention_bias)
    + kv_a_layernorm (kv_lora) + kv_b_proj (kv_lora -> heads*(nope+v)); o_proj (heads*v -> h, bias=attention_bias).
    Norms are RMSNorm (weight only)."""
    m, h, n = spec.mla, spec.hidden, spec.heads
    bias = spec.qkv_bias
    if m.q_lora_rank:
        q = linear(h, m.q_lora_rank, bias) + m.q_lora_rank + linear(m.q_lora_rank, n * m.qk_head_dim, False)
    else:
        q = linear(h, n * m.qk_head_dim, False)
    kv = (linear(h, m.kv_lora_rank + m.qk_rope_head_dim, bias) + m.kv_lora_rank
          + linear(m.kv_lora_rank, n * (m.qk_nope_head_dim + m.v_head_dim), False))
    return q + kv + linear(n * m.v_head_dim, h, spec.out_bias)


def gated_deltanet_params(spec: ModelSpec) -> int:
    """One Gated DeltaNet layer's token mixer (transformers models/qwen3_next/modeling_qwen3_next.py
    Qwen3NextGatedDeltaNet.__init__, lines 583-627): in_proj_qkvz (h -> 2 key_dim + 2 value_dim) and in_proj_ba
    (h -> 2 value_heads), no biases; the depthwise conv1d (conv_dim channels, kernel conv_kernel, groups=conv_dim,
    bias=False: conv_dim * conv_kernel); dt_bias and A_log (value_heads each); the gated RMSNorm over value_head_dim
    (Qwen3NextRMSNormGated.weight); out_proj (value_dim -> h, no bias)."""
    g, h = spec.linear_attn, spec.hidden
    projections = linear(h, 2 * g.key_dim + 2 * g.value_dim, False) + linear(h, 2 * g.value_heads, False)
    return (projections + g.conv_dim * g.conv_kernel + 2 * g.value_heads + g.value_head_dim
            + linear(g.value_dim, h, False))


def mtp_params(spec: ModelSpec, layers: int | None = None) -> int:
    """Unique parameters of DeepSeek-V3's multi-token-prediction modules (config num_nextn_predict_layers), which
    transformers does not build and `count_params` leaves out. Per module (DeepSeek-V3 paper arXiv:2412.19437
    §2.2 eq. 21, and the checkpoint's model.layers.61.*: enorm, hnorm, eh_proj, shared_head.norm + one MoE decoder
    layer): two RMSNorms over h, M_k = eh_proj (2h -> h, no bias), a full MoE layer and the shared head's final
    RMSNorm. The embedding and output head are shared with the main model (the checkpoint stores copies; not
    counted). `layers`: that many modules (--mtp-layers), else the config's."""
    n = spec.mtp_layers if layers is None else layers
    if n == 0:
        return 0
    c = count_params(spec)
    layer = c.per_layer_moe if spec.moe is not None else c.per_layer_dense
    return n * (2 * spec.hidden + 2 * spec.hidden * spec.hidden + layer + spec.hidden)


def mamba2_params(spec: ModelSpec) -> int:
    """One Nemotron-H Mamba-2 mixer (modeling_nemotron_h.py NemotronHMamba2Mixer.__init__, :398-448): in_proj
    (h -> inner + conv_dim + heads: z, x|B|C, dt; bias=use_bias), the depthwise conv1d (conv_dim, 1, kernel) + bias
    (use_conv_bias), dt_bias, A_log and D (heads each), the gated RMSNorm weight (inner), out_proj (inner -> h,
    bias=use_bias)."""
    m, h = spec.hybrid, spec.hidden
    return (linear(h, m.ssm_inner + m.conv_dim + m.ssm_heads, m.proj_bias)
            + m.conv_dim * m.conv_kernel + (m.conv_dim if m.conv_bias else 0)
            + 3 * m.ssm_heads + m.ssm_inner + linear(m.ssm_inner, h, m.proj_bias))


def hybrid_layers_params(spec: ModelSpec, attention: int, mlp: int, norm: int) -> int:
    """All blocks of a hybrid stack (NemotronHBlock: one norm + one mixer each)."""
    m = spec.hybrid
    return (spec.layers * norm + m.attention_layers * attention + m.mlp_layers * mlp
            + m.mamba_layers * mamba2_params(spec))


def relative_bias_params(spec: ModelSpec) -> int:
    """T5's relative position bias: Embedding(relative_attention_num_buckets, num_heads) in the first block's
    self-attention of each stack (modeling_t5.py T5Attention.__init__ :213-214, T5Stack.__init__ :651-653); 0 without
    one (BART)."""
    return spec.encdec.relative_buckets * spec.heads


def encoder_decoder_layers_params(spec: ModelSpec, attention: int, mlp: int, norm: int) -> tuple[int, int]:
    """(all blocks of both stacks + their own per-stack parameters, one decoder block's cross-attention with its
    norm). An encoder block (modeling_t5.py T5Block :439-450; modeling_bart.py BartEncoderLayer :260-280) is
    self-attention + norm and MLP + norm; a decoder block adds the cross-attention (T5LayerCrossAttention /
    BartDecoderLayer.encoder_attn: the same q/k/v/o shapes, + norm). Per stack: T5's final_layer_norm and relative
    bias; BART's position table and layernorm_embedding, whose first copy `count_params` counts in `embedding` (the
    decoder's second copy is added here)."""
    e = spec.encdec
    cross = attention + norm
    final = norm if spec.final_norm else 0
    encoder = spec.layers * (attention + mlp + 2 * norm) + final
    # BART's decoder_ffn_dim (its attention's shapes do not depend on the head count: d_model x d_model)
    decoder_mlp = (mlp_params(spec.hidden, e.decoder_intermediate, spec.gated_mlp, spec.mlp_bias)
                   if e.decoder_intermediate else mlp)
    decoder = e.decoder_layers * (attention + cross + decoder_mlp + 2 * norm) + final
    decoder_rows = e.decoder_positions or (spec.max_positions + spec.position_offset)
    decoder_embedding = (decoder_rows * spec.hidden if spec.positions == "learned" else 0
                         ) + (norm_params(spec, spec.hidden) if spec.embedding_norm else 0)
    # transformers 5 ties the stacks' embed_tokens to `shared` only under tie_word_embeddings (BartModel.
    # _tied_weights_keys, modeling_bart.py:678-681): untied, each stack holds its own vocab x d_model table too
    # (Whisper has no `shared`: its decoder's table is `count_params`' embedding)
    stack_tables = 0 if spec.tied_embeddings or not e.shared_embedding else 2 * spec.vocab * spec.hidden
    return (encoder + decoder + decoder_embedding + stack_tables + 2 * relative_bias_params(spec)
            + audio_frontend_params(spec)), cross


def audio_frontend_params(spec: ModelSpec) -> int:
    """Whisper's encoder convolutions (modeling_whisper.py WhisperEncoder :571-572): conv1 (mel_bins -> d, kernel 3)
    and conv2 (d -> d, kernel 3), each with a bias; 0 for a token encoder."""
    m, h = spec.encdec.mel_bins, spec.hidden
    return (m * h * 3 + h + h * h * 3 + h) if m else 0


def local_experts(spec: ModelSpec, setup) -> int:
    """The routed experts a rank holds: E / ep (0 without experts)."""
    return max(1, spec.moe.num_experts // getattr(setup, "ep", 1)) if spec.moe is not None else 0


def count_params(spec: ModelSpec) -> ParamCounts:
    h = spec.hidden
    # Token embedding: HF nn.Embedding(vocab, hidden) (OPT: vocab x word_embed_proj_dim).
    emb_dim = spec.embed_proj_dim or h
    embedding = spec.vocab * emb_dim
    if spec.embed_proj_dim:
        # HF modeling_opt: project_in (proj -> hidden) and project_out (hidden -> proj), bias=False
        embedding += 2 * spec.embed_proj_dim * h
    if spec.positions == "learned":
        # GPT-2 wpe / BERT position_embeddings / OPT OPTLearnedPositionalEmbedding (max + 2 rows) /
        # RoBERTa (max_position_embeddings rows, i.e. max_positions + padding offset)
        embedding += (spec.max_positions + spec.position_offset) * h
    embedding += spec.type_vocab * h  # BERT token_type_embeddings
    embedding += extra_embedding_rows(spec) * h  # Mllama's 8 rows past the vocabulary (models/mllama.py)
    if spec.embedding_norm:
        embedding += norm_params(spec, h)  # BERT embeddings.LayerNorm

    # Attention (HF modeling_llama: q_proj, k_proj, v_proj, o_proj; GPT-2 fused c_attn + c_proj;
    # NeoX query_key_value + dense; Phi-3 qkv_proj + o_proj; BERT query/key/value + output.dense).
    if spec.mla is not None:
        attention = mla_params(spec)
    else:
        # Qwen3-Next (modeling_qwen3_next.py:241-243): q_proj emits q and the output gate, heads * head_dim * 2
        q_width = spec.q_dim * (2 if spec.attn_output_gate else 1)
        attention = (
            linear(h, q_width, spec.qkv_bias)
            + 2 * linear(h, spec.kv_dim, spec.qkv_bias)
            + linear(spec.q_dim, h, spec.out_bias)
        )
    if spec.encdec is not None and not spec.encdec.k_bias:
        attention -= spec.kv_dim  # Whisper's k_proj has no bias (modeling_whisper.py WhisperAttention :281)
    if spec.qk_norm:
        attention += 2 * spec.head_dim  # HF modeling_qwen3: q_norm, k_norm = RMSNorm(head_dim)
    if spec.attn_sinks:
        attention += spec.heads  # gpt-oss GptOssAttention.sinks = Parameter(num_attention_heads)

    mlp = mlp_params(h, spec.intermediate, spec.gated_mlp, spec.mlp_bias)
    norms = spec.norms_per_layer * norm_params(spec, h)

    moe_mlp = expert = moe_layers = 0
    if spec.moe is not None:
        m = spec.moe
        # HF modeling_mixtral / qwen2_moe: experts.gate_up_proj (E, 2I, H) + experts.down_proj (E, H, I),
        # no biases; router gate.weight (E, H)
        # gpt-oss (modeling_gpt_oss.py GptOssExperts): + gate_up_proj_bias (E, 2I) + down_proj_bias (E, H), and a
        # router bias (E,) (GptOssTopKRouter.bias)
        expert = mlp_params(h, m.expert_intermediate, True, m.expert_bias)
        moe_mlp = m.num_experts * expert + m.num_experts * h + (m.num_experts if m.router_bias else 0)
        if m.shared_intermediate:
            # Qwen2-MoE shared_expert (no bias); DeepSeek shared_experts (DeepseekV2MLP: bias=config.mlp_bias)
            moe_mlp += mlp_params(h, m.shared_intermediate, True, spec.mlp_bias)
        if m.shared_gate:
            moe_mlp += h  # Qwen2-MoE shared_expert_gate = Linear(hidden, 1, bias=False)
        moe_layers = spec.moe_layers
    dense_layers = spec.layers - moe_layers

    final = norm_params(spec, h) if spec.final_norm else 0
    head = layout(spec)
    if head.kind in CLASSIFIERS:
        if head.pooler:
            # BERT pooler.dense (modeling_bert.py BertPooler) / RoBERTa classifier.dense (RobertaClassificationHead)
            final += linear(h, h, True)
        # BERT/RoBERTa classifier (out_proj), decoders' score (no bias for seq-cls) / token-cls classifier
        lm_head = linear(head.in_dim, head.width, head.out_bias)
    else:
        if spec.mlm_transform:
            # BERT cls.predictions.transform / RoBERTa lm_head: dense (h x h + bias) + LayerNorm
            final += linear(h, h, True) + norm_params(spec, h)
        lm_head = 0 if spec.tied_embeddings else spec.vocab * emb_dim
        if spec.lm_head_bias:
            lm_head += spec.vocab  # BERT cls.predictions.bias / RoBERTa lm_head.bias
            if not spec.tied_embeddings:
                # transformers 5 ties decoder.bias to that bias only under tie_word_embeddings (its
                # _tied_weights_keys); untied, decoder.bias is a second vocab-sized parameter.
                # NB: transformers 4.x always shared the bias, so there an untied BERT has `vocab` fewer.
                lm_head += spec.vocab

    per_layer = attention + norms
    # Qwen3-Next: the "linear_attention" layers hold a Gated DeltaNet instead of the attention above
    # (Qwen3NextDecoderLayer.__init__, modeling_qwen3_next.py:877-880)
    linear_layers = spec.linear_attn.layers if spec.linear_attn is not None else 0
    linear_attention = gated_deltanet_params(spec) if linear_layers else 0
    cross = second_stack = 0
    if spec.encdec is not None:
        # `final` is the encoder's final norm; the decoder's and the rest are `second_stack`
        layers_total, cross = encoder_decoder_layers_params(spec, attention, mlp, norm_params(spec, h))
        total = embedding + layers_total + lm_head
        second_stack = layers_total - spec.layers * (attention + mlp + norms) - final
    elif spec.hybrid is not None:
        # NB: for a hybrid stack `attention`, `mlp` and `norms` are one block of each kind, not one layer's sum
        total = embedding + hybrid_layers_params(spec, attention, mlp, norms) + final + lm_head
    else:
        total = (
            embedding
            + spec.layers * per_layer
            + linear_layers * (linear_attention - attention)
            + dense_layers * mlp
            + moe_layers * moe_mlp
            + final
            + lm_head
        )
    vision = tower_params(spec.vision) if spec.vision is not None else 0
    cross_extras = cross_layer_extras(spec)  # Mllama's cross-attention layers' q/k norms and gates (models/mllama.py)
    total += vision + cross_extras
    active = total
    if spec.moe is not None:
        # Each token runs top_k routed experts (plus the shared expert and router, counted above).
        active = total - moe_layers * (spec.moe.num_experts - spec.moe.top_k) * expert
    return ParamCounts(
        embedding=embedding,
        attention=attention,
        mlp=mlp,
        moe_mlp=moe_mlp,
        norms=norms,
        dense_layers=dense_layers,
        moe_layers=moe_layers,
        final=final,
        lm_head=lm_head,
        total=total,
        active=active,
        expert=expert,
        mamba=mamba2_params(spec) if spec.hybrid is not None else 0,
        linear_attention=linear_attention,
        linear_layers=linear_layers,
        vision=vision,
        cross_extras=cross_extras,
        cross_attention=cross,
        second_stack=second_stack,
        decoder_layers=spec.encdec.decoder_layers if spec.encdec is not None else 0,
    )
