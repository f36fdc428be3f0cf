"""Per-rank memory of the standard training step (DESIGN.md §3), phase by phase.

The peak is the largest of three high points, not the sum of categories:
  forward end      states + activations saved by every layer + the loss's logits buffers;
  backward         either its start (all activations + the logits gradients) or its end (all gradients),
                   since activations are freed layer by layer as gradients appear (linear in between);
  optimizer step   states + all gradients + the optimizer's temporaries.
Sharding: ZeRO stages per Rajbhandari et al. 2020 §5 (Pos, Pos+g, Pos+g+p); tensor parallelism and sequence
parallelism per Korthikanti et al. 2022 eq. 2-4; pipeline 1F1B keeps up to `pp` micro-batches in flight on
the first stage (Narayanan et al. 2021, §2.2).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..setup import Setup
from ..spec import ModelSpec
from .activations import (
    FP32,
    INDEX,
    _norm_saved,
    dropout_mask_bytes,
    dropouts,
    family_traits,
    keys_per_token,
    layer_activations,
    resolved_kernel,
)
from .params import ParamCounts, count_params
from .precision import StateBytes, state_bytes


@dataclass(frozen=True)
class Stage:
    """What one pipeline stage holds."""

    index: int
    layers: int
    embedding: bool
    head: bool
    in_flight: int  # micro-batches whose activations are stored at once


def stages(spec: ModelSpec, setup: Setup) -> list[Stage]:
    """First and last pipeline stages (the others are like the first minus the embedding)."""
    per = spec.layers // setup.pp
    if setup.pp == 1:
        return [Stage(0, spec.layers, True, True, 1)]
    in_flight = min(setup.pp, setup.grad_accum)  # 1F1B warm-up depth on stage 0
    return [Stage(0, per, True, False, in_flight), Stage(setup.pp - 1, per, False, True, 1)]


def rank_params(spec: ModelSpec, pc: ParamCounts, setup: Setup, stage: Stage) -> tuple[int, int]:
    """(parameters held by this rank, largest single parameter tensor) under TP and PP.
    NB: TP shards the matmul weights and the vocab; norms and row-parallel biases are replicated — we shard
    the whole attention/MLP count, under-counting by those biases (< 0.01% for LLMs)."""
    t = setup.tp
    layer_norms = pc.norms
    layer_rest = pc.attention + (pc.mlp * pc.dense_layers + pc.moe_mlp * pc.moe_layers) / spec.layers
    n = stage.layers * (layer_norms + layer_rest / t)
    if stage.embedding:
        n += pc.embedding / t
    if stage.head:
        n += pc.final + pc.lm_head / t
        if spec.tied_embeddings and not stage.embedding:
            n += pc.embedding / t  # Megatron keeps a copy of the tied embedding on the last stage
    largest = max(spec.vocab * (spec.embed_proj_dim or spec.hidden) // t, spec.hidden * spec.intermediate // t)
    return int(n), int(largest)


def adafactor_state(spec: ModelSpec, n_params: int, pc: ParamCounts, setup: Setup) -> float:
    """torch.optim.Adafactor (Shazeer & Stern 2018, Alg. 4): row and column second-moment statistics for each
    matrix, full second moment for vectors; no first moment by default. fp32."""
    h, t = spec.hidden, setup.tp
    i = spec.intermediate
    mats = [(spec.q_dim // t, h), (spec.kv_dim // t, h), (spec.kv_dim // t, h), (h, spec.q_dim // t)]
    mats += [(i // t, h), (h, i // t)] + ([(i // t, h)] if spec.gated_mlp else [])
    per_layer = sum(r + c for r, c in mats)
    emb = spec.vocab // t + h
    # vectors (norm weights, biases) keep a full second moment
    vectors = pc.norms
    return FP32 * (spec.layers * (per_layer + vectors) / setup.pp + 2 * emb)


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
    detail: dict


def _head_bytes(spec: ModelSpec, setup: Setup, st: StateBytes, tokens: int) -> dict:
    """Embedding, final norm, LM head and loss: saved bytes and the transient logits buffers.

    HF ForCausalLMLoss upcasts the logits to fp32 and runs cross_entropy = log_softmax + nll_loss
    (transformers loss_utils.py); log_softmax's fp32 output is saved for backward.
    """
    a, r = st.act, st.residual
    amp = setup.precision.startswith("amp")
    h, v = spec.hidden, spec.vocab // setup.tp  # vocab-parallel logits under TP (Megatron)
    p_emb, _, _ = dropouts(spec)
    emb_saved = INDEX * tokens  # token ids saved by the embedding backward
    if p_emb > 0:
        emb_saved += dropout_mask_bytes(setup, r) * h * tokens  # dropout mask on the (fp32 under amp) embeddings
    if spec.embedding_norm:
        emb_saved += _norm_saved(spec, r) * tokens
    head_saved = (_norm_saved(spec, r) if spec.final_norm else 0) * tokens
    if spec.mlm_transform:
        head_saved += (2 * a * h + _norm_saved(spec, a)) * tokens  # dense input, GELU input, LayerNorm
    head_saved += a * h * tokens  # lm_head input (its autocast cast under amp)
    head_fixed = a * v * (spec.embed_proj_dim or h) if amp else 0  # autocast cast of the LM-head weight
    # log_softmax runs in fp32 when the loss upcasts the logits, under autocast (log_softmax is on its fp32 list),
    # and in fp32 training; otherwise (BERT's MLM head in pure bf16) in the logits' dtype.
    upcast = family_traits(spec)["loss_upcast"]
    loss_bytes = FP32 if (upcast or amp or a == FP32) else a
    lsm = loss_bytes * v * tokens  # saved log_softmax output
    if spec.config.get("final_logit_softcapping", family_traits(spec).get("final_softcap_default")):
        head_saved += a * v * tokens  # Gemma-2 caps the logits with tanh, whose output is saved
    labels = INDEX * tokens
    logits = a * v * tokens
    logits_fp32 = FP32 * v * tokens if (a != FP32 and loss_bytes == FP32) else 0
    return {
        "embedding_saved": emb_saved,
        "head_saved": head_saved + head_fixed + lsm + labels,
        # forward high point: the logits, their fp32 copy and the log-softmax output, all live at once
        "loss_forward_transient": logits + logits_fp32,
        # backward start: grad of the log-softmax output and the logits' gradient beside the saved output
        # (counted in head_saved); the gradient's cast for the LM-head matmul comes after the first is freed
        "loss_backward_transient": max(2 * loss_bytes, loss_bytes + (a if a != loss_bytes else 0)) * v * tokens,
    }


def train_memory(spec: ModelSpec, setup: Setup, pc: ParamCounts | None = None) -> TrainMemory:
    pc = pc or count_params(spec)
    st = state_bytes(setup)
    results = [_stage_memory(spec, setup, pc, st, s) for s in stages(spec, setup)]
    return max(results, key=lambda m: m.peak)


def _optimizer_temporaries(setup: Setup, st: StateBytes, n: float, largest: int) -> float:
    """Temporaries of optimizer.step(): foreach kernels (the CUDA default) allocate whole-group temporaries, the
    for-loop (the CPU default) one parameter's worth at a time (torch/optim/adam.py, sgd.py)."""
    state_dtype = 4 if st.master or setup.precision in ("fp32", "amp-bf16", "amp-fp16") else 2
    foreach = setup.device == "cuda"
    size = n if foreach else largest
    per = {"sgd": 0, "momentum": 0, "adam": 2, "adamw": 2, "lion": 1, "adafactor": 2, "adamw-8bit": 1}[setup.optimizer]
    if foreach and setup.optimizer in ("adam", "adamw"):
        per = 1  # _foreach_sqrt(exp_avg_sq) is the one full-size temporary; the rest is in place
    temps = per * state_dtype * size
    if st.master:
        # every bf16 gradient gets an fp32 copy on the master before the update (trainfit.step's
        # MasterWeightOptimizer; Megatron's main_grad / DeepSpeed's fp32 gradient partition hold the same bytes)
        temps += FP32 * n
    return temps


