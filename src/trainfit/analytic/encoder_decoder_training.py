"""Training memory of T5 / Flan-T5 / mT5 (spec.encdec; transformers models/t5/modeling_t5.py
T5ForConditionalGeneration): both stacks' saved tensors, block by block, combined by phases.peak. BART's and
Whisper's steps are combined here the same way from encdec_absolute_training.py's terms (their blocks, front-ends,
the tied table's partials; train_memory, stack_terms).

The step: the encoder over --seq tokens, the decoder over --target-seq tokens (its cross-attention's K and V
projected from the encoder's output in every block), lm_head (tied to `shared`) over every target position and
CrossEntropyLoss on the raw logits (modeling_t5.py:1036-1057). Each block is a phases.LayerKind, in the order the
forward runs them (the encoder's, then the decoder's; the backward runs them in reverse); the encoder's first block
and the decoder's first block carry what each stack's first block adds (the relative bias's bucket indices) and,
for the decoder, what lives until its backward is done (the encoder's final norm and output, its own embeddings).

What one block saves (read op by op off modeling_t5.py and the trace's saved tensors, module by module):
  T5LayerNorm (:51-73)   pow and the multiply keep the input (the residual stream: counted where it is made) or,
                         16-bit, its fp32 copy beside it; rsqrt(variance) fp32; x * rsqrt fp32, or its 16-bit cast
                         (weight * keeps it); the output, which the next linears keep (not under autocast: their
                         casts are kept instead);
  attention (:283-372)   SDPA with the relative bias as a float mask (integrations/sdpa_attention.py
                         create_position_bias_mask :54-91). A CPU runs the math path, which upcasts q, k and v to
                         fp32 and keeps them, the fp32 softmax output, the fp32 dropout noise and the dropped
                         probabilities (dropout_rate on the probabilities), its output cast back (o's input). CUDA
                         runs the memory-efficient kernel (the flash kernel takes no mask; trace/cuda_masked_sdpa.py),
                         which keeps q, k, v and its output in the compute dtype, an fp32 logsumexp, its dropout's
                         RNG seed and offset (no mask) and the bias: each self-attention its contiguous (or autocast)
                         copy of the stack's relative bias, the cross-attentions the zero bias the decoder's first
                         block makes (attention_core). The decoder's self-attention keeps the causal
                         mask (q, k) bool of the torch.where; the first block of a stack keeps the bucket indices
                         (q, k) int64 its relative_attention_bias Embedding saves (compute_bias :265-281);
  MLP (:76-125)          T5DenseGatedActDense: wi_0's output (gelu_new's input, or its fp32 copy where CUDA autocast
                         runs pow in fp32: encoder_decoder.fp32_gelu), gelu_new's tanh, 1 + tanh, 0.5 * x and its
                         output (transformers activations.py NewGELUActivation), wi_1's output, the dropout's noise
                         or mask, wo's input (under autocast, the cast of the `.to(wo.weight.dtype)` fp32 copy);
                         T5DenseActDense with relu: relu's output in place of the gated terms;
  each sublayer          the dropout's noise (CPU) or 1-byte mask (CUDA) on its output (activations.
                         dropout_mask_bytes) and the residual add's output (the next norm's input);
  autocast               each linear's input cast and its cached weight cast (q, k, v, o; the cross-attention's k
                         and v cast the encoder's output in every block; wi_0, wi_1, wo; lm_head).
Each stack adds its embedding's dropout (noise and output) and its final norm and dropout; the head adds lm_head's
casts (autocast), the saved log-softmax (fp32 under autocast and in fp32, else the logits' dtype: no upcast, the
loss reads lm_logits as they are) and the decoder's ids (_shift_right's int64 copy of the labels shifted, :1031).

Full recomputation (gradient checkpointing: T5Block is a GradientCheckpointingLayer, :439, called per block in
T5Stack.forward :728-743 between the embeddings' dropout :726 and the final norm :745): each block keeps its input (and on a CPU the generator's state, recompute.
CPU_RNG_STATE); each stack keeps its relative bias (1, heads, q, k), the decoder also the encoder's output and
the cross-attention's zero bias (T5Attention.forward :340-346), all checkpoint inputs; in its backward a block runs
its forward again: its whole saved set is live again beside the incoming gradient and the backward's own
temporaries, and a stack's first block its forward's high point again (rerun_forward_moment). The zero bias is a
leaf that requires grad there (:345-346): autograd's AccumulateGrad keeps it and its .grad, summed over the
cross-attentions, as long as the step's graph (the loss) lives, through the optimizer step (zero_bias_leaf).
The forward's own high points (forward_moment: each stack's relative bias, held through its blocks and kept by none,
its first block's bucketing, its self-attention's mask copies) are moments too without recomputation: a long input
or target over few heads puts the peak there (tiny-t5 at 1024 + 128 tokens). Under full recomputation a block keeps
nothing of its own in the forward, and its high points are checkpointed_forward_moment's: a stack's first block's
bucketing, its last block's mask copies or SDPA call, beside the checkpoint inputs so far, the stack's input
embeddings and, under autocast, the weight casts cached so far; the forward's end holds all those casts too, and
of the zero-bias leaf not yet its .grad (train_memory). Without these (each block's forward counted only as its
checkpoint inputs) the forward phase of tiny-t5 at 1024 + 128 tokens, amp-bf16 on CUDA, read 23.78 MiB against
the trace's 53.56 MiB (-55.6 %).
"""
from __future__ import annotations

import sys

from ..errors import NotModelledError
from ..setup import Setup
from ..spec import ModelSpec
from .activations import FP32, INDEX, dropout_mask_bytes
from .encdec_frontends import encoder_input
from .encoder_decoder import absolute, bucket_live, fp32_gelu, inner, stack_casts
from .optimizer import PAGED, optimizer_temporaries, state_bytes_unsharded
from .params import ParamCounts, relative_bias_params
from .parallel.zero import model_states, params_at_rest
from .backward import Moment
from .phases import LayerKind, Pattern, StepBytes, peak, whole
from .precision import StateBytes, state_bytes
from .recompute import CPU_RNG_STATE


