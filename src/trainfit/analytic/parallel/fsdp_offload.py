"""FSDP2's CPU offload (torch 2.13 torch/distributed/fsdp/_fully_shard; paths inside the torch package), as
--offload params on a stack that shards with fully_shard and turns it on: torchtitan's training.enable_cpu_offload
(torchtitan 0.2.2 config/job_config.py:270 -> models/llama3/infra/parallelize.py:315-317
`fsdp_config["offload_policy"] = CPUOffloadPolicy()`) and accelerate's fsdp_offload_params under fsdp_version 2
(accelerate 1.15.0 utils/dataclasses.py:2180-2189 -> CPUOffloadPolicy()).

CPUOffloadPolicy (_fsdp_api.py:180-199, pin_memory=True): "offloads parameters, gradients, and optimizer states to
CPU. Sharded parameters are copied host-to-device before all-gather ... Sharded gradients are copied device-to-host in
backward, and the optimizer step runs on CPU with CPU optimizer states."
  * host, per rank: the parameter shards in their own dtype, pinned (_fsdp_param.py:312-315), their gradient shards
    (pinned: the D2H copy's output, _fsdp_collectives.py:711-738) and the optimizer's states, made on the CPU beside
    the parameters they belong to: every state the rank's shards hold without offload;
  * device: no resident state; each all-gather first copies the group's shard to the device (_fsdp_param.py:897-899
    `.to(self.device, non_blocking=True)`), each reduce-scatter output shard is freed once its D2H copy is queued
    (_fsdp_collectives.py:733-738). NB: these per-group shards (1/dp of a group) are not counted;
  * time: the H2D shard copies of every all-gather (forward and backward under --zero 3), overlapped with the pass
    they prefetch for; the gradient shards' D2H copies on the post-reduce stream beside the backward; then the
    optimizer step on the host's CPU while the GPU waits.
FSDP1's CPUOffload(offload_params=True) (--fsdp-version 1, parallel/fsdp1.py) holds the same host bytes and moves
the same bytes over PCIe, but keeps the gradient shards on the device through the backward (fsdp1.keeps_gradient_
shards): analytic/memory.py keeps them there and drops them at the optimizer step.
"""
from __future__ import annotations

from ...setup import Setup
from .fsdp1 import offloads_params as fsdp1_offloads
from .fsdp2 import fsdp2_strategy, reshards_after_forward

FP32 = 4
# torch's AdamW over CPU tensors, fp32 accesses per element. fused (aten._fused_adamw_ has a CPU kernel:
# torch/utils/_foreach_utils.py:13-23 lists "cpu" among the fused devices): read parameter, gradient and both
# moments, write parameter and moments = 7. Otherwise the single-tensor path (foreach kernels are for cuda, xpu,
# mtia only: _foreach_utils.py:8-10, optim/optimizer.py:161-185 _default_to_fused_or_foreach), one pass per op
# (optim/adam.py): param.mul_ (:419, r1 w1), exp_avg.lerp_ (:456, r2 w1), exp_avg_sq.mul_().addcmul_ (:475, r1 w1 +
# r2 w1), exp_avg_sq.sqrt() / c .add_(eps) (:544, 3 × r1 w1), param.addcdiv_ (:546, r3 w1) = 20
CPU_ADAMW_ACCESSES = {"fused": 7, "other": 20}


def runs(setup: Setup) -> bool:
    """--offload params on a stack whose FSDP wrapping offers CPU offload ([cpu_offload] fact): FSDP2's
    CPUOffloadPolicy, or FSDP1's CPUOffload under --fsdp-version 1."""
    return (setup.offload_state == "params" and setup.mode == "train" and fsdp2_strategy(setup)
            and setup.stack_facts.facts.get("cpu_offload") is not None)


def cpu_step_seconds(setup: Setup, shard: float, host_bandwidth: float) -> float:
    """torch's AdamW over the rank's `shard` fp32 parameters on the host (CPU_ADAMW_ACCESSES), at the host's memory
    line rate. NB optimistic: every core streaming; the single-tensor path runs its ops one tensor at a time."""
    accesses = CPU_ADAMW_ACCESSES["fused" if setup.optimizer_kernel == "fused" else "other"]
    return shard * accesses * FP32 / host_bandwidth


def offload_seconds(setup: Setup, shard: float, weight: float, grad: float, m: int, link: float,
                    host_bandwidth: float, forward: float, backward: float) -> float:
    """Seconds per step the GPU waits on FSDP2's CPU offload: per micro-batch the shards' H2D copies beyond the
    pass each all-gather serves (forward only when it reshards after forward) and the gradient shards' D2H beyond
    the backward (the two directions in parallel: full duplex), then the CPU step. shard: the rank's parameters
    (elements); weight, grad: their shard dtypes' bytes. NB optimistic: PCIe at its line rate."""
    if not runs(setup):
        return 0.0
    h2d = shard * weight / link
    fwd = max(0.0, h2d - forward) if reshards_after_forward(setup) else 0.0
    bwd = max(0.0, max(h2d, shard * grad / link) - backward)
    return m * (fwd + bwd) + cpu_step_seconds(setup, shard, host_bandwidth)


NOTE = ("--offload params: FSDP2's CPUOffloadPolicy (parameter and gradient shards pinned in host memory, the "
        "optimizer's states on the host, the optimizer step on the CPU); step term 'host copies': the shards' "
        "PCIe copies beyond the passes they overlap and torch's CPU AdamW at the host's memory line rate: NB "
        "optimistic")
NOTE_FSDP1 = ("--offload params: FSDP1's CPUOffload(offload_params=True) (parameter and gradient shards pinned in "
              "host memory, the optimizer's states on the host, the optimizer step on the CPU; each unit's fp32 "
              "gradient shard also kept on the device until the backward's end); step term 'host copies': the "
              "shards' PCIe copies beyond the passes they overlap and torch's CPU AdamW at the host's memory line "
              "rate: NB optimistic")


def note(setup: Setup) -> str:
    """The estimate's note on the offload `setup` runs."""
    return NOTE_FSDP1 if fsdp1_offloads(setup) else NOTE
