"""The Mamba-2 mixer of a hybrid stack (Nemotron-H) in a no-grad forward: its per-sequence cache, the live bytes
at its high point in the prefill, its decode step, its FLOPs.

The mixer is transformers 5.24 models/nemotron_h/modeling_nemotron_h.py NemotronHMamba2Mixer (:390-613) running the
reference PyTorch kernels (the `mamba_ssm` / `causal_conv1d` hub kernels absent: causal_conv1d_fn :164-183,
mamba2_chunk_scan :273-378, mamba2_selective_state_update :212-270). Symbols: T = b·s tokens, chunks c = ⌈s/Q⌉
of Q = chunk_size positions (Tp = b·c·Q, the tokens padded to whole chunks), H heads of P channels, state N per
channel, G groups of B and C, conv over conv_dim = H·P + 2·G·N channels with K taps.

Per-sequence cache (cache_utils.py:1218-1241 LinearAttentionLayer lazy_initialization): the conv state
(b, conv_dim, K) in the in_proj output's dtype, and the SSM state `zeros_like(final_state)` (b, H, P, N) in the
scan's einsum dtype (fp32, the scan upcasts x, B and C; the compute dtype under autocast, which runs einsum's bmm
in it). Constant in the sequence length.

Prefill: the scan's locals all stay referenced until it returns, so its high point is at its end (`output =
(Y_diag + Y_off).contiguous()`, :365-369), inside its last einsum's bmm (C_times_states, :359) where C's copy for
the bmm (and, under autocast, a second 16-bit copy: einsum_copy_bytes) is live, or inside the chunk states' bmm
(new_states, :351) where the concatenated states and their copy are — whichever is largest (mixer_prefill). Read
off traced prefills (small-nemotron_h at 2 x 128 with Nemotron-H 8B's and 47B's flags, state 128 and 256, and at
2 x 256, two chunks; tiny-nemotron-h at 2 x 100, 7 chunks: the live set at the prefill peak tensor by tensor).
"""
from __future__ import annotations

from dataclasses import dataclass
from math import ceil

from ..spec import ModelSpec
from .activations import FP32
from .onednn import bmm_scratch
from .precision import StateBytes


@dataclass(frozen=True)
class ScanShape:
    """One Mamba-2 mixer's sizes at `batch` sequences of `seq` tokens."""

    batch: int
    seq: int
    heads: int
    head_dim: int
    state: int
    groups: int
    chunk: int
    conv_dim: int
    conv_kernel: int
    inner: int

    @property
    def chunks(self) -> int:
        return ceil(self.seq / self.chunk)

    @property
    def tokens(self) -> int:
        return self.batch * self.seq

    @property
    def padded(self) -> int:
        """Tp: the tokens padded to whole chunks (pad_tensor_by_size, :80-88)."""
        return self.batch * self.chunks * self.chunk

    @property
    def proj(self) -> int:
        """in_proj's output width: z, x|B|C and dt (NemotronHMamba2Mixer.__init__, :428)."""
        return self.inner + self.conv_dim + self.heads


def scan_shape(spec: ModelSpec, batch: int, seq: int) -> ScanShape:
    m = spec.hybrid
    return ScanShape(batch, seq, m.ssm_heads, m.ssm_head_dim, m.d_state, m.n_groups, m.chunk_size, m.conv_dim,
                     m.conv_kernel, m.ssm_inner)


def scan_dtype_bytes(st: StateBytes) -> int:
    """The dtype of the scan's einsum outputs: fp32 (x, B, C upcast, :298-300), the compute dtype under autocast
    (bmm is on autocast's lower-precision list)."""
    return st.act if st.autocast else FP32


def einsum_copy_bytes(st: StateBytes, device: str) -> int:
    """The dtype of the transient copy each of the scan's einsums makes of an fp32 operand (C, B, B_decay, x·dt):
    einsum hands bmm its operands permuted and reshaped (aten/src/ATen/native/Linear.cpp sumproduct_pair:
    `.reshape`, a contiguous copy where the permuted layout is not viewable). Under CUDA's autocast einsum is on the
    lower-precision list (aten/src/ATen/autocast_mode.cpp KERNEL_CUDA(einsum, lower_precision_fp)): the operand is
    cast to the compute dtype before the op, and that cast is the transient (einsum permutes and copies it, and bmm
    saves the copy). CPU autocast lists bmm, not einsum (KERNEL_CPU(bmm, lower_precision_fp)): einsum copies the
    fp32 operand, which is the transient, and bmm casts the copy and saves the cast. Without autocast the einsums
    run in fp32 and the copy is fp32."""
    return st.act if (st.autocast and device == "cuda") else FP32


