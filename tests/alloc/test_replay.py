"""replay(): a traced step's births and deaths through the allocator, hand-derived like test_caching_allocator."""
from types import SimpleNamespace as R

import pytest

from trainfit.alloc.replay import replay

MiB = 1 << 20


def test_replay_of_a_small_step():
    # resident W (12 MiB: its own 12 MiB segment); the step (from event 1): A, B of 6 MiB share one 20 MiB
    # segment (split, best fit), both die (merged back into one free 20 MiB block); C (3 MiB) is split from it
    # and is alive at the end. The second pass frees C first, then reuses the same block: reserved 32 MiB,
    # allocated peak W + A + B = 24 MiB.
    records = [R(nbytes=12 * MiB, birth=0, death=None), R(nbytes=6 * MiB, birth=1, death=3),
               R(nbytes=6 * MiB, birth=2, death=4), R(nbytes=3 * MiB, birth=5, death=None)]
    r = replay(records, start=1)
    assert (r.reserved, r.allocated, r.segments) == (32 * MiB, 24 * MiB, 2)


def test_replay_with_expandable_segments():
    # expandable: W maps one 20 MiB page (W | 8 free); A takes 6 of the 8 (split at 512 B granularity),
    # B needs 6 > 2 free -> a second page merged in (W | A | B | 16 free): 40 MiB either way here, and the
    # second pass reuses it.
    records = [R(nbytes=12 * MiB, birth=0, death=None), R(nbytes=6 * MiB, birth=1, death=3),
               R(nbytes=6 * MiB, birth=2, death=4)]
    assert replay(records, start=1, conf="expandable_segments:True").reserved == 40 * MiB


def test_replay_keeps_each_stream_s_blocks_apart():
    # A (6 MiB) on stream 1, freed; B (6 MiB) on stream 0, alive at the end. 6 MiB: > kSmallSize and
    # < kMinLargeAlloc (10 MiB) -> a kLargeBuffer 20 MiB segment, split (rest 14 MiB > 1 MiB). A's free merges
    # its segment back into one free 20 MiB block filed under stream 1; get_free_block looks up (stream 0, 6 MiB)
    # and never crosses streams, so B needs a second 20 MiB segment: reserved 40 MiB. The second pass reuses
    # both cached blocks. On one stream B reuses A's block: 20 MiB. Allocated peak 6 MiB either way.
    two = [R(nbytes=6 * MiB, birth=0, death=1, stream=1), R(nbytes=6 * MiB, birth=2, death=None, stream=0)]
    one = [R(nbytes=6 * MiB, birth=0, death=1), R(nbytes=6 * MiB, birth=2, death=None)]  # no stream: 0
    assert (replay(two, start=0).reserved, replay(two, start=0).segments) == (40 * MiB, 2)
    assert (replay(one, start=0).reserved, replay(one, start=0).segments) == (20 * MiB, 1)
    assert replay(two, start=0).allocated == replay(one, start=0).allocated == 6 * MiB


def test_deaths_after_the_recording_stopped_are_not_replayed():
    # W (12 MiB, resident) dies at event 4, after the recorder stopped (end=4: the trace's objects going away).
    # A (6 MiB) lives 1-2 in the step, B (6 MiB) from 3 to the end. Replayed up to `end`, W stays allocated in the
    # second pass: allocated peak W + A = 18 MiB (W + B later, also 18). Replaying W's teardown death instead
    # frees W at the end of pass 1 and the second pass peaks at 6 MiB. Segments: W's own 12 MiB, and a 20 MiB
    # one that A and then B use: 32 MiB reserved.
    records = [R(nbytes=12 * MiB, birth=0, death=4), R(nbytes=6 * MiB, birth=1, death=2),
               R(nbytes=6 * MiB, birth=3, death=None)]
    kept = replay(records, start=1, end=4)
    assert (kept.reserved, kept.allocated) == (32 * MiB, 18 * MiB)
    assert replay(records, start=1).allocated == 6 * MiB


def test_segment_histogram_of_a_replay():
    # three 1,000 B tensors round to 1,024 B each (512 B granularity) and share one 2 MiB small-pool segment
    # (kSmallBuffer); 5 MiB (1-10 MiB) takes a 20 MiB kLargeBuffer segment; 30 MiB + 1 B (>= kMinLargeAlloc) a
    # segment of its own rounded up to 2 MiB: 32 MiB. Largest first, the form a real snapshot is summarised in.
    from trainfit.alloc.replay import segment_histogram

    records = [R(nbytes=1000, birth=i, death=None) for i in range(3)] + \
        [R(nbytes=5 * MiB, birth=3, death=None), R(nbytes=30 * MiB + 1, birth=4, death=None)]
    r = replay(records, start=0)
    assert segment_histogram(r.segment_sizes) == [[32 * MiB, 1], [20 * MiB, 1], [2 * MiB, 1]]
    assert segment_histogram([2 * MiB, 20 * MiB, 2 * MiB]) == [[20 * MiB, 1], [2 * MiB, 2]]


def test_least_capacity_releases_a_freed_segment_and_retries():
    # the step (from event 0): X (40 MiB) lives 0-1, then Y (60 MiB) 2-3. Unconstrained: X opens a 40 MiB segment
    # (>= kMinLargeAlloc: its own, 2 MiB multiple); its free block is smaller than Y, so Y opens a 60 MiB one:
    # reserved 100 MiB. At a capacity of 60 MiB, Y's cudaMalloc fails (40 + 60 > 60); malloc releases the cached,
    # non-split segments (release_cached_blocks: X's) and retries (num_alloc_retries): served. Below the allocated
    # peak (60 MiB) nothing is. So the least capacity is the peak, 40 MiB below reserved.
    from trainfit.alloc import OutOfMemory
    from trainfit.alloc.replay import least_capacity

    records = [R(nbytes=40 * MiB, birth=0, death=1), R(nbytes=60 * MiB, birth=2, death=3)]
    free = replay(records, start=0)
    assert (free.reserved, free.allocated, free.retries) == (100 * MiB, 60 * MiB, 0)
    assert least_capacity(records, start=0) == 60 * MiB
    assert replay(records, start=0, capacity=60 * MiB).retries == 1
    with pytest.raises(OutOfMemory):
        replay(records, start=0, capacity=58 * MiB)


def test_least_capacity_keeps_a_split_segment():
    # as above, but Z (12 MiB, alive to the step's end) is made between X's death and Y: best fit carves it from
    # X's free 40 MiB block (alloc_found_block splits: 28 MiB left > kSmallSize). When Y's cudaMalloc fails,
    # X's segment holds Z: release_blocks frees only non-split segments, so nothing is released and the retry
    # fails too. The split remainder (28 MiB) cannot be given back: the least capacity is the unconstrained
    # reserved, 100 MiB, 28 MiB above the allocated peak Z + Y.
    from trainfit.alloc import OutOfMemory
    from trainfit.alloc.replay import least_capacity

    records = [R(nbytes=40 * MiB, birth=0, death=1), R(nbytes=12 * MiB, birth=2, death=None),
               R(nbytes=60 * MiB, birth=3, death=4)]
    free = replay(records, start=0)
    assert (free.reserved, free.allocated) == (100 * MiB, 72 * MiB)
    assert least_capacity(records, start=0) == 100 * MiB
    with pytest.raises(OutOfMemory):
        replay(records, start=0, capacity=98 * MiB)
