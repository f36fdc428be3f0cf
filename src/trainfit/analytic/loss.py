"""The task head and the loss: what they save for backward and the transient logits buffers.

LM heads: HF ForCausalLMLoss upcasts the logits to fp32 and runs cross_entropy = log_softmax + nll_loss
(transformers/loss/loss_utils.py:61 `logits = logits.float()`, :42 `cross_entropy`); log_softmax's fp32 output
is saved for backward. BERT/RoBERTa's masked-LM heads call CrossEntropyLoss on the raw logits (families.json
`loss_upcast`). torchtitan's cross_entropy_loss does the same on `pred.float()` with a sum reduction
(torchtitan/components/loss.py:19-26): the same logits, fp32 copy and saved log-softmax; where the loss runs and
where its labels come from are the stack's [loss] facts.
Classifier heads (trainfit.heads for the layers of each family's class): the logits are num_labels wide instead
of the vocabulary, and a sequence classifier's loss sees one row per sequence; what stays is the base model's
last hidden state (held by the head's forward until it returns, or saved by the layer that reads it), the
token classifier's dropout, and autocast's casts.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..heads import CLASSIFIERS, layout
from ..precision import DTYPE_BYTES
from ..setup import Setup
from ..spec import ModelSpec
from .activations import FP32, INDEX, _norm_saved, dropout_mask_bytes, family_traits, norm_kernel
from . import kbit_prep
from .liger_ops import chunk_rows
from .long_context import tiled_loss_shards
from .precision import StateBytes


@dataclass(frozen=True)
class HeadBytes:
    saved: float  # saved for backward from the head's forward to the loss's backward (+ autocast's head cast)
    labels: float  # of `saved`, the labels (an input) and a model output the loop holds: live to the step's end
    forward_transient: float  # forward high point: the logits, their fp32 copy (and the saved log-softmax)
    backward_transient: float  # backward start: the loss's gradients beside the saved log-softmax output
    norm_kept: float = 0.0  # of `saved`, the final norm's tensors still saved at its backward's high point
    norm_backward: float = 0.0  # the final norm's backward temporaries at that point
    # of backward_transient, the first gradient the loss's backward makes (nll_loss_backward's, the saved
    # log-softmax output's size); 0 where not laid out (analytic/expandable.py)
    loss_grad: float = 0.0
    # inside the LM head's backward matmuls (head_matmuls): the logits' gradient in the matmul's dtype, the weight
    # and input gradients and oneDNN's scratch (CPU), with `loss_grad`'s log-softmax output freed; 0: not a moment
    matmul_backward: float = 0.0


def final_norm_backward(spec: ModelSpec, setup: Setup, st: StateBytes, tokens: int) -> tuple[float, float]:
    """(kept, temporaries) at the high point of the final norm's backward, right after the head's: the moment that
    sets the peak when the head is small (a classifier). HF's RMSNorm (modeling_llama.py LlamaRMSNorm: fp32 copy,
    pow, mean, rsqrt, mul, cast back) runs as separate autograd ops: at the pow's backward (grad·2·x, three fp32
    tensors) the mul's input gradient and the mean's expanded gradient are live, five fp32 tensors of the input's
    shape, with the fp32 copy and rsqrt still saved (read off traced steps, any precision). LayerNorm's backward is
    one kernel (aten native_layer_norm_backward): the incoming gradient and the input gradient, its saved input and
    statistics; so is torch.rms_norm's fused CUDA kernel (aten._fused_rms_norm_backward: input and rstd kept), while
    its CPU composite runs the same separate ops as HF's (activations._norm_saved)."""
    if not spec.final_norm:
        return 0.0, 0.0
    h, r = spec.hidden, st.residual
    if spec.norm == "rmsnorm" and norm_kernel(setup) == "liger-rms-norm":
        # Liger's backward writes dX over dY (ops/rms_norm.py:555-556, liger.py): the incoming gradient alone
        return _norm_saved(spec, r, "liger-rms-norm") * tokens, r * h * tokens
    if spec.norm == "rmsnorm" and norm_kernel(setup) == "torch-rms-norm" and setup.device == "cuda":
        return _norm_saved(spec, r, "torch-rms-norm", "cuda") * tokens, 2 * r * h * tokens
    if spec.norm == "rmsnorm":
        return (FP32 * h + FP32) * tokens, 5 * FP32 * h * tokens
    return _norm_saved(spec, r) * tokens, 2 * r * h * tokens