def dt_bytes(st: StateBytes, device: str) -> int:
    """dt's dtype after softplus: fp32 under CUDA's autocast, whose fp32 list has softplus (torch
    include/ATen/autocast_mode.h AT_FORALL_FP32, :873; CPU autocast's lists do not), else the compute dtype (dt is a
    slice of in_proj's output)."""
    return FP32 if (st.autocast and device == "cuda") else st.act


def conv_state_bytes(spec: ModelSpec, st: StateBytes) -> int:
    """One sequence's conv state of one Mamba block: (conv_dim, K) in in_proj's output dtype."""
    m = spec.hybrid
    return st.act * m.conv_dim * m.conv_kernel


def ssm_state_bytes(spec: ModelSpec, st: StateBytes) -> int:
    """One sequence's SSM state of one Mamba block: (H, P, N) in the scan's dtype."""
    m = spec.hybrid
    return scan_dtype_bytes(st) * m.ssm_heads * m.ssm_head_dim * m.d_state


def state_bytes_per_sequence(spec: ModelSpec, st: StateBytes) -> int:
    """Both states of one Mamba block, one sequence."""
    return conv_state_bytes(spec, st) + ssm_state_bytes(spec, st)


def scan_bmm_scratch(spec: ModelSpec, setup, st: StateBytes) -> tuple[int, int]:
    """(new_states', C_times_states'): what the two einsums' bmm (:351, :359) allocate inside themselves, 16-bit under
    autocast, on a CPU with oneDNN's 16-bit path (onednn.bmm_scratch; 0 elsewhere, and in fp32: the scan upcasts):
      new_states: b·H products of decay_chunk (c + 1)×(c + 1) by the states (c + 1)×(P·N), both plain;
      C_times_states: b·c·H products of C's chunk Q×N by its state N×P, transposed (the states' P·N rows). At one
        chunk the states reach it as a view of new_states[:, :-1] whose batch stride is (c + 1)·P·N (einsum's
        bmm makes new_states as (b·H, c + 1, P·N) and permutes it), which mkldnn_matmul copies; past one chunk
        einsum hands it a contiguous copy (einsum_copies), not copied again.
    Read off the probed bmm calls of traced steps (small-nemotron_h amp-bf16 at 2 x 128, CPU: C_times_states'
    (16, 128, 256) · (16, 256, 64), strides (32768, 1, 256): 524,288 B for the copy + 132,736 B of oneDNN's
    scratchpad at 2 threads)."""
    if not st.autocast:
        return 0, 0
    x = scan_shape(spec, setup.batch, setup.seq)
    b, h, p, n, q, c = x.batch, x.heads, x.head_dim, x.state, x.chunk, x.chunks
    states = bmm_scratch(setup, b * h, c + 1, c + 1, p * n)
    last = bmm_scratch(setup, b * c * h, q, n, p, transposed_b=True, copied_b=c == 1)
    return states, last


