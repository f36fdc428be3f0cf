"""Cost functions of Qwen3-Next's Gated DeltaNet layer (the mixer in place of attention on its linear layers) as
transformers runs it without flash-linear-attention and causal-conv1d: the torch fallbacks of
models/qwen3_next/modeling_qwen3_next.py (transformers 5.24): Qwen3NextGatedDeltaNet.forward :660-769,
fix_query_key_value_ordering :629-656, causal_conv1d_fn :340-359, l2norm :364-367, torch_chunk_gated_delta_rule
:371-509, Qwen3NextRMSNormGated :59-75; under transformers 5.25 also the split of the rule's inputs and the cat
of its output (splits_at_kept_states). Every elementwise kernel is one op with the bytes it reads and writes (the
shapes of analytic/gated_deltanet.py: chunks of CHUNK tokens over the sequence padded to a multiple of CHUNK);
the rule's matmuls are batched GEMMs (batch: sequences x value heads, x chunks for the intra-chunk products); its
two unitriangular solves (torch.linalg.solve_triangular, :470-471) are listed by their bytes: cuBLAS's batched trsm
over (chunk x chunk) systems, NB timed as memory-bound (optimistic: 2 FLOPs per byte or so, below every GPU's
ridge point, but trsm runs far below peak at these sizes).
The rule runs in fp32 whatever the precision (:413-416); under autocast its matmuls cast their fp32 operands to the
16-bit dtype (autocast's lower-precision list: matmul, bmm), and their gradients back; their 16-bit outputs combined
with fp32 tensors promote, so those gradients are cast back too.
tests/analytic/test_ops_vs_trace.py checks the catalog's (MoE) Qwen3-Next in bf16; NB: the autocast and fp32 paths
were checked once against the trace of a dense configuration (tests/analytic/test_gated_deltanet.py's CONFIG without
experts, 2 x 128, when written): casts exact both ways, other bytes -4.5 % / +2.4 % (amp-bf16 forward / backward),
+6.5 % / +2.3 % (fp32: the strided q and k the matmuls copy, not listed).
"""
from __future__ import annotations

from functools import lru_cache
from typing import Callable

from ...spec import ModelSpec
from ..activations import FP32
from ..gated_deltanet import CHUNK, padded
from .cast import autocast_inputs
from .norm import hf_rms_norm
from .op import BROADCAST, DOWNCAST, REDUCE, UPCAST, Op, Shape, bwd_kernel, gemm, grad_cast, memory, no_kernel

SRC = "modeling_qwen3_next.py"
SRC_525 = "modeling_qwen3_next.py (5.25)"
BOOL = 1
RULE = "rule."  # the prefix of the rule's ops: its matmuls multiply activations, not weights (no adapters, no casts)