def check_trainable(spec: ModelSpec, setup: Setup) -> None:
    """Refuse, in one line each, the training setups of T5 / mT5, BART and Whisper whose terms are not derived
    here."""
    why = None
    if setup.tp > 1 or setup.pp > 1 or setup.cp > 1:
        why = "--tp/--pp/--cp (the two stacks' split is not modelled)"
    elif setup.zero or setup.dp > 1:
        why = "data parallelism or ZeRO/FSDP (the step's buffers and shards over two stacks)"
    elif setup.lora_rank or setup.quant:
        why = "--lora or --quant"
    elif setup.compile or setup.offload != "none" or setup.optimizer_in_backward or setup.optimizer in PAGED:
        why = "--compile, --offload, --optimizer-in-backward or a paged optimizer"
    elif setup.precision not in ("fp32", "bf16", "amp-bf16", "bf16-master"):
        # fp16 keeps wo in fp32 (_keep_in_fp32_modules, modeling_t5.py:542) and clamps each sublayer's output
        why = f"--precision {setup.precision} (fp32, bf16, amp-bf16 and bf16-master are modelled)"
    elif setup.recompute not in ("none", "full"):
        why = f"--recompute {setup.recompute} (none and full are modelled)"
    elif setup.loss != "full" or setup.attention not in ("auto", "sdpa"):
        # (the seq2seq head is the hf stack's only: heads.py refuses the others)
        why = "a loss or attention kernel other than transformers' own (SDPA)"
    elif absolute(spec) is None and not ((spec.gated_mlp and spec.activation == "gelu_new")
                                         or (not spec.gated_mlp and spec.activation == "relu")):
        why = f"a {spec.activation} MLP (gated gelu_new and relu are modelled)"
    elif absolute(spec) is not None and (spec.gated_mlp or spec.activation != "gelu"):
        # nn.functional.gelu keeps its input only (encdec_absolute_training.mlp_saved)
        why = f"a {spec.activation} MLP (BART's and Whisper's gelu is modelled)"
    elif spec.task_head != "seq2seq-lm":
        why = f"the {spec.task_head} head"
    if why:
        raise NotModelledError(f"{spec.name}: training an encoder-decoder under {why} is not modelled by the analytic "
                               "engine; use --engine trace")


def norm_saved(st: StateBytes, rows: int, h: int, final: bool = False) -> float:
    """T5LayerNorm (modeling_t5.py:60-73) over `rows` tokens, what it saves beyond its input: rsqrt (fp32, one per
    row), x * rsqrt (fp32; its 16-bit cast where the weight is 16-bit, beside the input's fp32 copy that pow keeps)
    and, but for a stack's final norm (its output goes to dropout, which keeps none of it) or under autocast (the
    linears keep their casts), the output the next linears keep, in the weight's dtype."""
    out = 0 if (final or st.autocast) else st.weight
    if st.residual == FP32:  # `.to(torch.float32)` is the input itself
        return rows * (FP32 + FP32 * h + out * h)
    return rows * (FP32 + FP32 * h + st.weight * h + out * h)


def sublayer_saved(setup: Setup, st: StateBytes, rows: int, h: int) -> float:
    """What each sublayer (T5LayerSelfAttention, T5LayerCrossAttention, T5LayerFF :138-142, :403, :434) saves
    around its branch: its norm's tensors, the dropout's noise or mask on the branch's output (in the compute dtype)
    and the residual add's output, the next norm's input (in the residual stream's dtype)."""
    return norm_saved(st, rows, h) + dropout_mask_bytes(setup, st.act) * h * rows + st.residual * h * rows


