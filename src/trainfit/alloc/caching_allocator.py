"""A simulation of PyTorch's CUDA caching allocator (DeviceCachingAllocator), rule by rule.

Source read: pytorch/pytorch main, c10/cuda/CUDACachingAllocator.cpp at commit 001074d2 (2025; the
rules below are unchanged since torch 2.1 except `max_non_split_rounding_mb`, added in 2.4). Function names
are the C++ ones; each rule cites where it comes from.

What is simulated: round_size (512 B kMinBlockSize, roundup_power2_divisions), the small (<= kSmallSize 1 MiB)
and large pools, get_allocation_size (kSmallBuffer 2 MiB / kLargeBuffer 20 MiB below kMinLargeAlloc 10 MiB /
kRoundLarge 2 MiB multiples), best-fit search ordered by (stream, size, address) (BlockComparatorSize,
get_free_block), max_split_size (oversize blocks are not split and only serve requests within
max_non_split_rounding of their size), should_split, alloc_found_block's split, free_block's merge of free
neighbours (try_merge_blocks), the OOM path (release_available_cached_blocks, then release_cached_blocks and a
retry), garbage_collect_cached_blocks (age = get_free_block calls since the block was cached), and expandable
segments (one growing segment per pool and stream, mapped in 2 MiB pages for the small pool and 20 MiB pages
for the large pool: find_expandable_block, map_block, try_allocate_expandable_block, unmap_block).

NB (simplifications, each with its direction):
- Streams never cross: no record_stream events, so a freed block is reusable at once (real cross-stream frees
  wait for events: the simulator can under-read reserved where recordStream is used).
- cudaMalloc succeeds while reserved + size <= capacity (capacity=None: always). Real cudaMalloc also fails on
  memory held outside the allocator (CUDA context, NCCL) and on driver fragmentation: over-reads headroom.
- Segment addresses come from a bump pointer; they only break ties between equal-size free blocks.
- No CUDA graph private pools, no trigger_free_memory_callbacks (none are registered by default).
"""
from __future__ import annotations

from bisect import bisect_left, insort

from .config import AllocConf, UNLIMITED, parse_alloc_conf

K_MIN_BLOCK = 512  # kMinBlockSize: all sizes are rounded to at least 512 bytes
K_SMALL_SIZE = 1 << 20  # kSmallSize: largest "small" allocation is 1 MiB
K_SMALL_BUFFER = 2 << 20  # kSmallBuffer: "small" allocations are packed in 2 MiB blocks
K_LARGE_BUFFER = 20 << 20  # kLargeBuffer: "large" allocations may be packed in 20 MiB blocks
K_MIN_LARGE_ALLOC = 10 << 20  # kMinLargeAlloc: allocations between 1 and 10 MiB may use kLargeBuffer
K_ROUND_LARGE = 2 << 20  # kRoundLarge: round up large allocations to 2 MiB


class OutOfMemory(Exception):
    """The simulated device ran out: malloc failed after freeing cached blocks and retrying."""


