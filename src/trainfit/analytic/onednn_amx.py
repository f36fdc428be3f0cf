"""oneDNN's bf16 matmul scratch on AMX CPUs (avx512_core_amx: Sapphire Rapids and later), no torch.

One job: the scratchpad `brg_matmul:avx10_1_512_amx` books for a 2-D bf16 C (M×N) = A (M×K) · B (K×N) given as
plain or transposed strides (what torch's mkldnn_gemm passes: analytic/onednn.py), ported from oneDNN v3.12.0 (git
80afa710); file:line below are at that commit, under src/cpu/x64/ (matmul/ unless said).
  * blocking: compute_blocking_heuristic (brgemm_matmul_utils.cpp:1166-1249) takes the "macro" heuristic
    (amx_blocking_heuristics.cpp:96-1104, `_Macro`) when A is plain (is_supported :96-122) and its score is not 0,
    else the "micro" one (:1106-1424, `_Micro`) after its own M/K start blocks (brgemm_matmul_utils.cpp:1206-1238);
  * the configuration it leads to (init_brgemm_matmul_conf :1330-1960; init_aux_values :2039-2249): `amx_conf`;
    a bf16 problem whose A chunk is tiny (buffer_a_gb_stride <= 126 B, :1897-1930) is handed to the next
    implementation, avx512_core_bf16 (ONEDNN_VERBOSE: "small shapes fall back"): `amx_conf` returns None there;
  * the bookings (init_scratchpad :2251-2316), among them the AMX tile workspace: per thread the largest
    brgemm_desc_t::get_wsp_buffer_size (brgemm/brgemm_types.hpp:469-478) over the kernels brgemm_matmul.cpp:356-
    447 creates, whose tile counts come from brgemm_blocking_tmm (brgemm/brgemm_utils.cpp:295-724): `_c_tiles`.
The heuristics read the per-core L1/L2 sizes and L2's ways and sets (`cache_info`). Float scores are computed in
float32 as there (`_f32`), and the micro heuristic's M-block candidates are visited in libstdc++'s unordered_set
order, which decides ties (`_unordered_order`).
NB: the macro heuristic reads `best_m_v`/`best_k_v`/`best_k_h` uninitialised when no vertical/horizontal candidate
scores (amx_blocking_heuristics.cpp:835-836): taken as 0 here, i.e. "not possible" (unverified where it happens).
"""
from __future__ import annotations

import copy
import os
import struct
from dataclasses import dataclass
from functools import lru_cache


