"""The caching-allocator simulation against hand derivations from c10/cuda/CUDACachingAllocator.cpp's rules.

Each test says which rules give its numbers: round_size (512 B multiples, roundup_power2_divisions),
get_allocation_size (small <= 1 MiB -> 2 MiB segment; < 10 MiB -> 20 MiB; else 2 MiB multiples),
get_free_block (best fit; max_split_size), should_split (small: rest >= 512 B; large: rest > 1 MiB and
size < max_split_size), free_block (merge free neighbours of the same segment), malloc's OOM path.
"""
import pytest

from trainfit.alloc import Allocator, OutOfMemory
from trainfit.alloc.caching_allocator import round_size
from trainfit.alloc.config import parse_alloc_conf
from trainfit.errors import SetupError

KiB, MiB = 1024, 1 << 20


def test_small_request_rounds_to_512_and_gets_a_2mib_segment():
    # round_size(1000) = 512 * ceil(1000 / 512) = 1024; 1024 <= kSmallSize -> small pool; no cached block ->
    # get_allocation_size = kSmallBuffer = 2 MiB; should_split (small): rest 2 MiB - 1 KiB >= 512 -> split.
    a = Allocator()
    a.malloc(1000)
    assert (a.allocated, a.reserved, a.segments) == (1024, 2 * MiB, [2 * MiB])
    # a second small request fits in the 2 MiB - 1 KiB remainder: same segment
    a.malloc(300 * KiB)
    assert (a.allocated, a.reserved) == (1024 + 300 * KiB, 2 * MiB)


def test_mid_size_request_gets_a_20mib_segment():
    # 3 MiB: > kSmallSize -> large pool; < kMinLargeAlloc (10 MiB) -> kLargeBuffer = 20 MiB segment;
    # should_split (large): rest 17 MiB > 1 MiB -> allocated is the 3 MiB front.
    a = Allocator()
    a.malloc(3 * MiB)
    assert (a.allocated, a.reserved, a.segments) == (3 * MiB, 20 * MiB, [20 * MiB])


def test_large_request_gets_its_size_in_2mib_steps():
    # 12 MiB >= 10 MiB -> kRoundLarge multiple: 12 MiB exactly; nothing left to split.
    a = Allocator()
    a.malloc(12 * MiB)
    assert (a.allocated, a.reserved, a.segments) == (12 * MiB, 12 * MiB, [12 * MiB])
    # 12 MiB + 1 B: round_size -> 12 MiB + 512; segment 14 MiB; rest 1.5 MiB - 512 > 1 MiB -> split
    b = Allocator()
    b.malloc(12 * MiB + 1)
    assert (b.allocated, b.reserved) == (12 * MiB + 512, 14 * MiB)
    # 11 MiB: segment 12 MiB; rest exactly 1 MiB is not > kSmallSize -> not split: the whole 12 MiB is allocated
    c = Allocator()
    c.malloc(11 * MiB)
    assert (c.allocated, c.reserved) == (12 * MiB, 12 * MiB)


def test_free_then_same_request_reuses_the_cached_block():
    # free_block puts the 12 MiB segment in the large pool; get_free_block finds it (best fit, same stream).
    a = Allocator()
    a.free(a.malloc(12 * MiB))
    assert (a.allocated, a.reserved) == (0, 12 * MiB)  # freed memory stays reserved (cached)
    a.malloc(12 * MiB)
    assert (a.reserved, a.num_device_alloc) == (12 * MiB, 1)


def test_blocks_of_another_stream_are_not_reused():
    # BlockComparatorSize orders by stream first; get_free_block gives up when the stream differs.
    a = Allocator()
    a.free(a.malloc(12 * MiB, stream=0))
    a.malloc(12 * MiB, stream=1)
    assert a.reserved == 24 * MiB


def test_6mib_blocks_share_20mib_segments():
    # 1st 6 MiB: 20 MiB segment, split (rest 14 MiB > 1 MiB). 2nd: best fit is the 14 MiB rest, split (8 left).
    # 3rd: the 8 MiB rest, split (2 MiB > 1 MiB left). 4th: 2 MiB < 6 MiB -> a second 20 MiB segment.
    a = Allocator()
    a.malloc(6 * MiB)
    a.malloc(6 * MiB)
    assert (a.reserved, a.segments) == (20 * MiB, [20 * MiB])
    a.malloc(6 * MiB)
    assert a.reserved == 20 * MiB
    a.malloc(6 * MiB)
    assert (a.allocated, a.reserved, a.segments) == (24 * MiB, 40 * MiB, [20 * MiB, 20 * MiB])


def test_freed_neighbours_merge():
    # A, B split from one 20 MiB segment (A | B | 14 MiB). Free B: merges with the 14 MiB rest -> 14+... ;
    # free A: merges with that -> one free 20 MiB block; a 20 MiB request then fits without a new segment.
    a = Allocator()
    x, y = a.malloc(3 * MiB), a.malloc(3 * MiB)
    a.free(y)
    a.free(x)
    a.malloc(20 * MiB)
    assert (a.reserved, a.num_device_alloc) == (20 * MiB, 1)


