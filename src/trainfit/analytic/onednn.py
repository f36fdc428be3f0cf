"""oneDNN's bf16/fp16 matmul scratch on a CPU: whether a matmul takes oneDNN's path, and what it allocates (no torch).

The mechanism (PyTorch files at the commits trace/kernel_scratch.py cites; the oneDNN it links is v3.12.0, git
80afa710, as torch 2.13's `torch.__config__.show()` reports; ideep@8a6cc4e0):
  * which matmuls: a 16-bit `aten.mm`/`addmm` reaches `cpublas::gemm`, whose bf16/fp16 overloads first try
    `mkldnn_bf16_gemm` / `mkldnn_fp16_gemm` (CPUBlas.cpp:361-386); `mkldnn_gemm` takes the call when
    `use_mkldnn_bf16_matmul()` holds and m·n·k > 16³ (Matmul.cpp:160-167), and otherwise BLAS-free kernels run
    whose buffers are not c10's (kernel_scratch.py). `use_mkldnn_bf16_matmul()` is mkldnn enabled (the default) and
    `mkldnn_bf16_device_check()`, which on x86-64 is `ideep::has_bf16_type_support()` (aten/src/ATen/native/mkldnn/
    Utils.h) = `dnnl::get_effective_cpu_isa() >= dnnl::cpu_isa::avx2_vnni_2` (ideep abstract_types.hpp:81-88);
    fp16: `>= avx512_core_fp16 || == avx2_vnni_2` (:96-101). `onednn_matmul` below is that rule, torch-free.
  * what it allocates: `mkldnn_gemm` runs oneDNN's matmul primitive on plain (row-major or transposed) views of the
    operands, C = A·B as oneDNN's src (M×K) · weights (K×N) (Matmul.cpp mkldnn_gemm: `matmul_forward::compute(b,
    a, c, ...)`, the column-major identity C^T = B^T A^T), with the sum post-op when beta != 0 (addmm). ideep runs it
    in user-scratchpad mode and allocates the primitive's scratchpad, one block, through c10 (kernel_scratch.py:
    matmul.hpp:866, 1290-1296; IDeepRegistration.cpp:12-19). Its size is what the primitive books
    (`matmul_scratch`, one place, below); it is born and dies inside the op, beside the op's output.
  * which primitive: `brg_matmul` (src/cpu/x64/matmul/brgemm_matmul.cpp) where the effective ISA has bf16 compute
    (avx512_core_bf16 and up, avx2_vnni_2); on avx512_core / avx512_core_vnni (AVX-512 without BF16: Skylake, Cascade
    Lake, Ice Lake) oneDNN's bf16 matmul is `gemm:jit:bf16` (src/cpu/matmul/gemm_bf16_matmul.cpp), which books an
    fp32 copy of the whole output (ONEDNN_VERBOSE=1 on this project's machines, with ONEDNN_MAX_CPU_ISA=AVX512_CORE).
  * AMX (avx512_core_amx: Sapphire Rapids and later; ONEDNN_VERBOSE `brg_matmul:avx10_1_512_amx`): its own
    blocking heuristics ("macro" for a plain A, else "micro"), which read this CPU's L1/L2 sizes, a per-thread AMX
    tile workspace, and a hand-off of tiny problems to avx512_core_bf16: analytic/onednn_amx.py (one job: that
    port), called from `matmul_scratch`.
Checked against the trace engine's probe (trace/kernel_scratch.py, which runs the op on this CPU) for the layers'
shapes by tests/analytic/test_onednn_scratch.py and bench/studies/onednn_scratch.py (on AVX-512-BF16 and, capped,
AVX-512 CPUs; on a Sapphire Rapids with AMX, natively and capped to AVX512_CORE_BF16 / AVX512_CORE / AVX2).
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from functools import lru_cache

from .onednn_amx import amx_scratch

# -- the sizes, in one place (oneDNN 80afa710) --------------------------------------------------------------------
ALIGN = 128  # src/common/memory_tracking.hpp:384 default_alignment: each booking takes size + 128 (:420-425)
BATCH_ELEMENT = 40  # sizeof(brgemm_batch_element_t), src/cpu/x64/brgemm/brgemm_types.hpp:142-163 (2+2+1 dim_t/ptr)
BATCH_ELEMENTS_PER_THREAD = 16  # brgemm_matmul_utils.cpp:2248 `16 * brgemm_batch_size` (batch size 1 here)
N_BLOCK = 64  # brgemm_matmul_utils.cpp:360-371 get_default_n_block (plain B: 64; is also LDB, hpp:331-345)
WEI_K_BLOCK = 32  # :84-91 get_wei_k_blk: 16 x the bf16/fp16 VNNI granularity 2 (B's copy is padded to it along K)
M_BLOCK_MAX, M_BLOCK_MIN, M_BLOCK_MIN_LOW_WORK = 256, 32, 16  # :864-869, :894 (16-bit: need_large_m_blk is f32's)
K_BLOCK, K_BLOCK_EXTENDED = 512, 1024  # :876-880: 1024 when K > 1024 and A is not transposed
K_BLOCK_AVX2 = 1024  # :1042 compute_blocking_heuristic_avx2 (avx2_vnni_2)
ACC = 4  # the fp32 accumulator's bytes
MKLDNN_GEMM_MIN = 16 * 16 * 16  # Matmul.cpp:160-167: m·n·k must exceed it


# -- does this CPU take oneDNN's path -----------------------------------------------------------------------------
# oneDNN's ISAs as bit masks (src/cpu/x64/cpu_isa_traits.hpp:77-110 bits, :136-161 ISAs), each with the CPU flags its
# `mayiuse` needs (:415-493; /proc/cpuinfo's names for Xbyak's), in get_isa_info_t's descending order
# (cpu_isa_traits.cpp:173-194; avx10_2 and avx512_core_bf16_ymm, a hint, left out).
_XMM, _YMM, _ZMM, _AMX_TILE = 1 << 4, 1 << 5, 1 << 6, 1 << 7
_EVEX, _AVX2, _VNNI, _VNNI2, _EVEX_VNNI, _EVEX_BF16, _EVEX_FP16 = (1 << b for b in range(8, 15))
_AMX_INT8, _AMX_BF16, _AMX_FP16 = 1 << 15, 1 << 16, 1 << 17
_AVX2_ISA = _AVX2 | _YMM | _XMM
_AVX512_CORE = _EVEX | _ZMM | _AVX2_ISA
_AVX512_BF16 = _EVEX_BF16 | _EVEX_VNNI | _AVX512_CORE
_AVX10_1 = 1 | _AVX2 | _VNNI | _EVEX | _EVEX_VNNI | _EVEX_BF16 | _EVEX_FP16 | _ZMM | _YMM | _XMM
_AVX512 = ("avx512f", "avx512bw", "avx512vl", "avx512dq")
ISAS = (  # (oneDNN's name, its ONEDNN_MAX_CPU_ISA value, public dnnl_cpu_isa_t value (dnnl_types.h), mask, flags)
    ("avx512_core_amx_fp16", "avx10_1_512_amx_fp16", 0x1fef,
     _AVX10_1 | _AMX_TILE | _AMX_INT8 | _AMX_BF16 | _AMX_FP16,
     _AVX512 + ("avx512_vnni", "avx512_bf16", "avx512_fp16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16",
                "amx_fp16")),
    ("avx512_core_amx", "avx10_1_512_amx", 0xfef, _AVX10_1 | _AMX_TILE | _AMX_INT8 | _AMX_BF16,
     _AVX512 + ("avx512_vnni", "avx512_bf16", "avx512_fp16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16")),
    ("avx512_core_fp16", "avx10_1_512", 0x1ef, _AVX10_1,
     _AVX512 + ("avx512_vnni", "avx512_bf16", "avx512_fp16", "avx_vnni")),
    ("avx512_core_bf16", "avx512_core_bf16", 0xe7, _AVX512_BF16, _AVX512 + ("avx512_vnni", "avx512_bf16")),
    ("avx512_core_vnni", "avx512_core_vnni", 0x67, _EVEX_VNNI | _AVX512_CORE, _AVX512 + ("avx512_vnni",)),
    ("avx512_core", "avx512_core", 0x27, _AVX512_CORE, _AVX512),
    ("avx2_vnni_2", "avx2_vnni_2", 0x1f, _VNNI2 | _VNNI | _AVX2_ISA, ("avx2", "avx_vnni", "avx_vnni_int8",
                                                                    "avx_ne_convert")),
    ("avx2_vnni", "avx2_vnni", 0xf, _VNNI | _AVX2_ISA, ("avx2", "avx_vnni")),
    ("avx2", "avx2", 0x7, _AVX2_ISA, ("avx2",)),
)
_PUBLIC = {name: public for name, _, public, _, _ in ISAS}
# ONEDNN_MAX_CPU_ISA's aliases (cpu_isa_traits.cpp:36-46) and the two values below AVX2 (:58-59)
_CAP_ALIASES = {"avx512_core_fp16": "avx10_1_512", "avx512_core_amx": "avx10_1_512_amx",
                "avx512_core_amx_fp16": "avx10_1_512_amx_fp16"}
_LOW_CAPS = {"sse41": _XMM, "avx": _YMM | _XMM}


@lru_cache(maxsize=4)
def _cpuinfo_flags(path: str = "/proc/cpuinfo") -> frozenset:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def effective_isa(flags: frozenset | None = None, cap: str | None = None) -> str | None:
    """oneDNN's effective ISA (dnnl::get_effective_cpu_isa): the highest ISA whose CPU flags are present and whose
    mask fits under ONEDNN_MAX_CPU_ISA (or DNNL_MAX_CPU_ISA, read lower-cased: src/common/utils.cpp:112-126
    getenv_string_user; an unknown value caps nothing, cpu_isa_traits.cpp:31-76). None below AVX2."""
    flags = _cpuinfo_flags() if flags is None else flags
    if cap is None:
        cap = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or ""
    cap = _CAP_ALIASES.get(cap.lower(), cap.lower())
    mask = _LOW_CAPS.get(cap, next((m for _, env, _, m, _ in ISAS if env == cap), ~0))
    for name, _, _, isa_mask, needs in ISAS:
        if mask & isa_mask == isa_mask and all(f in flags for f in needs):
            return name
    return None


def onednn_matmul(dtype: str = "bf16", flags: frozenset | None = None, cap: str | None = None) -> bool:
    """Whether a 16-bit CPU matmul on this CPU runs oneDNN's primitive (and so allocates its scratch through c10):
    ideep's has_bf16_type_support / has_fp16_type_support (abstract_types.hpp:81-88, 96-101) on the effective ISA."""
    isa = effective_isa(flags, cap)
    if isa is None or dtype not in ("bf16", "fp16"):
        return False
    if dtype == "bf16":
        return _PUBLIC[isa] >= _PUBLIC["avx2_vnni_2"]
    return _PUBLIC[isa] >= _PUBLIC["avx512_core_fp16"] or isa == "avx2_vnni_2"


