"""Training memory of BART and Whisper (the encoder-decoders with learned absolute positions, encdec_absolute.py):
the terms encoder_decoder_training.train_memory combines for them in place of T5's, block by block.

The step is T5's (encoder_decoder_training.py): the encoder over --seq positions, the decoder over --target-seq
tokens, whose ids are the labels shifted right (shift_tokens_right, modeling_bart.py:59-70 called at :753-755,
modeling_whisper.py:70-80 at :1106-1108), the tied lm_head / proj_out over every target position and
CrossEntropyLoss (modeling_bart.py:934-941, modeling_whisper.py:1122-1129). What differs (transformers 5.24):

One block saves, per sublayer (two in an encoder block, three in a decoder block):
  LayerNorm              nn.LayerNorm (native_layer_norm) keeps its input (the residual add's output, counted where
                         it is made), its weight and bias, and mean and rstd, one each per row: fp32 on CUDA
                         (layer_norm_kernel.cu: the accumulate type) and wherever the input or weight is fp32, the
                         input's dtype on a CPU's pure 16-bit path (layer_norm.cpp param_scalar_type); its output,
                         the model's dtype, is what the next linear keeps (not under autocast: its cast is kept);
                         post-norm (BART, BartEncoderLayer.forward :280-308) normalises each sum, pre-norm (Whisper,
                         WhisperEncoderLayer.forward :383-417) each sublayer's input: one norm a sublayer either way;
  residual               the dropout (config `dropout`) on the branch's output: its noise (CPU, the branch's dtype)
                         or 1-byte mask (CUDA), none at p = 0 (Dropout.cpp returns the input); the add's output,
                         the model's dtype (fp32 + 16-bit under autocast is fp32), the next norm's input;
  attention              q, k and v projected with biases (Whisper's k_proj without, :281; q scaled by the kernel);
                         SDPA (attention_saved): the math path (a CPU with attention_dropout) keeps encoder_decoder_
                         training.attention_core's tensors; the fused kernels (flash, memory-efficient; CPU flash
                         without dropout) q, k, v, the output and an fp32 logsumexp, on CUDA also the philox seed
                         and offset, Whisper's output copy, and for BART's decoder, which passes a materialised
                         causal mask (encdec_frontends.FRONT_ENDS), the additive mask the memory-efficient kernel
                         keeps (trace/cuda_masked_sdpa.py) (attention_saved); out_proj keeps the output (its
                         input). NB: CUDA's LayerNorm keeps fp32 statistics, the trace's CUDA semantics the CPU
                         kernel's 16-bit ones in bf16 (2 x 2 B per row under);
  MLP                    fc1's output (GELU's input: nn.functional.gelu keeps its input only), activation_dropout's
                         noise or mask, fc2's input (GELU's output, or its dropped copy);
  autocast               each linear's input cast and its cached weight cast (attention_casts: q, k, v, out_proj;
                         the cross-attention's k and v cast the encoder's output in every block; fc1, fc2; lm_head).
                         NB: the biases' cached casts are not counted (under, by the biases: the trace files them
                         with the temporaries).
Each stack's front-end (front_saved): BART's sum of the token and position lookups (layernorm_embedding's input),
layernorm_embedding's mean and rstd, the embedding dropout's noise and its output (the first block's linears' input);
Whisper's conv1/conv2 + GELU (each GELU keeps its conv's output, conv2 the first GELU's output, conv1 under autocast
its input's cast) and the sum with the positions (the first norm's input); the position ids an Embedding or an
index keeps for its backward (BART's both tables, Whisper's decoder table: its encoder table is frozen,
modeling_whisper.py:575). Whisper's final layer_norm per stack (:641, :816) keeps its statistics and output.
BART's final_logits_bias (:935) is added to the logits: an add keeps nothing; the biased logits are a second
(b, t, vocab) tensor at the forward's end (the bias's dtype: fp32 under autocast).

Full recomputation: each block keeps its input (and on a CPU the generator's state), the decoder's blocks also the
encoder's output and, BART, the causal mask (b, 1, t, t) bool: checkpoint inputs.
"""
from __future__ import annotations