@lru_cache(maxsize=1)
def splits_at_kept_states() -> bool:
    """Whether transformers' linear mixers split their inputs at the recurrent states the cache keeps (for speculative
    decoding's rollback) and cat their outputs, and commit a decode step's state through the cache: from 5.25
    (modeling_qwen3_next.py:786-841: tensor_split of q, k, v, beta and g :793-797, the chunked rule on the first
    part, the cat :834; modeling_nemotron_h.py mamba2_scan_forward :408-539, called at :718: A again :445, the decode
    state's clone :458 and cache write :462, the same split :473-478, zero state :508 and cat :530; both convs'
    causal_conv1d_forward, :363-413 and :121-171, counts a decode token in the cache, cache_utils.py:1222). Up to
    5.24 the rule's and the scan's outputs were used as they came (modeling_qwen3_next.py:742-754,
    modeling_nemotron_h.py:556-607). The installed version decides (read from its metadata, transformers is not
    imported); without it, 5.25's. NB: the memory side is not modelled: the cache's token counter (one int64 per
    layer, cache_utils.py:1283) and the training scan's (batch, heads) zero state, under 1 KiB per layer."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        major, minor = (int(x) for x in version("transformers").split(".")[:2])
    except (PackageNotFoundError, ValueError):
        return True
    return (major, minor) >= (5, 25)


def cache_count(sh: Shape, src: str) -> list[Op]:
    """A decode step's `cache.increase_count` (5.25, splits_at_kept_states; `src`: the call): the layer's int64 token
    counter incremented in place (cache_utils.py:1222). NB: the prefill's, in update_conv_state (cache_utils.py:1283),
    is not listed (the prefill and training share the list; training has no cache): one 8-byte kernel under."""
    if not (sh.decode and splits_at_kept_states()):
        return []
    return [memory("cache_count", 8, 8, f"{src} increase_count, cache_utils.py:1222 add_")]


class _Dims:
    """One rank's widths of the layer (1/tp of its heads, Megatron-style) and the rule's padded token counts."""

    def __init__(self, spec: ModelSpec, sh: Shape):
        g, t = spec.linear_attn, sh.tp
        self.nk, self.nv = g.key_heads / t, g.value_heads / t
        self.dk, self.dv = g.key_head_dim, g.value_head_dim
        self.kd, self.vd = self.nk * self.dk, self.nv * self.dv
        self.cd = 2 * self.kd + self.vd  # the conv's channels: q, k, v
        self.K = g.conv_kernel
        self.b, self.s = sh.batch, sh.seq / sh.cp
        self.T = sh.tokens
        self.Tp = self.b * padded(int(self.s))  # the padded tokens of the chunked rule (:426-428)
        self.chunks = padded(int(self.s)) // CHUNK


def linear_mixer(spec: ModelSpec, sh: Shape, ops: list[Op], proj: Callable[..., Op]) -> None:
    """Appends to `ops` one Gated DeltaNet layer's mixer: in_proj_qkvz and in_proj_ba (:678-679), the reordering
    copies, the depthwise causal conv1d and SiLU, the gates, the chunked rule, the gated RMSNorm and out_proj."""
    d, h = _Dims(spec, sh), spec.hidden
    ops += autocast_inputs("attn_in", d.T, h, 2, sh, "attn_in")
    proj("in_proj_qkvz", 2 * spec.linear_attn.key_dim + 2 * spec.linear_attn.value_dim, h, 2 * d.kd + 2 * d.vd, h,
         False, f"{SRC}:678 in_proj_qkvz")
    proj("in_proj_ba", 2 * spec.linear_attn.value_heads, h, 2 * d.nv, h, False, f"{SRC}:679 in_proj_ba")
    if sh.decode:  # one cached token per sequence: the conv-state update and the recurrent rule (:686-694, :729-741)
        ops += _conv_update(d, sh) + _gates(d, sh) + _recurrent_rule(d, sh) + _gated_norm(spec, d, sh)
    else:
        ops += _conv(d, sh) + _gates(d, sh) + _split(d, sh) + _rule(d, sh) + _cat(d, sh) + _gated_norm(spec, d, sh)
    proj("out_proj", h, spec.linear_attn.value_dim, h, d.vd, False, f"{SRC}:768 out_proj")


def _conv(d: _Dims, sh: Shape) -> list[Op]:
    """fix_query_key_value_ordering's reshapes of strided slices (value, z :652-653, b, a :654-655) and the
    flattening of q and k (:681): six copies, whose backward is none but the two splits' (:649-650: a cat of the
    in_proj outputs' gradients each); the cat of q, k, v (:683), whose backward is the cat of the split at :712;
    causal_conv1d_fn (:350-358): F.conv1d over conv_kernel - 1 padded positions, sliced back (backward: the slice's
    zero-filled gradient, then convolution_backward: the input's and the weight's gradients), and SiLU."""
    a, w, T, cd = sh.act, sh.weight, d.T, d.cd
    reorder = T * (2 * d.vd + 2 * d.nv + 2 * d.kd) * a
    qkvz, ba, qkv = T * (2 * d.kd + 2 * d.vd) * a, T * 2 * d.nv * a, T * cd * a
    conv_out = d.b * cd * (d.s + d.K - 1) * a
    weight = cd * d.K
    ops = [memory("reorder_copies", reorder, reorder, f"{SRC}:652-655,681 reshape copies", kernels=6, bwd_ops=(
                bwd_kernel("in_proj_split.backward", qkvz, qkvz), bwd_kernel("in_proj_split.backward_ba", ba, ba))),
           memory("qkv_cat", qkv, qkv, f"{SRC}:683 torch.cat(q, k, v)", bwd_ops=(
               bwd_kernel("qkv_split.backward", qkv, qkv),))]
    if sh.autocast:  # .to(weight.dtype) (:351): the fp32 weight's dtype; F.conv1d then casts input and weight down
        ops += [memory("conv_in.to_fp32", qkv, T * cd * FP32, f"{SRC}:351", saves=False, **UPCAST),
                memory("conv_in.autocast", T * cd * FP32, qkv, "torch.autocast (conv1d)", saves=False, **DOWNCAST),
                memory("conv_weight.autocast", weight * w, weight * a, "torch.autocast (conv1d)", saves=False,
                       **DOWNCAST)]
    ops += [memory("conv1d", qkv + weight * a, conv_out, f"{SRC}:350-356 F.conv1d depthwise", bwd_ops=(
                bwd_kernel("conv1d.slice_backward", qkv, conv_out),
                bwd_kernel("conv1d.backward", conv_out + qkv + weight * a, qkv + weight * a))),
            memory("conv_silu", qkv, qkv, f"{SRC}:358 SiLU")]
    return ops


def _gates(d: _Dims, sh: Shape) -> list[Op]:
    """beta = sigmoid(b) (:725); the decay g = -exp(A_log.float()) * softplus(a.float() + dt_bias) in fp32 (:727):
    A_log's cast (none where the weights are fp32), exp and negation (value_heads each), a's cast (none in fp32), the
    bias add, softplus and the product."""
    a, w, x = sh.act, sh.weight, d.T * d.nv
    src = f"{SRC}:725-727"
    ops = [memory("beta_sigmoid", x * a, x * a, src)]
    if w != FP32:
        ops.append(memory("a_log.to_fp32", d.nv * w, d.nv * FP32, src, saves=False, **UPCAST))
    ops += [memory("a_log.exp", d.nv * FP32, d.nv * FP32, src), memory("a_log.neg", d.nv * FP32, d.nv * FP32, src)]
    if a != FP32:
        ops.append(memory("a.to_fp32", x * a, x * FP32, src, saves=False, **UPCAST))
    # the bf16 dt_bias promoted by the fp32 a: its gradient summed over the tokens, then cast back (grad_cast)
    ops += [memory("dt_bias_add", x * FP32 + d.nv * w, x * FP32, src, bwd_ops=(
                bwd_kernel("dt_bias_add.backward_sum", x * FP32, d.nv * FP32, "reduce"),
                *grad_cast("dt_bias_add.grad_cast", d.nv, FP32, w)), **BROADCAST),
            memory("softplus", x * FP32, x * FP32, src),
            memory("decay_mul", x * FP32 + d.nv * FP32, x * FP32, src, **BROADCAST)]
    return ops


def _split(d: _Dims, sh: Shape) -> list[Op]:
    """Backward only. 5.25 (splits_at_kept_states): tensor_split of q, k, v, beta and g at the kept states (:793-797;
    none kept in training and the prefill: the rule's part is the whole tensor), views whose backward writes each
    tensor's gradient whole (slice_backward: reads the gradient, writes it zero-filled around it; g is fp32, :727).
    Up to 5.24: none, but value's gradient, which arrives transposed (the rule's transpose, :413-416), is copied by
    the backward of its reshape (modeling_qwen3_next.py:723); 5.25's slice_backward writes it contiguous instead."""
    a, T = sh.act, d.T
    if not splits_at_kept_states():
        v = T * d.vd * a
        return [memory("value_reshape", 0, 0, f"{SRC}:723 value.reshape", saves=False, kernels=0, bwd_ops=(
            bwd_kernel("value_reshape.backward", v, v, "transpose"),))]
    x = T * (2 * d.kd * a + d.vd * a + d.nv * (a + FP32))  # q, k, v, beta, g
    return [memory("rule.split", 0, 0, f"{SRC_525}:793-797 tensor_split", saves=False, kernels=0, bwd_ops=(
        bwd_kernel("rule.split.slice_backward", x, x, kernels=5),))]


