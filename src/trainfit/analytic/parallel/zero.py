"""Data parallelism with ZeRO: which model states one rank keeps, and the buffers sharding adds.

Stages per Rajbhandari et al. 2020 ("ZeRO: Memory Optimizations Toward Training Trillion Parameter Models",
§5.1, Fig. 1): stage 1 (P_os) shards the optimizer states (and fp32 masters), stage 2 (P_os+g) also the
gradients, stage 3 (P_os+g+p) also the parameters — each over the `dp` ranks. What torch actually runs adds
buffers the paper leaves out; each is a term below.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...setup import Setup
from ..params import ParamCounts
from ..precision import StateBytes
from .pipeline import Stage


@dataclass(frozen=True)
class ModelStates:
    """Bytes of one rank's model states (resident through the step) and its data-parallel buffers."""

    weights: float
    gradients: float
    master: float
    optimizer: float
    comm: float  # DDP's gradient buckets / FSDP2's parameter shards beside the gathered ones

    @property
    def resident(self) -> float:
        return self.weights + self.master + self.optimizer + self.comm


def shard(setup: Setup, from_stage: int) -> int:
    """The divisor of a state that ZeRO shards from stage `from_stage` on (Rajbhandari §5.1)."""
    return setup.dp if setup.zero >= from_stage else 1


def model_states(n: float, optimizer_bytes: float, st: StateBytes, setup: Setup) -> ModelStates:
    """n: parameters on this rank before ZeRO; optimizer_bytes: their unsharded optimizer state."""
    dp, z = setup.dp, setup.zero
    weights = n * st.weight / shard(setup, 3)
    grads = n * st.grad / shard(setup, 2)
    master = n * st.master / shard(setup, 1)
    opt = optimizer_bytes / shard(setup, 1)
    # DDP copies gradients into its own bucket buffers (torch/nn/parallel/distributed.py, gradient_as_bucket_view=
    # False by default): a second gradient-sized allocation resident through the step. ZeRO-2/3 reduce-scatter in
    # small buckets. ZeRO-1 as torch runs it (DDP + ZeroRedundancyOptimizer) keeps those buckets too. ZeRO-2 as
    # FSDP2 runs it (fully_shard(reshard_after_forward=False)) keeps the sharded parameter storage it gathers from
    # beside the full parameters (Rajbhandari's P_os+g, as DeepSpeed runs it, has only the full ones: n/dp fewer).
    comm = n * st.grad if (dp > 1 and z <= 1) else (n * st.weight / dp if z == 2 else 0)
    return ModelStates(weights, grads, master, opt, comm)


def gathered_params(pc: ParamCounts, setup: Setup, st: StateBytes, stage: Stage) -> float:
    """ZeRO-3 / FSDP2: the current layer's and the prefetched next layer's full parameters are gathered
    (Rajbhandari §5.3: parameters are broadcast layer by layer), and the root module (embeddings, final norm,
    LM head) stays unsharded from its forward all-gather to its backward (FSDP2's root is not resharded)."""
    if setup.zero < 3:
        return 0
    t, dp = setup.tp, setup.dp
    root = (pc.embedding * stage.embedding + (pc.final + pc.lm_head) * stage.head) / t * st.weight * (1 - 1 / dp)
    return 2 * pc.per_layer_dense / t * st.weight + root


def reduce_scatter_transient(pc: ParamCounts, largest: int, st: StateBytes, setup: Setup) -> float:
    """ZeRO-2/3 in backward: a module's full gradient lives until its reduce-scatter — a whole layer's, or the
    LM head's/embedding's; gloo (the CPU backend) also clones the reduce-scatter input and, where backward
    re-gathers parameters (ZeRO-3), all-gathers into its own flat buffer; NCCL does neither
    (torch/csrc/distributed/c10d/ProcessGroupGloo.cpp, _reduce_scatter_base / _allgather_base)."""
    z, dp = setup.zero, setup.dp
    if z < 2:
        return 0
    layer = pc.per_layer_dense / setup.tp
    extra = max(largest, layer) * st.grad * (1 - 1 / dp)
    if setup.device == "cpu":
        extra += layer * (st.grad + (st.weight if z >= 3 else 0))
    return extra
