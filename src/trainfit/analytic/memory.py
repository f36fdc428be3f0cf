"""Per-rank memory of the standard training step (DESIGN.md §3): the worst pipeline stage's peak.

Each axis is its own module: parallel/pipeline.py (stages, in-flight micro-batches), parallel/tensor.py (TP/SP
shards), parallel/zero.py (ZeRO shards and DP buffers), recompute.py (one layer's saved and backward bytes),
embedding.py and loss.py (the model's two ends), optimizer.py (state and step temporaries), phases.py (the peak
as the largest of the step's high points).
"""
from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, replace

from ..models.hf_config import for_setup
from ..errors import SetupError
from ..setup import Setup
from ..spec import ModelSpec
from . import compile_effects, encoder_decoder, encoder_decoder_training, hybrid_training, long_context
from . import torchao_recipes
from .activations import keys_per_token
from .compute_time import tensors_per_rank
from .embedding import embedding_saved
from .forward_moments import last_layer_forward
from .lora import adapter_setup, embedding_grad, gathered_counts, head_saved_delta, lora_layer_params, lora_states
from .loss import head_and_loss
from .optimizer import adafactor_state, optimizer_temporaries, paged_state_bytes, state_bytes_unsharded
from .parallel import deepspeed as ds_zero
from .parallel import fsdp1, fsdp_offload
from .parallel.pipeline import Stage, stages
from . import quant, torchao_optim, vlm
from .parallel.fsdp2 import (expert_group_params, fsdp2_buffers, fsdp2_model_states, groups, layer_unsharded_grad_bytes,
                             torchtitan_fsdp)
from .parallel.tensor import rank_params, term_divisors
from .parallel.zero import (gathered_params, model_states, params_at_rest, reduce_scatter_transient, shard,
                            unsharded_at, unsharded_bytes)
from .params import ParamCounts, count_params
from .phases import LayerKind, Pattern, StepBytes, peak, whole
from .stacks import model_for
from .precision import StateBytes, state_bytes
from .recompute import LayerMemory, checkpoint_held_masks, layer_memory, layer_params

__all__ = ["Stage", "TrainMemory", "adafactor_state", "rank_params", "stage_memories", "stages", "train_memory"]


@dataclass(frozen=True)
class TrainMemory:
    weights: int
    gradients: int
    master: int
    optimizer: int
    activations: int  # saved for backward at the forward's end (all in-flight micro-batches)
    comm_buffers: int
    phases: dict
    peak: int
    peak_phase: str
    at_peak: dict
    detail: dict  # the peak stage's memory terms (Estimate.detail's records)
    params: int = 0  # parameters whose storage this rank owns (parallel/zero.py params_at_rest), count
    host_memory: int | None = None  # bytes in host memory: ZeRO-Offload's states, offloaded activations
    paged_optimizer_states: int | None = None  # bytes of bitsandbytes' paged states (CUDA unified memory)
    offloaded_activations: int | None = None  # of host_memory, the saved activations --offload activations moves


def _headed(spec: ModelSpec, setup: Setup, pc: ParamCounts | None) -> tuple[ModelSpec, ParamCounts | None]:
    """The model with the head the setup trains (trainfit.heads), with `pc` where that is the spec itself (None:
    the caller counts the headed model's)."""
    headed = for_setup(spec, setup)
    return (spec, pc) if headed is spec else (headed, None)


def train_memory(spec: ModelSpec, setup: Setup, pc: ParamCounts | None = None) -> TrainMemory:
    return max(stage_memories(spec, setup, pc), key=lambda m: m.peak)


