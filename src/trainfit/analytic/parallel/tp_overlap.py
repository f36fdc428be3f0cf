"""--tp-comm-overlap: a sequence-parallel layer's all-gathers and reduce-scatters run chunk by chunk beside the GEMMs
that consume or produce them, instead of before or after them. Two implementations, the same schedule:
- Megatron's --tp-comm-overlap, Transformer Engine's userbuffers (Megatron-Bridge's TransformerLayerTPOverlapCfg,
  src/megatron/bridge/training/comm_overlap.py:81-121 at v0.4.2, one field per pairing): the forward's all-gather
  of linear_qkv's (linear_fc1's) input beside that GEMM and linear_proj's (linear_fc2's) reduce-scatter beside that
  GEMM; in the backward the all-gather of linear_proj's (linear_fc2's) output gradient beside its dgrad GEMM and the
  reduce-scatter of linear_qkv's (linear_fc1's) input gradient beside its wgrad GEMM (BulkOverlapCfg: the whole
  collective on a few SMs beside the whole GEMM). TE v2.10 comm_gemm_overlap.cpp:887-1050
  CommOverlapP2PBase::split_overlap_ag and :1118-1207 split_overlap_rs run the GEMM as tp chunks of tokens / tp rows
  with tp − 1 point-to-point sends of one chunk between them: each GEMM chunk waits for the chunk received before it
  (all-gather), or each send for the GEMM chunk it carries (reduce-scatter; its chunks then summed by one reduce
  kernel, :1193-1204).
- torchtitan's async TP (parallelism.enable_async_tensor_parallel: torch.compile's micro-pipeline pass, torch 2.13
  torch/_inductor/fx_passes/micro_pipeline_tp.py:782-800 fuse_all_gather_matmul, :1030 fuse_matmul_reduce_scatter):
  an all-gather into the aten.mm / _scaled_mm that consume it and a matmul into the reduce-scatter of its output
  (:725-742, :957-985: only those ops match), each run by torch/distributed/_symmetric_memory/__init__.py:296-323
  _pipelined_all_gather_and_consume / :325-380 _pipelined_produce_and_all2all: the same tp chunks, the local one
  first, copies between ranks beside the matmuls, and the reduce-scatter's chunks summed at the end. A collective
  whose matmul side has a cast between (torchao's rowwise recipes gather in bf16 and cast after) is not matched and
  stays exposed: the stack's [tp_comm_overlap] gathered_before_cast; so does a backward reduce-scatter of the summed
  input gradients of separate projections (torchtitan's wq/wk/wv, w1/w3: an add produces it, not a matmul).

Either way the pair takes g_c + (tp − 1)·max(g_c, c / (tp − 1)), g_c one chunk's GEMM and c the collective: what it
adds to the unchunked GEMM the compute term counts is tp·g_c − g + max(0, c − (tp − 1)·g_c). Which collectives are
hidden is the stack's fact ([tp_comm_overlap] hidden). A MoE model's MLP collectives are taken as a dense MLP's,
exposed as in tensor.py, on the layers that run them (parallel/expert.py dense_mlp_share: not Megatron's MoE layers,
whose dispatcher gathers over the expert-TP group, timed with the exchange).
NB: optimistic by the SMs TE's bulk and pipelined methods take from the GEMM beside them (num_sm 2-32 of 132-148)
and by the dense layers of a MoE model (their MLP taken as exposed: pessimistic); the collectives are timed as NCCL
runs them (collectives.Links), the point-to-point copies moving the same (tp − 1)/tp of the bytes."""
from __future__ import annotations

from ...hardware import GPU
from ...low_precision import RECIPES
from ...spec import ModelSpec
from .. import roofline
from ..memo import remember_held, table
from ..timing import compute_dtype
from .collectives import Links, ranks_per_node

COLLECTIVES = ("forward all-gather", "forward reduce-scatter", "backward all-gather", "backward reduce-scatter")


def hidden_collectives(setup) -> tuple[frozenset[str], frozenset[str]]:
    """(the collectives the stack's overlap hides under `setup`'s recipe, those of them it runs beside a whole GEMM
    rather than chunked): stacks/*.toml [tp_comm_overlap] hidden, gathered_before_cast, bulk."""
    facts = setup.stack_facts.facts.get("tp_comm_overlap", {})
    hidden = frozenset(facts.get("hidden", ()))
    if getattr(setup, "low_precision", "none") in facts.get("gathered_before_cast", ()):
        hidden -= {"forward all-gather", "backward all-gather"}
    return hidden, frozenset(facts.get("bulk", ()))


