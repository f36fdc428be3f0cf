"""The memory-bound kernels torch's ring attention runs around its SDPA calls (stacks/torchtitan.toml
[context_parallel] merge = "fp32"; torch 2.13 distributed/tensor/experimental/_context_parallel/_attention.py,
convert_to_f32 on: parallel/torch_context.py). Per layer, with O the rank's output elements and K its K+V elements:
  forward (_SDPAMerger, :139-229): the first step's output cast to fp32 (step, :209-217), each of the cp − 1 later
    steps its output cast (read a·O, write 4O), out − block_out (8O, 4O), the sigmoid-weighted product (4O, 4O)
    and the update (8O, 4O) (:185-186; the log-sum-exp's ops are O/head_dim: not counted), the result cast back (:224);
  backward (_templated_ring_attention_backward, :488-656): fp32 zeros for dQ, dK, dV (:512-516), per step the dQ
    and dK/dV accumulations (read 4 + a per element of each, write 4) and the flat fp32 dK/dV copied for the next hop
    (torch.cat, :625), the results cast back (:645-646).
NB: _partial_update's torch.cat copies (:113-136, a step's chunk rebuilt) and the K/V torch.cat before each hop
(act bytes, the smaller tensor) are not counted (under)."""
from __future__ import annotations

from .op import Op, Shape, bwd_kernel, memory

FP32 = 4


def ring_merge_ops(sh: Shape, q: float, kv: float) -> list[Op]:
    """The merge kernels of one layer's ring attention on this rank (`q`, `kv`: its q and k/v features per token),
    none unless the stack's ring merges in fp32 under --cp (Shape.cp_merge)."""
    if not sh.cp_merge or sh.cp <= 1:
        return []
    cp, a = sh.cp, sh.act
    o, k = sh.tokens * q, sh.tokens * 2 * kv
    reads = (a + FP32) * o + (cp - 1) * (a + 20) * o
    writes = (FP32 + a) * o + (cp - 1) * 16 * o
    bwd_reads = cp * ((FP32 + a) * o + (2 * FP32 + a) * k) + FP32 * (o + k)
    bwd_writes = FP32 * (o + k) + cp * (FP32 * o + 2 * FP32 * k) + a * (o + k)
    back = bwd_kernel("ring_merge.backward", bwd_reads, bwd_writes, kernels=5 + 4 * cp)
    return [memory("ring_merge", reads, writes, "torch _attention.py _SDPAMerger (fp32 merge of the ring's steps)",
                   saves=False, kernels=2 + 4 * (cp - 1), bwd_ops=(back,))]
