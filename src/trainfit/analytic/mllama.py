"""Llama 3.2 Vision (mllama; spec.vision with projector "cross", models/mllama.py) in the analytic engine: the tiled
vision tower, the multi_modal_projector and the language model's cross-attention layers (transformers 5.24
models/mllama/modeling_mllama.py). analytic/vlm.py hands these models here.

The tower (MllamaVisionModel.forward, :877-1013) runs every image as max_tiles tiles (the processor pads to them,
step/mllama_batch.py) of (tile / patch)^2 patches and a class token, padded to a multiple of 8 rows: `depth` local
LayerNorm/GELU layers, then `global_layers` tanh-gated ones, each attending over an image's tiles under one additive
(images, 1, tiles x rows, tiles x rows) mask; the intermediate layers' outputs are concatenated to the last one and
projected to the language model's width: the cross_attention_states every cross-attention layer projects its K and
V from. The language model's sequence holds one <|image|> token per image (vlm_setup.lm_seq); its cross-attention
layers (MllamaCrossAttentionDecoderLayer, :672-720) replace a self-attention by q/k RMSNorms, K/V over the vision
tokens repeated to every head (a mask is given: transformers' SDPA path repeats k and v), the masked SDPA and two
tanh gates. memory.py prices the cross-attention layers as a kind of their own at their places (layer_kinds: a
self-attention layer's price and what a cross-attention layer saves beyond it, cross_layer_delta). The tower runs before the language model's
embedding, so autograd runs its backward last: its gradients are not made yet at the embedding's backward
(vlm.late_gradients), where at published sizes the training step peaks (every other gradient made, the tower's
saved set whole).
"""
from __future__ import annotations

from ..alloc.caching_allocator import K_MIN_BLOCK
from ..setup import Setup
from ..spec import ModelSpec
from .phases import Pattern
from .precision import StateBytes

FP32, INDEX = 4, 8