def mixer_prefill(spec: ModelSpec, st: StateBytes, batch: int, seq: int, device: str,
                  scratch: tuple[float, float] = (0, 0)) -> tuple[float, float, float]:
    """(inside the chunk states' bmm, inside the last einsum's bmm, the scan's end): the mixer's live bytes at its
    three candidate high points, the block's input, its norm and the cache aside. Each tensor by the source line
    that makes it:
      in_proj's output (T, proj) in the compute dtype (a), held whole: gate, x|B|C and dt are views of it (:515);
      the conv's output after SiLU, (b, conv_dim, s) in a (causal_conv1d_fn :175-183: the padded conv output is
        freed when the SiLU's slice is taken); x, B and C are views of it (:550-554);
      A = -exp(A_log) (H,) fp32 (:488);
      dt after bias, softplus and clamp (T, H) in dt_bytes (:293-296); A·dt chunked, fp32 (:309, 314);
    the scan's locals (fp32 unless named; e: the einsum dtype, scan_dtype_bytes):
      B and C repeated to every head and padded, (Tp, H, N) each (:299-300, 314: the repeat_interleave copies are
        freed by the padded ones);
      D_residual and the padded x·dt, (Tp, H, P) each (:305, 308, 314);
      A_cumsum, decay_states, state_decay_out: (b, H, c, Q) each (:317, 336, 356);
      L = exp(segment_sum) (b, H, c, Q, Q) (:321; segment_sum's intermediates are freed), G = C·Bᵀ per chunk in e
        (the bmm's output, :325), M = G·L (:328), all Tp·H·Q;
      B_decay (Tp, H, N) (:337);
      Y_diag's and C_times_states' bmm outputs (Tp, H, P) in e (:332, 359);
      the chunk states' zero initial state (b, H, P, N) and new_states (b, c + 1, H, P, N), both in e (:343-352;
        the concatenated states are freed once new_states is made);
      decay_chunk (b, H, c + 1, c + 1) (:349);
    at the end Y_off (:360), Y_diag + Y_off and its contiguous copy (:365), fp32 (Tp, H, P) each; inside the last
    bmm instead C's transient (Tp, H, N) copy in einsum_copy_bytes (CPU: the permuted fp32 copy; under CUDA's
    autocast: C's 16-bit cast, made before the einsum, :359) and under autocast the 16-bit operand bmm multiplies
    (CPU: bmm's cast of the fp32 copy; CUDA: einsum's permuted copy of the cast), beside the bmm's output, and
    past one chunk the chunk states' contiguous copy (b, c, H, P, N) in e (new_states[:, :-1] is not viewable in
    the bmm's layout; scan_end_train, einsum_copies: small-nemotron_h at 2 x 256 read -2.4 % without it, CUDA
    semantics);
    inside new_states' bmm (:351) the concatenated states (b, c + 1, H, P, N) and their contiguous copy, in e, with
    state_decay_out and the last einsum not made yet (the moment that tops the others where the state is wide:
    d_state 256, Nemotron-H 47B/56B).
    `scratch`: what the two bmm allocate inside themselves (scan_bmm_scratch), added to their moments.
    NB: the scan's few (s,), (Q, Q) boolean masks and int64 helpers, and under autocast the 16-bit casts of the
    other einsums' inputs (freed by their bmm), are left out."""
    x = scan_shape(spec, batch, seq)
    a = st.act
    e = scan_dtype_bytes(st)
    d = dt_bytes(st, device)
    tp, h, p, n, q, c = x.padded, x.heads, x.head_dim, x.state, x.chunk, x.chunks
    mixer = a * x.tokens * x.proj + a * batch * x.conv_dim * seq + FP32 * h + d * x.tokens * h
    scan = (2 * FP32 * n * tp * h  # B, C
            + 2 * FP32 * tp * h * p  # D_residual, x·dt
            + 4 * FP32 * tp * h  # A·dt, A_cumsum, decay_states, state_decay_out
            + (2 * FP32 + e) * tp * h * q  # L, M; G
            + FP32 * tp * h * n  # B_decay
            + e * tp * h * p  # Y_diag
            + e * batch * h * p * n * (c + 2)  # initial zero state, new_states
            + FP32 * batch * h * (c + 1) ** 2)  # decay_chunk
    last_out = e * tp * h * p  # C_times_states' bmm output
    states = mixer + scan - FP32 * tp * h + 2 * e * batch * h * (c + 1) * p * n + scratch[0]
    chunked = e * batch * c * h * p * n if c > 1 else 0  # (scan_end_train, einsum_copies)
    inside = mixer + scan + last_out + (einsum_copy_bytes(st, device) + (a if st.autocast else 0)) * tp * h * n \
        + chunked + scratch[1]
    end = mixer + scan + last_out + 3 * FP32 * tp * h * p
    return states, inside, end


