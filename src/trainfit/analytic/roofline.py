"""Per-kernel time on one GPU by a roofline with measured efficiencies (issue 14; no torch).

A kernel takes max(its FLOPs at the achievable matmul rate, its bytes at the achieved HBM bandwidth) plus a
per-kernel launch cost. The achievable rates are data with sources (data/kernels.toml, read once); the shape
dependence is a mechanism, not a fitted curve:

  * GEMM: wave and tile quantisation after NVIDIA's "Matrix Multiplication Background User's Guide"
    (docs.nvidia.com/deeplearning/performance, DU-09799-001, ch. 3 "Dimension Quantization Effects", §3.1 tile and
    §3.2 wave quantization): the output is cut into Tm x Tn tiles, one tile per SM per wave; a wave takes as long as one full
    tile, so time = ceil(tiles / SMs) x (one tile's FLOPs at the per-SM achievable rate). The largest tile's rate
    is the MAMF (max achievable matmul FLOP/s, measured on a well-quantised large shape) / SMs; smaller tiles
    (the guide's list) are capped by the measured L2 bandwidth per SM; the fastest tile is taken.
  * fused attention (FlashAttention-2 §3.2 work partitioning): the grid is batch x heads x query tiles (Br rows);
    each CTA walks its key blocks (Bc rows, fewer under a causal mask, a partial edge block costing a whole one)
    plus one pipeline-fill step, and CTAs run in waves over the SMs. Short sequences have few key blocks per CTA,
    so the fill step weighs more. Long sequences reach the kernel's published fraction of peak.
  * fp32 GEMMs on the CUDA cores (no TF32) where their kernels were measured: cuBLAS's SIMT tiles, warps per SM
    scheduler, the thin operand's stream and the epilogue's writes (_simt_gemm_seconds).
  * eager attention: two batched GEMMs plus the s_q x s_kv score tensor's softmax (and mask) traffic.
  * memory-bound ops: bytes at the achieved HBM bandwidth + launches.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

from trainfit.data import load_toml
from trainfit.hardware import GPU
from trainfit.low_precision import RECIPES

# bytes per element of trainfit's compute dtypes; the low-precision recipes' GEMM dtypes (their peak keys: mxfp8,
# fp4) take their format's element (low_precision.RECIPES)
_SIZE = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1, "fp6": 0.75}
_SIZE.update({r.peak: r.element_bytes for r in RECIPES.values() if r.peak not in _SIZE})


# the block-scaled GEMM dtypes (gpus.json peak_flops keys of low_precision.Recipe.peak) whose fraction is fp8's
BLOCK_SCALED = ("mxfp8", "fp4")


@dataclass(frozen=True)
class Kernels:
    sms: int                          # streaming multiprocessors / compute units (wave size)
    matmul_fraction: dict[str, float]  # dtype -> MAMF / datasheet dense peak
    hbm_fraction: float               # achieved / datasheet HBM bandwidth
    launch_seconds: float             # GPU-side cost per kernel
    attention: dict[str, float]       # kernel -> forward fraction of the datasheet peak at long sequence
    attention_bwd: dict[str, float] = field(default_factory=dict)  # kernel -> backward fraction (falls back to forward)
    tile: tuple[int, int] = (256, 128)       # GEMM output tile per SM per wave (MMBG)
    # fused-attention kernel -> ((max head_dim, Br, Bc), ...); "default" for kernels without their own entry
    attn_tiles: dict[str, tuple[tuple[int, int, int], ...]] = field(
        default_factory=lambda: {"default": ((64, 128, 128), (128, 128, 64), (256, 64, 64))})
    l2_bytes_per_sm: float = 0.0     # measured L2 -> SM bandwidth per SM (B/s); 0 = not measured
    link_fraction: float = 1.0        # NCCL bus bandwidth / datasheet NVLink rate (1.0 = not measured)
    host_link: float = 0.0            # GPU <-> host bytes/s per direction (pinned copies); 0 = unknown
    # fused-attention kernel -> launches of its backward where the GPU's default kernel differs (cuDNN on Hopper)
    attention_bwd_launches: dict[str, int] = field(default_factory=dict)
    # ... and the launches it adds when k and v are shared by query-head groups (GQA), or, forward, with dropout
    attention_gqa_bwd_launches: dict[str, int] = field(default_factory=dict)
    attention_dropout_launches: dict[str, int] = field(default_factory=dict)
    gemm_tiles: tuple[tuple[int, int], ...] = ()  # the tiles cuBLAS runs on this generation (measured); () = MMBG's
    unaligned_fraction: float = 0.0  # 16-bit GEMM with a row not 16-byte aligned / peak (measured); 0 = unmeasured
    # fp32 GEMMs on the CUDA cores: cuBLAS's SIMT tiles (Tm, Tn, warps per CTA) and its split-K reduction kernel's
    # time (measured); () = fp32 timed with the tensor-core tiles above
    simt_tiles: tuple[tuple[int, int, int], ...] = ()
    splitk_reduce_seconds: float = 0.0
    # of launch_seconds, the part inside a kernel's own profiled duration (measured); 0 = unmeasured
    kernel_floor_seconds: float = 0.0
    access: dict[str, float] = field(default_factory=dict)  # memory access class -> / streaming bandwidth
    sdpa: str = "flash"              # the kernel torch's SDPA runs for a 16-bit call on this generation
    # fused-attention kernel -> its measured model (kernels.toml [generation.*.cudnn], [generation.*.efficient])
    fitted: dict[str, "FittedAttention"] = field(default_factory=dict)
    threads_per_sm: int = 0           # maximum resident threads per SM (0: not listed, AMD)
    generation: str = ""

    def matmul(self, dtype: str) -> float:
        """Fraction for `dtype`; a dtype the GPU's entry lacks takes bf16's, then fp16's (NB: an unmeasured dtype's
        fraction of its own peak is assumed equal to bf16's; GPU.flops_for already maps fp8 without hardware
        support to the 16-bit peak)."""
        f = self.matmul_fraction
        if dtype in BLOCK_SCALED and dtype not in f:
            # NB: the block-scaled fp8 / fp4 GEMMs (sm100) unmeasured: fp8's fraction of their own peak
            dtype = "fp8"
        return f.get(dtype) or f.get("bf16") or f.get("fp16") or next(iter(f.values()))

    def attn_block(self, head_dim: int, kernel: str = "default") -> tuple[int, int]:
        """[Br, Bc] of the fused kernel for this head dim: the first entry whose head-dim bound covers it."""
        tiles = self.attn_tiles.get(kernel) or self.attn_tiles["default"]
        for bound, br, bc in tiles:
            if head_dim <= bound:
                return br, bc
        return tiles[-1][1], tiles[-1][2]


@lru_cache(maxsize=1)
def _table() -> dict:
    return load_toml("kernels.toml")


def power_clock(watts: float, ref_watts: float, static_watts: float, knee: float = 0.0) -> float:
    """SM clock at a board power cap `watts` relative to the clock the fractions were measured at (`ref_watts`).
    Board power = static + dynamic, dynamic = a*C*V^2*f (CMOS switching power). Over the upper DVFS range V rises
    ~linearly with f, so dynamic ∝ f^3; below the clock where V reaches the chip's minimum (the voltage floor) V stays
    there and dynamic ∝ f. `knee` = that floor clock / the clock at ref_watts under the same load (kernels.toml
    [voltage_floor], fitted on C2/C5; 0 = no floor known: the cube law throughout). With r = (P - P_static) / (P_ref - P_static)
    and dynamic normalised to r = 1 at f_ref (k = knee):
        f/f_ref = r^(1/3)   while r >= k^3        (V ∝ f: dynamic = (f/f_ref)^3)
        f/f_ref = r / k^2   below                 (V = V_min = k V_ref: dynamic = (f/f_ref) k^2; continuous at k^3)
    tensor-core FLOP/s ∝ f.
    NB: where no floor is known (knee 0) the cube law errs optimistic at deep caps (a GB300 at 500 of 1400 W ran its
    GEMMs at 0.28-0.39 of the rate: 0.31 with the floor, 0.66 by the cube; kernels.toml GB300PL). Above the floor V is
    taken ∝ f, while a real V-f curve is affine (V_min > 0 at the floor): it draws more at a given clock, so the cube
    branch errs optimistic. A kernel that drew less than ref_watts uncapped loses less (errs pessimistic)."""
    if not ref_watts or watts >= ref_watts:
        return 1.0
    r = max(watts - static_watts, 0.0) / (ref_watts - static_watts)
    k = min(max(knee, 0.0), 1.0)
    return r ** (1 / 3) if r >= k ** 3 else r / k ** 2


def voltage_floor(generation: str) -> float:
    """power_clock's knee for a GPU generation: kernels.toml [voltage_floor] clock where the generation is listed,
    else 0 (the cube law throughout)."""
    vf = _table().get("voltage_floor", {})
    return float(vf["clock"]) if generation in vf.get("generations", ()) else 0.0


def _build(entry: dict, gen: dict, name: str, clock: float = 1.0) -> Kernels:
    d = _with_derived({**gen, **entry})
    try:
        return Kernels(sms=int(d["sms"]), matmul_fraction={k: v * clock for k, v in d["matmul_fraction"].items()},
                       hbm_fraction=float(d["hbm_fraction"]), launch_seconds=float(d["launch_seconds"]),
                       attention={k: v * clock if k != "eager" else v for k, v in d["attention"].items()},
                       attention_bwd={k: v * clock if k != "eager" else v
                                      for k, v in d.get("attention_bwd", {}).items()},
                       tile=tuple(d.get("tile", (256, 128))),
                       attn_tiles=_attn_tiles(d["attn_tiles"]),
                       l2_bytes_per_sm=float(d.get("l2_per_sm", 0.0)),
                       link_fraction=float(d.get("link_fraction", 1.0)),
                       host_link=float(d.get("host_link", 0.0)),
                       attention_bwd_launches={k: int(v) for k, v in d.get("attention_bwd_launches", {}).items()},
                       attention_gqa_bwd_launches={k: int(v) for k, v in
                                                   d.get("attention_gqa_bwd_launches", {}).items()},
                       attention_dropout_launches={k: int(v) for k, v in
                                                   d.get("attention_dropout_launches", {}).items()},
                       gemm_tiles=tuple(tuple(int(x) for x in t) for t in d.get("gemm_tiles", ())),
                       unaligned_fraction=float(d.get("matmul_unaligned_fraction", 0.0)) * clock,
                       simt_tiles=tuple(tuple(int(x) for x in t) for t in d.get("simt_tiles", ())),
                       splitk_reduce_seconds=float(d.get("splitk_reduce_seconds", 0.0)),
                       kernel_floor_seconds=float(d.get("kernel_floor_seconds", 0.0)),
                       access={k: float(v) for k, v in d.get("access", {}).items()},
                       sdpa=str(d.get("sdpa", "flash")),
                       fitted={k: _fitted(d[k], clock) for k in FITTED_KERNELS if d.get(k)},
                       generation=str(d.get("generation", "")),
                       threads_per_sm=int(d.get("threads_per_sm", 0)))
    except KeyError as e:
        raise ValueError(f"kernels.toml: {name} lacks {e.args[0]!r}") from None


# the fused-attention kernels kernels.toml may give a measured model of, as [generation.*.<kernel>]
FITTED_KERNELS = ("cudnn", "efficient")


@dataclass(frozen=True)
class FittedAttention:
    """A fused attention kernel as measured (kernels.toml [generation.hopper.cudnn] / [...efficient]): per head dim,
    the fraction of the peak its matmuls reach, a fixed time per call, and the tiles its forward and backward walk,
    for the forward and the backward; `fill` pipeline-fill steps per CTA in the tile factor."""
    head_dims: tuple[int, ...]
    forward: tuple[float, ...]
    backward: tuple[float, ...]
    forward_fixed: tuple[float, ...]
    backward_fixed: tuple[float, ...]
    forward_tiles: tuple[tuple[int, int], ...]
    backward_tiles: tuple[tuple[int, int], ...]
    fill: int
    backward_bytes_per_element: float
    # the same kernel built for fp32 and/or dropout, fitted apart (kernels.toml [...<kernel>.fp32], .dropout,
    # .fp32_dropout): another template instantiation or engine config (fmha_cutlassB_f32_..._dropout_sm80), not
    # a scaling of this one
    variants: tuple[tuple[str, "FittedAttention"], ...] = ()

    def variant(self, dtype: str, dropout: bool) -> "FittedAttention | None":
        """The fit for `dtype` with or without dropout: this one for 16-bit without, else the fitted variant, or
        None where that was not measured."""
        key = "_".join(k for k in ("fp32" if dtype == "fp32" else "", "dropout" if dropout else "") if k)
        return dict(self.variants).get(key) if key else self

    def at(self, head_dim: int, backward: bool) -> tuple[float, float]:
        """(fraction, fixed seconds) at `head_dim`: linear between the measured head dims, the nearer one outside."""
        frac, fixed = (self.backward, self.backward_fixed) if backward else (self.forward, self.forward_fixed)
        dims = self.head_dims
        if head_dim <= dims[0]:
            return frac[0], fixed[0]
        for i in range(1, len(dims)):
            if head_dim <= dims[i]:
                w = (head_dim - dims[i - 1]) / (dims[i] - dims[i - 1])
                return frac[i - 1] + w * (frac[i] - frac[i - 1]), fixed[i - 1] + w * (fixed[i] - fixed[i - 1])
        return frac[-1], fixed[-1]

    def tile(self, head_dim: int, backward: bool) -> tuple[int, int]:
        """The [queries, keys] tile of the first measured head dim that holds `head_dim` (the kernels pick their
        tiles by head-dim bound), else the largest's."""
        tiles = self.backward_tiles if backward else self.forward_tiles
        return next((t for d, t in zip(self.head_dims, tiles) if head_dim <= d), tiles[-1])