def head_and_loss(spec: ModelSpec, setup: Setup, st: StateBytes, tokens: int) -> HeadBytes:
    """Final norm, MLM transform, LM head and loss for one micro-batch on one rank (vocab-parallel under TP)."""
    if spec.task_head in CLASSIFIERS:
        return classifier_and_loss(spec, setup, st, tokens)
    a, r = st.act, st.residual
    amp = st.autocast  # (FSDP2 mixed precision: the head computes on its gathered bf16 weight, no cast)
    loss_fact = setup.stack_facts.facts["loss"]
    h, v = spec.hidden, spec.vocab // setup.tp  # vocab-parallel logits under TP (Megatron)
    saved = (_norm_saved(spec, r, norm_kernel(setup), setup.device) if spec.final_norm else 0) * tokens
    if spec.mlm_transform:
        # dense input, GELU input, LayerNorm. CUDA autocast runs layer_norm in fp32 (autocast_mode.h AT_FORALL_FP32;
        # trace/cuda_autocast.py): the LayerNorm keeps an fp32 copy of the GELU's bf16 output
        ln_in = FP32 if amp and setup.device == "cuda" else a
        saved += (2 * a * h + _norm_saved(spec, ln_in)) * tokens
        if amp:
            saved += a * h * h  # autocast's cast of the transform's dense weight
    a = kbit_prep.head_bytes(setup, st)  # the head's matmul dtype: fp32 for --kbit-prep peft's fp32 head (analytic/kbit_prep.py)
    saved += a * h * tokens  # lm_head input (its autocast cast under amp)
    weight_cast = a * v * (spec.embed_proj_dim or h) if amp else 0  # autocast cast of the LM-head weight
    # log_softmax runs in fp32 when the loss upcasts the logits, under autocast (log_softmax is on its fp32 list),
    # and in fp32 training; otherwise (BERT's MLM head in pure bf16) in the logits' dtype.
    upcast = family_traits(spec)["loss_upcast"]
    loss_bytes = FP32 if (upcast or amp or a == FP32) else a
    lsm = loss_bytes * v * tokens  # saved log_softmax output
    if spec.final_softcap:
        saved += a * v * tokens  # Gemma-2 caps the logits with tanh, whose output is saved
    # the batch's labels (an input, resident through the step); causal LMs also save the shifted copy that
    # nll_loss reads (ForCausalLMLoss pads and shifts the labels: loss_utils.py:64-66) — unless the stack's data
    # loader gives them shifted already ([loss] labels = "given": torchtitan's text_datasets.py:129-131)
    shifts = spec.causal and loss_fact.get("labels", "shifted-copy") == "shifted-copy"
    labels = INDEX * tokens * (2 if shifts else 1)
    logits = a * v * tokens
    logits_fp32 = FP32 * v * tokens if (a != FP32 and loss_bytes == FP32) else 0
    # [loss] logits = "fp32-returned" (transformers before ForCausalLMLoss: stacks/hf.toml [releases]): the model
    # rebinds `logits = logits.float()` (its 16-bit logits dropped), takes the loss on a contiguous fp32 copy of the
    # shifted logits and returns the fp32 ones; [loss] output_held: the caller's loop keeps the model's output (its
    # `logits`) to the end of the step, with the saved set here and among the step's inputs below
    returned = loss_fact.get("logits") == "fp32-returned" and logits_fp32 > 0
    held = ((FP32 if returned else a) * v * tokens) if loss_fact.get("output_held", False) else 0.0
    fwd_logits = (logits_fp32 + FP32 * v * tokens if returned else logits + logits_fp32) - held
    # HF's *ForCausalLM / *ForMaskedLM forward holds the final hidden states (`outputs[0]`) until it returns with
    # the loss: under autocast that fp32 tensor is not the one the head saved (its bf16 cast is). A stack whose
    # loss runs after the model returns ([loss] in_forward = false) has dropped them by then.
    in_forward = loss_fact.get("in_forward", True)
    hidden = r * h * tokens if (amp and in_forward) else 0
    # ForCausalLMLoss pads the labels by one position before shifting them (loss_utils.py:64)
    padded = INDEX * (tokens + setup.batch) if shifts else 0
    kept, norm_bwd = final_norm_backward(spec, setup, st, tokens)
    if setup.loss == "chunked-logprob":
        norm = (_norm_saved(spec, r, norm_kernel(setup), setup.device) if spec.final_norm else 0) * tokens
        return chunked_logprob_head(spec, setup, st, tokens, norm, kept, norm_bwd)
    if setup.loss == "tiled":
        norm = (_norm_saved(spec, r, norm_kernel(setup), setup.device) if spec.final_norm else 0) * tokens
        return tiled_loss_head(spec, setup, st, tokens, norm, weight_cast, loss_bytes, kept, norm_bwd)
    if setup.loss == "fused-linear":
        norm = (_norm_saved(spec, r, norm_kernel(setup), setup.device) if spec.final_norm else 0) * tokens
        return fused_linear_head(spec, setup, st, tokens, norm, weight_cast, labels, hidden + padded, kept, norm_bwd)
    if setup.loss == "xentropy":
        return xentropy_head(saved + weight_cast + labels, logits, tokens, loss_fact, hidden + padded, kept,
                             norm_bwd)
    return HeadBytes(
        saved=saved + weight_cast + lsm + labels + held,
        # NB (output_held): the held logits are not counted at the optimizer step (phases.py's step inputs)
        labels=INDEX * tokens + held,
        # forward high point: the logits, their fp32 copy and the log-softmax output, all live at once
        forward_transient=fwd_logits + hidden + padded,
        # backward start: grad of the log-softmax output and the logits' gradient beside the saved output
        # (counted in `saved`); the gradient's cast for the LM-head matmul comes after the first is freed
        backward_transient=max(2 * loss_bytes, loss_bytes + (a if a != loss_bytes else 0)) * v * tokens,
        norm_kept=kept,
        norm_backward=norm_bwd,
        loss_grad=lsm,
        matmul_backward=head_matmuls(spec, setup, a, v, spec.embed_proj_dim or h, tokens),
    )


