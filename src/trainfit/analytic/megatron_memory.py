"""One pipeline stage's memory under --stack megatron: Megatron-Core's model states (parallel/megatron.py), its
TE layers' saved tensors (megatron_activations.py), its recompute methods, context parallelism, the vocab-parallel
embedding and cross-entropy — combined by phases.peak like every other stack.

Recompute (transformer/transformer_block.py:532-563 _checkpointed_forward):
  selective   (recompute_modules, default ['core_attn']: megatron_recompute.py) the recomputed modules' saved tensors
              are not stored (megatron_activations.py), and are made again in the layer's backward;
  uniform:N   the stage's layers in groups of N, each group's input checkpointed (full = uniform:1); in a group's
              backward its N layers' activations are recomputed and live together;
  block:N     the first N layers of each model chunk (virtual stage) checkpointed one by one, the rest store all.
Context parallelism (--cp): each rank holds seq/cp tokens of every sequence (TE's load-balanced 2·cp chunks).
"""
from __future__ import annotations

import math
from dataclasses import replace

from ..setup import Setup
from ..spec import ModelSpec
from .megatron_activations import FP32, INDEX, MASK, act_bytes, layer_input, layer_terms, local_spec
from .megatron_recompute import modules
from .megatron_loss import cross_entropy_bytes
from . import megatron_offload
from .mtp import mtp_layers
from . import te_recipes
from ..low_precision import recipe
from .params import ParamCounts
from .batch_free import MICRO_BATCH, batch_free, cache, memo
from .memo import remember
from .grad_clip import clip_work
from .moe_imbalance import busiest_rank_load, least_load
from .parallel.megatron import (bytes_per_param, grad_copy_bytes, largest_param, megatron_model_states,
                                megatron_tensors, rank_params, shards)
from .parallel.pipeline import Stage
from .phases import LayerKind, Pattern, StepBytes, peak, whole
from .precision import state_bytes