def _gemm_dtype(setup) -> str:
    """The dtype the layer's projections run at: the recipe's peak key, or the matmul dtype (ops/op.py gemm).
    NB: rowwise_with_gw_hp's bf16 weight-gradient GEMMs are timed at the fp8 rate here (the overlap's GEMM only)."""
    lp = getattr(setup, "low_precision", "none")
    return RECIPES[lp].peak if lp in RECIPES else compute_dtype(setup)


_EXPOSED = table()  # layer_seconds' memo (it reads the kernel data: forgotten by compute_time.clear_memos)


def layer_seconds(spec: ModelSpec, setup, gpu: GPU, links: Links, tokens: float, act_bytes: float,
                  gathers: tuple[float, float], rerun: float, mlp: float = 1.0) -> float:
    """One layer's exposed tensor-parallel time under --tp-comm-overlap on one rank of `tokens` (the sequence-parallel
    group's whole micro-batch); `gathers`: bytes per element of the forward's and the backward's all-gathers (a
    quantised gather moves fewer: tensor.py); `rerun`: the share of its forward run again in the backward; `mlp`:
    the share of layers whose MLP runs these collectives (expert.dense_mlp_share; a MoE layer's are its dispatcher's).
    Memoised on what it reads: of the setup its tp, the collectives its stack hides (hidden_collectives) and the
    GEMMs' dtype (_gemm_dtype), nothing else of it; the spec and the GPU by identity (the entry holds them: a GPU's
    equality leaves out its cluster, which the kernel data may read), the links, tokens, bytes and re-run share."""
    hidden, bulk = hidden_collectives(setup)
    dtype = _gemm_dtype(setup)
    key = (id(spec), id(gpu), links, tokens, act_bytes, gathers, rerun, setup.tp, hidden, bulk, dtype, mlp)
    return remember_held(_EXPOSED, key, (spec, gpu), lambda: _layer_seconds(
        spec, setup.tp, gpu, links, tokens, act_bytes, gathers, rerun, hidden, bulk, dtype, mlp))


def _layer_seconds(spec: ModelSpec, t: int, gpu: GPU, links: Links, tokens: float, act_bytes: float,
                   gathers: tuple[float, float], rerun: float, hidden: frozenset[str], bulk: frozenset[str],
                   dtype: str, mlp: float) -> float:
    """layer_seconds, computed from what it reads."""
    h = spec.hidden
    x = tokens * h * act_bytes  # one b·s·h activation, gathered
    node = ranks_per_node(1, t, links.gpus_per_node)  # (a group wider than a node spans nodes)
    ag_fwd, ag_bwd = (links.all_gather(t, node, tokens * h * g) for g in gathers)
    rs = links.reduce_scatter(t, node, x)
    # the sum of a pipelined reduce-scatter's tp chunks: x read, x / tp written (comm_gemm_overlap.cpp:1193-1204)
    reduce = roofline.memory_seconds(gpu, x + x / t)

    def gemm(n: float, k: float, rows: float) -> float:
        return roofline.gemm_seconds(gpu, rows, n, k, dtype)

    def beside(which: str, c: float, n: float, k: float) -> float:
        """What the collective `which` of time c adds beside the GEMM (n, k) of the micro-batch's rows."""
        if which not in hidden:
            return c
        if which in bulk:  # the whole collective beside the whole GEMM
            return max(0.0, c - gemm(n, k, tokens))
        whole, chunk = gemm(n, k, tokens), gemm(n, k, tokens / t)
        extra = t * chunk - whole + max(0.0, c - (t - 1) * chunk)
        return extra + (reduce if which.endswith("reduce-scatter") else 0.0)

    def block(col: tuple[float, float], row: tuple[float, float]) -> float:
        """A column-parallel GEMM (n, k) fed by an all-gather, then a row-parallel one feeding a reduce-scatter."""
        forward = beside("forward all-gather", ag_fwd, *col) + beside("forward reduce-scatter", rs, *row)
        backward = beside("backward all-gather", ag_bwd, *row) + beside("backward reduce-scatter", rs, *col)
        return forward * (1 + rerun) + backward

    attention = block(((spec.q_dim + 2 * spec.kv_dim) / t, h), (h, spec.q_dim / t))
    if spec.moe is not None:  # a dense MLP's collectives, exposed, where they run (expert.dense_mlp_share)
        return attention + mlp * ((ag_fwd + rs) * (1 + rerun) + ag_bwd + rs)
    fc1 = (2 if spec.gated_mlp else 1) * spec.intermediate / t
    return attention + block((fc1, h), (h, spec.intermediate / t))
