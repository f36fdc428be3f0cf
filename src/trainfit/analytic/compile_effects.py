"""--compile: what a torch.compile'd (inductor) training step saves for backward, derived from the partitioner.

torch.compile traces forward and backward into one joint graph and splits it with
`min_cut_rematerialization_partition` (torch/_functorch/partitioners.py, torch 2.13): every forward tensor the
backward needs is either saved or recomputed inside the backward's fused kernels, choosing the cheapest set to save
under these rules (`solve_min_cut.should_ban_recomputation`, partitioners.py:2200-2257, and the op lists of
`get_default_op_list`, :2826-2992):
  * ops outside the recomputable allowlist are never recomputed (`ban_recompute_not_in_allowlist`): matmuls
    (aten.mm) and attention (SDPA) outputs are saved when the backward reads them;
  * a tensor that a backward op cannot fuse with reads (a weight-gradient matmul, SDPA's backward) is "materialized
    in backward" and saved rather than recomputed (`is_materialized_backwards`, :2186-2198);
  * a reduction whose output is 4× smaller than its input is saved (`ban_recompute_reductions`, :2245-2256): a
    norm's rsqrt statistic, the loss's row max and log-sum-exp;
  * everything else — fp32 upcasts, the norm's normalised tensor, SiLU and the SwiGLU product's operands' pointwise
    chains, casts — is recomputed in backward from what is saved, and duplicate casts of one input are one node
    (common-subexpression elimination before partitioning, :3765-3767 with functorch config.cse = True).

The Llama block (pre-norm RMSNorm, rotary, SDPA, SwiGLU), no recompute, then saves per token:
  the block input (the first norm's backward reads it), each norm's rstd (fp32) and its output cast to the compute
  dtype (read by the q/k/v and gate/up weight-gradient matmuls), the mid residual (the second norm's input; or the
  attention projection's output from which it is recomputed — the partitioner keeps the fp32 sum in every layer but
  the first, measured), SDPA's q, k, v, output and log-sum-exp, and the MLP's gate and up outputs (matmul outputs
  the SiLU·mul backward reads) and their product (read by the down projection's weight gradient).
Against the eager step that drops: SiLU's output (one MLP-width tensor), HF RMSNorm's fp32 copies, autocast's
three casts of one norm output (one remains). Autocast's weight casts stay: each is read by its layer's
input-gradient matmul in backward (materialized in backward).

The stacks compile differently (stacks/*.toml [compile]): torchtitan compiles each block (fullgraph, after
activation checkpointing) and the loss; the HF Trainer compiles the whole model, and transformers then builds a
(b, 1, s, s) attention mask (masking_utils.py:290-296: `_ignore_causal_mask_sdpa` returns False while tracing a
padding mask, and always under torch < 2.14), so SDPA gets a mask, runs without GQA (sdpa_attention.py:43-52:
`use_gqa_in_sdpa` needs no mask) on k and v repeated to every query head, and saves the mask (one per forward, CSE).

Recompute policies under compile (checkpoint tags become partitioner constraints: MUST_SAVE nodes are never
recomputed, partitioners.py:2207; PREFER_RECOMPUTE ones always are, :2362-2373):
  full     the block input only, as eager (torch.utils.checkpoint inside the compiled region);
  op       torchtitan's per-op SAC: the saved ops' outputs that the compiled backward reads — q and v (the 1st and
           3rd matmul), SDPA's output and log-sum-exp, the gate output (5th) — and the block input. Eager SAC caches
           every MUST_SAVE output, also the down projection's (7th matmul) that no backward op reads: compile drops
           it (a·h per token) and nothing else: under op SAC most pointwise ops are already recomputed;
  layer:N  every N-th block as full, the others as none.

Measured on CPU (torch 2.13, inductor; tests/analytic/test_compile_float8.py re-measures a tiny case), per token of
one layer, h 256, i 704/688: torchtitan block bf16 none 12312 B eager -> 7832 compiled (= this model, exact), op
3767.5 -> 3216 (exact), full 551.5 -> 551.5; HF LlamaDecoderLayer amp-bf16 none 24296 -> 20104 (exact with the
weight casts), bf16 10920 -> 8264 (exact).
NB: the partitioner's size/distance heuristics (get_node_weight, :2265-2303) pick between near-equal cuts; where
they keep the attention projection's output instead of the fp32 mid residual (the first layer, measured) this
over-reads by (4 - 2)·h bytes per token for that layer.
"""
from __future__ import annotations