def _fitted(raw: dict, clock: float = 1.0) -> FittedAttention:
    """`clock`: a power-capped board's SM clock ratio (power_clock), which scales the compute fractions. One
    `tile` is every head dim's, both ways; else `forward_tiles` / `backward_tiles` per head dim."""
    n = len(raw["head_dims"])
    fwd_tiles = raw.get("forward_tiles") or [raw["tile"]] * n
    bwd_tiles = raw.get("backward_tiles") or [raw["tile"]] * n
    # a variant's sub-table gives its own fractions and fixed times; what it leaves out (tiles, fill, the
    # backward's passes) is the base kernel's
    own = {k: v for k, v in raw.items() if not isinstance(v, dict)}
    variants = tuple((name, _fitted({**own, **sub}, clock)) for name, sub in raw.items() if isinstance(sub, dict))
    return FittedAttention(tuple(raw["head_dims"]), tuple(f * clock for f in raw["forward"]),
                           tuple(f * clock for f in raw["backward"]),
                           tuple(raw["forward_fixed_seconds"]), tuple(raw["backward_fixed_seconds"]),
                           tuple(tuple(int(x) for x in t) for t in fwd_tiles),
                           tuple(tuple(int(x) for x in t) for t in bwd_tiles),
                           int(raw["fill"]), float(raw.get("backward_bytes_per_element", 0.0)), variants)


