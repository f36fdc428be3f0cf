"""The full depth's allocation records, built from the deepest extrapolation trace (5 layer periods), for the
caching allocator's replay (alloc/replay.py).

Why: reserved is not linear in depth. Which freed block serves which request depends on every size in the step,
and at 3-5 layers the model's fixed blocks (the fp32 logits, the tied embedding's gradient: a GiB each for
Llama-3.2-1B) are as large as all the layers together, so the cache beyond the peak moves by whole segments from
one traced depth to the next (extrapolate.py `_reserved`: 0.62, 1.98, 1.30 GB for llama-3.2-1b foreach). A line
through it read llama-3.2-1b amp 6.6 % low on an H200 where the full-depth replay is within 0.02 %
(bench/results/gpu/H200-2026-11-27-unrecorded-9-truth.json). The step itself is exactly periodic, so its events at the full
depth can be written down and replayed instead:

- every event (a storage's birth or death) gets the layer period it belongs to: by time inside a layer's forward
  (its module's pre hook to the next period's) or backward (its output's gradient hook, modules.py, to the next
  layer's or the first module outside the layers), else by the storage itself (a parameter's, gradient's or
  optimizer state's name; a foreach output through the element it was made from, recorder.py `source`);
- the traced periods 0, 1, 3, 4 stand for the full model's first two and last two; period 2, an interior one, is
  repeated for every interior period in between, in the order the step visits them (descending in the backward);
- a storage born in period a and freed in period b of the trace is born in each of a's copies and freed b - a
  periods later, at the same offset in that period's range (the interior periods' ranges are checked identical).

The result is accepted only if its highest live total over the step equals the extrapolated peak, which the
extrapolation proved exact; otherwise the caller keeps the line (None here).
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from .extrapolate import _Split

FORWARD, BACKWARD = "forward", "backward"
REPRESENTATIVE = 2  # of periods 0..4: the interior period that stands for all interior ones


@dataclass
class DepthRecord:
    """What alloc/replay.py reads of a record."""
    nbytes: int
    birth: int
    death: int | None
    stream: int
    cat: int


@dataclass
class DepthStream:
    """A synthetic recorder: what trace/engine.py replay_of reads."""
    records: list[DepthRecord]
    step_start: int
    stop: int
    phase_marks: list[tuple[int, str]] = field(default_factory=list)


def _phase_at(phase_marks, event: int) -> str:
    name = "setup"
    for e, n in phase_marks:
        if e > event:
            break
        name = n
    return name


def _ranges(rec, split: _Split, traced: int):
    """Time ranges of the layer periods, [(start, end, kind, period)] sorted and disjoint, or None."""
    layer = f"{split.prefix}.*"

    def layer_marks(kind: str, phase: str):
        for e, (k, *names) in rec.seg_marks or ():
            if k == kind and _phase_at(rec.phase_marks, e) == phase:
                generic, _, m = split(names[0])
                if generic == layer:
                    yield e, m, names[0]

    out = []
    # forward: a period's first layer's pre hook to the next period's; the last period to its last layer's post
    posts = list(layer_marks("post", FORWARD))
    groups = []
    for e, m, _ in layer_marks("pre", FORWARD):
        if not groups or groups[-1][1] != m:
            groups.append((e, m))
    for (e, m), nxt in zip(groups, [*groups[1:], None]):
        if nxt is not None and nxt[1] == m + 1:
            end = nxt[0]
        else:  # the last period of a forward pass
            last = f"{split.prefix}.{(m + 1) * split.p - 1}"
            end = next((pe for pe, _, name in posts if pe > e and name == last), None)
            if end is None:
                return None
        out.append((e, end, FORWARD, m))
    # backward: a period's layer output's gradient hook (modules.py) to the next mark of another period's layer or
    # of a module outside the layers (the embedding's), else the next phase
    marks = [(e, *split(name)) for e, name in rec.bwd_marks]
    i = 0
    while i < len(marks):
        e, generic, _, m = marks[i]
        if m is None or generic != layer:
            i += 1
            continue
        j = i + 1
        while j < len(marks) and marks[j][3] == m:
            j += 1
        end = marks[j][0] if j < len(marks) else next(
            (pe for pe, name in rec.phase_marks if pe > e and name != BACKWARD), None)
        if end is None:
            return None
        out.append((e, end, BACKWARD, m))
        i = j
    out.sort()
    return None if any(a[1] > b[0] for a, b in zip(out, out[1:])) else out


def full_depth_stream(rec, prefix: str, period: int, traced: int, n: int) -> DepthStream | None:
    """The n-period step's records from a `traced`-period recorder (`traced` = 5, marks recorded), or None when
    the trace does not have the structure this needs."""
    if traced != 5 or n <= traced:
        return None
    split = _Split(prefix, period)
    ranges = _ranges(rec, split, traced)
    if ranges is None:
        return None
    stop = rec.stop if rec.stop is not None else rec.event
    # the period of every event, and the range it lies in
    starts = [r[0] for r in ranges]
    at_event: list = [None] * (stop + 1)
    for r in rec.records:
        for e in (r.birth, r.death):
            if e is not None and e < stop:
                at_event[e] = r
    def period_of(r):
        """A storage's layer period: its name's (a parameter's, gradient's, optimizer state's), else, for one made
        outside the forward and backward (the optimizer's temporaries), that of what it was made from."""
        for _ in range(8):  # a few ops deep: sqrt of a state, its sum with eps, ...
            m = split(r.name)[2] if r.name else None
            if m is not None or r.source is None or r.phase in (FORWARD, BACKWARD):
                return m
            r = r.source
        return None

    ctx, where = [None] * stop, [None] * stop
    for e in range(stop):
        k = bisect.bisect_right(starts, e) - 1
        if k >= 0 and ranges[k][0] <= e < ranges[k][1]:
            ctx[e], where[e] = ranges[k][3], k
        elif at_event[e] is not None and _phase_at(rec.phase_marks, e) not in (FORWARD, BACKWARD):
            ctx[e] = period_of(at_event[e])
    # every period has as many ranges of a kind, and the interior ones match event for event (the offset map
    # below relies on it)
    by_kind: dict = {}
    for k, (s, t, kind, m) in enumerate(ranges):
        by_kind.setdefault((kind, m), []).append(k)
    for kind in (FORWARD, BACKWARD):
        runs = [by_kind.get((kind, m), []) for m in range(traced)]
        if len({len(x) for x in runs}) != 1:
            return None
        for occ in range(len(runs[0])):
            if len({ranges[runs[m][occ]][1] - ranges[runs[m][occ]][0] for m in (1, 2, 3)}) != 1:
                return None
    occurrence = {k: by_kind[(kind, m)].index(k) for k, (_, _, kind, m) in enumerate(ranges)}

    def full(m: int) -> list[int]:  # the full model's periods that traced period m stands for
        return [0] if m == 0 else [1] if m == 1 else [n - 2] if m == 3 else [n - 1] if m == 4 else list(
            range(2, n - 2))

    def rep(q: int) -> int:
        return 0 if q == 0 else 1 if q == 1 else 3 if q == n - 2 else 4 if q == n - 1 else REPRESENTATIVE

    # the new event order: runs of the representative period repeated, each in the order the step visits them
    index: dict = {}
    first = [0] * (stop + 1)  # the first new event of each traced one (phase marks, the step's start)
    counter = 0
    e = 0
    while e < stop:
        first[e] = counter
        if ctx[e] != REPRESENTATIVE:
            index[(e, None)] = counter
            counter += 1
            e += 1
            continue
        run_end = e
        while run_end < stop and ctx[run_end] == REPRESENTATIVE and where[run_end] == where[e]:
            run_end += 1
        if where[e] is not None:
            descending = ranges[where[e]][2] == BACKWARD
        else:  # storages taken by their layer (a list's elements die last to first): the way its neighbours go
            before = next((ctx[x] for x in range(e - 1, -1, -1) if ctx[x] not in (None, REPRESENTATIVE)), None)
            after = next((ctx[x] for x in range(run_end, stop) if ctx[x] not in (None, REPRESENTATIVE)), None)
            descending = (before is not None and before > REPRESENTATIVE) or (
                before is None and after is not None and after < REPRESENTATIVE)
        for q in (reversed(full(REPRESENTATIVE)) if descending else full(REPRESENTATIVE)):
            for x in range(e, run_end):
                index[(x, q)] = counter
                counter += 1
        for x in range(e + 1, run_end):
            first[x] = first[e]
        e = run_end
    first[stop] = counter

    def equivalent(d: int, q: int) -> tuple[int, int | None] | None:
        """(event, copy) of the event at d's place in full period q."""
        m = ctx[d]
        r = rep(q)
        copy = q if r == REPRESENTATIVE else None
        if r == m:
            return d, copy
        k = where[d]
        if k is None:
            return None
        kind = ranges[k][2]
        target = by_kind.get((kind, r))
        if target is None or occurrence[k] >= len(target):
            return None
        return ranges[target[occurrence[k]]][0] + (d - ranges[k][0]), copy

    out = []
    for r in rec.records:
        if not r.nbytes or r.birth >= stop:
            continue
        d = r.death if r.death is not None and r.death < stop else None
        kb = ctx[r.birth]
        kd = ctx[d] if d is not None else None
        for p in (full(kb) if kb is not None else [None]):
            born = index[(r.birth, p if kb == REPRESENTATIVE else None)]
            if d is None:
                died = None
            elif kd is None:
                died = index[(d, None)]
            else:
                q = (p + kd - kb) if kb is not None else full(kd)[0]
                if not 0 <= q < n:
                    return None
                eq = equivalent(d, q)
                if eq is None:
                    return None
                died = index[eq]
            out.append(DepthRecord(r.nbytes, born, died, r.stream, r.cat))

    out.sort(key=lambda r: r.birth)  # the recorder's order: alloc/replay.py makes deferred states in it
    return DepthStream(out, first[min(rec.step_start, stop)], counter,
                       [(first[min(e, stop)], name) for e, name in rec.phase_marks])


def step_peak(stream: DepthStream) -> int:
    """The highest live total over the step (residents included), as the recorder counts it."""
    ev = []
    for r in stream.records:
        ev.append((r.birth, r.nbytes))
        if r.death is not None:
            ev.append((r.death, -r.nbytes))
    ev.sort()
    live = peak = 0
    for e, b in ev:
        live += b
        if e >= stream.step_start:
            peak = max(peak, live)
    return peak
