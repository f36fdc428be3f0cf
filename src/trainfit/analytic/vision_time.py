"""A vision training step's time from the kernels it runs (issue 14: one time model everywhere; no torch): the op
list of analytic/vision_graph.py turned into the roofline's kernels (analytic/ops' Op) and timed by
compute_time.time_ops, as the transformer engine times its own list; the optimizer step by
compute_time.optimizer_seconds; the host-issue bound by step_time.host_issue_exposed. Returns step_time.StepTime.

Kernels:
  * conv (groups = 1) and linear: one GEMM each, the conv's cuDNN implicit GEMM (vision_graph.Net.conv: m = N·P·Q,
    n = K, k = C·R·S). Backward (ops.backward: dgrad (m, k, n) + wgrad (k, n, m), 2x the forward FLOPs, Narayanan
    et al. 2021 §5.1; for a conv the guide's dgrad and wgrad are convolutions of the same FLOPs). The stem's input
    (the images) needs no gradient: no dgrad. NB: dgrad's GEMM is taken as (N·P·Q, C·R·S, K), the
    forward's transposed; cuDNN's implicit dgrad is (N·H·W, C, K·R·S) — the same FLOPs for stride 1, another tile
    quantisation.
  * dtype: fp32 convolutions run on TF32 tensor cores by default (torch.backends.cudnn.allow_tf32 = True, unlike
    torch.backends.cuda.matmul.allow_tf32 = False: PyTorch docs, "CUDA semantics", "TensorFloat-32 (TF32) on
    Ampere (and later) devices"), so an fp32 conv is timed as tf32 where the GPU has it (GPU.flops_for); fp32
    linears run at the fp32 rate unless --tf32 (timing.compute_dtype). Autocast / bf16: the 16-bit dtype.
  * depthwise conv (groups > 1: ConvNeXt's 7x7): no GEMM worth the name (n = 1 output channel per group); a
    CUDA-core kernel timed by the roofline: max(its FLOPs at the fp32 CUDA-core peak, its bytes at the achieved
    HBM bandwidth). NB: optimistic (the peak, not an achieved fraction, and for 16-bit the fp32 rate: half2 could
    double it). Backward: dgrad (reads dY and the weight, writes dX) and wgrad (reads x and dY), two kernels.
  * every other op: a memory-bound kernel reading its inputs and writing its output (the ops backward rule for its
    backward: reads the output gradient and, when it keeps it, its input; writes the input gradient). Views and
    the in-place/identity gradient of adds launch nothing; a promoting add's backward casts the narrower branch's
    gradient (one kernel).
  * autocast: each conv/linear weight is cast to 16 bits in the forward (one kernel per parameter tensor, its
    cast's backward another, ToCopyBackward0) and an fp32 input is cast before the op.
  * NCHW (no --channels-last) with tensor-core convs (TF32, fp16, bf16): cuDNN's tensor-core kernels are NHWC, so
    the NCHW input and output are transposed around each conv (the guide's QuickStart Checklist and §"Tensor
    Layouts In Memory: NCHW vs NHWC": "choose tensor layouts in memory to avoid transposing input and output
    data"): a transpose each (read + write) per conv in the forward, and of dY, dX and x in the backward. NB: an
    upper bound — cuDNN has some NCHW-native tensor-core kernels.
  * SDPA (ViT): roofline.attention_seconds with the kernel HF's sdpa runs on CUDA (vision_graph.Net.attention:
    flash for 16-bit, the memory-efficient kernel for fp32).
  * --recompute full (ViT): each checkpointed layer's forward kernels once more, from its first op to the one
    before the early stop (vision_graph.checkpointed), in the StepTime's `recompute` term.
NB (not modelled): the conv bias add (ConvNeXt/ViT patch convs), GradScaler's unscale and inf checks under
amp-fp16, and gradient accumulation's adds — each a few memory-bound kernels: under.
"""
from __future__ import annotations

from ..hardware import GPU
from ..setup import Setup
from . import ops as rops
from .compute_time import ListTime, optimizer_seconds, time_ops
from .precision import state_bytes
from .roofline import kernels_for, memory_seconds
from ..estimate import StepTime
from .step_time import host_issue_exposed
from .stragglers import slowest_gpu_factor
from .timing import compute_dtype
from .vision_graph import FP32, HALF, Op, checkpointed