def stage_memory(spec: ModelSpec, setup: Setup, pc: ParamCounts, stage: Stage, result_type):
    t, a, h = setup.tp, act_bytes(setup), spec.hidden
    sp = t if setup.sequence_parallel else 1
    tokens = setup.batch * setup.seq / setup.cp  # this CP rank's tokens of the micro-batch
    keys = setup.seq / setup.cp  # NB: eager scores per CP chunk pair; TE runs CP only with fused attention
    ms, te_weights, clip, copies, owned = rank_states(spec, setup, pc, stage)
    frac = spec.moe_share
    held = held_pairs(setup, stage, frac) if frac else 1.0
    full = _layer_stored(spec, setup, stage, frac, tokens, keys, held=held)
    n8 = _recipe_layers(setup, stage)
    kept = layer_input(spec, setup) * tokens  # a checkpointed layer's (group's) input
    # NB: a layer's backward temporaries, approximated as the incoming and outgoing residual gradients, the
    # re-gathered ln_out under SP (TE's backward all-gather) and fc1's output gradient; TE's gradient-accumulation
    # fusion writes weight gradients straight into main_grad (no per-layer weight-gradient temporaries). NB: without
    # it (Megatron-Bridge v0.2.0's Megatron-FSDP recipes turn it off: scripts/performance/configs/llama3/
    # llama3_llm_pretrain.py:108-109; no trainfit setting) Megatron-FSDP copies each unit's 16-bit .grad into its
    # bucket at the unit's post-backward (megatron_fsdp.py:552-575, :525-532 at 0.15): under by up to one layer's
    # 16-bit weights at its backward's end
    # (a MoE layer's: the busiest EP rank's routed copies, moe_imbalance.py)
    moe = frac > 0
    width = (spec.moe.expert_intermediate * spec.moe.top_k * busiest_rank_load(spec, setup, tokens)
             if moe and frac >= 0.5 else spec.intermediate)
    temps = (2 * a * h / sp + (a * h if sp > 1 else 0) + a * width * (2 if spec.gated_mlp else 1) / t) * tokens
    kv_chunk = a * 2 * spec.kv_dim / t * tokens  # this rank's k and v
    ring = 2 * kv_chunk if setup.cp > 1 else 0.0  # TE's P2P ring: the KV chunk being computed on and the one received
    temps += 2 * ring  # NB: backward also passes dkv around the ring (2 more chunk buffers)
    if n8:  # linear_fc1's quantised output gradient beside its bf16 one (te_recipes.backward_transient)
        temps += te_recipes.backward_transient(spec, setup, moe and frac >= 0.5) * tokens
    if modules(setup) - {"core_attn"}:
        # --recompute-modules: in a layer's backward its recomputed modules' tensors are made again and live beside
        # the backward's temporaries (NB: all of them at once, as if one module's backward held the others': over-
        # counts by the smaller modules' when several are named)
        core = _core_only(setup)
        temps += max(0.0, _stored(spec, core, frac, tokens, keys, False)
                     - _stored(spec, setup, frac, tokens, keys, False))

    policy, n = setup.recompute_policy, setup.recompute_layers
    pattern: Pattern | tuple = ()
    kinds: tuple = ()
    if policy in ("full", "uniform"):
        groups = math.ceil(stage.layers / max(setup.vpp, 1) / n) * max(setup.vpp, 1)
        saved = groups * kept / stage.layers
        uniform = LayerKind(saved, min(n, stage.layers) * full + temps, 0.0, 0.0)
    elif policy == "block":
        uniform = LayerKind(full, temps, 0.0, 0.0)
        chunk = stage.layers // max(setup.vpp, 1)
        ck = min(n, chunk)
        # each virtual chunk's first ck layers checkpointed, the rest stored whole: runs, not one entry per layer
        pattern = Pattern(((((1, ck), (0, chunk - ck)), max(setup.vpp, 1)),))
        kinds = (uniform, LayerKind(kept, full + temps, 0.0, 0.0))
    else:  # none, selective
        uniform = LayerKind(full, temps, 0.0, 0.0)
    n_off = min(setup.offload_layers, stage.layers)  # --offload-layers (Megatron refuses pipelines: one stage)
    off = copied = 0.0
    if n_off:
        # Transformer Engine's activation CPU offloading (megatron_offload.py): an offloaded layer keeps its unmarked
        # tensors; the offloadable bytes of the layers in TE's window sit beside the layer being run
        def offloadable(quantised: bool, copies: bool) -> float:
            def one(m: bool) -> float:
                lt = layer_terms(spec, setup, moe=m, quantised=quantised, held=held)
                router = a * h if m else 0.0  # the router's bf16 norm output (megatron_activations._moe_replicated)
                return megatron_offload.copied_per_layer(lt, setup, tokens, keys, quantised, router) if copies else \
                    megatron_offload.parts(lt, router)[1].per_rank(setup, tokens, keys)
            return (1 - frac) * one(False) + (frac * one(True) if moe else 0.0)
        # NB: the recipe's and the bf16 first/last layers' bytes averaged over the stage, as `full` is
        off, copied = ((n8 * offloadable(True, c) + (stage.layers - n8) * offloadable(False, c)) / stage.layers
                       for c in (False, True))
        off_kinds, off_pattern = megatron_offload.layer_kinds(stage.layers, n_off, full, off, temps, LayerKind)
        kinds = (uniform,) + off_kinds  # kind 0 the layer stored whole (the MTP layers' below)
        pattern = Pattern.of(i + 1 for i in off_pattern)

    _, _, p_hidden = spec.dropouts
    embed = emb_back = 0.0
    if stage.embedding:
        # input ids (int64), VocabParallelEmbedding's masked ids under TP, embedding dropout's mask (after the SP
        # scatter: language_model_embedding.py:140-148)
        embed = (INDEX + (INDEX if t > 1 else 0) + (MASK * h / sp if p_hidden > 0 else 0)) * tokens
        # the incoming gradient and the word embedding's dense weight gradient (param.grad, then main_grad.add_:
        # distributed_data_parallel.py:440)
        emb_back = a * h / sp * tokens + a * spec.vocab * h / t
    head_saved = labels = fwd = loss_back = norm_back = 0.0
    local = local_spec(setup)
    if stage.head and local:
        v = spec.vocab / t
        stats = (2 if spec.norm == "layernorm" else 1) * a  # torch norm statistics in the input dtype on CPU
        # final norm (input + statistics) and output_layer's input; the cross-entropy's fp32 softmax, target mask and
        # masked targets (cross_entropy.py:187 save_for_backward); the per-token fp32 loss handed back to the caller
        # ([b s] copy: language_module.py:170), alive until its backward. The labels' [s b] copy
        # (language_module.py:139) is not saved: the function keeps masked_target_1d instead
        # (the cross-entropy's share per --loss-fusion: megatron_loss.py)
        ce = cross_entropy_bytes(setup, a, v, tokens)
        head_saved = ((2 * a * h + stats) / sp + FP32) * tokens + ce.saved
        labels = INDEX * tokens
        # the 16-bit logits beside their fp32 copy (cross_entropy.py:28 `.float()`; a no-op on fp32 logits, which
        # the function then overwrites in place: cross_entropy.py:45)
        fwd = ce.forward
        # backward: the logits' 16-bit gradient (the `.float()` cast's; the fp32 one is computed in place of the
        # saved softmax: cross_entropy.py:196-210), then output_layer's backward without gradient-accumulation fusion
        # (off by default; TE-less CPU): its input gradient [s b h] and a whole weight gradient (layers.py:531,614),
        # the latter added into main_grad by the DDP hook and freed
        loss_back = max(ce.backward, a * h * tokens + a * v * h)
        norm_back = 2 * a * h / sp * tokens
    elif stage.head:
        v = spec.vocab / t
        # final TENorm (input + statistics) and output_layer's input, /t under SP; the cross-entropy's fp32 softmax,
        # target mask and masked targets (cross_entropy.py:187); the labels and their [s b] contiguous copy
        # (language_module.py:139)
        # (the cross-entropy's share per --loss-fusion: megatron_loss.py)
        ce = cross_entropy_bytes(setup, a, v, tokens)
        head_saved = ((2 * a * h + FP32) / sp + 2 * INDEX) * tokens + ce.saved
        labels = INDEX * tokens
        fwd = ce.forward  # unfused: the 16-bit logits beside their fp32 copy (cross_entropy.py:28 `.float()`)
        loss_back = ce.backward  # unfused: the logits' 16-bit gradient (the fp32 one made in place of the softmax)
        norm_back = 2 * a * h / sp * tokens
    if pattern and stage.mtp:
        pattern = Pattern(pattern.runs + ((((0, stage.mtp),), 1),))  # the MTP layers' own (not block-checkpointed)
    n_mtp = mtp_layers(spec, setup)
    if stage.head and n_mtp:
        # each MTP layer's logits through the shared output layer and its own cross-entropy (gpt_model.py:611-660)
        # NB: as the main head's saved set, all kept to the loss's backward (its labels counted once)
        head_saved += n_mtp * (head_saved - labels)
    if stage.mtp:
        # per MTP layer (multi_token_prediction.py:726-735): enorm's and hnorm's inputs (the shifted tokens'
        # embedding, the hidden states) and fp32 statistics, eh_proj's 2h-wide input (the concatenation); its
        # decoder layer saves one layer's set (counted as one more of the stage's layers below)
        embed += stage.mtp * (4 * a * h + 2 * FP32) / sp * tokens
    comm, opt_tmp = ms.comm, 0.0
    if local:
        # parallel_state.py:2046 get_global_memory_buffer: a [b·heads/t, sq, sk] tensor in the activation dtype, the
        # baddbmm input of every layer's DotProductAttention (dot_product_attention.py:189-191, beta=0: its contents
        # unused), kept for the process's life (utils.py:617-635 GlobalMemoryBuffer.get_tensor reuses it)
        comm += a * spec.heads / t * setup.batch * keys * keys if setup.attention_kernel == "eager" else 0.0
        # gloo all-gathers the updated params into the whole param buffer (distributed_data_parallel.py:463
        # start_param_sync -> param_and_grad_buffer.py:274 all_gather_into_tensor under _coalescing_manager, called
        # even at dp 1); ProcessGroupGloo's allgather_into_tensor_coalesced allocates a flat output of the buffer's
        # size in its worker thread. NB: torch AdamW's for-loop step temporaries (2 × the largest fp32 main param,
        # optimizer/__init__.py:32 without TE/apex) come before it and are smaller unless one param is > 1/2 of
        # the buffer: under-counts then
        opt_tmp = ms.weights
    resident = {"weights": ms.weights, "master_weights": ms.master - copies, "optimizer_states": ms.optimizer,
                "comm_buffers": comm}
    if n_off and megatron_offload.reload_buffers(setup, off):  # TE's double buffer (none as Megatron-LM runs it)
        resident["offload_buffers"] = megatron_offload.reload_buffers(setup, off)
    step = StepBytes(
        resident=resident,
        gradients=ms.gradients,
        accumulating=True,  # the contiguous grad buffer exists from initialisation (param_and_grad_buffer.py)
        head_gradients=0.0, layer_gradients=0.0, layers=stage.layers + stage.mtp, in_flight=stage.in_flight,
        layer_saved=uniform.saved, embedding_saved=embed, head_saved=head_saved, inputs=labels,
        forward_transient=fwd + ring, loss_backward=loss_back, layer_backward=uniform.backward, layer_freed=0.0,
        layer_grads_done=0.0, embedding_backward=emb_back, gathered=0.0,
        # CUDA: fused Adam, in place (stacks/megatron.toml [optimizer_impl]); the clip's temporaries come and go before
        optimizer_transient=copies + max(opt_tmp, clip),
        norm_kept=0.0, norm_backward=norm_back, kinds=kinds, pattern=pattern)
    p = peak(step)
    detail = {"stage": stage.index, "layers_on_rank": stage.layers, "in_flight_microbatches": stage.in_flight,
              "activation_per_layer": int(step.layers_saved / max(stage.layers, 1)),
              "activation_per_layer_stored": int(full), "logits_buffers": int(fwd),
              "optimizer_temporaries": int(step.optimizer_transient), "grad_clip_temporaries": int(clip),
              "context_parallel_ring_buffers": int(ring),
              "quantised_weight_copies": int(te_weights), "layers_in_recipe": n8,
              "moe_pairs_held": round(held, 2), "offloaded_layers": n_off,
              "offloaded_copied_per_layer": int(copied)}
    # the offloaded layers' pinned host copies, all of them at the forward's end (cpu_offload.py:243-257)
    host = n_off * copied * stage.in_flight
    return result_type(whole(ms.weights), whole(ms.gradients), whole(ms.master), whole(ms.optimizer),
                       whole(step.activations), whole(comm), p.phases, p.peak, p.phase, p.at_peak, detail, owned,
                       host_memory=int(host) if n_off else None,
                       offloaded_activations=int(n_off * copied) if n_off else None)