def stage_memories(spec: ModelSpec, setup: Setup, pc: ParamCounts | None = None) -> Iterator[TrainMemory]:
    """Each pipeline stage's memory, first stage first (one for an encoder-decoder's two stacks), computed as they
    are taken: train_memory is the largest; the planner's memory oracle stops at the first above a capacity
    (plan/fit.py PeakOracle.fits)."""
    spec, pc = _headed(spec, setup, pc)
    encoder_decoder.check_trainable(spec, setup)  # an encoder-decoder family not modelled (encoder_decoder.py)
    pc = pc or count_params(spec)
    if encoder_decoder.modelled(spec):  # T5 / mT5, BART, Whisper: two stacks (encoder_decoder_training.py)
        yield encoder_decoder_training.train_memory(spec, setup, pc)
        return
    st = state_bytes(setup)
    if spec.hybrid is not None:  # (every stack's: one whose memory model has no Mamba-2 blocks refuses it)
        hybrid_training.check_trainable(spec, setup, st)
    stack = model_for(setup)  # its per-stage memory (analytic/stacks: Megatron-Core's is megatron_memory.py)
    for s in stages(spec, setup):
        yield stack.stage_memory(spec, setup, pc, st, s)


def states_floor(spec: ModelSpec, setup: Setup, pc: ParamCounts | None = None) -> int:
    """A lower bound of train_memory(spec, setup, pc).peak, and so of the fit rule's required bytes, from the
    busiest stage's states alone (the stack's StackModel.states_floor; 0 where it has none): the planner's memory
    oracle rejects a group whose states cannot fit without an engine call (plan/fit.py)."""
    return max(stage_states_floors(spec, setup, pc))


def stage_states_floors(spec: ModelSpec, setup: Setup, pc: ParamCounts | None = None) -> tuple[int, ...]:
    """Each pipeline stage's states_floor (its stack's; 0 where it has none), in stages()' order. With
    stage_saved_floors' (rank, saved, working) of the same stage: states + b × (pipeline.in_flight(pp, rank, vpp, m)
    × saved + working) <= train_memory(spec, setup at micro-batch b, accumulation m).peak for every b and m
    (tests/analytic/test_memory_floor.py): the planner's cap on the micro-batch without an engine call (plan/fit.py)."""
    spec, pc = _headed(spec, setup, pc)
    if encoder_decoder.modelled(spec):
        return (0,)
    pc = pc or count_params(spec)
    stack = model_for(setup)
    return tuple(stack.states_floor(spec, setup, pc, s) for s in stages(spec, setup))


def stage_saved_floors(spec: ModelSpec, setup: Setup, pc: ParamCounts | None = None) -> tuple[tuple, ...]:
    """Each pipeline stage's (rank, saved, working): its stack's saved_floor, bytes per sequence of the micro-batch
    beside stage_states_floors' states ((0, 0) where the stack has none)."""
    spec, pc = _headed(spec, setup, pc)
    if encoder_decoder.modelled(spec):
        return ((0, 0.0, 0.0),)
    pc = pc or count_params(spec)
    ranks = stages(spec, setup)
    return tuple((s.index, *f) for s, f in zip(ranks, model_for(setup).saved_floors(spec, setup, pc, ranks)))


# Settings the memory model never reads: the MoE token dispatcher, its SMs and the combined 1F1B schedule change how
# the expert exchanges are timed (parallel/expert.py), not what a rank holds (the busiest rank's tokens:
# moe_imbalance.py, whatever moves them). NB: Megatron's allgather dispatcher gathers the tp x ep group's tokens
# before it keeps its experts' (token_dispatcher.py MoEAllGatherTokenDispatcher), a transient not counted: errs low
# there; DeepEP's and HybridEP's communication buffers are allocated outside PyTorch's allocator: overheads beside
# it (overheads.dispatcher_buffers); torchtitan's DeepEP path holds fewer routed rows than its all-to-all, counted as
# the all-to-all's (errs high there: parallel/expert_memory.py dispatch_bytes).
# The planner's memory oracle keys on memory_key (tests/analytic/test_memory_key.py runs train_memory at every value).
NOT_IN_MEMORY = (("moe_dispatcher", None), ("moe_dispatcher_sms", None), ("overlap_moe_comm", False))