def _with_derived(d: dict) -> dict:
    """Adds kernels.toml's [derived.*] attention kernels to an entry that has their base kernel: fractions = the
    base's times the published ratio, with their own tiles and backward launches."""
    d = dict(d)
    for name, k in _table().get("derived", {}).items():
        base = k["of"]
        if base not in d["attention"]:
            continue
        fwd = d["attention"][base]
        d["attention"] = {**d["attention"], name: fwd * k["forward"]}
        d["attention_bwd"] = {**d.get("attention_bwd", {}),
                              name: d.get("attention_bwd", {}).get(base, fwd) * k["backward"]}
        tiles = d["attn_tiles"] if isinstance(d["attn_tiles"], dict) else {"default": d["attn_tiles"]}
        d["attn_tiles"] = {**tiles, name: k["tiles"]}
        d["attention_bwd_launches"] = {**d.get("attention_bwd_launches", {}), name: k["bwd_launches"]}
    return d


def _attn_tiles(raw) -> dict[str, tuple[tuple[int, int, int], ...]]:
    """kernels.toml's attn_tiles: a list (every fused kernel) or a table kernel -> list with a "default" key."""
    table = raw if isinstance(raw, dict) else {"default": raw}
    return {k: tuple(tuple(int(x) for x in t) for t in v) for k, v in table.items()}


@lru_cache(maxsize=64)
def _kernels_by_name(name: str, watts: float = 0.0, tdp: float = 0.0) -> Kernels:
    """kernels.toml's [gpu."NAME"] over its generation's table. `watts`: the board's power (gpus.json power_watts,
    or the run's --power-limit); below the power its compute fractions hold at it lowers them (power_clock). That
    power is the entry's `fraction_watts` where its fractions were measured on a board with more power than the
    catalog's (the H100-96GB's 500 W part timed with the 700 W SXM's fractions), else `tdp`, the board's own
    (GPU.tdp_watts): its fractions are of its datasheet peaks, which hold at its TDP. power_clock's knee is the
    generation's voltage_floor."""
    t = _table()
    entry = t["gpu"].get(name)
    if entry is None:  # GPU.kernels is a catalog name (hardware.py checks a file's); every one has an entry
        raise ValueError(f"kernels.toml has no [gpu.{name!r}] entry")
    clock = 1.0
    ref = float(entry.get("fraction_watts") or tdp)
    if watts and ref:
        from .energy import check_above_static, static_watts  # lazy: energy -> terms -> step_time imports this
        from ..hardware import get_gpu
        chip = get_gpu(name)  # (a GPU file's chip: its static power, where the cap itself was checked on the file's)
        check_above_static(chip, watts)
        clock = power_clock(watts, ref, static_watts(chip), voltage_floor(entry["generation"]))
    return _build(entry, t["generation"][entry["generation"]], name, clock=clock)


def fused_dropout_seconds(gpu: GPU, batch_heads: float, s_q: float, s_kv: float, causal: bool,
                          window: int = 0) -> float:
    """What dropout adds to one fused attention forward: a random draw per score at the measured SM-seconds
    (kernels.toml [dropout]) spread over the GPU's SMs. Causal kernels skip masked blocks, so only kept pairs draw
    (under a sliding window, its pairs)."""
    scores = batch_heads * attention_pairs(s_q, s_kv, causal, window)
    return scores * float(_table()["dropout"]["sm_seconds_per_score"]) / kernels_for(gpu).sms


