"""Lists derived from a forward list: its backward, its compiled form, what recompute re-runs, and the backward-only
gradient sums."""
from __future__ import annotations

from ...setup import Setup
from ...spec import ModelSpec
from ..activations import FP32
from ..families import family_traits
from .attention import ATTENTION_BWD_KERNELS
from .op import SIZE, Op, Shape, column_sum_launches, memory, replaced

def backward(ops: list[Op]) -> list[Op]:
    """The backward kernels of a forward list, in reverse order: GEMM dgrad (m, k, n) and wgrad (k, n, m); attention's
    backward kernel; the elementwise rule of the module docstring."""
    out: list[Op] = []
    for op in reversed(ops):
        if op.kind == "gemm" and op.grad:  # (a GEMM run under no_grad has no backward: DoRA's weight norm)
            out.append(replaced(op, name=op.name + ".dgrad", m=op.m, n=op.k, k=op.n))
            if op.wgrad:
                out.append(replaced(op, name=op.name + ".wgrad", m=op.k, n=op.n, k=op.m, rows="mn"))
            if op.bias:  # db = Σ_tokens dY: one read of dY, a column sum (its semaphores' memset: column_sum_launches)
                dy = op.m * op.n * op.batch * SIZE.get(op.dtype, 2)
                out.append(memory(op.name + ".bias_grad", dy, op.n * FP32, "autograd bias gradient", saves=False,
                               kernels=column_sum_launches(op.m)))
        elif op.kind == "attention":
            k = op.bwd_kernels if op.bwd_kernels >= 0 else ATTENTION_BWD_KERNELS.get(op.kernel, 1)
            out.append(replaced(op, name=op.name + ".backward", backward=True, kernels=k))
        elif op.kind != "gemm" and op.grad:
            reads = op.writes + (op.reads if op.saves_input else 0.0)
            fr = op.fused_writes + (op.fused_reads if op.saves_input else 0.0)
            if op.bwd_ops:  # its kernels as spelled out; compiled, they fuse to the generic rule's HBM bytes
                out += [replaced(b, group=op.group, fused_reads=fr if j == 0 else 0.0,
                                   fused_writes=op.fused_reads if j == 0 else 0.0, source=op.source)
                        for j, b in enumerate(op.bwd_ops)]
                continue
            k = op.kernels if op.bwd_kernels < 0 else op.bwd_kernels
            out.append(replaced(op, name=op.name + ".backward", reads=reads, writes=op.reads, fused_reads=fr,
                                   fused_writes=op.fused_reads, kernels=k, access=op.bwd_access or op.access,
                                   bwd_access=""))
    return out

def grad_accumulations(spec: ModelSpec, sh: Shape, linear: bool = False, block: str = "") -> list[Op]:
    """Backward-only kernels of one layer: autograd sums the gradients of a tensor used k times with k - 1 adds
    (torch/csrc/autograd/input_buffer.cpp InputBuffer::add): the residual stream read by each norm and its residual
    add (2), the attention input read by q, k and v (2; 0 when fused; `linear`: a Gated DeltaNet layer's, read by
    in_proj_qkvz and in_proj_ba, 1), the MLP input read by gate and up (1). A hybrid stack's `block` (spec.hybrid):
    its one norm and residual add (1), and an attention block's q, k and v (2)."""
    traits = family_traits(spec)
    x = sh.norm_tokens * spec.hidden * sh.residual
    n = 2 + (1 if linear else 0 if traits["fused_qkv"] or spec.mla is not None else 2)
    n += 1 if spec.gated_mlp and not traits["fused_gate_up"] and spec.moe is None else 0
    if spec.hybrid is not None:
        n = 1 + (2 if block == "attention" else 0)
    if sh.compile:
        return []  # the compiled backward sums inside its fused kernels
    return [memory("grad_accumulate", 2 * x * n, x * n, "autograd InputBuffer::add", saves=False, kernels=n)]

def compiled(ops: list[Op]) -> list[Op]:
    """torch.compile's view of a list: each run of consecutive memory ops sharing a group becomes one kernel moving
    only the bytes that cross HBM (fused_reads + fused_writes); ungrouped memory ops keep their own bytes. A fused
    kernel is Inductor's generated Triton, with vector loads whatever the casts and broadcasts inside it (NB)."""
    out: list[Op] = []
    for op in ops:
        if op.kind != "memory":
            out.append(op)
            continue
        prev = out[-1] if out else None
        if op.group and prev is not None and prev.kind == "memory" and prev.group == op.group:
            out[-1] = prev._replace(reads=prev.reads + op.fused_reads, writes=prev.writes + op.fused_writes,
                                    kernels=1, access="vector")
        elif op.group:
            out.append(op._replace(name=op.group, reads=op.fused_reads, writes=op.fused_writes, kernels=1,
                                   access="vector"))
        else:
            out.append(op)
    return out

# The policies whose checkpointed layer re-runs its whole forward (recomputed)
WHOLE_LAYER = ("full", "layer", "uniform", "block")


def recomputed(spec: ModelSpec, setup: Setup, forward: list[Op]) -> list[Op]:
    """What ONE checkpointed layer re-runs in its backward under the setup's per-layer policy (flops.py
    recompute_per_token, op by op): full / layer:N / uniform / block — the whole forward; selective — the attention
    core (Korthikanti et al. 2022 §4.2); op — everything but the matmuls and SDPA whose outputs torchtitan's per-op
    SAC stores (recompute.op_sac_saved_matmuls, op_sac_stores_sdpa)."""
    from ..nvfp4 import sac_stores_gemm
    from ..recompute import op_sac_saved_matmuls, op_sac_stores_sdpa

    pol = setup.recompute.split(":", 1)[0]
    if pol == "selective":  # the attention core, or Megatron's --recompute-modules (megatron_recompute.py)
        from ..megatron_recompute import rerun_ops
        return rerun_ops(spec, setup, forward)
    if pol == "op":
        saved = {name for name, *_ in op_sac_saved_matmuls(spec, setup)}
        # (an NVFP4 GEMM is not on the save list whatever its place: analytic/nvfp4.py)
        saved = {o.name for o in forward if o.kind == "gemm" and o.name in saved and sac_stores_gemm(setup, o.dtype)}
        sdpa = op_sac_stores_sdpa(spec, setup)
        keep = []
        for o in forward:
            base = o.name.split(".", 1)[0]
            if o.kind == "gemm" and o.name in saved:
                continue
            if o.kind == "memory" and base in saved and o.name.endswith((".amax_x", ".cast_x")):
                continue  # the saved matmul's own fp8 input casts are not re-run either (NB: the weight's are)
            if o.kind == "attention" and sdpa:
                continue
            keep.append(o)
        return keep
    if pol in WHOLE_LAYER:
        return list(forward)
    return []


def checkpointed_layers(setup: Setup, layers: int) -> int:
    """Of a stage's `layers`, how many re-run (part of) their forward (flops.recompute_per_token's counts)."""
    r = setup.recompute
    if r in ("full", "selective", "op") or r.startswith("uniform:"):
        return layers
    if r.startswith("layer:"):
        return layers // setup.layers_every
    if r.startswith("block:"):
        return min(setup.recompute_layers, layers // setup.vpp) * setup.vpp
    return 0
