"""A folder a test module's refused command lines share (one per module and xdist worker, not a tmp_path per case),
which each case must leave as it found it: a refused command writes nothing (test_bad_inputs.py,
test_bad_input_corpus.py)."""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path


@contextmanager
def left_unwritten(root: Path):
    """Yield `root`; fail if the body added, removed or renamed anything under it (bytecode caches aside)."""
    before = _listing(root)
    yield root
    assert _listing(root) == before, "a refused command wrote into the shared folder"


def _listing(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if "__pycache__" not in p.parts}