def decode_step(spec: ModelSpec, st: StateBytes, batch: int, device: str) -> float:
    """The mixer's high point in a decode step (one token per sequence), at the state update `ssm_states = state * dA
    + dBx` of mamba2_selective_state_update (:236-248): in_proj's output and the conv's SiLU output (the conv's
    concatenation with its state is freed by then, causal_conv1d_update :144-160), dt after softplus expanded over
    the head channels (b, H, P) in the compute dtype, and (b, H, P, N) each: dA = exp(dt·A) in fp32, dB = dt·B and
    dB·x in the compute dtype (dt, B and x are), state·dA and the sum in fp32 (the state is); on CPU, adding the
    16-bit dB·x to fp32 first copies it to fp32 (TensorIterator's common dtype; trace/cpu_casts.py). Under CUDA's
    autocast dt is fp32 (dt_bytes), and so are dB and dB·x. Read off traced decode steps (small-nemotron_h, bf16 and
    amp-bf16, CPU and CUDA semantics).
    NB: the (b, H, N) copies of B and C and the output bmm's (b·H, P, 1) are left out (an under-count of a few
    (b, H, N) per block)."""
    x = scan_shape(spec, batch, 1)
    a, d = st.act, dt_bytes(st, device)
    state = batch * x.heads * x.head_dim * x.state
    scratch = FP32 * state if (device == "cpu" and d != FP32) else 0
    return (a * batch * x.proj + a * batch * x.conv_dim + d * batch * x.heads * x.head_dim
            + (3 * FP32 + 2 * d) * state + scratch)


def conv_bias_cast(spec: ModelSpec) -> int:
    """Elements autocast caches for the mixer beside its matmul weights: the conv1d's bias (a leaf; the weight
    reaches conv1d as a `.squeeze(1)` view, whose cast is not cached: aten/src/ATen/autocast_mode.cpp cached_cast,
    `arg.is_leaf()`)."""
    m = spec.hybrid
    return m.conv_dim if m.conv_bias else 0


def in_proj_params(spec: ModelSpec) -> int:
    m = spec.hybrid
    return spec.hidden * (m.ssm_inner + m.conv_dim + m.ssm_heads) + (
        m.ssm_inner + m.conv_dim + m.ssm_heads if m.proj_bias else 0)


def out_proj_params(spec: ModelSpec) -> int:
    m = spec.hybrid
    return m.ssm_inner * spec.hidden + (spec.hidden if m.proj_bias else 0)


def matmul_params(spec: ModelSpec) -> int:
    """The mixer's matmul weights (in_proj, out_proj), which each token multiplies through."""
    m = spec.hybrid
    return spec.hidden * (m.ssm_inner + m.conv_dim + m.ssm_heads) + m.ssm_inner * spec.hidden


def scan_flops_per_token(spec: ModelSpec, seq: int) -> float:
    """One mixer's FLOPs per token beyond its projections, 2 per multiply-add, from the chunked scan's einsums
    (mamba2_chunk_scan :325-359; Dao & Gu 2024, "Transformers are SSMs", §6, the SSD algorithm's four steps), which
    run over the positions padded to whole chunks (c·Q per sequence of s): G = C·Bᵀ within a chunk (Q·H·N per
    position), Y_diag = M·x (Q·H·P), the chunk states B·x (H·P·N), C·states (H·P·N), the inter-chunk recurrence
    ((c + 1)² · H·P·N per sequence); and the depthwise conv (K per channel, s positions). Against the trace's count
    of the mixer (small-nemotron_h at 2 x 128: 313.5 M vs 314.4 M). NB: the elementwise work (softplus, exp, the
    decays, the gated norm) is left out, as elsewhere (flops.py)."""
    x = scan_shape(spec, 1, seq)
    h, p, n, q = x.heads, x.head_dim, x.state, x.chunk
    padded = x.chunks * q / seq
    per_token = padded * (q * h * n + q * h * p + 2 * h * p * n) + (x.chunks + 1) ** 2 * h * p * n / seq
    return 2 * per_token + 2 * x.conv_kernel * x.conv_dim


# --- training: what autograd keeps (the reference kernels, a grad-mode forward) --------------------------------
# Read off traced training steps (small-nemotron_h: Nemotron-H 47B's flags at hidden 128, 8 heads × 64, state 256,
# 8 groups, chunk 128; batch 2 × 128; fp32 and bf16; the live set at the step's high point tensor by tensor, each
# record's birth and death): the step's high point is the end of a Mamba block's scan in the forward (under full
# recomputation, in the re-run forward inside the backward), where every tensor the scan made is still live.


def upcasts(st: StateBytes) -> bool:
    """Whether the scan's `.float()` calls copy (16-bit activations) or return their input (fp32)."""
    return st.act != FP32


