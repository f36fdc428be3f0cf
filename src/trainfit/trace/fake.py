"""The fake-tensor environment: shapes and dtypes flow through real PyTorch code, no memory is touched.

Also turns fake-tensor failures into one-line `EngineUnavailableError`s naming the op: fake tensors
cannot run ops whose output shape or control flow depends on values (nonzero, masked_select, .item()
on a computed tensor, MoE routing with `torch.where(mask)`), and the user should be told which op and
what to use instead, not shown a traceback.
"""
from __future__ import annotations

import contextlib

from torch._subclasses import fake_tensor as ft

from ..errors import EngineUnavailableError


def fake_mode() -> ft.FakeTensorMode:
    # allow_non_fake_inputs: a few library paths build small real tensors (constants, masks) at import
    # or construction time; letting them in as constants is what a real run does too.
    return ft.FakeTensorMode(allow_non_fake_inputs=True)


_HINT = ("the trace engine runs on fake tensors, which cannot execute ops whose output depends on "
         "tensor values; use the analytic engine (--engine analytic) or the measure engine")


@contextlib.contextmanager
def translated_errors(what: str):
    """Re-raise fake-tensor limitations as EngineUnavailableError (one line, names the op)."""
    try:
        yield
    except (ft.DataDependentOutputException, ft.DynamicOutputShapeException) as e:
        raise EngineUnavailableError(f"cannot trace {what}: op {e.func} has a data-dependent output; {_HINT}") from e
    except ft.UnsupportedOperatorException as e:
        raise EngineUnavailableError(f"cannot trace {what}: op {e.func} has no fake-tensor implementation; {_HINT}") from e
    except ft.UnsupportedFakeTensorException as e:
        raise EngineUnavailableError(f"cannot trace {what}: {e.reason}; {_HINT}") from e
    except RuntimeError as e:
        # Symbolic-shape guards on data-dependent values surface as plain RuntimeErrors
        # (GuardOnDataDependentSymNode and friends) with this wording.
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        if "data-dependent" in msg or "data dependent" in msg or "DataDependent" in type(e).__name__:
            raise EngineUnavailableError(f"cannot trace {what}: {msg}; {_HINT}") from e
        raise
