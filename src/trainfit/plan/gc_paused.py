"""A search run with CPython's cyclic garbage collector paused: the search makes millions of small objects that its
memos keep for its length (op lists, memo keys, setups) and no reference cycles to reclaim, and each full collection
re-traverses all of them (a planner search of 135,900 setups spent ~8 % of its time there). Reference counting
still frees everything as usual; the collector runs again, as before, once the call returns."""
from __future__ import annotations

import functools
import gc
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def gc_paused(fn: Callable[..., T]) -> Callable[..., T]:
    """`fn` run with the cyclic collector off (left as it is where the caller has it off already)."""

    @functools.wraps(fn)
    def run(*args, **kwargs) -> T:
        if not gc.isenabled():
            return fn(*args, **kwargs)
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            gc.enable()

    return run