def cpu_threads() -> int:
    """The threads torch runs (and oneDNN books per-thread buffers for: brgemm_matmul_utils.cpp:1336 `nthr =
    dnnl_get_max_threads()`): torch sets OpenMP's count to mkl_get_max_threads() (aten/src/ATen/ParallelOpenMP.cpp
    init_num_threads), i.e. OMP_NUM_THREADS / MKL_NUM_THREADS when set, else MKL's default, the physical cores.
    NB: cores counted from /proc/cpuinfo's (physical id, core id) pairs among the CPUs this process may run on; a
    cgroup CPU quota or torch.set_num_threads elsewhere is not seen (either direction)."""
    for var in ("MKL_NUM_THREADS", "OMP_NUM_THREADS"):
        v = os.environ.get(var, "").split(",")[0].strip()
        if v.isdigit() and int(v) > 0:
            return int(v)
    return _physical_cores()


@lru_cache(maxsize=1)
def _physical_cores() -> int:
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
    cores, cpu, phys = set(), None, "0"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key, value = key.strip(), value.strip()
                if key == "processor":
                    cpu = int(value)
                elif key == "physical id":
                    phys = value
                elif key == "core id" and cpu in allowed:
                    cores.add((phys, value))
    except (OSError, ValueError):
        pass
    return max(1, len(cores) or len(allowed))


