"""The time ZeRO-Offload and ZeRO-Infinity add to a DeepSpeed step (deepspeed 0.19.8; paths inside the package):
the gradient and parameter copies over the GPU's host link (PCIe, kernels.toml host_link, one direction) and the
optimizer step DeepSpeedCPUAdam runs on the host. Per rank, `part` = its parameters / dp, `w` the model dtype's bytes,
`m` micro-batches per step:

  * gradients to the host. ZeRO-3 (stage3.py:2022-2036 partition_grads): every micro-batch copies each reduced
    partition into the host grad_partitions_flat_buffer and back to the device (`.to(device)`, the first micro-batch
    to reuse it, the others to accumulate), part·w each way; at the boundary the fp32 cast goes to the host fp32
    gradient (:1456-1457), part·4. ZeRO-1/2 (stage_1_and_2.py:2142-2167 copy_grads_in_partition): accumulating
    micro-batches copy the partition's gradients to pinned host buffers (:1846) and back before adding (:1833);
    the boundary copies their fp32 cast to the host fp32 gradient (:1893), part·4.
  * these copies run on the reduction stream beside the backward when overlap_comm is on (ZeRO-3's default:
    stacks/deepspeed.toml [overlap_comm]), on the backward's own stream otherwise.
  * the step: DeepSpeedCPUAdam's Step_1 (ops/csrc/adam/cpu_adam_impl.cpp:36) reads the fp32 parameter, gradient and
    both moments and writes the parameter and the moments, 7 × 4 bytes per element, on the host while the GPU waits.
  * the updated parameters back: ZeRO-3 copies the fp32 partition into its 16-bit partition (stage3.py:2854-2858)
    over the link, part·w, unless offload_param keeps that partition on the host (a host copy, 4 + w bytes read
    and written); ZeRO-1/2 through a pinned 16-bit host copy (stage_1_and_2.py:563-571), the cast on the host and
    part·w over the link.
  * offload_param (ZeRO-Infinity): each forward and backward fetches every layer's 16-bit partition from the host
    (partitioned_param_coordinator.py fetch_sub_module, prefetched ahead), part·w per pass, beside the pass.
"""
from __future__ import annotations

from ...setup import Setup
from .deepspeed import FP32, deepspeed_engine, overlap_comm

ADAM_BYTES = 7 * FP32  # DeepSpeedCPUAdam Step_1: 4 fp32 reads and 3 fp32 writes per element


def runs(setup: Setup) -> bool:
    """ZeRO-Offload: the ZeRO engine with --offload optimizer or params (ZeRO 1-3)."""
    return deepspeed_engine(setup) and setup.zero >= 1 and setup.offload_state in ("optimizer", "params")


def link_bytes(setup: Setup, part: float, w: float, m: int) -> tuple[float, float]:
    """Bytes over the host link per step for the gradients, (device-to-host, host-to-device)."""
    if setup.zero == 3:
        return m * part * w + part * FP32, m * part * w
    if m == 1:  # the one micro-batch's fp32 cast straight to the host fp32 gradient
        return part * FP32, 0.0
    return m * part * w + part * FP32, (m - 1) * part * w


def offload_seconds(setup: Setup, part: float, w: float, m: int, link: float, host_bandwidth: float,
                    forward: float, backward: float) -> float:
    """Seconds per step the GPU waits on ZeRO-Offload: the gradients' copies beyond the backward they overlap (or
    all of them without overlap_comm), the CPU Adam step, the parameters' return, and under offload_param each
    pass's parameter fetches beyond the pass. forward/backward: one micro-batch's compute seconds (backward with
    any recompute). NB optimistic: copies at the PCIe line rate, the two directions in parallel (full duplex), the
    CPU step at the host's memory line rate (kernels.toml [host] memory_bandwidth, every core streaming)."""
    if not runs(setup):
        return 0.0
    d2h, h2d = link_bytes(setup, part, w, m)
    copies = max(d2h, h2d) / link
    hidden = m * backward if overlap_comm(setup) else 0.0
    exposed = max(0.0, copies - hidden)
    cpu = part * ADAM_BYTES / host_bandwidth
    if setup.offload_state == "params":
        cpu += part * (FP32 + w) / host_bandwidth  # fp32 -> 16-bit partition, both on the host
        back = 0.0
        fetch = part * w / link  # each pass fetches every layer's partition
        exposed += m * (max(0.0, fetch - forward) + max(0.0, fetch - backward))
    else:
        back = part * w / link
        if setup.zero < 3:
            cpu += part * (FP32 + w) / host_bandwidth  # the cast into the pinned 16-bit copy
    return exposed + cpu + back


NOTE = ("--offload on --stack deepspeed (ZeRO-Offload): gradients to the host and the updated 16-bit partition "
        "back over PCIe at its line rate (overlapped with the backward under overlap_comm), DeepSpeedCPUAdam at the "
        "host's memory line rate, ZeRO-Infinity's parameter fetches beside each pass: step term 'host copies'; "
        "NB optimistic")
