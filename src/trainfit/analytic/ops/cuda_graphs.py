"""Transformer Engine CUDA graphs of parts of a Megatron layer (--cuda-graph-scope: Megatron's cuda_graph_impl
"transformer_engine" with cuda_graph_scope; megatron-core 0.16.1 transformer/transformer_layer.py:942-965
_get_submodules_under_cudagraphs, :967-1003 _te_cuda_graph_capture). The graphed parts of a layer are captured as one
callable (its attention, then its MLP part up to the router or the dispatcher's preprocess), whose forward and
backward TE's make_graphed_callables replays as one graph launch each: the host issues one launch where it issued
the parts' kernels, which still run and move their bytes.

The parts, as the op lists name them (megatron_moe.py, layer.py):
  attn            the layer's ops before its pre-MLP norm: the input norm, self-attention and its residual add
                  (transformer_layer.py:950-955 input_layernorm, self_attention; :975 _forward_attention);
  moe_router      the pre-MLP norm and the router (:961-962 pre_mlp_layernorm, mlp.router): mlp_norm, router*;
  moe_preprocess  the dispatcher's preprocess (moe/moe_layer.py:255-272 preprocess -> token_dispatcher.py:592-640
                  dispatch_preprocess: the metadata with its device-to-host copies, and permutation 1):
                  dispatch_metadata, permute.
A backward op belongs to its forward op's part (its name's prefix).
NB: kernels inside a graph still cost the GPU a short launch gap (not kept: optimistic by ~1 µs each); the graphs'
static input/output buffers are not counted in memory; a recomputed part's re-run keeps its own launches; Qwen3-Next's
shared experts, graphed with the router when not overlapped (:963-968), stay ungraphed.
"""
from __future__ import annotations

from .op import Op

ROUTER = ("mlp_norm", "router")  # the pre-MLP norm, the gating GEMM and the router's router_* kernels
PREPROCESS = ("dispatch_metadata", "permute")


def graphed_names(fwd: list[Op], scopes: tuple[str, ...], moe: bool) -> set[str]:
    """The forward op names inside the graphed parts of one layer (module doc); the moe_* scopes on MoE layers only
    (transformer_layer.py:961: is_moe_layer)."""
    names = [o.name for o in fwd]
    out: set[str] = set()
    if "attn" in scopes:
        end = names.index("mlp_norm") if "mlp_norm" in names else len(names)
        out.update(names[:end])
    if moe and "moe_router" in scopes:
        out.update(n for n in names if n == ROUTER[0] or n.startswith(ROUTER[1]))
    if moe and "moe_preprocess" in scopes:
        out.update(n for n in names if n in PREPROCESS)
    return out


def graph_launches(ops: list[Op], names: set[str]) -> list[Op]:
    """`ops` with the launches of those in `names` (by forward name: a backward op's prefix) replaced by one graph
    launch, carried by the first of them."""
    out, first = [], True
    for op in ops:
        if op.name.split(".")[0] in names and op.kernels:
            out.append(op._replace(kernels=1 if first else 0))
            first = False
        else:
            out.append(op)
    return out


def graphed_lists(fwd: list[Op], bwd: list[Op], scopes: tuple[str, ...], moe: bool) -> tuple[list[Op], list[Op]]:
    """A layer's forward and backward lists under the graphs of `scopes`: one launch each for the graphed parts."""
    names = graphed_names(fwd, scopes, moe)
    if not names:
        return fwd, bwd
    return graph_launches(fwd, names), graph_launches(bwd, names)