def memory_key(setup: Setup) -> Setup:
    """`setup` with the settings the memory model never reads (NOT_IN_MEMORY) at fixed values: a memo key, never
    run (no validation of the fixed values)."""
    return setup.keyed(NOT_IN_MEMORY)


# torchtune's OffloadActivations (training/_activation_offloading.py): each saved tensor is copied to pinned host
# memory on a side stream as the forward moves on, and in backward the next layer's tensors are brought back while
# the current one runs: the layer in flight and the one prefetched are on the device.
# NB: tensors under its min_offload_size (1 KiB) stay: not counted; the copy in flight is taken as done.
OFFLOAD_WINDOW = 2


def offload_window(setup: Setup) -> int:
    """Layers whose saved tensors are on the device under --offload activations: torchtune's window (above), or
    under ArcticTraining's checkpoint offload (long_context.checkpoint_offload) the one layer being run: its
    CheckpointFunction copies the layer's input to host memory synchronously before the layer runs
    (monkey_patches.py:85-92, `arg.detach().to("cpu")`) and back when its backward starts (:122-126)."""
    return 1 if long_context.checkpoint_offload(setup) else OFFLOAD_WINDOW


def interleaved_kinds(spec: ModelSpec, setup: Setup, stage: Stage) -> Pattern | tuple:
    """Each layer's kind, first to last, as (MoE, RoPE) where the layers differ at recorded places: DeepSeek's dense
    layers first (MoESpec.first_dense), Llama 4's at recorded intervals: MoE
    layers interleaved with dense ones (MoESpec.layer_step: Maverick's every other layer, dense first) and NoPE
    layers among the RoPE ones (ModelSpec.nope_every: every fourth), the RoPE layers with their chunked attention and
    q/k L2 norm. Each layer's backward high point then holds its own kind's saved set and the gradients of the layers
    after it (phases._mixed_layer_moments), where spreading the kinds evenly over the layers put the MoE layer's
    moment in the first layer with every other layer's gradients (full recompute on the families matrix's shrunk
    Maverick: +7 % to +9 %). () where the layers are alike or their positions are not recorded, or on a pipeline (NB:
    a stage's first layer index is not tracked here; the layers are then priced alike). A Pattern: one period of the
    two intervals (their least common multiple) written out and repeated, not each layer (a config of 10**9 layers).
    NB: O(period) work, which co-prime intervals of millions of layers would make large."""
    step = spec.moe.layer_step if spec.moe is not None else 0
    nope = spec.nope_every if (spec.chunked_layers or spec.qk_l2_norm_layers) else 0
    first = spec.moe.first_dense if spec.moe is not None else 0
    if setup.pp > 1 or stage.layers != spec.layers:
        return ()
    if first and step < 2 and nope < 2:  # DeepSeek: its dense layers first, then the MoE ones
        return Pattern.of_runs(((False, True), first), ((True, True), stage.layers - first))
    if step < 2 and nope < 2:
        return ()
    period = math.lcm(max(step, 1), max(nope, 1))
    kinds = tuple(((spec.moe is not None and (spec.moe.sparse_layers is None if step < 2 else j % step == step - 1),
                    nope < 2 or (j + 1) % nope != 0), 1) for j in range(min(period, stage.layers)))
    whole, rest = divmod(stage.layers, period)
    return Pattern(((kinds, whole), (kinds[:rest], 1)))


def kind_spec(spec: ModelSpec, rope: bool) -> ModelSpec:
    """The spec whose every layer is of one kind for the per-layer terms: a RoPE layer carries the chunked attention
    and the q/k L2 norm of its kind (activations.masked_chunk_share, the L2 term), a NoPE layer neither."""
    if not (spec.chunked_layers or spec.qk_l2_norm_layers):
        return spec
    return replace(spec, chunked_layers=spec.layers if rope and spec.chunked_layers else 0,
                   qk_l2_norm_layers=spec.layers if rope and spec.qk_l2_norm_layers else 0)


