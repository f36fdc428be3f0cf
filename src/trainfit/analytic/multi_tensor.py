"""torch's multi_tensor_apply, the kernels of the foreach and fused optimizers and of clip_grad_norm_: how a list of
tensors is cut into chunks and packed into launches, and how long one launch takes (issue 18).

Lines cited are torch 2.13's installed headers (torch/include/ATen/native/cuda/); the H200 runs measured torch 2.11,
whose launch counts agree with the packing below (kernels.toml [multi_tensor_apply]).

Packing (MultiTensorApply.cuh:339-421, multi_tensor_apply_for_fused_optimizer; the foreach ops' :160-252 and
:254-337 alike): a tensor is cut into chunks of kChunkSize = 65,536 elements (:18), one CTA of kBlockSize = 512
threads (:19) each. The chunks go into the current launch, which is issued when it holds depth_to_max_blocks = 320
CTAs, or when a tensor's last chunk makes it depth_to_max_tensors[depth - 1] tensors (:42-44). A tensor a full launch
cuts continues in the next one. Empty tensors are skipped (:355-357).

A launch's time: its bytes at the streaming bandwidth (roofline.memory_seconds), unless it has too few CTAs to keep
those bytes in flight. A CTA walks its chunk 512 x kILP (:17) = 2,048 elements per iteration, and each iteration
loads, computes and then stores (fused_adam_utils.cuh:224-248, ForeachFunctors.cuh:205-217): a CTA takes its
iterations x a latency (kernels.toml [multi_tensor_apply]) plus its bytes through its SM's share of the L2
bandwidth (kernels.toml l2_per_sm). The SM with the most bytes ends the launch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from ..hardware import GPU
from . import roofline

CHUNK = 65536  # MultiTensorApply.cuh:18 kChunkSize: elements per chunk, one CTA each
THREADS = 512  # :19 kBlockSize: threads per CTA
ILP = 4  # :17 kILP: elements per thread per iteration
# :42-44, the 4 KB kernel-argument table (the #else of :29). NB: torch builds with CUDA >= 13 from the version of
# this header on take :31-34's 32 KB table (7x the tensors and CTAs per launch); the H200 profiles' torch 2.11+cu130
# launched by the 4 KB one (kernels.toml [multi_tensor_apply]): fewer, fuller launches there would err slow here
MAX_TENSORS = (110, 64, 48, 36, 30)
MAX_TENSORS_SCALAR_LIST = (96, 64, 48, 36, 30)
MAX_BLOCKS = 320


def chunk_launches(elements: float, tensors: int, depth: int) -> int:
    """Kernels one pass launches, counted from totals rather than packed (pack): at least one per tensor_limit(depth)
    tensors and one per MAX_BLOCKS chunks. Transformer Engine's and apex's copies of multi_tensor_apply pack alike
    (transformer_engine/common/multi_tensor/multi_tensor_apply.cuh:17-18; Megatron's clip, grad_clip.py). NB: each
    tensor's last chunk counted as half a chunk."""
    return max(-(-tensors // tensor_limit(depth)), math.ceil((elements / CHUNK + tensors / 2) / MAX_BLOCKS))


@dataclass(frozen=True)
class Launch:
    """One multi_tensor_apply kernel: its CTAs (chunks), the elements they walk, and its largest chunk's."""

    ctas: int
    elements: int
    largest: int


def tensor_limit(depth: int, scalar_list: bool = False) -> int:
    """Tensors per launch for a list of `depth` tensor lists (:42, :44: an op with a scalar per tensor — foreach's
    div_ and addcdiv_ by a list — packs by depth_to_max_tensors_scalarlist)."""
    return (MAX_TENSORS_SCALAR_LIST if scalar_list else MAX_TENSORS)[depth - 1]


class _Packer:
    """multi_tensor_apply's loop (:372-408): the launch being filled, issued when its CTAs or tensors are full."""

    def __init__(self, limit: int):
        self.limit, self.launches = limit, {}
        self.ctas = self.elements = self.largest = self.tensors = 0

    def add(self, numel: int) -> None:
        """One tensor's chunks, many at a time (a launch fills up to MAX_BLOCKS)."""
        chunks = -(-numel // CHUNK)
        last = numel - (chunks - 1) * CHUNK
        self.tensors += 1
        while chunks:
            if not self.ctas and chunks > MAX_BLOCKS:  # whole launches of this tensor's full chunks, counted at once
                k = (chunks - 1) // MAX_BLOCKS
                full = Launch(MAX_BLOCKS, MAX_BLOCKS * CHUNK, CHUNK)
                self.launches[full] = self.launches.get(full, 0) + k
                chunks -= k * MAX_BLOCKS
                self.tensors = 1
                continue
            take = min(chunks, MAX_BLOCKS - self.ctas)
            ends = take == chunks  # this launch gets the tensor's last chunk
            self.ctas += take
            self.elements += (take - ends) * CHUNK + (last if ends else 0)
            self.largest = max(self.largest, CHUNK if take > ends else last)
            chunks -= take
            if self.ctas == MAX_BLOCKS or (ends and self.tensors == self.limit):
                self.flush()
                self.tensors = 0 if ends else 1  # :393-406: a cut tensor continues in the next launch

    def add_many(self, period: tuple[int, ...], count: int) -> None:
        """`count` repeats of the tensors `period` (one equal tensor, or a layer's tensors in order): once the launch
        being filled repeats its state at a period's start, the periods since then repeat their launches, so whole
        repeats are counted at once (the state is bounded: the loop ends within a few hundred periods whatever
        `count` is)."""
        seen: dict[tuple, tuple[int, dict]] = {}
        i = 0
        while i < count:
            state = (self.ctas, self.elements, self.largest, self.tensors)
            if state in seen:
                start, before = seen.pop(state)
                repeats = (count - i) // (i - start)
                for ln, n in list(self.launches.items()):
                    self.launches[ln] = n + repeats * (n - before.get(ln, 0))
                i += repeats * (i - start)
                seen.clear()
                if i >= count:
                    break
            seen[state] = (i, dict(self.launches))
            for numel in period:
                if numel > 0:  # :355-357: empty tensors are skipped
                    self.add(numel)
            i += 1

    def flush(self) -> None:
        if self.ctas:
            ln = Launch(self.ctas, self.elements, self.largest)
            self.launches[ln] = self.launches.get(ln, 0) + 1
        self.ctas = self.elements = self.largest = 0


@lru_cache(maxsize=1024)
def pack(runs: tuple[tuple[int, int], ...], limit: int) -> tuple[tuple[Launch, int], ...]:
    """The launches of one pass over tensors given as runs of (elements, how many), in the optimizer's order, as
    (launch, how many alike): a large model's launches are mostly the same full one. A run's elements may be a tuple:
    those tensors in order, repeated (runs_of's Repeated sizes)."""
    p = _Packer(limit)
    for numel, count in runs:
        p.add_many(numel if isinstance(numel, tuple) else (numel,), count)
    p.flush()
    return tuple(p.launches.items())


@dataclass(frozen=True)
class Repeated:
    """Per-tensor sizes that repeat one period `times` (a model's alike layers): a sequence of len(period) x times
    sizes whose length and sum are counted, not listed, so a model of many layers costs one layer's work."""

    period: tuple[int, ...]
    times: int

    def __len__(self) -> int:
        return len(self.period) * self.times

    def __iter__(self):
        for _ in range(self.times):
            yield from self.period

    def total(self) -> int:
        return sum(self.period) * self.times


def runs_of(elements: float, tensors: int, sizes: tuple[int, ...] | Repeated | None = None) -> tuple[tuple, ...]:
    """`elements` in `tensors` tensors as runs for pack: the given per-tensor `sizes` (scaled to `elements` where a
    shard holds part of each, NB: as FSDP2's per-tensor shards; a flat ZeRO buffer packs as fewer, larger tensors),
    else `tensors` equal tensors (NB: a model's own mix of matrices and small norm vectors packs as its average)."""
    if sizes:
        period, times = (sizes.period, sizes.times) if isinstance(sizes, Repeated) else (tuple(sizes), 1)
        scale = elements / (sum(period) * times)
        return ((tuple(max(1, round(s * scale)) for s in period), times),)
    if tensors <= 0 or elements <= 0:
        return ()
    return ((math.ceil(elements / tensors), tensors),)


def run_elements(runs: tuple[tuple, ...]) -> int:
    """The elements of `runs` (runs_of)."""
    return sum((sum(n) if isinstance(n, tuple) else n) * k for n, k in runs)


def launch_seconds(gpu: GPU, launch: Launch, bytes_per_element: float, access: str,
                   iteration_seconds: float | None = None) -> float:
    """One launch without its launch cost (the caller adds launches x kernels.toml launch_seconds): the larger of its
    bytes at the streaming bandwidth and the time its busiest SM takes. That SM holds the largest chunk, or its share
    of the CTAs at the launch's mean chunk if more; its CTAs run their iterations side by side (one wave when the SM
    holds them all: threads_per_sm / 512 CTAs, NB registers permitting), each iteration a latency, while the SM's
    bytes pass at its L2 bandwidth. NB: no l2_per_sm measured for the GPU: the latency alone (errs fast).
    `iteration_seconds`: the latency, else kernels.toml's (bench/gpu/fit_multi_tensor.py fits it)."""
    kn = roofline.kernels_for(gpu)
    stream = roofline.memory_seconds(gpu, launch.elements * bytes_per_element, 0, access)
    per_sm = max(launch.largest, math.ceil(launch.ctas / kn.sms) * launch.elements / launch.ctas)
    resident = kn.sms * max(1, (kn.threads_per_sm or 2048) // THREADS)  # NB: AMD (no threads_per_sm) as 2,048
    waves = math.ceil(launch.ctas / resident)
    iterations = math.ceil(launch.largest / (THREADS * ILP))
    latency = roofline.mta_iteration_seconds() if iteration_seconds is None else iteration_seconds
    floor = waves * iterations * latency
    if kn.l2_bytes_per_sm:
        floor += per_sm * bytes_per_element / kn.l2_bytes_per_sm
    return max(stream, floor)


def pass_seconds(gpu: GPU, runs: tuple[tuple[int, int], ...], depth: int, bytes_per_element: float, access: str,
                 scalar_list: bool = False, iteration_seconds: float | None = None) -> tuple[float, int]:
    """(seconds without launch costs, launches) of one multi_tensor_apply op over the tensors in `runs` (runs_of),
    reading and writing `bytes_per_element` per element in all of its lists. Memoised on its arguments (an
    optimizer step and a clip run the same passes over the same tensors: the estimate and the planner's setups of
    one layout ask again and again); the GPU by equality, which covers every field it reads (its bandwidth, kernel
    data name, power)."""
    try:
        return _pass_seconds(gpu, runs, depth, bytes_per_element, access, scalar_list, iteration_seconds)
    except TypeError:  # an unhashable argument: not memoised
        return _pass_seconds.__wrapped__(gpu, runs, depth, bytes_per_element, access, scalar_list, iteration_seconds)


@lru_cache(maxsize=4096, typed=True)
def _pass_seconds(gpu: GPU, runs: tuple[tuple[int, int], ...], depth: int, bytes_per_element: float, access: str,
                  scalar_list: bool, iteration_seconds: float | None) -> tuple[float, int]:
    launches = pack(runs, tensor_limit(depth, scalar_list))
    return (sum(n * launch_seconds(gpu, ln, bytes_per_element, access, iteration_seconds) for ln, n in launches),
            sum(n for _, n in launches))