from dataclasses import replace

from ..setup import Setup
from ..spec import ModelSpec
from .activations import FP32, LayerActivations, _flash_saved, _norm_saved, resolved_kernel
from .families import family_traits
from .loss import HeadBytes
from .nvfp4 import layer_saved_delta
from .parallel.tensor import layer_bytes_per_rank
from .precision import StateBytes


def not_modelled(spec: ModelSpec, setup: Setup) -> str | None:
    """Why the compiled block of this model is not modelled (None: it is): the derivation above is the Llama
    block's (RMSNorm, SwiGLU, flash/efficient SDPA, no dropout, dense)."""
    traits = family_traits(spec)
    checks = [
        (spec.norm == "rmsnorm" and not traits["norm_fp32"], "its norm is not a Llama RMSNorm"),
        (spec.gated_mlp and spec.activation in ("silu", "swish"), "its MLP is not SwiGLU"),
        (spec.moe is None, "its MLP is a mixture of experts"),
        (not (spec.qk_norm or spec.parallel_residual or traits["post_norm"] or spec.norms_per_layer != 2),
         "its block is not pre-norm with two norms"),
        (not traits["fused_qkv"] and not traits["fused_gate_up"], "its projections are fused"),
        (not any(spec.dropouts), "it has dropout"),
        (not spec.final_softcap, "it softcaps logits"),
        (resolved_kernel(spec, setup) == "flash", f"--attention {setup.attention_kernel} stores s×s scores"),
    ]
    for ok, why in checks:
        if not ok:
            return why
    return None


def _mask_materialized(setup: Setup) -> bool:
    return setup.stack_facts.fact("compile", "attention_mask") == "materialized"


def _attention(spec: ModelSpec, setup: Setup, a: int) -> float:
    """SDPA's saved set: the stack's flash kernel (activations._flash_saved), or under the HF stack's materialized
    mask q, k and v repeated to every head (transformers' repeat_kv), the output and an fp32 log-sum-exp."""
    if not _mask_materialized(setup):
        return _flash_saved(spec, setup, a)
    return a * 4 * spec.q_dim + FP32 * spec.heads


def block_terms(spec: ModelSpec, setup: Setup, st: StateBytes) -> dict[str, float]:
    """Bytes per token the compiled block saves with no recompute (one TP rank before the TP/SP divisors)."""
    from .torchao_recipes import compiled_recast_share
    a, r, h, i = st.act, st.residual, spec.hidden, spec.intermediate
    # the layers whose matmul inputs' casts the compiled backward recomputes (torchao_recipes.compiled_recast_share)
    float8 = compiled_recast_share(spec, setup)
    return {
        # the block input, and the mid residual (the second norm's input, in the residual dtype)
        "residual": 2 * r * h,
        "norms": 2 * FP32,  # each norm's rsqrt statistic (a reduction: saved)
        # each norm's output in the compute dtype, read by the weight-gradient matmuls. Float8 (float8.py): the
        # backward recasts that input to fp8 through a fusible transpose, so nothing forces the cast to be saved:
        # it is recomputed from the block input / mid residual and the norm's rstd
        "linear_inputs": (1 - float8) * 2 * a * h,
        "attention": _attention(spec, setup, a),
        # gate and up outputs (read by SiLU·mul's backward) and their product (the down projection's input);
        # float8: the product's fp8 cast is recomputed from gate and up like the norm outputs
        "mlp": (3 - float8) * a * i,
    }


