"""torchao's low-bit AdamW (--optimizer adamw-torchao-8bit | -4bit | -fp8) and its CPUOffloadOptimizer (--offload
optimizer on a stack whose [features] runs "cpu-offload-optimizer"), no torch.

Sources: torchao 0.18.0, torchao/optim/.
- States (adam.py:122-128): exp_avg (signed) and exp_avg_sq (unsigned), each made by _new_buffer (:71-99): a
  quantised subclass when the parameter has numel >= 4096 and numel % block_size == 0 (:75, "follow
  bitsandbytes"), else torch.zeros_like(p): the parameter's own dtype (the fp32 master's under bf16-master).
  * 8-bit (subclass_8bit.py:104-116): uint8 codes of the parameter's shape, one fp32 scale per block, and a 256-entry
    fp32 dynamic-tree qmap made for each state tensor (create_dynamic_map, quant_utils.py:13-61);
  * 4-bit (subclass_4bit.py:114-130): codes packed two per byte (numel / 2 uint8), one fp32 scale per block, and a
    16-entry fp32 qmap per state tensor (signed: create_dynamic_map(True, 3, 4), :35-36; unsigned: linspace(0, 1,
    17)[1:], :40-41, linear). Both moments are block-wise (no rank-1 factorisation of the second moment, unlike
    the 4-bit optimizers' paper, arXiv 2309.01507);
  * FP8 (subclass_fp8.py:85-95): float8_e4m3fn codes of the parameter's shape and one fp32 scale per block; no qmap.
  Block sizes (adam.py AdamW8bit :318, AdamW4bit :352, AdamWFp8 :384): 256, 128, 256; the HF Trainer passes
  block_size=256 to both AdamW4bit and AdamW8bit (transformers 5.24 trainer_optimizer.py:468-472, optim_args
  default), so a stack may set its own (stacks/*.toml [optimizers] torchao_block_size).
- Step (adam.py:101-158): per parameter, torch.compile(single_param_adam, fullgraph=True) (:142): dequantise both
  states to fp32, lerp, requantise (copy_ into the subclass), update the parameter in fp32 and copy it back
  (:163-209). Inductor fuses it into one kernel per parameter on a CPU (8-bit, fp8; inductor's CPU output code,
  torch 2.13) with two new fp32 block-scale buffers; 8-bit and 4-bit also materialise the two updated fp32 moments
  (read by the block amax, the qmap's binary search and the parameter update), fp8 recomputes them in the kernel;
  4-bit adds the unpacked codes of both states (a uint8 per element each: the stack of codes >> 4 and codes & 15,
  subclass_4bit.py:108) and both states' new codes as int64, one per element, before they are packed two to a byte.
  One parameter at a time: the largest sets the peak (a real compiled CPU step of one 512 x 1024 parameter: its
  peak above the step's start equals step_temporaries for all three formats, fp32 and bf16 parameters).
- CPUOffloadOptimizer (cpu_offload.py:18-180): every trainable parameter of minimal_size = 4096 elements or more
  (:94) gets a pinned host copy of its own dtype (:99) and a pinned host gradient (:100), and its own torch.optim
  AdamW over the host copy (:106-108; fused=True by default, :39-40: torch's CPU _fused_adamw, states of the host
  copy's dtype); smaller parameters keep an on-device AdamW (:110-114). The post-accumulate-grad hook copies each
  gradient to the host on a side stream (:65-84) during the backward; with offload_gradients=False (the default,
  :24) the device gradient stays until zero_grad. step() (:116-140) runs the on-device optimizer, then for each
  parameter waits for its gradient, runs its CPU AdamW and queues the parameter's H2D copy on the side stream, and
  synchronises at the end. It asserts a CUDA or XPU device (:55-59): no CPU run of it exists.
  offload_gradients=True (torchtune's docs' example) is not modelled: each device gradient is then freed once its
  copy is done (record_stream), so the gradients on the device are the copies' backlog, which depends on PCIe
  against the backward's pace (llama-3.1-8b on an H100: 32 GB made in ~0.17 s, 0.5 s to copy), not a fixed count.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..precision import DTYPE_BYTES, PRECISIONS
from ..setup import TORCHAO_OPTIMIZERS, Setup
from ..spec import ModelSpec
from .params import ParamCounts

FP32 = 4
MIN_QUANT = 4096  # adam.py:75: smaller tensors (or ones not a multiple of the block) keep plain states
OFFLOAD_MIN = 4096  # cpu_offload.py:25 minimal_size: smaller parameters stay with an on-device optimizer


@dataclass(frozen=True)
class Format:
    code_bits: int  # bits per element of a state's codes
    block: int  # the optimizer class's default block_size (elements per fp32 scale)
    qmap: int  # fp32 entries of the lookup table each state tensor carries (0: none)
    moments: int  # fp32 moments of the parameter's size the compiled step materialises
    unpacked: int  # bytes per element of the step's unpacked codes (4-bit: one uint8 per code), per state
    packing: int  # bytes per element of the step's buffers before packing (4-bit: both states' codes as int64)


FORMATS = {
    "adamw-torchao-8bit": Format(8, 256, 256, 2, 0, 0),  # subclass_8bit.py:112-116; adam.py:318
    "adamw-torchao-4bit": Format(4, 128, 16, 2, 1, 16),  # subclass_4bit.py:126-130; adam.py:352
    "adamw-torchao-fp8": Format(8, 256, 0, 0, 0, 0),  # subclass_fp8.py:93-95; adam.py:384
}


def torchao_optimizer(setup: Setup) -> bool:
    return setup.optimizer in TORCHAO_OPTIMIZERS


def block_size(setup: Setup) -> int:
    """The block the stack's optimizer is built with: its [optimizers] torchao_block_size, else the class default."""
    return int(setup.stack_facts.facts.get("optimizers", {}).get("torchao_block_size", FORMATS[setup.optimizer].block))


