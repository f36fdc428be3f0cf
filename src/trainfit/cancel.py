"""Cooperative cancellation: a computation started under `running(limit)` stops at its next `check()` once its time
limit has passed or someone (the web server, when the client disconnects or the server stops) calls `stop(why)`.

A thread cannot be killed from outside, so the loops that can run long call `check()`: fit advice's candidates
(studies/fit_advice.py), the planner's layout groups (plan/search.py), the allocator replay's events and the least
capacity's bisection (alloc/replay.py), and the trace engine's ops (trace/recorder.py __torch_dispatch__). Outside a
`running` block `check()` does nothing (the CLI runs to the end, bounded by trainfit/limits.py).
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from contextvars import ContextVar

from .errors import TrainfitError

DEFAULT_TIME_LIMIT = 30.0  # seconds a web request's computation may take (`trainfit serve --time-limit`)


class Stopped(TrainfitError):
    """The work was stopped: its time limit passed, or its client went away."""


class Work:
    """One bounded computation: its stop event and reason, its deadline, and how many checks it has passed (its
    progress: a stopped computation's count no longer moves)."""

    def __init__(self, limit: float | None = None, what: str = "the time limit"):
        self.event = threading.Event()
        self.limit = limit
        self.deadline = None if limit is None else time.monotonic() + limit
        self.what = what
        self.why = ""
        self.checks = 0

    def stop(self, why: str) -> None:
        if not self.event.is_set():
            self.why = why
            self.event.set()

    def expired(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def timeout_message(self) -> str:
        return f"stopped after {self.limit:g} s ({self.what})"

    def check(self) -> None:
        self.checks += 1
        if not self.event.is_set() and self.expired():
            self.stop(self.timeout_message())
        if self.event.is_set():
            raise Stopped(self.why)


_current: ContextVar[Work | None] = ContextVar("trainfit_work", default=None)


def check() -> None:
    """Raise Stopped if the computation running in this context was stopped or is past its limit."""
    work = _current.get()
    if work is not None:
        work.check()


@contextmanager
def running(work: Work):
    """Run the block as `work`: check() inside it (this thread, this context) answers to it."""
    token = _current.set(work)
    try:
        yield work
    finally:
        _current.reset(token)


def run(work: Work, fn, *args, **kwargs):
    """fn(*args, **kwargs) as `work` (the body of a worker thread)."""
    with running(work):
        work.check()
        return fn(*args, **kwargs)