def op_sac_terms(spec: ModelSpec, setup: Setup, st: StateBytes) -> dict[str, float]:
    """Bytes per token under torchtitan's per-op SAC compiled: the MUST_SAVE outputs the backward reads
    (torchtitan/models/llama3/infra/parallelize.py:36-50 save list; distributed/activation_checkpoint.py:98-120
    every second mm recomputed) and the block input."""
    from .nvfp4 import sac_mm_share
    from .recompute import op_sac_stores_sdpa  # (recompute reads this module's neighbours: imported on use)

    a, r = st.act, st.residual
    # SDPA's output and fp32 log-sum-exp, where the save list names the kernel that runs (stacks/torchtitan.toml
    # [op_sac] save; a release on sm100 ran cuDNN's, not on its list: both recomputed in backward)
    sdpa = a * spec.q_dim + FP32 * spec.heads if op_sac_stores_sdpa(spec, setup) else 0.0
    mm = sac_mm_share(spec, setup)  # (NVFP4 layers: no stored matmul output, analytic/nvfp4.py)
    return {
        "residual": r * spec.hidden,
        # q (wq, 1st mm) and v (wv, 3rd mm) projections
        "attention": mm * a * (spec.q_dim + spec.kv_dim) + sdpa,
        "mlp": mm * a * spec.intermediate,  # the gate projection's output (w1, 5th mm)
    }


def _per_rank(terms: dict, fixed: float, setup: Setup, tokens: int) -> float:
    la = LayerActivations(sum(terms.values()), 0.0, fixed, terms, {})
    return layer_bytes_per_rank(la, setup, tokens, 0.0)


def compiled_layer(spec: ModelSpec, setup: Setup, st: StateBytes, lm, tokens: int, policy: str | None = None):
    """The recompute module's LayerMemory `lm` (of `policy`, default the setup's) with what the compiled block keeps
    per layer and micro-batch; layer:N is built by memory.py from a none and a full layer. Backward moments stay
    eager's (NB in `notes`)."""
    policy = policy or setup.recompute
    if policy == "full":
        # the checkpointed block input (unchanged); the weight casts are inside the recomputed region, no
        # autocast cache exists under compile (dynamo traces autocast into casts)
        return replace(lm, autocast_casts=0.0)
    fixed = lm.activations.fixed  # autocast's weight casts: materialized in backward, saved
    if policy == "op":
        return replace(lm, saved=_per_rank(op_sac_terms(spec, setup, st), fixed, setup, tokens))
    terms = block_terms(spec, setup, st)
    if setup.lora_rank:  # the frozen base and its adapters (analytic/lora.py compiled_terms)
        from .lora import adapter_casts, compiled_terms

        terms, fixed = compiled_terms(spec, setup, st, terms), fixed + adapter_casts(spec, setup)
    none = _per_rank(terms, fixed, setup, tokens)
    none += layer_saved_delta(spec, setup, st, tokens)  # NVFP4Linear's codes (analytic/nvfp4.py; NB: eager's set)
    return replace(lm, saved=none)  # none, and HF's selective (flash SDPA: nothing s×s to recompute)


def shared_mask(spec: ModelSpec, setup: Setup, st: StateBytes) -> float:
    """The HF stack's compiled forward keeps one (b, 1, s, s) mask in the compute dtype for every layer's SDPA."""
    return setup.batch * setup.seq * setup.seq * st.act if _mask_materialized(setup) else 0.0


