"""Cost functions of Nemotron-H's Mamba-2 mixer (the block in place of attention on its "M" layers) and of the
block's own RMSNorm, as transformers runs them without the `mamba_ssm` / `causal_conv1d` kernels: the torch
fallbacks of models/nemotron_h/modeling_nemotron_h.py (transformers 5.24): NemotronHMamba2Mixer.forward :468-613,
causal_conv1d_fn :164-183, mamba2_chunk_scan :274-378 (segment_sum :111-128, reshape_into_chunks :91-108),
NemotronHRMSNormGated :56-74, NemotronHRMSNorm :617-633; a decode step's causal_conv1d_update :144-160 and
mamba2_selective_state_update :212-270; under transformers 5.25 also mamba2_scan_forward's split, cat and state
commit (gated_deltanet.splits_at_kept_states). Every elementwise kernel is one op with the bytes it reads and writes
(symbols of analytic/mamba2.py: T tokens, Tp padded to whole chunks of Q, H heads of P channels, state N, G groups,
c chunks); each torch.einsum is the copies sumproduct_pair makes of operands whose permuted layout is not viewable
(aten/src/ATen/native/Linear.cpp: `.reshape`) and one batched GEMM.
NB: this is the reference PyTorch path, the one the trace engine runs. On a GPU with `mamba_ssm` and
`causal_conv1d` installed transformers runs their fused Triton/CUDA kernels instead (mamba_chunk_scan_combined,
mamba_split_conv1d_scan_combined in training: conv, scan, gated norm and out_proj in a handful of kernels, none of
the (Tp, H, Q) intermediates nor the permuted copies in HBM), so the op list's memory-bound time over-counts such a
run's (pessimistic), while its GEMM FLOPs are the same matmuls.
The scan's einsums run in fp32 (x, B, C upcast, :298-300; TF32 where the setup allows it), in the 16-bit dtype under
autocast (bmm is on autocast's lower-precision list): their fp32 operands cast first, their gradients cast back, and
a 16-bit output combined with an fp32 tensor promotes, so its gradient is cast back too.
CUDA's autocast lists einsum itself (autocast_mode.cpp KERNEL_CUDA(einsum, lower_precision_fp); the trace's CUDA
semantics too, trace/cuda_autocast.py): the fp32 operands are cast before their permuted copies, which move 16-bit
bytes.
tests/analytic/test_ops_vs_trace.py checks tiny-nemotron-h's three kinds of block in amp-bf16 (GEMM shapes and casts
exact, a Mamba block's other bytes +0.18 % forward, -0.43 % backward; under 5.25 +0.17 % / -0.42 %); checked once when
written against the trace of a Mamba block in bf16 (+0.23 % / -0.45 %), fp32 (+0.22 % / -0.91 %), at a padded last
chunk (2 x 120: +0.16 % / +1.06 %) and with head width, state, chunk and groups all distinct (P 8, N 32, Q 32, G 4, H
12 at 2 x 100: GEMM shapes and casts exact, +0.14 % / +0.25 %); kernels launched: 102 / 148 listed, 102 / 151 traced.
tests/analytic/test_mamba2_ops.py checks a Mamba block's inference lists against the trace's inference step (bf16, 2 x
128): GEMM shapes exact, prefill bytes +0.9 % (91 of 95 kernels: the cache's conv-state and final-state writes not
listed; 5.25: +0.9 %, 96 of 100, its token counter not listed either, its zero state listed), decode +0.4 % (45 of 46;
5.25: +0.4 %, 51 of 52), the trace's in-place copy_ into a state counted as the bytes it moves. Under autocast the
decode step runs no weight casts (autocast's cache made them in the prefill: infer_time drops them, ops/cast.py
uncached; with them the decode list read -30.7 % of the trace, +4.9 % without).
"""
from __future__ import annotations

from typing import Callable

from ...spec import ModelSpec
from ..activations import FP32
from .cast import autocast_inputs
from .gated_deltanet import cache_count, rule_dtype, splits_at_kept_states
from .norm import hf_rms_norm
from .op import (BROADCAST, DOWNCAST, UPCAST, Op, Shape, add_backward, bwd_kernel, gemm, grad_cast, memory,
                 no_kernel)

SRC = "modeling_nemotron_h.py"
SRC_525 = "modeling_nemotron_h.py (5.25)"
SCAN = "scan."  # the prefix of the scan's ops: its matmuls multiply activations, not weights (no weight casts)
BOOL = 1