_16 = {"amp-fp16": "fp16", "amp-bf16": "bf16", "bf16": "bf16"}


def dtypes(setup: Setup, gpu: GPU) -> tuple[str, str]:
    """(the convolutions' dtype, the linears' dtype) of a vision step on `gpu` (module docstring)."""
    if setup.precision in _16:
        return _16[setup.precision], _16[setup.precision]
    return ("tf32" if gpu.peak_flops.get("tf32") else "fp32"), compute_dtype(setup)


def _sizes(ops: list[Op], images: int) -> dict[str, int]:
    """Bytes of every tensor: an op's output, or (a view, an in-place add) its first input's storage."""
    sizes = {"pixel_values": images}
    for op in ops:
        sizes[op.out] = op.out_bytes if not op.alias else sizes[op.ins[0]]
    return sizes


def kernels(ops: list[Op], setup: Setup, gpu: GPU, images: int,
            only: set[int] | None = None) -> tuple[list[rops.Op], list[rops.Op]]:
    """(forward, backward) kernel lists of one micro-batch. `images`: the input batch's bytes; `only`: the indices
    of the ops to list (all when None)."""
    conv_dt, lin_dt = dtypes(setup, gpu)
    sizes = _sizes(ops, images)
    fwd: list[rops.Op] = []
    bwd: list[rops.Op] = []
    transposes = not setup.channels_last and conv_dt != "fp32"
    for i, op in enumerate(ops):
        if only is not None and i not in only:
            continue
        reads = sum(sizes[t] for t in op.ins)
        if op.kind in ("conv", "linear"):
            if op.cast_params:  # the weight (and bias) cast to 16 bits; its backward casts the gradient up
                for n in op.tensors:
                    fwd.append(rops.memory(f"{op.name}.cast", n * FP32, n * HALF, "autocast weight cast", saves=False))
            if op.cast_in:  # an fp32 input cast to 16 bits (kept for backward)
                fwd.append(rops.memory(f"{op.name}.cast_in", reads, op.cast_in, "autocast input cast", saves=False))
            if op.kind == "conv" and op.groups > 1:
                w = sum(op.tensors) * FP32
                fwd.append(_depthwise(op.name, reads + w, op.out_bytes, op.flops, gpu))
                bwd.append(_depthwise(f"{op.name}.dgrad", op.out_bytes + w, reads, op.flops, gpu))
                bwd.append(_depthwise(f"{op.name}.wgrad", op.out_bytes + reads, w, op.flops, gpu))
                continue
            m, n, k = op.gemm
            g = rops.Op(op.name, "gemm", conv_dt if op.kind == "conv" else lin_dt, m, n, k,
                        bias=len(op.tensors) > 1, source="cuDNN implicit GEMM" if op.kind == "conv" else "linear")
            fwd.append(g)
            back = rops.backward([g])
            if op.ins[0] == "pixel_values":  # the images need no gradient
                back = [b for b in back if not b.name.endswith(".dgrad")]
            bwd.extend(back)
            if op.kind == "conv" and transposes:
                x = op.cast_in or reads
                fwd.append(rops.memory(f"{op.name}.nchw", x + op.out_bytes, x + op.out_bytes, "NCHW<->NHWC",
                                    kernels=2, grad=False))
                bwd.append(rops.memory(f"{op.name}.nchw_bwd", 2 * x + op.out_bytes, 2 * x + op.out_bytes,
                                    "NCHW<->NHWC", kernels=3, grad=False))
        elif op.kind == "sdpa":
            bh, rows, d = op.attn
            half = lin_dt in ("fp16", "bf16")
            a = rops.Op(op.name, "attention", lin_dt if half else "fp32", rows, rows, d, bh,
                        kernel="flash" if half else "efficient")
            fwd.append(a)
            bwd.extend(rops.backward([a]))
        elif op.alias:  # views, the in-place add (reads both, writes x in place), select
            if op.kind == "add":
                fwd.append(rops.memory(op.name, reads, sizes[op.out], "in-place add", grad=False))
            if op.kind == "select":  # select_backward: a zero-filled gradient of the whole tensor
                bwd.append(rops.memory(op.name + ".backward", 0, sum(op.grads_in), "select_backward", saves=False))
        elif op.passes_grad:  # adds: the gradient passes as is; a promoting add casts a narrower branch's
            fwd.append(rops.memory(op.name, reads + sum(op.tensors) * FP32, op.out_bytes, "add", grad=False))
            for g in op.grads_in:
                if g:
                    bwd.append(rops.memory(op.name + ".cast", op.out_bytes, g, "gradient cast", saves=False))
        else:
            # it writes its output and what it makes and keeps (pool indices, statistics, log-softmax, casts)
            e = rops.memory(op.name, reads, op.out_bytes + sum(op.own_saved), op.kind,
                         saves=op.kind not in ("pool", "cat", "loss"))
            fwd.append(e)
            bwd.extend(rops.backward([e]))
    for i, op in enumerate(ops):  # autocast: the 16-bit weight gradients cast to the fp32 .grad (ToCopyBackward0)
        if op.cast_params and op.kind in ("conv", "linear") and (only is None or i in only):
            bwd.extend(rops.memory(f"{op.name}.grad_cast", n * HALF, n * FP32, "ToCopyBackward0", saves=False)
                       for n in op.tensors)
    return fwd, bwd