def compiled_head(spec: ModelSpec, setup: Setup, st: StateBytes, head: HeadBytes, tokens: int) -> HeadBytes:
    """The compiled cross-entropy (torchtitan components/loss.py:20-36; HF: inside the compiled model): the fp32
    upcast and log-softmax are fused reductions over the logits, so the logits themselves (the LM head's matmul
    output: saved) and two fp32 numbers per row (max and log-sum-exp: reductions, saved) replace the eager saved
    fp32 log-softmax; no fp32 copy is materialised in forward, and the backward makes the logits' gradient in one
    kernel. Measured on CPU (vocab 1024, 128 tokens): 1028 B saved beyond the logits vs 524296 eager; the loss's
    backward peak 263688 B (the bf16 gradient + 1544) vs 1572872."""
    a, v = st.act, spec.vocab // setup.tp
    amp = setup.precision.startswith("amp")
    # what the eager loss saves (analytic/loss.py: log_softmax's output, fp32 when the loss upcasts)
    loss_bytes = FP32 if (family_traits(spec)["loss_upcast"] or amp or a == FP32) else a
    saved = head.saved - loss_bytes * v * tokens + a * v * tokens + 2 * FP32 * tokens
    return replace(head, saved=saved, forward_transient=0.0, backward_transient=a * v * tokens)


def loss_compiled(spec: ModelSpec, setup: Setup) -> bool:
    """Whether the step's cross-entropy runs compiled (compiled_head): --compile-loss, or --compile on a modelled
    block and a stack whose compile takes the loss ([compile] loss; a whole-model compile, HF's, has it inside the
    model)."""
    if setup.compile_loss:  # the loss alone (torchtitan compile.components ['loss']: setup/rules.py checks the stack)
        return True
    return (setup.compile and not not_modelled(spec, setup)
            and bool(setup.stack_facts.facts["compile"].get("loss", True)))


def apply(spec: ModelSpec, setup: Setup, st: StateBytes, tokens: int, lm, head: HeadBytes, lm_full=None):
    """memory.py's hook: one layer's (and, for layer:N, the checkpointed layer's `lm_full`) and the head's bytes of
    a compiled step (eager's where not modelled)."""
    if not setup.compile or not_modelled(spec, setup):  # eager blocks; the loss compiled alone under --compile-loss
        return lm, lm_full, compiled_head(spec, setup, st, head, tokens) if loss_compiled(spec, setup) else head
    every = setup.recompute.startswith("layer:")
    lm = compiled_layer(spec, setup, st, lm, tokens, "none" if every else None)
    lm_full = compiled_layer(spec, setup, st, lm_full, tokens, "full") if lm_full is not None else None
    if setup.stack_facts.fact("compile", "scope") == "model":
        # the whole model is compiled: the final norm saves its input and rstd, not HF RMSNorm's fp32 copies
        # (its output cast, the LM head's input, is counted by loss.py)
        head = replace(head, saved=head.saved - (_norm_saved(spec, st.residual) - st.residual * spec.hidden - FP32)
                       * tokens)
    return lm, lm_full, compiled_head(spec, setup, st, head, tokens) if loss_compiled(spec, setup) else head


def adjust_step(step, spec: ModelSpec, setup: Setup, st: StateBytes, stage):
    """memory.py's hook on the step's bytes: the HF stack's compiled attention mask (one per micro-batch, live from
    the first layer's forward to its backward) and embedding backward, and Float8's fp8 FSDP all-gather
    (float8.py)."""
    from .float8 import gathered_saving

    changes = {}
    compiled = setup.compile and not not_modelled(spec, setup)
    if compiled and stage.layers:
        changes["embedding_saved"] = step.embedding_saved + shared_mask(spec, setup, st)
    if compiled and stage.embedding and setup.stack_facts.fact("compile", "scope") == "model" \
            and not setup.lora_rank:  # (LoRA: the embedding is frozen, no backward runs through it)
        # the embedding's backward inside the compiled graph: inductor's decomposition accumulates into a zero-filled
        # buffer in the computation dtype (fp32 for fp32/bf16 gradients) and returns a separate result
        # (torch/_decomp/decompositions.py:1386-1416 embedding_dense_backward, new_zeros + index_put): one
        # vocab × embedding-width fp32 buffer beside the gradient (measured on CPU, amp-bf16 and bf16)
        changes["embedding_backward"] = step.embedding_backward + FP32 * spec.vocab * (spec.embed_proj_dim or
                                                                                        spec.hidden) / setup.tp
    if setup.fp8_all_gather and step.gathered_at:
        # torchtitan's FSDP2 groups (parallel/fsdp2.py): each moment's unsharded blocks hold their Float8Linear
        # weights in fp8 (per block: half of gathered_saving, which counts the current and the prefetched block)
        per_block = gathered_saving(spec, setup, stage) / 2
        at = dict(step.gathered_at)
        # block L-1 and prefetched L-2; block 0 (its prefetch is the embedding); block k and block k-1's all-gather
        # output. NB: a moment another grouping (an earlier --stack-release's) does not name keeps its bf16 bytes
        # (over-reads it by those blocks' saving)
        for moment, blocks in (("last_layer_backward", 2 if stage.layers > 1 else 1), ("first_layer_backward", 1)):
            if moment in at:
                at[moment] -= per_block * blocks
        if "layer_backward" in at:
            const, per = at["layer_backward"]
            at["layer_backward"] = (const - 2 * per_block, per)
        changes["gathered_at"] = at  # (fp8 all-gather needs ZeRO-3 over dp > 1)
    return replace(step, **changes) if changes else step


