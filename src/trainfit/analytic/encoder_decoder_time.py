"""Step and pass times of an encoder-decoder (T5 / mT5, spec.encdec; the kernels: analytic/ops/encoder_decoder.py;
BART's and Whisper's: analytic/ops/encdec_absolute.py), timed by the roofline kernel by kernel as the decoder-only
lists are (compute_time.time_ops):

training step: the encoder's blocks over --seq tokens and the decoder's over --target-seq (each stack's first block
  with the relative bias's computation), both stacks' embeddings and final norms, the head and loss; backward:
  ops.backward of each list plus the backward-only sums (block_grad_sums, encoder_decoder_backward_extra);
  recompute: the checkpointed blocks' re-runs (ops.recomputed per stack);
prefill (generate()'s first forward): the same forward in eval (no dropout) without the loss, lm_head over every
  target position (T5 takes no logits_to_keep); decode: the decoder alone over one token per sequence against
  --target-seq cached ones, its cross-attention over the cached encoder k and v (under autocast its weights' casts
  are the prefill's, cached for the region).
BART and Whisper: the same parts from their own front-ends (no relative bias: every block of a stack alike), generate()'s
  cache cats at the prefill too, and BART's decoder mask rebuilt per forward.
Refused in one line (check_timed): tensor, pipeline and context parallelism of the two stacks, LoRA, Float8 and Liger's
loss (their kernels are listed for decoder-only layers), fp16 and quantised weights (T5's wo kept in fp32); for BART
and Whisper quantised weights and --attention eager (their lists are SDPA's kernels).
NB: checkpointed_layers counts each stack's blocks as a model's layers (per-stack --recompute layer:N / block:N).
"""
from __future__ import annotations

from ..errors import NotModelledError
from ..hardware import GPU
from ..setup import Setup
from ..spec import ModelSpec
from .compute_time import ListTime, StageCompute, time_ops
from .ops import QUANTISED_GEMMS, backward, checkpointed_layers, compiled, recomputed, shape_of
from .ops import encdec_absolute as ab
from .ops import encoder_decoder as ed
from .precision import StateBytes, state_bytes
from .timing import compute_dtype


def check_timed(spec: ModelSpec, setup: Setup) -> None:
    """Refuse, in one line, what the lists do not cover: parallel stacks, LoRA, Float8 and Liger's loss, and fp16 or
    quantised weights, beside which transformers keeps every wo in fp32 (T5PreTrainedModel._keep_in_fp32_modules:
    modeling_utils.py _get_dtype_plan under fp16, and quantizers/base.py get_modules_to_not_convert leaves it a plain
    Linear), so wo's GEMM runs in fp32 and its fp32 output promotes the residual stream to fp32 from the first block
    on."""
    if setup.tp > 1 or setup.pp > 1 or setup.cp > 1:
        raise NotModelledError(f"{spec.name}: an encoder-decoder's step time is modelled on one GPU per replica "
                               "(no --tp, --pp or --cp); use --engine trace for its memory")
    if setup.mode == "train" and (setup.lora_rank or getattr(setup, "low_precision", "none") != "none"
                                  or getattr(setup, "loss", "full") != "full"):
        raise NotModelledError(f"{spec.name}: an encoder-decoder's step time lists its full-precision linears and "
                               "HF's loss only (no --lora-rank, --low-precision or --loss fused-linear kernels); use "
                               "--engine trace")
    dtype = compute_dtype(setup)
    if absolute(spec):
        if dtype in QUANTISED_GEMMS:
            raise NotModelledError(f"{spec.name}: --precision {setup.precision}'s quantised linears are not in the "
                                   "encoder-decoders' op list; time it in bf16, fp16, amp-bf16, amp-fp16 or fp32")
        if ab.stack_shape(shape_of(spec, setup, state_bytes(setup), dtype), setup.seq).attention == "eager":
            raise NotModelledError(f"{spec.name}: the op list has BART's and Whisper's SDPA kernels, not eager "
                                   "attention's; drop --attention eager or use --engine trace")
        return
    if (dtype == "fp16" and not state_bytes(setup).autocast) or dtype in QUANTISED_GEMMS:
        raise NotModelledError(f"{spec.name}: --precision {setup.precision} keeps T5's wo in fp32 (transformers "
                               "_keep_in_fp32_modules: fp16 weights; quantizers leave it unconverted), whose kernels "
                               "the op list does not list; time it in bf16, amp-bf16, amp-fp16 or fp32")


def absolute(spec: ModelSpec) -> bool:
    """Whether the model's kernels are ops/encdec_absolute.py's (BART, Whisper) rather than T5's."""
    return spec.family in ab.LISTED


def shapes(spec: ModelSpec, setup: Setup, st: StateBytes):
    """(the encoder's Shape over --seq tokens, the decoder's over --target-seq)."""
    sh = shape_of(spec, setup, st, compute_dtype(setup))
    mod = ab if absolute(spec) else ed
    return mod.stack_shape(sh, setup.seq), mod.stack_shape(sh, setup.target_tokens)


def dropout_rate(spec: ModelSpec, training: bool) -> float:
    """T5's one dropout_rate (every entry of spec.dropouts: embeddings, attention probabilities, branches); 0 in
    eval."""
    return spec.dropouts[2] if training else 0.0