_STATES = cache()  # rank_states' memo
# rank_states reads neither the micro-batch nor the recompute policy: its groups of one layout and ZeRO stage share it;
# nor the pipeline split but through the Stage (its layers, ends and MTP layers, in the key): the splits that give a
# stage the same layers share it
STATES_FIXED = MICRO_BATCH + (("recompute", "none"), ("recompute_modules", None), ("pp_split", "even"))


def rank_states(spec: ModelSpec, setup: Setup, pc: ParamCounts, stage: Stage) -> tuple:
    """(model states with the recipe's weight copies, those copies' bytes, the clip's temporaries, the optimizer
    step's fp32 grad copies, the parameters the rank owns) of a stage: the parameters' and their states' bytes, none
    of which reads the micro-batch, the accumulation (the in-flight micro-batches are the Stage's, in the key) or the
    recompute policy and modules (parallel/megatron.py, te_recipes.weight_bytes, grad_clip: the parameters, their
    dtypes, shards and tensors). Memoised on the setup without them (batch_free with STATES_FIXED: every other
    setting, the stack folders), the stage and the model (`pc`: the spec's own counts)."""
    return memo(_STATES, spec, setup, (stage,), lambda: _rank_states(spec, setup, pc, stage), STATES_FIXED)


def _rank_states(spec: ModelSpec, setup: Setup, pc: ParamCounts, stage: Stage) -> tuple:
    """rank_states, computed."""
    ms = megatron_model_states(spec, pc, setup, stage)
    moe_share = spec.moe_share
    te_weights = te_recipes.weight_bytes(spec, setup, stage, moe_share)  # the recipe's quantised weight copies
    if setup.zero >= 3 and setup.fp8_all_gather:
        # Megatron-FSDP keeps the quantised parameters in its model weight buffer (and MXFP8's columnwise data in a
        # transpose weight buffer), sharded alike (param_and_grad_buffer.py:1940-1999): te_recipes.weight_copies of
        # them (NB: the experts' copies divided by the dense shard count: under by the expert data-parallel group's
        # smaller size)
        te_weights /= shards(setup)
        # the gathered units' buckets hold them in the same format: megatron_model_states counts 16-bit ones
        # (NB: the MoE/dense mix taken as the model's average, te_recipes.gather_saving)
        units = setup.stack_facts.fact("megatron_fsdp", "in_flight")
        gathered = te_recipes.gather_saving(spec, setup, units, bytes_per_param(setup)["weights"],
                                            copies=te_recipes.weight_copies(setup))
        ms = replace(ms, comm=ms.comm - gathered)
    ms = replace(ms, weights=ms.weights + te_weights) if te_weights else ms
    clip = grad_clip_temporaries(spec, setup, pc, stage)
    copies = grad_copy_bytes(spec, pc, setup, stage)  # the fp32 grad copies: the optimizer step's only
    dense, expert = rank_params(spec, pc, setup, stage)  # the distributed optimizer shards no parameters
    if setup.zero >= 3:  # Megatron-FSDP's optim_grads_params does: the rank owns its shard (parallel/megatron.py)
        dense, expert = dense / shards(setup), expert / shards(setup, expert=True)
    return ms, te_weights, clip, copies, round(dense + expert)