def test_max_split_size_keeps_oversize_blocks_whole():
    # max_split_size_mb:128. A cached 200 MiB segment is >= max_split_size: get_free_block refuses it for a
    # 100 MiB request (< max_split_size) -> a new 100 MiB segment: 300 MiB reserved.
    a = Allocator("max_split_size_mb:128")
    a.free(a.malloc(200 * MiB))
    a.malloc(100 * MiB)
    assert a.reserved == 300 * MiB
    # torch's default (unlimited max_split_size): the 200 MiB block is found and split (rest 100 MiB > 1 MiB)
    b = Allocator()
    b.free(b.malloc(200 * MiB))
    b.malloc(100 * MiB)
    assert (b.reserved, b.allocated) == (200 * MiB, 100 * MiB)


def test_oversize_blocks_serve_requests_within_20mib():
    # request >= max_split_size may take an oversize block only if block < request + kLargeBuffer (20 MiB),
    # and then whole (should_split: size < max_split_size is false).
    a = Allocator("max_split_size_mb:128")
    a.free(a.malloc(200 * MiB))
    a.malloc(190 * MiB)  # 200 < 190 + 20 -> reused whole
    assert (a.allocated, a.reserved) == (200 * MiB, 200 * MiB)
    b = Allocator("max_split_size_mb:128")
    b.free(b.malloc(200 * MiB))
    b.malloc(170 * MiB)  # 200 >= 170 + 20 -> refused: new 170 MiB segment
    assert b.reserved == 370 * MiB


def test_fragmentation_then_expandable_segments_reserve_less():
    # Default: A = 12 MiB and B = 12 MiB each get their own 12 MiB segment; freed, they stay cached as two
    # unsplit segments that cannot merge (different segments); a 24 MiB request finds no block >= 24 MiB ->
    # a new 24 MiB segment: reserved 48 MiB for 24 MiB allocated.
    a = Allocator()
    x, y = a.malloc(12 * MiB), a.malloc(12 * MiB)
    a.free(x)
    a.free(y)
    a.malloc(24 * MiB)
    assert (a.allocated, a.reserved) == (24 * MiB, 48 * MiB)
    # expandable_segments:True: one large-pool segment mapped in 20 MiB pages. A maps page 1 (A | 8 free);
    # B: 8 free + page 2 mapped and merged -> (A | B | 16 free), 40 MiB. Freeing A and B merges everything into
    # one free 40 MiB block, which the 24 MiB request splits: reserved stays 40 MiB.
    e = Allocator("expandable_segments:True")
    x, y = e.malloc(12 * MiB), e.malloc(12 * MiB)
    assert e.reserved == 40 * MiB
    e.free(x)
    e.free(y)
    e.malloc(24 * MiB)
    assert (e.allocated, e.reserved) == (24 * MiB, 40 * MiB)


def test_expandable_small_pool_maps_2mib_pages_and_empty_cache_unmaps_them():
    # small pool pages are kSmallBuffer = 2 MiB: 3 x 1 MiB -> 3 MiB mapped as 2 pages = 4 MiB.
    e = Allocator("expandable_segments:True")
    hs = [e.malloc(MiB) for _ in range(3)]
    assert e.reserved == 4 * MiB
    for h in hs:
        e.free(h)
    assert e.reserved == 4 * MiB  # freed pages stay mapped until empty_cache (release_blocks -> unmap_block)
    e.empty_cache()
    assert (e.reserved, e.segments) == (0, [])


def test_oom_path_frees_cached_blocks_then_retries():
    # capacity 40 MiB. A 20 MiB segment is cached (freed, unsplit). 30 MiB: no cached fit; cudaMalloc would
    # exceed 40 MiB -> release_available_cached_blocks does nothing (max_split_size unset) ->
    # release_cached_blocks frees the unsplit 20 MiB segment -> retry succeeds: reserved 30 MiB.
    a = Allocator(capacity=40 * MiB)
    a.free(a.malloc(20 * MiB))
    a.malloc(30 * MiB)
    assert (a.reserved, a.num_device_free, a.max_reserved) == (30 * MiB, 1, 30 * MiB)


def test_oom_when_only_split_blocks_are_cached():
    # 3 MiB takes a 20 MiB segment (3 | 17 free); the 17 MiB block is split, so release_cached_blocks cannot
    # free it; 24 MiB more would need 44 MiB > 40 MiB -> OutOfMemory.
    a = Allocator(capacity=40 * MiB)
    a.malloc(3 * MiB)
    with pytest.raises(OutOfMemory):
        a.malloc(24 * MiB)
    # and nothing that is live is ever freed: 20 MiB live, 30 MiB more does not fit in 40 MiB
    b = Allocator(capacity=40 * MiB)
    b.malloc(20 * MiB)
    with pytest.raises(OutOfMemory):
        b.malloc(30 * MiB)