from ..setup import Setup
from ..spec import ModelSpec
from . import encdec_frontends as fe
from .activations import FP32, INDEX, dropout_mask_bytes
from .backward import Moment
from .encdec_absolute import LOGITS_BIAS, heads
from .encoder_decoder_training import attention_casts, attention_core
from .precision import StateBytes

# the CUDA caching allocator's smallest block (c10/cuda/CUDACachingAllocator.cpp kMinBlockSize): each of the fused
# kernels' philox seed and offset (one int64 each) takes one
CUDA_MIN_BLOCK = 512

# the families whose attention makes q, k and v contiguous in (b, heads, n, d) before SDPA (WhisperAttention.forward
# modeling_whisper.py:312, :336-337: `.transpose(1, 2).contiguous()`; BART's are views of the projections' (b, n, h)
# outputs, modeling_bart.py:207, :228-230)
CONTIGUOUS_HEADS = ("whisper",)


def dropped(setup: Setup, p: float, elem: int) -> int:
    """Bytes per element a dropout of probability `p` keeps: its noise or mask (activations.dropout_mask_bytes);
    none at p = 0, where the input passes through (Dropout.cpp _dropout_impl)."""
    return dropout_mask_bytes(setup, elem) if p > 0 else 0


def activation_dropout(spec: ModelSpec) -> float:
    return spec.encdec.activation_dropout


def stats_bytes(setup: Setup, st: StateBytes) -> int:
    """Bytes per row of LayerNorm's saved mean and rstd (module docstring)."""
    return 2 * (FP32 if setup.device == "cuda" or st.residual == FP32 else st.residual)


def norm_saved(setup: Setup, st: StateBytes, rows: int, h: int) -> float:
    """A LayerNorm over `rows`: its statistics and, but under autocast, its output (a linear's input)."""
    return rows * (stats_bytes(setup, st) + (0 if st.autocast else st.residual * h))


def sublayer_saved(spec: ModelSpec, setup: Setup, st: StateBytes, rows: int) -> float:
    """One sublayer's norm, its residual dropout and its add (module docstring)."""
    h = spec.hidden
    return norm_saved(setup, st, rows, h) + (dropped(setup, spec.dropouts[2], st.act) + st.residual) * h * rows


def masked(spec: ModelSpec, decoder: bool, cross: bool) -> bool:
    """Whether the attention's SDPA call gets a materialised mask (BART's decoder self-attention)."""
    return decoder and not cross and fe.front_end(spec, True).causal_mask


def fused(spec: ModelSpec, setup: Setup, decoder: bool, cross: bool) -> bool:
    """Whether SDPA runs a fused kernel (module docstring): without attention dropout, or on CUDA (a masked call
    there takes the memory-efficient kernel: trace/cuda_masked_sdpa.py)."""
    return spec.dropouts[1] == 0 or setup.device == "cuda"


