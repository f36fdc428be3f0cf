"""The kernels a traced training step launches, as the analytic op list (analytic/ops/) describes them: each
GEMM's (m, n, k, batch), each attention kernel's (batch·heads, s_q, s_kv, head_dim), and each other kernel's bytes
read and written. What tests/analytic/test_ops_vs_trace.py sets beside the op list, family by family.

A TorchDispatchMode sees the aten ops below autograd, so a linear arrives as its mm/addmm, a backward as its dgrad
and wgrad mms, and a view (func.is_view: no kernel) can be told from a kernel. Bytes count the distinct elements an
operand holds: a broadcast (stride-0) dimension once, as the kernel reads it.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

aten = torch.ops.aten
# (m, n, k, batch) of C = A·B from the operands' shapes: mm/addmm's A [m, k], B [k, n]; bmm's [b, m, k], [b, k, n]
GEMMS = {aten.mm.default: (0, 1), aten.addmm.default: (1, 2), aten.bmm.default: (0, 1),
         aten.baddbmm.default: (1, 2), aten._scaled_mm.default: (0, 1)}
# grouped_mm (MoE experts): A [Σm, k] of all groups' rows and B [groups, k, n] (forward, dgrad), or A [m, Σk] and
# B [Σk, n] (wgrad, the groups along the contraction); `offs` ends each group
GROUPED = {aten._grouped_mm.default} if hasattr(aten, "_grouped_mm") else set()
ATTENTION = {getattr(aten, name).default for name in (
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_efficient_attention_backward", "_scaled_dot_product_cudnn_attention_backward",
    # the CPU's fused kernel (a --device cpu trace); under CUDA semantics a masked call takes the memory-efficient
    # kernel, or the math path's GEMMs where that kernel does not take it (cuda_masked_sdpa.py)
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward")
    if hasattr(aten, name)}
# ops that launch no kernel although they are not views: allocation without a fill, metadata
# (_unsafe_view: a view its schema does not mark as one)
NO_KERNEL = {aten.empty.memory_format, aten.empty_strided.default, aten.detach.default, aten.lift_fresh.default,
             aten._local_scalar_dense.default, aten._unsafe_view.default}


class Kernel(NamedTuple):
    phase: str  # the step's phase: forward (loss included), backward
    kind: str  # gemm, grouped_gemm, attention, memory
    op: str  # the aten op
    m: int = 0
    n: int = 0
    k: int = 0
    batch: int = 1
    nbytes: int = 0  # memory: bytes read + written
    v: int = 0  # attention: the value head width (MLA's is narrower than q's and k's, `k`)


def distinct_bytes(t: torch.Tensor) -> int:
    """The bytes of the elements `t` holds: its size over the dimensions it does not broadcast (stride 0)."""
    n = 1
    for size, stride in zip(t.shape, t.stride()):
        if stride != 0:
            n *= size
    return n * t.element_size()


def _tensors(tree) -> list[torch.Tensor]:
    return [x for x in tree_flatten(tree)[0] if isinstance(x, torch.Tensor)]


def kernel_of(func, args, kwargs, out, phase: str) -> Kernel | None:
    """The Kernel an aten op launches, or None for a view or an op that launches none."""
    name = func.overloadpacket.__name__
    if func in GEMMS:
        i, j = GEMMS[func]
        a, b = args[i], args[j]
        return Kernel(phase, "gemm", name, a.shape[-2], b.shape[-1], a.shape[-1], a.shape[0] if a.dim() == 3 else 1)
    if func in GROUPED:
        a, b = args[0], args[1]
        offs = kwargs.get("offs", args[2] if len(args) > 2 else None)
        return Kernel(phase, "grouped_gemm", name, a.shape[-2], b.shape[-1], a.shape[-1], offs.shape[0])
    if func in ATTENTION:
        q, k, v = args[1:4] if name.endswith("_backward") else args[:3]
        return Kernel(phase, "attention", name, q.shape[2], k.shape[2], q.shape[3], q.shape[0] * q.shape[1],
                      v=v.shape[3])
    outputs = _tensors(out)
    if func.is_view or func in NO_KERNEL or not outputs:  # (no tensor out: prim::device, sizes)
        return None
    moved = sum(distinct_bytes(t) for t in _tensors((args, kwargs)) + outputs)
    return Kernel(phase, "memory", name, nbytes=moved)


class KernelLog(TorchDispatchMode):
    """Records the Kernel of every op dispatched while active, in the phase `set_phase` last named. Enter it inside
    FakeTensorMode (it then sees the fake outputs)."""

    def __init__(self):
        super().__init__()
        self.phase = "setup"
        self.kernels: list[Kernel] = []

    def set_phase(self, name: str) -> None:
        self.phase = name

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        kernel = kernel_of(func, args, kwargs or {}, out, self.phase)
        if kernel is not None:
            self.kernels.append(kernel)
        return out


def step_kernels(spec, setup) -> list[Kernel]:
    """The kernels of one training step of the HF model for `spec` (the trace engine's model, CUDA semantics when
    setup.device is "cuda"), forward and backward; the optimizer's are left out."""
    from ..step import make_optimizer, stack_step
    from .cuda_kernels import cuda_kernels
    from .engine import build_hf
    from .fake import fake_mode, translated_errors
    from .train import warm_up_optimizer

    step = stack_step(setup)
    with translated_errors(spec.name), fake_mode(), cuda_kernels(setup):
        model = build_hf(spec, setup)
        optimizer = make_optimizer(model, setup)
        batches = step.make_batches(spec, setup)
        warm_up_optimizer(model, optimizer)
        log = KernelLog()
        with log:
            step.run_step(model, optimizer, batches, setup, phase=log.set_phase)
    return [k for k in log.kernels if k.phase in ("forward", "backward")]


def inference_kernels(spec, setup) -> list[Kernel]:
    """The kernels of the inference step (step/infer.py: a prefill, then one decode step) of the HF model for `spec`,
    phases "prefill" and "decode" (CUDA semantics when setup.device is "cuda")."""
    from ..step.infer import inference_step, prompt
    from .cuda_kernels import cuda_kernels
    from .engine import build_hf
    from .fake import fake_mode, translated_errors

    with translated_errors(spec.name), fake_mode(), cuda_kernels(setup):
        model = build_hf(spec, setup).eval()
        log = KernelLog()
        with log:
            inference_step(model, prompt(spec, setup)[0], setup, spec.causal, phase=log.set_phase)
    return log.kernels
