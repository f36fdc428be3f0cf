"""Expert parallelism's communication: Megatron's alltoall token dispatcher (megatron/core/transformer/moe/
token_dispatcher.py). Which experts a rank holds: parallel/megatron.py rank_params.

Per MoE layer each rank sends its tokens × top_k × hidden × activation bytes to the experts and back (dispatch +
combine), in the forward and again in the backward: 4 all-to-alls, (ep−1)/ep of the volume leaving the rank, over
the expert_tp × ep ranks of the group. NB: on the critical path (not overlapped): pessimistic for
--overlap-moe-expert-parallel-comm.
"""
from __future__ import annotations

from ...setup import Setup
from ...spec import ModelSpec
from .collectives import Links


def ep_comm_seconds(spec: ModelSpec, setup: Setup, links: Links, tokens: float, act_bytes: float,
                    layers: int) -> float:
    """One micro-batch's all-to-alls on a stage of `layers` layers, `tokens` per rank (1/t of them each under
    sequence parallelism)."""
    e = setup.ep
    if e <= 1 or not spec.is_moe:
        return 0.0
    sent = (tokens / (setup.tp if setup.sequence_parallel else 1)) * spec.moe.top_k * spec.hidden * act_bytes
    return layers * 4 * (e - 1) / e * sent / links.over(setup.expert_tp * e)