def head_matmuls(spec: ModelSpec, setup: Setup, a: int, v: float, h: float, tokens: int) -> float:
    """The LM head's backward (nn.Linear h -> v, no bias: mm's backward makes the weight gradient first, then the
    input gradient: ONEDNN_VERBOSE of nn.Linear's backward, backward._down_backward_gemms), after the loss's: the
    logits' gradient in the matmul's dtype `a`, the weight gradient gradᵀ·x (v × tokens · tokens × h, autograd's
    transposed A) beside it with its oneDNN scratch, then the input gradient grad·W (tokens × v · v × h) beside both
    with its own. A frozen head (LoRA) makes no weight gradient. Read off the trace of tiny-llama amp-bf16 at seq 8
    with the optimizer in backward under ONEDNN_MAX_CPU_ISA=AVX512_CORE, where the weight gradient's gemm:jit:bf16
    scratch (an fp32 copy of its output, 256,128 B) sets the step's peak (onednn.py)."""
    from .onednn import gemm_scratch  # noqa: PLC0415 (onednn sits beside this module's importers)

    grad = a * v * tokens
    dx = a * tokens * h + gemm_scratch(setup, tokens, v, h)
    if setup.lora_rank:
        return grad + dx
    dw = a * v * h
    return grad + dw + max(gemm_scratch(setup, v, tokens, h, transposed_a=True, transposed_b=False), dx)