def scan_end_train(spec: ModelSpec, st: StateBytes, batch: int, seq: int) -> tuple[float, float]:
    """(live, transient): the mixer's bytes at the end of its scan (`output = (Y_diag + Y_off).contiguous()`,
    :365) in a grad-mode forward, and of those the ones freed when the mixer returns (the rest autograd saves).
    Training regimes without autocast (the scan's einsums in fp32); each tensor by the source line that makes it:
      in_proj's output (T, proj) in a (held whole: gate, x|B|C and dt are views of it, :515);
      the conv's padded output (b, conv_dim, s + K − 1) in a, which the SiLU saves (causal_conv1d_fn :175-181), and
        the SiLU's output (b, conv_dim, s) in a (saved through x's view when fp32; its views only when 16-bit: the
        scan's x.float() copy is saved instead, :298);
      dt + bias, its softplus, its clamp (T, H) in a (:293-296: each saves its input);
      16-bit only: x.float() (T, H, P) and dt's two fp32 copies (T, H) (`dt[..., None].float()` :308, `dt.float()`
        :309), fp32;
    the scan's, fp32:
      saved: pad(x) for D_residual and the chunked x·dt (Tp, H, P) each (:305, 308, 314); B repeated to every head
        (T, H, N) (:299); L, G, M (Tp, H, Q) each (:321, 325, 328); the bmm operands einsum copies, (Tp, H, N) each:
        C and B for G (:325), B_decay for the chunk states (:339), C for C_times_states (:359); the concatenated
        states and their bmm operand (b, c + 1, H, P, N) each (:348, 351); C_times_states (Tp, H, P) (:359, kept
        by Y_off's product); decay_states and state_decay_out (b, H, c, Q) (:336, 356); decay_chunk (b, H, c + 1,
        c + 1) (:349); the segment sums' boolean masks, (Q, Q) and (c + 1, c + 1) twice each (:120, 126); A (H,)
        (:488);
      transient: D_residual (Tp, H, P) (:305); A·dt (T, H) (:309); C repeated (T, H, N) (:300); A_cumsum (b, H, c,
        Q) (:317); Y_diag's bmm output (Tp, H, P) (:332); B_decay (Tp, H, N) (:337); the chunk states (b, H, P, N)
        (:339-347: one of the zero initial state and the einsum's output is live); Y_off, the sum and its
        contiguous copy (Tp, H, P) each (:360, 365).
    einsum_copies: torch.einsum hands bmm its operands permuted and reshaped (aten/src/ATen/native/Linear.cpp
    sumproduct_pair: `.reshape`), which copies an operand whose permuted layout is not viewable. With one chunk
    (c = 1) the chunk dimension has size 1 and x·dt and the chunk states reach their einsums as views, so autograd
    saves x·dt itself and new_states' bmm output; with several chunks it saves contiguous copies instead: x·dt's
    for Y_diag's and the chunk states' einsums (Tp, H, P) each (:332, 339), and the states' for C_times_states
    (b, c, H, P, N) (:359), x·dt and the bmm output becoming transient (read off small-nemotron_h at 2 x 256, two
    chunks of 128, against 2 x 128).
    NB: tensors the reference kernel pads are counted at Tp, those made before the padding at T; the traced
    configs' sequences fill whole chunks, where the two agree. CUDA's 512-byte rounding of the few (H,) tensors is
    left out."""
    x = scan_shape(spec, batch, seq)
    a, up = st.act, upcasts(st)
    t, tp, h, p, n, q, c = x.tokens, x.padded, x.heads, x.head_dim, x.state, x.chunk, x.chunks
    silu = a * batch * x.conv_dim * seq
    entry = a * t * x.proj + a * batch * x.conv_dim * (seq + x.conv_kernel - 1) + 3 * a * t * h
    copies = FP32 * t * h * p + 2 * FP32 * t * h if up else 0
    chunked = c > 1  # (einsum_copies)
    states = FP32 * batch * h * (c + 1) * p * n
    saved = (FP32 * tp * h * p * (3 if chunked else 2) + FP32 * t * h * n + 3 * FP32 * tp * h * q
             + 4 * FP32 * tp * h * n + states * (1 if chunked else 2)
             + (FP32 * batch * c * h * p * n if chunked else 0) + FP32 * tp * h * p + 2 * FP32 * tp * h
             + FP32 * batch * h * (c + 1) ** 2 + 2 * (q * q + (c + 1) ** 2) + 2 * FP32 * h)
    transient = (5 * FP32 * tp * h * p + FP32 * t * h + FP32 * t * h * n + FP32 * tp * h + FP32 * tp * h * n
                 + FP32 * batch * h * p * n + ((FP32 * tp * h * p + states) if chunked else 0))
    live = entry + silu + copies + saved + transient
    return live, transient + (silu if up else 0)


