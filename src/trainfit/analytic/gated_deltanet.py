"""Qwen3-Next's Gated DeltaNet linear-attention layers (GatedDeltaNetSpec) as transformers runs them without
flash-linear-attention and causal-conv1d: the torch fallbacks of models/qwen3_next/modeling_qwen3_next.py
(Qwen3NextGatedDeltaNet.forward :660-769, causal_conv1d_fn :340-361, torch_chunk_gated_delta_rule :371-510,
torch_recurrent_gated_delta_rule :513-580 for a one-token step, Qwen3NextRMSNormGated :59-75). Line numbers are
those of the installed transformers 5.24.

The layer: in_proj_qkvz and in_proj_ba (:687-688), q, k, v joined (:692) and run through a depthwise causal conv1d
of conv_kernel taps and SiLU (:717-723), b -> beta = sigmoid (:744), a -> the decay g = -exp(A_log) * softplus(a +
dt_bias) in fp32 (:746), the chunked gated delta rule in fp32 over chunks of CHUNK tokens, the gated RMSNorm over
value_head_dim (:764-766) and out_proj (:769). In inference each sequence keeps a conv state and an fp32 recurrent
state per linear layer (cache_utils.py LinearAttentionLayer: the conv state (conv_dim, conv_kernel) in the
projection's dtype, :1226-1230; the recurrent state (value_heads, key_head_dim, value_head_dim), the rule's fp32).
"""
from __future__ import annotations

from ..setup import Setup
from ..spec import ModelSpec
from .precision import state_bytes

FP32 = 4
CHUNK = 64  # torch_chunk_gated_delta_rule's chunk_size (:377), which the layer leaves at its default (:752-761)


def linear_layers(spec: ModelSpec) -> int:
    """How many layers are Gated DeltaNet layers (0: none)."""
    return spec.linear_attn.layers if spec.linear_attn is not None else 0


def attention_layers(spec: ModelSpec) -> int:
    """How many layers run softmax attention and cache k and v (the others keep a linear layer's state)."""
    return spec.layers - linear_layers(spec)