def xentropy_head(saved: float, logits: float, tokens: int, loss_fact: dict, transient: float, kept: float,
                  norm_bwd: float) -> HeadBytes:
    """flash-attn's fused softmax cross-entropy (--loss xentropy: flash_attn/losses/cross_entropy.py at v1.0.9, what
    llm-foundry's loss_fn fused_crossentropy runs, llmfoundry/models/mpt/modeling_mpt.py:981-987 at 5e85bd62d) on
    the head's `logits` bytes (16-bit under autocast or in bf16; `saved`: the head's own saved tensors and the
    labels). Its forward (csrc/xentropy/xentropy_kernel.cu:638-639) reads the logits in their dtype and makes two
    fp32 numbers per token, the losses and the log-sum-exp; it saves the logits themselves, the log-sum-exp and the
    labels (cross_entropy.py:85 ctx.save_for_backward): no fp32 copy, no log-softmax output. Its backward writes
    the logits' gradient into a new tensor of their dtype (xentropy_kernel.cu:697 `at::empty_like(logits_)`;
    CrossEntropyLoss's inplace_backward defaults False, and llm-foundry leaves it). [loss] output_held: the loop
    keeps the same logits to the step's end (no second copy)."""
    held = logits if loss_fact.get("output_held", False) else 0.0
    return HeadBytes(
        saved=saved + logits + FP32 * tokens,
        labels=INDEX * tokens + held,
        forward_transient=FP32 * tokens + transient,  # the per-token losses until the mean reduces them
        # the fp32 grad_loss per token (grad_loss.contiguous() of the expanded mean's gradient) and the new
        # 16-bit gradient beside the saved logits
        backward_transient=logits + FP32 * tokens,
        norm_kept=kept,
        norm_backward=norm_bwd,  # (loss_grad 0: the forward frees no logits-sized block: expandable.loss_hole)
    )


