"""The optimizer's own bytes: its state (per element, or factored for Adafactor) and the temporaries of step()."""
from __future__ import annotations

import math
from typing import Callable

from ..precision import PRECISIONS
from ..setup import BNB_OPTIMIZERS, Setup
from ..spec import ModelSpec
from .activations import FP32
from .params import ParamCounts
from .precision import StateBytes, bitsandbytes_optimizer
from .torchao_optim import state_bytes as torchao_state, step_temporaries, torchao_optimizer


def state_bytes_unsharded(spec: ModelSpec, n: float, pc: ParamCounts, st: StateBytes, setup: Setup) -> float:
    """The optimizer state of this rank's `n` parameters before ZeRO shards it (per-element bytes from
    precision.state_bytes; Adafactor factored, below)."""
    if st.factored:
        return adafactor_state(spec, n, pc, setup)
    if torchao_optimizer(setup):  # block-quantised large tensors, plain small ones (torchao_optim.py)
        return torchao_state(spec, pc, setup, n)
    if setup.optimizer in EIGHT_BIT:
        # each optimizer builds its own quantisation maps: one per parameter tensor with --optimizer-in-backward
        maps = _eight_bit_tensors(spec, pc) if setup.optimizer_in_backward else 1
        return eight_bit_state(spec, n, pc) + (maps - 1) * QMAPS
    return n * st.optimizer


EIGHT_BIT = ("adamw-8bit", "paged-adamw-8bit")
MIN_8BIT_SIZE = 4096  # bitsandbytes optim/optimizer.py:414,502-503: smaller tensors keep fp32 states
QMAPS = 2 * 256 * FP32  # the signed and unsigned dynamic quantisation maps, shared by all parameters (:515-521)


