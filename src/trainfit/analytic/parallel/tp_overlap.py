"""Transformer Engine's userbuffers overlap (Megatron's --tp-comm-overlap): a sequence-parallel layer's all-gathers and
reduce-scatters run chunk by chunk beside the GEMMs that consume or produce them, instead of before or after them.

Which collective hides behind which GEMM (Megatron-Bridge's TransformerLayerTPOverlapCfg, src/megatron/bridge/
training/comm_overlap.py:81-121 at v0.4.2, one field per pairing; TE's LayerNormLinear / Linear wire them):
- forward: the all-gather of linear_qkv's (linear_fc1's) input beside that GEMM, a ring exchange (qkv_fprop,
  fc1_fprop: RingExchangeOverlapCfg); linear_proj's (linear_fc2's) reduce-scatter beside that GEMM (proj_fprop,
  fc2_fprop: ring exchange or a pipelined split);
- backward: the all-gather of linear_proj's (linear_fc2's) output gradient beside its dgrad GEMM (proj_dgrad,
  fc2_dgrad: ring exchange); the reduce-scatter of linear_qkv's (linear_fc1's) input gradient beside its wgrad GEMM
  (qkv_wgrad, fc1_wgrad: BulkOverlapCfg, the whole collective on a few SMs beside the whole GEMM).
A ring exchange (TE v2.10 comm_gemm_overlap.cpp:887-1050 CommOverlapP2PBase::split_overlap_ag, :1118-1207
split_overlap_rs) runs the GEMM as tp chunks of tokens / tp rows, and tp − 1 point-to-point sends of one chunk each
between them: each GEMM chunk waits for the chunk received before it (the all-gather), or each send for the GEMM chunk
it carries (the reduce-scatter, whose chunks are then summed by one reduce kernel, :1193-1204). So the pair takes
g_c + (tp − 1)·max(g_c, c / (tp − 1)), g_c one chunk's GEMM and c the collective: what it adds to the unchunked GEMM
the compute term counts is tp·g_c − g + max(0, c − (tp − 1)·g_c).

The MoE layers' MLP collectives are the token dispatcher's, not a TE linear's: they stay exposed as in tensor.py.
NB: optimistic by the SMs the bulk and pipelined methods take from the GEMM beside them (num_sm 2-32 of 132-148) and
by the dense layers of a MoE model (their MLP taken as exposed: pessimistic); the collectives are timed as NCCL runs
them (collectives.Links), the ring exchange's point-to-point copies moving the same (tp − 1)/tp of the bytes."""
from __future__ import annotations

from ...hardware import GPU
from ...low_precision import RECIPES, recipe
from ...spec import ModelSpec
from .. import roofline
from ..te_recipes import runs_te
from ..timing import compute_dtype
from .collectives import Links


def _gemm_dtype(setup) -> str:
    """The dtype the layer's TE GEMMs run at: the recipe's peak key, or the matmul dtype (ops/op.py gemm)."""
    return RECIPES[setup.low_precision].peak if runs_te(setup) else compute_dtype(setup)


def layer_seconds(spec: ModelSpec, setup, gpu: GPU, links: Links, tokens: float, act_bytes: float,
                  rerun: float) -> float:
    """One layer's exposed tensor-parallel time under --tp-comm-overlap on one rank of `tokens` (the sequence-parallel
    group's whole micro-batch); `rerun`: the share of its forward run again in the backward (tensor.py)."""
    t, h = setup.tp, spec.hidden
    x = tokens * h * act_bytes  # one b·s·h activation, gathered
    r = recipe(setup) if runs_te(setup) else None
    # TE gathers linear_qkv's / linear_fc1's forward input quantised (te_recipes.te_gather_saving)
    ag_fwd = links.all_gather(t, t, x * (r.per_element / act_bytes if r else 1.0))
    ag, rs = links.all_gather(t, t, x), links.reduce_scatter(t, t, x)
    dtype = _gemm_dtype(setup)
    # the chunks' sum of a ring reduce-scatter: tp chunks of x / tp read, one written (comm_gemm_overlap.cpp:1193-1204)
    reduce = roofline.memory_seconds(gpu, x + x / t)

    def gemm(n: float, k: float, rows: float) -> float:
        return roofline.gemm_seconds(gpu, rows, n, k, dtype)

    def ring(c: float, n: float, k: float) -> float:
        whole, chunk = gemm(n, k, tokens), gemm(n, k, tokens / t)
        return t * chunk - whole + max(0.0, c - (t - 1) * chunk)

    def bulk(c: float, n: float, k: float) -> float:
        return max(0.0, c - gemm(n, k, tokens))

    def block(col: tuple[float, float], row: tuple[float, float]) -> float:
        """A column-parallel GEMM (n, k) fed by an all-gather, then a row-parallel one feeding a reduce-scatter."""
        forward = ring(ag_fwd, *col) + ring(rs, *row) + reduce
        return forward * (1 + rerun) + ring(ag, *row) + bulk(rs, *col)

    attention = block(((spec.q_dim + 2 * spec.kv_dim) / t, h), (h, spec.q_dim / t))
    if spec.moe is not None:
        return attention + (ag_fwd + rs) * (1 + rerun) + ag + rs
    fc1 = (2 if spec.gated_mlp else 1) * spec.intermediate / t
    return attention + block((fc1, h), (h, spec.intermediate / t))