def _cat(d: _Dims, sh: Shape) -> list[Op]:
    """5.25 (splits_at_kept_states): the rule's output cat'ed with the kept states' (none: a copy, :834); its
    backward slices the gradient (views)."""
    if not splits_at_kept_states():
        return []
    x = d.T * d.vd * sh.act
    return [memory("rule.out_cat", x, x, f"{SRC_525}:834 torch.cat", saves=False,
                   bwd_ops=(no_kernel("rule.out_cat.backward"),))]


def _bmm(name: str, m: float, n: float, k: float, batch: float, sh: Shape, src: str, operands: bool = True,
         grad: bool = True) -> list[Op]:
    """One batched matmul of fp32 operands (A: m x k, B: k x n, `batch` of them): under autocast each operand is
    cast to the 16-bit dtype first (autocast's lower-precision list). Its backward is a GEMM's (derived.backward:
    A's gradient as a dgrad, B's as a wgrad, though B is an activation); `operands` False: B needs no gradient (the
    zero initial state), so the backward computes A's only; `grad` False: nothing downstream needs its gradient."""
    ops = []
    if _autocast(sh):  # each operand's cast; its backward casts the operand's gradient back, where one is needed
        for j, (x, needed) in enumerate(((m * k * batch, grad), (k * n * batch, grad and operands))):
            ops.append(memory(f"{name}.autocast{j}", x * FP32, x * sh.act, "torch.autocast (bmm)", saves=False,
                              grad=needed, **DOWNCAST))
    return ops + [gemm(name, m, n, k, sh, src, batch=batch, wgrad=operands)._replace(dtype=rule_dtype(sh), grad=grad)]


