"""The fake-tensor environment: shapes and dtypes flow through real PyTorch code, no memory is touched.

Also turns fake-tensor failures into one-line `EngineUnavailableError`s naming the op: fake tensors
cannot run ops whose output shape or control flow depends on values (nonzero, masked_select, .item()
on a computed tensor, MoE routing with `torch.where(mask)`), and the user should be told which op and
what to use instead, not shown a traceback.
"""
from __future__ import annotations

import contextlib
import logging

from torch._subclasses import fake_tensor as ft

from ..errors import EngineUnavailableError


def fake_mode() -> ft.FakeTensorMode:
    # allow_non_fake_inputs: a few library paths build small real tensors (constants, masks) at import
    # or construction time; letting them in as constants is what a real run does too.
    return ft.FakeTensorMode(allow_non_fake_inputs=True)


@contextlib.contextmanager
def vision_constants(spec):
    """For a vision-language model (spec.vision): fake tensors made from Python values (torch.tensor, e.g. the image
    grid and the tower's window indexes: step/build.py vlm_batch) keep their values through index arithmetic, so that
    the model's `.tolist()` on them (modeling_qwen2_5_vl.py :316-318 attention splits, :1077 split sizes) reads real
    numbers. FakeTensorMode propagates such constants only while an op's output has at most CONSTANT_NUMEL_LIMIT
    elements (torch/_subclasses/fake_tensor.py, 1 by default); raised here to the largest index tensor (the patches'
    (h, w) positions), restored after. transformers' placeholder-count check (utils/import_utils.py
    torch_compilable_check, a value read of the token count) is off for the same span (TRANSFORMERS_DISABLE_TORCH_CHECK,
    its documented switch): the batch puts exactly one placeholder per image token by construction."""
    import os

    if getattr(spec, "vision", None) is None:
        yield
        return
    before, env = ft.CONSTANT_NUMEL_LIMIT, os.environ.get("TRANSFORMERS_DISABLE_TORCH_CHECK")
    ft.CONSTANT_NUMEL_LIMIT = max(before, 1 << 24)
    os.environ["TRANSFORMERS_DISABLE_TORCH_CHECK"] = "1"
    try:
        yield
    finally:
        ft.CONSTANT_NUMEL_LIMIT = before
        if env is None:
            os.environ.pop("TRANSFORMERS_DISABLE_TORCH_CHECK", None)
        else:
            os.environ["TRANSFORMERS_DISABLE_TORCH_CHECK"] = env


_HINT = ("the trace engine runs on fake tensors, which cannot execute ops whose output depends on "
         "tensor values; use the analytic engine (--engine analytic) or the measure engine")


def fake_limitation(e: BaseException, what: str) -> EngineUnavailableError | None:
    """The one-line EngineUnavailableError for a fake-tensor limitation (naming the op), or None when `e` is
    something else."""
    if isinstance(e, (ft.DataDependentOutputException, ft.DynamicOutputShapeException)):
        return EngineUnavailableError(f"cannot trace {what}: op {e.func} has a data-dependent output; {_HINT}")
    if isinstance(e, ft.UnsupportedOperatorException):
        return EngineUnavailableError(f"cannot trace {what}: op {e.func} has no fake-tensor implementation; {_HINT}")
    if isinstance(e, ft.UnsupportedFakeTensorException):
        return EngineUnavailableError(f"cannot trace {what}: {e.reason}; {_HINT}")
    if isinstance(e, RuntimeError):
        # Symbolic-shape guards on data-dependent values surface as plain RuntimeErrors
        # (GuardOnDataDependentSymNode and friends) with this wording.
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        if "data-dependent" in msg or "data dependent" in msg or "DataDependent" in type(e).__name__:
            return EngineUnavailableError(f"cannot trace {what}: {msg}; {_HINT}")
    return None


class _MetaFailureFilter(logging.Filter):
    """FakeTensorMode logs every failing meta kernel with its traceback (log.exception) before re-raising; the
    exception itself reaches the caller (and the user as one line), so the log record is dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("failed while attempting to run meta")


@contextlib.contextmanager
def translated_errors(what: str):
    """Re-raise fake-tensor limitations as EngineUnavailableError (one line, names the op); no traceback logged
    by the fake mode on the way."""
    log, quiet = logging.getLogger(ft.__name__), _MetaFailureFilter()
    log.addFilter(quiet)
    try:
        yield
    except Exception as e:
        err = fake_limitation(e, what)
        if err is None:
            raise
        raise err from e
    finally:
        log.removeFilter(quiet)