# -- what one call allocates --------------------------------------------------------------------------------------
def _f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def _div_up(a: int, b: int) -> int:
    return -(-a // b)


def _rnd_up(a: int, b: int) -> int:
    return _div_up(a, b) * b


@dataclass(frozen=True)
class Blocking:
    m_blk: int
    n_blk: int
    n_chunk: int
    k_blk: int
    nthr_k: int


def _imbalance(m: int, n: int, k: int, nthr: int, m_blk: int, n_blk: int, n_chunk: int, k_blk: int,
               nthr_k: int, batch: int = 1) -> float:
    """matmul_avx512_blocking_params_t::get_imbalance (brgemm_matmul_utils.cpp:781-811), in float as there; the
    parallel work counts the batch (get_parallel_work :813-818)."""
    def disbalance(work: int, block: int) -> float:  # :774-779 calculate_spatial_disbalance
        mod = work % block
        return _f32((block - mod if work < block else min(block - mod, mod)) / block)

    cur = nthr // nthr_k
    work = _div_up(m, m_blk) * _div_up(n, n_blk * n_chunk) * batch
    num_n_blk = _div_up(n, n_blk)
    terms = (disbalance(work, cur), _f32((m_blk * _div_up(m, m_blk)) % m / m),
             _f32((_div_up(num_n_blk, n_chunk) * n_chunk - num_n_blk) / num_n_blk), _f32(disbalance(k, nthr_k * k_blk)),
             _f32((nthr - cur * nthr_k) / nthr) if cur * nthr_k != nthr else 0.0)
    total = 0.0
    for t in terms:
        total = _f32(total + t)
    return _f32(total / 5)


@lru_cache(maxsize=4096)
def brgemm_blocking(m: int, k: int, n: int, nthr: int, transposed_a: bool, avx2: bool = False,
                    batch: int = 1) -> Blocking:
    """brg_matmul's blocking for a 16-bit problem given as plain or transposed strides (what mkldnn_gemm and
    mkldnn_matmul pass), `batch` matrices of M×K · K×N (aten.bmm's: B has a batch dimension, so oneDNN does not
    merge the batch into M, init_brgemm_matmul_conf :1647-1660): compute_blocking_heuristic_avx512
    (brgemm_matmul_utils.cpp:860-1023), or _avx2 (:1025-1081) on avx2_vnni_2. The batch enters only as parallel
    work (:892, :999, :1049) and by keeping K whole (:921); the bookings do not read it (init_aux_values :2039-2249).
    N_blk starts at min(64, N) (:1168-1169) and is never cut to 32: B comes with its strides, so n_blk_fixed
    (:357). 16-bit B is always copied to the VNNI layout (use_buffer_b, brgemm_matmul_utils.hpp:298-329); A is
    copied when transposed (:1722-1732) or when K is a big power of 2 with M >= 1024 (:1173-1181, prefer_copy_a).
    A 1-row A takes the transposed tag whatever its strides (matmul_helper_t::transA() is 'T' at M = 1,
    src/cpu/matmul/matmul_utils.hpp:50-53; set_or_check_tags :561-588), which the heuristic reads (`a_tag_t`), but is
    not copied (treat_A_as_plain :1642-1645)."""
    a_tag_t = transposed_a or m == 1
    n_blk = min(N_BLOCK, n)
    n_chunks = _div_up(n, n_blk)
    copy_a = _a_copied(m, k, transposed_a, avx2)
    n_chunk_start = min(16 if copy_a else 1, n_chunks)  # :878-880 max_n_chunks
    max_m_blk, min_m_blk = min(M_BLOCK_MAX, m), min(M_BLOCK_MIN, m)
    low_work = nthr > batch * n_chunks  # :892-894 (max_parallel = batch · N chunks)
    if low_work:
        min_m_blk = min(m, M_BLOCK_MIN_LOW_WORK)
    if avx2:
        k_blk, start_nthr_k = min(k, K_BLOCK_AVX2), 1
    else:
        k_blk = min(k, K_BLOCK_EXTENDED if (k > 1024 and not a_tag_t) else K_BLOCK)
        # :920-928: a transposed A (a weight gradient) with a big power-of-2 K splits K over up to 4 threads (batch 1)
        start_nthr_k = min(nthr, 4) if (low_work and batch == 1 and a_tag_t and k >= 2048
                                        and k & (k - 1) == 0) else 1
    best, best_score = None, 1.0
    for nthr_k in range(start_nthr_k, 0, -1):
        found = False
        for n_chunk in range(n_chunk_start, 0, -1):
            for m_blk in range(max_m_blk, min_m_blk - 1, -1):
                score = _imbalance(m, n, k, nthr, m_blk, n_blk, n_chunk, k_blk, nthr_k, batch)
                work = batch * _div_up(m, m_blk) * _div_up(n, n_blk * n_chunk)
                bmn = nthr // nthr_k
                if not avx2 and work < bmn * 3 and work % bmn != 0 and start_nthr_k == 1:  # :1001-1004
                    continue
                if score < best_score:
                    best, best_score, found = Blocking(m_blk, n_blk, n_chunk, k_blk, nthr_k), score, True
        if not found and not avx2:  # :1013-1019
            score = _imbalance(m, n, k, nthr, min_m_blk, n_blk, 1, k_blk, nthr_k, batch)
            if score < best_score:
                best, best_score = Blocking(min_m_blk, n_blk, 1, k_blk, nthr_k), score
        if avx2:
            break
    return best or Blocking(min_m_blk, n_blk, 1, k_blk, 1)


def _a_copied(m: int, k: int, transposed_a: bool, avx2: bool) -> bool:
    """use_buffer_a for 16-bit: a transposed A of more than one row (:1722-1732, treat_A_as_plain :1642-1645), or
    prefer_copy_a (brgemm_matmul_utils.cpp:1173-1181; lda_big_pow2, brgemm_matmul_utils.hpp:267-271)."""
    if transposed_a:
        return m != 1
    return not avx2 and k & (k - 1) == 0 and k >= 8192 // 2 and m >= 1024


def _on_onednn(setup) -> bool:
    """Whether `setup`'s 16-bit matmuls run oneDNN's primitive: a CPU step (device "cpu") whose compute dtype this
    CPU takes on oneDNN's path (onednn_matmul)."""
    from ..precision import PRECISIONS  # noqa: PLC0415

    return setup.device == "cpu" and onednn_matmul(PRECISIONS[setup.precision].compute)


def gemm_scratch(setup, m: float, k: float, n: float, transposed_a: bool = False,
                 transposed_b: bool | None = None) -> int:
    """The scratch of one of the step's matmuls (m×k · k×n in the compute dtype) under `setup`: only a CPU step
    (device "cpu") with a 16-bit compute dtype whose CPU takes oneDNN's path allocates it; 0 otherwise. B's layout
    (matmul_scratch) matters on AMX: nn.Linear's forward x·Wᵀ has it transposed, its input gradient grad·W plain."""
    from ..precision import PRECISIONS  # noqa: PLC0415

    # quantised weight formats (int8, int4, fp8) run their own kernels, not aten.mm on 16-bit operands
    if PRECISIONS[setup.precision].weight not in ("fp32", "bf16", "fp16") or not _on_onednn(setup):
        return 0
    return matmul_scratch(max(1, int(m)), max(1, int(k)), max(1, int(n)), transposed_a=transposed_a,
                          transposed_b=transposed_b)


def bmm_scratch(setup, batch: float, m: float, k: float, n: float, *, transposed_a: bool = False,
                transposed_b: bool = False, copied_a: bool = False, copied_b: bool = False) -> int:
    """The c10 bytes one of the step's aten.bmm (`batch` × m×k · k×n in the compute dtype) allocates and frees inside
    the op under `setup`, 0 where gemm_scratch's path is off: a 16-bit bmm calls mkldnn_matmul (LinearAlgebra.cpp
    bmm_out_or_baddbmm_: `use_mkldnn_bf16_matmul(batch1, batch2, ...)`, whose checksize wants b·m·k·n > 16³,
    Matmul.cpp), which first copies an operand that is neither contiguous nor transposed with its matrices packed
    (is_mkldnn_optimized_format: batch stride m·k, Matmul.cpp mkldnn_matmul) into a contiguous 16-bit one
    (`copied_a` / `copied_b`: the caller's layout), live through the primitive, then runs the primitive on the batch
    (matmul_scratch). A copied operand reaches oneDNN plain."""
    b, m, k, n = (max(1, int(x)) for x in (batch, m, k, n))
    if not _on_onednn(setup) or b * m * n * k <= MKLDNN_GEMM_MIN:
        return 0
    copies = 2 * b * (m * k * copied_a + k * n * copied_b)
    return copies + matmul_scratch(m, k, n, transposed_a=transposed_a and not copied_a,
                                   transposed_b=transposed_b and not copied_b, batch=b)


def matmul_scratch(m: int, k: int, n: int, *, transposed_a: bool = False, transposed_b: bool | None = None,
                   threads: int | None = None, isa: str | None = None, batch: int | None = None) -> int:
    """Bytes of the scratchpad oneDNN's matmul primitive books for C (m×n, 16-bit) = A (m×k) · B (k×n) on `isa`
    (default: this CPU's effective ISA), with `threads` threads (default: cpu_threads()); 0 where the call does not
    reach oneDNN (m·n·k <= 16³, or an ISA without the 16-bit path). Every booking is its size + ALIGN.
    `batch`: None for aten.mm's 2-D call (mkldnn_gemm), else aten.bmm's batch of such products (mkldnn_matmul: a
    3-D problem; the gate is batch·m·n·k > 16³). On brg_matmul the batch changes only the blocking (brgemm_blocking:
    more parallel work, so larger M blocks where M alone could not feed the threads); the per-thread buffers are
    one block's, whatever the batch.
    brg_matmul (init_scratchpad, brgemm_matmul_utils.cpp:2251-2316, sizes from init_aux_values :2039-2249), per thread:
      batch elements  16 · 40 B;
      A's copy        M_blk · LDA · 2 (a transposed A of 2 rows or more; LDA = k_blk rounded up to 32, + 32 at a
                      power of 2 >= 512: get_actual_lda :820-829);
      B's VNNI copy   rnd_up(N_blk, 64) · rnd_up(K_blk, 32) · 2;
      fp32 C buffer   M_blk · N_blk · 4 (× the N chunk when K spans several K blocks; with K split over threads,
                      M · N · 4). The C buffer is always booked for a 16-bit output: is_buffer_c_required (:831-839)
                      runs in update_configuration (:841-858) before init_aux_values sets K_chunk_elems, which is
                      still 0 from `bgmmc = zero<>()` (:1334), so `K > k_chunk_elems` holds.
    gemm:jit:bf16 (AVX-512 without BF16): the fp32 output, split in per-thread blocks (gemm_based_common.hpp:125-175
    get_scratchpad_num_elements / book_acc_scratchpad; use_single_gemm_call_optimization_ is never set there, :57),
    each rounded up to 64 elements.
    AMX (avx512_core_amx, avx512_core_amx_fp16): analytic/onednn_amx.py's port of the AMX blocking heuristics and
    bookings (with the AMX tile workspace), given B's layout `transposed_b` (default: not transposed_a, as nn.Linear's
    forward and weight gradient; its input gradient grad·W has a plain B); a problem whose A block is tiny (<= 126
    B) goes to avx512_core_bf16, as oneDNN hands it on.
    On brg_matmul (every ISA but gemm:jit:bf16's) an mm's M×1 result is computed as Cᵀ = Bᵀ·Aᵀ (torch keeps it
    column-major), and a 1-row A is plain whatever its strides (treat_A_as_plain; brgemm_blocking).
    NB: the sizes are bf16's; an fp16 matmul (on the path from avx512_core_fp16 up) is taken as bf16 (unverified,
    direction unknown). On AMX exact against the probe (bench onednn_scratch --full at 1 and 2 threads; 1,080 random
    shapes, plain/transposed A and B, M/K/N from 1 to 8192, 1-32 threads); avx512_core_amx_fp16 (no small-shape
    hand-off there) is not checked on a real CPU. On AVX512_CORE_BF16 exact against the probe for 2-D and batched
    shapes, M or N = 1 among them (tests/analytic/test_onednn_scratch.py).
    NB: on AMX a batch is not ported (onednn_amx.py is the 2-D heuristics): a bmm is priced as one of its matrices
    (direction unknown)."""
    b = 1 if batch is None else batch
    if b * m * n * k <= MKLDNN_GEMM_MIN:
        return 0
    isa = effective_isa() if isa is None else isa
    nthr = cpu_threads() if threads is None else threads
    if isa is None or _PUBLIC.get(isa, 0) < _PUBLIC["avx2_vnni_2"]:
        return 0
    if isa in ("avx512_core", "avx512_core_vnni"):  # gemm:jit:bf16
        def block(threads: int) -> int:  # get_scratchpad_block_elements (gemm_based_common.hpp:125-144)
            per = _div_up(b * m * n, threads)
            return _rnd_up(min(m * n, per - per % n) if per >= n else per, 64)
        return ACC * max(block(1), nthr * block(nthr)) + ALIGN
    tb = not transposed_a if transposed_b is None else transposed_b
    if n == 1 and batch is None:  # addmm_impl_cpu_ keeps an M×1 result column-major (LinearAlgebra.cpp): Cᵀ=BᵀAᵀ
        m, n, transposed_a, tb = 1, m, False, not transposed_a
    if isa in ("avx512_core_amx", "avx512_core_amx_fp16"):
        transposed_a = transposed_a and m != 1  # treat_A_as_plain (brgemm_matmul_utils.cpp:1642-1645)
        amx = amx_scratch(m, k, n, nthr, transposed_a, tb, small_shape_check=isa == "avx512_core_amx")
        if amx is not None:
            return amx
        # small shapes: oneDNN hands this problem to brg_matmul:avx512_core_bf16, modelled below
    avx2 = isa == "avx2_vnni_2"
    blk = brgemm_blocking(m, k, n, nthr, transposed_a, avx2, b)
    copy_a = _a_copied(m, k, transposed_a, avx2)
    k_blk = blk.k_blk
    total = nthr * BATCH_ELEMENTS_PER_THREAD * BATCH_ELEMENT + ALIGN
    if copy_a:
        lda = _rnd_up(k_blk, 32)
        lda += 32 if lda >= 512 and lda & (lda - 1) == 0 else 0
        total += nthr * 2 * blk.m_blk * lda + ALIGN
    total += nthr * 2 * _rnd_up(blk.n_blk, N_BLOCK) * _rnd_up(k_blk, WEI_K_BLOCK) + ALIGN
    if blk.nthr_k > 1:
        c = ACC * n * m
    else:
        c = ACC * blk.n_blk * blk.m_blk * (1 if k_blk >= k else blk.n_chunk)
    return total + nthr * c + ALIGN