def _autocast(sh: Shape) -> bool:
    """The rule's matmuls run under autocast (16-bit products of its fp32 tensors)."""
    return sh.autocast and sh.act != FP32


def _promoted(name: str, x: float, sh: Shape) -> tuple[Op, ...]:
    """Under autocast, a 16-bit bmm output combined with an fp32 tensor promotes to fp32: its gradient is cast back
    to the bmm's dtype (grad_cast); none otherwise."""
    return grad_cast(f"{name}.grad_cast", x, FP32, sh.act) if _autocast(sh) else ()


def rule_dtype(sh: Shape) -> str:
    """The dtype the rule's matmuls run in: fp32 (:413-416; TF32 where the setup allows it), the 16-bit one under
    autocast."""
    if sh.autocast and sh.act != FP32:
        return sh.dtype
    return "tf32" if sh.dtype == "tf32" else "fp32"


def _rule(d: _Dims, sh: Shape) -> list[Op]:
    """torch_chunk_gated_delta_rule (:371-509), fp32 (F bytes), at the padded length."""
    a, F, C = sh.act, FP32, CHUNK
    T, Tp, nv, dk, dv = d.T, d.Tp, d.nv, d.dk, d.dv
    xk, xv, xh = T * nv * dk, T * nv * dv, T * nv  # key-, value-wide and per-head elements
    pk, pv, ph = Tp * nv * dk, Tp * nv * dv, Tp * nv
    cc = Tp * nv * C  # the (chunk x chunk) tensors of all chunks
    ops: list[Op] = []
    if d.nk != d.nv:  # repeat_interleave of q and k (:408-410); its backward sums the copies
        for n in ("q", "k"):
            ops.append(memory(f"rule.repeat_{n}", d.T * d.kd * a, xk * a, f"{SRC}:409-410", saves=False))
    if a != F:  # .transpose(1, 2).to(float32, contiguous) (:413-416) of q, k, v, beta (the decay is fp32 already)
        for n, x in (("q", xk), ("k", xk), ("v", xv), ("beta", xh)):
            ops.append(memory(f"rule.{n}.to_fp32", x * a, x * F, f"{SRC}:413-416", saves=False, **UPCAST))
    for n in ("q", "k"):
        ops += _l2norm(f"rule.l2norm_{n}", xk, xh)
    ops.append(memory("rule.q_scale", xk * F, xk * F, f"{SRC}:423 query * scaling"))
    ops.append(memory("rule.pad", (2 * xk + xv + 2 * xh) * F, (2 * pk + pv + 2 * ph) * F, f"{SRC}:427-428 F.pad",
                      kernels=5, saves=False))
    ops += [_row_scale("rule.v_beta", pv, ph, f"{SRC}:435"), _row_scale("rule.k_beta", pk, ph, f"{SRC}:436"),
            memory("rule.mask", C * C * BOOL, 2 * C * C * BOOL, f"{SRC}:445 ones().triu(1)", kernels=2, grad=False),
            memory("rule.cumsum", ph * F, ph * F, f"{SRC}:449 cumsum"),
            memory("rule.pairwise_sub", 2 * ph * F, cc * F, f"{SRC}:454", bwd_ops=(  # each operand's gradient
                # summed back to its broadcast shape, the subtrahend's negated first
                bwd_kernel("rule.pairwise_sub.backward", cc * F, ph * F, "reduce"),
                bwd_kernel("rule.pairwise_sub.backward_neg", cc * F, cc * F),
                bwd_kernel("rule.pairwise_sub.backward_sum", cc * F, ph * F, "reduce")), **BROADCAST),
            memory("rule.pairwise_mask", cc * F + C * C * BOOL, cc * F, f"{SRC}:455 masked_fill"),
            memory("rule.pairwise_exp", cc * F, cc * F, f"{SRC}:456 exp")]
    intra = Tp / C * nv  # (chunk x chunk) products: sequences x heads x chunks
    for n in ("ut_system", "intra_attn"):  # (k_beta | query) @ key^T, times the pairwise decays (:459-460)
        ops += _bmm(f"rule.{n}", C, C, dk, intra, sh, f"{SRC}:459-460")
        ops.append(memory(f"rule.{n}_decay", 2 * cc * F, cc * F, f"{SRC}:459-460", bwd_ops=(  # both operands' grads
            bwd_kernel(f"rule.{n}_decay.backward", 2 * cc * F, cc * F),
            bwd_kernel(f"rule.{n}_decay.backward_b", 2 * cc * F, cc * F), *_promoted(f"rule.{n}_decay", cc, sh))))
    ops += [memory("rule.cum_decay_exp", ph * F, ph * F, f"{SRC}:461"),
            _row_scale("rule.decayed_k_beta", pk, ph, f"{SRC}:461")]
    # the two unitriangular solves (:470-471), each reading the system and its right-hand side; backward (torch
    # FunctionsManual.cpp linalg_solve_triangular_backward): the transposed solve for the right-hand side's
    # gradient, then the system's: -(gB @ X^T) (a bmm, listed below) masked to its strict lower triangle (neg, tril)
    for n, x in (("new_values", pv), ("k_cumdecay", pk)):
        ops.append(memory(f"rule.solve_{n}", (cc + x) * F, x * F, f"{SRC}:470-471 linalg.solve_triangular", bwd_ops=(
            bwd_kernel(f"rule.solve_{n}.backward", (cc + x) * F, x * F),
            bwd_kernel(f"rule.solve_{n}.backward_neg", cc * F, cc * F),
            bwd_kernel(f"rule.solve_{n}.backward_tril", cc * F, cc * F))))
        ops.append(_solve_grad_gemm(n, C, x / cc * C, intra, sh))
    state = d.b * nv * dk * dv  # one recurrent state per sequence and head
    ops += [memory("rule.state_zeros", 0, state * F, f"{SRC}:482 zeros", grad=False),
            memory("rule.out_zeros", pv * F, pv * F, f"{SRC}:485 zeros_like", grad=False),
            memory("rule.q_decay_exp", ph * F, ph * F, f"{SRC}:488"),
            _row_scale("rule.q_decay", pk, ph, f"{SRC}:488"),
            memory("rule.k_decay_sub", (ph + d.b * nv * d.chunks) * F, ph * F, f"{SRC}:489", **BROADCAST),
            memory("rule.k_decay_exp", ph * F, ph * F, f"{SRC}:489"),
            _row_scale("rule.k_decay", pk, ph, f"{SRC}:489"),
            memory("rule.chunk_decay", d.b * nv * d.chunks * F, d.b * nv * d.chunks * F, f"{SRC}:490")]
    ops += _scan_index(d) + _scan(d, sh, state) + _grad_sums(d)
    ops += [memory("rule.out_copy", pv * F, pv * F, f"{SRC}:505-508 the fp32 output's copy", saves=False)]
    if a != F:
        ops.append(memory("rule.out.to_dtype", xv * F, xv * a, f"{SRC}:508", saves=False, **DOWNCAST))
    return ops