def classifier_and_loss(spec: ModelSpec, setup: Setup, st: StateBytes, tokens: int) -> HeadBytes:
    """A sequence or token classifier (trainfit.heads.layout) and its loss, for one micro-batch.

    The base model's output (batch, seq, hidden), in the residual stream's dtype, is either saved (the output
    layer's input without autocast; BERT's pooler saves token 0's rows as a view, which keeps the whole tensor) or
    held by the head's forward (`outputs[0]`) until it returns. Under autocast each linear saves its low-precision
    cast of the input and of its weight. NB: of the (batch, hidden) tensors of a pooled head (pooler/dense input,
    tanh output, dropout masks, classifier input) and the decoders' last-token gather (int32 mask, indices) only the
    main ones are counted: under 1% of a layer's activations."""
    head = layout(spec)
    a, r = st.act, st.residual
    amp = setup.precision.startswith("amp")
    h, d, n = spec.hidden, head.in_dim, head.width
    b = setup.batch
    saved = (_norm_saved(spec, r) if spec.final_norm else 0) * tokens
    held = r * h * tokens  # the base model's output, referenced until the head's forward returns
    transient = 0.0
    weights = h * h + h if head.pooler else 0  # autocast casts weight and bias
    weights += d * n + (n if head.out_bias else 0)
    if amp:
        saved += a * weights
    mask = dropout_mask_bytes(setup, r)
    if head.rows == "first":  # BERT / RoBERTa sequence classifiers read token 0
        if head.dense_first and not amp:
            saved += held  # BertPooler.dense saves `hidden_states[:, 0]`, a view of the whole output
        else:
            transient += held  # RoBERTa's dropout saves its mask only; autocast's dense saves a (b, h) cast
        # pooler/dense input (cast), tanh output, dropout masks, classifier input
        saved += (a * (1 if amp or not head.dense_first else 0) + a + head.dropouts * mask + a) * h * b
        rows = b
        logits = a * n * b
    else:
        if head.dropouts:  # token classifiers: dropout on every position, its mask saved
            saved += mask * h * tokens
            transient += held  # the pre-dropout output, held by `outputs`
            out_in = r * h * tokens  # the dropout's output feeds the classifier
        else:
            out_in = held
        if amp:
            saved += a * d * tokens  # the classifier's / score's cast of its input
            transient += out_in
        else:
            saved += out_in
        logits = a * n * tokens  # every position is scored (decoders' seq-cls too: then one row is gathered)
        if head.rows == "all-last":
            logits += a * n * b + INDEX * b  # the gathered rows and their positions
            rows = b
        else:
            rows = tokens
    # the loss: cross-entropy's log_softmax (MSE for regression) saves its output, in fp32 when the loss upcasts,
    # under autocast (log_softmax and mse_loss are on its fp32 list) and in fp32 training
    loss_bytes = FP32 if (head.loss == "ce-upcast" or amp or a == FP32) else a
    lsm = loss_bytes * n * rows
    logits_fp32 = FP32 * n * rows if (a != FP32 and loss_bytes == FP32) else 0
    label_bytes = DTYPE_BYTES[setup.policy.weight] if head.loss == "mse" else INDEX  # regression: float labels
    labels = label_bytes * (b if spec.task_head == "seq-cls" else tokens)
    kept, norm_bwd = final_norm_backward(spec, setup, st, tokens)
    return HeadBytes(
        saved=saved + lsm + labels,
        labels=labels,
        forward_transient=logits + logits_fp32 + transient,
        backward_transient=max(2 * loss_bytes, loss_bytes + (a if a != loss_bytes else 0)) * n * rows,
        norm_kept=kept,
        norm_backward=norm_bwd,
    )


# TRL's fused LM head (trl/kernels/chunked_logprob.py, TRL 1.16): tiles of TOKEN_CHUNK_SIZE tokens (line 31) by
# _CHUNKED_LOGPROB_CHUNK_SIZE vocabulary entries (trl/trainer/utils.py:1506)
TRL_TILE_TOKENS = 4096
TRL_TILE_VOCAB = 32768
# the per-token fp32 statistics its forward allocates whole (chunked_logprob.py:340-346: running max, sum of exp,
# x·exp, squared, z sum, max before target, target logit)
TRL_TOKEN_STATS = 7


def trl_tiles(spec: ModelSpec, setup: Setup, st: StateBytes, n: int, backward: bool = False) -> float:
    """What TRL's fused head holds for one tile of `n` scored tokens: `mm_buf`, [min(n, 4096), 32768] in the compute
    dtype whatever the vocabulary (chunked_logprob.py:347, :413), each tile's operands cast to the compute dtype
    (`.to(compute_dtype)`, a copy when the dtypes differ; the forward's weight chunk only for its matmul), and off
    Triton (--device cpu) the torch fold's fp32 temporaries of the [rows, vocab-chunk] tile: in the forward three
    (`_forward_tile`: the transform's two products, then z, z − max and its exp; chunked_logprob.py:235-245), in
    the backward seven and a boolean (`_backward_tile` at `grad += grad_logprobs · (is_target.float() − p)`: y, z,
    log_p, p, grad, the difference and the product, the float mask freed once subtracted; :274-285), or after it,
    with a 16-bit tile, the fp32 copies `_addmm_fp32` makes of the tile and the weight chunk for the gradient GEMMs
    off CUDA (`acc.addmm_(a.float(), b.float())`, :52-63)."""
    a, r, h, v = st.act, st.residual, spec.hidden, spec.vocab // setup.tp
    rows, cols = min(n, TRL_TILE_TOKENS), min(v, TRL_TILE_VOCAB)
    chunk_cast = a * rows * h if r != a else 0
    weight_cast = a * cols * h if st.weight != a else 0
    cpu = setup.device == "cpu"
    if backward:  # the weight chunk's cast is a local of the whole tile's work
        fold = max((7 * FP32 + 1) * rows * cols, FP32 * (rows + h) * cols if a != FP32 else 0) if cpu else 0
        return a * rows * TRL_TILE_VOCAB + chunk_cast + weight_cast + fold
    # forward: the weight chunk's cast dies with the tile's matmul, before the fold
    return a * rows * TRL_TILE_VOCAB + chunk_cast + max(weight_cast, 3 * FP32 * rows * cols if cpu else 0)


