"""FLOPs of a step. Matmuls count 2 FLOPs per multiply-add (Kaplan et al. 2020, Table 1: C_forward ≈ 2N +
2·n_layer·n_ctx·d_attn); backward is twice the forward (Narayanan et al. 2021 §5.1: 3× total, 4× with full
recompute; per-op SAC re-runs the matmuls it does not store, layer:N every N-th layer). Causal attention counts the (s+1)/2 keys each query sees on average, as flash kernels skip the
masked half. NB: norms, activations, softmax and the optimizer are elementwise and left out (< 1% for LLMs:
under-counts slightly); embedding lookups are not matmuls and cost no FLOPs.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..heads import CLASSIFIERS, layout
from ..setup import Setup
from ..spec import ModelSpec
from . import gated_deltanet, vlm
from .params import ParamCounts, count_params


@dataclass(frozen=True)
class StepFlops:
    forward: float  # whole model, all micro-batches of one DP rank
    backward: float
    recompute: float
    per_token: float  # model FLOPs per trained token (fwd + bwd)
    forward_per_token: float


def head_matmul_per_token(spec: ModelSpec, seq: int) -> float:
    """Weights of the task head each token multiplies through (trainfit.heads): the LM head (also when tied to the
    embedding) and BERT's MLM transform; a token classifier, or a decoder's sequence classifier (which scores every
    position before gathering the last); BERT/RoBERTa's sequence classifier runs once per sequence on token 0
    (pooler/dense + classifier), i.e. 1/seq per token."""
    head = layout(spec)
    if head.kind in CLASSIFIERS:
        n = head.in_dim * head.width
        if head.rows == "first":
            return (n + (spec.hidden**2 if head.pooler else 0)) / seq
        return n
    n = spec.vocab * (spec.embed_proj_dim or spec.hidden)
    if spec.mlm_transform:
        n += spec.hidden * spec.hidden
    return n


def matmul_params_per_token(spec: ModelSpec, pc: ParamCounts, seq: int = 1) -> float:
    """Weights each token multiplies through: attention and MLP matrices (active experts only), the router and
    the task head (`head_matmul_per_token`; `seq` matters for pooled classifiers only). NB: Llama 4's eager MoE
    (modeling_llama4.py Llama4TextExperts) multiplies every token through all E experts, zero-scored ones included:
    the FLOPs the GPU executes, which the op list times (ops/moe.py every_expert_ops); model FLOPs and MFU stay on the
    routed top_k here, the standard definition."""
    # Qwen3-Next's Gated DeltaNet layers multiply through their projections in place of attention's
    n = pc.attention * (spec.layers - pc.linear_layers) + pc.mlp * pc.dense_layers
    if pc.linear_layers:
        n += pc.linear_layers * gated_deltanet.linear_params(spec)
    if spec.moe is not None:
        m = spec.moe
        shared = (pc.moe_mlp - m.num_experts * pc.expert - m.num_experts * spec.hidden) if pc.moe_layers else 0
        n += pc.moe_layers * (m.top_k * pc.expert + m.num_experts * spec.hidden + shared)
    return n + head_matmul_per_token(spec, seq)


def attention_core_per_layer(spec: ModelSpec, seq: int) -> float:
    """One softmax-attention layer's q·kᵀ and probs·v per token: 2·2·q_dim FLOPs per key (Kaplan et al. 2020,
    Table 1); MLA (DeepSeek): q·kᵀ over the qk head width, probs·v over v_head_dim, 2·(q_dim + heads·v_head_dim)."""
    keys = (seq + 1) / 2 if spec.causal else seq
    width = 2 * spec.q_dim if spec.mla is None else spec.q_dim + spec.heads * spec.mla.v_head_dim
    return 2 * width * keys


def attention_flops_per_token(spec: ModelSpec, seq: int) -> float:
    """Every softmax-attention layer's core (attention_core_per_layer) and the Gated DeltaNet layers' rule."""
    linear = gated_deltanet.linear_layers(spec)
    rule = linear * gated_deltanet.rule_flops_per_token(spec, seq) if linear else 0.0
    return gated_deltanet.attention_layers(spec) * attention_core_per_layer(spec, seq) + rule


def mtp_forward_per_token(spec: ModelSpec, setup: Setup, pc: ParamCounts) -> float:
    """The forward FLOPs per token of the MTP layers the stack trains (analytic/mtp.py; 0 without them): each its
    eh_proj (2h -> h), one decoder layer of the model's MoE kind (its dense one for a dense model) with the routed
    top_k, and the shared output layer once more, as Megatron counts them (megatron/training/training.py
    num_floating_point_operations: the 'MTP norms and proj' term and the logits' (mtp_num_layers + 1))."""
    from .mtp import mtp_layers  # (mtp imports parallel/, whose modules import this one)

    n = mtp_layers(spec, setup)
    if not n:
        return 0.0
    h = spec.hidden
    mlp = pc.mlp
    if spec.moe is not None and pc.moe_layers:
        m = spec.moe
        shared = pc.moe_mlp - m.num_experts * pc.expert - m.num_experts * h
        mlp = m.top_k * pc.expert + m.num_experts * h + shared
    matmuls = 2 * h * h + pc.attention + mlp + head_matmul_per_token(spec, setup.seq)
    return n * (2 * matmuls + attention_core_per_layer(spec, setup.seq))


def forward_per_token(spec: ModelSpec, seq: int, pc: ParamCounts | None = None) -> float:
    pc = pc or count_params(spec)
    if spec.hybrid is not None:
        return hybrid_forward_per_token(spec, seq, pc)
    return 2 * matmul_params_per_token(spec, pc, seq) + attention_flops_per_token(spec, seq)


def hybrid_forward_per_token(spec: ModelSpec, seq: int, pc: ParamCounts) -> float:
    """A hybrid stack (Nemotron-H): each kind of block times its count (ParamCounts' attention and mlp are one block
    of each kind there, params.py), the Mamba-2 blocks' projections and scan (mamba2.py), the attention core in the
    attention blocks only, and the head."""
    from . import mamba2  # noqa: PLC0415

    m = spec.hybrid
    matmuls = (m.attention_layers * pc.attention + m.mlp_layers * pc.mlp + m.mamba_layers * mamba2.matmul_params(spec)
               + head_matmul_per_token(spec, seq))
    return (2 * matmuls + attention_flops_per_token(spec, seq) * m.attention_layers / spec.layers
            + m.mamba_layers * mamba2.scan_flops_per_token(spec, seq))


def recompute_per_token(spec: ModelSpec, setup: Setup, layers: int, layer_forward: float,
                        attention_per_layer: float) -> float:
    """FLOPs per token that `layers` layers re-run in their backward under the setup's policy. layer_forward: one
    layer's forward FLOPs per token (matmuls + attention core); attention_per_layer: its attention core's.
      full       every layer's forward again (Narayanan et al. 2021 §5.1: 4× instead of 3×);
      selective  the attention core (Korthikanti et al. 2022 §4.2);
      op         per-op SAC replays the stored outputs — every second aten.mm and the CUDA SDPA kernel — and re-runs
                 the rest of the block: the other matmuls (addmm of biased linears included: not on the save list)
                 and, unless stored, the attention core (recompute.op_sac_saved_matmuls, op_sac_stores_sdpa);
      layer:N    every N-th layer's forward again (torchtitan _apply_layer_sac: the blocks whose count is a
                 multiple of N).
    NB: the elementwise ops every policy re-runs (norms, rotary, activations) are not counted, as in the forward."""
    r = setup.recompute
    if r == "full":
        return layers * layer_forward
    if r == "selective":  # the attention core, and Megatron's other --recompute-modules' matmuls
        from .megatron_recompute import modules, rerun_matmul_per_token
        core = attention_per_layer if "core_attn" in modules(setup) else 0.0
        return layers * (core + rerun_matmul_per_token(spec, setup))
    if r == "op":
        from .nvfp4 import sac_mm_share  # (NVFP4 layers re-run every matmul: analytic/nvfp4.py)

        stored = sac_mm_share(spec, setup) * sum(2 * out * inp for _, out, inp, _ in _recompute.op_sac_saved_matmuls(spec, setup))
        stored += attention_per_layer if _recompute.op_sac_stores_sdpa(spec, setup) else 0.0
        return layers * (layer_forward - stored)
    if r.startswith("layer:"):
        return layers // setup.layers_every * layer_forward
    # Megatron (transformer_block.py:532-563 _checkpointed_forward): selective (core_attn) as above; uniform:N re-runs
    # every group's forward; block:N the first N layers of each of the stage's vpp model chunks
    if r.startswith("uniform:"):
        return layers * layer_forward
    if r.startswith("block:"):
        return min(setup.recompute_layers, layers // setup.vpp) * setup.vpp * layer_forward
    return 0.0


def step_flops(spec: ModelSpec, setup: Setup, pc: ParamCounts | None = None) -> StepFlops:
    if spec.encdec is not None:  # T5's two stacks (encoder_decoder_training.py)
        from . import encoder_decoder, encoder_decoder_training  # noqa: PLC0415

        if encoder_decoder.modelled(spec):
            return encoder_decoder_training.step_flops(spec, setup)
    pc = pc or count_params(spec)
    fpt = forward_per_token(spec, setup.seq, pc)
    tokens = setup.batch * setup.seq * setup.grad_accum
    fwd = fpt * tokens
    head = 2 * head_matmul_per_token(spec, setup.seq)  # the head is outside the checkpointed layers
    layer_forward = (fpt - head) / spec.layers
    attention_layer = attention_flops_per_token(spec, setup.seq) / spec.layers
    # per pipeline stage: torchtitan's layer:N counts the blocks on each rank (activation_checkpoint.py:27-50)
    per_stage = recompute_per_token(spec, setup, spec.layers // setup.pp, layer_forward, attention_layer)
    recompute = setup.pp * per_stage * tokens
    if setup.lora_rank:  # frozen base: no weight gradients; the adapters' matmuls (analytic/lora.py)
        from .lora import flops_per_token

        f, b = flops_per_token(spec, setup, fpt, attention_flops_per_token(spec, setup.seq))
        if setup.recompute == "full":  # the adapters' forward matmuls re-run with their layers (selective: not)
            recompute += (f - fpt) * tokens
        return StepFlops(f * tokens, b * tokens, recompute, f + b, f)
    # a VLM's tower, per micro-batch (analytic/vlm.py): trained with the rest, its backward twice its forward but for
    # the patch embedding's, which needs no input gradient (the pixels); full recompute re-runs its blocks (NB:
    # counted as the whole tower)
    tower = vlm.tower_forward_flops(spec, setup) * setup.grad_accum
    if setup.recompute == "full":
        recompute += tower
    backward = 2 * (fwd + tower) - vlm.patch_embed_flops(spec, setup) * setup.grad_accum
    # the MTP layers (outside the decoder layers' recompute: NB not re-run under --recompute full)
    mtp = mtp_forward_per_token(spec, setup, pc)
    fwd, backward, fpt = fwd + mtp * tokens, backward + 2 * mtp * tokens, fpt + mtp
    return StepFlops(fwd + tower, backward, recompute, 3 * fpt, fpt)


# (imported last, as the module, not its names: recompute.py's imports reach this module; a function-level import costs its
# resolution on every call, and this one sits on the engine's hot path)
from . import recompute as _recompute  # noqa: E402
