"""Each training stack's analytic model, found by the stack's name: analytic/stacks/<name>.py holds MODEL, a
StackModel (base.py) that overrides only what the stack's step does differently. The stack's facts stay in
trainfit/stacks/<name>.toml (Setup.stack_facts); these modules hold the behaviour the formulas choose between.
Loaded on first use, so the analytic modules they call may import this package."""
from __future__ import annotations

from functools import lru_cache
from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .base import StackModel


@lru_cache(maxsize=None)
def model_named(name: str) -> StackModel:
    """The analytic model of the stack called `name`: its module here, by the same name; a stack without one (a
    stack of its own facts file only, trainfit/stacks/__init__.py) does what base.py's StackModel does."""
    try:
        return import_module(f"{__name__}.{name}").MODEL
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{name}":
            raise
        from .base import StackModel

        return StackModel()


def model_for(setup) -> StackModel:
    """The analytic model of the setup's stack (a Setup, or anything with a .stack name)."""
    return model_named(setup.stack)
