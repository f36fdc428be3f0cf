"""Memos keyed on a training setup without its micro-batch and accumulation (BatchFree), and without any other
settings a term does not read: for the memory terms the planner's fit search (plan/fit.py PeakOracle) asks again for
every micro-batch of a group and for the groups of a layout (a stage's model states, the clip's temporaries, a
layer's saved bytes per token). Emptied by memo.clear (compute_time.clear_memos), so a search timed from a cold
start is cold here too."""
from __future__ import annotations

import os
from collections.abc import Callable

from ..setup import Setup
from ..spec import ModelSpec
from ..stacks import PATH_VARIABLE
from . import memo as memos

MICRO_BATCH = (("batch", 1), ("grad_accum", 1))  # the settings every key here leaves out (at these values)
_RECENT: list[tuple[Setup, "BatchFree"]] = []  # (setup, its MICRO_BATCH key), the last few: asked per stage and term
_RECENT_SIZE = 4


class BatchFree:
    """`setup` with the `fixed` settings at the values given (--batch 1 and --grad-accum 1 at least: a key, never run)
    and the stack folders (a stack's facts are read from them: stacks.PATH_VARIABLE), its hash computed once. Equal
    for two setups that differ only in the fixed settings: a memo keyed on it is exact for a function that reads none
    of them (nor what is derived from them: tokens, tokens_per_step, the pipeline's in-flight micro-batches unless
    passed in the key)."""

    __slots__ = ("setup", "folders", "_hash")

    def __init__(self, setup: Setup, fixed: tuple = MICRO_BATCH):
        setup = setup.keyed(fixed)
        self.setup, self.folders = setup, os.environ.get(PATH_VARIABLE)
        self._hash = hash((setup, self.folders))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        # a Setup's __dict__ is its fields (Setup.copied): equal dicts are equal setups, compared without building
        # the dataclass's two tuples of ~100 fields
        return isinstance(other, BatchFree) and self._hash == other._hash and self.folders == other.folders \
            and self.setup.__dict__ == other.setup.__dict__


def cache() -> dict:
    """A new memo of this module's keys (memo.table: forgotten by memo.clear)."""
    return memos.table()


memos.also_clear(_RECENT.clear)


_INTERNED = cache()  # one object per key: the memos' lookups then match it by identity, not field by field


_WIDER = cache()  # (a MICRO_BATCH key, more fixed settings) -> the key with them fixed too


def batch_free(setup: Setup, fixed: tuple = MICRO_BATCH) -> BatchFree:
    """`setup`'s BatchFree key with `fixed` (MICRO_BATCH and more), memoised on the last few setup objects (by
    identity: the entry holds the setup, so its id is not reused while it lives); a key that fixes more settings is
    derived from the setup's MICRO_BATCH key, once per such key (the setup's other settings are that key's)."""
    for known, key in _RECENT:
        if known is setup:
            break
    else:
        key = _sibling_key(setup) or _interned(BatchFree(setup))
        _RECENT.insert(0, (setup, key))
        del _RECENT[_RECENT_SIZE:]
    if fixed is MICRO_BATCH:
        return key
    return memos.remember(_WIDER, (key, fixed), lambda: _interned(BatchFree(key.setup, fixed)))


def _sibling_key(setup: Setup) -> BatchFree | None:
    """The MICRO_BATCH key of a recent setup that differs from `setup` only in its micro-batch and accumulation (the
    fit search's next micro-batch of a group), found by comparing the fields (a Setup's __dict__) with that key's
    setup at --batch 1, --grad-accum 1 and the stack folders: cheaper than building and interning a new key."""
    if not _RECENT:
        return None
    fields = dict(setup.__dict__, batch=1, grad_accum=1)
    folders = os.environ.get(PATH_VARIABLE)
    for _, key in _RECENT:
        if key.setup.__dict__ == fields and key.folders == folders:
            return key
    return None


def _interned(key: BatchFree) -> BatchFree:
    """The one object of keys equal to `key` (the memos then find it by identity)."""
    return _INTERNED.setdefault(key, key) if len(_INTERNED) < memos.LIMIT else key


def memo(cache: dict, spec: ModelSpec, setup: Setup, extra: tuple, make: Callable[[], object],
         fixed: tuple = MICRO_BATCH):
    """make()'s value for (spec, setup without the `fixed` settings, `extra`), made the first time. The spec is keyed
    by identity (a ModelSpec never changes once built; hashing its fields costs more than the lookup): the entry
    holds it, so its id is not reused while the entry lives. Each cache is used with one `fixed`."""
    return memos.remember_held(cache, (id(spec), batch_free(setup, fixed), extra), (spec,), make)
