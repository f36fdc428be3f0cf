"""Which references may reach the file system: the one rule for every field that names a model or a file (the model,
--gpu, --draft-model, --critic-model, --reward-model). The CLI reads local files; the web app runs each request under
`catalog_only`, where references resolve from the catalogs alone and no request's text touches the disk
(models/resolve.py and hardware.py ask `catalog_only_rule()` before any file access). And `check_name`: a reference's
text, checked before the file system sees it (a NUL, a name too long: one line, not an OSError)."""
from __future__ import annotations

import os
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Iterator

from .errors import ConfigError


@dataclass(frozen=True)
class CatalogOnly:
    """References resolve from the catalogs alone. Each text is the fix a refused reference is told."""

    models: str  # e.g. "the web app takes catalog names (see /api/models) or a pasted config.json"
    gpus: str


# A ContextVar, not a global: the CLI and the web app may share a process (the tests), and each web request runs in
# its own context (FastAPI copies the context into the worker thread of a sync endpoint, asyncio into each task).
_CATALOG_ONLY: ContextVar[CatalogOnly | None] = ContextVar("trainfit_catalog_only", default=None)


@contextmanager
def catalog_only(models: str, gpus: str) -> Iterator[CatalogOnly]:
    """Within it, model and GPU references resolve from the catalogs only, without touching the file system; anything
    else is one line naming the field and `models` / `gpus`. Also a decorator (each call enters it anew)."""
    rule = CatalogOnly(models, gpus)
    token = _CATALOG_ONLY.set(rule)
    try:
        yield rule
    finally:
        _CATALOG_ONLY.reset(token)


def catalog_only_rule() -> CatalogOnly | None:
    """The rule in force (None: local files may be read, as the CLI does)."""
    return _CATALOG_ONLY.get()


# Linux's NAME_MAX and PATH_MAX (limits.h; macOS: 255 and 1024): longer names fail in the kernel with ENAMETOOLONG
NAME_MAX = 255
PATH_MAX = 4096


def shown(ref: str, width: int = 60) -> str:
    """A reference as an error message quotes it: repr (a NUL or an undecodable byte escaped, so the line prints
    and encodes as UTF-8) and at most `width` characters of it."""
    return repr(ref if len(ref) <= width else ref[:width] + "…")


def flag_of(field: str) -> str:
    """How the command line names a field: the model argument, else the setting's flag."""
    return field if field == "model" else "--" + field.replace("_", "-")


def check_name(ref: str, field: str, error: type[Exception] = ConfigError) -> None:
    """A reference's text, checked before the file system sees it: no NUL, encodable as a file name, and no longer
    than the system takes (NAME_MAX per component, PATH_MAX in all). `field`: the setting, named by its flag."""
    field = flag_of(field)
    if "\x00" in ref:
        raise error(f"{field} {shown(ref)} contains a NUL character: pass a catalog name or a file's path")
    try:
        raw = os.fsencode(ref)
    except UnicodeError:
        raise error(f"{field} {shown(ref)} is not valid text for a file name: pass a catalog name or a file's "
                    "path") from None
    if len(raw) > PATH_MAX or any(len(part) > NAME_MAX for part in raw.split(b"/")):
        raise error(f"{field} {shown(ref)}: name too long ({len(raw)} bytes; a file name has at most {NAME_MAX}): "
                    "pass a catalog name or a file's path")


def not_a_file(path: str | os.PathLike) -> str | None:
    """Why `path` is no regular file to read, as a message starts: "PATH: why" (None when it is one): missing, a
    folder, or a device or pipe (/dev/null reads as empty), each said as it is, not all as "no such file"; an empty
    path as "'': the path is empty". Pass the text as given: Path("") is ".", the current folder."""
    if os.fspath(path) == "":
        return "'': the path is empty"
    if os.path.isfile(path):
        return None
    if os.path.isdir(path):
        return f"{path}: a folder, not a file"
    return f"{path}: " + ("not a regular file" if os.path.exists(path) else "no such file")