def _f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def _div_up(a: int, b: int) -> int:
    return -(-a // b)


def _rnd_up(a: int, b: int) -> int:
    return _div_up(a, b) * b


def _i32(x: int) -> int:  # a size_t product stored in an `int` (amx_blocking_heuristics.cpp:686-760)
    x &= 0xFFFFFFFF
    return x - (1 << 32) if x >= 1 << 31 else x


def _pow2(x: int) -> bool:
    return x > 0 and x & (x - 1) == 0


# -- the caches the heuristics read ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class CacheInfo:
    l1: int  # per-core L1 data bytes   (platform::get_per_core_cache_size(1), src/cpu/platform.cpp:250-275)
    l2: int  # per-core L2 bytes        (get_per_core_cache_size(2))
    l2_ways: int  # L2 associativity    (get_num_ways_in_cache(2), platform.cpp:218-248: cpuid leaf 4 subleaf 2)
    l2_sets: int  # L2 sets             (get_num_sets_in_cache(2), platform.cpp:188-216)
    line: int = 64  # platform::get_cache_line_size()


# oneDNN's guesses where the CPU reports no caches (platform.cpp:189-260)
GUESS = CacheInfo(l1=32 * 1024, l2=512 * 1024, l2_ways=16, l2_sets=2048)


@lru_cache(maxsize=4)
def cache_info(root: str = "/sys/devices/system/cpu/cpu0") -> CacheInfo:
    """This CPU's caches as oneDNN sees them: Xbyak's setCacheHierarchy (third_party/xbyak/xbyak_util.h:353-460)
    reads cpuid leaf 4 for each data/unified level, size = ways·partitions·line·sets, and divides it by the cores
    sharing it (logical CPUs sharing it / SMT width); Linux fills /sys/devices/system/cpu/cpuN/cache/index*/ from
    the same leaf (size, ways_of_associativity, number_of_sets, shared_cpu_list), so: size / (CPUs sharing it /
    the core's threads). GUESS where sysfs says nothing.
    NB: Linux counts the sharing CPUs that exist, cpuid the most that could (xbyak caps it by leaf 0xB's count):
    on a VM whose cpuid claims more sharers than it has CPUs the per-core size oneDNN uses is smaller (then the
    heuristics may pick other blocks; direction unknown). Checked on this project's 2-core Sapphire Rapids: L1 48
    KiB, L2 2 MiB, 16 ways, 2048 sets, as cpuid leaf 4 reports."""
    def read(path: str) -> str | None:
        try:
            with open(path) as f:
                return f.read().strip()
        except OSError:
            return None

    def cpus(spec: str | None) -> int:
        n = 0
        for part in (spec or "").split(","):
            if "-" in part:
                lo, hi = part.split("-")
                n += int(hi) - int(lo) + 1
            elif part.strip():
                n += 1
        return n

    smt = max(1, cpus(read(f"{root}/topology/thread_siblings_list")))
    levels: dict[int, tuple[int, int, int]] = {}
    i = 0
    while True:
        d = f"{root}/cache/index{i}"
        if not os.path.isdir(d):
            break
        i += 1
        kind, level, size = read(f"{d}/type"), read(f"{d}/level"), read(f"{d}/size")
        if kind not in ("Data", "Unified") or not level or not size:
            continue
        mult = {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}.get(size[-1], 1)
        total = int(size.rstrip("KMG")) * mult
        sharing = max(1, cpus(read(f"{d}/shared_cpu_list")) // smt)
        ways, sets = read(f"{d}/ways_of_associativity"), read(f"{d}/number_of_sets")
        levels[int(level)] = (total // sharing, int(ways or 0), int(sets or 0))
    if 1 not in levels or 2 not in levels:
        return GUESS
    return CacheInfo(l1=levels[1][0], l2=levels[2][0], l2_ways=levels[2][1] or GUESS.l2_ways,
                     l2_sets=levels[2][2] or GUESS.l2_sets)


# -- the problem, as brgemm_matmul_conf_t holds it before the heuristic -----------------------------------------------
@dataclass(frozen=True)
class _Problem:
    M: int
    K: int
    N: int
    nthr: int
    transposed_A: bool
    transposed_B: bool
    cache: CacheInfo
    with_sum: bool = False
    # bf16 everywhere, fp32 accumulator (brgemm_matmul_utils.cpp:1376-1419); B always copied on AMX (use_buffer_b,
    # brgemm_matmul_utils.hpp:298-308: plain B is not blocked); wei_k_blk = 16 · 2 (:84-91)
    dt: int = 2
    acc: int = 4
    wei_k_blk: int = 32
    k_gran: int = 2  # required_k_granularity: the bf16 VNNI granularity on AMX (:1598-1601)

    @property
    def macro_supported(self) -> bool:
        """is_supported (amx_blocking_heuristics.cpp:92-121): A's tag plain, no zero points... A 1×K src matches both
        tags and takes `ba`, as matmul_helper_t::transA() is 'T' for M = 1 (src/cpu/matmul/matmul_utils.hpp:50-53;
        set_or_check_tags, brgemm_matmul_utils.cpp:561-588), though it is then treated as plain (:1642-1645)."""
        return not self.transposed_A and self.M != 1

    @property
    def wei_n_blk(self) -> int:  # get_default_n_block (brgemm_matmul_utils.cpp:360-371)
        return 32 if self.macro_supported else 64

    @property
    def lda_big_pow2(self) -> bool:  # brgemm_matmul_utils.hpp:267-271
        return not self.transposed_A and _pow2(self.K) and self.K >= 8192 // self.dt

    # thresholds (amx_blocking_heuristics.cpp:84-94)
    @property
    def L2_thr(self) -> int:
        return 3 * self.cache.l2 // 4

    @property
    def L2_ways_thr(self) -> int:
        return 3 * self.cache.l2_ways // 4

    @property
    def L1_thr(self) -> int:
        return 5 * self.cache.l1 // 6


class _Params:
    """matmul_amx_blocking_params_t (amx_blocking_heuristics.hpp:29-94): the state both heuristics share."""

    def __init__(self, p: _Problem, n_blk: int, m_blk: int = 0, k_blk: int = 0, batch_size: int = 0,
                 need_buf_a: bool = False):
        self.p = p
        self.nthr_m = self.nthr_n = self.nthr_k = self.nthr_b = 1
        self.nthr_mnb = p.nthr
        self.nthr_ = p.nthr
        self.n_blk, self.n_chunk_size = n_blk, 1
        self.n_chunk_elems = n_blk
        self.m_blk, self.m_chunk_size = m_blk, 1
        self.m_chunk_elems = m_blk
        self.k_blk, self.k_chunk_size = k_blk, 1
        self.k_chunk_elems = k_blk * batch_size
        self.need_prefetch_a = self.need_prefetch_b = False
        self.use_fused_copy_a = False
        self.batch_size = batch_size
        self.lda = 0
        self.need_buf_c = False
        self.need_buf_a = need_buf_a
        self.extendable_k = False
        self.score = 0.0

    def actual_lda(self) -> int:  # amx_blocking_heuristics.cpp:65-75
        p = self.p
        if not self.need_buf_a:
            return p.K if (p.M == 1 or not p.transposed_A) else p.M  # A's stride over M, or over K when transposed
        lda = _rnd_up(self.k_blk, 64 // p.dt)
        return lda + 64 // p.dt if lda >= 512 and _pow2(lda) else lda


# -- the macro heuristic ----------------------------------------------------------------------------------------------
_BW_POINTS = ((1, _f32(2.28)), (2, _f32(0.9)), (4, _f32(2.39)), (8, _f32(2.98)), (16, _f32(3.31)), (32, _f32(4.06)))
_L1_LOAD_HIT = _f32(106.41)  # bw_map_t (amx_blocking_heuristics.hpp:200-220)
_L1_LOAD_MISS = _f32(106.41 / 2.28)
_L1_STORE_MISS = _f32(106.41 / 2.85)
_LLC = _f32(6.0)


def _get_bw(x: float) -> float:
    """bw_map_t::get_bw(int) (hpp:200, 222-246): the float argument truncated to int, then interpolated in float."""
    x = int(x)
    for i, (x1, y1) in enumerate(_BW_POINTS):
        if x1 >= x:  # std::map::lower_bound
            if i == 0:
                return y1
            x0, y0 = _BW_POINTS[i - 1]
            return _f32(y0 + _f32(_f32(_f32(y1 - y0) * _f32(x - x0)) / (x1 - x0)))
    return _BW_POINTS[-1][1]


def _blk_candidates(per_thread: int, decomposition: int) -> list[int]:
    """blk_candidates (:674-684): the group sizes, ascending (a std::set)."""
    inner = _div_up(per_thread, decomposition)
    return sorted({_div_up(inner, g) for g in range(1, inner + 1)})


def _tmul_size(n: int, full: int) -> int:  # determine_tmul_size (:145-149)
    return _div_up(n, _div_up(n, full))


class _Macro(_Params):
    """matmul_amx_blocking_params_macro_t (amx_blocking_heuristics.hpp:96-175, .cpp:92-1104)."""

    def __init__(self, p: _Problem):
        super().__init__(p, n_blk=min(p.wei_n_blk, p.N), need_buf_a=p.transposed_A)
        self.min_k_elem = 256 // p.dt
        self.min_mn_elem = 64 // p.dt  # c_dt_sz: bf16 output
        self.k_wb_elem = 256 // p.dt
        self.min_n_wb_elem = 256 // p.dt
        self.n_dec = self.m_dec = 32
        self.m_pt = self.k_pt = self.n_pt = self.b_pt = 0
        self.is_horizontal = False
        self.m_tmul = self.n_tmul = self.k_tmul = 0
        self.is_a_nt = False  # is_a_nt_(is_a_nt): bgmmc's, zero-initialised (hpp:48; brgemm_matmul_utils.cpp:1334)

    # set_core_divs (:1092-1103)
    def set_core_divs(self, b: int, m: int, k: int, n: int) -> None:
        p = self.p
        self.nthr_b, self.nthr_m, self.nthr_k, self.nthr_n = b, m, k, n
        self.m_pt, self.k_pt, self.n_pt, self.b_pt = _div_up(p.M, m), _div_up(p.K, k), _div_up(p.N, n), _div_up(1, b)
        self.nthr_mnb = self.nthr_ // self.nthr_k

    def set_tmul_sizes(self) -> None:  # :790-794
        self.m_tmul = _tmul_size(self.m_pt, 16)
        self.n_tmul = 16
        self.k_tmul = min(self.p.wei_k_blk, self.p.K)

    def set_decomposition(self) -> None:  # :796-799
        self.m_dec = min(self.p.M, 2 * self.m_tmul)
        self.n_dec = min(self.p.N, 2 * self.n_tmul)

    def divs_acceptable(self) -> bool:  # divs_are_acceptable (:124-143)
        bad_m = _rnd_up(self.m_pt, self.m_tmul) < self.min_mn_elem and self.nthr_m > 1
        bad_k = self.k_pt < self.min_k_elem and self.nthr_k > 1
        if self.nthr_k == 1 and self.k_pt < self.k_wb_elem:
            bad_n = _rnd_up(self.n_pt, self.n_tmul) < self.min_n_wb_elem and self.nthr_n > 1
        else:
            bad_n = _rnd_up(self.n_pt, self.n_tmul) < self.min_mn_elem and self.nthr_n > 1
        return not (bad_m or bad_k or bad_n or self.nthr_b > 1)

    def skip_extendable_k(self) -> bool:  # :1072-1093
        p = self.p

        def ok(k: int) -> bool:
            ops = _div_up(k, 64 // p.dt)
            tile = k // ops
            return k % ops == 0 and tile <= 64 // p.dt and tile % p.k_gran == 0

        tail = p.K % self.k_blk
        return ok(self.k_blk) and ok(tail) if tail else ok(self.k_blk)

    # -- the small-dims shortcut (:168-310) --
    def small_dims(self) -> bool:
        p = self.p

        def common() -> None:
            self.k_blk, self.k_chunk_size, self.batch_size = p.K, 1, 1
            self.need_buf_c = self.need_buf_a = False
            self.extendable_k = p.K % p.wei_k_blk != 0 and not self.skip_extendable_k()
            self.is_a_nt = True
            self.need_prefetch_a = self.need_prefetch_b = self.use_fused_copy_a = False
            self.score = 1.0
            self.lda = self.actual_lda()

        if p.M <= 32 and p.transposed_B:  # b_is_not_flat: IMPLICATION(use_buffer_b, transposed_B)
            self.n_dec = min(p.N, p.wei_n_blk)
            self.m_dec = p.M
            n_per_core = _rnd_up(_div_up(p.N, p.nthr), self.n_dec)
            self.set_core_divs(1, 1, 1, _div_up(p.N, n_per_core))
            if self.nthr_n < 0.75 * self.nthr_:
                return False
            self.m_blk, self.m_chunk_size = p.M, 1
            self.n_blk, self.n_chunk_size = self.n_dec, n_per_core // self.n_dec
            if p.M * p.K > p.L2_thr:  # brg_a_size (K_blk/k_chunk set there are overwritten by set_common)
                return False
            common()
            return True
        if p.K <= p.wei_k_blk:
            m_per_core = _div_up(p.M, p.nthr)
            self.set_core_divs(1, _div_up(p.M, m_per_core), 1, 1)
            self.set_tmul_sizes()
            self.set_decomposition()
            if self.nthr_m < 0.75 * self.nthr_:
                return False
            self.m_blk, self.m_chunk_size = self.m_dec, _div_up(m_per_core, self.m_dec)
            b, b_tr, d = p.N * p.K, p.N * _rnd_up(p.K, p.wei_k_blk), p.N * self.m_dec
            self.n_chunk_size = _div_up(b + b_tr + d, p.L2_thr)
            self.n_blk = _rnd_up(_div_up(p.N, self.n_chunk_size), p.wei_n_blk)
            common()
            return True
        if p.N <= 32:
            m_per_core = _div_up(p.M, p.nthr)
            self.m_pt = m_per_core
            self.m_dec = _tmul_size(self.m_pt, 2 * 16)
            self.n_tmul, self.n_dec = 16, 32
            self.k_tmul = min(p.wei_k_blk, p.K)
            self.set_core_divs(1, _div_up(p.M, _rnd_up(self.m_pt, self.m_dec)), 1, 1)
            if self.nthr_m < 0.75 * self.nthr_:
                return False
            self.m_blk, self.m_chunk_size = self.m_dec, _div_up(m_per_core, self.m_dec)
            self.n_blk, self.n_chunk_size = p.N, 1
            common()  # the K chunking computed there (:298-303) is overwritten by set_common
            return True
        return False

    # -- the single-core model (:686-788) --
    def _kk(self, k_chunk: int, k_blk: int) -> int:
        return min(k_blk * k_chunk, self.k_pt)

    def l2_matrix_usage(self, k_chunk: int, mn_blk: int, k_blk: int, h: bool, force: bool = False) -> int:
        p = self.p
        dec = self.m_dec if h else self.n_dec
        kk = self._kk(k_chunk, k_blk)
        l1 = _i32(2 * dec * kk * p.dt)
        l2 = _i32(mn_blk * kk * p.dt)
        if force:
            l2 = _i32(l2 + mn_blk * k_blk * k_chunk * p.dt)
        c_post = (2 * self.m_dec * _rnd_up(mn_blk * p.dt, 64)) if h else (2 * _rnd_up(self.n_dec * p.dt, 64) * mn_blk)
        if k_blk == p.K:  # (or acc_dt == dst_dt with nthr_k 1: never, for a bf16 output)
            c_tmp = 2 * self.m_dec * self.n_dec * p.acc
        else:
            c_tmp = 2 * dec * mn_blk * p.acc
        return l1 + l2 + _i32(c_tmp) + _i32(c_post)

    def l2_matrix_and_c_usage(self, k_chunk: int, mn_blk: int, k_blk: int, h: bool) -> int:
        p = self.p
        per = self.m_pt if h else self.n_pt
        kk = self._kk(k_chunk, k_blk)
        return _i32(2 * per * kk * p.dt) + _i32(2 * mn_blk * kk * p.dt) + per * mn_blk * p.acc

    def bw(self, m_blk: int, k_chunk: int, k_blk: int, n_blk: int, h: bool) -> int:
        p = self.p
        kk = self._kk(k_chunk, k_blk)
        a, b = _i32(m_blk * kk * p.dt), _i32(n_blk * kk * p.dt)
        fits = self.l2_matrix_and_c_usage(k_chunk, n_blk if h else m_blk, k_blk, h) < p.L2_thr
        c = 0 if ((fits or kk == p.K) and self.nthr_k == 1) else _i32(m_blk * n_blk * p.acc)
        return _i32(a + b + c)

    def ratio(self, m_blk: int, k_chunk: int, k_blk: int, n_blk: int, h: bool) -> float:
        compute = _i32(m_blk * self._kk(k_chunk, k_blk) * n_blk)
        return _f32(_f32(compute) / _f32(self.bw(m_blk, k_chunk, k_blk, n_blk, h)))

    def evaluate(self, k_chunk: int, mn_blk: int, k_blk: int, h: bool, force: bool = False) -> float:
        if self.l2_matrix_usage(k_chunk, mn_blk, k_blk, h, force) <= self.p.L2_thr:
            m_blk, n_blk = (self.m_dec, mn_blk) if h else (mn_blk, self.n_dec)
            return self.ratio(m_blk, k_chunk, k_blk, n_blk, h)
        return 0.0

    def calc_k_blk(self, l1_dim: int) -> int:  # calc_k_blk (:655-672)
        p = self.p
        c_tiles = self.m_dec * self.n_dec * p.acc
        d_tiles = self.m_dec * _rnd_up(self.n_dec * p.dt, 64)
        avail = (p.L1_thr - (2 * c_tiles + d_tiles)) % (1 << 64)
        largest_k_tiles = avail // (l1_dim * p.dt) // self.k_tmul
        kpt_tiles = _div_up(_div_up(p.K, self.k_tmul), self.nthr_k)
        num_k_blocks = _div_up(kpt_tiles, largest_k_tiles)
        return min(_div_up(kpt_tiles, num_k_blocks) * self.k_tmul, p.K)

    # -- set_blocking_parameters (:828-1070) --
    def set_blocking_parameters(self, force_horizontal: bool = False, force_b_to_l2: bool = False) -> bool:
        p = self.p
        m_cands = _blk_candidates(self.m_pt, self.m_dec)
        n_cands = _blk_candidates(self.n_pt, self.n_dec)
        st = {"k_h": 0, "n_h": 0, "m_v": 0, "k_v": 0, "score_h": 0.0, "score_v": 0.0,
              "h_no": False, "v_no": force_horizontal}

        def calc_horizontal(k_blk_h: int, min_k_chunk: int = 0) -> None:
            if _rnd_up(self.m_pt, self.m_dec) * (self.nthr_m - 1) >= p.M:
                st["h_no"] = True
            elif _rnd_up(self.k_pt, k_blk_h) * (self.nthr_k - 1) >= p.K:
                st["h_no"] = True
            else:
                k_cands = _blk_candidates(self.k_pt, k_blk_h)
                st["n_h"] = 0
                for n in reversed(n_cands):
                    for k in reversed(k_cands):
                        s = self.evaluate(k, n * self.n_dec, k_blk_h, True, force_b_to_l2)
                        if s > st["score_h"] and k >= min_k_chunk:
                            st["score_h"], st["k_h"], st["n_h"] = s, k, n
                if st["n_h"] == 0:
                    st["h_no"] = True
                    return
                if _rnd_up(self.n_pt, st["n_h"] * self.n_dec) * (self.nthr_n - 1) >= p.N:
                    st["h_no"] = True
                if _rnd_up(self.k_pt, st["k_h"] * k_blk_h) * (self.nthr_k - 1) >= p.K:
                    st["h_no"] = True

        k_blk_h = self.calc_k_blk(self.m_dec)
        calc_horizontal(k_blk_h)

        def calc_vertical(k_blk_v: int, min_k_chunk: int = 0) -> None:
            if _rnd_up(self.n_pt, self.n_dec) * (self.nthr_n - 1) >= p.N:
                st["v_no"] = True
            elif _rnd_up(self.k_pt, k_blk_v) * (self.nthr_k - 1) >= p.K:
                st["v_no"] = True
            else:
                k_cands = _blk_candidates(self.k_pt, k_blk_v)
                for m in reversed(m_cands):
                    for k in reversed(k_cands):
                        s = self.evaluate(k, m * self.m_dec, k_blk_v, False)
                        if s > st["score_v"] and k >= min_k_chunk:
                            st["score_v"], st["k_v"], st["m_v"] = s, k, m
                if st["m_v"] == 0:  # NB (module docstring): uninitialised in oneDNN when nothing scored
                    st["v_no"] = True
                    return
                if _rnd_up(self.m_pt, st["m_v"] * self.m_dec) * (self.nthr_m - 1) >= p.M:
                    st["v_no"] = True
                if _rnd_up(self.k_pt, st["k_v"] * k_blk_v) * (self.nthr_k - 1) >= p.K:
                    st["v_no"] = True
                l2_util = 0
                if not st["v_no"]:
                    l2_util = self.l2_matrix_and_c_usage(st["k_v"], st["m_v"] * self.m_dec, k_blk_v, False)
                    if l2_util > p.L2_thr:
                        l2_util = self.l2_matrix_usage(st["k_v"], st["m_v"] * self.m_dec, k_blk_v, False)
                k_steps = _div_up(p.K, k_blk_v * st["k_v"])
                if k_steps != 1 and (k_steps != self.nthr_k or l2_util * self.nthr_k >= p.L2_thr):
                    st["v_no"] = True
                l2_line = p.cache.l2_sets * p.cache.line
                if l2_line == 0:
                    st["v_no"] = True
                    return
                stride = p.N * p.dt % 4096 or 4096  # the output's N stride within a 4 KiB page
                if l2_line % stride == 0 and _div_up(stride * self.m_pt, l2_line) >= p.L2_ways_thr:
                    st["v_no"] = True

        k_blk_v = self.calc_k_blk(self.n_dec)
        calc_vertical(k_blk_v)
        if st["v_no"] and st["h_no"]:
            return False
        # is_horizontal_selected (:801-826)
        if st["h_no"]:
            h = False
        elif st["v_no"]:
            h = True
        elif self.m_pt < self.m_tmul * 2:
            h = True
        elif self.n_pt < self.n_tmul * 2:
            h = False
        else:
            h = self.m_pt >= self.n_pt
        self.is_horizontal = h
        # is_postops_bound (:980-984) is false: no post-op code (postops_estimator.hpp: 0 instructions)
        if h:
            l1_eff = _div_up(p.K, k_blk_h)
            a_l1 = k_blk_h * self.m_dec * p.dt
            c_l1 = self.n_dec * self.m_dec * p.acc
            d_post = self.m_dec * _rnd_up(self.n_dec * p.dt, 64)
            self.is_a_nt = False
            if k_blk_h < p.K and l1_eff * a_l1 + 2 * c_l1 + d_post > p.L1_thr:  # l1_set_issues (:997-1010)
                st["score_h"] = 0.0
                calc_horizontal(p.wei_k_blk, k_blk_h // p.wei_k_blk)
                k_blk_h = min(p.wei_k_blk * st["k_h"], p.K)
                st["k_h"] = 1
                self.is_a_nt = True
            self.k_blk, self.k_chunk_size = k_blk_h, st["k_h"]
            self.n_blk, self.n_chunk_size = min(st["n_h"] * self.n_dec, p.N), 1
            self.m_blk = self.m_dec
            self.m_chunk_size = _div_up(self.m_pt, self.m_blk)
            self.need_prefetch_a, self.need_prefetch_b = self.m_pt // self.m_blk >= 2, False
            self.use_fused_copy_a = (p.K % p.wei_k_blk != 0 and self.n_blk >= self.n_dec * 3
                                     and self.k_blk >= (64 // p.dt) * 4)
            self.extendable_k = (p.K % p.wei_k_blk != 0 and not self.skip_extendable_k()
                                 and not self.use_fused_copy_a)
        else:
            self.k_blk, self.k_chunk_size = k_blk_v, st["k_v"]
            self.n_blk = self.n_dec
            self.n_chunk_size = _div_up(self.n_pt, self.n_blk)
            self.m_blk, self.m_chunk_size = min(st["m_v"] * self.m_dec, p.M), 1
            self.is_a_nt = True
            self.need_prefetch_a = False
            self.need_prefetch_b = False  # (n_per_thread / n_blk >= 2) && !use_buffer_b: B is always copied
            self.use_fused_copy_a = False
            self.extendable_k = p.K % p.wei_k_blk != 0 and not self.skip_extendable_k()
        self.batch_size = 1
        self.n_chunk_elems = min(self.n_pt, self.n_blk * self.n_chunk_size)
        self.m_chunk_elems = min(self.m_pt, self.m_blk * self.m_chunk_size)
        self.k_chunk_elems = min(self.k_pt, self.k_blk * self.k_chunk_size)
        self.lda = self.actual_lda()
        self.need_buf_c = self.nthr_k != 1 or self.k_blk != p.K  # acc_dt != dst_dt for a bf16 output
        self.score = self.scores()
        return True

    def b_transform_fits_in_l2(self) -> bool:  # :594-600
        return self.l2_matrix_usage(self.k_chunk_size, self.n_blk, self.k_blk, True, True) < self.p.L2_thr

    # -- calculate_blocking_scores (:377-592), in float32 --
    def scores(self) -> float:
        p = self.p
        f = _f32
        h = self.is_horizontal
        s1_b_h = h
        s_b_v = not h
        s1_b_mlc_h = s1_b_h and self.b_transform_fits_in_l2()
        a_size = self.m_pt * self.k_pt * p.dt
        b_size = self.n_pt * self.k_pt * p.dt
        d_size = self.m_pt * self.n_pt * p.dt
        cycles_per_tmul = self.m_tmul * 64 * 16 // 1024
        c_sz = p.dt if self.nthr_k == 1 else p.acc
        if h:
            dst = self.m_dec * self.n_pt * c_sz
            tmuls = f(self.m_dec * self.k_pt * self.n_pt // (self.m_tmul * self.k_tmul * self.n_tmul))
            num_strip = f(_div_up(self.m_pt, self.m_dec))
            nt_l1_miss = f(b_size)
            l1_reuse = f(_div_up(self.n_blk, self.n_dec))
            s1_shared = f(b_size)
            s1_private = f(self.m_dec * self.k_pt * p.dt + dst)
            s1_coef = f(self.nthr_m)
            mid_shared = f(self.m_dec * self.k_pt * p.dt)
            mid_private = f(dst)
            mid_coef = f(max(1, self.nthr_n))
        else:
            dst = self.n_dec * self.m_pt * c_sz
            tmuls = f(self.n_dec * self.k_pt * self.m_pt // (self.m_tmul * self.k_tmul * self.n_tmul))
            num_strip = f(_div_up(self.n_pt, self.n_dec))
            nt_l1_miss = f(a_size)
            l1_reuse = f(_div_up(self.m_blk, self.m_dec))
            s1_shared = f(a_size)
            s1_private = f(self.n_dec * self.k_pt * p.dt + dst)
            s1_coef = f(self.nthr_n)
            mid_shared = f(self.n_dec * self.k_pt * p.dt)
            mid_private = f(dst)
            mid_coef = f(max(1, self.nthr_m))
        t_l1_miss = f(mid_shared * 2)
        t_l1_hit = f(mid_shared * f(l1_reuse - 1))
        c_elem = f(self.m_blk * self.n_blk)
        nd = _div_up(self.n_blk, self.n_dec)
        c_miss = f(self.m_blk * nd * _rnd_up(self.n_dec * p.dt, 64))
        c_total = f(self.m_blk * nd * _div_up(self.n_dec, 16) * 64)
        c_hit = f(c_total - c_miss)
        c_read_tmp = f(c_elem * p.acc)
        bw_tmp = _L1_LOAD_HIT if self.k_blk == p.K else _L1_STORE_MISS
        c_tmp_l1 = f(f(f(p.acc * c_elem) * self.k_chunk_size) / bw_tmp)
        c_l1 = f(f(f(f(c_miss / _L1_STORE_MISS) + f(c_hit / _L1_LOAD_HIT)) + f(c_read_tmp / _L1_LOAD_HIT)) + c_tmp_l1)
        l1 = f(f(f(f(t_l1_miss / _L1_LOAD_MISS) + f(t_l1_hit / _L1_LOAD_HIT)) + f(nt_l1_miss / _L1_LOAD_MISS)) + c_l1)
        b_tr_h = f(s1_shared / _get_bw(s1_coef)) if s1_b_h else 0.0
        b_tr_v = f(mid_shared / _get_bw(mid_coef)) if s_b_v else 0.0
        if s_b_v:
            mid_dram = f(mid_private / _get_bw(1))
            mid_llc = f(mid_private / _LLC)
        else:
            mid_dram = f(f(mid_shared / _get_bw(mid_coef)) + f(mid_private / _get_bw(1)))
            mid_llc = f(f(mid_private + mid_shared) / _LLC)
        strip_tmul = f(tmuls * cycles_per_tmul)
        mid = f(b_tr_v + max(mid_dram, mid_llc, l1, strip_tmul, 0.0))
        if not s1_b_h:
            s1 = f(f(s1_shared / _get_bw(s1_coef)) + f(s1_private / _get_bw(1)))
        elif s1_b_mlc_h:
            s1 = mid
        else:
            s1 = f(s1_shared / _LLC)
        gemm = f(f(b_tr_h + s1) + f(f(num_strip - 1) * mid))
        if self.nthr_k != 1:
            if self.m_pt * self.n_pt * p.acc * 2 < p.L2_thr:
                mn = self.nthr_m * self.nthr_n
                read = f(p.M * _rnd_up(p.N, 16) * p.acc * (self.nthr_k - 1) // mn)
                read_c = f(read / (_get_bw(2) if a_size + b_size + d_size < p.L2_thr else _LLC))
                write_c = f(f(p.M * p.N * p.dt // mn) / _get_bw(1))
                reduction = f(f(read_c + write_c) + 25000)
            else:
                return 0.0
        else:
            reduction = 0.0
        total_macs = f(p.M * p.K * p.N)
        total = f(f(gemm + reduction) * self.b_pt)
        peak = f((1024 // p.dt) * p.nthr)
        return f(f(total_macs / peak) / total)

    # operator> (:611-653)
    def better_than(self, o: "_Macro") -> bool:
        p = self.p
        if o.score > self.score:
            return False
        if o.score < self.score:
            return True
        if not self.is_horizontal and o.is_horizontal:
            return self.m_pt * p.K + self.m_pt * p.N < p.L2_thr and o.is_a_nt
        if self.is_horizontal and not o.is_horizontal:
            return not (o.m_pt * p.K + o.m_pt * p.N < p.L2_thr and self.is_a_nt)
        return self.m_chunk_size * self.n_chunk_size > o.m_chunk_size * o.n_chunk_size


def _macro(p: _Problem) -> _Macro:
    """find_best_blocking (:312-375)."""
    best = _Macro(p)
    cur = _Macro(p)
    if best.small_dims():
        return best
    for nthr in range(p.nthr, 0, -1):
        cur.nthr_ = nthr
        for b in range(1, nthr + 1):
            if nthr % b:
                continue
            for m in range(1, nthr // b + 1):
                if (nthr // b) % m:
                    continue
                for k in range(1, nthr // b // m + 1):
                    if (nthr // b // m) % k:
                        continue
                    cur.set_core_divs(b, m, k, nthr // b // m // k)
                    cur.set_tmul_sizes()
                    cur.set_decomposition()
                    if cur.divs_acceptable() and cur.set_blocking_parameters() and cur.better_than(best):
                        best = copy.copy(cur)
    if not p.transposed_B and not best.is_horizontal:  # use_buffer_b holds on AMX
        cur.nthr_ = best.nthr_b * best.nthr_m * best.nthr_n * best.nthr_k
        cur.set_core_divs(best.nthr_b, best.nthr_m, best.nthr_k, best.nthr_n)  # tmul/decomposition kept (:358-372)
        if cur.set_blocking_parameters(True) and cur.better_than(best):
            best = copy.copy(cur)
        if cur.set_blocking_parameters(True, True) and cur.better_than(best):
            best = copy.copy(cur)
    return best


# -- the micro heuristic ----------------------------------------------------------------------------------------------
def _unordered_order(values: list[int]) -> list[int]:
    """The order a default std::unordered_set<int> (libstdc++) yields after inserting `values` in turn: identity hash,
    13 buckets from the first insert up to 13 elements (_Prime_rehash_policy: 11 minimum, __fast_bkt[12] = 13), each
    new element put first in its bucket's run, a new bucket's run put first in the list."""
    assert len(set(values)) <= 13
    order: list[int] = []
    for v in values:
        if v in order:
            continue
        b = v % 13
        at = next((i for i, x in enumerate(order) if x % 13 == b), 0)
        order.insert(at, v)
    return order


class _Micro(_Params):
    """matmul_amx_blocking_params_micro_t (amx_blocking_heuristics.cpp:1106-1428)."""

    def calc_chunk_mem(self) -> int:  # calculate_chunk_memory_size (:1407-1424) with update_k_blocking_dependent_params
        p = self.p
        self.k_chunk_elems = self.k_blk * self.k_chunk_size * self.batch_size
        self.lda = self.actual_lda()
        # is_buffer_c_required (:77-82)
        self.need_buf_c = ((self.nthr_k > 1 and p.K > self.k_chunk_elems)
                           or p.K > self.k_chunk_elems or p.K % self.k_blk > 0)
        mce, nce, kce = self.m_chunk_elems, self.n_chunk_elems, self.k_chunk_elems
        a_buf = p.dt * self.lda * self.batch_size * mce if self.need_buf_a else 0
        c_buf = p.acc * mce * nce if self.need_buf_c else 0
        return p.dt * kce * mce + a_buf + p.dt * kce * nce + p.dt * self.n_blk * kce + p.dt * mce * nce + c_buf

    def set_blocking_parameters(self, nthr_k: int, n_blk: int, n_chunk: int, m_blk: int, m_chunk: int) -> None:
        p = self.p  # amx_blocking_heuristics.cpp:1236-1320
        self.nthr_k = max(1, nthr_k)
        self.nthr_mnb = p.nthr // self.nthr_k
        self.nthr_ = self.nthr_mnb * self.nthr_k
        self.n_blk, self.n_chunk_size, self.m_blk, self.m_chunk_size = n_blk, n_chunk, m_blk, m_chunk
        if 0 in (n_blk, n_chunk, m_blk, m_chunk):
            self.k_blk = self.k_chunk_size = self.k_chunk_elems = self.batch_size = 0
            self.score = 0.0
            return
        self.n_chunk_elems, self.m_chunk_elems = n_blk * n_chunk, m_blk * m_chunk
        if p.K < p.wei_k_blk:
            self.k_blk = _rnd_up(p.K, p.k_gran)
            self.batch_size = 1
        else:
            k_per_thr = _div_up(p.K, self.nthr_k)
            self.k_blk = min(_rnd_up(k_per_thr, p.k_gran), p.wei_k_blk)
            nkb = _div_up(p.K, self.k_blk)
            nkb_thr = _div_up(nkb, self.nthr_k)
            self.batch_size = nkb_thr
            chunk = self.calc_chunk_mem()
            div_min, div_max = chunk // p.L2_thr, _div_up(chunk, p.L2_thr)
            if div_min > (2 if p.lda_big_pow2 else 0) and self.batch_size > 1:
                kc1 = max(self.batch_size // div_min, 1)
                kc2 = _div_up(self.batch_size, div_max)
                t1, t2 = nkb_thr % kc1, nkb_thr % kc2
                self.batch_size = kc2 if (not (t1 == 0 or t2 < t1) or t2 == 0) else kc1
            self.k_chunk_elems = self.k_blk * self.batch_size * self.k_chunk_size
            brg_k = self.k_blk * self.batch_size
            k_tail = p.K % self.k_blk
            self.extendable_k = (p.K % p.wei_k_blk != 0 and brg_k > p.wei_k_blk and not self.need_buf_a_start
                                 and self.lda == p.K)
            if self.extendable_k:
                self.k_blk = p.K if brg_k >= p.K else brg_k
                self.k_chunk_size = self.batch_size = 1
            elif k_tail == 0 and p.K % (self.k_blk * self.batch_size) == 0:
                self.k_blk, self.batch_size = brg_k, 1
            elif self.nthr_k == 1 and p.K == self.k_blk * self.batch_size + k_tail:
                self.k_blk, self.batch_size = brg_k, 2
        self.need_buf_a = self.need_buf_a_start or (not self.extendable_k and p.K % p.k_gran != 0)
        self.chunk_mem_size = self.calc_chunk_mem()
        self.score = self.scores()

    def scores(self) -> float:  # calculate_blocking_scores (:1385-1405) and its three parts, in float32
        p = self.p
        f = _f32
        if 0 in (self.n_blk, self.n_chunk_size, self.m_blk, self.m_chunk_size, self.k_blk, self.batch_size):
            return 0.0
        coeff = f(min(p.nthr, 100))
        balance_f = f(f(coeff - 1) / coeff)
        cache_f = f(1 / coeff)
        # L2 utilisation (:1373-1383)
        l2, mem = p.L2_thr, self.chunk_mem_size
        l2_score = f(1 - f(abs(f(f(l2) - f(mem))) / f(max(l2, mem))))
        # copied data re-use (:1354-1371)
        des_m = min(p.M, 256)
        des_n = min(p.N, 64 * (4 if self.need_buf_a else 1))
        coef_m = min(f(f(self.m_chunk_elems) / f(des_m)), 1.0)
        coef_n = min(f(f(self.n_chunk_elems) / f(des_n)), 1.0)
        reuse = f(0.5 * f(coef_m + coef_n))
        s = f(f(cache_f * l2_score) + f(1.0 * reuse))
        if balance_f > 0:
            # thread balance (:1326-1352), batch 1
            nmc, nnc = _div_up(p.M, self.m_chunk_elems), _div_up(p.N, self.n_chunk_elems)
            mnb = f(f(f(f(f(p.M) / f(self.m_chunk_elems)) * f(f(p.N) / f(self.n_chunk_elems)))
                      / f(_rnd_up(nmc * nnc, self.nthr_mnb))) * f(self.nthr_mnb))
            kps = 1.0
            if self.nthr_k > 1:
                nkc = _div_up(p.K, self.k_chunk_elems)
                kps = f(f(f(f(0.8) * f(f(p.K) / f(self.k_chunk_elems))) / f(_rnd_up(nkc, self.nthr_k)))
                        * f(self.nthr_k))
            s = f(s + f(balance_f * f(f(mnb * kps) / f(p.nthr))))
        return f(s / f(f(1.0 + balance_f) + cache_f))


def _micro(p: _Problem, use_buffer_a: bool) -> _Micro:
    """compute_blocking_heuristic's AMX micro branch (brgemm_matmul_utils.cpp:1201-1249) and find_best_blocking
    (amx_blocking_heuristics.cpp:1106-1228)."""
    n_blk0 = min(p.wei_n_blk, p.N)

    def block_candidate() -> int:  # get_block_candidate (:1205-1225)
        for r in range(16, 12, -1):
            for s in range(4, 1, -1):
                if p.M % (s * r) == 0:
                    return s * r
        return min(p.M, 4 * 16)

    m_blk0 = block_candidate()
    fixed_tail = p.K % p.wei_k_blk > 0 and p.K > p.wei_k_blk
    k_blk0 = _rnd_up(p.K, p.k_gran) if p.K < p.wei_k_blk else (p.wei_k_blk if fixed_tail else p.K)
    bs0 = max(p.K // k_blk0, 1)

    def fresh() -> _Micro:
        b = _Micro(p, n_blk=n_blk0, m_blk=m_blk0, k_blk=k_blk0, batch_size=bs0, need_buf_a=use_buffer_a)
        b.need_buf_a_start = use_buffer_a
        b.chunk_mem_size = 0
        return b

    best, cur = fresh(), fresh()
    max_k_par = _div_up(p.K, 1024)
    max_nthr_k = min(min(max(p.nthr // 8, 1), 7), max_k_par)  # batch 1, no runtime dims
    for nthr_k in range(1, max_nthr_k + 1):
        nthr_bmn = p.nthr // nthr_k
        num_m, num_n = _div_up(p.M, m_blk0), _div_up(p.N, n_blk0)
        work = num_m * num_n * min(max_k_par, nthr_k)
        lot = work > 16 * p.nthr
        low = _f32(work) < _f32(1.5 * p.nthr)
        min_m = _div_up(m_blk0, 2) if low and m_blk0 > 32 else m_blk0
        min_n = n_blk0  # B comes with its strides: n_blk_fixed (brgemm_matmul_utils.cpp:357)
        des_m, des_n = min(4, num_m), min(6 if lot else 4, num_n)
        inserted = []
        m_blk = m_blk0
        while m_blk >= min_m:
            inserted.append(m_blk)
            m_blk = _div_up(m_blk, 2) if m_blk > 1 else m_blk - 1
        if p.M > 16:
            top, bottom = min(p.M // 16 * 16, 64), _rnd_up(min_m, 16)
            inserted.extend(range(top, bottom - 1, -16))
        m_cands = _unordered_order(inserted)
        disable_skip = p.M == 4 and (p.N, p.K) in ((4096, 4096), (11008, 4096), (4096, 11008))
        found = False
        for n_blk in range(n_blk0, min_n - 1, -16):
            for m_blk in m_cands:
                for n_ch in range(des_n, 0, -1):
                    for m_ch in range(des_m, 0, -1):
                        cur.set_blocking_parameters(nthr_k, n_blk, n_ch, m_blk, m_ch)
                        w = _div_up(p.M, m_blk * m_ch) * _div_up(p.N, n_blk * n_ch)
                        if w < nthr_bmn * 3 and w % nthr_bmn != 0 and max_nthr_k == 1 and not disable_skip:
                            continue
                        if cur.score > best.score:
                            best, found = copy.copy(cur), True
        if not found:
            cur.set_blocking_parameters(nthr_k, min_n, 1, min_m, 1)
            if cur.score > best.score:
                best = copy.copy(cur)
    return best


# -- the configuration and its bookings --------------------------------------------------------------------------------
@dataclass(frozen=True)
class AmxConf:
    nthr: int
    M_blk: int
    M_chunk: int
    N_blk: int
    N_chunk: int
    K_blk: int
    K_chunk: int
    batch_size: int
    nthr_k: int
    use_buffer_a: bool
    use_buffer_c: bool
    extendable_k: bool
    fused_copy_a: bool
    prefetch: bool
    LDA: int
    LDB: int
    LDC: int
    macro: bool


@lru_cache(maxsize=4096)
def amx_conf(m: int, k: int, n: int, nthr: int, transposed_a: bool, transposed_b: bool,
             cache: CacheInfo, small_shape_check: bool = True) -> AmxConf | None:
    """brg_matmul's configuration on AMX for this bf16 problem (init_brgemm_matmul_conf, brgemm_matmul_utils.cpp:
    1330-1960), or None where it hands the problem to the next implementation (small shapes, :1903-1930; not on
    avx512_core_amx_fp16: small_shape_check False)."""
    transposed_a = transposed_a and m != 1  # treat_A_as_plain (:1642-1645)
    p = _Problem(m, k, n, nthr, transposed_a, transposed_b, cache)
    prefer_copy_a = p.lda_big_pow2 and m >= 1024  # :1173-1181 (bf16)
    use_buffer_a = transposed_a  # is_copy_a_required (:1722-1732)
    b: _Params | None = None
    macro = False
    if p.macro_supported:
        mb = _macro(p)
        if mb.score != 0.0:
            b, macro = mb, True
    if b is None:
        b = _micro(p, use_buffer_a or prefer_copy_a)
        if b.score == 0.0:
            raise ValueError(f"oneDNN's AMX blocking fails for {(m, k, n, nthr)}")
    wei_n_blk = p.wei_n_blk
    if wei_n_blk > b.n_blk and n != b.n_blk:  # :1788-1808: B's copy padded to a cache line of VNNI pairs
        wei_n_blk = _rnd_up(b.n_blk, 64 // (p.k_gran * p.dt))
    use_c = b.need_buf_c
    ldc = min(32, b.n_blk) if use_c and b.nthr_k <= 1 else n  # :1830-1839 (LDD: N)
    conf = AmxConf(nthr=b.nthr_, M_blk=b.m_blk, M_chunk=b.m_chunk_size, N_blk=b.n_blk, N_chunk=b.n_chunk_size,
                   K_blk=b.k_blk, K_chunk=b.k_chunk_size, batch_size=b.batch_size, nthr_k=b.nthr_k,
                   use_buffer_a=b.need_buf_a, use_buffer_c=use_c, extendable_k=b.extendable_k,
                   fused_copy_a=b.use_fused_copy_a, prefetch=b.need_prefetch_a or b.need_prefetch_b,
                   LDA=b.lda, LDB=wei_n_blk, LDC=ldc, macro=macro)
    if small_shape_check and p.dt * conf.M_blk * conf.LDA <= 126:  # buffer_a_gb_stride (:2097-2098)
        return None
    return conf


def _c_tiles(bd: int, ld: int, rd: int, l1: int) -> int:
    """get_num_C_tiles (brgemm/brgemm_types.hpp:402-413) after brgemm_blocking_tmm (brgemm/brgemm_utils.cpp:295-
    640) for a bf16 kernel of bcast_dim `bd` (M), load_dim `ld` (N) and reduce_dim `rd` (K), as the matmul
    creates it (use_uker, no bd mask, no blocking hints): how many tiles C is decomposed into."""
    s = {"ld_block": 16, "ldb": ld // 16, "ldb_tail": ld % 16, "bd_block": 0, "bdb": 0, "bdb_tail": 0,
         "bd_block2": 0, "ld_block2": 0, "is_M_tail": False}

    def by_ld() -> None:  # set_decomposition_by_ld (:354-379)
        if s["bd_block2"] == 1 and s["ldb"] > 0 and s["ldb_tail"] == 0:
            s["ld_block2"] = 3 if s["ldb"] % 3 == 0 else 2 if s["ldb"] % 2 == 0 else 1
        else:
            s["ld_block2"] = 2 if (s["ldb"] > 0 and s["ldb"] % 2 == 0 and s["ldb_tail"] == 0
                                   and s["bd_block2"] < 3) else 1
        if s["ld_block2"] == 1 and not s["is_M_tail"] and s["ldb_tail"] == 0:
            s["bd_block2"] = 3 if s["bdb"] >= 3 else 2 if s["bdb"] >= 2 else 1

    def try_3x1(step: int) -> bool:  # :381-400
        s["is_M_tail"] = False
        if (step - 1) * 16 < bd < step * 16 and s["ldb_tail"] == 0:
            s["bd_block"], s["bdb"], s["bdb_tail"], s["is_M_tail"] = 16, _div_up(bd, 16), bd % 16, True
            s["bd_block2"] = step
            by_ld()
            return True
        return False

    def try_2x2() -> bool:  # :402-437
        for mb in range(16, 0, -1):
            if bd % mb == 0:
                s["bd_block"] = mb
                break
        if s["bd_block"] == 1:
            s["bd_block"], s["bdb_tail"] = min(16, bd), bd % 16
            for i in range(16, 0, -1):
                t = bd % i
                if t > s["bdb_tail"] or t == 0:
                    s["bd_block"], s["bdb_tail"] = i, t
                    if t == 0:
                        break
        s["bdb"], s["bdb_tail"] = bd // s["bd_block"], bd % s["bd_block"]
        s["bd_block2"] = 2 if s["bdb"] >= 2 else 1
        s["is_M_tail"] = False
        by_ld()
        return not (s["ld_block2"] == 1 or s["bd_block2"] == 1 or s["bd_block"] < 8)

    def recalc(bd_block: int, ld_block: int, bd_block2: int, ld_block2: int) -> None:  # :439-475 (uker)
        if bd_block:
            s["bd_block"] = bd_block
            s["bdb"], s["bdb_tail"] = _div_up(bd, bd_block), bd % bd_block
            s["is_M_tail"] = s["bdb_tail"] != 0
        if ld_block:
            s["ld_block"] = ld_block
            s["ldb"], s["ldb_tail"] = _div_up(ld, ld_block), ld % ld_block
        if bd_block2:
            s["bd_block2"] = bd_block2
        if ld_block2:
            s["ld_block2"] = ld_block2

    if not (try_2x2() or try_3x1(3) or try_3x1(2)):  # :488-505
        try_2x2()
    recalc(s["bd_block"], s["ld_block"], s["bd_block2"], s["ld_block2"])
    # the uker's shape rules (:526-623)
    eff_k = rd * 2  # reduce_dim · typesize_A · K_koef (1)
    low_k = (l1 - 4 * 1024) // (6 * 16)
    bdb_block_tail = not (s["bd_block"] > 12 and bd % s["bd_block"] == 0)
    ldb_tail_16 = ld % 16 != 0
    if not bdb_block_tail and not ldb_tail_16:  # 1x(4|5) or (4|5)x1 for a range of K
        k5 = low_k <= eff_k < (l1 - 5 * 1024) // (5 * 16)
        k4 = low_k <= eff_k < (l1 - 4 * 1024) // (4 * 16)
        if ld % 80 == 0 and k5 and bd > 32:
            recalc(0, 16, 1, 5)
        elif ld % 64 == 0 and k4 and bd > 32:
            recalc(0, 16, 1, 4)
        elif bd % 80 == 0 and k5 and ld > 32:
            recalc(0, 16, 5, 1)
        elif bd % 64 == 0 and k4 and ld > 32:
            recalc(16, 16, 4, 1)
    weak_ldb = s["ld_block"] < 8 or s["ldb_tail"] > 0
    weak_bdb = s["bd_block"] < 8 or s["bdb_tail"] > 0
    ldb_tail_only = ldb_tail_16 and not bdb_block_tail
    bdb_tail_only = bdb_block_tail and not ldb_tail_16
    ld16, bd16 = _rnd_up(ld, 16), _rnd_up(bd, 16)
    if ldb_tail_only and ld > 64 and s["ld_block"] < 8:
        recalc(0, 16, 2, 1)
    elif ldb_tail_only and weak_ldb and ld16 == 64:
        recalc(0, 16, 1, 4)
    elif ldb_tail_only and weak_ldb and ld16 == 48:
        recalc(0, 16, 1, 3)
    elif ldb_tail_only and weak_ldb and ld16 == 32:
        recalc(0, 16, 2, 2)
    elif bd <= 16:
        recalc(bd, 16, 0, 0)
        recalc(0, 0, 1, min((3 if s["ldb"] > 4 else 4) if ldb_tail_16 else 5, _div_up(ld, 16)))
    elif bdb_tail_only and weak_bdb and bd > 64:
        recalc(16, 16, 1, 2)
    elif bdb_tail_only and weak_bdb and bd16 == 64:
        recalc(16, 16, 4, 1)
    elif bdb_tail_only and weak_bdb and bd16 == 48:
        recalc(16, 16, 3, 1)
    elif bdb_tail_only and weak_bdb and bd16 == 32 and ld % 32 == 0:
        recalc(16, 16, 2, 2)
    elif ld <= 16:
        recalc(16, 16, 0, 0)
        recalc(0, 0, min((3 if s["bdb"] > 4 else 4) if s["bdb_tail"] else 5, _div_up(bd, 16)), 1)
    elif bdb_block_tail and ldb_tail_16 and bd16 == 32 and ld16 == 32 and (weak_ldb or weak_bdb):
        recalc(16, 16, 2, 2)
    # get_bd_block2 / get_ld_block2 (brgemm_types.hpp:392-400)
    bd2 = s["bdb"] if s["bdb"] <= s["bd_block2"] else s["bd_block2"] + (1 if s["bdb_tail"] else 0)
    ld2 = s["ldb"] if s["ldb"] <= s["ld_block2"] else s["ld_block2"] + (1 if s["ldb_tail"] else 0)
    return bd2 * ld2


TILE = 1024  # brgemm_desc_t::tilesize (brgemm/brgemm_types.hpp:377)
ALIGN = 128  # each booking's alignment (src/common/memory_tracking.hpp:384, 405-425)
BATCH_ELEMENT = 40  # sizeof(brgemm_batch_element_t) (brgemm/brgemm_types.hpp:142-163)


def tile_workspace(c: AmxConf, m: int, k: int, n: int, l1: int) -> int:
    """wsp_tile_per_thr_bytes (brgemm_matmul.cpp:353-449): the largest get_wsp_buffer_size (brgemm/brgemm_types.hpp:
    469-478: C tiles for the post-ops, a tile where A's K tail is read warily, fused copy A's rows) over the kernels
    made for the M/N/K blocks and tails and the batch tail (get_brg_kernel_index, brgemm_matmul.cpp:61-100)."""
    m_tail, n_tail = m % c.M_blk, n % c.N_blk
    k_tail = 0
    if k > c.K_blk:  # brgemm_matmul_utils.cpp:1815-1820
        k_tail = k % c.K_blk if (c.extendable_k or c.fused_copy_a) else _rnd_up(k % c.K_blk, 2)
    k_chunk_elems = c.K_blk * c.K_chunk * c.batch_size
    last = (max(k, c.K_blk) - (_div_up(k, k_chunk_elems) - 1) * k_chunk_elems) // c.K_blk  # :2062-2068
    bs_tail = last % c.batch_size
    wsp = 0
    for i_bs in ((0, 1) if bs_tail else (0,)):
        for vm in (c.M_blk, m_tail):
            for vn in (c.N_blk, n_tail):
                for i_k in ((0, 1) if k_tail else (0,)):
                    vk = k_tail if i_k else c.K_blk
                    bs = 1 if i_k else (bs_tail if i_bs else c.batch_size)
                    if 0 in (vm, vn, vk, bs) or c.LDA < vk:
                        continue
                    size = _c_tiles(vm, vn, vk, l1) * TILE
                    if c.extendable_k and (vk % 2 or (vk > 32 and vk % 32)):  # amx_wary_k_tail (:571-579)
                        size += TILE
                    if c.fused_copy_a:
                        size += bs * vm * _rnd_up(vk, 32) * 2
                    wsp = max(wsp, size)
    return wsp


def amx_scratch(m: int, k: int, n: int, nthr: int, transposed_a: bool, transposed_b: bool,
                cache: CacheInfo | None = None, small_shape_check: bool = True) -> int | None:
    """Bytes of brg_matmul's scratchpad on AMX (init_aux_values, brgemm_matmul_utils.cpp:2039-2249; init_scratchpad
    :2251-2316), each booking + ALIGN, for the threads the blocking uses (update_configuration sets bgmmc.nthr:
    the macro heuristic may use fewer); None where the small-shape rule hands the problem on (amx_conf).
      batch elements  16 · batch_size · 40 B per thread;
      A's copy        M_blk · LDA · 2 · batch_size · K_chunk · M_chunk per thread (when A is copied);
      B's VNNI copy   rnd_up(N_blk, LDB) · rnd_up(K_blk, 32) · 2 · batch_size · K_chunk per thread;
      fp32 C buffer   rnd_up(N_blk, LDC) · M_blk · 4 per thread (× M_chunk · N_chunk when a K chunk is not all of
                      K; LDC · M · 4 with K split over threads), when the blocks make partial sums;
      tile workspace  tile_workspace per thread."""
    cache = cache_info() if cache is None else cache
    c = amx_conf(m, k, n, nthr, transposed_a, transposed_b, cache, small_shape_check)
    if c is None:
        return None
    t = c.nthr
    k_chunk_elems = c.K_blk * c.K_chunk * c.batch_size
    total = t * 16 * c.batch_size * BATCH_ELEMENT + ALIGN
    if c.use_buffer_a:
        total += t * 2 * c.M_blk * c.LDA * c.batch_size * c.K_chunk * c.M_chunk + ALIGN
    total += t * 2 * _rnd_up(c.N_blk, c.LDB) * _rnd_up(c.K_blk, 32) * c.batch_size * c.K_chunk + ALIGN
    if c.use_buffer_c:
        if c.nthr_k == 1:
            chunk = _rnd_up(c.N_blk, c.LDC) * c.M_blk * 4
            per = chunk if k_chunk_elems >= k else chunk * c.M_chunk * c.N_chunk
        else:
            per = 4 * c.LDC * m
        total += t * per + ALIGN
    return total + t * tile_workspace(c, m, k, n, cache.l1) + ALIGN