def _row_scale(name: str, x: float, rows: float, src: str) -> Op:
    """x (fp32) times a per-row factor broadcast along it (`t * f.unsqueeze(-1)`). Backward (derivatives.yaml mul):
    grad times the factor, grad times x, and that summed back over the row to the factor's shape."""
    F = FP32
    return memory(name, (x + rows) * F, x * F, src, bwd_ops=(
        bwd_kernel(f"{name}.backward", (x + rows) * F, x * F, "strided"),
        bwd_kernel(f"{name}.backward_factor", 2 * x * F, x * F),
        bwd_kernel(f"{name}.backward_sum", x * F, rows * F, "reduce")), **BROADCAST)


def _l2norm(name: str, x: float, rows: float) -> list[Op]:
    """l2norm (:364-367) of x elements in fp32 rows: x * x, sum, + eps, rsqrt, x * inv_norm. Backward
    (derivatives.yaml): the product's two gradients (grad·inv_norm, grad·x summed over the row), rsqrt's three
    kernels, the sum's none (an expand), x * x's two products and x's three gradients summed (two adds)."""
    F, src = FP32, f"{SRC}:364-367 l2norm"

    def k(n, r, w, access="vector"):
        return bwd_kernel(f"{name}.{n}", r * F, w * F, access)
    return [memory(f"{name}.square", 2 * x * F, x * F, src, bwd_ops=(
                k("square.backward", x + rows, x, "strided"), k("square.backward_b", x + rows, x, "strided"),
                k("grad_sum", 6 * x, 3 * x))),
            memory(f"{name}.sum", x * F, rows * F, src, bwd_ops=(no_kernel(f"{name}.sum.backward"),), **REDUCE),
            memory(f"{name}.rsqrt", 2 * rows * F, 2 * rows * F, src, kernels=2, bwd_ops=(
                k("rsqrt.backward_pow", rows, rows), k("rsqrt.backward_mul", rows, rows),
                k("rsqrt.backward", 2 * rows, rows))),
            memory(f"{name}.mul", (x + rows) * F, x * F, src, bwd_ops=(
                k("mul.backward", x + rows, x, "strided"), k("mul.backward_x", 2 * x, x),
                k("mul.backward_sum", x, rows, "reduce")), **BROADCAST)]