def mta_iteration_seconds() -> float:
    """The latency of one iteration of a multi_tensor_apply CTA (kernels.toml [multi_tensor_apply], measured on an
    H200): analytic/multi_tensor.py's floor under a launch with too few CTAs to stream at HBM bandwidth."""
    return float(_table()["multi_tensor_apply"]["iteration_seconds"])


def host_seconds_per_kernel(no_grad: bool = False) -> float:
    """The host's time to issue one kernel from eager PyTorch: a training step's, or an inference forward's under
    no_grad (no autograd recording) — kernels.toml [host], measured on H200 hosts."""
    return float(_table()["host"]["no_grad_seconds_per_kernel" if no_grad else "eager_seconds_per_kernel"])


def host_memory_bandwidth() -> float:
    """The host's memory bandwidth, bytes/s (kernels.toml [host] memory_bandwidth): a CPU optimizer step's rate."""
    return float(_table()["host"]["memory_bandwidth"])


def cluster_table() -> dict:
    """kernels.toml [cluster]: what a job of many GPUs of one SKU adds to one GPU's kernels (analytic/stragglers.py)."""
    return _table()["cluster"]


def kernels_for(gpu: GPU) -> Kernels:
    """Kernel data for `gpu`: its kernels.toml entry, the catalog GPU it names in GPU.kernels (its own name for a
    catalog GPU; a GPU file names the catalog GPU of its chip)."""
    return _kernels_by_name(gpu.kernels, gpu.power_watts, gpu.tdp_watts)


def blackwell(gpu: GPU) -> bool:
    """Compute capability 10 or later: the GPUs kernels.toml files under the Blackwell generation (the checks the
    stacks make on get_device_capability()[0] >= 10)."""
    return kernels_for(gpu).generation == "blackwell"


def _size(dtype: str) -> float:
    """Bytes per element. NB: an MX format's e8m0 scale (1 B per 32 values) is left out: under-counts by 1/32 B."""
    return _SIZE.get(dtype, 2)


def _bandwidth(gpu: GPU, kn: Kernels) -> float:
    return gpu.memory_bandwidth * kn.hbm_fraction


# ---- GEMM ------------------------------------------------------------------------------------------------------
def gemm_waves(kn: Kernels, m: int, n: int, batch: int = 1) -> tuple[int, int]:
    """(output tiles, waves) of a (batched) GEMM with the GPU's largest tile, one tile per SM per wave (MMBG §3.2:
    on A100 a 256x128 tile runs one thread block per SM, so a wave is 108 tiles)."""
    tm, tn = kn.tile
    tiles = batch * math.ceil(m / tm) * math.ceil(n / tn)
    return tiles, math.ceil(tiles / kn.sms)


def gemm_efficiency(kn: Kernels, m: int, n: int, batch: int = 1) -> float:
    """Useful fraction of the SM-time a GEMM occupies: m*n*batch / (waves * SMs * Tm*Tn) — tile quantisation
    (padded edge tiles, MMBG §3.1) times wave quantisation (idle SMs in the last wave, §3.2)."""
    tm, tn = kn.tile
    _, waves = gemm_waves(kn, m, n, batch)
    return (m * n * batch) / (waves * kn.sms * tm * tn)


# MMBG §2.3 "Typical Tile Dimensions in cuBLAS and Performance" (paraphrased): cuBLAS picks among these thread-block
# tiles, 256x128 / 128x256 the most efficient and 64x64 the least, larger tiles reusing each loaded operand more.
_CUBLAS_TILES = ((256, 128), (128, 256), (128, 128), (256, 64), (64, 256), (128, 64), (64, 128), (64, 64))


@lru_cache(maxsize=256)
def _tile_rates(kernels: str, dtype: str, per_sm: float) -> tuple[tuple[int, int, float], ...]:
    """(Tm, Tn, per-SM FLOP/s) for each tile the GPU may use. A tile streams (Tm + Tn) * size bytes of A and B from
    L2 per 2*Tm*Tn FLOPs, so with the measured L2 bandwidth per SM its rate is at most l2 * 2*Tm*Tn/((Tm+Tn)*size).
    The GPU's own tile is the one the MAMF was measured with: its rate is the MAMF, and a smaller tile loses the
    ratio of the two L2 bounds (only where that bound binds). No L2 measurement: the GPU's tile alone (NB).
    The candidates: the generation's measured tiles (kernels.toml gemm_tiles), else MMBG's smaller than the GPU's."""
    kn = _kernels_by_name(kernels)
    big = kn.tile
    if not kn.l2_bytes_per_sm:
        return ((big[0], big[1], per_sm),)
    size = _size(dtype)

    def l2_bound(tm: int, tn: int) -> float:
        return kn.l2_bytes_per_sm * 2 * tm * tn / ((tm + tn) * size)

    top = min(per_sm, l2_bound(*big))
    tiles = kn.gemm_tiles or [big] + [t for t in _CUBLAS_TILES if t[0] * t[1] < big[0] * big[1]]
    # a larger tile than the GPU's streams less per FLOP but runs no faster than the MAMF
    return tuple((tm, tn, per_sm * min(1.0, min(per_sm, l2_bound(tm, tn)) / top)) for tm, tn in tiles)


def gemm_seconds(gpu: GPU, m: int, n: int, k: int, dtype: str, batch: int = 1, rows: str = "nk") -> float:
    """C[m,n] = A[m,k] @ B[k,n] on one GPU, `batch` independent GEMMs in one launch (see _gemm_seconds). `rows`: the
    dimensions that are a stored operand's row (its leading dimension, the stride the alignment rule reads): n and
    k for a forward or dgrad GEMM, m and n for a wgrad (ops/derived.py backward)."""
    if min(m, n, k, batch) <= 0:
        return 0.0
    # averaged dimensions (tokens per expert, experts per rank) can be fractional: a kernel runs whole rows and
    # whole GEMMs, so round up (int() made 0.5 rows a 0-tile GEMM and divided by zero)
    return _gemm_seconds(gpu, *(math.ceil(x) for x in (m, n, k)), dtype, math.ceil(batch), rows)