def gated_norm_train(spec: ModelSpec, st: StateBytes, tokens: int) -> float:
    """What the mixer's gated RMSNorm (NemotronHRMSNorm with a gate, :63-74) and out_proj save, (T, inner) fp32 each
    (the reference scan returns fp32, :365-369, so the norm computes in fp32): the scan's output + D_residual, the
    gated product, the normalised tensor, silu(gate) and, fp32, the norm's output out_proj multiplies (:612);
    16-bit: the gate's fp32 copy (silu's input, :67) instead of that output, which out_proj's 16-bit cast
    (`scan_output.to(dtype)`) replaces; and the rsqrt per group (T, groups). Read off the traced forward ends
    (small-nemotron_h fp32 and bf16, tensor by tensor)."""
    m = spec.hybrid
    inner = m.ssm_inner
    return FP32 * tokens * inner * 5 + FP32 * tokens * m.n_groups + (st.act * tokens * inner if upcasts(st) else 0)


def block_norm_train(spec: ModelSpec, st: StateBytes, tokens: int) -> float:
    """The block's RMSNorm (NemotronHBlock.norm, NemotronHRMSNorm :63-74 without a gate) in a grad-mode forward:
    the normalised fp32 tensor, its rsqrt (T,) and the output in a (in_proj's saved input); 16-bit input adds its
    fp32 copy (`.to(torch.float32)` :65, saved by pow). NB: read off the traced live sets (fp32: 2 (T, h) fp32; bf16:
    2 fp32 + 1 bf16)."""
    h = spec.hidden
    return FP32 * tokens * h * (2 if upcasts(st) else 1) + FP32 * tokens + st.act * tokens * h


