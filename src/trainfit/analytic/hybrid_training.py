"""Training memory of a hybrid stack (Nemotron-H, transformers models/nemotron_h/modeling_nemotron_h.py: Mamba-2,
attention and MLP blocks, NemotronHBlock :934-994: one RMSNorm, one mixer, the residual add): each kind of block
is a phases.LayerKind with its own saved bytes, backward high point and gradients, in the pattern's order.

A Mamba-2 block's forward has a high point of its own: the end of its scan, where the scan's fp32 locals are all
live beside what autograd saves (mamba2.scan_end_train). Without recomputation it is the step's high point at the
traced sizes (before the backward, whose live set is the saved one less the scan's transients plus gradients);
under full recomputation the same moment recurs in the backward, in the block's re-run forward, beside the
gradients of the blocks after it and the incoming gradient.
"""
from __future__ import annotations

from ..errors import NotModelledError
from ..setup import Setup
from ..spec import ModelSpec
from . import mamba2
from .activations import FP32
from .parallel.tensor import term_divisors
from .params import ParamCounts
from .phases import LayerKind, Pattern
from .precision import StateBytes
from .recompute import CPU_RNG_STATE, LayerMemory


def check_trainable(spec: ModelSpec, setup: Setup, st: StateBytes) -> None:
    """Refuse, in one line, the hybrid training setups whose terms are not derived."""
    from .stacks import model_for  # noqa: PLC0415 (the stacks' models import the memory modules)

    if not model_for(setup).hybrid_blocks:  # (its memory model has no Mamba-2 layers: StackModel.hybrid_blocks)
        raise NotModelledError(f"{spec.name}: training with Mamba-2 blocks on --stack {setup.stack} is not modelled by "
                               "the analytic engine (its memory model has no Mamba-2 layers); use --stack hf")
    why = None
    if setup.tp > 1 or setup.pp > 1 or setup.zero >= 3 or setup.recompute not in ("none", "full"):
        # the Mamba heads' TP split, each stage's share of the pattern and the per-block parameter gathers are not
        why = "--tp/--pp, ZeRO-3/FSDP or a recompute policy other than none and full"
    elif setup.lora_rank or setup.compile or setup.offload != "none":
        why = "--lora, --compile or --offload"
    if why:
        raise NotModelledError(f"{spec.name}: training with Mamba-2 blocks under {why} is not modelled by the analytic "
                               "engine; use --engine trace")


def sub_blocks_saved(lm: LayerMemory, setup: Setup, tokens: int) -> tuple[float, float]:
    """(attention, MLP): of a dense layer's saved bytes, each sub-block's without its norm (the MLP's: its inputs,
    activations and dropout, mlp_share; the attention's: the rest but the two norms)."""
    la = lm.activations
    div = term_divisors(la, setup)
    mlp = sum(v / div[k] for k, v in la.mlp_share.items() if k in div and k != "norms") * tokens
    norms = la.terms.get("norms", 0.0) / div.get("norms", 1) * tokens
    return lm.saved - norms - mlp, mlp


def norm_saved(spec: ModelSpec, st: StateBytes, tokens: int) -> float:
    """What any block's norm saves (mamba2.block_norm_train), with the block's input where the norm keeps it (fp32:
    `.to(torch.float32)` returns the input, which pow saves, :65, 71); 16-bit, its fp32 copy instead."""
    return mamba2.block_norm_train(spec, st, tokens) + (0 if mamba2.upcasts(st) else st.residual * spec.hidden * tokens)


def mamba_kind(spec: ModelSpec, setup: Setup, st: StateBytes, tokens: int, held: float, grads: float,
               gb: float) -> LayerKind:
    """A Mamba-2 block. `held`: what the block keeps until its backward under full recomputation (recompute.py:
    the checkpointed input, the CPU RNG state). Its forward high point: the block's input (the residual, live
    through the block: the residual add), its norm's saved tensors, the mixer at its scan's end. Saved for the
    backward: the norm's (norm_saved), the mixer's but the scan's transients, the gated norm's and out_proj's
    input.
    Its backward high point beside the saved tensors (no recomputation): scan_backward_moment."""
    r, h = st.residual, spec.hidden
    live, transient = scan_train(spec, setup, st)
    norm = mamba2.block_norm_train(spec, st, tokens)
    block_input = r * h * tokens
    incoming = r * h * tokens
    if setup.recompute == "full":
        # the re-run forward (with a fresh copy of the CPU RNG state) up to its scan's end, the checkpointed input
        # being the held one. The first forward saves nothing (checkpoint's hooks drop what autograd would save):
        # its high point is the scan's as in a prefill (mamba2.mixer_prefill), beside the block's input and the
        # norm's output
        rerun = norm + live + (CPU_RNG_STATE if setup.device == "cpu" else 0)
        first = block_input + st.act * h * tokens + max(mamba2.mixer_prefill(
            spec, st, setup.batch, setup.seq, setup.device, mamba2.scan_bmm_scratch(spec, setup, st)))
        return LayerKind(held, rerun + incoming, 0.0, 0.0, gradients=grads, forward=first)
    saved = (norm_saved(spec, st, tokens) + live - transient + mamba2.gated_norm_train(spec, st, tokens)
             + out_proj_cast(spec, st))
    forward = block_input + norm + live
    # NB: under autocast the backward moment keeps its fp32 derivation (not read off an autocast trace tensor by
    # tensor; where it sets the step's peak, tiny-nemotron-h at 2 x 128 and 2 x 100, the analytic peak reads -0.2 %
    # to -0.3 % of the trace)
    extra, freed = scan_backward_moment(spec, setup, st, tokens)
    return LayerKind(saved, incoming + extra, freed, mamba2.out_proj_params(spec) * gb, gradients=grads,
                     forward=forward)


