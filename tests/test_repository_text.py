"""The committed repository speaks of the project, its users and their machines: no absolute path of a development
machine and no word of the place it was written in (issue 37). Text files only, as git lists them."""
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# an absolute path into a machine's own folders (/work/..., /tmp/..., /home/...), not a URL's path or a relative one
MACHINE_PATH = re.compile(r"(?<![\w.~:/-])/(?:work|tmp|home|root|Users|mnt)/")
# words of a work period or of who lent what: "lent"/"lend", "this session" (a profiler's session is "the session"
# or "the profiler session", an HTTP one "Session"), "workplace", "stop <n>" / "this stop" as a period of work
WORKPLACE = re.compile(r"\blent\b|\blend(?:s|ing)?\b|\b(?:this|that|one|each|every|next|last|previous) session\b"
                       r"|\bthe session's (?:first|last)\b|\bworkplace\b|\bstop \d+\b|\bthis stop\b|\bstop's\b", re.I)

# files that hold a machine path on purpose, with the reason
PATH_EXCEPTIONS = {
    "tests/cli/test_model_refs.py": "a 300-character /tmp/ path is a bad input the CLI must refuse",
    "tests/web/test_web_corpus.py": "a 300-character /tmp/ path is a bad input the web API must refuse",
    ".ci/run": "the CI job's own scratch virtual environment on the CI machine",
    "tests/test_repository_text.py": "the patterns' own examples",
}
WORD_EXCEPTIONS = {"tests/test_repository_text.py": "the patterns' own examples"}


def _text_files() -> list[str]:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    out = []
    for name in filter(None, listed.split("\0")):
        path = ROOT / name
        if not path.is_file():
            continue
        head = path.read_bytes()[:4096]
        if b"\0" not in head:
            out.append(name)
    return out


FILES = _text_files()


def _hits(pattern: re.Pattern, skip) -> list[str]:
    hits = []
    for name in FILES:
        if name in skip:
            continue
        text = (ROOT / name).read_text(errors="replace")
        for m in pattern.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            hits.append(f"{name}:{line}: {m.group(0)!r}")
    return hits


def test_files_are_found():
    assert "README.md" in FILES and "src/trainfit/__init__.py" in FILES


def test_no_machine_paths():
    assert not _hits(MACHINE_PATH, PATH_EXCEPTIONS.keys())


def test_no_workplace_words():
    assert not _hits(WORKPLACE, WORD_EXCEPTIONS.keys())


@pytest.mark.parametrize("text, path, word", [
    ("see /work/shared/x.md", True, False), ("python -m venv /tmp/venv", True, False),
    ("https://example.com/home/page", False, False), ("bench/results/tmp/x", False, False),
    ("a GPU was lent", False, True), ("in this session", False, True), ("the code of this stop's start", False, True),
    ("the profiler session", False, False), ("requests.Session()", False, False), ("blend the two", False, False),
])
def test_patterns(text, path, word):
    assert bool(MACHINE_PATH.search(text)) == path
    assert bool(WORKPLACE.search(text)) == word