def eight_bit_state(spec: ModelSpec, n: float, pc: ParamCounts) -> float:
    """bitsandbytes' block-wise 8-bit AdamW states of `n` parameters: 2 uint8 states + 2 fp32 absmax per 256
    elements (precision.state_bytes), except tensors shorter than min_8bit_size, which keep two fp32 states
    (8 B per element): the norm vectors, and in small models whole projections (a 64 x 32 k_proj).
    NB: the small tensors' share of `n` is the model's share (exact without tensor or pipeline parallelism);
    MoE experts' matrices and biases are taken as large (under-counts by 6 B per element of a small one)."""
    h = spec.hidden
    # the layers are alike: one layer's small matrices counted once and multiplied (integer sums, exact)
    vectors = (spec.layers * pc.norms // h + pc.final // h) * h if h < MIN_8BIT_SIZE else 0
    mats = spec.layers * sum(v for v in (r * c for r, c in _layer_matrices(spec, 1)) if v < MIN_8BIT_SIZE)
    small = (vectors + mats) / pc.total * n
    return (n - small) * (2.0 + 2 * FP32 / 256) + small * 2 * FP32 + QMAPS


def _eight_bit_tensors(spec: ModelSpec, pc: ParamCounts) -> int:
    """Parameter tensors that get 8-bit states (min_8bit_size elements or more) in a dense model: each layer's
    projections and norm vectors, the embedding, the final norm and an untied head. NB: biases and MoE experts
    are not counted (each tensor's maps are 2 KiB)."""
    h = spec.hidden
    sizes = [r * c for r, c in _layer_matrices(spec, 1)] + [h] * (pc.norms // h)
    per_layer = sum(1 for v in sizes if v >= MIN_8BIT_SIZE)
    ends = [spec.vocab * h] + [h] * (pc.final // h) + ([pc.lm_head] if pc.lm_head else [])
    return spec.layers * per_layer + sum(1 for v in ends if v >= MIN_8BIT_SIZE)


def _layer_matrices(spec: ModelSpec, t: int) -> list[tuple[int, int]]:
    """(rows, columns) of one dense layer's projection matrices on a tp = t rank."""
    h, i = spec.hidden, spec.intermediate
    mats = [(spec.q_dim // t, h), (spec.kv_dim // t, h), (spec.kv_dim // t, h), (h, spec.q_dim // t)]
    return mats + [(i // t, h), (h, i // t)] + ([(i // t, h)] if spec.gated_mlp else [])


# bitsandbytes 0.50 optim/optimizer.py:383-389 (get_state_buffer): with is_paged, the states of a parameter of 1e5
# elements or more are allocated by functional.get_paged (:91-99: cudaMallocManaged, wrapped by torch.frombuffer),
# outside torch's caching allocator; smaller ones, and the 8-bit absmax, are ordinary CUDA tensors.
PAGED = ("paged-adamw-8bit", "paged-adamw")
PAGED_MIN = 100_000


def paged_state_bytes(spec: ModelSpec, setup: Setup, n: float) -> float:
    """The optimizer states in CUDA unified memory (not torch's allocator: not in memory_allocated/reserved; in
    device memory while resident, evicted to the host under pressure) of this rank's `n` trainable parameters:
    AdamW's two states, uint8 or fp32, of every tensor of PAGED_MIN elements or more (LoRA: the adapters' A, r x in,
    and B, out x r). NB: the large tensors' share of `n` is the model's (exact without pipeline stages); MoE experts
    are taken as large."""
    if setup.device != "cuda" or setup.optimizer not in PAGED:
        return 0.0
    per_element = 2 * (1 if setup.optimizer in EIGHT_BIT else FP32)
    if setup.lora_rank:
        from .lora import targets
        r = setup.lora_rank
        sizes = [k for i, o, _ in targets(spec, setup).values() for k in (r * i, o * r)]
    else:
        t = setup.tp
        sizes = [r * c for r, c in _layer_matrices(spec, t)] + [spec.hidden] * spec.norms_per_layer
        ends = spec.vocab * spec.hidden / t * (1 if spec.tied_embeddings else 2)
        big_ends = ends if spec.vocab * spec.hidden / t >= PAGED_MIN else 0
        total = spec.layers * sum(sizes) + ends
        return per_element * n * (spec.layers * sum(k for k in sizes if k >= PAGED_MIN) + big_ends) / total
    return per_element * spec.layers * sum(k for k in sizes if k >= PAGED_MIN)


def adafactor_state(spec: ModelSpec, n_params: int, pc: ParamCounts, setup: Setup) -> float:
    """torch.optim.Adafactor (Shazeer & Stern 2018, Alg. 4): row and column second-moment statistics for each
    matrix, full second moment for vectors; no first moment by default. fp32."""
    h, t = spec.hidden, setup.tp
    per_layer = sum(r + c for r, c in _layer_matrices(spec, t))
    emb = spec.vocab // t + h
    # vectors (norm weights, biases) keep a full second moment
    vectors = pc.norms
    return FP32 * (spec.layers * (per_layer + vectors) / setup.pp + 2 * emb)


def temporary_bytes(setup: Setup, st: StateBytes) -> int:
    """Bytes per element of the optimizer's temporaries: the states' dtype (fp32 beside fp32 or master weights)."""
    return 4 if st.master or setup.precision in ("fp32", "amp-bf16", "amp-fp16") else 2


def state_tensors(setup: Setup, st: StateBytes) -> int:
    """Per-element optimizer states each parameter has, each a tensor of its shape in temporary_bytes' dtype (Adam:
    2, momentum and Lion: 1, SGD: 0); 0 for Adafactor's factored states."""
    return 0 if st.factored else round(st.optimizer / temporary_bytes(setup, st))


def optimizer_temporaries(setup: Setup, st: StateBytes, n: float, largest: int) -> float:
    """Temporaries of optimizer.step() for the kernel the stack runs (Setup.optimizer_kernel): foreach kernels
    allocate whole-group temporaries, the for-loop one parameter's worth at a time (torch/optim/adam.py
    _multi_tensor_adam / _single_tensor_adam, sgd.py), fused kernels none (torch/optim/adam.py _fused_adam:
    one in-place aten._fused_adamw_ over all tensors)."""
    state_dtype = temporary_bytes(setup, st)
    kernel = setup.optimizer_kernel
    foreach = kernel == "foreach"
    size = n if foreach else largest
    if bitsandbytes_optimizer(setup):
        return bnb_temporaries(setup, largest)
    if torchao_optimizer(setup):  # one compiled step per parameter (torchao_optim.py), beside a master's fp32 grads
        return step_temporaries(setup, largest) + (FP32 * n if st.master else 0)
    per = {"sgd": 0, "momentum": 0, "adam": 2, "adamw": 2, "lion": 1, "adafactor": 2}[setup.optimizer]
    if foreach and setup.optimizer in ("adam", "adamw"):
        per = 1  # _foreach_sqrt(exp_avg_sq) is the one full-size temporary; the rest is in place
    if foreach and setup.optimizer == "adafactor":
        # torch/optim/_adafactor.py _multi_tensor_adafactor: per (dtype, multidim) group one full-size temporary,
        # var_estimates (row_var @ col_var, or a clone of a vector's variance), rsqrt'ed and scaled in place into
        # the updates; the group before's updates are freed only once the next group's list is made, so the groups
        # of one dtype (matrices, vectors) are held together: the whole model's size
        per = 1
    temps = 0 if kernel == "fused" else per * state_dtype * size
    if st.master:
        # every bf16 gradient gets an fp32 copy on the master before the update (trainfit.step's
        # MasterWeightOptimizer; Megatron's main_grad / DeepSpeed's fp32 gradient partition hold the same bytes)
        temps += FP32 * n
    return temps


def clip_temporaries(setup: Setup, grad_bytes: float, tensors: int, largest: int,
                     block: Callable[[float], float] = lambda n: n) -> float:
    """The high point of clip_grad_norm_'s temporaries before optimizer.step() (Setup.grad_clip_norm; stacks/*.toml
    [grad_clip]), each allocation rounded by `block` (the CUDA allocator's 512 bytes): a 0-d norm per gradient tensor
    in the gradients' dtype, then their stack and the total beside them (torch/nn/utils/clip_grad.py:86-107); on CUDA
    _foreach_norm first holds an fp32 scratch of tensors × the largest tensor's 65,536-element chunks beside the norms
    (ATen ForeachReduceOp.cu). Then clip_coef = max_norm / (total + 1e-6) (:164) holds the total, the sum, its
    reciprocal and the product, and on a CPU each Python float as a 0-d double (8 bytes) and its cast (the CUDA
    kernels take the host scalar as it is)."""
    if setup.grad_clip_norm <= 0 or not tensors:
        return 0.0
    norms = tensors * block(grad_bytes)
    after = block(tensors * grad_bytes) + block(grad_bytes)
    if setup.device == "cuda":
        scratch = block(FP32 * tensors * math.ceil(largest / 65536))
        return max(norms + max(scratch, after), 4 * block(grad_bytes))
    return max(norms + after, 5 * grad_bytes + 8)


def bnb_temporaries(setup: Setup, largest: int) -> float:
    """bitsandbytes' update kernels: in place on CUDA (backends/cuda/ops.py:1059,1118), so none. On a CPU they are
    PyTorch code that, for the parameter being stepped, holds fp32 temporaries of its size:
      8-bit (backends/cpu/ops.py:469-580): both dequantised states, the scaled gradient (g.float() * gnorm_scale: a
        new tensor), the parameter (p.data.float(): a copy unless the weights are fp32) and, while it forms the
        denominator, sqrt(state2) and sqrt(state2)/c2 — five, plus the parameter copy;
      32-bit (:345-448; paged-adamw, lion): the scaled gradient and the parameter copy, then two at once — AdamW's
        sqrt(state2) and its sum with eps, then that sum and the update; Lion's state1·beta1 and the update, then
        the update and its sign — three, plus the parameter copy.
    NB: the 8-bit optimizers' fp32 states of tensors under 4,096 elements take the 32-bit path: smaller than the
    largest tensor's 8-bit temporaries, not counted."""
    if setup.device != "cpu" or setup.optimizer not in BNB_OPTIMIZERS:
        return 0.0
    param_copy = 0 if PRECISIONS[setup.precision].weight == "fp32" else 1
    held = 5 if setup.optimizer in EIGHT_BIT else 3
    return (held + param_copy) * FP32 * largest