def _grad_sums(d: _Dims) -> list[Op]:
    """Backward only: autograd sums the gradients of the rule's tensors read more than once (input_buffer.cpp
    InputBuffer::add, one add of two gradients per extra read): the pairwise decays (both products, :459-460), the
    UT system (both solves), the padded key (both products and its decay, :489: 2), the query (:460, :488),
    k_beta (:459, :461), beta (:435-436), each chunk's v_new but the last's (:498, :500)."""
    F, C = FP32, CHUNK
    pk, cc, ph = d.Tp * d.nv * d.dk, d.Tp * d.nv * C, d.Tp * d.nv
    cv = d.b * d.nv * C * d.dv
    x = 2 * cc + 4 * pk + ph + (d.chunks - 1) * cv
    return [memory("rule.grad_sums", 0, 0, "autograd InputBuffer::add", saves=False, kernels=0, bwd_ops=(
        bwd_kernel("rule.grad_sums", 2 * x * F, x * F, kernels=7 + d.chunks),))]


def _scan_index(d: _Dims) -> list[Op]:
    """Backward only: the scan reads chunk i of new_values, k_cumdecay, the decayed query and intra-chunk attention
    (:496-498) and, but in the last chunk, the decayed key (:500): each select's backward writes the whole tensor
    zero-filled around the chunk's gradient (select_backward), and autograd sums the chunks' (InputBuffer::add)."""
    F, C, n = FP32, CHUNK, d.chunks
    pk, pv, cc = d.Tp * d.nv * d.dk, d.Tp * d.nv * d.dv, d.Tp * d.nv * C
    read_every_chunk = pv + 2 * pk + cc
    selects = n * (read_every_chunk / n + read_every_chunk) + (n - 1) * (pk / n + pk)
    sums = (n - 1) * read_every_chunk + max(n - 2, 0) * pk
    return [memory("rule.scan_index", 0, 0, f"{SRC}:496-500 chunk i of each tensor", saves=False, kernels=0,
                   bwd_ops=(bwd_kernel("rule.scan_index.select_backward", selects * F, 0, kernels=5 * n - 1),
                            bwd_kernel("rule.scan_index.grad_sum", 2 * sums * F, sums * F, kernels=4 * (n - 1))))]