class _Dims:
    """One rank's widths of the mixer (1/tp of its heads and groups, NB: as vLLM splits them; training under --tp
    is refused by hybrid_training.check_trainable) and the scan's padded token count."""

    def __init__(self, spec: ModelSpec, sh: Shape):
        m, t = spec.hybrid, sh.tp
        self.h, self.p, self.n = m.ssm_heads / t, m.ssm_head_dim, m.d_state
        self.g = max(m.n_groups / t, 1)
        self.inner = self.h * self.p
        self.cd = self.inner + 2 * self.g * self.n  # the conv's channels: x, B, C
        self.K, self.Q = m.conv_kernel, m.chunk_size
        self.b, self.s = sh.batch, sh.seq / sh.cp
        self.T = sh.tokens
        self.c = -(-int(self.s) // self.Q)  # chunks per sequence
        self.Tp = self.b * self.c * self.Q  # the tokens padded to whole chunks (:302)
        self.conv_bias = m.conv_bias


def scan_autocast(sh: Shape) -> bool:
    """The scan's einsums run under autocast (16-bit products of its fp32 tensors)."""
    return sh.autocast and sh.act != FP32


def block_norm(spec: ModelSpec, name: str, sh: Shape, group: str) -> list[Op]:
    """NemotronHRMSNorm (:617-633) over the residual stream: HF's RMSNorm kernels up to the normalised fp32 tensor
    (hf_rms_norm), then, unlike Llama's, the weight cast to fp32 (`self.weight.to(torch.float32)`, none where it is
    fp32), the product in fp32 and the cast of the product back to the input dtype (none where it is fp32)."""
    r, w, T, h = sh.residual, sh.weight, sh.norm_tokens, spec.hidden
    src = f"{SRC}:626-633 NemotronHRMSNorm"
    ops = [o for o in hf_rms_norm(spec, name, T, h, sh, group, FP32, r, zero_centred=False)
           if not o.name.endswith(".to_dtype")]  # (cast after the weight's product here)
    weight = ops.pop()
    if w != FP32:
        ops.append(memory(f"{name}.weight.to_fp32", h * w, h * FP32, src, saves=False, **UPCAST))
    ops.append(weight)
    if r != FP32:
        ops.append(memory(f"{name}.to_dtype", T * h * FP32, T * h * r, src, saves=False, **DOWNCAST))
    return ops


def mamba_mixer(spec: ModelSpec, sh: Shape, ops: list[Op], proj: Callable[..., Op]) -> None:
    """Appends to `ops` one Mamba-2 mixer: in_proj (:486), A = -exp(A_log) (:488), the depthwise causal conv and SiLU
    (or, decoding, the conv-state update), the chunked scan (or the recurrent state update), the gated RMSNorm and
    out_proj (:609-612)."""
    d, h, m = _Dims(spec, sh), spec.hidden, spec.hybrid
    ops += autocast_inputs("mamba_in", d.T, h, 1, sh, "mamba_in")
    proj("in_proj", m.ssm_inner + m.conv_dim + m.ssm_heads, h, d.inner + d.cd + d.h, h, m.proj_bias,
         f"{SRC}:486 in_proj")
    ops += _a(d, sh)
    # 5.25 (splits_at_kept_states): mamba2_scan_forward (:408-539) computes A again (:445)
    again = _a(d, sh, f"{SRC_525}:445") if splits_at_kept_states() else []
    if sh.decode:  # one cached token per sequence (:521-527, :556-579)
        ops += _conv_update(d, sh) + again + _state_update(d, sh)
    else:
        ops += _conv(d, sh) + again + _split(d, sh) + _scan(d, sh) + _cat(d, sh)
    ops += _gated_norm(spec, d, sh) + ([] if sh.decode else _grad_sums(d, sh))
    if sh.act != FP32 and not sh.autocast:  # `scan_output.to(dtype)` (:612): the fp32 norm output to the input's
        x = d.T * d.inner
        ops.append(memory("out_proj_in.to_dtype", x * FP32, x * sh.act, f"{SRC}:612", saves=False, **DOWNCAST))
    else:  # (under autocast the block's input is fp32: the cast is autocast's, of out_proj's input)
        ops += autocast_inputs("out_proj_in", d.T, d.inner, 1, sh, "mamba_out")
    proj("out_proj", h, m.ssm_inner, h, d.inner, m.proj_bias, f"{SRC}:612 out_proj")


def _a(d: _Dims, sh: Shape, src: str = f"{SRC}:488") -> list[Op]:
    """A = -exp(self.A_log.float()) (:488): the cast (none where the weights are fp32), exp and negation, H each."""
    w = sh.weight
    ops = [memory("a_log.to_fp32", d.h * w, d.h * FP32, src, saves=False, **UPCAST)] if w != FP32 else []
    return ops + [memory("a_log.exp", d.h * FP32, d.h * FP32, src), memory("a_log.neg", d.h * FP32, d.h * FP32, src)]


def _conv(d: _Dims, sh: Shape) -> list[Op]:
    """causal_conv1d_fn (:164-183): `hidden_states.to(weight.dtype)` (under autocast the 16-bit x|B|C to the fp32
    weight's dtype, then autocast's casts of it, of the weight and of the bias for conv1d), F.conv1d depthwise over
    K - 1 padded positions, sliced back (backward: the slice's zero-filled gradient, then convolution_backward: the
    input's, the weight's and the bias's gradients) and SiLU."""
    a, w, T, cd, K = sh.act, sh.weight, d.T, d.cd, d.K
    x, weight, bias = T * cd, cd * K, cd if d.conv_bias else 0
    out = d.b * cd * (d.s + K - 1)
    src = f"{SRC}:174-182 causal_conv1d_fn"
    ops: list[Op] = []
    if sh.autocast and a != w:
        ops += [memory("conv_in.to_fp32", x * a, x * w, f"{SRC}:175", saves=False, **UPCAST),
                memory("conv_bias.autocast", bias * w, bias * a, "torch.autocast (conv1d)", saves=False,
                       kernels=1 if bias else 0, **DOWNCAST),
                memory("conv_weight.autocast", weight * w, weight * a, "torch.autocast (conv1d)", saves=False,
                       **DOWNCAST),
                memory("conv_in.autocast", x * w, x * a, "torch.autocast (conv1d)", saves=False, **DOWNCAST)]
    ops += [memory("conv1d", (x + weight + bias) * a, out * a, f"{src} F.conv1d depthwise", bwd_ops=(
                bwd_kernel("conv1d.slice_backward", x * a, out * a),
                bwd_kernel("conv1d.backward", (out + x + weight) * a, (x + weight + bias) * a))),
            memory("conv_silu", x * a, x * a, f"{src} SiLU", bwd_ops=(
                bwd_kernel("conv_silu.backward", 3 * x * a, x * a),))]  # silu_backward: grad, input -> grad
    return ops


def _split(d: _Dims, sh: Shape) -> list[Op]:
    """5.25 (splits_at_kept_states): the zero state of a scan without a cache (:508: `A.new_zeros(batch, heads)`,
    unused; NB: listed in the prefill too, whose scan's final state takes its place: one kernel of b·H fp32 over);
    and tensor_split of x, dt, B and C at the kept states (:473-478; none kept: the scan's part is the whole tensor),
    views whose backward writes each gradient whole (slice_backward: reads it, writes it zero-filled around it)."""
    if not splits_at_kept_states():
        return []
    x = d.T * (d.inner + d.h + 2 * d.g * d.n) * sh.act  # x, dt, B, C: in_proj's and the conv's outputs
    return [memory("scan.zero_state", 0, d.b * d.h * FP32, f"{SRC_525}:508 new_zeros", saves=False, grad=False),
            memory("scan.split", 0, 0, f"{SRC_525}:473-478 tensor_split", saves=False, kernels=0, bwd_ops=(
                bwd_kernel("scan.split.slice_backward", x, x, kernels=4),))]


def _cat(d: _Dims, sh: Shape) -> list[Op]:
    """5.25 (splits_at_kept_states): the scan's fp32 output cat'ed with the kept states' (none: a copy, :530); its
    backward slices the gradient (views)."""
    if not splits_at_kept_states():
        return []
    x = d.T * d.inner * FP32
    return [memory("scan.out_cat", x, x, f"{SRC_525}:530 torch.cat", saves=False,
                   bwd_ops=(no_kernel("scan.out_cat.backward"),))]


def _mul(name: str, r: float, w: float, src: str, bwd: tuple[float, float] | None = None, **kw) -> Op:
    """A product of two tensors (r bytes read, w written): its backward the two operands' gradients, each a product
    of the output's gradient and the other operand (`bwd`: each gradient's (reads, writes); default both as the
    forward's)."""
    br, bw = bwd if bwd is not None else (r, w)
    return memory(name, r, w, src, bwd_ops=(bwd_kernel(f"{name}.backward", br, bw),
                                            bwd_kernel(f"{name}.backward_b", br, bw)), **kw)


def _einsum(name: str, m: float, n: float, k: float, batch: float, copies: tuple[tuple[float, int], ...],
            casts: tuple[float, ...], sh: Shape, src: str, grad_copy: bool = True) -> list[Op]:
    """One torch.einsum of the scan: the contiguous copies of its operands (`copies`: (elements, bytes each)),
    autocast's casts of its fp32 operands (`casts`: their elements; none outside autocast) and the bmm (m x k by
    k x n, `batch` of them). Backward: the output's gradient made contiguous for the bmm's backward (`grad_copy`;
    none for C·Bᵀ, whose gradient M's product writes in the bmm's layout), the bmm's two gradients (derived.backward:
    a dgrad and a wgrad, though both operands are activations), each cast operand's gradient cast back; the operand
    copies' backward is none (a reshape's gradient is a view)."""
    out = m * n * batch * (sh.act if scan_autocast(sh) else FP32)
    low = scan_autocast(sh)  # the copies are of the operands autocast cast (CUDA's list has einsum): 16-bit
    ops = [memory(f"{name}.copy{j}", x * (sh.act if low else nb), x * (sh.act if low else nb),
                  f"{src} (einsum operand copy)", saves=False, access="transpose",
                  bwd_ops=(no_kernel(f"{name}.copy{j}.backward"),)) for j, (x, nb) in enumerate(copies)]
    if scan_autocast(sh):
        ops += [memory(f"{name}.autocast{j}", x * FP32, x * sh.act, "torch.autocast (bmm)", saves=False, **DOWNCAST)
                for j, x in enumerate(casts)]
    ops.append(gemm(name, m, n, k, sh, src, batch=batch)._replace(dtype=rule_dtype(sh)))
    if grad_copy:  # (listed after the bmm: the backward runs in reverse)
        ops.append(memory(f"{name}.grad_copy", 0, 0, f"{src} (the output gradient's copy)", saves=False, kernels=0,
                          bwd_ops=(bwd_kernel(f"{name}.grad_copy", out, out, "transpose"),)))
    return ops


def _row_scale(name: str, x: float, rows: float, src: str, nb: int = FP32, out: int = FP32) -> list[Op]:
    """x (`nb` bytes each) times a per-row fp32 factor broadcast along it, written in `out` bytes. Backward
    (derivatives.yaml mul): grad times the factor (x's gradient, cast back to `nb` where the product promoted it),
    grad times x, and that summed over the row to the factor's shape."""
    F = FP32
    return [memory(name, x * nb + rows * F, x * out, src, bwd_ops=(
        bwd_kernel(f"{name}.backward", x * out + rows * F, x * out, "strided"),
        *grad_cast(f"{name}.grad_cast", x, out, nb),
        bwd_kernel(f"{name}.backward_factor", x * (out + nb), x * out),
        bwd_kernel(f"{name}.backward_sum", x * out, rows * F, "reduce")), **BROADCAST)]


def _segment_sum(name: str, rows: float, q: float, read_rows: float, src: str) -> list[Op]:
    """segment_sum (:111-128) of `rows` rows of q fp32 values (read from `read_rows` distinct ones, the expand of
    :118): each of its two masks made (ones, tril, bitwise_not: q x q booleans), the masked_fill of the expanded
    input, the cumsum over q, the masked_fill to -inf; then the caller's exp. Backward: masked_fill's gradient
    masked, cumsum's as flip, cumsum, flip (FunctionsManual.cpp cumsum_backward), the expand's sum back to the rows."""
    F, x = FP32, rows * q
    mask = q * q * BOOL
    ops = []
    for j in range(2):
        ops.append(memory(f"{name}.mask{j}", 2 * mask, 3 * mask, src, kernels=3, grad=False))
    ops += [memory(f"{name}.fill_zero", read_rows * F + mask, x * F, src, bwd_ops=(
                bwd_kernel(f"{name}.fill_zero.backward", x * F + mask, x * F),
                bwd_kernel(f"{name}.expand.backward_sum", x * F, read_rows * F, "reduce"))),
            memory(f"{name}.cumsum", x * F, x * F, src, bwd_ops=(
                bwd_kernel(f"{name}.cumsum.backward", 3 * x * F, 3 * x * F, kernels=3),)),
            memory(f"{name}.fill_inf", x * F + mask, x * F, src, saves=False),
            memory(f"{name}.exp", x * F, x * F, f"{src} exp")]
    return ops


def _scan(d: _Dims, sh: Shape) -> list[Op]:
    """mamba2_chunk_scan (:274-378): dt's bias, softplus and clamp, the upcasts and head repeats of x, B and C, the
    D skip's padded input, the discretised x·dt and A·dt, the chunking pads, and the SSD algorithm's four steps
    (Dao & Gu 2024 §6): intra-chunk outputs (segment sums, C·Bᵀ, its mask, M·x), chunk states (B_decay·x), the
    inter-chunk recurrence (segment sums of the chunk ends, decay_chunk·states), state-to-output (C·states, its
    decay), the sum, its contiguous copy and the D skip."""
    a, w, F = sh.act, sh.weight, FP32
    e = a if scan_autocast(sh) else F  # the einsums' output dtype
    dtb = F if sh.autocast else a  # dt after softplus: fp32 under CUDA's autocast (analytic/mamba2.dt_bytes)
    T, Tp, H, P, N, G, Q, c, b = d.T, d.Tp, d.h, d.p, d.n, d.g, d.Q, d.c, d.b
    th, ph = T * H, Tp * H  # per-head elements: tokens, padded tokens
    x, px = T * d.inner, Tp * d.inner  # (T|Tp, H, P)
    bn, pn = T * G * N, Tp * H * N  # B (or C) as in_proj makes it, repeated and padded
    pq = Tp * H * Q  # the (Tp, H, Q) intra-chunk tensors
    st = b * H * P * N  # one state per sequence and head
    cs = b * H * (c + 1)  # the chunk ends, padded with the initial one
    ops: list[Op] = []
    if w != a:  # dt_bias.to(dt.dtype) (:293)
        ops.append(memory("scan.dt_bias.to_dtype", H * w, H * a, f"{SRC}:293", saves=False, **DOWNCAST))
    ops.append(memory("scan.dt_bias_add", (th + H) * a, th * a, f"{SRC}:293", bwd_ops=(
        bwd_kernel("scan.dt_bias_add.backward_sum", th * a, H * a, "reduce"),), **BROADCAST))
    if dtb != a:  # softplus on CUDA autocast's fp32 list: dt cast up first
        ops.append(memory("scan.dt.to_fp32", th * a, th * F, f"{SRC}:295 (autocast fp32 list)", saves=False,
                          **UPCAST))
    ops += [memory("scan.softplus", th * dtb, th * dtb, f"{SRC}:295 softplus"),
            # clamp's backward: where(min <= dt <= max, grad, 0): two comparisons, their and, the where
            memory("scan.clamp", th * dtb, th * dtb, f"{SRC}:296 clamp", bwd_ops=(
                bwd_kernel("scan.clamp.backward_mask", 2 * th * dtb, 2 * th * BOOL, kernels=2),
                bwd_kernel("scan.clamp.backward_and", 2 * th * BOOL, th * BOOL),
                bwd_kernel("scan.clamp.backward", th * (dtb + BOOL), th * dtb)))]
    if a != F:  # .float() of x, B, C (:298-300)
        ops += [memory(f"scan.{n}.to_fp32", n_ * a, n_ * F, f"{SRC}:298-300", saves=False, **UPCAST)
                for n, n_ in (("x", x), ("B", bn), ("C", bn))]
    for n in ("B", "C"):  # repeat_interleave to every head (:299-300); its backward sums the groups' copies
        ops.append(memory(f"scan.{n}.repeat", bn * F, T * H * N * F, f"{SRC}:299-300 repeat_interleave",
                          saves=False, bwd_ops=(
                              bwd_kernel(f"scan.{n}.repeat.backward", T * H * N * F, bn * F, "reduce"),)))
    dw = w  # D, a parameter (:305): `D[..., None] * pad(x)`, promoted to fp32
    ops += [memory("scan.d_pad", x * F, px * F, f"{SRC}:305 pad_tensor_by_size", saves=False),
            memory("scan.d_residual", px * F + H * dw, px * F, f"{SRC}:305", bwd_ops=(
                bwd_kernel("scan.d_residual.backward", px * F + H * F, px * F, "strided"),
                bwd_kernel("scan.d_residual.backward_d", 2 * px * F, px * F),
                bwd_kernel("scan.d_residual.backward_sum", px * F, H * F, "reduce"),
                *grad_cast("scan.d_residual.grad_cast", H, F, dw)), **BROADCAST)]
    for n in ("x", "A"):  # dt[..., None].float() (:308), dt.float() (:309): copies where dt is 16-bit
        if dtb != F:
            ops.append(memory(f"scan.dt_{n}.to_fp32", th * dtb, th * F, f"{SRC}:308-309", saves=False, **UPCAST))
        if n == "x":
            ops += _row_scale("scan.x_dt", x, th, f"{SRC}:308 hidden_states * dt")
    ops.append(memory("scan.a_dt", (H + th) * F, th * F, f"{SRC}:309 A * dt", bwd_ops=(
        bwd_kernel("scan.a_dt.backward", th * F + H * F, th * F, "strided"),
        bwd_kernel("scan.a_dt.backward_a", 2 * th * F, th * F),
        bwd_kernel("scan.a_dt.backward_sum", th * F, H * F, "reduce")), **BROADCAST))
    # backward: the four slices of the gradients; those of x, B and C arrive in the einsums' permuted layouts and
    # are made contiguous first (NB: read off the trace's kernel sequence, three copies)
    ops += [memory("scan.chunk_pad", (x + th + 2 * T * H * N) * F, (px + ph + 2 * pn) * F,
                   f"{SRC}:314 reshape_into_chunks (F.pad)", kernels=4, saves=False, bwd_ops=(
                       bwd_kernel("scan.chunk_pad.backward_copy", 2 * (px + 2 * pn) * F, 0, "transpose", 3),
                       bwd_kernel("scan.chunk_pad.backward", (px + ph + 2 * pn) * F, (x + th + 2 * T * H * N) * F,
                                  kernels=4))),
            memory("scan.a_cumsum", ph * F, ph * F, f"{SRC}:317 cumsum", bwd_ops=(
                bwd_kernel("scan.a_cumsum.backward", 3 * ph * F, 3 * ph * F, kernels=3),))]
    # 1. the intra-chunk outputs: L = exp(segment_sum(A)), G = C·Bᵀ, M = G·L, Y_diag = M·x (:321-332)
    ops += _segment_sum("scan.segsum", ph, Q, ph, f"{SRC}:321 segment_sum")
    ops += _einsum("scan.cb", Q, Q, N, b * c * H, ((pn, F), (pn, F)), (pn, pn), sh, f"{SRC}:325 C·Bᵀ",
                   grad_copy=False)
    ops.append(memory("scan.m", pq * (e + F), pq * F, f"{SRC}:328 G * L", bwd_ops=(
        bwd_kernel("scan.m.backward", 2 * pq * F, pq * F), *grad_cast("scan.m.grad_cast", pq, F, e),
        bwd_kernel("scan.m.backward_l", pq * (F + e), pq * F))))
    ops += _einsum("scan.y_diag", Q, P, Q, b * c * H, ((px, F),), (pq, px), sh, f"{SRC}:332 M·x")
    # 2. the chunk states: decay_states, B_decay, B_decayᵀ·x (:336-339)
    ops += [memory("scan.decay_states_sub", (b * H * c + ph) * F, ph * F, f"{SRC}:336", bwd_ops=(
                bwd_kernel("scan.decay_states_sub.backward_neg", ph * F, ph * F),
                bwd_kernel("scan.decay_states_sub.backward_sum", ph * F, b * H * c * F, "reduce")), **BROADCAST),
            memory("scan.decay_states_exp", ph * F, ph * F, f"{SRC}:336 exp")]
    ops += _row_scale("scan.b_decay", pn, ph, f"{SRC}:337 B * decay_states")
    ops += _einsum("scan.states", P, N, Q, b * c * H, ((pn, F), (px, F)), (pn, px), sh, f"{SRC}:339 B_decayᵀ·x")
    # 3. the inter-chunk recurrence: the zero initial state, the cat, decay_chunk, decay_chunk·states (:343-352)
    ops += [memory("scan.initial_state", 0, st * e, f"{SRC}:346 zeros_like", saves=False, grad=False),
            memory("scan.states_cat", (st + c * st) * e, (c + 1) * st * e, f"{SRC}:348 torch.cat", saves=False),
            memory("scan.chunk_ends_pad", b * H * c * F, cs * F, f"{SRC}:349 F.pad", saves=False)]
    ops += _segment_sum("scan.segsum_chunks", cs, c + 1, cs, f"{SRC}:349 segment_sum")
    ops += _einsum("scan.new_states", c + 1, P * N, c + 1, b * H, (((c + 1) * st, e),), (cs * (c + 1),), sh,
                   f"{SRC}:351 decay_chunk·states")
    # 4. the state-to-output conversion: exp(A_cumsum), C·states, its decay; the sum, its copy, D's skip (:356-369)
    ops.append(memory("scan.state_decay_out", ph * F, ph * F, f"{SRC}:356 exp"))
    ops += _einsum("scan.c_states", Q, P, N, b * c * H, ((pn, F), (c * st, e)), (pn,), sh, f"{SRC}:359 C·states")
    ops += _row_scale("scan.y_off", px, ph, f"{SRC}:360 C_times_states * state_decay_out", nb=e)
    # the adds pass their gradient on (Y_diag's cast back where it is 16-bit), a clone's backward is none
    ops += [memory("scan.y_sum", px * (e + F), px * F, f"{SRC}:365 Y_diag + Y_off",
                   bwd_ops=add_backward("scan.y_sum", px, F, e)),
            memory("scan.y_contiguous", px * F, px * F, f"{SRC}:365 .contiguous()", saves=False,
                   bwd_ops=(no_kernel("scan.y_contiguous.backward"),)),
            # (the padded positions cut off, :373, and reshaped to (b, s, inner), :607: views)
            memory("scan.d_skip", 2 * px * F, px * F, f"{SRC}:369 output + D_residual",
                   bwd_ops=(no_kernel("scan.d_skip.backward"),))]
    return ops


def _gated_norm(spec: ModelSpec, d: _Dims, sh: Shape) -> list[Op]:
    """NemotronHRMSNormGated (:56-74) over the scan's fp32 output (T, inner), in groups of inner / G: the gate cast to
    fp32 (none in fp32), its SiLU, the product, then HF's RMSNorm kernels per group (pow, mean, + eps, rsqrt, the
    product) and the weight's product in fp32 (`.to(input_dtype)`: the input is fp32, no copy; a 16-bit weight
    promotes, its gradient cast back)."""
    a, w, F, x = sh.act, sh.weight, FP32, d.T * d.inner
    src = f"{SRC}:63-74 NemotronHRMSNormGated"
    ops: list[Op] = []
    if a != F:
        ops.append(memory("gated_norm.z.to_fp32", x * a, x * F, src, saves=False, **UPCAST))
    ops += [memory("gated_norm.silu", x * F, x * F, src),
            _mul("gated_norm.gate_mul", 2 * x * F, x * F, src, (2 * x * F, x * F))]
    rows, width = d.T * d.g, d.inner / d.g
    ops += hf_rms_norm(spec, "gated_norm", rows, int(width), sh, "", FP32, FP32, zero_centred=False)
    if w != F:  # the weight's gradient, fp32 by the promotion, cast back to the weight (no forward kernel)
        ops.append(memory("gated_norm.weight.grad_cast", 0, 0, src, saves=False, kernels=0,
                          bwd_ops=grad_cast("gated_norm.weight.grad_cast", d.inner, F, w)))
    return ops


def _conv_update(d: _Dims, sh: Shape) -> list[Op]:
    """A decode step's conv (causal_conv1d_update, :144-160) at one token per sequence: the cached conv state (K
    positions) and the token cat'ed, the last K positions copied back into the state, F.conv1d without padding (two
    positions, the last kept) and SiLU; under autocast the window cast to the fp32 weight's dtype (`.to(weight.dtype)`,
    :154), the state copied from it, and autocast's casts of the window and the weight for conv1d (the bias's cast is
    cached from the prefill). Inference only: no backward."""
    a, w, b, cd, K = sh.act, sh.weight, d.b, d.cd, d.K
    src = f"{SRC}:144-160 causal_conv1d_update"
    x = b * cd * (K + 1)  # the window's elements
    ops = [memory("conv_state_cat", x * a, x * a, src)]
    cast = sh.autocast and a != w
    if cast:
        ops.append(memory("conv_window.to_fp32", x * a, x * w, f"{SRC}:154", **UPCAST))
    ops.append(memory("conv_state_copy", b * cd * K * (w if cast else a), b * cd * K * a, f"{SRC}:155 copy_"))
    if cast:
        ops += [memory("conv_weight.autocast", cd * K * w, cd * K * a, "torch.autocast (conv1d)", **DOWNCAST),
                memory("conv_window.autocast", x * w, x * a, "torch.autocast (conv1d)", **DOWNCAST)]
    return ops + [memory("conv1d", x * a + cd * K * a, 2 * b * cd * a, f"{SRC}:156 F.conv1d"),
                  memory("conv_silu", b * cd * a, b * cd * a, f"{SRC}:157-159 SiLU")] + cache_count(
                      sh, f"{SRC_525}:160")


def _state_update(d: _Dims, sh: Shape) -> list[Op]:
    """A decode step's scan (mamba2_selective_state_update, :212-270) at one token per sequence, on the (P x N) state
    of each sequence and head: dt + bias and softplus over (b, H, P) (dt expanded over P, :559), dA = exp(dt·A) in
    fp32, B repeated to every head (a contiguous copy), dB = dt·B, dB·x, the state's decay and the sum (the state in
    fp32, e.g. its dtype outside autocast), its copy into the cache, C repeated, the state cast to C's dtype, the
    output bmm (P x N by N x 1 per sequence and head), D's skip (a product and a sum) and the output's cast back.
    Inference only: no backward."""
    a, F, b, H, P, N = sh.act, FP32, d.b, d.h, d.p, d.n
    dtb = F if sh.autocast else a
    hp, st, hn = b * H * P, b * H * P * N, b * H * N
    src = f"{SRC}:212-270 mamba2_selective_state_update"
    # 5.25 (splits_at_kept_states): the update runs on a clone of the cached state (:458), copied back by the cache
    # (:462, cache_utils.py:1340 copy_)
    commit = splits_at_kept_states()
    ops = [memory("scan.state_clone", st * F, st * F, f"{SRC_525}:458 clone")] if commit else []
    ops += [memory("scan.dt_bias_add", (b * H + H) * a, hp * a, src, **BROADCAST),
           memory("scan.softplus", hp * dtb, hp * dtb, src)]
    if dtb != F:
        ops.append(memory("scan.dt.to_fp32", hp * dtb, hp * F, src, **UPCAST))
    ops += [memory("scan.da", hp * F + H * F, st * F, f"{src} dt * A", **BROADCAST),
            memory("scan.da_exp", st * F, st * F, f"{src} exp"),
            memory("scan.B.repeat", b * d.g * N * a, hn * a, f"{src} expand().contiguous()"),
            memory("scan.db", hp * dtb + hn * a, st * max(dtb, a), f"{src} dt * B", **BROADCAST),
            memory("scan.dbx", st * max(dtb, a) + hp * a, st * max(dtb, a), f"{src} dB * x", **BROADCAST),
            memory("scan.state_decay", 2 * st * F, st * F, f"{src} state * dA"),
            memory("scan.state_add", st * (F + max(dtb, a)), st * F, f"{src} + dBx"),
            memory("scan.state_copy", st * F, st * F, f"{src} state.copy_"),
            memory("scan.C.repeat", b * d.g * N * a, hn * a, f"{src} expand().contiguous()")]
    if a != F:
        ops.append(memory("scan.state.to_dtype", st * F, st * a, src, **DOWNCAST))
    ops += [gemm("scan.state_out", P, 1, N, sh, src, batch=b * H)._replace(dtype=rule_dtype(sh)),
            memory("scan.d_skip_mul", hp * a + H * P * sh.weight, hp * max(a, sh.weight), src, **BROADCAST),
            memory("scan.d_skip", hp * (a + max(a, sh.weight)), hp * max(a, sh.weight), src)]
    if sh.weight != a:
        ops.append(memory("scan.out.to_dtype", hp * sh.weight, hp * a, src))
    if commit:
        ops.append(memory("scan.state_commit", st * F, st * F, f"{SRC_525}:462 update_recurrent_state"))
    return ops


def _grad_sums(d: _Dims, sh: Shape) -> list[Op]:
    """Backward only: the splits' gradients concatenated (a split's backward is a cat): in_proj's output into z, x|B|C
    and dt (:515), the conv's into x, B and C (:550); and autograd's sums of the gradients of the scan's tensors read
    twice (input_buffer.cpp InputBuffer::add, one add of two gradients per extra read): the chunked x·dt (M·x and the
    chunk states' einsum), C and B repeated (C·Bᵀ and C·states; C·Bᵀ and B_decay), x.float() (D's pad and x·dt),
    dt (x·dt and A·dt), A·dt chunked (its cumsum and segment_sum), A_cumsum (read four times: decay_states' two
    operands, state_decay_out, the chunk ends' pad)."""
    a, F = sh.act, FP32
    dtb = F if sh.autocast else a
    T, H = d.T, d.h
    proj, conv = T * (d.inner + d.cd + H) * a, T * d.cd * a
    sums = (d.Tp * d.inner + 2 * d.Tp * H * d.n + T * d.inner + 4 * d.Tp * H) * F + T * H * dtb
    return [memory("split.backward", 0, 0, f"{SRC}:515, 550 split", saves=False, kernels=0, bwd_ops=(
                bwd_kernel("in_proj_split.backward", proj, proj), bwd_kernel("conv_split.backward", conv, conv))),
            memory("scan.grad_sums", 0, 0, "autograd InputBuffer::add", saves=False, kernels=0, bwd_ops=(
                bwd_kernel("scan.grad_sums", 2 * sums, sums, kernels=9),))]