def _depthwise(name: str, reads: float, writes: float, flops: float, gpu: GPU) -> rops.Op:
    """A depthwise-conv kernel (forward, dgrad or wgrad: each the forward's FLOPs) on the CUDA cores, timed by the
    roofline's max: a memory-bound kernel whose bytes are raised to what its FLOPs at the fp32 CUDA-core peak take
    at the achieved bandwidth, where that is longer (time_ops times memory kernels by their bytes)."""
    per_byte = memory_seconds(gpu, 1.0, 0)  # seconds per byte at the achieved HBM bandwidth
    scale = max(1.0, flops / gpu.flops_for("fp32") / ((reads + writes) * per_byte))
    return rops.memory(name, reads * scale, writes * scale, "depthwise conv", saves=False)


def vision_step_time(setup: Setup, gpu: GPU, ops: list[Op], params: int, tensors: int,
                     images: int, model_flops: float) -> StepTime:
    """The StepTime of one vision step (one rank): grad_accum micro-batches of forward + backward, the optimizer
    step, and the host-issue bound; every communication term 0 (one rank). `images`: one micro-batch's input
    bytes; `model_flops`: the step's FLOPs (vision.step_flops x grad_accum)."""
    st = state_bytes(setup)
    fwd, bwd = kernels(ops, setup, gpu, images)
    tf, tb = time_ops(gpu, fwd), time_ops(gpu, bwd)
    m = setup.grad_accum
    tot: ListTime = tf + tb
    # --recompute full: each checkpointed block's forward again in the backward, up to the early stop (the last
    # op that saves: its inputs are packed before its kernel runs, so it does not run; NB: its autocast weight
    # cast does, not counted: under)
    again = {i for first, last in checkpointed(ops, setup.recompute).values() for i in range(first, last)}
    if again:
        tot = tot + time_ops(gpu, kernels(ops, setup, gpu, images, again)[0])
    rec = m * (tot.seconds - tf.seconds - tb.seconds) if again else 0.0
    opt_mem, opt_launch = optimizer_seconds(gpu, setup, st, params, tensors)
    opt = opt_mem + opt_launch
    # the slowest of the data-parallel GPUs sets the pace of their compute-bound kernels (stragglers.py)
    slowest = m * (tot.gemm + tot.attention) * slowest_gpu_factor(setup.dp)
    step = m * tot.seconds + opt + slowest
    n_kernels = m * tot.kernels + opt_launch / kernels_for(gpu).launch_seconds
    issue = host_issue_exposed(setup, n_kernels, step)
    step += issue
    peak = gpu.flops_for(dtypes(setup, gpu)[0])
    matmul = tot.gemm + tot.attention
    mfu = model_flops / (step * peak)
    return StepTime(
        compute=m * tot.seconds - rec, recompute=rec, tp_comm=0.0, cp_comm=0.0, ep_comm=0.0, pp_comm=0.0, bubble=0.0,
        dp_comm=0.0, optimizer=opt, host_copies=0.0, host_issue=issue, straggler=slowest, step_seconds=step,
        tokens_per_second=setup.batch * m * setup.dp / step, mfu=mfu, hfu=mfu, dp_comm_total=0.0,
        dp_bandwidth="intra", efficiency=tot.flops / (matmul * peak) if matmul else 0.0,
        compute_terms={k: m * getattr(tot, k) for k in ("gemm", "attention", "memory", "launches")},
        kernels=n_kernels)
