"""Inside one layer's backward: what is live beside the layer's saved tensors at its high points, and which of the
layer's parameter gradients exist by then.

Autograd runs the layer's ops in reverse (torch/csrc/autograd/engine.cpp: ready nodes by sequence number): each op's
backward allocates its input gradients (and weight gradients), then drops the tensors only it saved and its output
gradient. The high points read off traced steps:
  MLP        the down projection's backward: the gradient of the layer output (the residual stream's, kept until
             the attention branch adds its part), the dropout's input gradient, the down projection's input and weight
             gradients; then the activation's backward, the dropout's input gradient gone with the down projection's
             (its only reader) and its mask freed: the MLP's intermediate gradients — for a gated MLP the product's
             gradient and the two the product rule makes, the product (down_proj's input) freed: 2 × width net; for
             ReLU (which saves its output, fc2's input) the same; for other activations (which save their input) one;
  norm       Gemma-2's post-feed-forward RMSNorm, the first op of its layer's backward: five fp32 h-sized gradients;
  attention  (eager and math kernels only) the s×s gradient, once the MLP's saved tensors and its gradients are done
             (the math path with dropout: first probs·v's backward, then softmax's, the dropped probabilities and
             the noise freed);
  flash      (16-bit on CUDA) FlashAttention-2's backward scratch beside dq, dk, dv, the MLP's saved tensors freed: the
             high point of a layer whose MLP is tiled (--tiled-mlp: one slice's MLP-width gradients at a time);
  recompute  with full recomputation, the end of the layer's re-run forward: all its saved tensors again, plus its
             output (discarded) and the incoming gradient; on a CPU on oneDNN's 16-bit path, earlier, inside the
             re-run's down projection matmul, beside its scratch.
  math MLA   (CPU, q/k wider than v) a re-run layer's SDPA math path at its softmax or its output, beside the
             re-run's saved set so far: the forward's and the math path's own locals (_mla_math_rerun_moment;
             torchtitan's MLA forward exact against its real CPU step, transformers' against the trace).
NB: moment over-counted: a recomputed layer's fork_rng copy of the CPU RNG state (torch/utils/checkpoint.py:
1663-1665) only lives through the re-run forward — still counted at the MLP moment (5 KiB; +0.05% on small-gpt2).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..setup import Setup
from ..spec import ModelSpec
from .activations import FP32, _norm_saved, dropout_mask_bytes, norm_kernel, resolved_kernel
from .liger import swiglu_on
from .long_context import tiled_mlp_on, tiled_mlp_shards
from . import clamped_swiglu as swiglu
from . import sink_attention as sinks
from . import kbit_prep, lora, torchtitan_moe
from .families import family_traits
from .parallel.expert_memory import dispatch_bytes
from .precision import StateBytes


@dataclass(frozen=True)
class Moment:
    extra: float  # bytes beside the layer's saved tensors, one TP rank
    grads_done: float  # parameters of the layer whose gradients exist by then, one TP rank
    freed: float = 0.0  # of the layer's saved tensors, those already freed by then


def _mlp_intermediates(spec: ModelSpec) -> int:
    """How many MLP-width gradients are live net of freed saved tensors at the activation's backward: the product
    rule's two beside the product's gradient, the product freed (gated); ReLU's input gradient beside fc2's, its
    output (fc2's input) still saved by ReLU (aten threshold_backward); HF's composite tanh GELUs (gelu_new,
    gelu_fast: `0.5 * input * (1.0 + torch.tanh(...))`, transformers/activations.py:59-66 NewGELUActivation,
    :107-113 FastGELUActivation) the same: their last multiply's backward makes both operands' gradients beside
    fc2's input gradient, the product (fc2's input) freed (read off the trace of small-gpt2: three MLP-width
    gradients, four of its five saved tensors left); otherwise fc2's input gradient alone, the activation's output
    freed before its backward allocates."""
    if spec.gated_mlp or spec.activation in ("relu", "gelu_new", "gelu_fast"):
        return 2
    return 1


def layer_moments(spec: ModelSpec, setup: Setup, st: StateBytes, tokens: int, keys: float, moe: bool,
                  mlp_saved: float, layer_params: float, recomputed: float) -> list[Moment]:
    """The layer's backward high points. mlp_saved: per-token bytes the MLP sub-block saves (on this rank);
    layer_params: the layer's parameters on this rank; recomputed: bytes re-created by full recomputation."""
    t = setup.tp
    h, a = spec.hidden, st.act
    sp = t if setup.sequence_parallel else 1
    # the gradient of the layer's output, in the residual stream's dtype (split by SP only)
    incoming = st.residual * h * tokens / sp
    _, _, p_resid = spec.dropouts
    # the MLP-output dropout's backward: its input gradient is live, its saved mask freed
    drop_grad = (a - dropout_mask_bytes(setup, a)) * h * tokens / sp if p_resid > 0 else 0
    # post-norm (BERT): the norm after the MLP's residual add runs its backward first, freeing its saved input
    post_norm = _norm_saved(spec, st.residual) * tokens / sp if family_traits(spec)["post_norm"] else 0
    # Gemma-2's post-feed-forward norm (norms_per_layer 4: modeling_gemma2.py:326) runs its backward before the
    # MLP's, freeing what it saved (its input's fp32 copy, rsqrt, the fp32 normalised tensor; its moment is its own,
    # below); the post-attention norm (:320) likewise before the attention's. (mlp_saved holds the former.)
    post_ff = _norm_saved(spec, a, norm_kernel(setup), setup.device) * tokens / sp if spec.norms_per_layer == 4 else 0
    if moe and spec.moe.experts_every_token:  # Llama 4: every expert on every token (moe_every_expert.py)
        from .moe_every_expert import every_expert_moments  # noqa: PLC0415

        moments = every_expert_moments(spec, setup, tokens, incoming, recomputed)
    elif moe and torchtitan_moe.block_on(setup):  # torchtitan's own MoE module
        from .recompute import _saves_its_input  # noqa: PLC0415 (recompute imports this module)

        mid = 0 if _saves_its_input(spec, setup, st) else st.residual * h * tokens / sp
        moments = torchtitan_moe.moments(spec, setup, st, tokens / t, incoming, recomputed, mid)
    elif moe:
        m = spec.moe
        ex = int(st.param or st.weight)  # grouped_mm runs in the experts' (gathered) weight dtype (moe.py)
        routed = m.top_k * tokens / t  # the S = tokens·top_k routed copies
        # the routing-weight multiply's output takes the promoted dtype: fp32 when the weights stay fp32 (Mixtral)
        wb = FP32 if not family_traits(spec)["moe_weights_logits_dtype"] else max(ex, a)
        # Qwen2-MoE's gated shared expert (modeling_qwen2_moe.py:347, `sigmoid(shared_expert_gate(x)) * shared`) was
        # recorded after the routed experts, so its gate's backward has run: the gradient it passes to the block's
        # input (h, in the normalised input's dtype: the residual's) waits in autograd's input buffer for the routed
        # experts' and the router's; the multiply's saved shared output is traded for that output's gradient
        pending = incoming + (st.residual * h * tokens / sp if m.shared_gate else 0)
        # (a) its backward: the gradient arriving through the final sum (expanded to S×h), the reordered output's
        # and the down output's gradients (S×h each, that dtype)
        # under expert parallelism the combine's all-to-all backward holds its input and output gradients at once
        # (parallel/expert_memory.py dispatch_bytes)
        moments = [Moment(recomputed + pending + 3 * routed * h * wb + dispatch_bytes(spec, setup, tokens, a), 0.0)]
        if setup.recompute == "full":
            # the re-run forward's own high point, at that multiply: the sum's expanded gradient (computed before
            # the re-run starts: it needs no saved tensor) beside the multiply's output; a CPU kernel multiplying
            # bf16 by fp32 first copies the bf16 operand to fp32 (TensorIterator; trace/cpu_casts.py)
            scratch = FP32 * routed * h if (setup.device == "cpu" and wb != ex) else 0
            # the layer's mid residual (x + attention) is still referenced for the MLP's residual add
            moments.append(Moment(recomputed + pending + st.residual * h * tokens / sp + 2 * routed * h * wb + scratch,
                                  0.0))
            if spec.attn_sinks and resolved_kernel(spec, setup) == "eager":
                # gpt-oss: earlier still, inside the re-run's eager attention as its softmax runs (sink_attention.py
                # forward_transient: its s×s transients and locals) beside the layer's saved set made so far — the
                # output's copy and the MLP sub-block's not yet (the masks are the checkpoint's: masks_held)
                from .activations import layer_activations  # noqa: PLC0415 (activations imports this module's peers)
                later = (a * spec.q_dim / t + sum(layer_activations(spec, setup, moe=True).mlp_share.values())) * tokens
                moments.append(Moment(recomputed + pending + routed * h * wb - later
                                      + sinks.forward_transient(spec, st, tokens, keys) / t, 0.0))
            if m.swiglu_limit:
                # gpt-oss: earlier in the re-run, at the clamped SwiGLU's last product (clamped_swiglu.py), beside
                # the sum's expanded gradient and the mid residual (in the saved set already where the MLP's norm
                # saves its input): the gate's transients, down's output and the routing multiply not made yet
                from .recompute import _saves_its_input  # noqa: PLC0415 (recompute imports this module)
                mid = 0 if _saves_its_input(spec, setup, st) else st.residual * h * tokens / sp
                # the MLP's normalised input, held by the layer's local through the MLP (modeling_gpt_oss.py:367-368):
                # under autocast no op saves it (the router saves its cast; the experts gather from it)
                mid += st.residual * h * tokens / sp if st.autocast else 0
                moments.append(Moment(recomputed + pending + mid + routed * h * wb
                                      + swiglu.rerun_gate_extra(spec, ex, a) * tokens / t, 0.0))
        # (b) the activation's backward: down's input gradient beside the product rule's two (S×i each), with the
        # product (down's input) and down's output freed; the grouped down_proj weight gradient (all experts at once)
        # (the rank's experts: E/(ep·etp) of them under expert parallelism, parallel/expert_memory.py)
        experts_split = t if setup.ep <= 1 else setup.ep * setup.expert_tp
        moments.append(Moment(recomputed + pending + ex * routed * (2 * m.expert_intermediate - h),
                              m.num_experts * h * m.expert_intermediate / experts_split))
    else:
        # the MLP's gradients are in its intermediates' dtype: fp32 where the frozen quantised gate and up return
        # fp32 (analytic/kbit_prep.py)
        ai = kbit_prep.input_bytes(setup, st, "act")
        # Liger's SwiGLU backward stores da and db over its saved a and b (ops/swiglu.py:104-105, liger.py), and the
        # product (down's saved input) is freed: the down projection's input gradient alone, net of it: none
        n = 0 if swiglu_on(setup) and spec.gated_mlp else _mlp_intermediates(spec)
        # --tiled-mlp: DeepSpeed's TiledMLP.backward (deepspeed/runtime/sequence_parallel/ulysses_sp.py:1012-1062 at
        # edaa722) allocates the input's gradient whole (`x_grad = torch.zeros_like(x)`, :1031) and re-runs one
        # slice's MLP with grad at a time (:1035-1057): the MLP-width gradients are one slice's
        tiles = tiled_mlp_shards(spec, setup) if tiled_mlp_on(setup) else 1
        x_grad = a * h * tokens / sp if tiled_mlp_on(setup) else 0
        incoming = incoming + x_grad
        mlp = n * ai * spec.intermediate * tokens / t / tiles
        out_params = (h * spec.intermediate + (h if spec.mlp_bias else 0)) / t
        # under autocast the down projection's weight cast, saved by that matmul alone, went with its backward
        # (read off the trace of small-gpt2 amp-bf16: no c_proj cast live at the activation's backward)
        out_cast = a * out_params if st.autocast else 0
        # (a) the down projection's backward: its input gradient (one width) beside the dropout's input gradient
        # (the down projection's output gradient, which that backward reads)
        moments = [Moment(recomputed + incoming + drop_grad + ai * spec.intermediate * tokens / t / tiles, out_params,
                          post_norm + post_ff + out_cast)]
        moments += _down_backward_gemms(spec, setup, st, tokens, recomputed + incoming + drop_grad,
                                        post_norm + post_ff)
        if setup.recompute == "full" and not tiled_mlp_on(setup):
            mask_after = dropout_mask_bytes(setup, a) * h * tokens / sp if p_resid > 0 else 0
            moments += _rerun_down_gemm(spec, setup, st, tokens, recomputed + incoming,
                                        post_norm + post_ff + mask_after)
        # (b) the activation's backward: the dropout's input gradient went with the down projection's backward
        # (its only reader; GPT2MLP.forward runs dropout(c_proj(...)), transformers/models/gpt2/modeling_gpt2.py:
        # 240-245), so of the dropout only its freed mask (CPU: the noise, Dropout.cpp's input * noise) is left in
        # the account; with two MLP-width intermediates this is the higher of the two (read off the trace of
        # small-gpt2 fp32 full recompute on CPU: no h-sized dropout gradient live at gelu_new's last multiply)
        mask_freed = dropout_mask_bytes(setup, a) * h * tokens / sp if p_resid > 0 else 0
        moments.append(Moment(recomputed + incoming + mlp, out_params, post_norm + post_ff + out_cast + mask_freed))
        incoming -= x_grad  # (by the attention's backward the MLP's input gradient is summed into the residual's)
    if family_traits(spec)["norm_fp32"] and spec.norms_per_layer == 4 and not moe:
        # Gemma-2's post-feed-forward RMSNorm (`self._norm(x.float()) * (1.0 + self.weight.float())`,
        # modeling_gemma2.py:55-63, applied to the MLP's output at :326) is the first op of the layer's backward:
        # beside the incoming gradient, five fp32 h-sized gradients live at once as autograd runs its
        # mul/rsqrt/mean/pow backward one by one (as MLA's fp32 norms: _q_norm_moment), its normalised fp32 output
        # and rsqrt freed, only its own weight's gradient made — every other saved tensor of the layer still live
        # (read off the trace of small-gemma2 with full recompute, where this moment sets the peak)
        moments.append(Moment(recomputed + incoming + 5 * FP32 * h * tokens / sp, h,
                              FP32 * (h + 1) * tokens / sp))
    if resolved_kernel(spec, setup) != "flash":
        # the s×s gradient of the probabilities; by then the MLP's saved tensors (and the attention output's
        # dropout mask) are freed and all but q/k/v's and the first norm's gradients exist
        # softmax's backward allocates the scores' gradient while the probabilities' gradient is live: two s×s
        # (aten _softmax_backward_data), in the probabilities' dtype (the math path's fp32 upcast; eager: the
        # matmul's dtype for the probabilities' gradient, fp32 for softmax(dtype=float32)'s)
        kernel = resolved_kernel(spec, setup)
        a_probs = FP32 if kernel == "math" else a
        scores = (a_probs + FP32) * spec.heads * tokens * keys / t
        mask = dropout_mask_bytes(setup, a) * h * tokens / sp if p_resid > 0 else 0
        qkv = (h * (spec.q_dim + 2 * spec.kv_dim) + ((spec.q_dim + 2 * spec.kv_dim) if spec.qkv_bias else 0)) / t
        if spec.mla is not None:
            # MLA's q and kv down/up projections all run their backward after the scores' (as at the SDPA moment,
            # _mla_sdpa_moment): none of their gradients exists yet (read off the trace of small-deepseek_v3 on
            # CPU, whose math-path attention saves the s×s probabilities: only o_proj's and the MLP's gradients)
            from .mla import projection_params  # noqa: PLC0415
            qkv = projection_params(spec) / t
        freed = mlp_saved * tokens + mask + post_norm
        # the attention output's sub-block, where its backward has run before the moment: the output projection's
        # saved input (the kernel's output) and, under autocast, its weight cast
        from .inference import o_proj_params  # noqa: PLC0415 (inference imports this module's peers)
        o_w = o_proj_params(spec)
        o_block = (a * o_w // h * tokens + (a * (o_w + (h if spec.out_bias else 0)) if st.autocast else 0)) / t
        if kernel == "math" and spec.dropouts[1] > 0:
            # the math path with dropout on the probabilities (fp32 q, k, v; dropout; probs·v; the output cast back:
            # the aten ops the trace of small-bert records inside it): the attention output's sub-block has run its
            # backward too, and a post-norm layer's first LayerNorm (BertSelfOutput, modeling_bert.py:290-293)
            freed += o_block + post_norm
            # (i) probs·v's backward, the higher of the two: the dropped probabilities' gradient beside v's and the
            # output's fp32 gradient (ToCopyBackward of the fp32 matmul's output; the gradient itself when fp32)
            moments.append(Moment(recomputed + incoming + FP32 * (spec.heads * keys + 2 * spec.q_dim) * tokens / t,
                                  layer_params - qkv, freed))
            # (ii) by softmax's backward the dropped probabilities and the dropout's noise (fp32: the math path's
            # dtype; Dropout.cpp multiplies by a noise tensor on CPU) went with the dropout's and the matmul's
            freed += (dropout_mask_bytes(setup, FP32) + FP32) * spec.heads * tokens * keys / t
        elif kernel == "eager" and spec.dropouts[1] == 0:
            # eager attention (transformers' eager_attention_forward: softmax(dtype=float32).to(query.dtype), then
            # matmul with v): by softmax's backward the output projection's saved input and weight cast (autocast)
            # went with its backward, the probabilities' 16-bit cast with probs·v's, and a post-attention norm's
            # saved tensors (Gemma-2's, norms_per_layer 4) with its own (read off the trace of small-gemma2 at 1 x 200)
            freed += o_block + (a * spec.heads * tokens * keys / t if a != FP32 else 0) + post_ff
        moments.append(Moment(recomputed + incoming + scores, layer_params - qkv, freed))
    if resolved_kernel(spec, setup) == "flash" and setup.device == "cuda" and a < FP32 and spec.mla is None \
            and not moe:
        moments.append(_flash_backward_moment(spec, setup, st, tokens, mlp_saved, layer_params, recomputed + incoming,
                                              post_norm + (dropout_mask_bytes(setup, a) * h * tokens / sp
                                                           if p_resid > 0 else 0)))
    if spec.mla is not None and resolved_kernel(spec, setup) == "flash":
        moments.append(_mla_sdpa_moment(spec, setup, st, tokens, mlp_saved, layer_params, recomputed + incoming))
    if spec.mla is not None and spec.mla.q_lora_rank:
        moments.append(_q_norm_moment(spec, setup, st, tokens, keys, moe, layer_params, recomputed + incoming))
    if spec.mla is not None:
        moments.append(_kv_norm_moment(spec, setup, st, tokens, keys, moe, layer_params, recomputed + incoming))
    if spec.mla is not None and resolved_kernel(spec, setup) == "math" and recomputed:
        moments.append(_mla_math_rerun_moment(spec, setup, st, tokens, moe, incoming))
    if recomputed:
        # under full recomputation the freed tensors are recomputed ones, not the layer's saved (its input)
        moments = [Moment(m.extra - m.freed, m.grads_done) for m in moments]
    if setup.recompute == "full":
        # BERT's blocks end `LayerNorm(dropout(x) + input)` with the dropout's output still referenced until the
        # norm returns (modeling_bert.py BertOutput.forward)
        dropped = a * h * tokens / sp if (post_norm and p_resid > 0) else 0
        moments.append(Moment(recomputed + incoming + st.residual * h * tokens / sp + dropped, 0.0))
    return moments


def _flash_backward_moment(spec: ModelSpec, setup: Setup, st: StateBytes, tokens: int, mlp_saved: float,
                           layer_params: float, base: float, freed: float) -> Moment:
    """Inside the 16-bit flash kernel's backward (FlashAttention-2's mha_bwd, which torch's SDPA flash backend and
    transformers' flash_attention_2 both run): the output's gradient (dout) it reads, the dq, dk, dv it writes
    (flash_attn_interface.py:881-883 FlashAttnFunc.backward, csrc/flash_attn/flash_api.cpp:887-913 at 0251105), its
    fp32 scratch — softmax_d (batch, heads,
    seq) and the dq accumulator (batch, seq, heads, head_dim) (:921-926) — and under GQA dk and dv at the query heads
    before their sum over each group (dk_expanded, dv_expanded: :936-939; the varlen path alike, :1142-1165). By then
    the MLP sub-block's saved tensors are freed (its backward has run) and every gradient of the layer exists but
    q/k/v's. Under a full-width MLP the MLP's moments above stay higher (its saved intermediates alone outweigh
    these); it sets the layer's high point where the MLP is tiled (--tiled-mlp) or narrow.
    NB: FlashAttention-3 (Hopper) accumulates dk and dv in fp32 at the kv heads instead of expanding them in 16-bit at
    the query heads, and keeps a second fp32 row statistic (hopper/flash_api.cpp:1479-1497 dk_accum, dv_accum,
    softmax_lse_log2): under GQA 2·a·q_dim − 8·kv_dim − 4·heads bytes a token fewer than counted here (Llama-3.1-8B
    in bf16: ~8 KiB; read high there)."""
    t, a = setup.tp, st.act
    q, kv = spec.q_dim, spec.kv_dim
    per_token = a * (2 * q + 2 * kv) + FP32 * (q + spec.heads)  # dout, dq, dk, dv; dq_accum, softmax_d
    if spec.kv_heads < spec.heads:
        per_token += 2 * a * q  # dk_expanded, dv_expanded
    qkv = (spec.hidden * (q + 2 * kv) + ((q + 2 * kv) if spec.qkv_bias else 0)) / t
    return Moment(base + per_token * tokens / t, layer_params - qkv, mlp_saved * tokens + freed)


def _down_backward_gemms(spec: ModelSpec, setup: Setup, st: StateBytes, tokens: int, base: float,
                         freed: float) -> list[Moment]:
    """Inside the down projection's backward (moment (a)), its two matmuls, each with oneDNN's scratch (onednn.py:
    none off that path, where these stay below moment (a)): the input gradient grad·W (tokens × h · h × width) and
    the weight gradient with a transposed A — nn.Linear's grad^T·x (h × tokens · tokens × width: autograd keeps
    the transposed weight's layout), Conv1D's x^T·grad (width × tokens · tokens × h). addmm's backward (a biased
    linear: Linear.cpp's 3-D path, Conv1D) makes the input gradient first, mm's (unbiased) the weight gradient first
    (ONEDNN_VERBOSE of nn.Linear's backward, torch 2.13; the trace of small-gpt2): the second runs beside the first's
    output, as moment (a), its weight cast (autocast) not freed yet; the weight gradient comes out in the matmul's
    dtype (autocast copies it to fp32 after). Frozen weights (LoRA) make no weight gradient.
    NB: the other layer matmuls' backward (q/k/v/o, gate/up; MoE experts, shared experts) and the forward's are not
    moments here (the LM head's are: loss.head_matmuls; the re-run forward's down projection: _rerun_down_gemm): an
    under-count where the peak falls inside one on a CPU that takes oneDNN's path (none in the families matrix on
    AVX512-BF16 or, capped, AVX-512 without BF16)."""
    from .onednn import gemm_scratch  # noqa: PLC0415

    if setup.quant:  # frozen 4-bit weights: dequantised per call (quant.py), not modelled here
        return []
    t, h, a = setup.tp, spec.hidden, st.act
    width = spec.intermediate / t
    conv1d = family_traits(spec)["conv1d_weights"]
    s_in = gemm_scratch(setup, tokens, h, width, transposed_b=conv1d)  # grad·W (nn.Linear: W plain), grad·Wᵀ
    if not s_in:
        return []
    in_grad = a * width * tokens
    if setup.lora_rank:
        return [Moment(base + in_grad + s_in, 0.0, freed)]
    rows, cols = (width, h) if conv1d else (h, width)
    s_w = gemm_scratch(setup, rows, tokens, cols, transposed_a=True, transposed_b=False)
    w_grad = a * h * width
    if spec.mlp_bias:  # addmm: the input gradient, then the weight gradient
        return [Moment(base + in_grad + s_in, 0.0, freed), Moment(base + in_grad + w_grad + s_w, 0.0, freed)]
    return [Moment(base + w_grad + s_w, 0.0, freed), Moment(base + w_grad + in_grad + s_in, 0.0, freed)]


def _rerun_down_gemm(spec: ModelSpec, setup: Setup, st: StateBytes, tokens: int, base: float,
                     freed: float) -> list[Moment]:
    """Under full recomputation, inside the re-run forward's down projection matmul (x·Wᵀ: tokens × width · width ×
    h, W transposed) with oneDNN's scratch (onednn.py; none off that path, where this stays below the end of the
    re-run). The re-run starts when the layer's first backward node unpacks a saved tensor (torch 2.13 torch/utils/
    checkpoint.py:1165-1186 unpack_hook runs recompute_fn) and reaches this matmul with the layer's whole saved set
    made but what comes after it (`freed`: a dropout's mask, BERT's post-norm, Gemma-2's post-feed-forward norm),
    beside the incoming gradient, the mid residual the MLP's residual add holds (modeling_llama.py:311-314; already
    in the saved set where the MLP's norm saves its input) and the matmul's output (the row-parallel partial: h
    wide). With a LoRA adapter on the down projection (peft 0.21 tuners/lora/layer.py:1089-1102, `result +
    lora_B(lora_A(dropout(x))) * scaling`) the `* scaling` multiply's backward, which saves nothing, has run first
    and made its gradient (compute dtype) before lora_B's unpack starts the re-run; lora_A's r outputs are made
    after the matmul (read off the trace of a 2-layer LoRA Llama under FSDP2, amp-bf16, CPU: the step's high
    point, 198,272 B of scratch).
    NB: the re-run's other matmuls (q/k/v/o, gate/up, the adapters') are not moments: an under-count where one of
    them sets the peak; DoRA's down path is taken as LoRA's (unverified, direction unknown)."""
    from .onednn import gemm_scratch  # noqa: PLC0415
    from .recompute import _saves_its_input  # noqa: PLC0415 (recompute imports this module)

    if setup.quant:  # frozen 4-bit weights: dequantised per call (quant.py), not modelled here
        return []
    t, h, a = setup.tp, spec.hidden, st.act
    width = spec.intermediate / t
    scratch = gemm_scratch(setup, tokens, width, h, transposed_b=not family_traits(spec)["conv1d_weights"])
    if not scratch:
        return []
    sp = t if setup.sequence_parallel else 1
    mid = 0 if _saves_its_input(spec, setup, st) else st.residual * h * tokens / sp
    extra = mid + a * h * tokens + scratch
    if setup.lora_rank and "down_proj" in lora.targets(spec, setup):
        extra += a * h * tokens  # the `* scaling` multiply's gradient
        # lora_A's outputs, in its input's dtype as lora.layer_saved_delta counts them
        freed += (a if st.autocast else st.param or lora.adapter_bytes(setup)) * setup.lora_rank * tokens
    return [Moment(base + extra, 0.0, freed)]


def _q_norm_moment(spec: ModelSpec, setup: Setup, st: StateBytes, tokens: int, keys: float, moe: bool,
                   layer_params: float, base: float) -> Moment:
    """MLA's q_a_layernorm backward (DeepseekV3RMSNorm over q_lora_rank in fp32, modeling_deepseek_v3.py:46-51; its
    autograd runs mul/rsqrt/mean/pow backward one by one): five fp32 (tokens, q_lora) gradients live at once (read off
    the trace of small-deepseek_v3, q_lora 1536 beside hidden 128, where this moment sets the peak). It runs last in
    the attention's backward (the q path was recorded before the kv path): every saved tensor of the layer is freed
    but the input norm's, q_a_proj's input (under autocast its own cast; kv_a_proj's is freed) and the q norm's fp32
    input copy and rsqrt (its normalised tensor, saved by the weight multiply, went with that op's backward); of
    autocast's weight casts only q_a_proj's is left; every gradient exists but q_a_proj's. kv_a_proj's input
    gradient, made by the kv path's backward, waits in autograd's input buffer for q_a_proj's, to be summed into the
    attention norm's output gradient (in that output's dtype, the residual's: fp32 under autocast, through the input
    cast's backward; read off the trace of small-deepseek_v3 with full recompute in fp32 and bf16: -0.28 % / -0.22 %
    without it)."""
    from .activations import layer_activations  # noqa: PLC0415 (activations imports this module's peers)
    t, h, a, ql = setup.tp, spec.hidden, st.act, spec.mla.q_lora_rank
    sp = t if setup.sequence_parallel else 1
    la = layer_activations(spec, setup, moe)
    kept = la.terms["norms"] / 2 + a * h + FP32 * ql + FP32
    # autocast's weight casts: all freed by their matmuls' backward but q_a_proj's
    casts = la.fixed - (a * h * ql if st.autocast else 0)
    freed = ((la.per_token - kept) * tokens + la.per_token_key * tokens * keys + casts) / t
    grads = 5 * FP32 * ql * tokens / t + st.residual * h * tokens / sp  # (the norm's; kv_a_proj's input's)
    return Moment(base + grads, layer_params - (h * ql + (ql if spec.qkv_bias else 0)) / t, freed)


def _kv_norm_moment(spec: ModelSpec, setup: Setup, st: StateBytes, tokens: int, keys: float, moe: bool,
                    layer_params: float, base: float) -> Moment:
    """MLA's kv_a_layernorm backward (DeepseekV3RMSNorm over kv_lora_rank in fp32, modeling_deepseek_v3.py:46-51):
    like the q norm's (_q_norm_moment) five fp32 (tokens, kv_lora) gradients live at once. The kv path was recorded
    after the q path (DeepseekV3Attention.forward, modeling_deepseek_v3.py:440-447), so its backward runs first:
    SDPA's query gradient (heads·qk) waits for the q path, and the gradient of the shared RoPE key, summed from its
    per-head expansion (heads·rope, then rope), for the rotary backward (read off the trace of small-deepseek_v2 on
    CUDA, where this moment sets the peak). Every saved tensor of the layer is freed but the input norm's, the
    projections' input (under autocast q's and kv_a's own casts), the kv norm's fp32 input copy (its whole
    kv_lora + rope storage in fp32: a view of kv_a_proj's output) and rsqrt, and the q path's saved tensors; of
    autocast's weight casts q's and kv_a_proj's are left; every gradient exists but the q path's and kv_a_proj's."""
    from .activations import layer_activations  # noqa: PLC0415 (activations imports this module's peers)
    from .mla import projections_saved  # noqa: PLC0415
    m, t, h, a = spec.mla, setup.tp, spec.hidden, st.act
    n, kvl, ql = spec.heads, m.kv_lora_rank, m.q_lora_rank
    la = layer_activations(spec, setup, moe)
    q_saved = projections_saved(spec, a) - projections_saved(replace(spec, mla=replace(m, q_lora_rank=0)), a)
    kept = (la.terms["norms"] / 2 + (2 if st.autocast else 1) * a * h + FP32 * (kvl + (m.qk_rope_head_dim if a == FP32
            else 0)) + FP32 + q_saved)
    q_params = h * ql + ql + ql * n * m.qk_head_dim + (ql if spec.qkv_bias else 0) if ql else h * n * m.qk_head_dim
    kv_a_params = h * (kvl + m.qk_rope_head_dim) + ((kvl + m.qk_rope_head_dim) if spec.qkv_bias else 0)
    casts = la.fixed - (a * (q_params - (ql if ql else 0) + h * (kvl + m.qk_rope_head_dim)) if st.autocast else 0)
    freed = ((la.per_token - kept) * tokens + la.per_token_key * tokens * keys + casts) / t
    grads = (5 * FP32 * kvl + a * (n * m.qk_head_dim + (n + 1) * m.qk_rope_head_dim)) * tokens / t
    return Moment(base + grads, layer_params - (q_params + kv_a_params) / t, freed)


def _mla_math_rerun_moment(spec: ModelSpec, setup: Setup, st: StateBytes, tokens: int, moe: bool,
                           incoming: float) -> Moment:
    """Inside the re-run's math-path MLA attention (CPU: activations.resolved_kernel) of a layer re-run with grad
    (full recomputation, or per-op SAC, whose save list has no math-path op), at its high point (mla.math_rerun_live:
    the softmax, the output, or the output's copy once SDPA returns): beside the layer's kept tensors and the
    incoming gradient, what the re-run has made so far — the attention norm's saved tensors and the projections'
    inputs (its output, or under autocast the linears' casts with the fp32 output held as the attention's argument),
    the latent norms' (mla.projections_saved), the forward's locals and SDPA's own, on CPU the re-run's copy of the RNG
    state — and no gradient of the layer yet. The forward's locals: torchtitan's (mla.torchtitan_forward_held, its q
    a transposed view SDPA's matmul copies) or transformers' (mla.transformers_forward_held, the rotated k_pe,
    which only a KV cache would take over, in rotary's dtype, and under autocast SDPA's copy of a query rotary
    promoted to fp32: mla.sdpa_query_copy, DeepSeek-V3). The MLP's and o_proj's saved tensors are not made yet.
    transformers' re-run (DeepseekV2Attention.forward, modeling_deepseek_v2.py; its RMSNorm computes in fp32):
      - the attention norm's fp32 copy of an fp32 input is the input itself, which the checkpoint keeps (counted with
        the layer's kept tensors, not again here);
      - in fp32 the latent norm's input is a view of compressed_kv (projections_saved's whole (kv_lora + rope)
        storage), which the forward's locals also list: counted once;
      - under autocast: the weight casts of the projections before SDPA (mla.projection_params, each saved by its
        matmul), the latent norm's output k_nope in fp32 (the fp32 weight times its 16-bit input, a forward local
        beside kv_b_proj's saved cast), and the gradient of the layer's MLP output cast to its 16-bit dtype (the
        residual add's backward runs before the MLP's, which starts the re-run: autograd casts each gradient to its
        input's dtype, engine.cpp validate_outputs).
    Read off the traces of torchtitan's deepseek_v3 (exact against its real CPU step, bench torchtitan_moe_cpu) and
    transformers' DeepSeek-V2 on CPU (fp32, bf16, amp-bf16: the trace's allocations tagged with their aten ops).
    NB: under tensor parallelism the heads' terms are split t ways, the latent's not (replicated); not checked on a
    step."""
    from .activations import _composite_inner_norm  # noqa: PLC0415
    from .mla import input_calls, math_rerun_live, projection_params, projections_saved  # noqa: PLC0415
    from .mla import rotated_bytes, sdpa_query_copy, torchtitan_forward_held, transformers_forward_held  # noqa: PLC0415
    from .recompute import CPU_RNG_STATE, op_sac_saved_matmuls  # noqa: PLC0415 (recompute imports this module)
    from .params import count_params  # noqa: PLC0415
    from .parallel.fsdp2 import experts_unsharded_late  # noqa: PLC0415

    t, a, r, h, m = setup.tp, st.act, st.residual, spec.hidden, spec.mla
    sp = t if setup.sequence_parallel else 1
    torchtitan = torchtitan_moe.model_fact(spec, setup, "mla_forward")
    norm = _norm_saved(spec, r, norm_kernel(setup), setup.device)
    fixed = 0.0  # (bytes beside the per-token ones: weight casts, gradients)
    if torchtitan:
        stored = {mm[0] for mm in op_sac_saved_matmuls(spec, setup)} if setup.recompute == "op" else set()
        held = torchtitan_forward_held(spec, a=a, stored=stored, tp=t)
    else:
        # and the rotated k_rot, in rotary's dtype; under autocast SDPA's copy of a query rotary promoted to fp32
        held = (transformers_forward_held(spec, a=a, r=r, tp=t) + rotated_bytes(spec, a, r) * m.qk_rope_head_dim
                + sdpa_query_copy(spec, a=a, r=r, autocast=st.autocast, tp=t))
        norm -= FP32 * h if r == FP32 else 0  # (the input itself: the checkpoint's)
        held -= a * (m.kv_lora_rank + m.qk_rope_head_dim) if a == FP32 else 0  # (compressed_kv: projections_saved's)
        if st.autocast:
            held += FP32 * m.kv_lora_rank  # k_nope, the latent norm's fp32 output
            fixed += a * projection_params(spec) / t + a * h * tokens / sp  # the casts, the MLP output's gradient
    inputs = (input_calls(spec) * a + r) * h if st.autocast else a * h
    per_token = ((norm + inputs) / sp + projections_saved(spec, a, _composite_inner_norm(setup, st.autocast, a))
                 + held)
    rng = CPU_RNG_STATE if setup.device == "cpu" else 0
    cast = late = 0.0
    if moe and torchtitan_moe.block_on(setup):
        # the block's re-run starts at its combine's bmm backward, after the output gradient's cast; the experts'
        # unsharded copy, where FSDP2 makes it at their own pre-forward, is not made yet
        cast = torchtitan_moe.rerun_grad_cast(spec, setup, st, tokens / t)
        late = experts_unsharded_late(spec, count_params(spec), setup) * (st.param or st.weight)
    live = math_rerun_live(spec, a=a, tokens=tokens, seq=setup.seq, tp=t, q_folded=torchtitan)
    return Moment(incoming + cast - late + fixed + per_token * tokens + live + rng, 0.0)


def _mla_sdpa_moment(spec: ModelSpec, setup: Setup, st: StateBytes, tokens: int, mlp_saved: float,
                     layer_params: float, base: float) -> Moment:
    """MLA's fused SDPA backward (aten _scaled_dot_product_efficient_attention_backward /
    _flash_attention_backward): beside the output's gradient it reads (o_proj's input gradient, heads·v: dout, as
    _flash_backward_moment's), it allocates dq, dk (heads·(nope+rope) each) and dv (heads·v) in the inputs' dtype
    while all of the attention's saved tensors are still live; the MLP's saved tensors are freed by then and every
    gradient exists but the q/kv projections'. With MLA's widths (v_head_dim 128, qk 192 beside hidden 2048 in
    DeepSeek-V2-Lite) this moment can top the MLP's (read off the trace of small-deepseek_v2 on CUDA, where in fp32
    it sets the peak: without dout -1.46 %)."""
    from .mla import projection_params  # noqa: PLC0415
    m, t, n = spec.mla, setup.tp, spec.heads
    grads = st.act * (2 * n * m.qk_head_dim + 2 * n * m.v_head_dim) * tokens / t  # dq, dk; dv, dout
    proj = projection_params(spec) / t  # all but o_proj
    return Moment(base + grads, layer_params - proj, mlp_saved * tokens)