def _recipe_layers(setup: Setup, stage: Stage) -> int:
    """The stage's layers inside --low-precision's recipe (te_recipes.recipe_layers; 0 without one)."""
    return te_recipes.recipe_layers(setup, stage) if recipe(setup) is not None else 0


def _stored(spec: ModelSpec, setup: Setup, frac: float, tokens: float, keys: float, quantised: bool,
            held: float = 1.0, load: float | None = None, mask: bool = True) -> float:
    """The average layer's saved bytes on one rank for `tokens` tokens: its dense and MoE layers in their proportion
    `frac`, the MoE layers' routed copies at `held` pairs' load or at `load` (layer_terms), inside --low-precision's
    recipe or not (`quantised`), the local spec's mask or not (MegatronLayer.per_rank's `mask`)."""
    return (1 - frac) * layer_terms(spec, setup, quantised=quantised).per_rank(setup, tokens, keys, mask) + \
        (frac * layer_terms(spec, setup, moe=True, quantised=quantised, held=held, load=load).per_rank(
            setup, tokens, keys, mask) if frac else 0.0)


def _layer_stored(spec: ModelSpec, setup: Setup, stage: Stage, frac: float, tokens: float, keys: float,
                  held: float) -> float:
    """The stage's average layer's saved bytes on one rank (_stored at `held` pairs); under --low-precision the
    recipe's layers save quantised linear inputs, the bf16 first/last ones do not (te_recipes)."""
    return _in_recipe(setup, stage, lambda quantised: _stored(spec, setup, frac, tokens, keys, quantised, held))


