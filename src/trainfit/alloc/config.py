"""The caching allocator's settings, parsed from a `PYTORCH_CUDA_ALLOC_CONF`-syntax string.

Source read: pytorch/pytorch main, c10/core/AllocatorConfig.cpp (AcceleratorAllocatorConfig::parseArgs and its
parse* helpers; CUDAAllocatorConfig forwards to it). Keys are `key:value` pairs separated by commas.
- max_split_size_mb: an integer >= kLargeBuffer / MiB = 20 (parseMaxSplitSize); default: unlimited.
- max_non_split_rounding_mb: an integer >= 20 (parseMaxNonSplitRoundingSize); default kLargeBuffer (20 MiB).
- garbage_collection_threshold: a float in (0, 1) (parseGarbageCollectionThreshold); default 0 (off).
- roundup_power2_divisions: a power of 2, or a list `[256:1,512:2,>:4]` of `MiB boundary:divisions` with powers of
  2 (0 disables rounding in a list) over 16 intervals from 1 MiB to 64 GiB (parseRoundUpPower2Divisions,
  roundup_power2_divisions(size)); default 0 (off).
- expandable_segments: True/False (parseExpandableSegments).
Keys about host (pinned) memory or locking do not change device pools: accepted and ignored, as torch does.
NB: torch skips unknown keys silently (skipKey); here an unknown key is a SetupError (a typo would otherwise
silently change nothing). `backend:cudaMallocAsync` is refused: that allocator is CUDA's, not simulated here.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..errors import SetupError

MiB = 1024 * 1024
K_LARGE_BUFFER = 20 * MiB  # CUDACachingAllocator.cpp kLargeBuffer
UNLIMITED = 2 ** 64 - 1  # std::numeric_limits<size_t>::max(), the default max_split_size
INTERVALS = 16  # kRoundUpPowerOfTwoIntervals: 1 MiB (2^20) .. 64 GiB (2^36)
IGNORED = ("backend", "pinned_use_cuda_host_register", "pinned_num_register_threads", "release_lock_on_cudamalloc",
           "pinned_use_background_threads", "pinned_reserve_segment_size_mb")


@dataclass(frozen=True)
class AllocConf:
    max_split_size: int = UNLIMITED
    max_non_split_rounding_size: int = K_LARGE_BUFFER
    garbage_collection_threshold: float = 0.0
    roundup_power2_divisions: tuple = field(default=(0,) * INTERVALS)
    expandable_segments: bool = False
    text: str = ""

    def divisions(self, size: int) -> int:
        """AcceleratorAllocatorConfig::roundup_power2_divisions(size): the interval of floor(log2 size), from 1 MiB."""
        log_size = size.bit_length() - 1
        index = log_size - 20 if log_size > 20 else 0
        return self.roundup_power2_divisions[min(index, INTERVALS - 1)]


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _int(key: str, v: str) -> int:
    if not re.fullmatch(r"\d+", v.strip()):
        raise SetupError(f"--alloc-conf {key}: expected a whole number, got {v!r}")
    return int(v)


def _divisions(v: str) -> tuple:
    v = v.strip()
    if not v.startswith("["):
        n = _int("roundup_power2_divisions", v)
        if not _pow2(n):
            raise SetupError(f"--alloc-conf roundup_power2_divisions: the divisions have to be a power of 2, got {n}")
        return (n,) * INTERVALS
    if not v.endswith("]"):
        raise SetupError("--alloc-conf roundup_power2_divisions: expected a closing ']'")
    table = [0] * INTERVALS
    first, last = True, 0
    for item in filter(None, (s.strip() for s in v[1:-1].split(","))):
        bound, _, val = item.partition(":")
        n = _int("roundup_power2_divisions", val)
        if n and not _pow2(n):
            raise SetupError(f"--alloc-conf roundup_power2_divisions: the divisions have to be a power of 2 or 0, got {n}")
        if bound.strip() == ">":
            table[last + 1:] = [n] * (INTERVALS - last - 1)
            continue
        b = _int("roundup_power2_divisions", bound)
        if not _pow2(b):
            raise SetupError(f"--alloc-conf roundup_power2_divisions: the intervals have to be powers of 2, got {b}")
        index = min(max(b.bit_length() - 1, 0), INTERVALS - 1)
        if first:
            table[:index] = [n] * index
            first = False
        table[index] = n
        last = index
    return tuple(table)


def _split_pairs(text: str) -> list[tuple[str, str]]:
    pairs, depth, cur = [], 0, ""
    for ch in text:  # commas inside [...] belong to the list
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            pairs.append(cur)
            cur = ""
        else:
            cur += ch
    pairs.append(cur)
    out = []
    for p in (s.strip() for s in pairs):
        if not p:
            continue
        key, sep, val = p.partition(":")
        if not sep or not val.strip():
            raise SetupError(f"--alloc-conf: expected key:value, got {p!r}")
        out.append((key.strip(), val.strip()))
    return out


def parse_alloc_conf(text: str | None) -> AllocConf:
    """`PYTORCH_CUDA_ALLOC_CONF` syntax -> AllocConf; None or "" gives torch's defaults."""
    if not text:
        return AllocConf()
    kw: dict = {}
    for key, val in _split_pairs(text):
        if key == "max_split_size_mb":
            n = _int(key, val)
            if n < K_LARGE_BUFFER // MiB:
                raise SetupError(f"--alloc-conf max_split_size_mb too small, must be >= {K_LARGE_BUFFER // MiB}")
            kw["max_split_size"] = n * MiB
        elif key == "max_non_split_rounding_mb":
            n = _int(key, val)
            if n < K_LARGE_BUFFER // MiB:
                raise SetupError(f"--alloc-conf max_non_split_rounding_mb too small, must be >= {K_LARGE_BUFFER // MiB}")
            kw["max_non_split_rounding_size"] = n * MiB
        elif key == "garbage_collection_threshold":
            try:
                x = float(val)
            except ValueError:
                raise SetupError(f"--alloc-conf garbage_collection_threshold: expected a number, got {val!r}") from None
            if not 0.0 < x < 1.0:
                raise SetupError("--alloc-conf garbage_collection_threshold is invalid, set it in (0.0, 1.0)")
            kw["garbage_collection_threshold"] = x
        elif key == "roundup_power2_divisions":
            kw["roundup_power2_divisions"] = _divisions(val)
        elif key == "expandable_segments":
            if val not in ("True", "False", "true", "false", "1", "0"):
                raise SetupError(f"--alloc-conf expandable_segments: expected True or False, got {val!r}")
            kw["expandable_segments"] = val in ("True", "true", "1")
        elif key == "backend":
            if val != "native":
                raise SetupError(f"--alloc-conf backend:{val} is not simulated (only the native caching allocator)")
        elif key in IGNORED:
            continue
        else:
            raise SetupError(f"--alloc-conf: unknown key {key!r} (known: max_split_size_mb, expandable_segments, "
                             "roundup_power2_divisions, garbage_collection_threshold, max_non_split_rounding_mb)")
    return AllocConf(text=text, **kw)