def notes(spec: ModelSpec, setup: Setup) -> list[str]:
    """What --compile (or --compile-loss) changed in the estimate, and in which direction it may be off."""
    if setup.compile_loss:
        return ["compile-loss: the loss compiled, the blocks eager — the logits and two fp32 row statistics saved "
                "instead of the fp32 log-softmax, no fp32 copy, its backward one gradient in the logits' dtype (compiled_head); the "
                "loss's kernels timed as eager's (NB: over-reads the loss's time)"]
    if not setup.compile:
        return []
    # any compiled step: inductor's generated code launches the kernels, not eager's per-op Python (step_time.py)
    host = ("no wait on the host's kernel issue (step_time.host_issue_exposed; NB optimistic: inductor's launches "
            "are cheaper, not free)")
    why = not_modelled(spec, setup)
    if why:  # the saved set and the fusion are the Llama block's (ops.shape compiles only where modelled)
        return [f"compile: not modelled for {spec.name} ({why}): eager's saved tensors kept (NB: over-reads "
                f"memory) and eager's kernels, unfused (NB: over-reads their time); {host}"]
    what = ("under op SAC only the down projection's output is dropped (the policy already recomputes the pointwise "
            "ops); what remains: the block input, the q and v projections, the attention output and log-sum-exp, "
            "the gate projection" if setup.recompute == "op" else
            "the block input only, as eager (the re-run forward is modelled as eager's: NB over-reads the backward)"
            if setup.recompute == "full" else
            "pointwise intermediates (SiLU, norm upcasts, duplicate casts) recomputed in backward, matmul and "
            "attention outputs saved")
    out = [f"compile: the min-cut partitioner's saved set per layer — {what}; loss: the logits and two fp32 row "
           "statistics saved instead of the fp32 log-softmax, no fp32 copy (compile_effects.py; NB: backward high "
           "points inside a layer kept eager's: may over-read)"]
    if setup.lora_rank:
        out.append("compile (LoRA): the frozen base saves no weight-gradient inputs; one norm output per group an "
                   "adapter reads, each adapter's r-wide lora_A output and a copy of SDPA's output for o_proj's "
                   "adapter saved (lora.compiled_terms; NB: the compiled backward's first moments kept eager's: "
                   "-0.5 % on the measured CPU peak)")
    if _mask_materialized(setup):
        out.append("compile (hf): transformers builds a (b, 1, s, s) attention mask while tracing, so SDPA repeats "
                   "k and v to every head and keeps the mask")
    out.append("compile: step time from the op list with inductor's fusion — each chain of elementwise kernels "
               "between two matmuls one kernel moving only its inputs and outputs (ops.compiled); matmuls and "
               "attention as eager (NB: fusions across a matmul's epilogue and CUDA graphs not modelled: may "
               f"under-read compiled throughput); {host}")
    return out