def round_size(size: int, conf: AllocConf) -> int:
    """DeviceCachingAllocator::round_size with roundup_power2_next_division."""
    if size < K_MIN_BLOCK:
        return K_MIN_BLOCK
    divisions = conf.divisions(size)
    if divisions > 1 and size > K_MIN_BLOCK * divisions:
        if size & (size - 1) == 0:
            return size
        floor = 1 << (size.bit_length() - 1)
        step = floor >> (divisions.bit_length() - 1)
        if step == 0:
            return floor << 1
        low = size & ~(step - 1)
        return size if low == size else low + step
    return K_MIN_BLOCK * ((size + K_MIN_BLOCK - 1) // K_MIN_BLOCK)


def allocation_size(size: int) -> int:
    """get_allocation_size: the segment a new cudaMalloc gets for a rounded request."""
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return K_ROUND_LARGE * ((size + K_ROUND_LARGE - 1) // K_ROUND_LARGE)


class Block:
    __slots__ = ("size", "ptr", "stream", "pool", "allocated", "prev", "next", "es", "mapped", "gc_base")

    def __init__(self, size, ptr, stream, pool, es=None, mapped=True):
        self.size, self.ptr, self.stream, self.pool = size, ptr, stream, pool
        self.allocated = False
        self.prev = self.next = None
        self.es = es
        self.mapped = mapped
        self.gc_base = 0

    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None

    def splice(self, before, after):
        if before is not None:
            before.next = self
        self.prev = before
        if after is not None:
            after.prev = self
        self.next = after


class Pool:
    """BlockPool: free mapped blocks ordered by (stream, size, ptr), unmapped ones by (stream, ptr)."""

    def __init__(self, small: bool):
        self.small = small
        self.keys: list[tuple] = []
        self.blocks: dict[tuple, Block] = {}
        self.ukeys: list[tuple] = []
        self.unmapped: dict[tuple, Block] = {}
        self.free_calls = 0  # get_free_blocks_call_count

    def insert(self, b: Block) -> None:  # BlockPool::insert_into_blocks
        b.gc_base = self.free_calls
        k = (b.stream, b.size, b.ptr)
        insort(self.keys, k)
        self.blocks[k] = b

    def erase(self, b: Block) -> None:
        k = (b.stream, b.size, b.ptr)
        del self.keys[bisect_left(self.keys, k)]
        del self.blocks[k]

    def insert_unmapped(self, b: Block) -> None:
        k = (b.stream, b.ptr)
        insort(self.ukeys, k)
        self.unmapped[k] = b

    def erase_unmapped(self, b: Block) -> None:
        k = (b.stream, b.ptr)
        del self.ukeys[bisect_left(self.ukeys, k)]
        del self.unmapped[k]


class ExpandableSegment:
    """One virtual range mapped page by page (Note [Expandable Segments]; ExpandableSegment::map/unmap)."""

    def __init__(self, base: int, size: int, page: int):
        self.base, self.size, self.page = base, size, page
        self.pages: set[int] = set()

    def map(self, ptr: int, size: int, room) -> int:
        """Pages covering [ptr, ptr+size) (begin = segmentLeft, end = segmentRight); 0 when cuMemCreate fails."""
        begin = (ptr - self.base) // self.page
        end = -(-(ptr + size - self.base) // self.page)
        if not room((end - begin) * self.page):
            return 0
        self.pages.update(range(begin, end))
        return (end - begin) * self.page

    def unmap(self, ptr: int, size: int) -> tuple[int, int]:
        """Whole pages inside [ptr, ptr+size) (begin = segmentRight, end = segmentLeft): (start, bytes)."""
        begin = -(-(ptr - self.base) // self.page)
        end = (ptr + size - self.base) // self.page
        if begin >= end:
            return ptr, 0
        self.pages.difference_update(range(begin, end))
        return self.base + begin * self.page, (end - begin) * self.page


class Allocator:
    """`Allocator(conf).malloc(nbytes, stream) -> handle`; `.free(handle)`; byte counters like torch.cuda's
    memory_allocated / memory_reserved / max_memory_allocated / max_memory_reserved.

    conf: an AllocConf or a PYTORCH_CUDA_ALLOC_CONF string. capacity: the device bytes the allocator may
    reserve (None: unlimited). memory_fraction: like torch.cuda.set_per_process_memory_fraction (the
    allowed maximum is fraction * capacity; garbage_collection_threshold only acts when it is set, as in
    malloc's `set_fraction && garbage_collection_threshold() > 0.0`).
    """

    def __init__(self, conf: AllocConf | str | None = None, capacity: int | None = None,
                 memory_fraction: float | None = None):
        self.conf = conf if isinstance(conf, AllocConf) else parse_alloc_conf(conf)
        self.capacity = capacity
        self.set_fraction = memory_fraction is not None and capacity is not None
        self.allowed_max = int(memory_fraction * capacity) if self.set_fraction else 0
        self.small_pool, self.large_pool = Pool(True), Pool(False)
        self.active: dict[int, Block] = {}  # ptr -> allocated block (the handle is the address)
        self.allocated = self.reserved = self.max_allocated = self.max_reserved = 0
        self.num_device_alloc = self.num_device_free = self.num_alloc_retries = 0
        self._bump = 1 << 32
        self._es: list[ExpandableSegment] = []

    # -- public API ---------------------------------------------------------------------------------
    def malloc(self, nbytes: int, stream: int = 0) -> int:
        """DeviceCachingAllocator::malloc."""
        conf = self.conf
        size = round_size(nbytes, conf)
        pool = self.small_pool if size <= K_SMALL_SIZE else self.large_pool  # get_pool
        alloc_size = allocation_size(size)
        block = self._get_free_block(pool, size, stream)
        if block is None:
            if self.set_fraction and conf.garbage_collection_threshold > 0.0:
                self._garbage_collect()
            block = self._alloc_block(pool, size, alloc_size, stream)
            if block is None and self._release_available_cached_blocks(pool, size, stream):
                block = self._alloc_block(pool, size, alloc_size, stream)
            if block is None:
                self._release_cached_blocks()
                self.num_alloc_retries += 1
                block = self._alloc_block(pool, size, alloc_size, stream)
        if block is None:
            raise OutOfMemory(f"simulated CUDA out of memory: tried to allocate {alloc_size} bytes with "
                              f"{self.allocated} allocated and {self.reserved} reserved of {self.capacity}")
        return self._alloc_found_block(pool, block, size, stream, self._should_split(pool, block, size))

    def free(self, handle: int) -> None:
        """DeviceCachingAllocator::free -> free_block (no cross-stream events: see the module NB)."""
        block = self.active.pop(handle)
        block.allocated = False
        self.allocated -= block.size
        pool = block.pool
        for cand in (block.prev, block.next):
            self._try_merge(block, cand, pool)
        pool.insert(block)

    def empty_cache(self) -> None:
        """emptyCache -> release_cached_blocks."""
        self._release_cached_blocks()

    def reset_peak(self) -> None:
        """resetPeakStats: peaks restart at the current values."""
        self.max_allocated, self.max_reserved = self.allocated, self.reserved

    def segment_heads(self) -> list:
        """The first block of each segment, by address; an expandable segment gives one per contiguous mapped range
        (as torch's snapshot() lists them)."""
        blocks = list(self.active.values())
        for pool in (self.small_pool, self.large_pool):
            blocks += pool.blocks.values()
        return sorted((b for b in blocks if b.mapped and (b.prev is None or not b.prev.mapped)), key=lambda b: b.ptr)

    @property
    def segments(self) -> list[int]:
        """Segment sizes by address (segment_heads)."""
        out = []
        for b in self.segment_heads():
            total = 0
            while b is not None and b.mapped:
                total += b.size
                b = b.next
            out.append(total)
        return out

    # -- search and split ---------------------------------------------------------------------------
    def _get_free_block(self, pool: Pool, size: int, stream: int) -> Block | None:
        """get_free_block: the smallest cached block of this stream with size >= the request."""
        conf = self.conf
        if self.set_fraction and conf.garbage_collection_threshold > 0.0:
            pool.free_calls += 1
        keys = pool.keys
        i = bisect_left(keys, (stream, size, -1))
        if i == len(keys) or keys[i][0] != stream:
            return None
        b = pool.blocks[keys[i]]
        if b.es is not None:
            # best fit counts the unmapped room after a segment's last block as part of its size
            def room(x):
                return x.size + (x.next.size if x.next is not None and not x.next.mapped else 0)
            while b.es is not None and i + 1 < len(keys) and keys[i + 1][0] == stream \
                    and room(pool.blocks[keys[i + 1]]) < room(b):
                i += 1
                b = pool.blocks[keys[i]]
        mss = conf.max_split_size
        if size < mss and b.size >= mss:  # do not return an oversized block for a smaller request
            return None
        if size >= mss and b.size >= size + conf.max_non_split_rounding_size:  # oversize: round up within a limit
            return None
        pool.erase(b)
        return b

    def _should_split(self, pool: Pool, block: Block, size: int) -> bool:
        """should_split: small pool / expandable: remainder >= kMinBlockSize; large: size < max_split_size and
        remainder > kSmallSize."""
        remaining = block.size - size
        if pool.small or self.conf.expandable_segments:
            return remaining >= K_MIN_BLOCK
        return size < self.conf.max_split_size and remaining > K_SMALL_SIZE

    def _alloc_found_block(self, pool: Pool, block: Block, size: int, stream: int, split: bool) -> int:
        """alloc_found_block: the front `size` bytes become the allocation, the rest stays cached."""
        if split:
            remaining = block
            block = Block(size, remaining.ptr, stream, pool, remaining.es)
            block.prev = remaining.prev
            if block.prev is not None:
                block.prev.next = block
            block.next = remaining
            remaining.prev = block
            remaining.ptr += size
            remaining.size -= size
            pool.insert(remaining)
        block.allocated = True
        self.active[block.ptr] = block
        self.allocated += block.size
        self.max_allocated = max(self.max_allocated, self.allocated)
        return block.ptr

    def _try_merge(self, dst: Block, src: Block | None, pool: Pool) -> int:
        """try_merge_blocks: absorb a free neighbour with the same mapped state."""
        if src is None or src.allocated or dst.mapped != src.mapped:
            return 0
        if src.mapped:
            pool.erase(src)
        else:
            pool.erase_unmapped(src)
        if dst.prev is src:
            dst.ptr = src.ptr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size
        return src.size

    # -- new memory ---------------------------------------------------------------------------------
    def _room(self, nbytes: int) -> bool:
        return self.capacity is None or self.reserved + nbytes <= self.capacity

    def _grow(self, nbytes: int) -> None:
        self.reserved += nbytes
        self.max_reserved = max(self.max_reserved, self.reserved)
        self.num_device_alloc += 1

    def _alloc_block(self, pool: Pool, size: int, alloc_size: int, stream: int) -> Block | None:
        """alloc_block: a new segment by cudaMalloc (or expandable-segment pages)."""
        if self.set_fraction and self.reserved + alloc_size > self.allowed_max:
            return None
        if self.conf.expandable_segments:
            return self._try_allocate_expandable_block(pool, size, stream)
        if not self._room(alloc_size):
            return None
        block = Block(alloc_size, self._bump, stream, pool)
        self._bump += alloc_size
        self._grow(alloc_size)
        return block

    def _find_expandable_block(self, pool: Pool, size: int, stream: int) -> Block:
        """find_expandable_block: the lowest unmapped range (with a free block just before it) that has room."""
        def allocatable(b):
            return b is not None and not b.allocated

        def has_room(b):
            total = 0
            while total < size and allocatable(b):
                total += b.size
                b = b.next
            return total >= size

        i = bisect_left(pool.ukeys, (stream, -1))
        while i < len(pool.ukeys) and pool.ukeys[i][0] == stream:
            c = pool.unmapped[pool.ukeys[i]]
            if allocatable(c.prev):
                c = c.prev
            if has_room(c):
                return c
            i += 1
        page = K_SMALL_BUFFER if pool.small else K_LARGE_BUFFER  # 2 MiB pages small pool, 20 MiB large pool
        # address space for 1 1/8 of the device memory (1 TiB per segment when unlimited)
        span = (self.capacity + self.capacity // 8) if self.capacity is not None else 1 << 40
        span = -(-span // page) * page
        es = ExpandableSegment((1 << 50) + len(self._es) * (1 << 44), span, page)
        self._es.append(es)
        c = Block(span, es.base, stream, pool, es, mapped=False)
        pool.insert_unmapped(c)
        return c

    def _map_block(self, to_map: Block, size: int) -> bool:
        """map_block: back [ptr, ptr+size) with pages, split off the still-unmapped rest, merge free neighbours."""
        pool = to_map.pool
        mapped = to_map.es.map(to_map.ptr, size, self._room)
        if mapped == 0:
            return False
        pool.erase_unmapped(to_map)
        to_map.mapped = True
        if mapped < to_map.size:
            rest = Block(to_map.size - mapped, to_map.ptr + mapped, to_map.stream, pool, to_map.es, mapped=False)
            rest.splice(to_map, to_map.next)
            pool.insert_unmapped(rest)
            to_map.size = mapped
        self._try_merge(to_map, to_map.prev, pool)
        self._try_merge(to_map, to_map.next, pool)
        pool.insert(to_map)
        self._grow(mapped)
        return True

    def _try_allocate_expandable_block(self, pool: Pool, size: int, stream: int) -> Block | None:
        """try_allocate_expandable_block."""
        c = self._find_expandable_block(pool, size, stream)
        if not c.mapped and not self._map_block(c, min(c.size, size)):
            return None
        while c.size < size:
            nxt = c.next
            if not self._map_block(nxt, min(size - c.size, nxt.size)):
                return None
            c = nxt
        pool.erase(c)
        return c

    # -- giving memory back -------------------------------------------------------------------------
    def _release_block(self, block: Block) -> None:
        """release_block: cudaFree a whole cached segment."""
        block.pool.erase(block)
        self.reserved -= block.size
        self.num_device_free += 1

    def _unmap_block(self, block: Block) -> None:
        """unmap_block: unmap the whole pages inside a free expandable block."""
        pool = block.pool
        start, nbytes = block.es.unmap(block.ptr, block.size)
        if nbytes == 0:
            return
        pool.erase(block)
        before = start - block.ptr
        if before > 0:
            b = Block(before, block.ptr, block.stream, pool, block.es)
            b.splice(block.prev, block)
            pool.insert(b)
        after = block.size - before - nbytes
        if after > 0:
            a = Block(after, start + nbytes, block.stream, pool, block.es)
            a.splice(block, block.next)
            pool.insert(a)
        block.ptr, block.size, block.mapped = start, nbytes, False
        self._try_merge(block, block.prev, pool)
        self._try_merge(block, block.next, pool)
        pool.insert_unmapped(block)
        self.reserved -= nbytes
        self.num_device_free += 1

    def _release_blocks(self, pool: Pool) -> None:
        """release_blocks: free every non-split cached segment; unmap free pages of expandable segments."""
        to_unmap = []
        for k in list(pool.keys):
            b = pool.blocks[k]
            if b.es is not None:
                to_unmap.append(b)
            elif b.prev is None and b.next is None:
                self._release_block(b)
        for b in to_unmap:
            self._unmap_block(b)
            if b.prev is None and b.next is None and not b.mapped:  # release_expandable_segment
                pool.erase_unmapped(b)
                self._es.remove(b.es)

    def _release_cached_blocks(self) -> bool:
        """release_cached_blocks: large pool, then small pool."""
        self._release_blocks(self.large_pool)
        self._release_blocks(self.small_pool)
        return True

    def _release_available_cached_blocks(self, pool: Pool, size: int, stream: int) -> bool:
        """release_available_cached_blocks: with max_split_size set, free one oversize cached block big enough,
        else the largest oversize ones until their sum reaches the request."""
        mss = self.conf.max_split_size
        if mss == UNLIMITED:
            return False
        target = max(size, mss)
        keys = pool.keys
        i = bisect_left(keys, (stream, target, -1))
        if i < len(keys) and keys[i][0] == stream:
            b = pool.blocks[keys[i]]
            if b.es is not None:  # NB: torch asserts here (release_block of an expandable block); we decline
                return False
            self._release_block(b)
            return True
        if i == 0:
            return False
        released = 0
        i -= 1
        while released < target and i >= 0 and keys[i][0] == stream and keys[i][1] >= mss:
            b = pool.blocks[keys[i]]
            if b.es is not None:
                break
            released += b.size
            self._release_block(b)
            i -= 1
        return released >= target

    def _garbage_collect(self) -> None:
        """garbage_collect_cached_blocks: above threshold * allowed, free non-split large blocks of at least
        the average age (get_free_block calls since cached), oldest-first rounds until the excess is freed."""
        threshold = int(self.conf.garbage_collection_threshold * self.allowed_max)
        if self.reserved <= threshold:
            return
        target = self.reserved - threshold
        pool = self.large_pool
        ages = [pool.free_calls - pool.blocks[k].gc_base for k in pool.keys if not pool.blocks[k].is_split()]
        total_age, count = sum(ages), len(ages)
        reclaimed, freed = 0, True
        while reclaimed < target and freed and count > 0:
            threshold_age = total_age / count
            freed = False
            for k in list(pool.keys):
                b = pool.blocks.get(k)
                if b is None or b.is_split() or b.es is not None:
                    continue
                age = pool.free_calls - b.gc_base
                if age >= threshold_age:
                    freed = True
                    reclaimed += b.size
                    total_age -= age
                    count -= 1
                    self._release_block(b)