def scan_autocast_train(spec: ModelSpec, st: StateBytes, batch: int, seq: int, device: str,
                        scratch: float = 0) -> tuple[float, float, float]:
    """(inside, end, transient): under autocast, the mixer's live bytes in a grad-mode forward inside its last
    einsum's bmm (C_times_states, :359) and at its scan's end (:365), and of those at the end the ones freed when the
    mixer returns (the rest autograd saves).
    Autocast runs conv1d and bmm in bf16 (torch include/ATen/autocast_mode.h AT_FORALL_LOWER_PRECISION_FP :823,
    :843; CPU: aten/src/ATen/autocast_mode.cpp TORCH_LIBRARY_IMPL(aten, AutocastCPU) KERNEL_CPU(conv1d|bmm,
    lower_precision_fp)); each einsum (aten/src/ATen/native/Linear.cpp sumproduct_pair) hands bmm its fp32 operands
    permuted and reshaped (a contiguous fp32 copy where not viewable), which bmm casts to bf16 and saves: the fp32
    copies are freed with the einsum, the 16-bit casts kept. Each tensor by the source line that makes it (a: the
    compute dtype; Tp = T at one chunk):
      in_proj's output (T, proj) in a, transient: no backward keeps it (the conv's input is autocast's 16-bit copy of
        `hidden_states.to(weight.dtype)`'s fp32 one, the gate's is its fp32 copy, dt + bias a new tensor);
      the conv's 16-bit input (b, conv_dim, s) and its weight's 16-bit cast (conv_dim, K) (a `.squeeze(1)` view:
        not cached, conv_bias_cast), saved; the padded conv output (b, conv_dim, s + K − 1) in a, saved by the
        SiLU; the SiLU's output (b, conv_dim, s) in a, transient (x, B, C are upcast by `.float()`, :298-300);
      dt (T, H): dt + bias, softplus and clamp (:293-296) in dt_bytes (under CUDA's autocast softplus is fp32:
        its fp32 input copy, output, clamp; on CPU the three in a and `dt[..., None].float()`, `dt.float()` fp32
        copies, :308-309); A·dt padded, A_cumsum, decay_states, state_decay_out, fp32 (Tp, H) each (:309-356);
      (Tp, H, P), fp32: x.float() (:298), D_residual (:305), x·dt and its chunked copy (:308, 314); in a: the two
        bmm casts of x·dt (Y_diag's, :332, the chunk states', :339), Y_diag's bmm output (:332) and
        C_times_states' (:359);
      (Tp, H, N), fp32: B and C repeated to every head (:299-300), B_decay (:337); in a: the bmm operands of C and
        B for G (:325), of B_decay (:339), of C (:359); inside the last bmm C's transient copy in einsum_copy_bytes
        (:359; CPU: the permuted fp32 copy bmm casts; CUDA: the 16-bit cast einsum permutes and copies);
      (Tp, H, Q): L and M fp32 (:321, 328), G (the bmm output, :325) and M's bmm cast (:332) in a;
      the chunk states' bmm output (b, H, P, N) in a (:339); the concatenated states' bmm cast and new_states
        (b, c + 1, H, P, N) in a (:348-351); decay_chunk (b, H, c + 1, c + 1) fp32 and its cast (:349);
      the segment sums' boolean masks (Q, Q) and (c + 1, c + 1) twice each (:120, 126); A (H,) twice, fp32 (:488);
      at the scan's end instead of C's transient copy: Y_off, the sum and its contiguous copy, (Tp, H, P) fp32 each
        (:360, 365);
      past one chunk (scan_end_train, einsum_copies): the chunk states new_states[:, :-1] reach the last einsum as a
        16-bit contiguous copy (b, c, H, P, N), which its bmm saves, and new_states becomes transient.
    Read off traced training steps (small-nemotron_h at 2 x 128 and 2 x 256, one and two chunks, with Nemotron-H
    47B's flags, amp-bf16, CUDA and CPU semantics: the live set inside the last bmm, tensor by tensor, each record's
    birth and death).
    Under CUDA's autocast (einsum_copy_bytes) every einsum casts its fp32 operands before permuting them: what bmm
    saves is the same size (16-bit), and of the transients only the moment inside the last bmm is among the
    candidates; there it holds C's 16-bit cast (a·Tp·H·N) where CPU holds the fp32 copy, so the scan's end is the
    higher moment wherever 3·FP32·P > a·N (small-nemotron_h at 2 x 128, CUDA semantics: inside 44,748,288 B, end
    45,272,576 B of the step; read off the trace tensor by tensor, each einsum's operand casts born before its
    permuted copies).
    `scratch`: what the last bmm allocates inside itself (scan_bmm_scratch), added to the moment inside it.
    NB: the conv bias's 16-bit cast (cached) and the (T,) int64 position helpers are left out."""
    x = scan_shape(spec, batch, seq)
    a, d = st.act, dt_bytes(st, device)
    t, tp, h, p, n, q, c = x.tokens, x.padded, x.heads, x.head_dim, x.state, x.chunk, x.chunks
    conv = a * batch * x.conv_dim * seq
    entry = a * t * x.proj + a * batch * x.conv_dim * (seq + x.conv_kernel - 1) + 2 * conv + a * x.conv_dim * \
        x.conv_kernel
    dt = 3 * FP32 * t * h if d == FP32 else 3 * a * t * h + 2 * FP32 * t * h
    states = batch * h * p * n
    scan = (4 * FP32 * tp * h + 4 * (FP32 + a) * tp * h * p + (3 * FP32 + 4 * a) * tp * h * n
            + 2 * (FP32 + a) * tp * h * q + a * states * (1 + 2 * (c + 1)) + (FP32 + a) * batch * h * (c + 1) ** 2
            + 2 * (q * q + (c + 1) ** 2) + 2 * FP32 * h)
    chunked = c > 1  # (einsum_copies)
    scan += a * batch * c * h * p * n if chunked else 0
    inside = entry + dt + scan + einsum_copy_bytes(st, device) * tp * h * n + scratch
    end = entry + dt + scan + 3 * FP32 * tp * h * p
    # freed when the mixer returns: in_proj's output, the SiLU's, C repeated, B_decay, D_residual (held by the
    # output's add: NB counted freed), x·dt's chunked copy, M, the chunk states' output, Y_diag's bmm output, the
    # end's three (Tp, H, P)
    transient = (a * t * x.proj + conv + 2 * FP32 * tp * h * n + 2 * FP32 * tp * h * p + FP32 * tp * h * q
                 + a * states + a * tp * h * p + 3 * FP32 * tp * h * p
                 + (a * batch * (c + 1) * h * p * n if chunked else 0))
    return inside, end, transient