def test_release_available_cached_blocks_frees_oversize_blocks():
    # max_split_size_mb:128, capacity 450 MiB. A cached 200 MiB oversize segment; 300 MiB does not fit
    # (200 + 300 > 450); release_available_cached_blocks frees the 200 MiB block (largest oversize, < 300 so it
    # reports failure), release_cached_blocks has nothing left, the retry fits: reserved 300 MiB.
    a = Allocator("max_split_size_mb:128", capacity=450 * MiB)
    a.free(a.malloc(200 * MiB))
    a.malloc(300 * MiB)
    assert (a.reserved, a.segments, a.num_device_free) == (300 * MiB, [300 * MiB], 1)


def test_garbage_collection_frees_old_cached_blocks_first():
    # capacity 100 MiB, memory fraction 1.0 (GC needs set_fraction), threshold 0.5 -> 50 MiB.
    # malloc 30 (get_free_block call 1), free -> cached at count 1; malloc 40 (call 2, no fit, reserved 30 <= 50:
    # no GC) -> 70 reserved; free -> cached at count 2; malloc 50 (call 3): no fit; GC: 70 > 50, target 20;
    # ages 30 MiB: 3-1 = 2, 40 MiB: 3-2 = 1; average 1.5 -> frees the 30 MiB block only (30 >= 20).
    # cudaMalloc 50: 40 + 50 <= 100 -> reserved 90 MiB with the 40 MiB block still cached.
    a = Allocator("garbage_collection_threshold:0.5", capacity=100 * MiB, memory_fraction=1.0)
    a.free(a.malloc(30 * MiB))
    a.free(a.malloc(40 * MiB))
    a.malloc(50 * MiB)
    assert (a.reserved, sorted(a.segments)) == (90 * MiB, [40 * MiB, 50 * MiB])
    # without GC the same sequence runs into the 100 MiB limit and the OOM path frees both cached blocks
    b = Allocator(capacity=100 * MiB, memory_fraction=1.0)
    b.free(b.malloc(30 * MiB))
    b.free(b.malloc(40 * MiB))
    b.malloc(50 * MiB)
    assert b.reserved == 50 * MiB


def test_roundup_power2_divisions():
    conf = parse_alloc_conf("roundup_power2_divisions:4")
    # 5 MiB + 1: > 512 * 4; between 4 MiB and 8 MiB in 4 divisions of 1 MiB -> 6 MiB
    assert round_size(5 * MiB + 1, conf) == 6 * MiB
    # 1200 B is not > 512 * 4 = 2048 -> plain 512 rounding: 1536; powers of two stay as they are
    assert round_size(1200, conf) == 1536
    assert round_size(4 * MiB, conf) == 4 * MiB
    # list form: [256:1,512:2,>:4] -> intervals below 256 MiB and at 256 MiB: 1 (off); 512 MiB: 2; above: 4
    table = parse_alloc_conf("roundup_power2_divisions:[256:1,512:2,>:4]")
    assert round_size(300 * MiB + 1, table) == 300 * MiB + 512
    assert round_size(600 * MiB, table) == 768 * MiB  # 512 MiB floor, 2 divisions of 256 MiB
    assert round_size(2048 * MiB + 1, table) == 2560 * MiB  # 2 GiB floor, 4 divisions of 512 MiB
    # the allocator counts the rounded size
    a = Allocator("roundup_power2_divisions:4")
    a.malloc(5 * MiB + 1)
    assert a.allocated == 6 * MiB


@pytest.mark.parametrize("text", ["max_split_size_mb:10", "garbage_collection_threshold:1.5", "roundup_power2_divisions:3",
                                  "expandable_segments:maybe", "max_split_size_mb", "max_split_sise_mb:200",
                                  "backend:cudaMallocAsync", "max_split_size_mb:abc"])
def test_bad_conf_is_one_line_setup_error(text):
    with pytest.raises(SetupError) as e:
        parse_alloc_conf(text)
    assert "\n" not in str(e.value)


def test_full_conf_parses():
    c = parse_alloc_conf("max_split_size_mb:128,expandable_segments:True,roundup_power2_divisions:4,"
                         "garbage_collection_threshold:0.8")
    assert (c.max_split_size, c.expandable_segments, c.divisions(MiB), c.garbage_collection_threshold) == \
        (128 * MiB, True, 4, 0.8)


def _run(conf):
    a = Allocator(conf)
    live, trace = [], []
    sizes = [700, 3 * MiB, 12 * MiB + 5, 64 * KiB, 6 * MiB, 25 * MiB, 900 * KiB, 2 * MiB + 3]
    for i in range(200):
        live.append(a.malloc(sizes[(i * 7) % len(sizes)] * (1 + i % 3), stream=i % 2))
        if i % 3 == 2:
            a.free(live.pop((i * 5) % len(live)))
        trace.append((a.allocated, a.reserved))
    return trace, a.segments


@pytest.mark.parametrize("conf", [None, "expandable_segments:True", "max_split_size_mb:40"])
def test_deterministic(conf):
    assert _run(conf) == _run(conf)