def padded(seq: int) -> int:
    """The chunked rule pads the sequence to a multiple of CHUNK (:414-416)."""
    return -(-seq // CHUNK) * CHUNK


def state_per_sequence(spec: ModelSpec, act: int) -> float:
    """One linear layer's cache per sequence: the conv state (conv_dim x conv_kernel, in the conv input's dtype `act`)
    and the fp32 recurrent state (value_heads x key_head_dim x value_head_dim)."""
    g = spec.linear_attn
    return act * g.conv_dim * g.conv_kernel + FP32 * g.value_heads * g.key_head_dim * g.value_head_dim


def saved_terms(spec: ModelSpec, setup: Setup) -> dict[str, float]:
    """Per token, what one Gated DeltaNet layer saves for backward beyond its input (the input norm's output, which
    the layer's linear-input term counts), grouped by where it is made. Read off the saved tensors of real CPU steps
    (torch.autograd.graph.saved_tensors_hooks) and matched to the code:
      conv: the conv1d's input (b, conv_dim, s) and SiLU's input, the conv output with its conv_kernel - 1 padded
        positions (F.conv1d padding=K-1, sliced after, :349-356), both in the activation dtype;
      gates: sigmoid's output beta (activation dtype); softplus's fp32 input and output, which the decay's product
        keeps (:746);
      rule, per head and token, all fp32 (:400-507): l2norm's fp32 q and k and their rsqrt, beta, v; the key-width
        tensors the products and matmuls keep (k_beta, the scaled query, the normalised key, the UT solve's k_cumdecay,
        the decayed query and key of the chunk scan) — 8 of them; in fp32 the `.to(torch.float32,
        memory_format=torch.contiguous_format)` of (:405-408) aliases its transposed input (a 4-D tensor whose
        suggested memory format is contiguous), so q and k stay strided and the matmuls save 3 contiguous copies
        more — 11; the value-width ones: v, the solve's new_values and each chunk's v_new; five (chunk x chunk)
        fp32 tensors per chunk (the pairwise decays after exp, the two products with them, the triangular system
        the solve keeps, the intra-chunk attention the scan's matmul keeps); three exp'd cumulative decays;
      state: the recurrent state entering each chunk (the scan's matmul keeps it), per sequence and chunk;
      norm: Qwen3NextRMSNormGated (:66-75): the fp32 input, the normalised input in the activation dtype and its
        weighted copy (fp32 where the weight is, under autocast), the fp32 SiLU input (z) and output; an fp32 rsqrt
        per head;
      out_proj: its input (value_dim, activation dtype).
    Under autocast (`_autocast_rule`) the rule's matmuls save 16-bit casts of their operands in place of fp32
    tensors.
    NB: the sequence is taken as a multiple of CHUNK: a padded one (F.pad, :414-416) is priced at its padded length
    for the per-chunk tensors (an approximation at other lengths)."""
    g = spec.linear_attn
    a = state_bytes(setup).act
    s, sp = setup.seq, padded(setup.seq)
    nv, dk, dv = g.value_heads, g.key_head_dim, g.value_head_dim
    pad_share = sp / s  # the chunked tensors' padded length per real token
    st = state_bytes(setup)
    if st.autocast:
        rule, state = _autocast_rule(spec, a, sp)
    else:
        key_copies = 11 if a == FP32 else 8
        rule = FP32 * nv * (key_copies * dk + 3 * dv + 5 * CHUNK + 6)
        state = FP32 * nv * dk * dv * (sp // CHUNK)
    weighted = a if int(st.weight) == a else FP32  # the norm's weight times its normalised input
    return {
        "conv": a * g.conv_dim * (2 + (g.conv_kernel - 1) / s),
        "gates": a * nv + 2 * FP32 * nv,
        "rule": rule * pad_share,
        "state": state / s,
        "norm": (3 * FP32 + a + weighted) * g.value_dim + FP32 * nv,
        "out_proj": a * g.value_dim,
    }


def _autocast_rule(spec: ModelSpec, a: int, padded_seq: int) -> tuple[float, float]:
    """(per padded token, per sequence) what the chunked rule saves under autocast, where matmul and bmm run in the
    16-bit dtype `a` (autocast's lower-precision list, CPU's and CUDA's alike) and save casts of their operands
    (read off real CPU steps under torch.autocast, equal to their saved_tensors_hooks count). fp32: l2norm's q and
    k and the normalised key, the chunked query and key the decays multiply, the solve's k_cumdecay (6 key-wide);
    v and new_values (2 value-wide); the pairwise decays and the triangular system (2 chunk-wide); three decays,
    two rsqrt and beta; per sequence the state entering each chunk (the decay product keeps it). 16-bit: the two
    chunk-wide products' matmul outputs (:446-447) and each chunk's intra-chunk attention cast (:493); v_new cast
    twice per chunk (2 value-wide); k_beta, the query and the key's transpose cast for the two (chunk x chunk)
    matmuls (4 key-wide), each chunk's decayed key (:496; 1), and the query and k_cumdecay of every chunk but the
    first (:491-492: the first reads the zero state, which needs no gradient, so those matmuls keep no left operand);
    per sequence the two casts of the state each chunk reads. The last chunk's state update (:497) feeds only the
    final state, which the layer drops (:500, output_final_state False in training): its graph is freed at the end
    of the forward with what it saved — its key and v_new casts and the fp32 state its decay product keeps."""
    g = spec.linear_attn
    nv, dk, dv = g.value_heads, g.key_head_dim, g.value_head_dim
    chunks = padded_seq // CHUNK
    fp32 = FP32 * nv * (6 * dk + 2 * dv + 2 * CHUNK + 6)
    low = a * nv * (3 * CHUNK + (2 * chunks - 1) / chunks * dv + 4 * dk + 3 * dk * (chunks - 1) / chunks)
    state = (FP32 * (chunks - 1) + 2 * a * chunks) * nv * dk * dv
    return fp32 + low, state


def saved_per_token(spec: ModelSpec, setup: Setup) -> float:
    return sum(saved_terms(spec, setup).values())


def linear_params(spec: ModelSpec) -> int:
    """The weights of one linear layer's matmuls (what autocast casts and caches): in_proj_qkvz (2 key_dim + 2
    value_dim outputs), in_proj_ba (2 value_heads) and out_proj (:680-686). The conv1d's weight reaches F.conv1d
    through squeeze/unsqueeze views (:720, :352), not a leaf: cast per call, not cached."""
    g = spec.linear_attn
    return spec.hidden * (2 * g.key_dim + 2 * g.value_dim + 2 * g.value_heads) + g.value_dim * spec.hidden


def _projections_live(spec: ModelSpec, a: int) -> float:
    """Per token, what the layer's forward holds through its rule in a no-grad forward (read off traced prefills):
    in_proj_qkvz's and in_proj_ba's outputs (the locals projected_states_qkvz/_ba, :687-688, live to the end), the
    copies reshape makes of z, b and a (strided slices, :650-654), beta (:744), the conv + SiLU output whose views
    are q, k and v (:717-740), all in the activation dtype; the fp32 decay g (:746)."""
    g = spec.linear_attn
    return (a * (2 * g.key_dim + 2 * g.value_dim + 2 * g.value_heads + g.value_dim + 3 * g.value_heads + g.conv_dim)
            + FP32 * g.value_heads)


def prefill_live(spec: ModelSpec, setup: Setup, tokens: int) -> float:
    """A linear layer's high point in a no-grad forward of `tokens` tokens (batch x seq), beside the layer's input
    and the model's held tensors: the larger of two moments of the chunked rule (read off traced prefills of the
    families matrix's Qwen3-Next and tiny-qwen3-next, matched to the code). Live at both, besides the projections
    (_projections_live), all fp32: the rule's transposed beta and decay (:405-408); four value-width tensors (v,
    v_beta, the solve's new_values, the output core_attn_out, :476); three (chunk x chunk) per chunk (the pairwise
    decays, the UT system, the intra-chunk attention); the cumulative decays; the (chunk, chunk) boolean mask; then
      key decay (:484): the key decayed beside the normalised one, the decayed query, k_beta, the decayed k_beta
        and k_cumdecay (6 key-width), the exp'd decay difference, the zero initial state per sequence;
      scan (:489-497), at `inter_chunk_attn + intra_chunk_attn[:, :, i] @ v_new`: 5 key-width (the normalised key
        gone), per sequence the recurrent state, the chunk decays and the chunk's v_new, its state read, its
        intra-chunk product and their sum.
    The scan's moment is the higher where the value width is large beside the key width and the chunk.
    NB: exact at sequences that are multiples of CHUNK (against the trace: within 0.5 % of the prefill peak of the
    families matrix's Qwen3-Next at 2 x 128 and of tiny-qwen3-next at 2 x 256, fp32, bf16 and amp-bf16); a padded
    sequence (F.pad, :414-416) is under-counted: -0.8 % to -1.8 % of the prefill peak of the families matrix's
    Qwen3-Next at 1 x 200 (the padded copies' moment is not priced)."""
    g = spec.linear_attn
    a = state_bytes(setup).act
    batch = tokens // setup.seq
    chunks = padded(setup.seq) // CHUNK
    tp = batch * padded(setup.seq)  # the padded tokens
    nv, dk, dv = g.value_heads, g.key_head_dim, g.value_head_dim
    common = FP32 * nv * tp * (2 + 4 * dv + 3 * CHUNK + 1)
    key_decay = FP32 * nv * (tp * (6 * dk + 1) + batch * dk * dv)
    scan = FP32 * nv * (tp * 5 * dk + batch * (4 * CHUNK * dv + dk * dv + chunks))
    return _projections_live(spec, a) * tokens + common + max(key_decay, scan) + CHUNK * CHUNK


def decode_live(spec: ModelSpec, setup: Setup, batch: int) -> float:
    """A linear layer's high point in a one-token step (torch_recurrent_gated_delta_rule, :513-580, and
    causal_conv1d_update, :320-337): the projections' outputs as in the prefill, the fp32 q, k, v, beta and decay,
    and three recurrent states per sequence (the decayed state, the product with k_t and the updated state).
    NB: read off the code, not a trace (the decode step's peak is the logits' and the cache's, far above it)."""
    g = spec.linear_attn
    a = state_bytes(setup).act
    nv = g.value_heads
    per_token = _projections_live(spec, a) + FP32 * nv * (2 * g.key_head_dim + g.value_head_dim + 2)
    return (per_token + 3 * FP32 * nv * g.key_head_dim * g.value_head_dim) * batch


def conv_params(spec: ModelSpec) -> int:
    """The depthwise conv1d's weight (conv_dim x conv_kernel, no bias: :670-677); under autocast F.conv1d casts it
    per call and keeps the cast for its backward."""
    return spec.linear_attn.conv_dim * spec.linear_attn.conv_kernel


def rule_flops_per_token(spec: ModelSpec, seq: int) -> float:
    """Forward matmul FLOPs of one layer's chunked rule per token (2 per multiply-add, as flops.py), at the padded
    length: per head the two (chunk x chunk) products over key_head_dim (:459-460), the two unitriangular solves
    (chunk^2 / 2 multiply-adds per right-hand column, :470-471: key and value widths), and per chunk the scan's
    k_cumdecay and query reads of the state and its update (key x value each) and the intra-chunk product (chunk x
    value) (:493-500). NB: the depthwise conv, the l2 norms and the decays are elementwise, left out as flops.py
    leaves out norms (the conv's 2 x conv_kernel FLOPs per channel and position too). The solves are counted here
    (real arithmetic: chunk^2 / 2 multiply-adds per column) where torch's flop counter (torch/utils/flop_counter.py,
    the trace's: no formula for aten.linalg_solve_triangular) leaves them out and counts the conv (aten.convolution).
    A real layer at tests/analytic/test_gated_deltanet.py's CONFIG, 2 x 128: torch counts 41,821,184 FLOPs, the op
    list's GEMMs (ops/gated_deltanet.py: the solves listed by their bytes, a memory-bound trsm) 41,418,752 plus the
    conv's 402,432; flops.py counts the GEMMs plus the solves' 3,145,728. At the families matrix's size (2 x 128,
    4 value heads of 32) the rule's 23.1 M here against the trace's 19.4 M are the same two terms: -4.2 M of solves,
    +0.5 M of conv."""
    g = spec.linear_attn
    dk, dv, c = g.key_head_dim, g.value_head_dim, CHUNK
    per_head = 4 * c * dk + c * (dk + dv) + 2 * (3 * dk * dv + c * dv)
    return g.value_heads * per_head * padded(seq) / seq