def _in_recipe(setup: Setup, stage: Stage, stored) -> float:
    """The stage's average of `stored(quantised)` over its layers inside and outside --low-precision's recipe."""
    n8 = _recipe_layers(setup, stage)
    return stored(False) if n8 == 0 else (n8 * stored(True) + (stage.layers - n8) * stored(False)) / stage.layers


_PER_LAYER = cache()  # saved_floors' one-layer terms
# One layer's saved bytes per sequence and its checkpointed input (_stored, layer_input) read the pipeline only through
# the Stage, which saved_floors applies after (te_recipes.recipe_layers): the layouts that differ only in their
# pipeline share them, as the micro-batch's
PER_LAYER_FIXED = MICRO_BATCH + (("pp", 1), ("pp_split", "even"), ("vpp", 1))


def saved_floors(spec: ModelSpec, setup: Setup, pc: ParamCounts, stages: list[Stage]) -> tuple:
    """(saved, working) of each stage: bytes per sequence of the micro-batch that the stage holds at least beside
    states_floor's states and grad buffer (accumulating from initialisation), for every micro-batch b and
    accumulation: its last layer's backward (phases.peak's last_layer_backward moment) holds in_flight × its layers'
    saved bytes (`saved`: each layer's, `full` below, or under full/uniform recompute its groups' inputs, kept) and
    the layer's backward working set (`working`: under full/uniform recompute the group's N layers re-run, their
    `full` bytes; the temporaries, >= 0, left out) — at b sequences at least b × these: the saved bytes are b ×
    per-sequence terms plus the local spec's mask (>= 0, left out), and the routed copies' load is at least
    moe_imbalance.least_load whatever b. On the head's stage the forward's end holds the saved layers and the loss's
    saved logits (cross_entropy_bytes' saved, once more per MTP layer; the head's other tensors, >= 0, left out):
    `working` is the larger of the two moments'. (0, 0) where the layers differ in kind (block:N, --offload-layers:
    not bounded here). The planner's memory cap (plan/fit.py); one layer's terms for all the stages."""
    policy = setup.recompute_policy
    if policy == "block" or setup.offload_layers:
        return tuple((0.0, 0.0) for _ in stages)
    tokens = keys = setup.seq / setup.cp  # one sequence's tokens on this CP rank
    frac, load = spec.moe_share, least_load(setup)
    # one layer's, for every stage, and for every pipeline of the layout (PER_LAYER_FIXED)
    per: dict = memo(_PER_LAYER, spec, setup, (), dict, PER_LAYER_FIXED)

    def stored(quantised: bool) -> float:
        if quantised not in per:
            per[quantised] = _stored(spec, setup, frac, tokens, keys, quantised, load=load, mask=False)
        return per[quantised]
    kept = per.get("kept")
    if kept is None:
        kept = per["kept"] = layer_input(spec, setup) * tokens
    logits = cross_entropy_bytes(setup, act_bytes(setup), spec.vocab / setup.tp, tokens).saved * (
        1 + mtp_layers(spec, setup))
    out = []
    for stage in stages:
        full = _in_recipe(setup, stage, stored)
        if policy in ("full", "uniform"):
            n = setup.recompute_layers
            groups = math.ceil(stage.layers / max(setup.vpp, 1) / n) * max(setup.vpp, 1)
            per_layer, working = groups * kept / stage.layers, min(n, stage.layers) * full
        else:
            per_layer, working = full, 0.0
        out.append(((stage.layers + stage.mtp) * per_layer, max(working, logits) if stage.head else working))
    return tuple(out)