def stage_memory(spec: ModelSpec, setup: Setup, pc: ParamCounts, st: StateBytes, stage: Stage) -> TrainMemory:
    """One pipeline stage of a model the step runs with torch's DDP/FSDP2 or DeepSpeed's ZeRO engine."""
    t = setup.tp
    n, largest = rank_params(spec, pc, setup, stage)
    owned = params_at_rest(n, setup)  # (before LoRA's n below becomes the adapters')
    fsdp2 = torchtitan_fsdp(setup)  # the stack's own FSDP2 groups and mixed precision (parallel/fsdp2.py)
    ms = (fsdp2_model_states if fsdp2 else model_states)(n, state_bytes_unsharded(spec, n, pc, st, setup), st, setup)
    pc_gathered, n_base = pc, n  # the parameters ZeRO-3 / FSDP2 gather per layer; the rank's before LoRA
    if setup.lora_rank:  # frozen base weights; gradients, masters and optimizer states of the adapters only
        ms, st_grad, n, largest = lora_states(spec, setup, st, n)
        pc_gathered = gathered_counts(spec, setup, pc, st)
    # paged states live in CUDA unified memory, beside the allocator (analytic/optimizer.py; engine.py adds the
    # resident part to the device total); optimizer states, so sharded from ZeRO-1 on as ms.optimizer is
    paged = paged_state_bytes(spec, setup, n) / shard(setup, 1)
    ms = replace(ms, optimizer=ms.optimizer - paged)
    # torchao's CPUOffloadOptimizer: the large parameters' states on the host, the small ones' on the device
    off = torchao_optim.offloaded(spec, pc, setup, n, st.optimizer) if torchao_optim.offload_runs(setup) else None
    if off:
        ms = replace(ms, optimizer=off.device_states)
    # FSDP's CPU offload: every sharded state on the host (parallel/fsdp_offload.py); FSDP1 keeps the gradient
    # shards on the device too, through the backward (parallel/fsdp1.py keeps_gradient_shards)
    fsdp_host, kept_grads = None, False
    if fsdp_offload.runs(setup):
        fsdp_host = ms.weights + ms.gradients + ms.master + ms.optimizer
        kept_grads = fsdp1.keeps_gradient_shards(setup)
        why = fsdp1.accumulation_refusal(setup)
        if why:
            raise SetupError(why)
        ms = replace(ms, weights=0.0, gradients=ms.gradients if kept_grads else 0.0, master=0.0, optimizer=0.0)
    gathered = 0.0 if fsdp2 else gathered_params(pc_gathered, setup, st, stage)
    ds = None  # DeepSpeed's ZeRO engine allocates its own states and buckets (parallel/deepspeed.py)
    if ds_zero.deepspeed_engine(setup):
        # AutoEP: the rank's own experts only, partitioned over their expert-data-parallel group (ds_zero.expert_split)
        n, ds_experts, largest, expert_largest = ds_zero.expert_split(spec, pc, setup, n, stage.layers, largest)
        persistent = frozen_persistent = ds_zero.persistent_params(spec, pc, setup, stage)
        if setup.lora_rank:  # the adapters' states; the frozen base beside them (ds_zero.lora_frozen)
            frozen = ds_zero.lora_frozen(spec, setup, st, n_base, persistent)
            persistent = ds_zero.lora_persistent(spec, setup)
        ds = ds_zero.deepspeed_states(n, state_bytes_unsharded(spec, n, pc, st, setup), st, setup,
                                      persistent, largest,
                                      tensors_per_rank(spec, stage.layers, stage.embedding, stage.head),
                                      ds_zero.backward_leftovers(pc, setup, stage),
                                      ds_zero.partition_grad_elements(spec, pc, setup, n, ds_experts),
                                      frozen_persistent if setup.lora_rank else 0.0, ds_experts, expert_largest)
        ms, gathered = ds.states, ds_zero.gathered(spec, pc, setup, st, layer_params(spec, pc, setup))
        if setup.lora_rank:
            ms = replace(ms, weights=ms.weights + frozen)
            # NB: the adapters gathered with each layer counted as the layer's share of them (replay of the base)
            gathered *= pc_gathered.per_layer_dense / pc.per_layer_dense

    # this rank's tokens: the ring splits each sequence over cp (inputs and labels sharded), --ulysses over its
    # group (long_context.py); NB: keys per query stay the whole sequence (CP runs fused SDPA kernels only)
    tokens = setup.batch * setup.seq / setup.cp / setup.ulysses
    keys = keys_per_token(spec, setup.seq)
    lp = layer_params(spec, pc, setup)
    every = setup.layers_every if setup.recompute.startswith("layer:") else 0
    lm = layer_memory(spec, setup, pc, st, tokens, keys, "none" if every else None)
    # torchtitan's layer:N (activation_checkpoint.py:27-49 _apply_layer_sac): the block whose running count
    # (1, 2, ...) is a multiple of N is checkpointed whole, the others save everything
    lm_full = layer_memory(spec, setup, pc, st, tokens, keys, "full") if every else None
    head = head_and_loss(spec, setup, st, tokens)
    lm, lm_full, head = compile_effects.apply(spec, setup, st, tokens, lm, head, lm_full)  # --compile
    gb = (st_grad if setup.lora_rank else st.grad) / shard(setup, 2)  # gradient bytes per parameter on this rank
    if (ds and ds_zero.gradients_leave_device(setup)) or (fsdp_host is not None and not kept_grads):
        gb = 0.0  # ZeRO-Offload, FSDP2's CPU offload: the reduced gradients go to the host
    # a layer's gradients made during its backward: FSDP2 keeps them unsharded in param_dtype until its
    # post-backward reduce-scatter (parallel/fsdp2.py); otherwise they are the rank's own gradients
    # (so does the hf stack's FSDP, with a MixedPrecision(Policy) or none, in param_dtype or the stored dtype:
    # parallel/zero.py unsharded_bytes, unsharded_at)
    hf_fsdp = not fsdp2 and ds is None and unsharded_bytes(setup, st)
    gb_layer = layer_unsharded_grad_bytes(st) if (fsdp2 or hf_fsdp) else gb
    # torchtitan's routed experts under EP are their own FSDP group over efsdp, not dp (parallel/fsdp2.py groups)
    expert_sharding = (expert_group_params(spec, pc, setup) * (st.grad / setup.expert_dp - gb)
                       if fsdp2 and gb else 0.0)
    # hf under FSDP: the head's (and a tied embedding's) gradients are the root group's, unsharded
    # in that dtype until the root's post-backward, after the embedding's backward (parallel/zero.py unsharded_at)
    gb_root = hf_fsdp if hf_fsdp else gb
    head_params = (pc.final + pc.lm_head / t) if stage.head else 0
    if stage.head and spec.tied_embeddings:
        head_params += spec.vocab * (spec.embed_proj_dim or spec.hidden) / t  # the tied weight's gradient
    # A tied embedding gets two gradients, the LM head's and the embedding's, which autograd sums before
    # AccumulateGrad steals the sum as the .grad (torch/csrc/autograd/input_buffer.cpp accumulate). Under autocast
    # the head's partial, which arrives first, is the fresh fp32 output of the weight cast's backward
    # (ToCopyBackward0), which the buffer alone holds: the embedding's partial is added into it in place
    # (old_var.add_(var)), so at the embedding's backward one partial is live beside the one that becomes the
    # gradient. Without autocast the head's partial is a view of the matmul's gradient (TBackward0) sharing its
    # base's storage, so the sum is out of place: both partials and their sum. Both seen on an H200 (torch
    # 2.11.0+cu130; the trace folds such sums: trace/recorder.py _accumulated). (On a pipeline, Megatron's last stage holds its own copy:
    # not here.)
    tied_partials = (1 if st.autocast else 2) * spec.vocab * (spec.embed_proj_dim or spec.hidden) / t * gb_root \
        if (spec.tied_embeddings and stage.embedding and stage.head) else 0
    if setup.lora_rank:  # frozen head and embedding: no gradients there; the layers' gradients are the adapters'
        head_params, tied_partials = 0, 0
        lp_trainable = lora_layer_params(spec, setup)
        head = replace(head, saved=head.saved + head_saved_delta(spec, setup) * tokens)
    # a VLM trained without images: the tower's (and Mllama's skipped cross-attention layers') parameters get no
    # gradient, nor the step's temporaries (vlm.idle_params). NB: DeepSpeed's flat gradient partitions are made whole
    # (not applied there); frozen under LoRA anyway
    idle = 0 if (setup.lora_rank or ds) else vlm.idle_params(spec, setup, pc, stage.layers, stage.embedding)
    lora_rs = (lp_trainable, st_grad, pc_gathered.per_layer_dense * st.weight) if setup.lora_rank else None
    rs = 0.0 if (fsdp2 or ds) else reduce_scatter_transient(pc, largest, st, setup, lora_rs)
    rs += long_context.a2a_transient(spec, setup, st.act)  # --ulysses: the all-to-alls' buffers at the attention
    # ArcticTraining's reentrant checkpoint holds the re-run layer's output through its backward (long_context.py)
    rs += long_context.rerun_output(spec, setup, st.residual, tokens) if setup.recompute == "full" else 0
    # torchao's quantised operand copies in a converted linear's backward (torchao_recipes.backward_transient)
    rs += torchao_recipes.backward_transient(spec, setup)
    # the stack's ring attention backward buffers under --cp (parallel/torch_context.py on torchtitan)
    rs += model_for(setup).cp_backward_bytes(spec, setup, tokens, st.act)
    if setup.quant:  # a frozen 4-bit matmul's dequantised weight beside the backward's temporaries (quant.py)
        # NB: over-reads where the layer's high point is not inside a frozen matmul (by at most that copy)
        rs += quant.dequant_transient(spec, setup)

    def kind(m: LayerMemory, gradients: float | None = None) -> LayerKind:
        # the layer's backward high point: the moment with the most temporaries and gradients made so far
        # NB (LoRA): the moments' gradients made are scaled to the adapters' share of the layer's parameters
        share = lp_trainable / lp if setup.lora_rank else 1.0
        moment = max(m.moments, key=lambda x: x.extra - x.freed + x.grads_done * share * gb_layer)
        return LayerKind(m.saved, moment.extra + rs, moment.freed, moment.grads_done * share * gb_layer, gradients)

    def kind_gradients(moe: bool) -> float | None:
        # all of one layer's gradient bytes by its kind (a dense or an MoE layer; the average under LoRA)
        if setup.lora_rank or not (pc.dense_layers and pc.moe_layers):
            return None
        return layer_params(spec, pc, setup, moe) * gb + (expert_sharding * spec.layers / pc.moe_layers if moe else 0)

    kinds = (kind(lm),) + ((kind(lm_full),) if every else ())
    # layer j is checkpointed where j + 1 is a multiple of `every`: a block of every - 1 whole layers and one
    # checkpointed, repeated, then the rest whole
    pattern = Pattern(((((0, every - 1), (1, 1)), stage.layers // every),
                       (((0, stage.layers % every),), 1))) if every else ()
    layer_kinds = () if (every or setup.compile) else interleaved_kinds(spec, setup, stage)
    if layer_kinds:  # Llama 4's layers of different kinds, each with its own saved set and backward high point
        kinds = {(moe, rope): kind(layer_memory(kind_spec(spec, rope), setup, pc, st, tokens, keys, moe_layer=moe),
                                   kind_gradients(moe))
                 for moe, rope in sorted(layer_kinds.counts())}
        pattern = layer_kinds
    cross = None if (pattern or setup.compile) else vlm.cross_kinds(spec, setup, st, stage.layers, kinds[0])
    if cross is not None:  # Mllama's cross-attention layers, a kind of their own (analytic/mllama.py)
        kinds, pattern = cross
    uniform = kinds[pattern.first if pattern else 0]
    casts = (sum((lm, lm_full)[k].autocast_casts * n for k, n in pattern.counts().items()) if every
             else stage.layers * lm.autocast_casts)
    if spec.hybrid is not None:  # Mamba-2, attention and MLP blocks, each its own kind (hybrid_training.py)
        hybrid_training.check_trainable(spec, setup, st)
        kinds, pattern = hybrid_training.block_kinds(spec, setup, st, pc, tokens, lm, kinds[0], gb_layer)
        uniform, every = kinds[pattern.first], len(pattern)
    masks_held, masks_first = checkpoint_held_masks(spec, setup, st, stage.layers)
    step = StepBytes(
        resident={"weights": ms.weights, "master_weights": ms.master, "optimizer_states": ms.optimizer,
                  "comm_buffers": ms.comm},
        gradients=ms.gradients - idle * gb,
        # earlier micro-batches' gradients stay live; ZeRO-3's gradient partition buffer is (parallel/deepspeed.py
        # gradient_buffer_resident)
        accumulating=setup.grad_accum > 1 or (ds is not None and ds_zero.gradient_buffer_resident(setup)),
        head_gradients=head_params * gb_root,
        layer_gradients=(lp_trainable if setup.lora_rank else lp) * gb + expert_sharding,
        layers=stage.layers,
        in_flight=stage.in_flight,
        # where the layers' kinds are not placed (a pipeline stage), Mllama's cross-attention layers' saved tensors
        # beyond a self-attention layer's, spread over the layers (analytic/mllama.py); 0 for other models
        layer_saved=uniform.saved + (vlm.cross_layers_saved(spec, setup, st) / stage.layers
                                     if stage.layers and cross is None else 0),
        # a VLM's tower runs before the embedding's scatter: its pixel inputs and saved tensors live to the end of
        # the backward (NB: the pixels, an input, live through the optimizer step too: not counted there)
        embedding_saved=embedding_saved(spec, setup, st, tokens) + vlm.tower_saved(spec, setup, st)
        + vlm.tower_inputs(spec, setup) if stage.embedding else 0,
        head_saved=head.saved if stage.head else 0,
        inputs=head.labels if stage.head else 0,
        step_inputs=vlm.tower_inputs(spec, setup) if stage.embedding else 0,
        embedding_freed=vlm.tower_saved(spec, setup, st) if stage.embedding else 0,
        late_gradients=vlm.late_gradients(spec, setup, pc) * gb if stage.embedding else 0,
        forward_transient=(head.forward_transient if stage.head else 0) + casts
        + (vlm.checkpointed_casts(spec, setup, st) + vlm.forward_end_held(spec, setup, st) if stage.embedding else 0),
        loss_backward=head.backward_transient if stage.head else 0,
        layer_backward=uniform.backward,
        layer_freed=uniform.freed,
        layer_grads_done=uniform.grads_done,
        embedding_backward=embedding_grad(spec, setup, st, tokens) + tied_partials if stage.embedding else 0,
        gathered=gathered,
        # NB: gradient clipping's temporaries before the step (optimizer.clip_temporaries: a 0-d norm per tensor, a
        # few KB; on CUDA 512 B each and _foreach_norm's scratch, 2.4 MB for llama-3.2-1b) not counted here
        # (CPUOffloadOptimizer's on-device AdamW is fused: cpu_offload.py:39-40, in place)
        optimizer_transient=ds.step_transient if ds else 0 if (off or fsdp_host is not None) else optimizer_temporaries(
            adapter_setup(setup, st), st, (n - idle) / shard(setup, 1), largest),
        masks_held=masks_held,
        masks_first=masks_first if stage.embedding else masks_held,
        last_layer_forward=last_layer_forward(spec, setup, st, tokens, uniform.saved) if stage.head else 0,
        norm_kept=head.norm_kept if stage.head else 0,
        norm_backward=head.norm_backward if stage.head else 0,
        head_matmul=head.matmul_backward if stage.head else 0,
        head_matmul_freed=head.loss_grad if stage.head and head.matmul_backward else 0,
        gathered_at=fsdp2_buffers(groups(spec, pc, setup, stage, lp), st, setup) if fsdp2 else
        (ds.backward_moments(gathered) if ds else unsharded_at(pc_gathered, setup, st, stage,
                                                               lp_trainable if setup.lora_rank else None)),
        kinds=kinds if pattern else (),
        pattern=pattern,
        # torchtune's optimizer_in_bwd (step/in_backward.py): one optimizer per parameter, so the step's
        # temporaries are the largest parameter's, beside its gradient; before them (under autocast) the
        # low-precision weight gradient the matmul's backward made, which AccumulateGrad casts up to the fp32 .grad
        in_backward_step=largest * (st_grad if setup.lora_rank else st.grad) + max(
            largest * st.act if st.autocast else 0,
            optimizer_temporaries(adapter_setup(setup, st), st, largest, largest)) if setup.optimizer_in_backward
        else None,
        layers_on_device=offload_window(setup) if setup.offload_activations else None,
        # FSDP1's CPU offload: the gradient shards kept through the backward are freed before the step (fsdp1.py)
        step_gradients=0.0 if kept_grads else None,
    )
    step = compile_effects.adjust_step(step, spec, setup, st, stage)  # --compile's mask, --fp8-all-gather
    activations = step.activations
    fwd_transient = step.forward_transient
    p = peak(step)
    la = lm.activations
    detail = {
        "stage": stage.index,
        "layers_on_rank": stage.layers,
        "in_flight_microbatches": stage.in_flight,
        "activation_per_layer": int(step.layers_saved / stage.layers if every else lm.saved),
        "activation_terms_per_token": {k: v / d for (k, v), d in zip(la.terms.items(), term_divisors(la, setup).values())},
        "attention_scores_per_layer": int(la.per_token_key * tokens * keys / t),
        "autocast_weight_copies_per_layer": int(la.weight_casts / t),
        "logits_buffers": int(fwd_transient),
        "optimizer_temporaries": int(step.optimizer_transient),
        "zero3_gathered_params": int(gathered if not fsdp2 else step.gathered_at["last_layer_backward"]),
        # allocated at the loss backward's start (analytic/expandable.py: where an expandable segment grows)
        "loss_backward_allocated": int(p.moments.get("loss_backward", p.peak)),
    }
    host = int(ds.host) if ds else None  # ZeRO-Offload's host bytes
    if off:  # CPUOffloadOptimizer's pinned copies and CPU states
        host = int(off.host)
    if fsdp_host is not None:  # FSDP2's pinned shards and the CPU optimizer's states
        host = int(fsdp_host)
    acts_host = None
    if setup.offload_activations:  # the other layers' saved tensors, in pinned host buffers, beside any states
        every_layer = (sum(kinds[k].saved * n for k, n in pattern.counts().items()) if every
                       else uniform.saved * stage.layers)
        acts_host = int(stage.in_flight * (every_layer - step.layers_saved))
        host = (host or 0) + acts_host
    if setup.lora_rank:  # the adapters are the rank's too, sharded as the base is (lora_states)
        owned += params_at_rest(n, setup)
    return TrainMemory(whole(ms.weights), whole(ms.gradients), whole(ms.master), whole(ms.optimizer),
                       whole(activations), whole(ms.comm), p.phases, p.peak, p.phase, p.at_peak, detail, round(owned),
                       host, int(paged) if paged else None, acts_host)