def chunked_logprob_head(spec: ModelSpec, setup: Setup, st: StateBytes, tokens: int, norm_saved: float,
                         kept: float, norm_bwd: float) -> HeadBytes:
    """--loss chunked-logprob: TRL's fused LM head (trl/trainer/utils.py:1548-1660 add_fused_lm_head, TRL 1.16), what
    its GRPO trainer scores and trains with: per-token log-probabilities of the labels, never the [tokens, vocab]
    logits. The forward copies the shifted hidden states (`last_hidden_state[:, :-1]` reshaped, or `[mask]` on a
    Triton device) and the targets, folds [4096 × 32768] logits tiles (one `mm_buf`, the compute dtype) into seven
    fp32 per-token statistics, and saves the hidden copy, the targets, log Z and the entropy
    (chunked_logprob.py:311-391). The backward recomputes each tile into the same kind of buffer and accumulates the
    input and weight gradients in fp32 (chunked_logprob.py:394-470): grad_hidden [n, H] fp32 and grad_weight
    [V, H] fp32 (the .grad itself when the weight is fp32 and no earlier micro-batch made one; beside it otherwise).
    NB: n = every position with a next-token label (tokens − batch), what the torch path scores; on a Triton GPU
    TRL scores only the labelled (completion) positions: over by the prompts' share of the [n, H] buffers."""
    r, h, v = st.residual, spec.hidden, spec.vocab // setup.tp
    n = tokens - setup.batch
    labels = INDEX * tokens  # the batch's labels (input_ids with -100 on the prompt)
    targets = INDEX * n
    held = r * h * tokens  # the backbone's output, referenced by the forward until it returns
    hidden_copy = r * h * n
    lm_head_trains = not setup.lora_rank
    # the fp32 accumulator is a tensor beside the head's .grad when the .grad is 16-bit, or when an earlier
    # micro-batch made the .grad already (AccumulateGrad adds the new one into it: torch/csrc/autograd/functions/
    # accumulate_grad.h); otherwise it becomes the .grad itself
    grad_weight = FP32 * v * h if (lm_head_trains and (st.grad != FP32 or setup.grad_accum > 1)) else 0.0
    return HeadBytes(
        # the hidden copy, targets, log Z and entropy saved; the log-probs and entropy returned to the loss
        saved=norm_saved + hidden_copy + targets + 4 * FP32 * n + labels,
        labels=labels,
        forward_transient=held + trl_tiles(spec, setup, st, n) + TRL_TOKEN_STATS * FP32 * n,
        # the loop's tiles, or at the return the gradients cast back to the inputs' dtypes beside the fp32 ones
        backward_transient=FP32 * h * n + grad_weight + max(trl_tiles(spec, setup, st, n, backward=True), (
            r * h * n if r != FP32 else 0) + (st.weight * v * h if (lm_head_trains and st.weight != FP32) else 0)),
        norm_kept=kept,
        norm_backward=norm_bwd,
    )