def _solve_grad_gemm(name: str, c: int, width: float, batch: float, sh: Shape) -> Op:
    """The system's gradient of a solve: gB (chunk x width) @ X^T (width x chunk), batched per chunk; a backward-only
    GEMM, listed as a forward op with no forward cost (`backward` keeps only its dgrad, of those shapes)."""
    return memory(f"rule.solve_{name}.grad_gemm", 0, 0, "FunctionsManual.cpp linalg_solve_triangular_backward",
                  saves=False, kernels=0, bwd_ops=(
                      Op(f"rule.solve_{name}.system_grad", "gemm", rule_dtype(sh), c, c, width, batch),))


def _scan(d: _Dims, sh: Shape, state: float) -> list[Op]:
    """The sequential scan over chunks (:493-500), per chunk: v_new = new_values - k_cumdecay @ S, the state read
    q @ S, the output intra @ v_new + it, written into core_attn_out (copy_), and the state update S * decay +
    key^T @ v_new. The first chunk reads the zero initial state, which needs no gradient (its two reads' backward
    computes the left operand's only); the last chunk's update feeds only the final state, dropped in training
    (:503: output_final_state False), so it has no backward."""
    F, C, nv, dk, dv, b = FP32, CHUNK, d.nv, d.dk, d.dv, d.b
    cv = b * nv * C * dv  # one chunk's value-wide tensor
    src = f"{SRC}:493-500"
    ops: list[Op] = []
    for i in range(d.chunks):
        first, last = i == 0, i == d.chunks - 1
        ops += _bmm("rule.scan_kS", C, dv, dk, b * nv, sh, src, operands=not first)
        ops.append(memory("rule.scan_v_new", 2 * cv * F, cv * F, src, bwd_ops=(  # the subtrahend's gradient negated
            bwd_kernel("rule.scan_v_new.backward_neg", cv * F, cv * F), *_promoted("rule.scan_v_new", cv, sh))))
        ops += _bmm("rule.scan_qS", C, dv, dk, b * nv, sh, src, operands=not first)
        ops += _bmm("rule.scan_intra", C, dv, C, b * nv, sh, src)
        ops += [memory("rule.scan_out_add", 2 * cv * F, cv * F, src),
                # (under autocast the 16-bit sum copied into the fp32 output: the gradient's slice cast back)
                memory("rule.scan_out_copy", 2 * cv * F, cv * F, f"{SRC}:498 core_attn_out[:, :, i] =", saves=False,
                       bwd_ops=_promoted("rule.scan_out_copy", cv, sh) or ()),
                memory("rule.scan_state_decay", (2 * state + b * nv) * F, state * F, src, grad=not last,
                       **BROADCAST)]
        ops += _bmm("rule.scan_update", dk, dv, C, b * nv, sh, src, grad=not last)
        ops.append(memory("rule.scan_state_add", 2 * state * F, state * F, src, grad=not last,
                          bwd_ops=(bwd_kernel("rule.scan_state_add.backward", 0, 0, kernels=0),
                                   *_promoted("rule.scan_state_add", state, sh))))
    return ops


def _gated_norm(spec: ModelSpec, d: _Dims, sh: Shape) -> list[Op]:
    """Qwen3NextRMSNormGated (:59-75) over value_head_dim, per token and value head: HF's eager RMSNorm in fp32 with
    the weight multiplying the normalised input cast back to the input dtype (:72), then the gate z cast to fp32, its
    SiLU, the product (fp32) and the cast back (:73-75)."""
    a, F, x = sh.act, FP32, d.T * d.vd
    src = f"{SRC}:59-75 Qwen3NextRMSNormGated"
    # the weight times the normalised input in the input dtype: fp32 where the weight is (type promotion, autocast)
    ops = hf_rms_norm(spec, "gated_norm", d.T * d.nv, int(d.dv), sh, "", max(a, sh.weight), a, zero_centred=False)
    if a != F:
        ops.append(memory("gated_norm.z.to_fp32", x * a, x * F, src, saves=False, **UPCAST))
    ops += [memory("gated_norm.silu", x * F, x * F, src),
            memory("gated_norm.gate_mul", x * (a + F), x * F, src, bwd_ops=(  # the normed input's gradient cast
                bwd_kernel("gated_norm.gate_mul.backward", 2 * x * F, x * F),  # back to its dtype (type promotion)
                bwd_kernel("gated_norm.gate_mul.backward_gate", x * (a + F), x * F),
                *grad_cast("gated_norm.gate_mul.grad_cast", x, F, a)))]
    if a != F:
        ops.append(memory("gated_norm.to_dtype", x * F, x * a, src, saves=False, **DOWNCAST))
    return ops