def scan_train(spec: ModelSpec, setup: Setup, st: StateBytes) -> tuple[float, float]:
    """(live, transient): the mixer at its forward high point in a grad-mode forward, and of that what is freed when
    it returns. Under autocast the higher of the moment inside the last einsum's bmm and the scan's end
    (mamba2.scan_autocast_train), beside in_proj's 16-bit weight, which autocast caches for the forward and the
    linear saves (aten/src/ATen/autocast_mode.cpp cached_cast: an fp32 leaf that requires grad)."""
    if not st.autocast:
        return mamba2.scan_end_train(spec, st, setup.batch, setup.seq)
    inside, end, transient = mamba2.scan_autocast_train(spec, st, setup.batch, setup.seq, setup.device,
                                                        mamba2.scan_bmm_scratch(spec, setup, st)[1])
    return max(inside, end) + st.act * spec.hidden * mamba2.scan_shape(spec, 1, 1).proj, transient + max(
        0.0, inside - end)


def out_proj_cast(spec: ModelSpec, st: StateBytes) -> float:
    """out_proj's 16-bit weight under autocast (cached, saved by the linear for its input gradient)."""
    return st.act * mamba2.out_proj_params(spec) if st.autocast else 0.0


def scan_backward_moment(spec: ModelSpec, setup: Setup, st: StateBytes, tokens: int) -> tuple[float, float]:
    """(made, freed): the mixer's backward high point, at the backward of the scan's last einsum (C_times_states,
    :359), beside the incoming gradient and out_proj's weight gradient. Made, fp32 (the norm computes in fp32 and the
    scan's tensors are fp32): the gradients of the gated norm's two inputs, the scan's output and the gate's
    fp32 silu (T, inner) each; of Y_off's product, (Tp, H, P); the einsum's bmm gradients for the chunk states
    (b, c, H, P, N) and for C (Tp, H, N); the norm's per-group gradient (T, groups). Freed by then: the gated norm's
    saved tensors (mamba2.gated_norm_train) and C_times_states (Tp, H, P), whose product's backward has run.
    Read off the traced backward (small-nemotron_h fp32: 44,186,112 B at this moment; the formula 44,179,368)."""
    x = mamba2.scan_shape(spec, setup.batch, setup.seq)
    m = spec.hybrid
    made = (2 * FP32 * tokens * m.ssm_inner + FP32 * x.padded * x.heads * x.head_dim
            + FP32 * setup.batch * x.chunks * x.heads * x.head_dim * x.state + FP32 * x.padded * x.heads * x.state
            + FP32 * tokens * m.n_groups)
    freed = mamba2.gated_norm_train(spec, st, tokens) + FP32 * x.padded * x.heads * x.head_dim
    return made, freed


def block_kinds(spec: ModelSpec, setup: Setup, st: StateBytes, pc: ParamCounts, tokens: int, lm: LayerMemory,
                dense: LayerKind, gb: float) -> tuple[dict, tuple]:
    """(kinds by block kind, the stage's pattern of kinds). The attention and MLP blocks take the dense layer's
    backward high point (NB: an attention block's includes the MLP's temporaries, an MLP block's the
    attention's: an over-count of the other sub-block's) and their share of its saved bytes: the MLP sub-block's
    (mlp_share) and the rest, each beside the block's own norm as a Mamba block's (mamba2.block_norm_train:
    NemotronHRMSNorm keeps two fp32 (T, h) tensors where the input is 16-bit; per block within 0.01 % of the traced
    Nemotron-Nano-9B-v2 at 1 x 4096 in bf16); whole under full recomputation, the checkpointed input."""
    m = spec.hybrid
    attn, mlp = sub_blocks_saved(lm, setup, tokens)
    # the norm's output is the sub-block's first linear input, which the dense terms count in linear_inputs
    norm = norm_saved(spec, st, tokens) - st.act * spec.hidden * tokens
    attn, mlp = attn + norm, mlp + norm

    def like_dense(saved: float, params: float) -> LayerKind:
        return LayerKind(saved if setup.recompute != "full" else lm.saved, dense.backward, dense.freed,
                         dense.grads_done, gradients=(params + pc.norms) * gb)

    kinds = {"mamba": mamba_kind(spec, setup, st, tokens, lm.saved, (pc.mamba + pc.norms) * gb, gb),
             "attention": like_dense(attn, pc.attention), "mlp": like_dense(mlp, pc.mlp)}
    return kinds, Pattern.of(m.pattern)