def _stage_memory(spec: ModelSpec, setup: Setup, pc: ParamCounts, st: StateBytes, stage: Stage) -> TrainMemory:
    t, dp, z = setup.tp, setup.dp, setup.zero
    n, largest = rank_params(spec, pc, setup, stage)
    weights = n * st.weight / (dp if z >= 3 else 1)
    grads = n * st.grad / (dp if z >= 2 else 1)
    master = n * st.master / (dp if z >= 1 else 1)
    if st.factored:
        opt = adafactor_state(spec, n, pc, setup) / (dp if z >= 1 else 1)
    else:
        opt = n * st.optimizer / (dp if z >= 1 else 1)
    # DDP copies gradients into its own bucket buffers (torch DDP, gradient_as_bucket_view=False): a second
    # gradient-sized allocation resident through the step. ZeRO-2/3 reduce-scatter in small buckets.
    # ZeRO-1 as torch runs it (DDP + ZeroRedundancyOptimizer) keeps those buckets too. ZeRO-2 as FSDP2 runs it
    # (reshard_after_forward=False) keeps the sharded parameter storage it gathers from beside the full parameters
    # (Rajbhandari's Pos+g, as DeepSpeed runs it, has only the full ones: n/dp fewer bytes).
    comm = n * st.grad if (dp > 1 and z <= 1) else (n * st.weight / dp if z == 2 else 0)
    # ZeRO-3 / FSDP2: the current layer's and the prefetched next layer's full parameters are gathered, and the
    # root module (embeddings, final norm, LM head) stays unsharded from its forward all-gather to its backward.
    root = 0
    if z >= 3:
        root = (pc.embedding * stage.embedding + (pc.final + pc.lm_head) * stage.head) / t * st.weight * (1 - 1 / dp)
    gathered = 2 * pc.per_layer_dense / t * st.weight + root if z >= 3 else 0

    tokens = setup.batch * setup.seq
    keys = keys_per_token(spec, setup.seq)
    recompute = setup.recompute
    layer_setup = setup if recompute != "selective" else setup.with_(attention="flash", recompute="none")
    la = layer_activations(spec, layer_setup)
    if spec.moe is not None and pc.moe_layers:
        m = spec.moe
        la_moe = layer_activations(spec, layer_setup, mlp_width=m.expert_intermediate, experts_per_token=m.top_k)
    else:
        la_moe = la
    tp_div = {k: (t if (k in ("attention", "mlp") or setup.sequence_parallel) else 1) for k in la.terms}

    def layer_bytes(x):
        per_tok = sum(v / tp_div[k] for k, v in x.terms.items())
        return per_tok * tokens + x.per_token_key * tokens * keys / t + x.fixed / t

    frac_moe = pc.moe_layers / spec.layers
    one_layer = (1 - frac_moe) * layer_bytes(la) + frac_moe * layer_bytes(la_moe)
    if recompute == "full":
        # torch.utils.checkpoint keeps each layer's input (the residual stream); the layer is recomputed in backward
        saved_layer = st.residual * spec.hidden * tokens / (t if setup.sequence_parallel else 1)
        # the recomputed layer's first saved tensor is the checkpointed input itself (same storage)
        bwd_recompute = max(one_layer - saved_layer, 0)
    else:
        saved_layer = one_layer
        bwd_recompute = 0
    layers_saved = stage.layers * saved_layer * stage.in_flight

    head = _head_bytes(spec, setup, st, tokens)
    emb_saved = head["embedding_saved"] if stage.embedding else 0
    head_saved = head["head_saved"] if stage.head else 0
    activations = layers_saved + emb_saved * stage.in_flight + head_saved
    fwd_transient = head["loss_forward_transient"] if stage.head else 0
    if recompute == "full" and setup.precision.startswith("amp"):
        # autocast's cache keeps every weight's cast until the autocast region exits, checkpointed or not
        fwd_transient += stage.layers * la.fixed / t
    bwd_start_transient = head["loss_backward_transient"] if stage.head else 0
    # During one layer's backward: with full recompute, its recomputed activations (the big intermediate gradients
    # only appear once some of them are freed); without, the gradients of its largest intermediates.
    # NB: approximated by two MLP-intermediate gradients, or the s×s gradient for non-flash attention.
    a = st.act
    if recompute == "full":
        bwd_layer_transient = bwd_recompute
    else:
        bwd_layer_transient = 2 * a * spec.intermediate * tokens / t
        if resolved_kernel(spec, layer_setup) != "flash":
            # the softmax's fp32 s×s gradient (observed in traced eager steps; not live with the MLP's)
            bwd_layer_transient = max(bwd_layer_transient, FP32 * spec.heads * tokens * keys / t)

    if z >= 2:
        # a module's full gradient lives until its reduce-scatter: a whole layer's, or the LM head's/embedding's
        layer = pc.per_layer_dense / t
        bwd_layer_transient += max(largest, layer) * st.grad * (1 - 1 / dp)
        if setup.device == "cpu":
            # gloo (the CPU backend) clones the reduce-scatter input and, where backward re-gathers parameters
            # (ZeRO-3), all-gathers into its own flat buffer; NCCL does neither (ProcessGroupGloo.cpp
            # _reduce_scatter_base / _allgather_base)
            bwd_layer_transient += layer * (st.grad + (st.weight if z >= 3 else 0))

    states = weights + master + opt + comm
    grads_before = grads if setup.grad_accum > 1 else 0  # earlier micro-batches' gradients stay live
    forward_end = states + grads_before + activations + fwd_transient + gathered
    # the loss's gradients and a layer's backward temporaries are not live at the same time
    bwd_start = states + grads_before + activations + max(bwd_start_transient, bwd_layer_transient) + gathered
    # end of backward: all gradients, the first layer's saved tensors (freed by its own backward) and the embedding's
    bwd_end = states + grads + emb_saved + saved_layer + bwd_layer_transient + gathered
    backward = max(bwd_start, bwd_end)
    opt_temps = _optimizer_temporaries(setup, st, n / (dp if z >= 1 else 1), largest)
    optimizer_step = states + grads + opt_temps
    phases = {"forward_end": int(forward_end), "backward": int(backward), "optimizer_step": int(optimizer_step)}
    peak_phase = max(phases, key=phases.get)
    peak = phases[peak_phase]
    resident = {"weights": weights, "master_weights": master, "optimizer_states": opt, "comm_buffers": comm}
    if peak_phase == "forward_end":
        at = {**resident, "gradients": grads_before, "activations": activations, "temporaries": fwd_transient + gathered}
    elif peak_phase == "backward" and bwd_start >= bwd_end:
        at = {**resident, "gradients": grads_before, "activations": activations,
              "temporaries": max(bwd_start_transient, bwd_layer_transient) + gathered}
    elif peak_phase == "backward":
        at = {**resident, "gradients": grads, "activations": emb_saved + saved_layer,
              "temporaries": bwd_layer_transient + gathered}
    else:
        at = {**resident, "gradients": grads, "activations": 0, "temporaries": opt_temps}
    at = {k: int(v) for k, v in at.items()}
    detail = {
        "stage": stage.index,
        "layers_on_rank": stage.layers,
        "in_flight_microbatches": stage.in_flight,
        "activation_per_layer": int(saved_layer),
        "activation_terms_per_token": {k: v / tp_div[k] for k, v in la.terms.items()},
        "attention_scores_per_layer": int(la.per_token_key * tokens * keys / t),
        "autocast_weight_copies_per_layer": int(la.fixed / t),
        "logits_buffers": int(fwd_transient),
        "optimizer_temporaries": int(opt_temps),
        "zero3_gathered_params": int(gathered),
    }
    return TrainMemory(int(weights), int(grads), int(master), int(opt), int(activations), int(comm), phases,
                       int(peak), peak_phase, at, detail)
