"""Gradient clipping before the optimizer step, as each stack runs it (Setup.grad_clip_norm: --max-grad-norm, else the
stack's stacks/*.toml [grad_clip]). On one rank: the passes its norm and scale make over the gradients (bytes read and
written, and the access class their kernels reach), every kernel it launches, the all-reduces of the norm, and the
high point of its temporaries beside the gradients. No torch. compute_time.optimizer_seconds times the passes and
launches inside optimizer.step()'s term, step_time adds the all-reduces, the memory models (megatron_memory.py,
parallel/deepspeed.py) its temporaries.

  hf, torchtitan  torch.nn.utils.clip_grad_norm_ (foreach): a norm pass reading every gradient, a scale pass reading
                  and writing it, each multi_tensor_apply launches; 0 turns it off (torch_clip).
  megatron        the optimizer's fp32 main grads (the rank's shard under the distributed optimizer):
                  multi_tensor_l2norm and the squared norm all-reduced over the grad-stats group whatever clip_grad
                  is (the ChainedOptimizer logs it), multi_tensor_scale when the norm is above clip_grad; 0 turns
                  the scale off (megatron_clip).
  deepspeed       inside the engine's optimizer: ZeRO-1/2/3 take a per-tensor fp64 norm of the rank's partition
                  whatever gradient_clipping is and fold the clip into one multiply of the fp32 gradient partition;
                  stage 0 takes it over the flat fp32 gradient (FusedAdam) or per gradient (other optimizers); fp32
                  stage 0 runs utils.clip_grad_norm_ only when clipping (deepspeed_clip).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..alloc.caching_allocator import K_MIN_BLOCK
from ..hardware import GPU
from ..setup import Setup
from .optimizer import clip_temporaries
from .precision import StateBytes
from . import multi_tensor
from .roofline import kernels_for, memory_seconds
from .stacks import model_for

FP32, FP64, INT32 = 4, 8, 4


@dataclass(frozen=True)
class Pass:
    """One pass of kernels over the clipped gradients: the bytes read and written, and the access class
    (kernels.toml access) its kernels reach; `depth`: the tensor lists of a torch multi_tensor_apply pass, timed
    launch by launch over ClipWork.runs (analytic/multi_tensor.py), 0 for a pass timed as its bytes."""
    nbytes: float
    access: str
    depth: int = 0


@dataclass(frozen=True)
class ClipWork:
    passes: tuple[Pass, ...] = ()
    kernels: float = 0.0  # every launch: the passes' and the scalar ops' (the all-reduces' own included)
    allreduces: tuple[tuple[str, float], ...] = ()  # (group, bytes): "dp", "model" (tp x pp) or "world"
    temporaries: float = 0.0  # the high point of its temporaries beside the gradients
    runs: tuple[tuple, ...] = ()  # the clipped tensors as multi_tensor.runs_of gives them (depth passes)


NONE = ClipWork()


def pass_seconds(gpu: GPU, work: ClipWork) -> float:
    """The passes' bytes at the bandwidth their access class reaches (roofline.memory_seconds), a multi_tensor_apply
    pass launch by launch (multi_tensor.pass_seconds: a launch of few chunks takes its latency floor); launches apart."""
    elements = multi_tensor.run_elements(work.runs)
    return sum(multi_tensor.pass_seconds(gpu, work.runs, p.depth, p.nbytes / elements, p.access)[0]
               if p.depth and elements else memory_seconds(gpu, p.nbytes, 0, p.access) for p in work.passes)


def clip_seconds(gpu: GPU, work: ClipWork) -> float:
    """The clip on the device: its passes and every launch (the all-reduces' transfer: step_time)."""
    return pass_seconds(gpu, work) + work.kernels * kernels_for(gpu).launch_seconds

# The scalar ops each stack's clip launches beside its passes, named as its code runs them (kernels: one each).
# megatron/core/optimizer/clip_grads.py:103 (torch.zeros dummy_overflow_buf), TE l2norm.cpp:18 (at::zeros output),
# l2norm.cu (cleanup kernel), clip_grads.py:118 (grad_norm ** 2), :130-132 (all_reduce); :174 (the scale's dummy)
MEGATRON_NORM_SCALARS = ("zeros", "zeros", "cleanup", "pow", "all_reduce")
MEGATRON_SCALE_SCALARS = ("zeros",)
# deepspeed/runtime/utils.py:404-425 clip_grad_norm_: stack, pow, sum; pow(1/p); * 1.0, / world; all_reduce;
# the max_norm tensor, + 1e-6, /, the 1.0 tensor, min
DS_FP32_SCALARS = ("stack", "pow", "sum", "pow", "mul", "div", "all_reduce", "tensor", "add", "div", "tensor", "min")
# zero/stage_1_and_2.py:2684-2699 get_grad_norm_direct: stack, pow, sum, float; all_reduce; pow(1/p); utils.py:883-888
# mask_nan_or_inf_with_val_inplace: isinf, isnan, logical_or, the -1 tensor, masked_fill_; utils.py:899-906
# combine_grad_norm_groups: stack, isfinite, ~, < 0, |, any, vector_norm, full_like, where
DS_ZERO12_NORM_SCALARS = ("stack", "pow", "sum", "float", "all_reduce", "pow", "isinf", "isnan", "logical_or",
                          "tensor", "masked_fill_", "stack", "isfinite", "invert", "lt", "or", "any", "vector_norm",
                          "full_like", "where")
# zero/stage3.py:2467-2484 get_grad_norm_direct: stack, pow, sum; all_reduce; pow(1/p); isinf, isnan, logical_or,
# the -1 tensor, where; then combine_grad_norm_groups as above
DS_ZERO3_NORM_SCALARS = ("stack", "pow", "sum", "all_reduce", "pow", "isinf", "isnan", "logical_or", "tensor",
                         "where", "stack", "isfinite", "invert", "lt", "or", "any", "vector_norm", "full_like",
                         "where")
# stage_1_and_2.py:3206-3220 / stage3.py:2984-2987 unscale_and_clip_grads: / loss_scale, + 1e-6, / clip_grad, clamp,
# * loss_scale, 1. / combined_scale (the multiply itself is the pass)
DS_CLIP_SCALARS = ("div", "add", "div", "clamp", "mul", "reciprocal")


def block_of(setup: Setup) -> Callable[[float], float]:
    """An allocation's bytes on the device: the CUDA caching allocator rounds each to kMinBlockSize (512 B); the
    CPU allocator hands out what is asked."""
    if setup.device == "cuda":
        return lambda n: K_MIN_BLOCK * -(-int(n) // K_MIN_BLOCK) if n else 0
    return lambda n: n


def clipped_params(setup: Setup, trained: float) -> float:
    """Elements of the gradients the rank's clip reads, of the `trained` parameters the rank holds unsharded (the
    stack's: analytic/stacks)."""
    return model_for(setup).clipped_params(setup, trained)


def clip_work(setup: Setup, st: StateBytes, clipped: float, tensors: int, largest: float = 0.0,
              sizes: tuple[int, ...] | None = None) -> ClipWork:
    """What the setup's stack runs to clip `clipped` gradient elements in `tensors` tensors (`largest`: the
    rank's largest parameter, for the temporaries; `sizes`: each tensor's elements where known, LoRA's adapters)."""
    return model_for(setup).clip_work(setup, st, clipped, tensors, largest, sizes)


# clip_grad_norm_'s small kernels beside its two passes (torch/nn/utils/clip_grad.py _get_total_norm,
# _clip_grads_with_norm_): _foreach_norm's zeroed per-chunk sums and its lpnorm_cleanup (aten/src/ATen/native/cuda/
# ForeachReduceOp.cu foreach_tensor_norm_cuda: `at::zeros({ntensors * max_chunks_per_tensor})`, multi_tensor_apply,
# lpnorm_cleanup), torch.stack of the norms (a cat), vector_norm of the stack, `total_norm + 1e-6`,
# `max_norm / (...)` (reciprocal, then a mul), torch.clamp: each in the H200 profiles once per step
TORCH_SCALARS = ("zeros", "lpnorm_cleanup", "stack", "vector_norm", "add", "reciprocal", "mul", "clamp")


def torch_clip(setup: Setup, st: StateBytes, clipped: float, tensors: int, largest: float,
               sizes: tuple[int, ...] | None = None) -> ClipWork:
    """clip_grad_norm_ (stacks/hf.toml, torchtitan.toml [grad_clip]): a foreach norm reads every gradient (:95
    _foreach_norm), a foreach mul by the clip coefficient reads and writes it (:173 _foreach_mul_), each a one-list
    multi_tensor_apply pass whatever the norm, and TORCH_SCALARS. The H200 torchtitan step: 1.24 + 2.40 ms for 1.1B
    fp32."""
    if setup.grad_clip_norm <= 0:
        return NONE
    g = st.grad  # the model's own gradients: a master's fp32 copies are made after the clip
    runs = multi_tensor.runs_of(clipped, tensors, sizes)
    access = "mta32" if g >= 4 else "mta16"
    launches = sum(n for _, n in multi_tensor.pack(runs, multi_tensor.tensor_limit(1)))
    return ClipWork(passes=(Pass(clipped * g, access, 1), Pass(clipped * 2 * g, access, 1)),
                    kernels=2 * launches + len(TORCH_SCALARS), runs=runs,
                    temporaries=clip_temporaries(setup, g, tensors, largest, block_of(setup)))


def megatron_clip(setup: Setup, clipped: float, tensors: int, largest: float) -> ClipWork:
    """Megatron-Core's step as Megatron-LM builds it: get_megatron_optimizer returns a ChainedOptimizer (optimizer/
    __init__.py:689) whose step() takes the norm whatever clip_grad is (optimizer.py:1314 get_grad_norm, the logged
    grad norm) and clips when clip_grad > 0 (:1317-1330). The norm: the main params' fp32 grads (optimizer.py:136-162;
    the fp32 grad buffer under --bf16, the fp32 copies under --fp16) read once by multi_tensor_l2norm (clip_grads.py:
    108; one list, 110 tensors a launch), the squared norm all-reduced over the grad-stats group (every rank of the
    distributed optimizer, else the model-parallel group: optimizer/__init__.py:459, :462, :466) and read on the
    host (.item(), clip_grads.py:133). The clip, when the norm is above clip_grad (:172-177): multi_tensor_scale
    reads and writes them ([grads, grads]: 64 tensors a launch).
    NB: the scale is counted on every step with clip_grad > 0 (pessimistic by that pass where the norm is within
    clip_grad); the norm reads the TP-duplicate norms and biases on every TP rank (Megatron only on TP rank 0:
    over-reads < 0.1 %)."""
    clip = setup.grad_clip_norm > 0
    passes = [Pass(FP32 * clipped, "mta32")]
    scalars = MEGATRON_NORM_SCALARS
    if clip:
        passes.append(Pass(2 * FP32 * clipped, "mta32"))
        scalars += MEGATRON_SCALE_SCALARS
    launches = sum(multi_tensor.chunk_launches(clipped, tensors, depth) for depth in (1, 2)[:len(passes)])
    return ClipWork(passes=tuple(passes), kernels=launches + len(scalars),
                    allreduces=(("world" if setup.zero >= 1 else "model", FP32),),
                    temporaries=megatron_temporaries(setup, tensors, min(largest, clipped), clip))


def megatron_temporaries(setup: Setup, tensors: int, piece: float, clip: bool) -> float:
    """CUDA (Transformer Engine): the int32 dummy_overflow_buf (clip_grads.py:103) beside multi_tensor_l2norm's output
    (one fp32 partial sum per block of a launch, multi_tensor.MAX_BLOCKS) and its 1-element result (TE pytorch/csrc/extensions/
    multi_tensor/l2norm.cpp:18, :22); the scale works in place. CPU, without TE or apex (clip_grads.py:26-43, the
    local fallbacks of megatron/core/utils.py): the dummy, a 0-d fp32 norm per tensor, their 1-D tensor and its norm
    (:1205-1206); then the scale's dummy and, one tensor at a time, `src * scale` (:1214-1215) beside the Python scale
    wrapped as a 0-d double and its fp32 cast (TensorIterator's wrapped-number promotion, seen in the allocation
    records): `piece`, the largest main grad."""
    block = block_of(setup)
    if setup.device == "cuda":
        return block(INT32) + block(FP32 * multi_tensor.MAX_BLOCKS) + block(FP32)
    norm = INT32 + 2 * FP32 * tensors + FP32
    return max(norm, INT32 + FP64 + FP32 + FP32 * piece) if clip else norm


def deepspeed_clip(setup: Setup, st: StateBytes, clipped: float, tensors: int, largest: float) -> ClipWork:
    """DeepSpeed's engine (stacks/deepspeed.toml [grad_clip]) clips in the optimizer it built for the stage and
    precision (engine.py:2358-2366): ZeRO-1/2 and ZeRO-3 (zero_clip), 16-bit stage 0 (FP16_Optimizer with FusedAdam,
    else FP16_UnfusedOptimizer: engine.py:2564-2599) or fp32 stage 0 (no wrapper: the engine's own clip)."""
    if setup.zero >= 1:
        return zero_clip(setup, st, clipped, tensors, largest)
    if st.weight >= FP32:
        return ds_fp32_clip(setup, clipped, tensors)
    # FusedAdam needs CUDA (the test parallel/deepspeed.py fused_adam makes; that module imports this one)
    if setup.device != "cpu" and setup.optimizer in ("adam", "adamw") and setup.optimizer_kernel == "fused":
        return ds_fused_fp16_clip(setup, clipped)
    return ds_unfused_fp16_clip(setup, st, clipped, tensors, largest)


def zero_clip(setup: Setup, st: StateBytes, clipped: float, tensors: int, largest: float) -> ClipWork:
    """The ZeRO optimizers take the global norm whatever gradient_clipping is (stage_1_and_2.py:3033-3039 with
    compute_grad_norm = True, zero/config.py:143; stage3.py:2884-2887): every gradient piece of the rank's partition
    (ZeRO-1/2: the parameters inside it, split at its ends; ZeRO-3: every parameter's partition) cast to fp64
    (get_norm_dtype, zero/utils.py:59-63) and its vector norm taken (stage_1_and_2.py:2684-2686, stage3.py:2455-2457),
    the squares summed and all-reduced over the data-parallel group. The clip then multiplies the flat fp32 gradient
    partition by 1 / (loss scale x clip coefficient) (stage_1_and_2.py:3193-3220; stage3.py:2979-2987), which ZeRO-1/2
    skip without clipping or loss scale (bf16, fp32) and ZeRO-3 always runs.
    NB: the casts timed at the measured bf16 -> fp32 rate (access upcast), the norms at the row reductions' (reduce)."""
    w, dp = st.weight, setup.dp
    stage3 = setup.zero == 3
    # ZeRO-1/2's partitions split up to dp - 1 tensors at their ends. NB: the mean rank's pieces
    pieces = tensors if stage3 else (tensors + dp - 1) / dp
    piece = largest / dp if stage3 else min(largest, clipped)
    passes = [Pass(clipped * (w + FP64), "upcast"), Pass(clipped * FP64, "reduce")]
    kernels = 2 * pieces + len(DS_ZERO3_NORM_SCALARS if stage3 else DS_ZERO12_NORM_SCALARS)
    clip = setup.grad_clip_norm > 0
    if stage3 or clip or setup.precision == "fp16-master":  # without clipping the scale is the loss scale, a float
        passes.append(Pass(clipped * 2 * FP32, "vector"))
        kernels += 1 + (len(DS_CLIP_SCALARS) if clip else 0)
    block = block_of(setup)
    # the fp64 norms so far beside the cast of the largest piece; then their stack and its squares
    temps = max(pieces * block(FP64) + block(FP64 * piece), pieces * block(FP64) + 2 * block(FP64 * pieces))
    return ClipWork(tuple(passes), kernels, (("dp", FP64),), temps)


def ds_fp32_clip(setup: Setup, clipped: float, tensors: int) -> ClipWork:
    """fp32 stage 0 (no optimizer wrapper): only with gradient_clipping > 0 the engine calls runtime/utils.py
    clip_grad_norm_ (engine.py:3502-3511): a 0-d fp32 norm per .grad (:398, .float() a no-op), their stack, squares
    and sum, the norm all-reduced over the data-parallel group (:414-419), then each .grad multiplied by the clamped
    coefficient (:426-427), one kernel per tensor either way."""
    if setup.grad_clip_norm <= 0:
        return NONE
    block = block_of(setup)
    return ClipWork(passes=(Pass(clipped * FP32, "reduce"), Pass(clipped * 2 * FP32, "vector")),
                    kernels=2 * tensors + len(DS_FP32_SCALARS), allreduces=(("dp", FP32),),
                    temporaries=tensors * block(FP32) + 2 * block(FP32 * tensors))


def ds_fused_fp16_clip(setup: Setup, clipped: float) -> ClipWork:
    """16-bit stage 0 with FusedAdam: FP16_Optimizer.step (fp16/fused_optimizer.py:256-355) takes the norm of the
    flat fp32 gradient it just made whatever gradient_clipping is (get_flattened_grad_norm, utils.py:478-489: one
    norm, .item(), a 1-element tensor; no all-reduce: the gradient is already all-reduced and there is no model
    parallelism), then multiplies the flat gradient by 1 / combined scale (:374-386, apply_scale, always)."""
    block = block_of(setup)
    return ClipWork(passes=(Pass(clipped * FP32, "reduce"), Pass(clipped * 2 * FP32, "vector")),
                    kernels=3, temporaries=2 * block(FP32))


def ds_unfused_fp16_clip(setup: Setup, st: StateBytes, clipped: float, tensors: int, largest: float) -> ClipWork:
    """16-bit stage 0 with any other optimizer: FP16_UnfusedOptimizer.step (fp16/unfused_optimizer.py:197-231) takes
    get_weight_norm of the 16-bit gradients whatever gradient_clipping is (utils.py:566-585: per gradient an fp32
    cast, its norm, ** 2 and the running sum; a 1-element tensor), then multiplies every fp32 gradient copy by 1 /
    combined scale (:243-258, always): at the largest gradient's cast the running sum and the last norm are live."""
    block = block_of(setup)
    return ClipWork(passes=(Pass(clipped * (st.weight + FP32), "upcast"), Pass(clipped * FP32, "reduce"),
                            Pass(clipped * 2 * FP32, "vector")),
                    kernels=5 * tensors + 1, temporaries=block(FP32 * largest) + 3 * block(FP32))