@lru_cache(maxsize=65536)  # the planner times the same shapes for many layouts
def _gemm_seconds(gpu: GPU, m: int, n: int, k: int, dtype: str, batch: int, rows: str = "nk") -> float:
    """C[m,n] = A[m,k] @ B[k,n], `batch` of them in one launch. Compute: for each tile the GPU may use (see
    _tile_rates), waves x one tile's 2*Tm*Tn*k FLOPs at that tile's per-SM rate; the fastest is taken (cuBLAS's
    heuristic picks the tile). When the output grid leaves SMs idle, K is split over them (split-K / stream-K,
    CUTLASS docs "Efficient GEMM in CUDA" §"Parallelized Reductions"): s = SMs // tiles slices of >= 256 deep, whose
    fp32 partial sums are written and re-read. Memory: A, B, C once (+ partials) at the achieved HBM bandwidth.
    NB: assumes operands hit in L2 (a tile row/column is re-read by the other tiles of its wave): optimistic for
    GEMMs whose operands overflow L2 in a bad raster order."""
    kn = kernels_for(gpu)
    if dtype == "fp32" and kn.simt_tiles:
        return _simt_gemm_seconds(gpu, kn, m, n, k, batch)
    size = _size(dtype)
    # a row not a multiple of 16 bytes: the unaligned fallback kernels where measured (kernels.toml
    # matmul_unaligned_fraction). The rows are the operands' leading dimensions, the strides a TMA descriptor needs
    # in multiples of 16 bytes (CUDA programming guide, 'Tensor Memory Access'): of a linear layer's forward
    # (tokens, out, in) and dgrad (tokens, in, out) n and k; of its wgrad (in, out, tokens) m and n (x and dY are
    # [tokens, in] and [tokens, out], dW [out, in]). The tokens are never a row: 1220 of them (a Qwen3-VL sample,
    # 1024 text + 196 image) no more unaligned than 1224
    dims = {"m": m, "n": n, "k": k}
    unaligned = kn.unaligned_fraction and size == 2 and any(dims[d] * size % 16 for d in rows)
    per_sm = gpu.flops_for(dtype) * (kn.unaligned_fraction if unaligned else kn.matmul(dtype)) / kn.sms
    base = (m * k + k * n + m * n) * size * batch
    bw = _bandwidth(gpu, kn)
    best = math.inf
    for tm, tn, rate in _tile_rates(gpu.kernels, dtype, per_sm):
        tiles = batch * math.ceil(m / tm) * math.ceil(n / tn)
        splits = max(1, min(kn.sms // tiles, math.ceil(k / 256))) if tiles < kn.sms else 1
        waves = math.ceil(tiles * splits / kn.sms)
        compute = waves * 2 * tm * tn * math.ceil(k / splits) / rate
        nbytes = base + (2 * splits * m * n * 4 * batch if splits > 1 else 0)  # fp32 partials written then reduced
        best = min(best, max(compute, nbytes / bw))
    return best + kn.launch_seconds


def _simt_gemm_seconds(gpu: GPU, kn: Kernels, m: int, n: int, k: int, batch: int) -> float:
    """An fp32 GEMM on the CUDA cores: cuBLAS's SIMT kernels (kernels.toml simt_tiles, 8-deep k steps), timed as
    _gemm_seconds times a tile (waves of tiles, split-K over idle SMs, the fastest tile), with what the H200's fp32 LoRA
    GEMMs (bench/results/gpu/H200-2026-11-27-unrecorded-12-kernels-lora.json, docs/benchmarks/gpu-truth.md) showed these kernels add:
      * an SM has 4 warp schedulers, each issuing one instruction per clock for its own warps (CUDA C++ Programming
        Guide, compute capability 8.x / 9.0): a CTA of w < 4 warps alone on its SM issues FFMAs at w/4 of the SM's
        rate, so a thin GEMM's single wave of 2-warp CTAs runs at half rate, and split-K keeps splitting until every
        scheduler has a warp (SMs x 4 // w CTAs). NB: one warp per scheduler is taken to keep it busy (its
        micro-tile's independent FMAs): optimistic where latency is exposed;
      * the k loop streams A and B at the `simt` access class (kernels.toml access: a thin GEMM's large operand read
        by a few CTAs' shallow pipelines) or does its FMAs, whichever is longer;
      * the epilogue then writes C (and split-K's fp32 slices) at the streaming bandwidth, not overlapped;
      * split-K's slices are summed by a second kernel (cublasLt::splitKreduce_kernel): its measured time + a launch.
    NB: every tile runs at the one per-SM rate (matmul_fraction fp32, fitted on large GEMMs), so the smallest tile,
    which quantises best, wins on large GEMMs where cuBLAS runs 128-256 wide ones: the fitted rate absorbs their wave
    loss, and mid-sized GEMMs whose wide tiles leave SMs idle read fast (GPT-2's 768-wide layers, -13 % on the H200);
    cuBLAS's 64-wide xmma tiles (4 warps, 32 outputs per thread) run below that rate: rank-64 adapters read -7 %."""
    per_sm = gpu.flops_for("fp32") * kn.matmul("fp32") / kn.sms
    bw = _bandwidth(gpu, kn)
    stream = bw * kn.access.get("simt", 1.0)
    reads, write = (m * k + k * n) * 4 * batch, m * n * 4 * batch
    best = math.inf
    for tm, tn, warps in kn.simt_tiles:
        tiles = batch * math.ceil(m / tm) * math.ceil(n / tn)
        slots = kn.sms * max(1, 4 // warps)  # CTAs that give every sub-partition a warp
        splits = max(1, min(slots // tiles, math.ceil(k / 256))) if tiles < slots else 1
        waves = math.ceil(tiles * splits / kn.sms)
        busy = min(1.0, warps * waves / 4)  # sub-partitions with a warp to issue (waves = CTAs per SM)
        compute = waves * 2 * tm * tn * math.ceil(k / splits) / (per_sm * busy)
        partials = 2 * splits * m * n * 4 * batch if splits > 1 else 0  # fp32 slices written, read by the reduction
        t = max(compute, reads / stream) + (write + partials) / bw
        if splits > 1:
            t += kn.splitk_reduce_seconds + kn.launch_seconds
        best = min(best, t)
    return best + kn.launch_seconds


# ---- attention -------------------------------------------------------------------------------------------------
@lru_cache(maxsize=4096)
def _block_steps(s_q: int, s_kv: int, br: int, bc: int, causal: bool, window: int = 0) -> tuple[int, int, int]:
    """(query tiles, total key-block steps over all tiles, the longest tile's steps) for one (batch, head).
    Causal: query row i sees keys <= i + (s_kv - s_q) (bottom-right aligned, flash-attn >= 2.1 convention), so
    tile t walks ceil(min(s_kv, (t+1)*br + s_kv - s_q) / bc) blocks; masked tiles are skipped (FA2 §3.1.1).
    `window` (causal only; 0: none): row i sees only its last `window` keys, i + d - window < j <= i + d, and a
    tile starts at the block of its first row's first key (flash-attn csrc/flash_attn/src/block_info.h and
    flash_fwd_kernel.h: Is_local sets n_block_min from the window's left edge; cuDNN's sliding window and flex
    attention's block mask skip the same blocks)."""
    tiles = math.ceil(s_q / br)
    full = math.ceil(s_kv / bc)
    if not causal:
        return tiles, tiles * full, full
    # tile t's steps a(t) = ceil(((t + 1)·br + s_kv − s_q) / bc), clamped to [0, full], rise with t: the tiles below
    # `lo` walk none, those from `hi` on walk all `full`, and the ones between sum a(t) in closed form (floor_sum),
    # so the cost does not grow with the sequence
    if tiles == 0 or full == 0:
        return tiles, 0, 0
    d = s_kv - s_q
    lo = min(tiles, max(0, -(-(1 - d) // br) - 1))  # the first tile with a(t) >= 1: (t + 1)·br + d >= 1
    hi = min(tiles, max(lo, -(-((full - 1) * bc + 1 - d) // br) - 1))  # the first with a(t) >= full
    # a(t) = floor((br·t + br + d + bc − 1) / bc), summed over t in [lo, hi)
    middle = floor_sum(hi - lo, bc, br, br * (lo + 1) + d + bc - 1)
    longest = min(full, max(0, -(-(tiles * br + d) // bc)))  # a(t) rises: the last tile's
    total = middle + full * (tiles - hi)
    if not window or window >= s_kv:
        return tiles, total, longest
    # the window: tile t starts at block b(t) = floor((br·t + c) / bc), c = d − window + 1, from the first tile t0
    # whose first row's window begins past key 0; summed in closed form, and the longest tile among the ones where
    # a(t) − b(t) can peak (it depends on br·t mod bc alone: one period of bc / gcd(br, bc) tiles from t0, the last
    # tile before t0, whose a(t) is the highest unclipped, and the last tiles, where a(t) is clipped at `full`)
    c = d - window + 1
    t0 = min(tiles, max(0, -(-(-c) // br)))
    total -= floor_sum(tiles - t0, bc, br, br * t0 + c)
    period = bc // math.gcd(br, bc)

    def steps(t: int) -> int:
        a = min(full, max(0, -(-((t + 1) * br + d) // bc)))
        return max(0, a - max(0, br * t + c) // bc)

    probe = {*range(max(0, t0 - 1), min(tiles, t0 + period)), *range(max(0, tiles - period), tiles)}
    return tiles, total, max(steps(t) for t in probe)


def floor_sum(n: int, m: int, a: int, b: int) -> int:
    """sum of floor((a·i + b) / m) for i in [0, n), m > 0, in O(log) steps: AtCoder Library's floor_sum
    (atcoder/math.hpp floor_sum_unsigned: take the whole parts of a/m and b/m out, then swap the roles of the axes
    under the line y = (a·x + b)/m); Python's floor division brings a negative a or b into [0, m) first."""
    total = 0
    while True:
        if a < 0 or a >= m:
            total += n * (n - 1) // 2 * (a // m)
            a %= m
        if b < 0 or b >= m:
            total += n * (b // m)
            b %= m
        y_max = a * n + b
        if y_max < m:
            return total
        n, b = y_max // m, y_max % m
        m, a = a, m


def flash_efficiency(kn: Kernels, batch_heads: int, s_q: int, s_kv: int, head_dim: int, causal: bool,
                     kernel: str = "default", block: tuple[int, int] | None = None, fill: int = 1,
                     window: int = 0) -> float:
    """Sequence factor in (0, 1]: useful block steps / the step-slots the SMs are held for.
    A step = one Br x Bc block of QK^T and PV (4*Br*Bc*d FLOPs) at the per-SM long-sequence rate. Each CTA (one
    query tile of one head, FA2 §3.2) walks its key blocks — a partial edge block costs a whole step — plus one
    pipeline-fill step: its K/V tiles are double-buffered (flash-attn csrc/flash_attn/src/flash_fwd_kernel.h loads
    block j+1 while computing block j; FA3 §3.1 two-stage pipeline), so the first load is exposed once per CTA.
    CTAs run in waves over the SMs (one CTA per SM per wave), never faster than the longest CTA.
    NB: the fill step is one block-compute long, not a measured latency; errs either way by < 1 step per CTA.
    `block` and `fill` override the kernel's tiles and the one fill step (a measured kernel's: FittedAttention);
    `window`: a causal sliding window (_block_steps), whose tiles walk few blocks, each partly masked."""
    br, bc = block or kn.attn_block(head_dim, kernel)
    tiles, total, longest = _block_steps(s_q, s_kv, br, bc, causal, window)
    if total == 0:
        return 1.0
    ctas = batch_heads * tiles
    useful = batch_heads * attention_pairs(s_q, s_kv, causal, window) / (br * bc)
    waves = math.ceil(ctas / kn.sms)
    busy = max(waves * (batch_heads * total + ctas * fill) / ctas, longest + fill)  # per-SM step-slots
    return min(1.0, useful / (kn.sms * busy))


def _causal_pairs(s_q: int, s_kv: int) -> float:
    """(query, key) pairs a bottom-right-aligned causal mask keeps: row i sees min(s_kv, i + 1 + s_kv - s_q) keys."""
    off = s_kv - s_q
    if off >= 0:  # every row sees at least off+1 keys, none more than s_kv
        return s_q * off + s_q * (s_q + 1) / 2
    first = -off  # rows with i + 1 + off <= 0 see nothing
    n = s_q - first
    return n * (n + 1) / 2


def attention_pairs(s_q: int, s_kv: int, causal: bool, window: int = 0) -> float:
    """(query, key) pairs a kernel computes: every pair, those a bottom-right causal mask keeps (_causal_pairs), or
    under a sliding `window` (causal) those whose key is among the query row's last `window`: row i loses
    max(0, i + d − window + 1) keys below its window, d = s_kv − s_q (summed in closed form)."""
    if not causal:
        return s_q * s_kv
    pairs = _causal_pairs(s_q, s_kv)
    if not window or window >= s_kv:
        return pairs
    c = s_kv - s_q - window + 1  # row i's first key
    first = max(0, -c)  # rows before this one keep every key the causal mask gives them
    n = max(0, s_q - first)
    return pairs - (n * (first + c) + n * (n - 1) / 2)


def _attention_flops(batch_heads: int, s_q: int, s_kv: int, head_dim: int, causal: bool, window: int = 0) -> float:
    """Forward FLOPs 4*bh*s_q*s_kv*d (QK^T and PV, 2 FLOPs per MAC; FA2 §4.1 counts the same), halved by a causal
    mask for kernels that skip masked blocks (FA2 §4.1: 'divide by 2 for causal'); under a sliding `window`, the
    window's pairs (attention_pairs: what cudnn-frontend's benchmark_single_sdpa.py flops() counts for it)."""
    if causal and window and window < s_kv:
        return 4.0 * batch_heads * attention_pairs(s_q, s_kv, True, window) * head_dim
    f = 4.0 * batch_heads * s_q * s_kv * head_dim
    return f / 2 if causal else f


def attention_seconds(gpu: GPU, kernel: str, batch_heads: int, s_q: int, s_kv: int, head_dim: int, causal: bool,
                      dtype: str, backward: bool, mask: int = 0, dropout: bool = False, window: int = 0) -> float:
    """One attention call (forward, or its backward when `backward`) on one GPU. mask: HF eager's additive mask's
    bytes per element (ops.Shape.eager_mask; 0: SDPA's math path). dropout: on the probabilities inside a fused
    kernel (an eager step's dropout is its own kernel, analytic/ops/). window: a causal sliding window the fused
    kernel takes itself, skipping the key blocks outside it (_block_steps; 0: none); an eager call computes them
    all (it is refused here: the window is the fused kernels')."""
    if min(batch_heads, s_q, s_kv, head_dim) <= 0:
        return 0.0
    window = int(window) if causal and window and window < s_kv else 0
    return _attention_seconds(gpu, kernel, int(batch_heads), int(s_q), int(s_kv), int(head_dim), bool(causal),
                              dtype, bool(backward), int(mask), bool(dropout), window)


@lru_cache(maxsize=65536)
def _attention_seconds(gpu: GPU, kernel: str, batch_heads: int, s_q: int, s_kv: int, head_dim: int, causal: bool,
                       dtype: str, backward: bool, mask: int = 0, dropout: bool = False, window: int = 0) -> float:
    kn = kernels_for(gpu)
    kernel = runnable(kn, kernel)
    if kernel in kn.fitted:
        base = kn.fitted[kernel]
        fit = base.variant(dtype, dropout)
        # not measured this way: the fit without dropout (else the 16-bit one at this dtype's peak) + the draws
        draws = dropout and fit is None and not backward
        fit = fit or base.variant(dtype, False) or base
        return _fitted_seconds(gpu, kn, fit, kernel, batch_heads, s_q, s_kv, head_dim, causal, dtype, backward,
                               window) + _draws(gpu, batch_heads, s_q, s_kv, causal, draws, window)
    if kernel == "eager":
        assert not window, "an eager attention computes every key: no window to skip"
        return sum(unfused_attention(gpu, batch_heads, s_q, s_kv, head_dim, causal, dtype, backward, mask)) \
            + kn.launch_seconds
    flops = _attention_flops(batch_heads, s_q, s_kv, head_dim, causal, window)
    frac = kn.attention[kernel]
    if backward:
        flops *= 2.5  # FA2 §4.1: backward = 2.5x forward FLOPs (5 matmuls vs 2, one recomputing QK^T)
        frac = kn.attention_bwd.get(kernel, frac)
        # FA2 §3.2: the backward grid is batch x heads x key blocks walking the query blocks (swap roles)
        seq = flash_efficiency(kn, batch_heads, s_kv, s_q, head_dim, causal, kernel, window=window)
    else:
        seq = flash_efficiency(kn, batch_heads, s_q, s_kv, head_dim, causal, kernel, window=window)
    compute = flops / (_attention_peak(gpu, kernel, dtype) * frac * seq)
    # HBM traffic: forward reads Q, K, V and writes O; backward reads Q, K, V, O, dO and writes dQ, dK, dV
    io = batch_heads * head_dim * _size(dtype) * ((4 * s_q + 4 * s_kv) if backward else (2 * s_q + 2 * s_kv))
    return max(compute, io / _bandwidth(gpu, kn)) + kn.launch_seconds \
        + _draws(gpu, batch_heads, s_q, s_kv, causal, dropout and not backward, window)


def _draws(gpu: GPU, batch_heads: int, s_q: int, s_kv: int, causal: bool, dropout: bool, window: int = 0) -> float:
    """A fused kernel's random draws where no fit with dropout holds them (fused_dropout_seconds); the backward
    regenerates them beside 2.5x the matmuls and is left as is. NB: fast where a fitted variant shows the
    backward's dropout cost (the H200's: +10 ... +40 %, kernels.toml [dropout])."""
    return fused_dropout_seconds(gpu, batch_heads, s_q, s_kv, causal, window) if dropout else 0.0


def _attention_peak(gpu: GPU, kernel: str, dtype: str) -> float:
    """The peak a fused attention kernel's matmuls run at. PyTorch's memory-efficient kernel (the CUTLASS kernel
    from xformers) runs fp32 on tensor cores from sm80 on, as 3xTF32 (aten/src/ATen/native/transformers/cuda/
    mem_eff_attention/gemm_kernel_utils.h: DefaultGemmType<ArchTag, float> for kMinComputeCapability >= 80 is
    OpClassTensorOp with OpMultiplyAddFastF32, three TF32 products per multiply-add), not on the CUDA cores that an
    fp32 cuBLAS GEMM without allow_tf32 uses; before sm80 (no TF32) it is the SIMT kernel at the fp32 rate."""
    tf32 = gpu.peak_flops.get("tf32")
    if kernel == "efficient" and dtype == "fp32" and gpu.vendor == "nvidia" and tf32:
        return tf32 / 3
    return gpu.flops_for(dtype)


def _fitted_seconds(gpu: GPU, kn: Kernels, c: FittedAttention, kernel: str, bh: int, s_q: int, s_kv: int, d: int,
                    causal: bool, dtype: str, backward: bool, window: int = 0) -> float:
    """A measured fused attention kernel `c` (FittedAttention): FLOPs at its fraction of the peak over its tiles'
    tile factor, its fixed time per call, and in the backward its pre/post passes' bytes at HBM bandwidth. The
    fixed time includes its launches: time_ops times one launch for it, and counts all of them for the host."""
    frac, fixed = c.at(d, backward)
    flops = _attention_flops(bh, s_q, s_kv, d, causal, window) * (2.5 if backward else 1.0)
    tile = c.tile(d, backward)
    # the backward's grid walks the query blocks per key block (FA2 §3.2): the roles swap (NB: under a window the
    # swapped walk is exact for s_q = s_kv, the training case; the band is its own mirror)
    seq = flash_efficiency(kn, bh, s_kv, s_q, d, causal, block=tile, fill=c.fill, window=window) if backward else \
        flash_efficiency(kn, bh, s_q, s_kv, d, causal, block=tile, fill=c.fill, window=window)
    extra = bh * s_q * d * c.backward_bytes_per_element / _bandwidth(gpu, kn) if backward else 0.0
    return flops / (_attention_peak(gpu, kernel, dtype) * frac * seq) + extra + fixed


def runnable(kn: Kernels, kernel: str) -> str:
    """The kernel that actually runs: "sdpa" (a stack calling torch's SDPA with 16-bit inputs) is what torch picks
    on this GPU (Kernels.sdpa: cuDNN on sm90, measured there as a fitted model, and on sm100, as published
    long-sequence fractions; else FlashAttention-2); otherwise one the GPU has data for, else the next one
    PyTorch's SDPA dispatcher would try (flash, then memory-efficient, then math) — e.g. "flash3" on an A100 runs
    FlashAttention-2."""
    if kernel == "sdpa":
        kernel = kn.sdpa if kn.sdpa in kn.fitted or kn.sdpa in kn.attention else "flash"
    if kernel in kn.fitted:
        return kernel
    if kernel == "eager" or kernel in kn.attention:
        return kernel
    return next((k for k in ("flash", "efficient") if k in kn.attention), "eager")


@lru_cache(maxsize=16384)
def unfused_attention(gpu: GPU, bh: int, s_q: int, s_kv: int, d: int, causal: bool, dtype: str, backward: bool,
                      mask: int = 0) -> tuple[float, float]:
    """(batched-GEMM seconds, memory-bound seconds) of unfused attention, launches left out: its GEMMs run as cuBLAS
    GEMMs and its elementwise kernels as PyTorch's, which is how a profile sorts them (bench/gpu/cuda_truth.py kinds).
    S = QK^T and O = PV as batched GEMMs; backward dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q.
    mask = 0, PyTorch's math path: softmax reads and writes S (and the mask when causal) in the compute dtype;
    backward dS = softmax'(P, dP): CUDA first forms dP·P (SoftMax.cu softmax_backward_cuda_out `grad * output`), then
    its kernel reads that and P, writes dS (ops.SOFTMAX_BWD_KERNELS).
    mask > 0, HF's eager_attention_forward (transformers 5.24 modeling_llama.py:193-199): S * scaling, S + mask (the
    mask in the parameters' dtype, `mask` bytes: a 16-bit S with an fp32 mask, as under autocast, sums to fp32 by
    type promotion), softmax(dim=-1, dtype=float32) (an upcast first when the sum is 16-bit), .to(query's dtype), P V;
    backward, each the other way: the cast's upcast, softmax's backward (dP·P, then the kernel reading it and P,
    writing dS, fp32), the upcast's cast back, the add's cast to S's dtype when it promoted (autograd casts a
    gradient to its input's dtype: engine.cpp validate_outputs), the scaling's. The H200 profile of llama-3.2-1b
    eager (bench/results/gpu/H200-2026-11-27-unrecorded-9-truth.json) has these kernels: per layer one broadcast add<float>, one
    softmax_warp_forward / _backward<float> (beside the backward's fp32 S·S mul), three [2, 32, 1024, 1024] copies.
    NB: the mask add's broadcast fp32 + bf16 kernel (elementwise_kernel with dynamic casts) ran at 1.1 TB/s there,
    timed here at the upcast class's rate (2.0 TB/s on an H200; kernels.toml access): under-reads it; the mask's own
    read (1/heads of S) is left out."""
    launch = kernels_for(gpu).launch_seconds
    shapes = ((s_kv, d, s_q), (s_q, s_kv, d), (s_q, d, s_kv), (s_kv, d, s_q)) if backward else \
        ((s_q, s_kv, d), (s_q, d, s_kv))
    gemms = sum(gemm_seconds(gpu, m, n, k, dtype, batch=bh) - launch for m, n, k in shapes)
    n = bh * s_q * s_kv
    s = _size(dtype)
    if not mask:
        parts = [(6 * s, "vector")] if backward else [(2 * s * (2 if causal else 1), "vector")]
    else:
        summed = max(s, mask)
        up, down = summed < 4, s < 4
        if not backward:
            add = "upcast" if summed != s else "strided"  # a promoting add casts as it loads; else a broadcast add
            parts = [(2 * s, "vector"), (s + summed, add), (summed + 4 if up else 0, "upcast"),
                     (8, "reduce"), (4 + s if down else 0, "vector")]
        else:
            parts = [(s + 4 if down else 0, "upcast"), (12, "vector"), (12, "reduce"), (4 + summed if up else 0,
                     "vector"), (summed + s if summed != s else 0, "vector"), (2 * s, "vector")]
    return gemms, sum(memory_seconds(gpu, n * b, 0, access) for b, access in parts if b)


# ---- memory-bound ops ------------------------------------------------------------------------------------------
def memory_seconds(gpu: GPU, nbytes: float, kernels: int = 1, access: str = "vector") -> float:
    """Elementwise / reduction / copy: bytes read + written at the achieved HBM bandwidth, plus launches. `access`
    (ops.Op.access): a kernel that cannot vectorise reaches a measured fraction of the streaming bandwidth
    (kernels.toml access); unmeasured on this GPU: the streaming bandwidth (NB optimistic)."""
    kn = kernels_for(gpu)
    return max(0.0, nbytes) / (_bandwidth(gpu, kn) * kn.access.get(access, 1.0)) + kernels * kn.launch_seconds