def _rounded(setup: Setup, n: int) -> int:
    """A small tensor's bytes as the allocator holds them (CUDA: 512-B blocks; alloc/caching_allocator.py)."""
    return -(-n // K_MIN_BLOCK) * K_MIN_BLOCK if setup.device == "cuda" and n else n


def _active(spec: ModelSpec, setup: Setup) -> bool:
    return spec.vision is not None and bool(setup.images)


def padded_rows(spec: ModelSpec) -> int:
    """One tile's rows through the encoders: the tile's tokens padded to a multiple of 8 (MllamaVisionModel.forward
    :950-952, F.pad)."""
    n = spec.vision.tile_tokens
    return n + (8 - n % 8) % 8


def _sizes(spec: ModelSpec, setup: Setup) -> tuple[int, int, int, int]:
    """(images B = batch x images, padded rows n = B x tiles x padded rows, unpadded rows m = B x tiles x tile
    tokens, one image's attention length tiles x padded rows) of one micro-batch."""
    t = spec.vision
    images = setup.batch * (setup.images or 0)
    return images, images * t.max_tiles * padded_rows(spec), images * t.max_tiles * t.tile_tokens, \
        t.max_tiles * padded_rows(spec)


def vision_tokens(spec: ModelSpec, setup: Setup) -> int:
    """The vision tokens each sample's cross-attention reads: images x tiles x tile tokens (the projected states
    reshaped to (batch, images x tiles x tokens, hidden), MllamaTextCrossAttention.forward :443-448)."""
    t = spec.vision
    return (setup.images or 0) * t.max_tiles * t.tile_tokens


def _stat(setup: Setup, st: StateBytes) -> int:
    """Bytes of a LayerNorm's mean (or rstd) element: fp32 on CUDA and under autocast (fp32 input), else the
    input's dtype (the CPU kernel keeps them in it when input and weight agree: activations._norm_saved)."""
    return FP32 if (st.autocast or setup.device == "cuda") else st.act


def _lse(setup: Setup, heads: int, batch: int, rows: int) -> int:
    """A masked SDPA's logsumexp, (batch, heads, rows) fp32: the CPU flash kernel's, and on CUDA the memory-efficient
    kernel's (a mask rules out flash), which the trace's CUDA semantics record unpadded and without an RNG seed and
    offset (read off traced fp32 and amp-bf16 steps)."""
    return _rounded(setup, FP32 * batch * heads * rows)


def _eager(setup: Setup) -> bool:
    """The model runs transformers' eager attention (--attention eager; the tower takes the model's implementation)."""
    return setup.attention_kernel == "eager"


def _eager_probs(setup: Setup, st: StateBytes, scores: int) -> int:
    """eager_attention_forward (modeling_mllama.py:210-232) over `scores` query-key pairs: softmax's fp32
    probabilities and their 16-bit copy the probs.v matmul saves (.to(query.dtype), or autocast's cast); the mask is
    added, not saved. Its q, k, v operands are the SDPA's (copies made for the batched matmul), its output the
    transposed copy o_proj reads, no logsumexp."""
    return _rounded(setup, FP32 * scores) + (_rounded(setup, st.act * scores) if st.act < FP32 else 0)


def _weight_casts(spec: ModelSpec, st: StateBytes) -> int:
    """Under autocast an encoder layer's weight casts, saved by its matmuls: q, k, v, o (h x h), fc1, fc2 (h x i)."""
    if not st.autocast:
        return 0
    h, i = spec.vision.hidden, spec.vision.intermediate
    return st.act * (4 * h * h + 2 * h * i)


def layer_saved(spec: ModelSpec, setup: Setup, st: StateBytes, gated: bool) -> int:
    """One MllamaVisionEncoderLayer (:289-330) over the padded rows: its two residual adds' outputs (the second
    LayerNorm's input and the next layer's), each LayerNorm's mean and rstd, the norms' outputs (shared by q, k, v
    and by fc1; under autocast each linear's own 16-bit cast of the fp32 output), q, k, v and SDPA's output (o_proj's
    input) and logsumexp, fc1's and GELU's outputs, the weight casts; a global (gated) layer also the o_proj and fc2
    outputs the tanh gates' products save (and the gates' tanh, 2 scalars)."""
    t = spec.vision
    images, n, _, length = _sizes(spec, setup)
    h, i, a = t.hidden, t.intermediate, st.act
    s = FP32 if st.autocast else a
    stats = 2 * 2 * _rounded(setup, _stat(setup, st) * n)
    norms_out = (4 if st.autocast else 2) * a * n * h
    attention = 4 * a * n * h + (_eager_probs(setup, st, t.heads * images * length * length) if _eager(setup)
                                 else _lse(setup, t.heads, images, length))
    gates = 2 * a * n * h + 2 * _rounded(setup, st.weight) if gated else 0
    return 2 * s * n * h + stats + norms_out + attention + 2 * a * n * i + _weight_casts(spec, st) + gates


def tower_only_saved(spec: ModelSpec, setup: Setup, st: StateBytes) -> int:
    """Bytes the tower and projector save for the backward in one micro-batch (MllamaVisionModel.forward):
    - the patch Conv2d: the pixels cast to the weight's dtype (a 16-bit copy with 16-bit weights; fp32: the input
      itself, tower_inputs), under autocast its 16-bit casts of the pixels and of the weight;
    - the pre- and post-tile embeddings' rows (images, tiles x hidden) and the gated position embedding's tile rows
      (images, tiles x tile tokens x hidden), in the weights' dtype, which the gates' products save;
    - layernorm_pre's input (the position-embedded tiles, unpadded) and statistics, the padded rows (the first
      local layer's input), the aspect-ratio mask (built by a matmul: 16-bit under autocast);
    - every encoder layer (layer_saved), less the last global layer's output (nothing saves it); layernorm_post's
      statistics; the post-tile embedding's output (the first global layer's input);
    - the projector's input (the last and the intermediate hidden states concatenated; under autocast its 16-bit
      cast and the weight's) and its output, the cross_attention_states."""
    t = spec.vision
    images, n, m, length = _sizes(spec, setup)
    h, a, w = t.hidden, st.act, st.weight
    s = FP32 if st.autocast else a
    patches = images * t.max_tiles * (t.tile_tokens - 1)
    k, wide = t.patch_values, h * (1 + len(t.intermediate_layers))
    conv = a * (patches * k + h * k) if st.autocast else (a * patches * k if a < FP32 else 0)
    tables = _rounded(setup, int(w * images * t.max_tiles * h)) * 2 + _rounded(
        setup, int(w * images * t.max_tiles * t.tile_tokens * h)) + 4 * _rounded(setup, int(w))
    mask = 0 if _eager(setup) else a * images * length ** 2  # SDPA's operand; eager adds it and saves nothing
    pre = s * m * h + 2 * _rounded(setup, _stat(setup, st) * m) + s * n * h + mask
    encoders = (t.depth * layer_saved(spec, setup, st, False) + t.global_layers * layer_saved(spec, setup, st, True)
                - (s * n * h if t.global_layers else 0))
    post = 2 * _rounded(setup, _stat(setup, st) * n) + s * n * h
    projector = (a * (m * wide + wide * t.out_hidden) if st.autocast else s * m * wide) + a * m * t.out_hidden
    return conv + tables + pre + encoders + post + projector


def cross_layer_delta(spec: ModelSpec, setup: Setup, st: StateBytes) -> int:
    """What one cross-attention layer saves beyond the self-attention layer memory.py prices (both: the two RMSNorms,
    the MLP, the residual adds, o_proj's input and the logsumexp; MllamaTextCrossAttention.forward :428-480 against
    MllamaTextSelfAttention's :538-580), over r = batch x L text rows and v = batch x vision tokens:
    - the self-attention's saved attention (its rotated q and k, v, output and logsumexp, or the math path's
      probabilities: _self_attention_saved) is not made; the cross-attention's SDPA keeps its output and logsumexp;
    - q_norm and k_norm (MllamaTextRMSNorm :380-397) save the fp32 input (a copy, or the projection's output in
      fp32), the rsqrt per head row and the normalised tensor cast back; q's weight product (under autocast its
      16-bit cast: the weight promotes to fp32) is SDPA's operand; k's is repeated to every head (repeat_kv :197-207,
      a copy; SDPA's cast under autocast) and so is v;
    - the tanh gates' products save o_proj's output and the row-masked MLP output (fp32 under autocast: the
      full_text_row mask is in the weights' dtype);
    - eager attention: softmax's probabilities over (batch, heads, L, v) in place of the logsumexp (_eager_probs);
    - under autocast SDPA's 16-bit cast of the (batch, 1, L, v) mask, each layer's own; and only q_proj casts its
      input (k and v read the 16-bit cross_attention_states), where a self-attention layer casts it for q, k and v."""
    h, a = spec.hidden, st.act
    rows = setup.batch * setup.seq
    vrows = setup.batch * vision_tokens(spec, setup)
    qd, kvd = spec.q_dim, spec.kv_dim
    q_side = (FP32 + 2 * a) * rows * qd + _rounded(setup, FP32 * rows * spec.heads)
    k_side = (FP32 + a) * vrows * kvd + _rounded(setup, FP32 * vrows * spec.kv_heads) + a * vrows * qd
    v_side = a * vrows * qd
    eager = _eager(setup)
    scores = rows * spec.heads * vision_tokens(spec, setup)
    sdpa = a * rows * qd + (_eager_probs(setup, st, scores) if eager else _lse(setup, spec.heads, setup.batch,
                                                                               setup.seq))
    gates = a * rows * h + st.residual * rows * h
    mask_cast = 0 if eager else _rounded(setup, a * rows * vision_tokens(spec, setup))
    autocast = mask_cast - 2 * a * rows * h if st.autocast else 0
    return q_side + k_side + v_side + sdpa + gates + autocast - _self_attention_saved(spec, setup, st)


def _self_attention_saved(spec: ModelSpec, setup: Setup, st: StateBytes) -> int:
    """memory.py's price of one self-attention layer's attention over the text rows: activations.py's "attention"
    term (q, k, v as SDPA takes them, its output and what its kernel keeps) and the per-key term (the math path's
    probabilities)."""
    from .activations import keys_per_token
    from .params import count_params
    from .recompute import layer_memory

    tokens = setup.batch * setup.seq
    keys = keys_per_token(spec, setup.seq)
    acts = layer_memory(spec, setup, count_params(spec), st, tokens, keys, "none").activations
    return int(tokens * (acts.terms["attention"] + acts.per_token_key * keys))


def language_held(spec: ModelSpec, setup: Setup, st: StateBytes) -> int:
    """The language model's masks made once and saved by every cross-attention layer (MllamaModel.forward
    :1362-1375, _prepare_cross_attention_mask :53-78): the additive (batch, 1, L, vision tokens) mask (without
    autocast: SDPA's operand; under autocast each layer saves its own cast, cross_layer_delta; eager attention adds
    it and saves nothing) and the (batch, 1, L,
    1) full-text-row mask, in the weights' dtype (with full recompute: the checkpoints' inputs)."""
    rows = setup.batch * setup.seq
    w = int(st.weight)
    # under full recompute the checkpoints keep the mask itself (a layer's input), the re-run casts it
    mask = 0 if ((st.autocast or _eager(setup)) and setup.recompute != "full") else w * rows * vision_tokens(
        spec, setup)
    return _rounded(setup, mask) + _rounded(setup, w * rows)


def tower_saved(spec: ModelSpec, setup: Setup, st: StateBytes) -> int:
    """What Mllama saves beside memory.py's language-model layers, live to the end of the backward: the tower and
    projector (tower_only_saved) and the language model's masks (language_held); nothing without images."""
    if spec.vision is None or not setup.images:
        return 0
    return tower_only_saved(spec, setup, st) + language_held(spec, setup, st)


def cross_layers_saved(spec: ModelSpec, setup: Setup, st: StateBytes) -> int:
    """What the cross-attention layers save beyond memory.py's self-attention price for them, where memory.py cannot
    place them (a pipeline stage: layer_kinds is None; spread over the stage's layers): each
    layer's cross_layer_delta; under full recompute a checkpointed cross-attention layer keeps its input as a
    self-attention one does (0); NB: not split by --tp, and spread evenly over a pipeline's stages; without images
    the cross-attention layers are skipped (MllamaTextModel.forward :1136-1139) and memory.py's price of each comes
    off."""
    t = spec.vision
    if t is None:
        return 0
    if not setup.images:
        return -len(t.cross_layers) * _self_layer_saved(spec, setup, st)
    return 0 if setup.recompute == "full" else len(t.cross_layers) * cross_layer_delta(spec, setup, st)


def layer_kinds(spec: ModelSpec, setup: Setup, st: StateBytes, layers: int, self_kind):
    """(kinds, pattern): the self-attention layers as memory.py prices them (`self_kind`, a phases.LayerKind) and
    the cross-attention layers at their places (text_config cross_attention_layers), each layer's backward high
    point then holding its own kind's saved set and the gradients of the layers after it (phases.py
    _mixed_layer_moments): a cross-attention layer saves cross_layer_delta more, or under full recompute keeps its
    input as a self-attention layer does and holds that much more at its backward (its re-run's saved set; NB: its
    backward's own temporaries over the vision tokens are a self-attention layer's: fp32 with 2 images, -1.0 % on
    CUDA, +0.65 % on the CPU of the small model's traced peak);
    without images it is skipped (MllamaTextModel.forward :1136-1139): nothing saved, no gradients. None on a
    pipeline stage (its first layer's index is not tracked: cross_layers_saved spreads the difference instead)."""
    from dataclasses import replace

    t = spec.vision
    if t is None or not t.cross_layers or setup.pp > 1 or layers != spec.layers:
        return None
    if not setup.images:
        cross = replace(self_kind, saved=0.0, backward=0.0, freed=0.0, grads_done=0.0, gradients=0.0)
    elif setup.recompute == "full":
        cross = replace(self_kind, backward=self_kind.backward + cross_layer_delta(spec, setup, st))
    else:
        cross = replace(self_kind, saved=self_kind.saved + cross_layer_delta(spec, setup, st))
    # the self-attention layers between the (sorted, distinct: models/mllama.py cross_layers) cross-attention ones, as
    # runs (not one entry per layer: 10**9 layers)
    runs, prev = [], -1
    for j in t.cross_layers:
        runs += [(0, j - prev - 1), (1, 1)]
        prev = j
    return (self_kind, cross), Pattern.of_runs(*runs, (0, layers - prev - 1))


def skipped_params(spec: ModelSpec, setup: Setup, pc, layers: int, embedding: bool) -> float:
    """One rank's parameters of the cross-attention layers a step without images skips (MllamaTextModel.forward
    :1136-1139; layer_kinds' cross kind makes no gradients): each a self-attention layer's count (memory.py's
    layer price: its norms and, split by --tp, its attention and MLP; parallel/tensor.py rank_params) and their q/k
    norms and gates (ParamCounts.cross_extras, on the first stage). NB: on a pipeline the layers are spread evenly
    over the stages (a stage's first layer index is not tracked)."""
    t = spec.vision
    per_layer = pc.norms + (pc.attention + pc.mlp) / setup.tp
    return len(t.cross_layers) * per_layer * layers / spec.layers + (pc.cross_extras if embedding else 0)


def _self_layer_saved(spec: ModelSpec, setup: Setup, st: StateBytes) -> int:
    """memory.py's saved bytes of one language-model layer in `setup`."""
    from .activations import keys_per_token
    from .params import count_params
    from .recompute import layer_memory

    tokens = setup.batch * setup.seq
    return int(layer_memory(spec, setup, count_params(spec), st, tokens, keys_per_token(spec, setup.seq)).saved)


def tower_inputs(spec: ModelSpec, setup: Setup) -> int:
    """The step's image inputs in one micro-batch, live through the step (step/mllama_batch.py): pixel_values
    (batch, images, tiles, channels, tile, tile) fp32, cross_attention_mask (batch, L, images, tiles) int64 and the
    aspect-ratio ids and mask (int64)."""
    if not _active(spec, setup):
        return 0
    t = spec.vision
    images = setup.batch * setup.images
    pixels = FP32 * images * t.max_tiles * t.in_channels * t.image_size ** 2
    masks = INDEX * setup.batch * setup.seq * setup.images * t.max_tiles + INDEX * images * (t.max_tiles + 1)
    return pixels + _rounded(setup, masks)


def tower_casts(spec: ModelSpec, setup: Setup, st: StateBytes) -> int:
    """Under autocast the tower's weight casts autocast's cache keeps through a no-grad generate: the patch conv's,
    every encoder layer's and the projector's."""
    if not _active(spec, setup) or not st.autocast:
        return 0
    t = spec.vision
    wide = t.hidden * (1 + len(t.intermediate_layers))
    return st.act * (t.hidden * t.patch_values + wide * t.out_hidden) + (t.depth + t.global_layers) * _weight_casts(
        spec, st)


def checkpointed_casts(spec: ModelSpec, setup: Setup, st: StateBytes) -> int:
    """What the forward holds to its end beyond the saved tensors (memory.py's forward transient): under autocast
    the projector's fp32 input (the last and intermediate hidden states concatenated), which the tower's output
    object keeps (MllamaModel.forward :1350-1356, returned as image_outputs :1390) while the projector saves its 16-bit
    cast. The tower's layers are not checkpointed (MllamaVisionEncoderLayer is a plain module): no casts here."""
    if not _active(spec, setup) or not st.autocast:
        return 0
    t = spec.vision
    _, _, m, _ = _sizes(spec, setup)
    return FP32 * m * t.hidden * (1 + len(t.intermediate_layers))


def encoder_outputs_held(spec: ModelSpec, setup: Setup, st: StateBytes) -> int:
    """What the language model's prefill holds beside analytic/inference.py's self-attention layers (MllamaModel.
    forward :1345-1390, locals through the language model): the tower's output object (the projector's input: the
    hidden states concatenated, in the stream's dtype), the cross_attention_states (the projector's output), the
    additive cross-attention mask (batch, 1, L, vision tokens) and the full-text-row mask (batch, 1, L, 1) in the
    weights' dtype; and the cross-attention layers' cache, K and V over the vision tokens instead of the text
    (this term is the difference to the self-attention cache inference.py counts for every layer; the cache holds
    them in the projection's dtype). Without images the cross-attention layers are skipped: no cache for them. NB: the
    decode step's cache is inference.py's over the text for every layer (an under-count of that moment, which stays
    below the prefill's: the prefill holds the same cache and the tower's outputs)."""
    if spec.vision is None:
        return 0
    if not setup.images:
        return -len(spec.vision.cross_layers) * 2 * st.act * setup.batch * spec.kv_dim * setup.seq
    t = spec.vision
    _, _, m, _ = _sizes(spec, setup)
    a = st.act
    s = FP32 if st.autocast else a
    w = int(st.weight)
    rows = setup.batch * setup.seq
    wide = t.hidden * (1 + len(t.intermediate_layers))
    held = s * m * wide + a * m * t.out_hidden + _rounded(setup, w * rows * vision_tokens(spec, setup)) + _rounded(
        setup, w * rows)
    cache = len(t.cross_layers) * 2 * a * setup.batch * spec.kv_dim * (vision_tokens(spec, setup) - setup.seq)
    return held + cache


def tower_prefill_peak(spec: ModelSpec, setup: Setup, st: StateBytes) -> int:
    """The tower's no-grad high point (beside the weights, the cached casts and the pixels): inside the last global
    layer's MLP. The local encoder's output object keeps every local layer's output (MllamaVisionEncoder.forward
    :348-376, encoder_states; MllamaVisionModel.forward reads the intermediate ones after the global encoder), and
    the global encoder's keeps its layers' outputs so far; beside them the aspect-ratio mask, the post-tile
    embedding's output (the global encoder's input), the layer's residual, its norm's output (fp32 under autocast,
    and the 16-bit cast fc1 reads) and fc1's and GELU's outputs."""
    if not _active(spec, setup):
        return 0
    t = spec.vision
    images, n, m, length = _sizes(spec, setup)
    h, i, a = t.hidden, t.intermediate, st.act
    s = FP32 if st.autocast else a
    outputs = (t.depth + max(t.global_layers - 1, 0) + 1) * s * n * h
    layer = s * n * h + n * h * (s + (a if st.autocast else 0)) + 2 * a * n * i
    return outputs + layer + a * images * length ** 2


def tower_forward_flops(spec: ModelSpec, setup: Setup) -> float:
    """The tower's and cross-attention layers' forward FLOPs (2 per multiply-add): the patch conv, each encoder
    layer's q, k, v, o, fc1, fc2 over the padded rows and its attention (4 x hidden per key, every row attending
    over its image's tiles x padded rows), the projector; each cross-attention layer's K and V projections over the
    vision tokens and its attention (4 x q_dim per text token and vision token) in place of the self-attention's
    (flops.py prices every language-model layer as one); without images the cross-attention layers' whole forward
    comes off (they are skipped). NB: norms, gates, GELU are elementwise, left out."""
    if spec.vision is None:
        return 0.0
    t = spec.vision
    if not setup.images:  # the cross-attention layers are skipped: each layer's forward comes off
        from .flops import forward_per_token, head_matmul_per_token

        per_layer = (forward_per_token(spec, setup.seq) - 2 * head_matmul_per_token(spec, setup.seq)) / spec.layers
        return -len(t.cross_layers) * per_layer * setup.batch * setup.seq
    images, n, m, length = _sizes(spec, setup)
    h, i = t.hidden, t.intermediate
    wide = h * (1 + len(t.intermediate_layers))
    per_layer = 2 * n * (4 * h * h + 2 * h * i) + 4 * h * n * length
    tower = patch_embed_flops(spec, setup) + (t.depth + t.global_layers) * per_layer + 2 * m * wide * t.out_hidden
    rows, vrows = setup.batch * setup.seq, setup.batch * vision_tokens(spec, setup)
    kv = 2 * 2 * vrows * spec.hidden * spec.kv_dim - 2 * 2 * rows * spec.hidden * spec.kv_dim
    # flops.attention_flops_per_token: a causal self-attention's (s + 1) / 2 keys per query on average
    attention = 4 * spec.q_dim * rows * vision_tokens(spec, setup) - 4 * spec.q_dim * rows * (setup.seq + 1) / 2
    return tower + len(t.cross_layers) * (kv + attention)


def patch_embed_flops(spec: ModelSpec, setup: Setup) -> float:
    """The patch Conv2d's forward FLOPs: each patch of every tile times the (hidden, channels x patch^2) weight."""
    if not _active(spec, setup):
        return 0.0
    t = spec.vision
    return 2.0 * setup.batch * setup.images * t.max_tiles * (t.tile_tokens - 1) * t.patch_values * t.hidden