def _conv_update(d: _Dims, sh: Shape) -> list[Op]:
    """A decode step's conv (causal_conv1d_update, :320-336): the reordering copies and the q, k, v cat as in the
    prefill, then the cached conv state (conv_kernel positions) and the token cat'ed, the last conv_kernel positions
    copied back into the state, F.conv1d without padding (two positions, the last kept) and SiLU. Inference only: no
    backward. NB: read off the code, not checked against a trace (the ops test compares training layers)."""
    a, T, cd, K = sh.act, d.T, d.cd, d.K
    reorder = T * (2 * d.vd + 2 * d.nv + 2 * d.kd) * a
    qkv, window = T * cd * a, T * cd * (K + 1) * a
    src = f"{SRC}:320-336 causal_conv1d_update"
    return [memory("reorder_copies", reorder, reorder, f"{SRC}:652-655,681 reshape copies", kernels=6),
            memory("qkv_cat", qkv, qkv, f"{SRC}:683 torch.cat(q, k, v)"),
            memory("conv_state_cat", window, window, src),
            memory("conv_state_copy", T * cd * K * a, T * cd * K * a, src),
            memory("conv1d", window + cd * K * sh.weight, 2 * qkv, src),
            memory("conv_silu", qkv, qkv, src)] + cache_count(sh, f"{SRC_525}:402")


def _recurrent_rule(d: _Dims, sh: Shape) -> list[Op]:
    """A decode step's rule (torch_recurrent_gated_delta_rule, :513-577) at one token per sequence, fp32: the casts
    and l2 norms as in the chunked rule, then on the (key_head_dim x value_head_dim) state of each sequence and
    value head: its decay (exp, product), the product with k_t and its sum over the key width (kv_mem), the delta
    (v_t - kv_mem) * beta_t, the outer product k_t delta^T and its add, the product with q_t and its sum (the
    output), written into the output and cast back. Inference only: no backward.
    NB: read off the code, not checked against a trace (the ops test compares training layers)."""
    a, F = sh.act, FP32
    T, nv = d.T, d.nv
    xk, xv, xh = T * nv * d.dk, T * nv * d.dv, T * nv
    state = T * nv * d.dk * d.dv  # one state per sequence (T sequences of one token)
    ops: list[Op] = []
    if d.nk != d.nv:
        ops += [memory(f"rule.repeat_{n}", T * d.kd * a, xk * a, f"{SRC}:534-535") for n in ("q", "k")]
    if a != F:
        ops += [memory(f"rule.{n}.to_fp32", x * a, x * F, f"{SRC}:538-541", **UPCAST)
                for n, x in (("q", xk), ("k", xk), ("v", xv), ("beta", xh))]
    for n in ("q", "k"):
        ops += _l2norm(f"rule.l2norm_{n}", xk, xh)
    ops += [memory("rule.q_scale", xk * F, xk * F, f"{SRC}:548"),
            memory("rule.out_zeros", xv * F, xv * F, f"{SRC}:557 zeros_like"),
            memory("rule.decay_exp", xh * F, xh * F, f"{SRC}:563"),
            memory("rule.state_decay", (state + xh) * F, state * F, f"{SRC}:564", **BROADCAST),
            memory("rule.kv_mem_mul", (state + xk) * F, state * F, f"{SRC}:567", **BROADCAST),
            memory("rule.kv_mem_sum", state * F, xv * F, f"{SRC}:567", **REDUCE),
            memory("rule.delta", (3 * xv + xh) * F, 2 * xv * F, f"{SRC}:568", kernels=2),
            memory("rule.outer", (xk + xv) * F, state * F, f"{SRC}:569", **BROADCAST),
            memory("rule.state_add", 2 * state * F, state * F, f"{SRC}:569"),
            memory("rule.out_mul", (state + xk) * F, state * F, f"{SRC}:571", **BROADCAST),
            memory("rule.out_sum", state * F, xv * F, f"{SRC}:571", **REDUCE),
            memory("rule.out_copy", 2 * xv * F, xv * F, f"{SRC}:571 core_attn_out[:, :, i] =")]
    if a != F:
        ops.append(memory("rule.out.to_dtype", xv * F, xv * a, f"{SRC}:576", **DOWNCAST))
    return ops
