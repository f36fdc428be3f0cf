"""The embedding front-end of each stack of an absolute-position encoder-decoder (BART, Whisper): what turns the
stack's input into its first block's input, what of it the stack's forward keeps through its blocks, its casts and
its FLOPs. Data (FRONT_ENDS, one row per family and stack, each with its transformers source) read by functions that
an inference or a training module can share (encdec_absolute.py reads them for inference).

T5's stacks have no such front-end beyond the shared embedding (its relative bias is encoder_decoder.py's). Versions:
transformers 5.24 models/bart/modeling_bart.py and models/whisper/modeling_whisper.py.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..setup import Setup
from ..spec import ModelSpec
from .activations import resolved_kernel
from .params import audio_frontend_params, linear
from .precision import StateBytes

INDEX = 8


@dataclass(frozen=True)
class FrontEnd:
    """What one stack's forward holds from its front-end through its blocks (the forward's locals):
    embeds: the token embeddings (`inputs_embeds`, (b, n, h) in the model's dtype), or "conv": Whisper's encoder's
      conv2 + GELU output (b, h, n) in the compute dtype, permuted;
    positions: the learned position embeddings' output kept as a local: "batch" (b, n, h), "one" (1, n, h), "" none
      (added and freed);
    position_ids: the int64 position ids kept: "batch" (b, n), "one" (n,), "" none;
    causal_mask: SDPA's (b, 1, n, n) bool mask, which create_causal_mask materialises when an attention_mask was
      passed (otherwise SDPA runs is_causal); under eager attention every decoder holds the additive (b, 1, n, n)
      mask in the model's dtype (masking_utils.py eager_mask)."""

    embeds: str = "tokens"
    positions: str = ""
    position_ids: str = ""
    causal_mask: bool = False


# (encoder, decoder) per family
FRONT_ENDS: dict[str, tuple[FrontEnd, FrontEnd]] = {
    # BartEncoder.forward (modeling_bart.py:517-523): inputs_embeds and embed_pos (BartLearnedPositionalEmbedding over
    # inputs_embeds[:, :, -1], position ids expanded to (b, n) :86-97) are locals through the layer loop;
    # BartDecoder.forward (:609-650): inputs_embeds, position_ids = arange(n) + cache_length (n,) and positions
    # (position_ids.unsqueeze(0): (1, n, h)) kept; attention_mask = torch.ones(b, n) passed to create_causal_mask,
    # which materialises the (b, 1, n, n) bool mask. scale_embedding (BartScaledWordEmbedding.forward :109-110: the
    # lookup times embed_scale) holds the scaled copy in the lookup's place: the same bytes
    "bart": (FrontEnd(positions="batch"), FrontEnd(positions="one", position_ids="one", causal_mask=True)),
    # WhisperEncoder.forward (modeling_whisper.py:617-623): inputs_embeds (conv2 + GELU, permuted) and all_positions
    # (arange over the table: (n,) int64) kept, the table's rows added and freed; WhisperDecoder.forward (:777-795):
    # inputs_embeds, position_ids (arange(n).unsqueeze(0).repeat(b, 1): (b, n)) and positions (weight[position_ids]:
    # (b, n, h)) kept; no attention_mask: create_causal_mask leaves SDPA its is_causal (no mask tensor). Its
    # embed_scale (:569, :672) is set but never applied
    "whisper": (FrontEnd(embeds="conv", position_ids="one"),
                FrontEnd(positions="batch", position_ids="batch")),
}


def eager(spec: ModelSpec, setup: Setup) -> bool:
    """Whether the model runs transformers' eager attention (--attention eager; step/build.py hf_attn_implementation)
    rather than SDPA."""
    return resolved_kernel(spec, setup) == "eager"


def front_end(spec: ModelSpec, decoder: bool) -> FrontEnd:
    return FRONT_ENDS[spec.family][1 if decoder else 0]


def held(spec: ModelSpec, setup: Setup, st: StateBytes, decoder: bool, tokens: int) -> int:
    """Bytes a stack's front-end leaves held through its blocks over `tokens` positions per sequence (FrontEnd); the
    lookups are in the model's dtype (StateBytes.residual: the parameters' fp32 under autocast, the 16-bit dtype
    otherwise, also beside quantised linears)."""
    fe, b, h = front_end(spec, decoder), setup.batch, spec.hidden
    rows = {"batch": b * tokens, "one": tokens, "": 0}
    embeds = b * tokens * h * (st.act if fe.embeds == "conv" else st.residual)
    return (embeds + rows[fe.positions] * h * st.residual + rows[fe.position_ids] * INDEX
            + b * tokens * tokens * mask_bytes(spec, setup, st, decoder))


def mask_bytes(spec: ModelSpec, setup: Setup, st: StateBytes, decoder: bool) -> int:
    """Bytes per (query, key) pair of the stack's materialised causal mask (FrontEnd.causal_mask); 0 for none."""
    if decoder and eager(spec, setup):
        return st.residual
    return 1 if front_end(spec, decoder).causal_mask else 0


def encoder_input(spec: ModelSpec, setup: Setup, st: StateBytes) -> int:
    """The encoder's input (an input of the step): input_ids (b, --seq) int64, or Whisper's input_features (b,
    mel_bins, EncoderDecoderSpec.mel_frames(--seq)) in the model's dtype (step/build.py encoder_inputs)."""
    e = spec.encdec
    if e.mel_bins:
        return setup.batch * e.mel_bins * e.mel_frames(setup.seq) * st.residual
    return INDEX * setup.batch * setup.seq


def conv_moment(spec: ModelSpec, setup: Setup, st: StateBytes) -> int:
    """Whisper's audio front-end high point (WhisperEncoder.forward :617-618, inputs_embeds = gelu(conv1(x)) then
    gelu(conv2(...))), beside the input and the convolutions' casts: at conv1's GELU its output and conv1's (b, h,
    2n); at conv2's GELU the first GELU's output (the local is rebound after the call), conv2's output and its GELU's
    (b, h, n) each; both 4 x b x h x n in the compute dtype. Under autocast conv1's 16-bit cast of the input is freed
    once conv1 has run. 0 for a token encoder."""
    e = spec.encdec
    if not e.mel_bins:
        return 0
    frames = e.mel_frames(setup.seq)
    return int(2 * setup.batch * spec.hidden * frames * st.act)


def conv_casts(spec: ModelSpec) -> int:
    """Elements autocast casts (and caches) for the audio front-end: conv1's and conv2's weights and biases
    (conv1d is on autocast's lower-precision list); 0 for a token encoder."""
    return audio_frontend_params(spec)


def conv_flops(spec: ModelSpec, setup: Setup) -> float:
    """The audio front-end's FLOPs, 2 per multiply-add over the batch: conv1 (mel_bins -> h, kernel 3) at every mel
    frame, conv2 (h -> h, kernel 3, stride 2) at every encoder position (torch's conv flop formula: output positions
    x out x in x kernel); 0 for a token encoder."""
    e = spec.encdec
    if not e.mel_bins:
        return 0
    h, b = spec.hidden, setup.batch
    return 2 * b * e.mel_frames(setup.seq) * h * e.mel_bins * 3 + 2 * b * setup.seq * h * h * 3


def block_linears(spec: ModelSpec, decoder: bool) -> tuple[int, int, int]:
    """Elements of one block's linears, (attention, fc1, fc2), weights and biases: q/k/v/out_proj d_model x d_model
    (BartAttention / WhisperAttention: embed_dim -> embed_dim whatever the head count; Whisper's k_proj has no bias,
    modeling_whisper.py:281), twice in a decoder block (its encoder_attn), fc1 d_model -> ffn and fc2 back, biased
    (BartEncoderLayer :276-277, WhisperEncoderLayer :379-380)."""
    e, h = spec.encdec, spec.hidden
    f = e.decoder_intermediate if decoder and e.decoder_intermediate else spec.intermediate
    attention = 3 * linear(h, h, spec.qkv_bias) + linear(h, h, spec.out_bias) - (0 if e.k_bias else h)
    return (2 if decoder else 1) * attention, linear(h, f, spec.mlp_bias), linear(f, h, spec.mlp_bias)


def mlp_width(spec: ModelSpec, decoder: bool) -> int:
    """The stack's fc1 width (encoder_ffn_dim, decoder_ffn_dim)."""
    e = spec.encdec
    return e.decoder_intermediate if decoder and e.decoder_intermediate else spec.intermediate
