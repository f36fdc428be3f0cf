"""The analytic engine's memos, one rule for all: bounded tables (emptied when full: the planner's search reuses an
entry right after making it, so a full table holds mostly stale ones), every one of them forgotten by clear()
(compute_time.clear_memos: after a change to the kernel data, or to time a search from a cold start).

functools.lru_cache does not fit these: its keys must hash whole (a ModelSpec or a GPU hashes slowly and is keyed by
identity here, the entry holding the object so that its id is not reused while the entry lives), and the tables
are cleared together, not one function at a time."""
from __future__ import annotations

from collections.abc import Callable
from operator import is_

LIMIT = 8192  # entries per table (each a few hundred bytes): a search's groups stay well within it

_TABLES: list[dict] = []
_ALSO: list[Callable[[], None]] = []  # the memos kept in another form (an lru_cache, a list of recent keys)


def table() -> dict:
    """A new memo table, forgotten with the others by clear()."""
    _TABLES.append({})
    return _TABLES[-1]


def also_clear(forget: Callable[[], None]) -> None:
    """Have clear() call `forget` too: a memo that is not a table()."""
    _ALSO.append(forget)


def clear() -> None:
    """Forget every entry of every table, and every memo registered with also_clear."""
    for t in _TABLES:
        t.clear()
    for forget in _ALSO:
        forget()


def remember(memo: dict, key, make: Callable[[], object], limit: int = LIMIT):
    """memo[key], made by make() the first time (the table emptied when it holds `limit` entries)."""
    hit = memo.get(key)
    if hit is None:
        if len(memo) >= limit:
            memo.clear()
        hit = memo[key] = make()
    return hit


def remember_held(memo: dict, key, held: tuple, make: Callable[[], object], limit: int = LIMIT):
    """remember() for a key that names objects by id(): the entry holds them (`held`), and a hit counts only where it
    holds these very objects (an id is reused only once its object is gone)."""
    hit = memo.get(key)
    if hit is None or not all(map(is_, hit[0], held)):
        if len(memo) >= limit:
            memo.clear()
        hit = memo[key] = (held, make())
    return hit[1]