def per_element(setup: Setup) -> float:
    """Bytes per element of both states of a quantised tensor (codes and block scales; the qmaps are per tensor)."""
    f = FORMATS[setup.optimizer]
    return 2 * (f.code_bits / 8 + FP32 / block_size(setup))


def plain_bytes(setup: Setup) -> float:
    """Bytes per element of one state of a tensor torchao does not quantise: zeros_like(p), the dtype of the
    tensor the optimizer updates (the policy's state dtype)."""
    return DTYPE_BYTES[PRECISIONS[setup.precision].state]


def tensor_state(setup: Setup, numel: int) -> float:
    """Both states' bytes of one parameter tensor of `numel` elements (adam.py:75, subclass_*bit.py zeros)."""
    f, blk = FORMATS[setup.optimizer], block_size(setup)
    if numel >= MIN_QUANT and numel % blk == 0:
        return 2 * (numel * f.code_bits // 8 + FP32 * (numel // blk) + FP32 * f.qmap)
    return 2 * numel * plain_bytes(setup)


def model_tensors(spec: ModelSpec, pc: ParamCounts) -> tuple[list[int], int]:
    """The sizes of a dense decoder's parameter tensors: each layer's projections, biases and hidden-sized norm
    vectors, the embedding, the final norm and an untied head; and the parameters the enumeration leaves out of
    pc.total (MoE experts, q/k norms, position tables), taken as large tensors by the callers."""
    h, i = spec.hidden, spec.intermediate
    q, kv = spec.q_dim, spec.kv_dim
    layer = [q * h, kv * h, kv * h, h * q, i * h, h * i] + ([i * h] if spec.gated_mlp else [])
    layer += ([q, kv, kv] if spec.qkv_bias else []) + ([h] if spec.out_bias else [])
    layer += ([i, h] + ([i] if spec.gated_mlp else []) if spec.mlp_bias else [])
    layer += [h] * (pc.norms // h)
    sizes = spec.layers * layer + [spec.vocab * h] + [h] * (pc.final // h) + ([pc.lm_head] if pc.lm_head else [])
    return sizes, max(0, pc.total - sum(sizes))


def state_bytes(spec: ModelSpec, pc: ParamCounts, setup: Setup, n: float) -> float:
    """The two states of this rank's `n` parameters: the model's tensors each as tensor_state prices it, scaled to
    the rank's share. NB: the share is the model's (exact without tensor or pipeline parallelism); the tensors the
    enumeration leaves out are taken as quantised without their qmaps (under-counts a small one's plain states);
    a fused qkv (GPT-2's c_attn) is taken as three tensors (8-bit: +4 KiB of qmaps a layer)."""
    sizes, rest = model_tensors(spec, pc)
    return (sum(tensor_state(setup, k) for k in sizes) + rest * per_element(setup)) * n / pc.total


def step_temporaries(setup: Setup, largest: int) -> float:
    """The compiled single-parameter step's buffers for the largest parameter (module docstring): the new block
    scales, the updated fp32 moments (8-bit, 4-bit), and for 4-bit the unpacked codes of both states and the packing
    buffers. NB: read from inductor's CPU code; Triton's fusion on CUDA is taken to materialise the same buffers (not
    checked on a GPU). torchao's published Llama2-7B full-bf16 runs on an A100 (torchao/optim/README.md, validation
    only) drop 5.9 GB of peak from 8-bit to 4-bit where this gives 4.4 GB with the peak at the step: 4-bit's int64
    codes (16 B per element of the largest parameter) may not be materialised by Triton (over-counts by up to 2.1 GB
    there)."""
    f = FORMATS[setup.optimizer]
    return largest * (f.moments * FP32 + 2 * f.unpacked + f.packing) + 2 * FP32 * (largest // block_size(setup))


def step_bytes(setup: Setup, param: float, grad: float) -> float:
    """Bytes per element one compiled step moves: read the parameter, its gradient and both states (codes and
    scales), write the parameter and both states (adam.py:163-209, fused by inductor into one pass). NB: the fp32
    moments the kernel also writes and the 4-bit packing buffers are not counted (under-reads)."""
    return 2 * param + grad + 2 * per_element(setup)


# inductor's kernels per parameter: one fused kernel on a CPU (its output code; NB taken as one on CUDA), timed as a
# kernel launch. NB optimistic: the Python work around each compiled call (dynamo's guards over the subclasses'
# flattened inputs) is not measured; torchao's published Llama2-7B A100 runs (README, validation only) lose 9 % of
# fused AdamW's tokens/s with 8-bit or 4-bit states, where this model shows none
KERNELS_PER_PARAM = 1


# --- CPUOffloadOptimizer ----------------------------------------------------------------------------------------

OFFLOAD_NOTE = ("--offload optimizer: torchao's CPUOffloadOptimizer (parameters of 4,096 elements or more: a pinned host "
                "copy, a pinned host gradient and torch's fused CPU AdamW states in host memory, the gradients kept on "
                "the GPU as offload_gradients=False leaves them); step term 'host copies': gradients to the host beyond "
                "the backward, then the longer of the CPU AdamW (the host's memory bandwidth) and the parameters' "
                "copies back (PCIe line rate): NB optimistic")


def offload_runs(setup: Setup) -> bool:
    """torchao's CPUOffloadOptimizer: --offload optimizer on a stack that runs it (single GPU, no ZeRO)."""
    return (setup.offload_state == "optimizer" and setup.mode == "train"
            and "cpu-offload-optimizer" in setup.stack_facts.facts.get("features", {}).get("runs", ()))


@dataclass(frozen=True)
class Offloaded:
    device_states: float  # the on-device AdamW's states of the small parameters
    host: float  # pinned host parameter and gradient copies, and the CPU optimizer's states
    moved: float  # parameters stepped on the host (elements): their gradients go D2H, themselves H2D
    moved_bytes: float  # bytes per element of those copies (the parameter's dtype)


def offloaded(spec: ModelSpec, pc: ParamCounts, setup: Setup, n: float, state_per_element: float) -> Offloaded:
    """Where CPUOffloadOptimizer puts the states of `n` trainable parameters (cpu_offload.py:90-114): the tensors
    of OFFLOAD_MIN elements or more on the host (their copy, their gradient, their AdamW states, all in the
    parameter's dtype), the others on the device. NB: the small tensors' share of `n` is the model's."""
    small = device_params(spec, n)
    w = DTYPE_BYTES[PRECISIONS[setup.precision].weight]
    moved = n - small
    return Offloaded(small * state_per_element, moved * (2 * w + state_per_element), moved, w)


def device_params(spec: ModelSpec, n: float) -> float:
    """Of `n` trainable parameters, those CPUOffloadOptimizer keeps on the device (under OFFLOAD_MIN elements)."""
    from .params import count_params

    pc = count_params(spec)
    return sum(k for k in model_tensors(spec, pc)[0] if k < OFFLOAD_MIN) / pc.total * n


def cpu_step_seconds(setup: Setup, moved: float, host_bandwidth: float) -> float:
    """torch's fused CPU AdamW over the host copies (torch/optim/adam.py _fused_adam -> aten._fused_adamw_ on CPU,
    aten/src/ATen/native/FusedAdam.cpp): per element read the parameter, the gradient and both states, write the
    parameter and both states, 7 tensors of the parameter's dtype. NB optimistic: at the host's memory bandwidth
    (its line rate), every core streaming."""
    w = DTYPE_BYTES[PRECISIONS[setup.precision].weight]
    return moved * 7 * w / host_bandwidth


def offload_exposed(setup: Setup, off: Offloaded, link: float, host_bandwidth: float, backward: float) -> float:
    """Seconds the GPU waits on the offloaded step: the gradients' D2H copies run on a side stream during the
    backward (exposed beyond it), then step() alternates each parameter's CPU AdamW with its H2D copy on the
    side stream, so the longer of the two streams, plus the last parameter's copy (NB: not counted), is exposed
    (cpu_offload.py:65-84, :116-140)."""
    copy = off.moved * off.moved_bytes / link
    return max(0.0, copy - backward) + max(copy, cpu_step_seconds(setup, off.moved, host_bandwidth))


def offload_seconds(spec: ModelSpec, setup: Setup, link: float, backward: float, micro_batches: int) -> float:
    """The step's exposed offload time (offload_exposed) on one GPU: the gradients go to the host after each
    micro-batch's backward (the post-accumulate-grad hook fires every time, cpu_offload.py:77-79), the CPU step and
    the parameters' return once per step. 0 unless CPUOffloadOptimizer runs."""
    if not offload_runs(setup):
        return 0.0
    from ..errors import SetupError
    from .params import count_params
    from .precision import state_bytes as policy_bytes
    from .roofline import host_memory_bandwidth

    if not link:
        raise SetupError("--offload optimizer: no host link bandwidth is known for this GPU (kernels.toml host_link); "
                         "use a catalog GPU")
    pc = count_params(spec)
    off = offloaded(spec, pc, setup, pc.total, policy_bytes(setup).optimizer)
    copy = off.moved * off.moved_bytes / link
    return (micro_batches - 1) * max(0.0, copy - backward) + offload_exposed(setup, off, link, host_memory_bandwidth(),
                                                                             backward)
