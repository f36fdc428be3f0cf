"""The analytic engine: closed-form memory, FLOPs and time for any transformer at any scale (no torch)."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .. import heads, limits, overheads, serving_versions
from ..models.hf_config import for_setup
from ..errors import SetupError
from .unmodelled import check_modelled
from ..estimate import PHASES, Detail, Estimate, Flops, Memory, PassTime, Phase, RLStep, Timing
from ..hardware import GPU
from ..units import fmt_bytes
from ..setup import BY_NAME, Setup
from ..spec import ModelSpec
from . import compile_effects, fit_rule, float8, torchao_optim, vlm
from . import expandable, gpu_support, nvfp4, torchao_recipes
if TYPE_CHECKING:
    from .rl import RLMemory
# _MODE_MODULES: the modules of the other modes (inference, infer_time, encoder_decoder's inference FLOPs for
# --mode infer; serving, serving_time for --mode serve; rl, rl_placement for --mode rl) are imported inside the
# function of their mode, not here: a training estimate (the CLI's default) never reads them, and importing them
# with this module cost ~0.1 s of `trainfit estimate`'s start-up (python -X importtime).
from dataclasses import replace
from .fit_rule import reserve_bytes
from .layout import validate_layout
from .flops import forward_per_token, step_flops
from .foreach_segments import new_segments, parameter_tensors
from .grad_segments import gradient_segments
from .memory import TrainMemory, train_memory
from . import lora
from .mtp import mtp_layers
from .params import count_params, mtp_params
from .parallel import fsdp1
from .parallel.fsdp2 import fsdp2_strategy, reshards_after_forward, side_stream_blocks, torchtitan_fsdp
from .parallel import deepspeed_offload, fsdp_offload
from .precision import fsdp2_mixed_precision, fsdp_policy_on, policy_dtype, state_bytes
from .loss import head_and_loss
from .liger_ops import chunk_rows
from .long_context import rank_tokens, tiled_loss_shards, tiled_mlp_on, tiled_mlp_shards
from .optimizer import state_tensors, temporary_bytes
from .recompute import layer_params
from ..precision import PRECISIONS
from .step_time import layout_step_time, stage_params, with_paged_migration
from .roofline import cluster_table, host_seconds_per_kernel
from .stacks import model_for
from .timing import budget, compute_dtype, mfu_step_terms, step_seconds


def transient_blocks(spec: ModelSpec, setup: Setup, mem: TrainMemory, pc=None) -> list[int]:
    """The blocks of tensors a training step makes and frees before its peak that stay cached beside the peak's
    tensors (overheads.reserved_from_allocated): the largest of the loss's fp32 logits (the torch-native losses upcast:
    stacks/*.toml [loss]; a compiled loss makes none, compile_effects.loss_compiled; Megatron's TE fused loss makes
    none and frees its 16-bit logits instead: StackModel.loss_block_bytes) when the peak's stage holds
    the head, one layer's MLP intermediate (tokens ×
    intermediate / tp), or a tied embedding's partial gradient (vocab × hidden / tp in the gradients' dtype: autograd
    sums the head's and the embedding's partials, in place under autocast, and frees the partial it does not keep
    as the .grad, torch/csrc/autograd/input_buffer.cpp accumulate, at the end of the backward).
    When a request the backward makes after the loss is larger than the logits, it cannot be carved from a
    logits-sized block (get_free_block takes only a block >= the request), and best fit serves the smaller requests
    from smaller blocks, so every logits-sized block the loss held at once stays cached: the saved log-softmax
    output and the loss backward's gradients (analytic/loss.py backward_transient); three blocks in the
    simulator's qwen2.5-0.5b and llama-3.2-1b replays. Those later requests: a tied embedding's partial gradient,
    the input embedding's gradient (vocab × hidden, made at its backward: grads are set to None between steps), and
    under FSDP2 a block's flat reduce-scatter input (its parameters in reduce_dtype, unsharded:
    _fsdp_collectives.py:597-601). NB: Megatron and DeepSpeed keep gradients in preallocated buffers: only the
    tied partial is counted there. NB (reads high at one long sequence per GPU): torchtitan Llama-3.1-8B FSDP 8,
    op SAC, eager, 1 x 8192 tokens, H100: the allocator simulator replaying the trace keeps 2.36 GiB on the compute
    stream beside the 39.60 GiB peak (the loss backward's), where this block (3.91) and the embedding's FSDP2
    copy-out block (0.98) count 4.89: there the loss backward's fp32 gradient takes this very block, and what stays
    free is the embedding's block and fragments; its side streams agree (6.30 vs 6.29); 48.25 vs 50.79 GiB reserved.
    At 2 x 8192 (C2) the fragments are 8.87 GiB (~100 MiB blocks) against 8.81 counted (82.17 vs 82.10 GiB,
    published 82.4): this block stands in for them, right at C2's shape only."""
    if setup.mode != "train" or setup.device != "cuda":
        return []
    st = state_bytes(setup)
    tokens = int(rank_tokens(setup))  # (--cp, --ulysses: the rank's slice of the sequence)
    mlp = mlp_intermediate(spec, setup)
    on_last_stage = setup.pp == 1 or mem.detail["stage"] == setup.pp - 1
    # the loss's largest block: the fp32 logits, or what the stack's loss makes instead (StackModel.loss_block_bytes:
    # Megatron's TE fused cross-entropy keeps the 16-bit logits and makes no fp32 copy)
    logits = int(model_for(setup).loss_block_bytes(setup, tokens * spec.vocab // setup.tp)) \
        if (on_last_stage and spec.causal) else 0
    if compile_effects.loss_compiled(spec, setup):
        logits = 0  # the compiled loss makes no fp32 logits-sized tensor (compile_effects.compiled_head)
    if setup.loss == "tiled" and on_last_stage:  # one slice's fp32 logits (loss.tiled_loss_head)
        logits = -(-tokens // tiled_loss_shards(spec, setup)) * spec.vocab // setup.tp * 4
    if setup.loss == "fused-linear" and on_last_stage:  # Liger's fused head: no whole logits, one chunk's in
        v = spec.vocab // setup.tp  # the activations' dtype (loss.fused_linear_head)
        logits = chunk_rows(tokens, v, spec.hidden) * v * st.act
    if setup.loss == "xentropy" and on_last_stage:  # flash-attn's fused loss: no fp32 copy; its largest block, the
        logits = tokens * spec.vocab // setup.tp * st.act  # logits' 16-bit gradient (loss.xentropy_head)
    if setup.loss == "chunked-logprob":  # TRL's fused head: no whole logits; its largest block, the fp32 input
        logits = tokens * spec.hidden * 4 if on_last_stage else 0  # gradient (analytic/loss.py chunked_logprob_head)
    table = spec.vocab * (spec.embed_proj_dim or spec.hidden) // setup.tp
    tied = table * int(st.param or st.grad) if (spec.tied_embeddings and setup.pp == 1) else 0
    later = tied
    if model_for(setup).torch_data_parallel:
        fsdp = fsdp2_strategy(setup)
        if mem.detail["stage"] == 0:
            later = max(later, table * int((st.reduce or st.grad) if fsdp else st.grad))
        if fsdp:
            later = max(later, int(layer_params(spec, pc or count_params(spec), setup) * (st.reduce or st.grad)))
    if logits and later > logits:
        # the later request gates; it is itself a live gradient (or reused by the next block's), not a cached block
        # NB: the loss backward's blocks are taken as one
        return [max(mlp, tied), logits, int(head_and_loss(spec, setup, st, tokens).backward_transient)]
    return [max(mlp, logits, tied)]


def largest_transient(spec: ModelSpec, setup: Setup, mem: TrainMemory, pc=None) -> int:
    """The bytes of transient_blocks: what reserved holds beside the allocated peak for the step's freed tensors."""
    return sum(transient_blocks(spec, setup, mem, pc))


def mlp_intermediate(spec: ModelSpec, setup: Setup) -> int:
    """Bytes of one layer's MLP intermediate on a rank (tokens × intermediate / tp in the activations' dtype): the
    largest activation block a layer frees."""
    tokens = int(rank_tokens(setup))
    if tiled_mlp_on(setup):  # DeepSpeed's TiledMLP: one slice's intermediate at a time
        tokens = -(-tokens // tiled_mlp_shards(spec, setup))
    return tokens * (spec.intermediate or 4 * spec.hidden) // setup.tp * state_bytes(setup).act


def backward_peak(mem: TrainMemory) -> int:
    """The allocated high point of the forward and backward: every phase's but optimizer.step()'s."""
    return max(v for k, v in mem.phases.items() if k != "optimizer_step")


def _torch_optim_on_cuda(setup: Setup) -> bool:
    """A CUDA training step whose torch.optim optimizer steps every parameter's own gradient: the hf and torchtitan
    stacks (Megatron and DeepSpeed step flat buffers: analytic/stacks), without LoRA (a few small adapters)."""
    return setup.mode == "train" and setup.device == "cuda" and model_for(setup).torch_optimizer \
        and not setup.lora_rank


def foreach_segments(spec: ModelSpec, setup: Setup, mem: TrainMemory, pc=None, blocks: list[int] | None = None) -> int:
    """The segments foreach AdamW's exp_avg_sq_sqrt opens at optimizer.step() (analytic/foreach_segments.py): its
    per-parameter tensors placed into the blocks cached at the end of the backward (`blocks`: transient_blocks,
    when the caller has them)."""
    if not _torch_optim_on_cuda(setup) or setup.optimizer_kernel != "foreach" \
            or setup.optimizer not in ("adam", "adamw"):
        return 0
    if blocks is None:
        blocks = transient_blocks(spec, setup, mem, pc)
    live = mem.weights + mem.gradients + mem.master + mem.optimizer + mem.comm_buffers
    st = state_bytes(setup)
    temporaries = [(n * temporary_bytes(setup, st), c) for n, c in parameter_tensors(spec, setup)]
    # the activations' cache: what the backward reserved beside the transient blocks, less what stays live
    return new_segments(temporaries, blocks, mlp_intermediate(spec, setup), max(0, backward_peak(mem) - live))


def grad_segments(spec: ModelSpec, setup: Setup, mem: TrainMemory, blocks: list[int]) -> int:
    """The gradients' own segments, free at a forward/backward peak (analytic/grad_segments.py): where torch.optim
    steps per-parameter gradients the stack allocates (hf, torchtitan; no ZeRO or FSDP), the fused or for-loop
    kernel."""
    if not _torch_optim_on_cuda(setup) or setup.optimizer_kernel == "foreach" or setup.zero or fsdp2_strategy(setup):
        return 0  # (ZeRO / FSDP: sharded gradients and states, in flat buffers or DTensors)
    if mem.phases.get("optimizer_step", 0) >= backward_peak(mem):
        return 0  # the peak is optimizer.step()'s, when the gradients are live in it
    st = state_bytes(setup)
    per = temporary_bytes(setup, st)
    states = state_tensors(setup, st)
    return gradient_segments(spec, setup, st.grad, per, states, mlp_intermediate(spec, setup), blocks,
                             int(mem.at_peak.get("gradients", 0)))


def _side_streamed(setup: Setup) -> bool:
    """Whether the step runs FSDP2's side streams (fsdp2_side_streams): FSDP2 on CUDA."""
    return setup.device == "cuda" and bool(fsdp2_strategy(setup))


def _reserved_note(spec: ModelSpec, setup: Setup, beside: dict, held: dict) -> str:
    """overheads.describe for a training step: its cached blocks, a tied embedding's gradient where the model ties
    it, FSDP2's side-stream blocks where it runs them."""
    return overheads.describe(beside, held, cached_block=True, tied=spec.tied_embeddings,
                              side_streams=_side_streamed(setup))


def fsdp2_side_streams(spec: ModelSpec, setup: Setup, mem: TrainMemory, pc=None) -> int:
    """FSDP2's blocks on its side streams, which the compute stream cannot reuse (parallel/fsdp2.py
    side_stream_blocks; trace/streams.py for the file:line facts), beyond what the allocated peak already counts:
    - all-gather copy-in stream: one segment per group kind's all-gather output (+ the cast shards), freed at
      once after the copy-out, so none of it is in the peak's tensors (the copy-out targets are, on stream 0);
    - reduce-scatter stream: the reduce-scatter outputs, one flat buffer per group in reduce_dtype, which ARE the
      sharded gradients (_fsdp_collectives.py:611-616, live to zero_grad): their blocks stay reserved on that
      stream when the peak comes before they exist (grads set to None: forward, early backward), so only what
      the peak's gradients do not cover is added.
    Groups: torchtitan's (embedding, each block, [norm, output]; parallel/fsdp2.py groups) or trainfit's hf
    strategy (each decoder layer, the root holding embedding + final norm + head: step/strategy.py)."""
    if not _side_streamed(setup):
        return 0
    pc = pc or count_params(spec)
    st = state_bytes(setup)
    t, stage = setup.tp, mem.detail["stage"]
    first, last = stage == 0, stage == setup.pp - 1
    lp = layer_params(spec, pc, setup)
    layers = mem.detail["layers_on_rank"]
    head = (pc.final + pc.lm_head / t) * last
    if torchtitan_fsdp(setup):
        kinds = {"embedding": pc.embedding / t * first, "layer": lp, "head": head}
    else:
        kinds = {"root": pc.embedding / t * first + head, "layer": lp}
    trained = kinds
    if setup.lora_rank:  # LoRA: a layer gathers its frozen base and adapters; only the adapters are reduced
        lp_g = layer_params(spec, lora.gathered_counts(spec, setup, pc, st), setup)
        kinds, trained = {**kinds, "layer": lp_g}, {"root": 0, "layer": lora.adapter_params_per_layer(spec, setup)}
    # FSDP1: no all-gather output beside the unsharded flat parameters (parallel/fsdp1.py)
    copy_in = fsdp1.side_stream_blocks(kinds, st, setup) if fsdp1.runs_fsdp1(setup) else \
        side_stream_blocks(kinds, st, setup)
    # compute stream: torchtitan reshards the embedding after forward and [norm, output] after its backward; their
    # unsharded parameters' blocks (copy-out targets, param_dtype, _fsdp_param.py:616-627 alloc_storage, per
    # parameter) stay cached, larger than any block request after them, beside a peak that comes later. A peak at the
    # loss's backward (memory.py detail loss_backward_allocated) comes before the head's backward: the output weight
    # is then still unsharded and counted in the peak itself, only the embedding's block is beside it (the allocator
    # simulator replaying torchtitan Llama-3.1-8B, FSDP 8, op SAC at 1 and 2 x 8192 tokens: the largest free block
    # on the compute stream at that peak is the embedding's, 0.92-1.44 GiB, and no second one of the output's size).
    # NB: counts the embedding's and the output weight's blocks only (norms are small-pool bytes).
    p = st.param or st.weight
    head_cached = last and mem.detail.get("loss_backward_allocated") != mem.peak
    copy_out = (overheads.held_segments(((pc.embedding / t * first * p, 1), (pc.lm_head / t * head_cached * p, 1)))
                if torchtitan_fsdp(setup) and reshards_after_forward(setup) else 0)
    r = st.reduce or st.grad
    reduce_out = overheads.held_segments((n * r / setup.dp, layers if k == "layer" else 1) for k, n in trained.items())
    if r != st.grad:
        # a reduce_dtype unlike the shards' (hf: accelerate's bf16): the reduce-scatter output is cast to the fp32
        # gradient shard on the same stream (_fsdp_collectives.py:696, _to_dtype_if_needed), and the low-precision
        # output, freed, is reused by the next group's: one block of the largest kind beside the fp32 shards
        reduce_out = overheads.held_segments([(n * st.grad / setup.dp, layers if k == "layer" else 1)
                                              for k, n in trained.items()] + [(max(trained.values()) * r / setup.dp, 1)])
    return copy_in + copy_out + max(0, reduce_out - int(mem.at_peak.get("gradients", 0)))


def step_reserve(spec: ModelSpec, setup: Setup, mem: TrainMemory, pc=None, expandable_segments: bool = False) -> int:
    """What the training step's own tensors hold in the caching allocator when nothing limits it (reserved: an
    unconstrained run's cache; the fit is judged on fit_rule.required): the allocated peak, the cached blocks
    of its freed tensors (transient_blocks) and FSDP2's side-stream blocks (overheads.reserved_from_allocated,
    checked against the allocator simulator: bench/studies/alloc_fragmentation.py), the gradients' own segments free at the
    peak (grad_segments; bench/studies/grad_segments.py); under foreach AdamW, the segments its temporaries open, counted
    from the backward's peak (foreach_segments; bench/studies/foreach_reserved.py). pc: the model's ParamCounts when the
    caller has them. expandable_segments: the allocator grows one segment per stream (analytic/expandable.py)."""
    side = fsdp2_side_streams(spec, setup, mem, pc)
    if expandable_segments:
        on_head = setup.pp == 1 or mem.detail["stage"] == setup.pp - 1
        hole = expandable.loss_hole(head_and_loss(spec, setup, state_bytes(setup), int(rank_tokens(setup)))) \
            if on_head else 0
        return expandable.reserved(mem, hole, side)
    blocks = transient_blocks(spec, setup, mem, pc)
    opened = foreach_segments(spec, setup, mem, pc, blocks)
    if opened:  # the temporaries are in the cache or their own segments, not on top of the backward's blocks
        return max(mem.peak, overheads.reserved_from_allocated(backward_peak(mem), sum(blocks), side) + opened)
    return overheads.reserved_from_allocated(mem.peak, sum(blocks), side) + grad_segments(spec, setup, mem, blocks)


def infer_reserve(spec: ModelSpec, setup: Setup, m) -> int:
    """What an inference run's own tensors hold in the caching allocator: the prefill's peak and, as in training
    (reserved_from_allocated), the cached block of the largest tensor it freed before its peak, one layer's MLP
    intermediate; a decode peak above that is carved from the cache or added. Against the allocator simulator
    replaying the traced prefill + decode (itself within 1 % of both inference steps measured on an H200, bench/
    results/trace_reserved.md), 8 setups of llama-3.2-1b/3b, qwen2.5-0.5b/1.5b and gpt2 at 2k-16k tokens: -4.7 to
    -0.5 %, mean |error| 2.0 % (peak alone: -10.1 to -1.5 %). NB: reads low. On CPU the peak."""
    if setup.device != "cuda":
        return max(m.prefill_peak, m.decode_peak)
    return max(overheads.reserved_from_allocated(m.prefill_peak, mlp_intermediate(spec, setup)), m.decode_peak)


def estimate(spec: ModelSpec, setup: Setup, gpu: GPU | None = None, mfu: float | None = None,
             tokens: float | None = None, reserve: float = BY_NAME["reserve"].default,
             alloc_conf: str | None = None) -> Estimate:
    """The estimate of `setup` (see _estimate); a vision-language model's language model runs over the text and
    image tokens (analytic/vlm.py language_setup), the estimate shows the setup as given. alloc_conf: the caching
    allocator's settings (--alloc-conf); the analytic engine models expandable_segments (analytic/expandable.py)."""
    from ..alloc.config import parse_alloc_conf

    if alloc_conf is not None and not alloc_conf.strip():
        raise SetupError("--alloc-conf is empty: give key:value pairs (e.g. expandable_segments:True), or drop it")
    es = expandable.check(parse_alloc_conf(alloc_conf) if alloc_conf else None,
                          setup.mode == "train" and setup.device == "cuda")
    lm = vlm.language_setup(spec, setup)
    est = _estimate(spec, lm, gpu, mfu, tokens, reserve, es)
    limits.check_device_bytes(est.memory.device_total or est.memory.peak)
    return est if lm is setup else replace(est, setup=setup)


def _estimate(spec: ModelSpec, setup: Setup, gpu: GPU | None = None, mfu: float | None = None,
              tokens: float | None = None, reserve: float = BY_NAME["reserve"].default,
              expandable_segments: bool = False) -> Estimate:
    """mfu: None times a training step with the step-time model (analytic/step_time.py: each kernel of the op list
    timed by the roofline + exposed communication + bubble + optimizer, the planner's model); a number overrides it
    with a flat model-FLOPs utilisation. reserve: extra GiB per GPU kept free when judging the fit (fit_rule.py:
    fits = required <= GPU memory - reserve - the fixed overheads)."""
    spec = for_setup(spec, setup)  # the model with the head this setup trains (--head / architectures)
    reserve = reserve_bytes(reserve)
    if mfu is not None and not 0 < mfu <= 1:
        raise SetupError(f"--mfu must be in (0, 1], got {mfu}")
    if tokens is not None and tokens <= 0:
        raise SetupError(f"--tokens must be positive, got {tokens}")
    validate_layout(spec, setup)
    if setup.mode != "serve":  # serving sizes the engine's own profile run (analytic/serving.py), not these terms
        # with a GPU and no --mfu the op list times each pass (ops/layer.py asks again); without, nothing is timed
        # (--mode infer times its decode step op by op under --mfu too)
        check_modelled(spec, kernels=gpu is not None and (mfu is None or setup.mode == "infer"))
    gpu_support.check_gpu(setup, gpu)
    nvfp4.check(spec, setup, gpu)  # torchao's NVFP4 kernels: every GEMM dim a multiple of 128
    pc = count_params(spec)
    if setup.mode == "infer":
        return _infer(spec, setup, pc, gpu, mfu, reserve)
    if setup.mode == "serve":
        return _serve(spec, setup, pc, gpu, mfu, reserve)
    if setup.mode == "rl":
        return _rl(spec, setup, pc, gpu, mfu, reserve)
    mem = train_memory(spec, setup, pc)
    f = step_flops(spec, setup, pc)
    ranks_per_replica = setup.tp * setup.pp
    fwd_rank = f.forward / ranks_per_replica
    bwd_rank = f.backward / ranks_per_replica
    rec_rank = f.recompute / ranks_per_replica
    flops = Flops(int(fwd_rank), int(bwd_rank), int(rec_rank), int(fwd_rank + bwd_rank + rec_rank),
                  int(fwd_rank + bwd_rank), int(f.per_token))
    at = mem.at_peak
    needed = expandable.required(mem) if expandable_segments else fit_rule.required(spec, setup, mem, pc)
    reserved, device_total, beside, held = overheads.device_memory(
        step_reserve(spec, setup, mem, pc, expandable_segments), gpu, setup, needed, spec)
    paged, evicted, host = mem.paged_optimizer_states or 0, 0, mem.host_memory
    if paged and gpu is not None:  # unified memory: resident where the rest leaves room, else on the host
        device_total, evicted = overheads.with_paged(device_total, beside, paged, gpu, reserve)
        if evicted:
            host = (host or 0) + evicted
    memory = Memory(
        weights=mem.weights, gradients=mem.gradients, optimizer_states=mem.optimizer, master_weights=mem.master,
        activations=mem.activations, temporaries=at.get("temporaries", 0) + mem.comm_buffers, kv_cache=0,
        peak=mem.peak, peak_phase=mem.peak_phase, phases=mem.phases, at_peak=at,
        reserved=reserved, device_total=device_total, overheads=beside, required=needed,
    )
    timing = fit = tm = None
    if gpu is not None:
        if mfu is None:
            tm = with_paged_migration(layout_step_time(spec, setup, gpu, pc=pc), evicted, gpu)
            secs, achieved = tm.step_seconds, tm.mfu
            terms = tm.as_dict()
        else:
            secs = step_seconds(flops.step, gpu, setup, mfu)
            achieved = mfu * flops.model_step / flops.step
            terms = mfu_step_terms(flops.step, gpu, setup, mfu)
        tps = setup.tokens_per_step / secs
        extra = budget(tokens, tps, setup.world_size, gpu, terms) if tokens else {}
        # the fit rule (fit_rule.py); paged states resident on the device take what the step leaves
        fit = fit_rule.verdict(gpu, setup, needed, reserve, paged, spec)
        # and the node's host memory: the offloaded states and pinned buffers of its ranks (fit_rule.host_verdict)
        fit = fit_rule.host_verdict(fit, gpu, setup, host or 0)
        timing = Timing(gpu=gpu.name, mfu=achieved, step_seconds=secs,
                        tokens_per_second=tps, fits=fit.fits, headroom=fit.headroom,
                        gpu_memory=gpu.memory, **extra)
    notes = [f"attention kernel: {attention_words(spec, setup)}; optimizer {setup.optimizer_kernel} ({setup.device} "
             f"semantics); stack {setup.stack}"]
    notes += compile_effects.notes(spec, setup) + float8.notes(spec, setup, gpu if mfu is None else None)
    notes += torchao_recipes.notes(spec, setup, gpu if mfu is None else None)
    stack_model = model_for(setup)
    # the stack's warnings begin "warning:", as the estimate's others do (what --engine all's side-by-side prints)
    notes += stack_model.notes(spec, setup) + [f"warning: {w}" for w in stack_model.warnings(spec, setup, gpu)]
    if fsdp_policy_on(setup):
        version = "FSDP1 (FlatParameter per unit)" if fsdp1.runs_fsdp1(setup) else "FSDP2"
        rd = policy_dtype(setup, "reduce_dtype")
        if fsdp2_mixed_precision(setup):
            notes.append(f"{version} mixed precision: fp32 shards; each group all-gathered in "
                         f"{PRECISIONS[setup.precision].compute} for compute, gradients reduce-scattered in "
                         f"{PRECISIONS[setup.precision].compute if rd == 'none' else rd}; "
                         + ("autocast on, over low-precision weights (no weight casts)"
                            if setup.stack_facts.fact("mixed_precision") == "autocast" else "no autocast"))
        else:
            notes.append(f"{version} without a param_dtype: fp32 shards all-gathered in fp32, autocast casting each "
                         f"weight per use; gradients reduce-scattered in {'fp32' if rd == 'none' else rd}")
    if gpu is not None:
        notes.append(_fit_note(fit) if not expandable_segments else
                     EXPANDABLE_NOTE.format(hole=fmt_bytes(reserved - sum(held.values()) - mem.peak)))
        short = fit_rule.host_note(fit, setup, gpu)
        if short:
            notes.append(short)
        notes.append(_reserved_note(spec, setup, beside, held))
        notes.append("step time from FLOPs at the stated --mfu (an override; communication not included)" if mfu is not None
                     else "step time: the planner's model (each GEMM, attention and memory-bound kernel of the step "
                          "timed by the roofline, analytic/ops/ + roofline.py, + exposed communication, bubble, "
                          "optimizer, + host issue: the GPU waiting on an eager host's kernel launches, "
                          f"kernels x {host_seconds_per_kernel() * 1e6:.1f} µs measured on an H200's host, when "
                          "they outlast the kernels, + straggler: the job's slowest GPU, chips' compute rates "
                          f"spread {cluster_table()['compute_spread']:.1%} under a power cap, measured on H200s); "
                          "--mfu overrides it")
        if paged:
            notes.append(f"--optimizer {setup.optimizer}: {fmt_bytes(paged)} of states in CUDA unified memory "
                         "(bitsandbytes' paged buffers), not in torch's allocated/reserved; on the device while "
                         "they fit, the rest evicted to the host (host memory) and migrated back and forth each step "
                         "(step term 'host copies', at the host link's line rate: NB optimistic)")
        if torchao_optim.offload_runs(setup):  # NB: optimistic (line rates)
            notes.append(torchao_optim.OFFLOAD_NOTE)
        if deepspeed_offload.runs(setup):  # NB: optimistic (line rates)
            notes.append(deepspeed_offload.NOTE)
        if fsdp_offload.runs(setup):  # NB: optimistic (line rates)
            notes.append(fsdp_offload.note(setup))
        if setup.offload_activations:  # NB: optimistic (line rate)
            notes.append("--offload activations: host copies at the PCIe line rate, each overlapped with its pass "
                         "as torchtune's side stream does (step term 'host copies': what stays exposed)")
    # peft's adapters join the model's parameters; only they train (analytic/lora.py)
    trainable = lora.adapter_params(spec, setup) if setup.lora_rank else None
    detail = Detail(params_active=pc.active, params_trainable=trainable, head=spec.task_head,
                    num_labels=spec.num_labels if spec.task_head in heads.CLASSIFIERS else None, host_memory=host,
                    paged_optimizer_states=mem.paged_optimizer_states, step_time=tm, records=mem.detail)
    # the multi-token-prediction layers the stack trains (mtp.py) join the model's parameters, as the ranks hold them
    n_mtp = mtp_layers(spec, setup)
    extra = mtp_params(spec, n_mtp) if n_mtp else 0
    if extra:
        notes.append(f"parameters: the model's {pc.total:,} and {n_mtp} multi-token-prediction layer"
                     f"{'s' if n_mtp > 1 else ''} the stack trains, {extra:,} (--mtp-layers; transformers builds "
                     "none)")
    return Estimate("analytic", spec.name, pc.total + (trainable or 0) + extra, mem.params,
                    setup, memory, flops, timing, tuple(notes), detail, fit)


def _fit_note(fit) -> str:
    """The fit rule in words, with this verdict's numbers (fit_rule.py)."""
    return (f"fits = the step's requests can be served at capacity: required {fmt_bytes(fit.required)} (allocated "
            "peak + the fragmentation the caching allocator cannot release: the largest freed block a later tensor "
            f"was carved from, segment rounding) <= capacity {fmt_bytes(fit.capacity)} (GPU memory as CUDA reports "
            "it: nvidia-smi's total less the driver's reserve, `trainfit gpus`; less --reserve and the fixed "
            "overheads); reserved is what an unconstrained run caches: when cudaMalloc fails, PyTorch frees its "
            "cached free segments and retries before it raises")


EXPANDABLE_NOTE = ("--alloc-conf expandable_segments:True: one segment per stream grows by 20 MiB pages; reserved "
                   "is its high-water mark: the allocated peak, or the loss backward's bytes beside the free range "
                   "its freed logits leave ({hole} beside the peak); fits = the allocated peak <= capacity (the OOM "
                   "retry unmaps free pages; analytic/expandable.py)")


def _infer(spec, setup, pc, gpu, mfu, reserve) -> Estimate:
    from . import encoder_decoder, infer_time, inference  # noqa: PLC0415 (see _MODE_MODULES)

    m = inference.infer_memory(spec, setup, pc)
    peak_phase = "prefill" if m.prefill_peak >= m.decode_peak else "decode"
    peak = max(m.prefill_peak, m.decode_peak)
    phases = {"prefill": m.prefill_peak, "decode": m.decode_peak} if spec.causal else {"prefill": m.prefill_peak}
    fpt = forward_per_token(spec, setup.seq, pc)
    prefill_flops = (fpt * setup.batch * setup.seq + vlm.tower_forward_flops(spec, setup)) / (setup.tp * setup.pp)
    if spec.encdec is not None:  # two stacks over --seq and --target-seq tokens (encoder_decoder.py): per prompt token
        fpt = encoder_decoder.prefill_flops(spec, setup) / (setup.batch * setup.seq)
        prefill_flops = fpt * setup.batch * setup.seq / (setup.tp * setup.pp)
    needed = fit_rule.infer_required(spec, setup, m)
    reserved, device_total, beside, held = overheads.device_memory(infer_reserve(spec, setup, m), gpu, setup, needed)
    # what the peak holds, adding up to it: the weights and the cache, the prefill's largest layer transient where
    # the prefill peaks, and the rest (the logits, the prompt ids, autocast's casts, the moment's other tensors:
    # inference.infer_memory) as temporaries
    states = m.weights + m.kv_cache
    acts = min(m.activations, max(0, peak - states)) if peak_phase == "prefill" else 0
    memory = Memory(weights=m.weights, gradients=0, optimizer_states=0, master_weights=0, activations=m.activations,
                    temporaries=m.logits, kv_cache=m.kv_cache, peak=peak, peak_phase=peak_phase,
                    phases=phases, reserved=reserved, device_total=device_total, overheads=beside, required=needed,
                    at_peak={"weights": m.weights, "kv_cache": m.kv_cache, "activations": acts,
                             "temporaries": max(0, peak - states - acts)})
    flops = Flops(int(prefill_flops), 0, 0, int(prefill_flops), int(prefill_flops), int(fpt))
    timing = fit = prefill = decode = None
    modelled = mfu is None
    if gpu is not None:
        fit = fit_rule.verdict(gpu, setup, needed, reserve)  # the largest batch and context: the same rule
        if modelled:  # each pass's op list, timed as the training step's (analytic/infer_time.py)
            pre, dec = infer_time.prefill_decode(spec, setup, gpu, pc)
            prefill_s, decode_s = pre.seconds, dec.seconds if dec else None
            mfu = prefill_flops / (prefill_s * gpu.flops_for(compute_dtype(setup)))
            prefill = PassTime(pre.gpu.seconds, pre.gpu.kernels, pre.host_bound)
            decode = PassTime(dec.gpu.seconds, dec.gpu.kernels, dec.host_bound) if dec else None
        else:  # --mfu names the prefill's utilisation: the prefill at it; the decode step still op by op
            prefill_s = prefill_flops / (gpu.flops_for(compute_dtype(setup)) * mfu)
            dec = infer_time.prefill_decode(spec, setup, gpu, pc)[1]
            decode_s = dec.seconds if dec else None
            decode = PassTime(dec.gpu.seconds, dec.gpu.kernels, dec.host_bound) if dec else None
        timing = Timing(gpu=gpu.name, mfu=mfu, step_seconds=prefill_s, tokens_per_second=setup.batch * setup.seq / prefill_s,
                        fits=fit.fits, headroom=fit.headroom, gpu_memory=gpu.memory,
                        prefill_seconds=prefill_s,
                        decode_tokens_per_second=setup.batch / decode_s if decode_s else None,
                        max_batch=inference.largest_batch(spec, setup, fit.capacity), max_batch_tokens=setup.seq,
                        max_seq=inference.largest_context(spec, setup, fit.capacity))
    notes = [f"KV cache in {inference.kv_dtype(spec, setup)}; " + (
        "prefill and decode timed op by op (the training step's kernel model) and by the host's kernel issue"
        if modelled else f"prefill at --mfu {mfu:.0%}; the decode step timed op by op")]
    if gpu is not None:
        notes += [_fit_note(fit), overheads.describe(beside, held)]
    return Estimate("analytic", spec.name, pc.total, stage_params(spec, pc, setup.tp, setup.pp), setup, memory, flops,
                    timing, tuple(notes), Detail(params_active=pc.active,
                                                 kv_bytes_per_token=inference.kv_bytes_per_token(spec, setup),
                                                 prefill=prefill, decode=decode), fit)


def _serve(spec, setup, pc, gpu, mfu, reserve) -> Estimate:
    """--mode serve: vLLM's start-up sizing (analytic/serving.py), the device total, and TTFT, TPOT and output
    tokens/s at --concurrency (analytic/serving_time.py: engine steps op by op, continuous batching)."""
    from . import serving, serving_time  # noqa: PLC0415 (see _MODE_MODULES)

    if gpu is None:
        raise SetupError("--mode serve sizes the KV cache from the GPU's memory: add --gpu (see `trainfit gpus`)")
    if serving_versions.engine_of(setup.server) == "sglang":
        return _serve_sglang(spec, setup, pc, gpu, mfu, reserve)
    sv = serving.serve_memory(spec, setup, gpu, pc)
    k = sv.knobs
    graphs = (f" − CUDA graphs ({len(k.capture_sizes)} sizes)" if sv.graphs_in_kv else
              f" (its CUDA graphs, {len(k.capture_sizes)} sizes, are captured after the KV cache, outside this budget)")
    sizing = (f"KV cache = --kv-cache-memory-bytes, taken as given = {fmt_bytes(sv.available_kv)} (the profile run "
              f"still runs; whether it all fits is the device total below); gpu_memory_utilization {k.utilization} "
              "then only sets the free memory vLLM asks for at start-up, total × it (v1/worker/gpu_worker.py "
              "init_device), which an otherwise empty GPU has" if setup.kv_cache_memory else
              f"requested = total × {k.utilization} = {fmt_bytes(sv.requested)}; KV cache = requested − weights − "
              f"profile-run peak ({k.max_num_batched_tokens} tokens, {k.max_num_seqs} sequences) − non-torch "
              f"({fmt_bytes(sv.non_torch)}){graphs} = {fmt_bytes(sv.available_kv)}")
    notes = [f"vLLM {k.version}: {sizing} → {sv.kv_blocks:,} blocks of {k.block_size} tokens ({k.kv_dtype} KV)",
             ("vLLM 0.8.x counts the CUDA context, NCCL and cuBLAS inside --gpu-memory-utilization (the non-torch "
              "term above: every non-torch byte on the device)" if sv.non_torch_on_device else
              "the CUDA context, NCCL and cuBLAS come before vLLM's baseline snapshot: outside "
              "--gpu-memory-utilization, in the device total") +
             "; the total is CUDA's (cudaMemGetInfo), as vLLM reads it: nvidia-smi's less the "
             f"driver's reserve, {fmt_bytes(gpu.smi_memory - gpu.memory)} here (NB: by driver version; set --gpu-memory "
             "to the total_gpu_memory vLLM logs)",
             _load_note(setup, mfu)]
    # a request of max_model_len must fit (vLLM raises at start-up otherwise: kv_cache_utils.py, "max seq len ...
    # larger than the maximum number of tokens that can be stored in KV cache")
    starts = sv.kv_blocks >= sv.blocks_per_request
    if not starts:
        notes.append(f"does not start: {sv.kv_tokens:,} KV tokens < --max-model-len {k.max_model_len} (vLLM raises); "
                     "lower --max-model-len, " + ("raise --kv-cache-memory or add --tp" if setup.kv_cache_memory
                                                  else "raise --gpu-memory-utilization, add --tp or --quant"))
    # vLLM raises at start-up when the free memory at its snapshot (the total less what is on the device before it:
    # the CUDA context, NCCL) is under requested (0.11.0 v1/worker/gpu_worker.py:185-195; 0.33.0 v1/worker/utils.py
    # request_memory :716-770)
    at_start = gpu.memory - sum(overheads.overheads(gpu, setup).values())
    if at_start < sv.requested:
        starts = False
        notes.append(f"does not start: free memory at start {fmt_bytes(at_start)} < requested {fmt_bytes(sv.requested)} "
                     "(vLLM raises 'Free memory on device ... is less than desired GPU memory utilization'); lower "
                     "--gpu-memory-utilization")
    load = serving_time.vllm(spec, setup, gpu, pc, sv, mfu) if sv.kv_tokens >= setup.prompt_len + setup.completion_len \
        else None
    return _serving_estimate(spec, setup, pc, gpu, reserve, sv, sv.activations, sv.cuda_graphs, starts, load,
                             k.max_model_len, notes)


def _serve_sglang(spec, setup, pc, gpu, mfu, reserve) -> Estimate:
    """--mode serve --server sglang: SGLang's static-fraction sizing (analytic/serving_sglang.py). The device
    total counts the weights, the KV pool, the CUDA context and NCCL, and what lives in the headroom SGLang leaves
    (pre × (1 − mem_fraction_static)): the largest eager activation and the CUDA graphs; a headroom too small for
    them is a warning with the numbers (SGLang itself does not check)."""
    from . import serving_time  # noqa: PLC0415 (see _MODE_MODULES)

    from . import serving_sglang as sg

    sv = sg.serve_memory(spec, setup, gpu, pc)
    k = sv.knobs
    notes = [f"SGLang {k.version}: mem_fraction_static {k.mem_fraction_static} of the free memory at "
             f"start ({fmt_bytes(sv.pre_model_load)}) = {fmt_bytes(sv.requested)}; KV pool = that − weights"
             f"{' − the Mamba state pool' if sv.state_slots else ''} = "
             f"{fmt_bytes(sv.available_kv)} → max_total_num_tokens {sv.kv_tokens:,} ({sv.kv_bytes_per_token:,} "
             f"bytes per token, {k.kv_dtype} KV), max_running_requests {sv.max_running_requests}",
             f"outside the fraction ({fmt_bytes(sv.headroom)}): activations {fmt_bytes(sv.activations)} (a "
             f"{k.chunked_prefill_size}-token chunk, or the logits of "
             f"{min(sv.max_running_requests, k.chunked_prefill_size)} requests) + CUDA graphs {fmt_bytes(sv.cuda_graphs)} (decode up to batch {k.cuda_graph_max_bs}, "
             f"{k.prefill_graph_sizes} prefill sizes)",
             _load_note(setup, mfu)]
    if sv.state_slots:
        notes.append(f"linear-attention / Mamba states: {sv.state_slots:,} slots of {fmt_bytes(sv.state_bytes)} per "
                     f"request (max_mamba_cache_size, mamba_full_memory_ratio 0.9 of the rest) before the token pool, "
                     f"in the KV pool's bytes; running requests capped at slots // 5")
    if sv.swa_tokens:
        notes.append(f"hybrid SWA: {sv.kv_tokens:,} full-layer tokens and {sv.swa_tokens:,} sliding-layer tokens "
                     "(swa_full_tokens_ratio 0.8)")
    if sv.draft is not None:
        d = sv.draft
        notes.append(f"speculative {d.algorithm} ({d.model or 'the target MTP layers'}): draft weights "
                     f"{fmt_bytes(d.weights)} in the fraction; its {d.layers} layer(s) add to each token's cell at the "
                     f"target's per-layer size (SGLang's pool_configurator); the target verifies {d.draft_tokens} "
                     f"tokens per request ({d.steps} steps, top-k {d.topk})")
    if sv.remainder_short:
        notes.append(f"warning: mem_fraction_static {k.mem_fraction_static} leaves {fmt_bytes(sv.headroom)} outside "
                     f"the pool, {fmt_bytes(sv.remainder_short)} short of the activations and CUDA graphs "
                     f"({fmt_bytes(sv.remainder_needs)}); SGLang starts and then runs out of memory at graph capture "
                     f"or the first full chunk: --mem-fraction-static {sv.largest_fraction()} or lower")
    if sv.kv_tokens < k.context_length:
        notes.append(f"a request of --max-model-len {k.context_length} does not fit the {sv.kv_tokens:,}-token pool; "
                     "lower --max-model-len, raise --mem-fraction-static, add --tp or --quant")
    load = serving_time.sglang(spec, setup, gpu, pc, sv, mfu) if sv.kv_tokens >= setup.prompt_len + setup.completion_len \
        else None
    return _serving_estimate(spec, setup, pc, gpu, reserve, sv, sv.activations, sv.cuda_graphs, sg.fits(sv), load,
                             k.context_length, notes)


def _load_note(setup, mfu) -> str:
    return (f"throughput at {setup.concurrency or 'the most'} concurrent requests of {setup.prompt_len} + "
            f"{setup.completion_len} tokens: continuous batching, each engine step op by op (its GEMMs at the step's "
            "tokens, attention over the cached K/V, TP all-reduces, the sampler, CUDA graphs or eager launches)"
            + (f"; prefill tokens at --mfu {mfu:.0%}" if mfu is not None else ""))


def _target_note(setup, load) -> str:
    """--request-rate: the replicas of this engine it needs, each completing its requests at the steady state's
    rate (serving_time: running / a request's life); --ttft-ms: whether the TTFT at this load meets it."""
    out = []
    if setup.request_rate:
        per = load.output_tokens_per_second / load.output  # requests per second, one replica
        out.append(f"--request-rate {setup.request_rate:g}/s needs {math.ceil(setup.request_rate / per)} replica(s) "
                   f"of this engine ({per:.3g} requests/s each at {load.concurrency} in flight)")
    if setup.ttft_ms:
        ttft = load.ttft * 1e3
        out.append(f"TTFT {ttft:.1f} ms {'within' if ttft <= setup.ttft_ms else 'over'} --ttft-ms {setup.ttft_ms:g}")
    return "; ".join(out)


def _serving_estimate(spec, setup, pc, gpu, reserve, sv, activations, graphs, starts, load, max_seq,
                      notes) -> Estimate:
    """The Estimate of a serving engine, either server: its budget as used (weights, `activations`, CUDA `graphs`,
    the KV pool) as the peak, the device total around it, and its steady state under load (`load`,
    serving_time.ServingTime; None when no request fits); it fits when the engine starts (`starts`) and the device
    total fits."""
    peak = sv.weights + activations + graphs + sv.kv_pool
    reserved, device_total, beside, held = overheads.device_memory(peak, gpu, setup)
    at = {"weights": sv.weights, "kv_cache": sv.kv_pool, "activations": activations, "temporaries": graphs}
    memory = Memory(weights=sv.weights, gradients=0, optimizer_states=0, master_weights=0, activations=activations,
                    temporaries=graphs, kv_cache=sv.kv_pool, peak=peak, peak_phase="prefill", phases={"prefill": peak},
                    reserved=reserved, device_total=device_total, overheads=beside, at_peak=at)
    fits = starts and device_total + reserve <= gpu.memory
    prompt = setup.prompt_len
    fpt = forward_per_token(spec, prompt, pc)
    timing = None
    longer = prompt + setup.completion_len > max_seq  # the OpenAI server refuses a request past the model length
    if longer:
        load = None
    if load is not None:
        s = load.step
        achieved = s.kernels.flops / (s.seconds * gpu.flops_for(compute_dtype(setup))) if s.seconds else 0.0
        timing = Timing(gpu=gpu.name, mfu=achieved, step_seconds=load.tpot,
                        tokens_per_second=load.output_tokens_per_second, fits=fits,
                        headroom=gpu.memory - reserve - device_total, gpu_memory=gpu.memory,
                        prefill_seconds=load.ttft, decode_tokens_per_second=load.output_tokens_per_second,
                        max_batch=round(load.running), max_batch_tokens=prompt + setup.completion_len,
                        max_seq=max_seq)
    else:  # no request fits the KV cache: the engine serves nothing
        timing = Timing(gpu=gpu.name, mfu=0.0, step_seconds=0.0, tokens_per_second=0.0, fits=fits,
                        headroom=gpu.memory - reserve - device_total, gpu_memory=gpu.memory, max_batch=0,
                        max_batch_tokens=prompt + setup.completion_len, max_seq=max_seq)
        notes = [*notes, f"no request of --prompt-len {prompt} + --completion-len {setup.completion_len} tokens "
                 + (f"is taken: it is longer than the model length, {max_seq:,} (the server refuses it); set "
                    "--prompt-len and --completion-len within it (0 tokens/s)" if longer else
                    "fits the KV cache: nothing is served (0 tokens/s)")]
    if load is not None and (setup.request_rate or setup.ttft_ms):
        notes = [*notes, _target_note(setup, load)]
    if load is not None and load.step.api_server > load.step.core_seconds:
        s = load.step
        notes = [*notes, f"the API server binds: streaming a step's tokens takes it {s.api_server * 1e3:.1f} ms, the "
                 f"engine core's step {s.core_seconds * 1e3:.1f} ms (analytic/serving_time.py api_server); vLLM's "
                 "--api-server-count spreads it over processes (not modelled: one)"]
    flops = Flops(int(fpt * prompt), 0, 0, int(fpt * prompt), int(fpt * prompt), int(fpt))
    from .serving import stored_mxfp4  # noqa: PLC0415 (see _MODE_MODULES)
    detail = replace(sv.sizing(), load=load.as_dict() if load is not None else {},
                     experts_format="mxfp4" if stored_mxfp4(spec, setup) else None,
                     quant_as_stored=bool(setup.quant) and setup.quant == spec.checkpoint_quant)
    return Estimate("analytic", spec.name, pc.total, stage_params(spec, pc, setup.tp, setup.pp), setup, memory, flops,
                    timing, tuple(notes), Detail(params_active=pc.active, serving=detail))


def _rl_at_peak(m: "RLMemory") -> dict[str, int]:
    """What is live at the RL step's peak, by Category: the phase's own breakdown (the policy's or the critic's
    training step) with the models and buffers the phase carries beside it; the generate and score phases' own
    bytes (KV cache, a forward's transient) beside the resident models."""
    frozen = sum(o.resident for o in m.others if o.role != "critic")
    critic = next((o for o in m.others if o.role == "critic"), None)
    p = m.policy
    at: dict[str, int] = {}

    def add(k, v):
        if v:
            at[k] = at.get(k, 0) + int(v)

    def add_states(s):  # a model's weights, fp32 master and optimizer states, resident between its steps
        add("weights", s.weights)
        add("master_weights", s.master)
        add("optimizer_states", s.optimizer)

    add("weights", frozen + m.rollout.engine_weights)
    add("kv_cache", m.rollout.kv_cache if m.rollout.engine else 0)
    add("temporaries", m.rollout.engine - m.rollout.engine_weights - (m.rollout.kv_cache if m.rollout.engine else 0))
    trained = [p] + ([critic.train] if critic else [])  # the models with optimizer states
    if m.peak_phase in PHASES or m.peak_phase == Phase.CRITIC_STEP.value:
        add("inputs", m.buffers)
        step = p if m.peak_phase in PHASES else critic.train
        for k, v in step.at_peak.items():
            add(k, v)
        for s in trained:
            if s is not step:  # the other model, between its steps
                add_states(s)
    else:
        for s in trained:
            add_states(s)
        if m.peak_phase == Phase.SCORE.value:
            add("inputs", m.buffers)
        elif not m.rollout.engine:
            add("kv_cache", m.rollout.kv_cache)
    add("temporaries", m.peak - sum(at.values()))  # the phase's own transient (a forward's, generation's)
    return at


def _rl(spec, setup, pc, gpu, mfu, reserve) -> Estimate:
    """--mode rl: the step's phases (analytic/rl.py), its FLOPs and time (generate + score + train)."""
    from . import rl, rl_placement  # noqa: PLC0415 (see _MODE_MODULES)
    from ..models.resolve import load_model
    from ..estimate import Phase

    m = rl.rl_memory(spec, setup, gpu, load_model)
    sh = rl.shape(setup)
    ts = rl.train_setup(setup)
    p = m.policy
    critic = next((o for o in m.others if o.role == "critic"), None)
    f = step_flops(spec, ts, pc)
    cf = step_flops(critic.spec, rl.train_setup(setup, head="token-cls")) if critic else None
    prefill = forward_per_token(spec, sh.prompt_len, pc) * sh.completions * sh.prompt_len
    # the decode steps' FLOPs, attention growing with the cache: sampled every completion_len / 64 steps
    decode = sum(forward_per_token(spec, sh.prompt_len + i, pc) for i in range(0, sh.completion_len,
                                                                              max(1, sh.completion_len // 64))) \
        * max(1, sh.completion_len // 64) * sh.completions
    score = rl.score_flops(setup, m, spec, m.others)
    fwd = prefill + decode + score + f.forward + (cf.forward if cf else 0)
    bwd = f.backward + (cf.backward if cf else 0)
    rec = f.recompute + (cf.recompute if cf else 0)
    flops = Flops(int(fwd), int(bwd), int(rec), int(fwd + bwd + rec), int(fwd + bwd), int(f.per_token))
    hybrid = rl_placement.hybrid(setup)
    pl = m.placement
    at = dict(pl.parts[m.peak_phase]) if hybrid else _rl_at_peak(m)
    # the caching allocator: the policy's training step keeps its freed blocks cached (step_reserve) and needs its
    # unreleasable fragmentation (fit_rule.required) beside the step's peak; the other phases reserve and need
    # what they allocate (NB: their own freed blocks are not modelled: under)
    cached = step_reserve(spec, ts, p) - p.peak
    needed = m.peak + fit_rule.required(spec, ts, p) - p.peak
    reserved, device_total, beside, held = overheads.device_memory(m.peak + cached, gpu, ts, needed, spec)
    weights = p.weights + sum(o.resident for o in m.others if o.role != "critic") + m.rollout.engine_weights
    co = critic  # the critic trained on the actor's GPUs
    if setup.rl_placement == "split":  # the actor's GPUs hold the actor alone (the other groups': detail.rl)
        weights, co = p.weights, None
    memory = Memory(weights=int(weights + (co.train.weights if co else 0)), gradients=p.gradients,
                    optimizer_states=int(p.optimizer + (co.train.optimizer if co else 0)),
                    master_weights=int(p.master + (co.train.master if co else 0)),
                    activations=p.activations, temporaries=at.get("temporaries", 0), kv_cache=m.rollout.kv_cache,
                    peak=m.peak, peak_phase=m.peak_phase, phases=m.phases, at_peak=at, reserved=reserved,
                    device_total=device_total, overheads=beside, required=needed)
    seconds = {}
    timing = fit = None
    if gpu is not None:
        seconds[Phase.GENERATE.value] = rl.generate_seconds(spec, setup, m, gpu, pc)
        peak_flops = gpu.flops_for(compute_dtype(ts))
        seconds[Phase.SCORE.value] = rl.score_seconds(setup, m, spec, gpu)
        if mfu is None:
            seconds["train"] = layout_step_time(spec, ts, gpu, pc=pc).step_seconds
            if critic:
                seconds[Phase.CRITIC_STEP.value] = layout_step_time(
                    critic.spec, rl.train_setup(setup, head="token-cls"), gpu).step_seconds
        else:
            seconds["train"] = step_seconds(f.forward + f.backward + f.recompute, gpu, ts, mfu)
            if critic:
                seconds[Phase.CRITIC_STEP.value] = step_seconds(cf.forward + cf.backward + cf.recompute, gpu, ts, mfu)
        if hybrid:
            seconds.update(rl_placement.seconds(pl, setup, gpu))
        secs = sum(seconds.values())
        fit = fit_rule.verdict(gpu, ts, needed, reserve, spec=spec)
        timing = Timing(gpu=gpu.name, mfu=flops.model_step / (secs * peak_flops), step_seconds=secs,
                        tokens_per_second=sh.completions * sh.seq / secs, fits=fit.fits, headroom=fit.headroom,
                        gpu_memory=gpu.memory, prefill_seconds=seconds[Phase.GENERATE.value],
                        decode_tokens_per_second=sh.completions * sh.completion_len / seconds[Phase.GENERATE.value])
    models = {"policy": spec.name, **{o.role: o.spec.name for o in m.others}}
    placed = {}
    if hybrid:
        placed = {"placement": setup.rl_placement, "groups": pl.groups, "host_per_gpu": pl.host_per_gpu,
                  "transfers": pl.transfers, "sync_bytes": pl.sync_bytes}
        if gpu is not None:
            placed["host_per_node"] = rl_placement.host_per_node(pl, gpu)
    rl_step = RLStep(algo=setup.rl_algo, rollout=setup.rollout, prompts=sh.prompts, completions=sh.completions,
                     micro_batch=sh.micro, grad_accum=sh.accum, prompt_len=sh.prompt_len,
                     completion_len=sh.completion_len, models=models, scored_by=m.scored,
                     resident={"policy": m.policy_resident, **{o.role: o.resident for o in m.others}},
                     rollout_buffers=m.buffers, engine=m.rollout.engine, phase_seconds=seconds,
                     serving=m.rollout.serving.sizing() if m.rollout.serving else None,
                     rollout_records=m.rollout.records, placement=placed)
    notes = [f"--batch {setup.batch} prompts × --group-size {setup.group_size} = {sh.completions} completions "
             f"generated at once, trained in {sh.accum} micro-batch(es) of {sh.micro} (TRL's "
             f"per_device_train_batch_size={sh.micro}, gradient_accumulation_steps={sh.accum}, "
             f"num_generations={setup.group_size})",
             (("phases as verl's hybrid engine runs them" if setup.rl_placement == "colocated" else
               "phases of the split placement, each on its own group") + " (docs/rl.md, Many GPUs): weight sync, "
              "generate, score, "
              "the policy's training step" + (" and the critic's" if critic else "") if hybrid else
              "phases as TRL's GRPOTrainer runs them (docs/rl.md): generate, score (no-grad log-probs), the policy's "
              "training step" + (" and the critic's" if critic else "") + "; the policy's optimizer states stay "
              "resident while it generates, its gradients are freed (zero_grad)"),
             "the training step's LM head is TRL's fused chunked log-prob head (--loss chunked-logprob)"]
    if setup.beta == 0 and setup.rl_algo == "grpo":
        notes.append("--beta 0 (TRL's default): no reference model is loaded")
    if setup.rollout == "vllm":
        kv, kv_needed = m.rollout.serving.kv_tokens, m.rollout.records["kv_tokens_needed"]
        if hybrid:
            notes.append(f"vLLM: {setup.vllm_gpu_memory_utilization} of each rollout GPU's memory at generation, KV "
                         f"pool {kv:,} tokens per engine")
        else:
            notes.append(f"colocated vLLM: {setup.vllm_gpu_memory_utilization} of the GPU held through every phase "
                         f"(TRL's vllm_enable_sleep_mode off), KV pool {kv:,} tokens")
        if kv < kv_needed:
            notes.append(f"the KV pool holds {kv:,} of the {kv_needed:,} "
                         "tokens of all completions: vLLM preempts and runs them in waves (the decode time is a "
                         "lower bound); raise --vllm-gpu-memory-utilization")
    if hybrid:
        notes += rl_placement.describe(pl, setup, m.peak_phase, gpu)
    if gpu is not None:
        gen = ("the vLLM engine's steps over the whole batch (analytic/serving_time.py)" if setup.rollout == "vllm"
               else "transformers' eager prefill + decode forwards (analytic/infer_time.py)")
        notes.append(f"time: generate = {gen}, op by op, {sh.completion_len} tokens per completion (full length); "
                     "score = eager no-grad forwards op by op; train = "
                     + ("the step-time model" if mfu is None else f"the step's FLOPs at --mfu {mfu:.0%}"))
        notes.append(_fit_note(fit))
        notes.append(_reserved_note(spec, setup, beside, held))
    params = pc.total + sum(count_params(o.spec).total for o in m.others if o.spec is not spec)
    return Estimate("analytic", spec.name, params, params, setup, memory, flops, timing, tuple(notes),
                    Detail(params_active=pc.active, rl=rl_step, host_memory=pl.host_per_gpu or None), fit)


def attention_words(spec: ModelSpec, setup: Setup) -> str:
    """The attention kernel the estimate prices (activations.resolved_kernel), and the one asked for where the model or
    the dtype runs another: gpt-oss's sinks run its family's own eager attention on the HF stack (transformers has no
    SDPA path for them), fp32 on CUDA the math path under GQA."""
    from .activations import resolved_kernel

    asked, run = setup.attention_kernel, resolved_kernel(spec, setup)
    if run == asked or (asked in ("sdpa", "flash2", "efficient", "cudnn") and run == "flash"):
        return asked  # (the fused kernels' saved set is priced as flash's: resolved_kernel)
    why = "the model's own eager attention: its family has no SDPA path" if run == "eager" else \
        "fp32 SDPA on this device and layout"
    return f"{run} ({why})" if setup.attention == "auto" else f"{run} ({why}; --attention {asked} is not what runs)"