def efficient_attention(spec: ModelSpec, setup: Setup, st: StateBytes) -> bool:
    """Whether the masked SDPA call runs CUDA's memory-efficient kernel (trace/cuda_masked_sdpa.py): on CUDA, with
    d_kv a multiple of the GEMM alignment, 128 bits of the compute dtype's elements, at least 4 (sdp_utils.cpp
    minimum_gemm_alignment, check_head_dim_size_mem_efficient); a CPU runs the math path."""
    return setup.device == "cuda" and spec.head_dim % max(4, 16 // st.act) == 0


def _padded_keys(k_len: int, multiple: int) -> int:
    """k_len rounded up to `multiple`."""
    return -(-k_len // multiple) * multiple


def attention_core(spec: ModelSpec, setup: Setup, st: StateBytes, q_len: int, k_len: int, heads: int = 0,
                   own_bias: bool = True) -> float:
    """What one SDPA call with the bias mask and dropout keeps, one batch (see the module docstring); `heads` the
    attention's own (BART's decoder may have others), spec.heads when 0.
    The math path (a CPU): fp32 q, k, v, the output in the compute dtype, and three fp32 (b, heads, q, k) tensors
    (softmax's output, the dropout's noise and the dropped probabilities).
    CUDA's memory-efficient kernel (meta__scaled_dot_product_efficient_attention, torch/_meta_registrations.py):
    q, k and v as the linears made them and the output (o's input: the kernel writes it (b, q, heads, d_kv), so
    sdpa_attention.py:195's transpose(1, 2).contiguous() copies nothing) in the compute dtype; the fp32 logsumexp
    (b, heads, q rounded up to 32); the philox seed and offset of its dropout (two int64 scalars, no mask; NB: the
    CUDA allocator rounds each to 512 B, under by 1,008 B a call); and, with `own_bias`, the bias this call made:
    create_position_bias_mask's contiguous copy (sdpa_attention.py:91: the permuted relative bias, or the decoder's
    torch.where with the causal mask) in the compute dtype (autocast's cast of the fp32 bias, SDPA being on its
    lower-precision list), (1, heads, q, k), padded to a multiple of 8 keys where k is not one (attention.cpp
    preprocess_mask, pad_bias). The cross-attention's zero bias is made once per stack in the query's dtype and
    is contiguous (modeling_t5.py:337-342): one copy, block_saved's first decoder block's, and a padded copy per
    call only where the keys are not a multiple of 8."""
    b, q, n = setup.batch, inner(spec), heads or spec.heads
    if not efficient_attention(spec, setup, st):
        return b * (FP32 * q * (q_len + 2 * k_len) + st.act * q * q_len + 3 * FP32 * n * q_len * k_len)
    pad = _padded_keys(k_len, 8)
    bias = n * q_len * pad * st.act if (own_bias or pad != k_len) else 0
    seeds = 2 * INDEX if spec.dropouts[1] > 0 else 0
    lse = FP32 * b * n * _padded_keys(q_len, 32)
    return b * st.act * q * (2 * q_len + 2 * k_len) + lse + bias + seeds


def attention_casts(spec: ModelSpec, st: StateBytes, q_rows: int, kv_rows: int) -> float:
    """Under autocast: q's, k's and v's input casts (k and v over `kv_rows`: the encoder's output for the
    cross-attention) and the four cached weight casts (autocast_mode.cpp cached_cast)."""
    if not st.autocast:
        return 0.0
    h, q = spec.hidden, inner(spec)
    return st.act * (h * (q_rows + 2 * kv_rows) + 4 * h * q)


def mlp_saved(spec: ModelSpec, setup: Setup, st: StateBytes, rows: int) -> float:
    """The MLP sub-block's saved tensors over `rows` tokens (module docstring)."""
    a, h, f = st.act, spec.hidden, spec.intermediate
    wide = FP32 if fp32_gelu(spec, setup, st) else a  # gelu_new's fp32 tensors under CUDA autocast
    if spec.gated_mlp:  # gelu_new: its input (or pow's fp32 copy), tanh, 1 + tanh, 0.5 * x (a), the output; wi_1's
        act = 4 * wide + a + a
    else:  # relu keeps its output (wi's output is not kept)
        act = a
    product = wide if spec.gated_mlp else a
    dropout = dropout_mask_bytes(setup, product)
    casts = 0.0
    if st.autocast:  # wi_0/wi_1 (wi) and wo: input and weight casts
        ups = 2 if spec.gated_mlp else 1
        casts = a * ups * (h * rows + h * f) + a * h * f
    return rows * f * (act + dropout + a) + casts


def block_saved(spec: ModelSpec, setup: Setup, st: StateBytes, decoder: bool, first: bool) -> float:
    """One block's saved tensors over one micro-batch (module docstring)."""
    h, b, s, t = spec.hidden, setup.batch, setup.seq, setup.target_tokens
    q_len = t if decoder else s
    rows = b * q_len
    out = (3 if decoder else 2) * sublayer_saved(setup, st, rows, h)
    out += attention_core(spec, setup, st, q_len, q_len) + attention_casts(spec, st, rows, rows)
    if decoder:
        out += q_len * q_len  # the causal mask, (q, k) bool
        out += attention_core(spec, setup, st, q_len, s, own_bias=False) + attention_casts(spec, st, rows, b * s)
        if first and efficient_attention(spec, setup, st):  # the cross-attention's zero bias, which the kernels keep
            out += spec.heads * q_len * s * st.act
    if first:
        out += INDEX * q_len * q_len  # the bucket indices the relative bias's Embedding keeps
    return out + mlp_saved(spec, setup, st, rows)


def stack_ends(spec: ModelSpec, setup: Setup, st: StateBytes, rows: int) -> tuple[float, float]:
    """(embedding's dropout, final norm + dropout) of a stack over `rows` tokens: the embedding's dropout noise and
    output (the first block's input; `shared` is in the weights' dtype), the final norm's saved tensors and its
    dropout's noise, and the dropout's output where a matmul keeps it as it is (the cross-attention's k and v, or
    lm_head; not under autocast, where their casts are kept). T5 v1.0's rescale of the decoder's output by
    d_model**-0.5 (scale_decoder_outputs, modeling_t5.py:1047-1048) multiplies by a number, which keeps nothing:
    lm_head keeps the scaled copy in place of the dropout's output, the same bytes."""
    h, w = spec.hidden, st.weight
    embedding = (dropout_mask_bytes(setup, w) + w) * h * rows
    final = norm_saved(st, rows, h, final=True) + dropout_mask_bytes(setup, w) * h * rows
    if not st.autocast:
        final += w * h * rows
    return embedding, final


def head_bytes(spec: ModelSpec, setup: Setup, st: StateBytes) -> tuple[float, float, float]:
    """(saved, forward transient, loss backward transient) of lm_head and the loss over the target tokens:
    saved, autocast's casts of lm_head's input and weight and the log-softmax output (CrossEntropyLoss on the raw
    logits, modeling_t5.py:1054-1057: fp32 where log_softmax runs in fp32 — autocast's fp32 list, or fp32 training
    — else the logits' dtype); at the forward's end the logits and, under autocast, log_softmax's fp32 copy of them;
    at the loss's backward the log-softmax output's gradient and the logits' (NB: as loss.py head_and_loss)."""
    a, h, v = st.act, spec.hidden, spec.vocab
    rows = setup.batch * setup.target_tokens
    loss = FP32 if (st.autocast or a == FP32) else a
    casts = a * (h * rows + v * h) if st.autocast else 0
    saved = casts + loss * v * rows
    logits = a * v * rows + (FP32 * v * rows if a != loss else 0)
    backward = max(2 * loss, loss + (a if a != loss else 0)) * v * rows
    return saved, logits, backward


def held_per_stack(spec: ModelSpec, setup: Setup, st: StateBytes, decoder: bool) -> float:
    """Under full recomputation, a stack's checkpoint inputs beyond each block's hidden states: its relative bias
    (1, heads, q, k) in the weights' dtype; the decoder's also the encoder's output (its cross-attention's zero bias,
    a leaf autograd keeps to the step's end: zero_bias_leaf)."""
    s, t = setup.seq, setup.target_tokens
    q_len = t if decoder else s
    out = spec.heads * q_len * q_len * st.weight
    if decoder:
        out += setup.batch * s * spec.hidden * st.weight
    return out


def zero_bias_leaf(spec: ModelSpec, setup: Setup, st: StateBytes) -> float:
    """Under full recomputation, the decoder's cross-attention zero bias (1, heads, t, s) in the query's dtype and
    its .grad: T5Attention.forward makes it a leaf that requires grad under gradient checkpointing (modeling_t5.py
    :340-346), so the graph's AccumulateGrad node keeps it and accumulates the cross-attentions' bias gradients in
    its .grad, both live as long as the graph (the loss) is, through the optimizer step (read off the trace of
    tiny-t5, 1024 + 128 tokens, amp-bf16 on CUDA: both live at the re-run encoder block 0's bucketing).
    Counted in the step's inputs; the forward's moments take off what is not made yet (train_memory: the zero bias
    from the decoder's first cross-attention on, the .grad in the backward). NB: the .grad is made at the decoder's
    last cross-attention's backward (over by one (heads, t, s) tensor at the head's backward moments and that
    block's MLP moments)."""
    return 2 * spec.heads * setup.target_tokens * setup.seq * st.act if setup.recompute == "full" else 0.0


def forward_moment(spec: ModelSpec, setup: Setup, st: StateBytes, decoder: bool, first: bool) -> float:
    """A block's forward high point, its saved tensors so far included (phases.LayerKind.forward; under full
    recomputation a first block's re-run, rerun_forward_moment): T5Stack.forward (modeling_t5.py:726-745) holds its
    input embeddings (inputs_embeds) and the relative bias its first block made (position_bias, (1, heads, q, k) in
    the weights' dtype: the Embedding keeps only its indices) as locals through every block, so a long input's stack
    carries (heads, q, q) tensors that no block saves. The largest of:
    - a first block at its relative bias's bucketing (encoder_decoder.bucket_live over the (q, k) pairs, the bucket
      indices kept among them), its norm, q, k, v and their casts made (under autocast beside the norm's output,
      normed_hidden_states :395 in the weights' dtype, which no linear keeps and the sublayer holds through the
      attention call; otherwise the linears keep it, norm_saved);
    - its self-attention at SDPA's mask (sdpa_attention.py create_position_bias_mask :54-91), beside the bias: at the
      mask's contiguous copy, the sublayer's norm, casts, q, k and v (and the decoder's torch.where output it
      copies, with its causal mask); then inside the SDPA call the sublayer's kept set (as attention_moment's: norm,
      core, casts, causal mask, bucket indices) and the copy where the core does not keep it (autocast keeps its
      16-bit cast; the math path, a CPU, keeps no mask, nor under autocast that cast);
    - its end: its whole saved set beside the bias (and, on the math path, the decoder's cross-attention zero bias,
      which no kernel keeps there, T5Attention.forward :335-342).
    NB: the CPU math path's own (b, heads, q, k) temporaries inside SDPA are not counted (under); nor the stack's
    final norm beside its last block's end (under, a few (rows, d_model) tensors)."""
    h, b, q = spec.hidden, setup.batch, inner(spec)
    q_len = setup.target_tokens if decoder else setup.seq
    rows, pairs = b * q_len, spec.heads * q_len * q_len
    efficient = efficient_attention(spec, setup, st)
    embeds = rows * h * st.weight
    bias = pairs * st.weight
    if decoder and not efficient:
        bias += spec.heads * q_len * setup.seq * st.act
    core = attention_core(spec, setup, st, q_len, q_len)
    normed = norm_saved(st, rows, h) + (rows * h * st.weight if st.autocast else 0)
    kept = normed + core + attention_casts(spec, st, rows, rows) + \
        (q_len * q_len if decoder else 0) + (INDEX * q_len * q_len if first else 0)
    copy = pairs * st.weight
    # at the contiguous copy, before SDPA's call (q, k and v made, nothing of the core's own yet), beside the
    # decoder's torch.where output; then inside the call, the copy beside what the core keeps where that is not the
    # copy itself (autocast's cast, or the math path's own tensors and, under autocast, its cast of the mask)
    at_copy = kept - core + 3 * rows * q * st.act + copy + (copy if decoder else 0)
    at_call = kept + (copy if st.autocast or not efficient else 0) + (pairs * st.act if st.autocast and not efficient
                                                                      else 0)
    moments = [bias + at_copy, bias + at_call, bias + block_saved(spec, setup, st, decoder, first)]
    if first:
        moments.append(normed + 3 * rows * q * st.act + attention_casts(spec, st, rows, rows)
                       + q_len * q_len * bucket_live(decoder))
    return embeds + max(moments)


def checkpointed_forward_moment(spec: ModelSpec, setup: Setup, st: StateBytes, decoder: bool, first: bool) -> float:
    """Under full recomputation, a block's forward high point beyond its kind's saved set (the checkpoint's inputs,
    train_memory) and what the step holds beside it (the blocks before it, the embeddings' dropout, the inputs).
    A checkpointed block keeps nothing of its own in the forward: non-reentrant checkpoint's pack hook stores an
    empty _Holder in place of each saved tensor (torch/utils/checkpoint.py:1155-1163) and the frame keeps only the
    block's inputs (new_frame.save_inputs :1698), so what the block makes lives only while the forward's locals refer
    to it. Live at the self-attention (T5LayerSelfAttention.forward, modeling_t5.py:395-403): the stack's input
    embeddings (inputs_embeds :683, a local of T5Stack.forward through every block), the sublayer's norm output
    (normed_hidden_states :395, in the weights' dtype, held through the attention call), q, k and v (:306, :327-328;
    the compute dtype) and, under autocast, the weight casts its cache holds (autocast_mode.cpp cached_cast: every
    linear's so far, to the autocast region's exit, torch/amp/autocast_mode.py:349). Beside them the largest of:
    - a first block at its relative bias's bucketing (compute_bias :265-281, encoder_decoder.bucket_live over the
      (q, k) pairs); the bias it is about to make (counted in its kind's saved set, held_per_stack) not yet made;
    - the additive mask at its contiguous copy (sdpa_attention.py create_position_bias_mask :54-91): the copy of the
      permuted bias, (1, heads, q, k) in the weights' dtype, and in the decoder the causal mask (q, k) bool (:76-79)
      and the torch.where output (:80) it copies;
    - inside SDPA's call (sdpa_attention.py:182), the copy passed in (the where and the causal mask freed) and
      autocast's 16-bit cast of it (SDPA is on autocast's lower-precision list); with CUDA's memory-efficient kernel
      (efficient_attention) the padded bias where the keys are not a multiple of 8 (attention.cpp preprocess_mask,
      pad_bias), its output (b, q, heads, d_kv) and fp32 logsumexp (b, heads, q rounded up to 32) (as
      attention_core); on the math path (a CPU: attention.cpp _scaled_dot_product_attention_math) at its dropout,
      q, k and v's fp32 copies (16-bit compute) and the scaled query, and three (b, heads, q, k) fp32 tensors:
      the softmax output, the dropout's noise and the dropped probabilities (read off the traces of tiny-t5, CUDA
      and CPU, every precision at 1024 + 128, 128 + 1024 and 512 + 512 tokens: to the byte on the CPU's, which a
      real CPU step matches, measure engine).
    The stack's other blocks are one kind, whose highest block is its last (the most checkpoint inputs before it):
    their autocast casts are counted as that block's, every block's but its own o and MLP (NB: over at the blocks
    before the last by the casts of those after them; never above the last's moment).
    NB: the kernel's philox seed and offset are not counted (under by 1 KiB); nor the cross-attention's and the
    MLP's moments (under where the decoder's (b, s, d_kv) keys or the MLP's (rows, d_ff) temporaries outweigh the
    self-attention's (heads, q, k) tensors: short sequences, where the forward's end, the logits, is higher at the
    sizes traced)."""
    h, b, q, a, w = spec.hidden, setup.batch, inner(spec), st.act, st.weight
    q_len = setup.target_tokens if decoder else setup.seq
    rows, pairs = b * q_len, spec.heads * q_len * q_len
    attention, mlp = 4 * h * q, (3 if spec.gated_mlp else 2) * h * spec.intermediate
    if first:  # the casts made before this block's q, k and v: none, or the whole encoder's
        before = stack_casts(spec, False) if decoder else 0
    else:  # (the stack's last block) every cast but its own
        before = stack_casts(spec, decoder) - (2 * attention if decoder else attention) - mlp
    casts = a * (before + 3 * h * q) if st.autocast else 0
    live = 2 * rows * h * w + 3 * rows * q * a + casts  # the embeddings, the norm's output, q, k, v, the casts
    copy = pairs * w
    at_copy = copy + (copy + q_len * q_len if decoder else 0)  # (the decoder's torch.where output, causal mask)
    cast = pairs * a if st.autocast else 0
    if efficient_attention(spec, setup, st):
        pad = _padded_keys(q_len, 8)
        padded = spec.heads * q_len * pad * a if pad != q_len else 0
        call = cast + padded + rows * q * a + FP32 * b * spec.heads * _padded_keys(q_len, 32)
    else:
        call = cast + FP32 * rows * q * (4 if a != FP32 else 1) + 3 * FP32 * b * pairs
    moments = [at_copy, copy + call]
    if first:
        moments.append(q_len * q_len * bucket_live(decoder) - pairs * w)
    return live + max(moments)


def block_moments(spec: ModelSpec, setup: Setup, st: StateBytes, decoder: bool, first: bool) -> list[Moment]:
    """A block's backward high points beside its saved tensors (backward.Moment), both in its MLP, whose backward
    runs first (modeling_t5.py:107-125, T5LayerFF :138-142), with the incoming gradient (the residual stream's):
    (a) wo's backward: the sublayer dropout's input gradient (h wide) and wo's input gradient (MLP wide) beside wo's
        weight gradient; the block's output (the next norm's input, whose backward has run) and the sublayer
        dropout's noise freed;
    (b) the gated product's backward (the product rule, backward.py _mlp_intermediates): the product's gradient and
        the two it makes (gelu_new's output's, wi_1's), wo's input and the MLP dropout's noise freed with their
        backward.
    Under full recomputation the re-run forward's saved set is live beside them (and a first block's re-computed
    relative bias, (1, heads, q, k) in the weights' dtype), at (a) nothing of it freed yet (read off the trace: the
    re-run encoder block 0 at (a), fp32 on CPU, to the byte but the loss's 4), at (b) wo's input and the noise.
    On CUDA a third, the self-attention kernel's backward (attention_moment). NB: on a CPU the math path's
    (b, heads, q, k) gradients come later and are smaller at these sizes."""
    h, f, a, r = spec.hidden, spec.intermediate, st.act, st.residual
    q_len = setup.target_tokens if decoder else setup.seq
    rows = setup.batch * q_len
    wide = FP32 if fp32_gelu(spec, setup, st) else a
    product = wide if spec.gated_mlp else a
    full = setup.recompute == "full"
    rerun = 0.0
    if full:
        rerun = block_saved(spec, setup, st, decoder, first) + (spec.heads * q_len * q_len * st.weight if first else 0)
    incoming = r * h * rows
    out_freed = 0.0 if full else (r + dropout_mask_bytes(setup, a)) * h * rows
    wo = h * f
    down = Moment(rerun + incoming + a * h * rows + a * f * rows, wo, out_freed)
    gated = (product + wide + a) * f * rows if spec.gated_mlp else product * f * rows
    mlp_freed = (a + dropout_mask_bytes(setup, product)) * f * rows
    # (under full recomputation wo's input and the noise freed are the re-run's: backward.layer_moments)
    rule = Moment(rerun + incoming + gated - (mlp_freed if full else 0), wo, out_freed + (0 if full else mlp_freed))
    moments = [down, rule]
    if full and first:
        moments.append(rerun_forward_moment(spec, setup, st, decoder))
    if efficient_attention(spec, setup, st):
        moments.append(attention_moment(spec, setup, st, decoder, first))
    if decoder and first and not full:
        moments.append(decoder_embedding_moment(spec, setup, st))
    return moments


def rerun_forward_moment(spec: ModelSpec, setup: Setup, st: StateBytes, decoder: bool) -> Moment:
    """Under full recomputation, a stack's first block's re-run forward at its own high point (forward_moment's:
    the relative bias's bucketing, or the self-attention's mask copies beside the bias it makes again). The first
    unpack of a checkpointed block's saved tensor re-runs its whole forward (torch/utils/checkpoint.py unpack_hook
    :1165-1185, frame.recompute_fn; early stop :1128-1131 comes after the attention's saved tensors), and the first
    block makes the relative bias again (modeling_t5.py:347-350, compute_bias :265-281) with its (q, k) int64
    bucketing. Beside it the incoming gradient (the residual stream's) and the gradient of the stack's relative bias,
    (1, heads, q, k) in the weights' dtype, that the blocks after it accumulated (the bias is the first block's
    output, T5Stack.forward :728-743); the held relative bias (a checkpoint input of those blocks) freed with their
    backward (read off the trace of tiny-t5, 1024 + 128 tokens, amp-bf16 on CUDA: the peak at the re-run encoder
    block 0's bucketing, the six (q, k) int64 tensors, the bool and the accumulated fp32 gradient live; at 128 + 1024,
    the re-run decoder block 0 at the mask's copy). The stack's input embeddings, which the forward holds, are not
    live here (the dropout's output, the block's input, is counted with the stack's ends). Under autocast the
    incoming gradient has a 16-bit copy too: the MLP sublayer's residual add (T5LayerFF :141, fp32 stream + 16-bit
    branch) hands its branch the gradient cast to the branch's dtype (autograd casts an input's gradient to its
    dtype) before the branch dropout's backward unpacks a saved tensor and so starts the re-run.
    NB: with one block in the stack there is no accumulated gradient (over by one (heads, q, k) tensor); on the
    CPU math path forward_moment counts the decoder's zero bias made again, held there already (over by one
    (heads, t, s) tensor)."""
    q_len = setup.target_tokens if decoder else setup.seq
    rows = setup.batch * q_len
    bias = spec.heads * q_len * q_len * st.weight  # the accumulated gradient in, the held bias freed
    embeds = rows * spec.hidden * st.weight
    incoming = (st.residual + (st.act if st.act != st.residual else 0)) * spec.hidden * rows
    return Moment(incoming + bias + forward_moment(spec, setup, st, decoder, True) - embeds, 0, bias)


def attention_moment(spec: ModelSpec, setup: Setup, st: StateBytes, decoder: bool, first: bool) -> Moment:
    """The memory-efficient kernel's backward in the self-attention, the block's backward's last sublayer (CUDA;
    read off the trace of flan-t5-base, 1 x 4096 tokens, bf16: its four gradients to the byte), with the incoming
    gradient (the residual stream's): o's input gradient, q's, k's and v's (the compute dtype) and the bias's
    gradient (b, heads, q, keys rounded up to 16) in the bias's dtype (meta__scaled_dot_product_efficient_backward,
    torch/_meta_registrations.py; the compute dtype, attention_core). Live of the saved set: the self-attention's
    norm, core, casts, causal mask and bucket indices; the rest (the MLP and cross-attention sublayers, the
    sublayer's dropout mask and residual output) freed by their backward, with their weights' gradients done.
    Under full recomputation the re-run's kept tensors instead (the re-run first block keeps its bias's contiguous
    copy, not the relative bias it made), beside the gradient of the stack's relative bias accumulated over the
    blocks after it (1, heads, q, q) in the weights' dtype; at the first block the held relative bias is freed, the
    blocks after it done (read off the trace of flan-t5-base, 2 x 2048 tokens, bf16: the peak at encoder block 1's
    kernel backward, the held bias, the accumulated gradient, the re-run's copy and the kernel's (b, heads, q, q)
    gradient live).
    NB: without recomputation a batch over 1 sums the bias's gradient to (1, heads, q, k) (expand's backward)
    after the kernel, and the stack's bias gradient accumulates from its last block's attention on; neither is
    counted (under: one (heads, q, k) tensor beside a (b, heads, q, k) one, and every block after the stack's last
    keeps less than the last, which holds a bias copy of that size). Under full recomputation the stack's last
    block has no accumulated gradient yet (over by one (heads, q, q) tensor where the stack's one later block is
    its last) and the cross-attention kernel's (b, heads, t, s) bias gradient (the zero bias requires grad under
    checkpointing, modeling_t5.py:345-346) comes before the self-attention's and is not counted (its sum, the
    leaf's .grad, is: zero_bias_leaf)."""
    h, a, r, q = spec.hidden, st.act, st.residual, inner(spec)
    q_len = setup.target_tokens if decoder else setup.seq
    b = setup.batch
    rows = b * q_len
    saved = block_saved(spec, setup, st, decoder, first)
    kept = norm_saved(st, rows, h) + attention_core(spec, setup, st, q_len, q_len) + \
        attention_casts(spec, st, rows, rows) + (q_len * q_len if decoder else 0) + \
        (INDEX * q_len * q_len if first else 0)
    grads = r * h * rows + a * q * rows + 3 * a * q * rows + a * b * spec.heads * q_len * _padded_keys(q_len, 16)
    done = h * spec.intermediate * (3 if spec.gated_mlp else 2) + q * h + h + (4 * h * q + h if decoder else 0)
    if setup.recompute == "full":
        accumulated = spec.heads * q_len * q_len * st.weight
        return Moment(kept + accumulated + grads, done, accumulated if first else 0)
    return Moment(grads, done, saved - kept)


def decoder_embedding_moment(spec: ModelSpec, setup: Setup, st: StateBytes) -> Moment:
    """The decoder's embedding backward, after its first block's and before the encoder's (the tied `shared`
    table, modeling_t5.py:1036-1040), a moment of the decoder's first block: the tied table's two partials
    (tied_partials) and the encoder output's gradient the cross-attentions' k and v made (the residual stream's
    dtype), beside the whole encoder's saved tensors; the block's and the decoder embedding's dropout's saved
    tensors freed, the block's gradients done (read off the trace of flan-t5-base, 2 x 2048 + 64 tokens, bf16: its
    peak, the two (vocab, d_model) partials and the (2, 2048, 768) gradient live). Long inputs and short targets
    put the peak here.
    NB: without recomputation only (under full recomputation the decoder's held inputs at this point are not
    derived; its re-run moments are larger at the sizes measured)."""
    h, q = spec.hidden, inner(spec)
    rows = setup.batch * setup.target_tokens
    extra = tied_partials(spec, st) + st.residual * h * setup.batch * setup.seq
    freed = block_saved(spec, setup, st, True, True) + (dropout_mask_bytes(setup, st.weight) + st.weight) * h * rows
    done = 8 * h * q + h * spec.intermediate * (3 if spec.gated_mlp else 2) + 3 * h + relative_bias_params(spec)
    return Moment(extra, done, freed)


def tied_partials(spec: ModelSpec, st: StateBytes) -> float:
    """The tied `shared` table's partial gradients live at an embedding's backward (memory.py tied_partials: under
    autocast one beside the sum, lm_head's partial being the weight cast's fresh fp32 gradient, which takes the
    embedding's in place; otherwise both partials and their sum, one of the three counted as the gradient)."""
    return (1 if st.autocast else 2) * spec.vocab * spec.hidden * st.grad


def block_params(spec: ModelSpec, pc: ParamCounts, decoder: bool, first: bool) -> float:
    """A block's parameters: q, k, v, o, the MLP, a norm per sublayer; the decoder's cross-attention and its norm;
    the first block's relative bias."""
    own = pc.attention + pc.mlp + pc.norms + (pc.cross_attention if decoder else 0)
    return own + (relative_bias_params(spec) if first else 0)


def stack_terms(spec: ModelSpec, setup: Setup, st: StateBytes) -> tuple[float, float, float, float]:
    """(encoder front, encoder end, decoder front, decoder end): each stack's saved tensors before its first block
    (T5: stack_ends' embedding dropout; BART / Whisper: encdec_absolute_training.front_saved) and after its last
    (T5: the final norm and dropout; Whisper: its final layer_norm; BART: none)."""
    ab = absolute_training(spec)
    if ab is not None:
        return (ab.front_saved(spec, setup, st, False), ab.final_saved(spec, setup, st, False),
                ab.front_saved(spec, setup, st, True), ab.final_saved(spec, setup, st, True))
    enc = stack_ends(spec, setup, st, setup.batch * setup.seq)
    dec = stack_ends(spec, setup, st, setup.batch * setup.target_tokens)
    return enc[0], enc[1], dec[0], dec[1]


def absolute_training(spec: ModelSpec):
    """encdec_absolute_training for BART and Whisper (their blocks, front-ends and head), None for T5 / mT5."""
    if absolute(spec) is None:
        return None
    from . import encdec_absolute_training  # noqa: PLC0415 (it reads this module's attention terms)

    return encdec_absolute_training


def train_memory(spec: ModelSpec, setup: Setup, pc: ParamCounts):
    """The training step's memory (memory.TrainMemory) of T5 / mT5, BART and Whisper, as memory.stage_memory's for
    one stack; BART's and Whisper's blocks, front-ends and head from encdec_absolute_training."""
    from .memory import TrainMemory  # noqa: PLC0415 (memory dispatches here)

    check_trainable(spec, setup)
    st = state_bytes(setup)
    ab = absolute_training(spec)
    n = pc.total
    ms = model_states(n, state_bytes_unsharded(spec, n, pc, st, setup), st, setup)
    b, h = setup.batch, spec.hidden
    dec_rows = b * setup.target_tokens
    enc_embedding, enc_final, dec_embedding, dec_final = stack_terms(spec, setup, st)
    head_saved, logits, loss_backward = head_bytes(spec, setup, st)
    full = setup.recompute == "full"
    if full and ab is None:
        # each stack's last block's output, which its final norm keeps (norm_saved: the input, counted where it is
        # made, a block's saved set); under checkpointing no block keeps it (T5Stack.forward :745)
        enc_final += st.residual * h * b * setup.seq
        dec_final += st.residual * h * dec_rows
        if not st.autocast:
            # the encoder's output (its final dropout's, T5Stack.forward :746), which stack_ends counts as the
            # cross-attentions' k and v keep it (:327-328): inside checkpointed blocks they keep nothing, and it is
            # the decoder blocks' checkpoint input (encoder_hidden_states, :728-737), counted once (held_per_stack)
            enc_final -= st.weight * h * b * setup.seq
    if ab is not None:
        logits += ab.logits_extra(spec, setup, st)
    gb = st.grad
    terms = ab or sys.modules[__name__]
    leaf = zero_bias_leaf(spec, setup, st) if ab is None else 0.0  # (T5, full recomputation) to the step's end
    kinds = []
    for decoder, first in ((False, True), (False, False), (True, True), (True, False)):
        rows = dec_rows if decoder else b * setup.seq
        if full:
            # the block's input; a first block's is the embeddings' dropout output, counted with the stack's ends
            saved = (0 if first else st.residual * h * rows) + (CPU_RNG_STATE if setup.device == "cpu" else 0)
            if first:
                saved += terms.held_per_stack(spec, setup, st, decoder)
        else:
            saved = terms.block_saved(spec, setup, st, decoder, first)
        if decoder and first:  # live until the decoder's backward is done: its embeddings, the encoder's end
            saved += dec_embedding + enc_final + INDEX * dec_rows  # (+ shift_right's decoder ids)
        m = max(terms.block_moments(spec, setup, st, decoder, first),
                key=lambda x: x.extra - x.freed + x.grads_done * gb)
        own = ab.block_params(spec, decoder) if ab is not None else block_params(spec, pc, decoder, first)
        # the forward's high point, with what the kind's saved set carries beside the block's own (the decoder's
        # first: its embeddings, the encoder's end, the decoder ids). NB: not derived for BART's and Whisper's blocks
        # (no relative bias): under where they are the peak
        if ab is not None:
            forward = 0.0
        elif full:
            # the checkpoint's inputs and the block's temporaries; of `inputs`, the zero-bias leaf is made at the
            # decoder's first cross-attention (after its self-attention) and its .grad in the backward
            forward = saved + checkpointed_forward_moment(spec, setup, st, decoder, first) - \
                (leaf / 2 if decoder and not first else leaf)
        else:
            forward = forward_moment(spec, setup, st, decoder, first) + saved - \
                terms.block_saved(spec, setup, st, decoder, first)
        kinds.append(LayerKind(saved, m.extra, m.freed, m.grads_done * gb, gradients=own * gb, forward=forward))
    # each stack's first block and its other blocks, as runs (not one entry per block: 10**9 blocks a stack)
    pattern = Pattern.of_runs((0, 1), (1, spec.layers - 1), (2, 1), (3, spec.encdec.decoder_layers - 1))
    inputs = encoder_input(spec, setup, st) + INDEX * dec_rows  # input_ids (Whisper: input_features) and labels
    transient = logits
    if full and ab is None:
        # at the loss, beside the logits: autocast's cached casts of every block's weights, which no checkpointed
        # block saves (freed at the autocast region's exit, torch/amp/autocast_mode.py:349); the leaf's .grad,
        # counted in `inputs`, is made in the backward
        transient += (st.act * stack_casts(spec, True) if st.autocast else 0) - leaf / 2
    step = StepBytes(
        resident={"weights": ms.weights, "master_weights": ms.master, "optimizer_states": ms.optimizer,
                  "comm_buffers": ms.comm},
        gradients=ms.gradients,
        accumulating=setup.grad_accum > 1,
        head_gradients=(spec.vocab * h + h) * gb,  # lm_head (tied `shared`) and the decoder's final norm
        layer_gradients=0.0,
        layers=len(pattern),
        in_flight=1,
        layer_saved=0.0,
        embedding_saved=enc_embedding,
        head_saved=dec_final + head_saved + inputs + leaf,
        inputs=inputs + leaf,
        forward_transient=transient,
        loss_backward=loss_backward,
        layer_backward=0.0,
        layer_freed=0.0,
        layer_grads_done=0.0,
        # the tied table's partials (memory.py tied_partials; BART's and Whisper's encoder's own)
        embedding_backward=ab.table_partials(spec, st, False) * gb if ab else tied_partials(spec, st),
        gathered=0.0,
        optimizer_transient=optimizer_temporaries(setup, st, n, spec.vocab * h),
        kinds=tuple(kinds),
        pattern=pattern,
        step_inputs=leaf,
    )
    p = peak(step)
    detail = {"stage": 0, "layers_on_rank": len(pattern), "in_flight_microbatches": 1,
              "activation_per_layer": int(step.layers_saved / len(pattern)), "logits_buffers": int(logits),
              "optimizer_temporaries": int(step.optimizer_transient)}
    return TrainMemory(whole(ms.weights), whole(ms.gradients), whole(ms.master), whole(ms.optimizer),
                       whole(step.activations), whole(ms.comm), p.phases, p.peak, p.phase, p.at_peak, detail,
                       round(params_at_rest(n, setup)))


def step_flops(spec: ModelSpec, setup: Setup):
    """The training step's FLOPs (flops.StepFlops) over every micro-batch: the forward is the prefill's
    (encoder_decoder.prefill_flops: both stacks and lm_head over every target position), the backward twice it
    (input and weight gradients of every matmul; NB: the embeddings' input gradient is not a matmul: over by
    none, the tables take no input gradient, but the first blocks' q, k and v input gradients are counted), full
    recomputation re-runs both stacks' blocks (lm_head is outside them). Per token: per input (--seq) token."""
    from .encoder_decoder import prefill_flops  # noqa: PLC0415
    from .flops import StepFlops  # noqa: PLC0415 (flops dispatches here)

    fwd = prefill_flops(spec, setup) * setup.grad_accum
    head = 2 * setup.batch * setup.target_tokens * spec.vocab * spec.hidden * setup.grad_accum
    recompute = fwd - head if setup.recompute == "full" else 0.0
    per_token = fwd / (setup.batch * setup.seq * setup.grad_accum)
    return StepFlops(fwd, 2 * fwd, recompute, 3 * per_token, per_token)
