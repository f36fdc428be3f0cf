"""The files the commands write (-o): checked before any engine runs, and written with a one-line error."""
from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

from ..errors import TrainfitError


def _short(path: Path) -> str:
    text = str(path)
    return text if len(text) <= 120 else f"{text[:60]}…{text[-40:]} ({len(text)} characters)"


def check_writable(path: Path) -> None:
    """-o PATH names a file that can be created or replaced here; a one-line TrainfitError otherwise. The file is
    opened without blocking (a FIFO with no reader is refused, not waited on) and removed again if it was new."""
    try:
        if path.is_dir():
            raise TrainfitError(f"-o {_short(path)} is a folder: name a file in it")
        if not path.parent.is_dir():
            raise TrainfitError(f"-o {_short(path)}: folder {_short(path.parent)} does not exist; create it or "
                                "write elsewhere")
        existed = path.exists()
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NONBLOCK, 0o644))
    except OSError as e:
        raise TrainfitError(f"-o {_short(path)}: cannot write it ({e.strerror}); choose another path") from None
    if not existed:
        path.unlink()


@contextmanager
def writing(path: Path):
    """Around the write itself: a disk full or a file removed meanwhile is one line, not a traceback."""
    try:
        yield
    except OSError as e:
        raise TrainfitError(f"-o {_short(path)}: writing failed ({e.strerror or e}); choose another path") from None