def attention_saved(spec: ModelSpec, setup: Setup, st: StateBytes, decoder: bool, cross: bool) -> float:
    """One attention's saved tensors beyond its input (module docstring), under autocast with its casts."""
    b, h, a = setup.batch, spec.hidden, st.act
    q_len = setup.target_tokens if decoder else setup.seq
    k_len = setup.seq if cross else q_len
    n = heads(spec, decoder)
    casts = attention_casts(spec, st, b * q_len, b * k_len)
    if not fused(spec, setup, decoder, cross):
        return attention_core(spec, setup, st, q_len, k_len, n) + casts
    seed = 2 * CUDA_MIN_BLOCK if setup.device == "cuda" else 0  # the CUDA kernels' philox seed and offset
    # the flash kernels allocate their output like the query (torch/_meta_registrations.py:6122 (CUDA), :6389
    # (CPU): empty_like(query)), the
    # memory-efficient one (fp32 on CUDA) as (b, q, heads, d); a query laid out (b, heads, q, d) (CONTIGUOUS_HEADS)
    # makes sdpa_attention_forward's transpose(1, 2).contiguous() (integrations/sdpa_attention.py:195) a copy,
    # out_proj's input beside the kernel's saved output
    mask = masked(spec, decoder, cross)
    efficient = setup.device == "cuda" and (a == FP32 or mask)
    copy = a * h * b * q_len if spec.family in CONTIGUOUS_HEADS and not efficient else 0
    # a masked call on CUDA: aten turns the bool mask into an additive one in q's dtype (where(mask, 0, -inf)),
    # padded to 8 keys (attention.cpp convert_boolean_attn_mask, preprocess_mask), which the kernel keeps
    bias = b * q_len * -(-k_len // 8) * 8 * a if (mask and setup.device == "cuda") else 0
    return b * (a * h * (2 * q_len + 2 * k_len) + FP32 * n * q_len) + seed + copy + casts + bias


def mlp_saved(spec: ModelSpec, setup: Setup, st: StateBytes, rows: int, decoder: bool) -> float:
    """fc1's output, the activation dropout's noise or mask, fc2's input; under autocast fc1's input cast and both
    weights' casts."""
    a, h, f = st.act, spec.hidden, fe.mlp_width(spec, decoder)
    casts = a * (h * rows + 2 * h * f) if st.autocast else 0
    return rows * f * (2 * a + dropped(setup, activation_dropout(spec), a)) + casts


def block_saved(spec: ModelSpec, setup: Setup, st: StateBytes, decoder: bool, first: bool = False) -> float:
    """One block's saved tensors over one micro-batch (module docstring)."""
    rows = setup.batch * (setup.target_tokens if decoder else setup.seq)
    out = (3 if decoder else 2) * sublayer_saved(spec, setup, st, rows) + attention_saved(spec, setup, st, decoder,
                                                                                         False)
    if decoder:
        out += attention_saved(spec, setup, st, True, True)
    return out + mlp_saved(spec, setup, st, rows, decoder)


def front_saved(spec: ModelSpec, setup: Setup, st: StateBytes, decoder: bool) -> float:
    """A stack's front-end's saved tensors (module docstring) over one micro-batch."""
    b, h, r, a = setup.batch, spec.hidden, st.residual, st.act
    n = setup.target_tokens if decoder else setup.seq
    rows = b * n
    f = fe.front_end(spec, decoder)
    ids = {"batch": rows, "one": n, "": 0}[f.position_ids]
    if spec.encdec.mel_bins and not decoder:
        ids = 0  # the encoder's table is frozen: its index keeps nothing
    out = INDEX * ids + r * h * rows  # the ids; the sum with the positions
    if spec.embedding_norm:  # layernorm_embedding's statistics, the dropout and its output
        p = spec.dropouts[0]
        out += rows * stats_bytes(setup, st) + dropped(setup, p, r) * h * rows + (0 if st.autocast else r * h * rows)
    else:
        out += dropped(setup, spec.dropouts[0], r) * h * rows
    if f.embeds == "conv":
        frames = spec.encdec.mel_frames(n)
        out += a * b * h * (2 * frames + n)  # conv1's output (kept by its GELU), the GELU's (conv2's), conv2's
        if st.autocast:
            out += a * b * spec.encdec.mel_bins * frames + a * 3 * h * (spec.encdec.mel_bins + h)
    return out


def final_saved(spec: ModelSpec, setup: Setup, st: StateBytes, decoder: bool) -> float:
    """A stack's final layer_norm (Whisper): its statistics and output; 0 without one (BART)."""
    if not spec.final_norm:
        return 0.0
    rows = setup.batch * (setup.target_tokens if decoder else setup.seq)
    return norm_saved(setup, st, rows, spec.hidden)


def logits_extra(spec: ModelSpec, setup: Setup, st: StateBytes) -> float:
    """BART's biased logits beside the logits at the forward's end (module docstring); 0 for Whisper."""
    if spec.family not in LOGITS_BIAS:
        return 0.0
    return setup.batch * setup.target_tokens * spec.vocab * st.residual


def held_per_stack(spec: ModelSpec, setup: Setup, st: StateBytes, decoder: bool) -> float:
    """Under full recomputation, a stack's checkpoint inputs beyond each block's hidden states: the decoder's
    encoder output (the model's dtype) and, BART, its causal mask (b, 1, t, t) bool."""
    if not decoder:
        return 0.0
    t = setup.target_tokens
    mask = setup.batch * t * t * (1 if fe.front_end(spec, True).causal_mask else 0)
    return setup.batch * setup.seq * spec.hidden * st.residual + mask


def block_params(spec: ModelSpec, decoder: bool) -> float:
    """A block's parameters: its linears with their biases (encdec_frontends.block_linears), a LayerNorm (weight and
    bias) per sublayer."""
    return sum(fe.block_linears(spec, decoder)) + (3 if decoder else 2) * 2 * spec.hidden


def block_moments(spec: ModelSpec, setup: Setup, st: StateBytes, decoder: bool, first: bool) -> list[Moment]:
    """A block's backward high points beside its saved tensors, in its MLP, whose backward runs first, with the
    incoming gradient (the model's dtype):
    (a) fc2's backward: the residual dropout's input gradient (h wide) and fc2's input gradient (MLP wide) beside
        fc2's weight gradient;
    (b) GELU's backward: its input gradient beside fc2's input gradient (or the activation dropout's), fc2's input
        and the activation dropout's noise freed with their backward.
    Under full recomputation the re-run forward's saved set is live beside them."""
    h, a, r = spec.hidden, st.act, st.residual
    f = fe.mlp_width(spec, decoder)
    rows = setup.batch * (setup.target_tokens if decoder else setup.seq)
    rerun = block_saved(spec, setup, st, decoder) if setup.recompute == "full" else 0.0
    incoming = r * h * rows
    fc2 = h * f + h
    # accumulating (--grad-accum > 1), fc2's fresh weight and bias gradients are live beside the .grad they are
    # added to in place (AccumulateGrad), until its backward has returned them
    fresh = fc2 * st.grad if setup.grad_accum > 1 else 0
    down = Moment(rerun + incoming + a * h * rows + a * f * rows + fresh, fc2)
    act_freed = (a + dropped(setup, activation_dropout(spec), a)) * f * rows
    gelu = Moment(rerun + incoming + 2 * a * f * rows, fc2, act_freed)
    if not (decoder and first):
        return [down, gelu]
    # the decoder's embedding backward, its first block's done: the block's gradient in, its saved tensors freed
    # (under full recomputation its checkpoint inputs kept: NB over by the encoder's output), the table's partial
    own = 0.0 if setup.recompute == "full" else block_saved(spec, setup, st, decoder)
    table = Moment(incoming + table_partials(spec, st, True) * st.grad, block_params(spec, decoder), own)
    return [down, gelu, table]


def table_partials(spec: ModelSpec, st: StateBytes, decoder: bool) -> float:
    """Elements of the token table's gradient its Embedding's backward makes beside the gradients already there
    (embedding_dense_backward's (vocab, h) output), in the decoder's and then the encoder's backward (BART's
    `shared`; Whisper's encoder has no table: 0). Tied to lm_head, the decoder's is summed into the head's partial
    as memory.py's tied_partials says: in place under autocast (one partial), out of place without (both and their
    sum: two beside the head's); that sum, a fresh tensor, takes the encoder's partial in place (one)."""
    table = spec.vocab * spec.hidden
    if not decoder:
        return table if spec.encdec.shared_embedding and not spec.encdec.mel_bins else 0
    return (2 if spec.tied_embeddings and not st.autocast else 1) * table