def tiled_loss_head(spec: ModelSpec, setup: Setup, st: StateBytes, tokens: int, norm_saved: float,
                    weight_cast: float, loss_bytes: int, kept: float, norm_bwd: float) -> HeadBytes:
    """--loss tiled: DeepSpeed's TiledFusedLogitsLoss as ArcticTraining's SFT trainer runs it under Ulysses
    (arctic_training/trainer/sft_trainer.py:101-156; deepspeed/runtime/sequence_parallel/ulysses_sp.py:1126-1225):
    the rank's final hidden states in slices of about 1 GiB of fp32 logits (long_context.tiled_loss_shards), each
    slice's LM head and the model's own loss (logits, their fp32 copy, the log-softmax) run and backpropagated
    inside the forward (:1187-1196), so one slice's logits live at a time; the input gradient (zeros_like(x), the
    hidden states' dtype, :1166) is saved for the backward (:1212-1214), which only scales it (:1226-1231), and the
    LM head's weight gradient accumulates over the slices in the forward. The labels come shifted from
    UlyssesSPDataLoaderAdapter (`shift_labels`, sft_trainer.py:67-77): no padded copy. The slice's high point: its
    forward (bf16 logits, the fp32 copy, the saved log-softmax) or its backward (the log-softmax, its gradient and
    the logits' gradient), whichever is larger. NB: the model's output (the hidden states) is held by the trainer
    beside the slices, counted; the per-slice loss scalars are not."""
    a, h, v = st.act, spec.hidden, spec.vocab // setup.tp
    rows = -(-int(tokens) // tiled_loss_shards(spec, setup))
    fp32_copy = FP32 * v * rows if (a != FP32 and loss_bytes == FP32) else 0
    forward = a * v * rows + fp32_copy + loss_bytes * v * rows
    backward = loss_bytes * v * rows + max(2 * loss_bytes, loss_bytes + (a if a != loss_bytes else 0)) * v * rows
    grad_input = st.residual * h * tokens
    grad_weight = st.weight * v * h if not setup.lora_rank else 0.0
    return HeadBytes(
        saved=norm_saved + weight_cast + grad_input + grad_weight + INDEX * tokens,
        labels=INDEX * tokens,
        forward_transient=st.residual * h * tokens + max(forward, backward),
        backward_transient=0.0,
        norm_kept=kept,
        norm_backward=norm_bwd,
    )


def fused_linear_head(spec: ModelSpec, setup: Setup, st: StateBytes, tokens: int, norm_saved: float,
                      weight_cast: float, labels: float, held: float, kept: float, norm_bwd: float) -> HeadBytes:
    """--loss fused-linear: Liger's fused linear cross-entropy (linkedin/Liger-Kernel ops/fused_linear_cross_entropy.py,
    fused_linear_cross_entropy_forward). The tokens run in chunks of next_pow2(ceil(BT / ceil(V / H))) rows, so a
    chunk's logits are about BT × H values; its Triton kernel turns each chunk's logits into their gradient in place
    (fp32 only in registers); the input gradient (BT × H, the input's dtype) and the LM head's weight gradient (V × H,
    the weight's dtype, when it trains) are made in the forward and saved for the backward, which only scales them.
    So no logits, fp32 copy or log-softmax outlive a chunk, and nothing is left to do at the loss's backward.
    NB: the chunk's input-gradient product (chunk × H) is counted beside its logits; the HF Trainer's labels shift
    (padded copy) and the final hidden states held by the forward stay as for the full loss; Gemma-2's logit
    soft-capping runs inside the kernel. Its kernels, for the step time: analytic/liger_ops.py."""
    a, h, v = st.act, spec.hidden, spec.vocab // setup.tp
    chunk = chunk_rows(tokens, v, h)
    grad_input = a * h * tokens
    lm_head_trains = not setup.lora_rank
    grad_weight = st.weight * v * h if lm_head_trains else 0.0
    loss_1d = FP32 * tokens
    return HeadBytes(
        saved=norm_saved + weight_cast + grad_input + grad_weight + loss_1d + labels,
        labels=INDEX * tokens,
        forward_transient=held + a * chunk * v + a * chunk * h,
        backward_transient=0.0,
        norm_kept=kept,
        norm_backward=norm_bwd,
    )