def forward_lists(spec: ModelSpec, enc, dec, p: float, loss: bool, cache: bool = False) -> dict[str, list]:
    """The forward lists by part: the encoder's first and later blocks, the decoder's, and the ops run once
    (`cache`: generate()'s prefill, BART's and Whisper's cats into it)."""
    s = enc.seq
    if absolute(spec):
        q = ab.dropouts(spec, training=p > 0)  # (p: dropout_rate's, 0 in eval)
        once = (ab.stack_input(spec, enc, q, False) + ab.stack_output(spec, enc) + ab.stack_input(spec, dec, q, True)
                + ab.stack_output(spec, dec) + ab.head_forward(spec, dec, loss))
        enc_block, dec_block = ab.encoder_block(spec, enc, q), ab.decoder_block(spec, dec, s, q, cache=cache)
        return {"encoder_first": enc_block, "encoder": enc_block, "decoder_first": dec_block, "decoder": dec_block,
                "once": once}
    once = (ed.stack_input(spec, enc, p) + ed.stack_output(spec, enc, p) + ed.stack_input(spec, dec, p)
            + ed.stack_output(spec, dec, p) + ed.head_forward(spec, dec, loss))
    return {"encoder_first": ed.encoder_block(spec, enc, p, first=True), "encoder": ed.encoder_block(spec, enc, p),
            "decoder_first": ed.decoder_block(spec, dec, s, p, first=True),
            "decoder": ed.decoder_block(spec, dec, s, p),
            "once": once}


def training_parts(spec: ModelSpec, enc, dec) -> tuple[dict, dict, dict]:
    """A training step's forward lists by part (forward_lists), each part's count and its backward-only ops."""
    lists = forward_lists(spec, enc, dec, dropout_rate(spec, True), loss=True)
    counts = {"encoder_first": 1, "encoder": spec.layers - 1, "decoder_first": 1,
              "decoder": spec.encdec.decoder_layers - 1, "once": 1}
    extra = {"encoder_first": ed.block_grad_sums(spec, enc, False), "encoder": ed.block_grad_sums(spec, enc, False),
             "decoder_first": ed.block_grad_sums(spec, dec, True, enc.tokens),
             "decoder": ed.block_grad_sums(spec, dec, True, enc.tokens),
             "once": (ab.absolute_backward_extra if absolute(spec) else ed.encoder_decoder_backward_extra)(
                 spec, enc, dec)}
    return lists, counts, extra


def stage_lists(spec: ModelSpec, setup: Setup) -> tuple[list, list]:
    """(a training micro-batch's forward ops, its backward ops), uncompiled."""
    check_timed(spec, setup)
    lists, counts, extra = training_parts(spec, *shapes(spec, setup, state_bytes(setup)))
    return ([o for part, ops in lists.items() for o in counts[part] * ops],
            [o for part, ops in lists.items() for o in counts[part] * (backward(ops) + extra[part])])


def stage_compute(spec: ModelSpec, setup: Setup, gpu: GPU, st: StateBytes) -> StageCompute:
    """One micro-batch's forward, backward and recompute of a training step (the module docstring)."""
    check_timed(spec, setup)
    enc, dec = shapes(spec, setup, st)
    lists, counts, extra = training_parts(spec, enc, dec)
    prep = compiled if enc.compile else (lambda ops: ops)  # torch.compile's fused elementwise chains (ops.compiled)
    fwd = bwd = rec = ListTime()
    attn = 0.0
    for part, ops in lists.items():
        n = counts[part]
        fwd = fwd + n * time_ops(gpu, prep(ops))
        bwd = bwd + n * time_ops(gpu, prep(backward(ops) + extra[part]))
        attn += n * time_ops(gpu, [o for o in ops if o.kind == "attention"]).seconds
    for part, blocks in (("encoder", spec.layers), ("decoder", spec.encdec.decoder_layers)):
        rerun = recomputed(spec, setup, lists[part])
        rec = rec + checkpointed_layers(setup, blocks) * time_ops(gpu, prep(rerun))
    return StageCompute(fwd, bwd, rec, attn / max(1, spec.layers + spec.encdec.decoder_layers))


def prefill_decode_lists(spec: ModelSpec, setup: Setup) -> tuple[list, list]:
    """(the prefill's ops, a decode step's ops) of generate(), in eval."""
    check_timed(spec, setup)
    enc, dec = shapes(spec, setup, state_bytes(setup))
    parts = forward_lists(spec, enc, dec, 0.0, loss=False, cache=True)
    prefill = (parts["once"] + parts["encoder_first"] + (spec.layers - 1) * parts["encoder"] + parts["decoder_first"]
               + (spec.encdec.decoder_layers - 1) * parts["decoder"])
    t, s = setup.target_tokens, setup.seq
    if absolute(spec):
        one, q = ab.stack_shape(dec, 1), ab.dropouts(spec, False)
        decode = (ab.stack_input(spec, one, q, True, past=t)
                  + spec.encdec.decoder_layers * ab.decoder_block(spec, one, s, q, cache=True, past=t)
                  + ab.stack_output(spec, one) + ab.head_forward(spec, one, loss=False))
        return prefill, [o for o in decode if not o.name.endswith("weight_casts")]
    one = ed.stack_shape(dec, 1)
    decode = (ed.stack_input(spec, one, 0.0) + ed.decoder_block(spec, one, s, 0.0, first=True, past=t)
              + (spec.encdec.decoder_layers - 1) * ed.decoder_block(spec, one, s, 0.0, past=t)
              + ed.stack_output(spec, one, 0.0) + ed.head_forward(spec, one, loss=False))
    # autocast's weight casts are cached for the autocast region (torch/amp autocast_mode.cpp cached_cast; the cache
    # is cleared on leaving the outermost region), which holds the whole generate(): made at the prefill, reused by
    # every decode step (the trace's decode step casts no weight)
    return prefill, [o for o in decode if not o.name.endswith("weight_casts")]