def held_pairs(setup: Setup, stage: Stage, frac: float) -> float:
    """The (micro-batch, MoE layer) pairs whose routed copies the stage's rank holds at its peak (the stored layers'
    of every in-flight micro-batch, pipeline.in_flight; under full/uniform recompute the group's layers recomputed in
    one micro-batch's backward; under block:N the layers not checkpointed), for moe_imbalance.held_load.
    NB: the stage's MoE layers as frac of its layers (the model's share, as the stored bytes take it): a stage with
    fewer (first_k_dense models' first) is given more pairs, whose excess grows as √n (over-counts there)."""
    policy, n, v = setup.recompute_policy, setup.recompute_layers, max(setup.vpp, 1)
    if policy in ("full", "uniform"):
        layers, micro = min(n, stage.layers), 1.0
    elif policy == "block":
        layers, micro = stage.layers - min(n, stage.layers // v) * v, stage.in_flight
    else:
        layers, micro = stage.layers, stage.in_flight
    return max(1.0, frac * layers * micro)


def _cut_to_core(s: Setup) -> Setup:
    """`s` with its recompute modules cut to the attention core (none where core_attn is not among them)."""
    return s.with_(recompute_modules="core_attn") if "core_attn" in modules(s) else \
        s.with_(recompute="none", recompute_modules=None)


_CORES = cache()  # _core_only's: the setup without its micro-batch and accumulation -> its core at one micro-batch
_LAST_CORE: tuple = (None, None)  # (the setup asked last, its answer): each pipeline stage of one evaluation asks again


def _core_only(setup: Setup) -> Setup:
    """_cut_to_core, memoised on the setup without its micro-batch and accumulation (batch_free; a training setup:
    the rules that read them are Setup.with_micro_batches', which checks them at this setup's own, so the policy's
    change is checked once per setting of the others)."""
    global _LAST_CORE
    if setup.mode != "train":
        return _cut_to_core(setup)
    if _LAST_CORE[0] is setup:
        return _LAST_CORE[1]
    one = remember(_CORES, batch_free(setup), lambda: _cut_to_core(setup.with_micro_batches(1)))
    got = one.with_micro_batches(setup.batch, setup.grad_accum)
    _LAST_CORE = (setup, got)
    return got




def grad_clip_temporaries(spec: ModelSpec, setup: Setup, pc: ParamCounts, stage: Stage) -> float:
    """The clip's temporaries before the step (grad_clip.megatron_clip) over the optimizer's main grads: the rank's
    shard of its parameters under the distributed optimizer (parallel/megatron.py shards)."""
    dense, expert = rank_params(spec, pc, setup, stage)
    clipped = dense / shards(setup) + expert / shards(setup, expert=True)
    tensors = megatron_tensors(spec, stage.layers, stage.embedding, stage.head)
    return clip_work(setup, state_bytes(setup), clipped, tensors, largest_param(spec, setup, stage)).temporaries
